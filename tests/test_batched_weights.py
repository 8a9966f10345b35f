"""The batched view computes the same products as the model, with one BLAS call per weight matrix."""
import numpy as np
import pytest

from engine import Model
from engine.batched_weights import SMALL_BATCH_ROWS, batched_view, flat_matmul
from test_engine_forward import prompt, tiny

# float32 sums of 64 products reordered by BLAS: ~1e-7 relative; logits are O(1), 1e-5 as in test_engine_forward.
TOL = 1e-5


@pytest.mark.parametrize("rows", [1, 3, SMALL_BATCH_ROWS, SMALL_BATCH_ROWS + 5])   # both code paths
def test_flat_matmul_equals_row_by_row_products(rows):
    rng = np.random.default_rng(rows)
    W = rng.standard_normal((40, 24)).astype(np.float32)              # [N, D]
    x = rng.standard_normal((rows, 1, 24)).astype(np.float32)         # [B, T, D]
    out = flat_matmul(x, W.T)
    expected = np.stack([[W @ x[b, 0]] for b in range(rows)])          # one matrix-vector product per row
    assert out.shape == (rows, 1, 40) and out.flags.c_contiguous
    assert np.abs(out - expected).max() < 1e-4                          # 24 products of N(0,1): sums ~5, 1e-6 rel


def test_batched_view_shares_weights_and_gives_the_same_logits():
    model = Model.random(tiny(tie_word_embeddings=True), seed=2)
    view = batched_view(model)
    assert view.config is model.config and batched_view(view) is view
    pairs = [(view.weights.layers[0].wqkv, model.weights.layers[0].wqkv), (view.weights.lm_head, model.weights.embed)]
    for a, b in pairs:
        assert np.shares_memory(a, b)                                   # a view: nothing copied
    seqs = [prompt(n, seed=n) for n in (3, 9, 6)]
    tokens = np.array([s + [0] * (9 - len(s)) for s in seqs])
    n_valid = [len(s) for s in seqs]
    a = model.forward(tokens, model.new_cache(3), n_valid=n_valid)
    b = view.forward(tokens, view.new_cache(3), n_valid=n_valid)
    assert type(b) is np.ndarray and np.abs(a - b).max() < TOL
