"""`ops.matmul_t`: the weight product every forward step uses, one BLAS call for a whole batch."""
import numpy as np
import pytest

from engine.model.ops import MATVEC_MIN_BYTES, MATVEC_ROWS, SMALL_BATCH_ROWS, matmul_t, matvecs_by_block


@pytest.mark.parametrize("rows", [1, 3, SMALL_BATCH_ROWS, SMALL_BATCH_ROWS + 5])   # both GEMM paths
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


@pytest.mark.parametrize("rows", [2, MATVEC_ROWS])
def test_matmul_t_with_a_matrix_larger_than_the_cache_takes_the_matvec_path(rows, monkeypatch):
    """An LM-head-sized matrix and 2-4 rows: `matvecs_by_block`, and the same numbers as one matvec per row."""
    import engine.model.ops as ops
    calls = []
    real = ops.matvecs_by_block
    monkeypatch.setattr(ops, "matvecs_by_block", lambda r, W: calls.append(r.shape) or real(r, W))
    rng = np.random.default_rng(0)
    W = rng.standard_normal((MATVEC_MIN_BYTES // (256 * 4) + 3, 256)).astype(np.float32)     # just over the limit
    x = rng.standard_normal((rows, 1, 256)).astype(np.float32)
    out = matmul_t(x, W)
    assert calls == [(rows, 256)]
    for r in range(rows):
        assert np.abs(out[r, 0] - W @ x[r, 0]).max() < 1e-3
    matmul_t(x, W[:1000])                                             # a small matrix: the GEMM
    assert len(calls) == 1
