"""The math of a Llama layer as small pure NumPy functions (picoGPT style): shapes in, shapes out.

Every function here is float32 in, float32 out, and allocates only what its output needs. The forward pass in
`engine/model/model.py` strings them together; a page that wants to show one step can call the same function.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · w.   [..., D], [D] -> [..., D]
    One row (a decode step's): its scale is one Python number, three NumPy calls instead of six. Each call right
    after a weight product starts cold (measured ~5-10 µs), and a decode step makes two norms per layer."""
    D = x.shape[-1]
    out = x * w
    if x.size == D:
        row = x.reshape(D)
        out *= np.float32(1.0 / math.sqrt(float(row @ row) / D + eps))
        return out
    rms = np.vecdot(x, x)[..., None]                                                 # [..., 1] sum of squares
    rms *= np.float32(1.0 / D)                                                       # mean of squares
    rms += np.float32(eps)
    out /= np.sqrt(rms, out=rms)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x).   [..., F] -> [..., F]"""
    return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) · up, built in ONE new array (no temporaries the size of gate).   [..., F], [..., F] -> [..., F]"""
    out = np.negative(gate)
    np.exp(out, out=out)
    out += 1.0
    np.divide(gate, out, out=out)                                 # gate · sigmoid(gate) = gate / (1 + e^-gate)
    out *= up
    return out


def gelu_tanh_glu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """GeGLU (Gemma): gelu_tanh(gate) · up, gelu_tanh(x) = x/2 · (1 + tanh(sqrt(2/pi) · (x + 0.044715 x³))), the
    tanh approximation transformers calls "gelu_pytorch_tanh".   [..., F], [..., F] -> [..., F]"""
    out = gate * gate
    out *= np.float32(0.044715)
    out += 1.0
    out *= gate                                                   # x + 0.044715 x³
    out *= np.float32(math.sqrt(2.0 / math.pi))
    np.tanh(out, out=out)
    out += 1.0
    out *= gate
    out *= np.float32(0.5)
    out *= up
    return out


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap · tanh(x / cap): squashes x smoothly into (-cap, cap) (Gemma 2's logit soft-capping).   same shape"""
    return np.float32(cap) * np.tanh(x / np.float32(cap))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; rows that are all -inf give zeros, not NaN.   [..., S] -> [..., S]"""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / np.maximum(np.sum(e, axis=axis, keepdims=True), 1e-30)


F32_MIN = np.finfo(np.float32).min      # what an all-hidden row's max becomes (finite, so -inf - m is -inf)


def softmax_(x: np.ndarray, hidden_keys: bool = True) -> np.ndarray:
    """`softmax(x, -1)` computed IN PLACE (no second array the size of x); returns x.   [..., S] -> [..., S]
    hidden_keys: some scores may be -inf (masked keys), so a row may be all -inf: it gets zeros, not NaN.
    With False (no score is -inf: a decode step that sees all its keys) the two guards are skipped."""
    m = x.max(-1, keepdims=True)
    if hidden_keys:
        np.maximum(m, F32_MIN, out=m)                             # an all -inf row: subtract a finite number
    x -= m
    np.exp(x, out=x)
    total = x.sum(-1, keepdims=True)
    if hidden_keys:
        np.maximum(total, 1e-30, out=total)                       # an all -inf row: 0 / tiny = zeros, not NaN
    x /= total
    return x


# ---------------------------------------------------------------------------------------------- RoPE
def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """Rotation speed of each dimension pair: theta^(-2i/d), optionally rescaled.   -> [head_dim/2] (float64)

    Supports Llama-3 `rope_type: llama3` (low frequencies divided by `factor`, smooth blend in between) and
    `linear` (all positions divided by `factor`), as in Hugging Face `modeling_rope_utils`; and `freq_factors`
    (one divisor per pair, [head_dim/2]: a Llama-3.1 GGUF's `rope_freqs` tensor, applied as llama.cpp does).
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return inv
    if "freq_factors" in scaling:
        factors = np.asarray(scaling["freq_factors"], np.float64)
        if factors.shape != inv.shape or not np.all(factors > 0):
            raise ValueError(f"freq_factors must be {inv.size} positive numbers (one per dimension pair), "
                             f"got shape {factors.shape}")
        rest = {k: v for k, v in scaling.items() if k != "freq_factors"}
        return rope_inv_freq(head_dim, theta, rest) / factors
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * np.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        out = np.where(wavelen > old_ctx / low, inv / factor, inv)              # long waves: slowed down
        mid = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        return np.where(mid, blended, out)
    if kind == "default":
        return inv
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Angles pos·freq for each position.   [..., T], [d/2] -> cos, sin each [..., T, d/2] (float32)"""
    ang = positions[..., None].astype(np.float64) * inv_freq
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@dataclass(frozen=True)
class Rotation:
    """RoPE at a pass's positions, built once and applied to the q and k heads of every layer.

    Each dimension i is rotated with a partner dimension j by the pair's angle a:
        out_i = x_i·cos a - x_j·sin a   (the first of the pair),   out_j = x_j·cos a + x_i·sin a
    so with cos and a signed sin laid out at full head width:   out = x·cos + x[partner]·signed_sin.
    cos, signed_sin [B, T, 1, d] (broadcast over heads); partner [d]."""
    cos: np.ndarray
    signed_sin: np.ndarray
    partner: np.ndarray

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[B, T, H, d] -> [B, T, H, d]"""
        out = x[..., self.partner]                                                   # x_j next to each x_i
        out *= self.signed_sin
        out += x * self.cos
        return out


def rope_rotation(cos: np.ndarray, sin: np.ndarray, layout: str = "half") -> Rotation:
    """The Rotation for angles cos/sin [B, T, d/2], in either layout of the pairs:
    "half" (Hugging Face, "rotate_half"): dimension i pairs with i + d/2;
    "interleaved" (original Llama, GGUF): dimension 2i pairs with 2i + 1."""
    h = cos.shape[-1]
    if layout == "half":
        partner = np.concatenate([np.arange(h, 2 * h), np.arange(h)])
        full, signed = np.concatenate([cos, cos], axis=-1), np.concatenate([-sin, sin], axis=-1)
    elif layout == "interleaved":
        partner = np.arange(2 * h) ^ 1                                               # 0<->1, 2<->3, ...
        full = np.repeat(cos, 2, axis=-1)
        signed = np.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], 2 * h)
    else:
        raise ValueError(f"RoPE layout must be 'half' or 'interleaved', got {layout!r}")
    return Rotation(full[..., None, :], signed[..., None, :], partner)


