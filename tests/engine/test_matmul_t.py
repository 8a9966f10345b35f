"""`ops.matmul_t`: the weight product every forward step uses, one BLAS call for a whole batch."""
import numpy as np
import pytest

from engine.model.ops import (MATVEC_FEW_MIN_BYTES, MATVEC_FEW_ROWS, MATVEC_MIN_BYTES, MATVEC_ROWS,
                              SMALL_BATCH_ROWS, matmul_t, matvecs_by_block)


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


@pytest.mark.parametrize("rows, takes_matvecs", [(1, False), (2, True), (MATVEC_FEW_ROWS, True),
                                                  (MATVEC_FEW_ROWS + 1, False), (8, False)])
def test_a_layer_sized_matrix_takes_the_matvecs_for_two_or_three_rows_only(rows, takes_matvecs, monkeypatch):
    """A matrix between 1 and 32 MiB (every layer of SmolLM2 or TinyLlama): 2-3 rows by blocked matvecs, which read
    it from memory once each (the GEMM packs it first and costs ~1.3x as much), 4 rows and more by the GEMM; the
    numbers are the brute-force ones either way. Under 1 MiB (a matrix that may sit in cache): the GEMM."""
    import engine.model.ops as ops
    calls = []
    real = ops.matvecs_by_block
    monkeypatch.setattr(ops, "matvecs_by_block", lambda r, W: calls.append(r.shape) or real(r, W))
    rng = np.random.default_rng(rows)
    W = rng.standard_normal((MATVEC_FEW_MIN_BYTES // (96 * 4) + 5, 96)).astype(np.float32)   # just over 1 MiB
    x = rng.standard_normal((rows, 1, 96)).astype(np.float32)
    out = matmul_t(x, W)
    assert calls == ([(rows, 96)] if takes_matvecs else [])
    np.testing.assert_allclose(out, brute_force(x, W), rtol=1e-4, atol=1e-4)
    matmul_t(x, W[:MATVEC_FEW_MIN_BYTES // (96 * 4) - 5])                              # just under 1 MiB: the GEMM
    assert len(calls) == (1 if takes_matvecs else 0)


def brute_force(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """One float64 dot product per output entry."""
    xs, W64 = x.reshape(-1, x.shape[-1]).astype(np.float64), W.astype(np.float64)
    return np.array([[float(np.dot(W64[j], r)) for j in range(W.shape[0])] for r in xs]).reshape(
        *x.shape[:-1], W.shape[0])


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 17, 33, SMALL_BATCH_ROWS, SMALL_BATCH_ROWS + 6])
def test_a_matrix_stored_by_columns_gives_the_same_product(rows):
    """The LM head is kept column by column (`Weights.head_by_columns`), so `matmul_t` multiplies it as the
    contiguous [in, out] matrix it is: uneven shapes, 1 to 70 rows, the same numbers as a brute-force loop."""
    rng = np.random.default_rng(100 + rows)
    W = np.asfortranarray(rng.standard_normal((131, 57)).astype(np.float32))    # [out, in], laid out as [in, out]
    assert W.flags.f_contiguous and not W.flags.c_contiguous
    x = rng.standard_normal((rows, 1, 57)).astype(np.float32)
    out = matmul_t(x, W)
    assert out.shape == (rows, 1, 131) and out.flags.c_contiguous
    assert np.abs(out - brute_force(x, W)).max() < 1e-4          # 57 products of N(0,1): float32 reordering only


@pytest.mark.parametrize("rows", [1, 2, MATVEC_ROWS, 8])
def test_an_lm_head_sized_matrix_stored_by_columns(rows):
    """Over MATVEC_MIN_BYTES, by columns: the blocked matvecs (2-4 rows) and the GEMM (1, 8 rows) both right."""
    rng = np.random.default_rng(rows)
    W = np.asfortranarray(rng.standard_normal((MATVEC_MIN_BYTES // (64 * 4) + 7, 64)).astype(np.float32))
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    out = matmul_t(x, W)
    picks = rng.choice(W.shape[0], 300, replace=False)           # brute force on 300 output columns of 131k
    assert np.abs(out[:, picks] - brute_force(x, W[picks])).max() < 1e-4
    assert np.abs(out - (x.astype(np.float64) @ W.T.astype(np.float64))).max() < 1e-4
