"""The small NumPy steps of `engine.model.ops` against brute-force loops in float64 (the forward pass as a whole is
pinned by the golden logits; these pin the edge cases a whole pass rarely reaches)."""
import math

import numpy as np
import pytest

from engine.model import ops


def softmax_loop(row):
    finite = [v for v in row if v != -math.inf]
    if not finite:
        return [0.0] * len(row)
    m = max(finite)
    e = [0.0 if v == -math.inf else math.exp(v - m) for v in row]
    return [x / sum(e) for x in e]


def test_softmax_in_place_matches_a_loop_and_gives_zeros_for_a_row_with_every_key_hidden():
    """A padding row in a batch can have every key hidden (all -inf): its weights must be 0, not NaN (NaN would
    spread into the batch's other rows through the next weight product)."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 4, (3, 2, 7)).astype(np.float32)
    x[0, 1] = -np.inf                                    # every key hidden
    x[1, 0, [0, 3, 6]] = -np.inf                         # some keys hidden
    x[2, 1, 2] = 80.0                                    # exp would overflow without the max subtracted
    want = np.array([[softmax_loop(list(map(float, r))) for r in b] for b in x])
    got = ops.softmax_(x.copy())
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert (got[0, 1] == 0).all()
    np.testing.assert_allclose(ops.softmax(x), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 1, 16), (16,), (3, 2, 16)])
def test_rms_norm_of_a_tiny_row_keeps_its_epsilon(shape):
    """Activations near zero: eps is most of the denominator, on the one-row path and the batched one alike."""
    x = np.full(shape, 1e-3, np.float32)
    w = np.ones(16, np.float32)
    want = 1e-3 / math.sqrt(1e-6 + 1e-5)                                          # mean of squares 1e-6, eps 1e-5
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-5), np.full(shape, want), rtol=1e-5)


def test_rms_norm_and_rope_match_loops():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(2, 3, 10)).astype(np.float32), rng.normal(size=10).astype(np.float32)
    want = [[[x[b, t, i] / math.sqrt(sum(float(v) ** 2 for v in x[b, t]) / 10 + 1e-6) * w[i] for i in range(10)]
             for t in range(3)] for b in range(2)]
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6), want, rtol=1e-5)
    np.testing.assert_allclose(ops.rms_norm(x[1:, 2:], w, 1e-6), [[want[1][2]]], rtol=1e-5)   # one row: own path
    np.testing.assert_allclose(ops.rms_norm(x[0, 1], w, 1e-6), want[0][1], rtol=1e-5)
    q = rng.normal(size=(1, 2, 3, 8)).astype(np.float32)                        # [B, T, H, d]
    pos = np.array([[5, 9]])
    cos, sin = ops.rope_cos_sin(pos, ops.rope_inv_freq(8, 10000.0))
    want = np.empty_like(q, dtype=np.float64)
    for t in range(2):
        for h in range(3):
            for i in range(4):                                                   # pair (i, i + d/2)
                a = pos[0, t] * 10000.0 ** (-2 * i / 8)
                x1, x2 = float(q[0, t, h, i]), float(q[0, t, h, i + 4])
                want[0, t, h, i], want[0, t, h, i + 4] = x1 * math.cos(a) - x2 * math.sin(a), x2 * math.cos(a) + x1 * math.sin(a)
    np.testing.assert_allclose(ops.apply_rope_half(q, cos, sin), want, rtol=1e-5, atol=1e-6)


def test_interleaved_rope_on_a_strided_view_matches_a_loop():
    """GGUF layout (pair 2i, 2i+1), applied as the forward pass does: to q/k heads sliced out of the fused projection
    (a strided view), with angles built once for the pass."""
    rng = np.random.default_rng(2)
    H, d = 3, 6
    qkv = rng.normal(size=(2, 2, H * d + 5)).astype(np.float32)                 # 5 trailing columns: a view
    x = qkv[..., :H * d].reshape(2, 2, H, d)
    pos = np.array([[0, 7], [3, 4]])
    rotate = ops.rope_rotation(*ops.rope_cos_sin(pos, ops.rope_inv_freq(d, 500.0)), "interleaved")
    want = np.empty(x.shape)
    for b, t, h, i in np.ndindex(2, 2, H, d // 2):
        a = pos[b, t] * 500.0 ** (-2 * i / d)
        x1, x2 = float(x[b, t, h, 2 * i]), float(x[b, t, h, 2 * i + 1])
        want[b, t, h, 2 * i], want[b, t, h, 2 * i + 1] = (x1 * math.cos(a) - x2 * math.sin(a),
                                                          x2 * math.cos(a) + x1 * math.sin(a))
    np.testing.assert_allclose(rotate(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="layout"):
        ops.rope_rotation(*ops.rope_cos_sin(pos, ops.rope_inv_freq(d, 500.0)), "sideways")


def test_softmax_without_hidden_keys_skips_only_the_guards():
    x = np.random.default_rng(3).normal(size=(2, 3, 9)).astype(np.float32) * 30
    np.testing.assert_allclose(ops.softmax_(x.copy(), hidden_keys=False), ops.softmax_(x.copy()), rtol=1e-6)
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(ops.softmax_(x.copy(), hidden_keys=False), e / e.sum(-1, keepdims=True), rtol=1e-5,
                               atol=1e-7)