def apply_rope_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Hugging Face layout ("rotate_half"): dimension i pairs with i + d/2.   [B, T, H, d], cos/sin [B, T, d/2]"""
    return rope_rotation(cos, sin, "half")(x)


def apply_rope_interleaved(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Original Llama / GGUF layout: dimension 2i pairs with 2i+1.   [B, T, H, d], cos/sin [B, T, d/2]"""
    return rope_rotation(cos, sin, "interleaved")(x)


# ---------------------------------------------------------------------------------------------- attention
def causal_visible(q_positions: np.ndarray, n_keys: int, key_valid: np.ndarray) -> np.ndarray:
    """True where key j is visible to the query at position p: j ≤ p (no future) and j is a real key.

    q_positions [B, T] absolute positions of the queries; key_valid [B, S] bool.   -> [B, T, S] bool
    """
    keys = np.arange(n_keys)
    return (keys[None, None, :] <= q_positions[:, :, None]) & key_valid[:, None, :]


def window_visible(q_positions: np.ndarray, key_positions: np.ndarray, key_valid: np.ndarray,
                   window: int) -> np.ndarray:
    """Sliding-window causal visibility: key at position j is seen by the query at position p when
    p - window < j ≤ p (the query and the window - 1 tokens before it) and j is a real key.

    q_positions [B, T]; key_positions [B, S] absolute position held in each key slot; key_valid [B, S] bool.
    -> [B, T, S] bool"""
    kp, qp = key_positions[:, None, :], q_positions[:, :, None]
    return (kp <= qp) & (kp > qp - window) & key_valid[:, None, :]


def gqa_attention_scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """Scaled dot products, each K/V head shared by G query heads WITHOUT copying K.

    q [B, h_kv, G, T, d], k [B, h_kv, S, d] -> scores [B, h_kv, G, T, S]
    """
    B, h_kv, G, T, d = q.shape
    scores = np.matmul(q.reshape(B, h_kv, G * T, d), k.swapaxes(-1, -2))           # [B, h_kv, G·T, S]: one
    scores *= np.float32(scale)                                                      # product per K/V head
    return scores.reshape(B, h_kv, G, T, -1)


