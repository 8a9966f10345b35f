"""`ops.matmul_t`: the weight product every forward step uses, one BLAS call for a whole batch."""
import numpy as np
import pytest

from engine.ops import MATVEC_ROWS, SMALL_BATCH_ROWS, matmul_t, matvecs_by_block


@pytest.mark.parametrize("rows", [1, 2, MATVEC_ROWS // 2 + 1, SMALL_BATCH_ROWS, SMALL_BATCH_ROWS + 5])  # every path
def test_matmul_t_equals_row_by_row_products(rows):
    rng = np.random.default_rng(rows)
    W = rng.standard_normal((40, 24)).astype(np.float32)              # [N, D]
    x = rng.standard_normal((rows, 2, 24)).astype(np.float32)         # [B, T, D]
    out = matmul_t(x, W)
    expected = np.stack([[W @ x[b, t] for t in range(2)] for b in range(rows)])   # one matvec per row (brute force)
    assert out.shape == (rows, 2, 40) and out.flags.c_contiguous
    # 24 products of N(0,1) values: sums of magnitude ~5, float32 reordering error ~1e-6 relative -> 1e-4 absolute
    assert np.abs(out - expected).max() < 1e-4


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("block_bytes", [1, 5 * 24 * 4, 7 * 24 * 4, 1 << 20])   # 1-row blocks, ragged last block, one block
def test_matvecs_by_block_covers_every_output_row_once(rows, block_bytes):
    """Blocks of W rows that do not divide W: every output column written, by the right row of x (brute force)."""
    rng = np.random.default_rng(rows)
    W = rng.standard_normal((40, 24)).astype(np.float32)
    x = rng.standard_normal((rows, 24)).astype(np.float32)
    out = matvecs_by_block(x, W, block_bytes)
    expected = np.array([[float(np.dot(W[j].astype(np.float64), x[r])) for j in range(40)] for r in range(rows)])
    assert out.shape == (rows, 40) and np.abs(out - expected).max() < 1e-4