def gqa_attention_output(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Weighted sum of values.   p [B, h_kv, G, T, S], v [B, h_kv, S, d] -> [B, h_kv, G, T, d]"""
    B, h_kv, G, T, S = p.shape
    return np.matmul(p.reshape(B, h_kv, G * T, S), v).reshape(B, h_kv, G, T, -1)


# ---------------------------------------------------------------------------------------------- weight products
SMALL_BATCH_ROWS = 64   # up to this many rows, W · xᵀ runs faster than x · Wᵀ with OpenBLAS (measured, bench/)
MATVEC_ROWS = 4                 # 2-4 rows times a matrix far larger than the last-level cache (an LM head):
MATVEC_MIN_BYTES = 32 << 20     # one matvec per row over 4 MiB blocks of W beats OpenBLAS's GEMM (measured, bench/)
MATVEC_FEW_ROWS = 3             # 2-3 rows: the same for any matrix a decode step streams from memory, which is
MATVEC_FEW_MIN_BYTES = 1 << 20  # every layer's (only a matrix under 1 MiB may still be in cache: the GEMM)
MATVEC_BLOCK_BYTES = 4 << 20


def by_matvecs(rows: int, W: np.ndarray) -> bool:
    """Whether `rows` rows times W go through `matvecs_by_block` rather than OpenBLAS's GEMM, which packs W before
    it multiplies, so a few rows cost about twice one row. Measured on the 2-core development machine, SmolLM2's
    layer matrices (1.3-7 MB; all 30 layers, so each comes from memory as in a real step): 2 rows 27.5 ms against
    36.8 by GEMM, 3 rows 33.8 against 44.5, 4 rows 35.0 against 35.9 (a tie, so 4 rows keep the GEMM below 32 MiB);
    its 113 MB LM head, 2 rows: 8.5 against 15.0 ms. Through the scheduler: 2 streams +23%, 3 streams +15%."""
    if rows < 2 or rows > MATVEC_ROWS:
        return False
    return W.nbytes >= (MATVEC_FEW_MIN_BYTES if rows <= MATVEC_FEW_ROWS else MATVEC_MIN_BYTES)


def matmul_t(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """x · Wᵀ reading W once however many sequences, so a batch shares each weight read.
    (`x @ W.T` on a stack [B, T, D] would loop over B and re-read W per sequence.)   [..., in], W [out, in] -> [..., out]

    One row: a matvec. 2-3 rows by a matrix of 1 MiB or more, 4 rows by one of 32 MiB or more: `matvecs_by_block`
    (see `by_matvecs`). Otherwise one GEMM, over W as stored: a W kept column by column
    (`Weights.head_by_columns`) is multiplied as the contiguous [in, out] matrix it is."""
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])                        # [M, in], M = B·T
    by_columns = W.strides[0] < W.strides[1]                                       # W stored column by column
    if rows.shape[0] == 1 and not by_columns:
        out = W @ rows[0]                                                           # one matvec: [out]
    elif by_matvecs(rows.shape[0], W):
        out = matvecs_by_block(rows, W)
    elif by_columns:                                                                # (the LM head):
        out = rows @ W.T                                                            # Wᵀ is a contiguous [in, out]
    elif rows.shape[0] <= SMALL_BATCH_ROWS:
        out = np.ascontiguousarray((W @ rows.T).T)                                  # [out, in] @ [in, M] -> [M, out]
    else:
        out = rows @ W.T                                                            # [M, in] @ [in, out]
    return out.reshape(*x.shape[:-1], W.shape[0])


def matvecs_by_block(rows: np.ndarray, W: np.ndarray, block_bytes: int = MATVEC_BLOCK_BYTES) -> np.ndarray:
    """One matvec per row, W taken MATVEC_BLOCK_BYTES of rows at a time: the first row's matvec streams the block
    from memory, the others find it in cache, so W is still read from memory once.   [M, in], [out, in] -> [M, out]"""
    out = np.empty((rows.shape[0], W.shape[0]), np.result_type(rows, W))
    step = max(1, block_bytes // (W.shape[1] * W.itemsize))
    for s in range(0, W.shape[0], step):
        block = W[s:s + step]
        for r, row in enumerate(rows):
            np.matmul(block, row, out=out[r, s:s + step])
    return out

