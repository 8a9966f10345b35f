"""Reading a real run: small pure functions over the arrays a forward pass exposes (embeddings, logits, the
residual stream, q/k, attention patterns, a generation record). The "Inside the model" pages show these numbers;
each function is short enough to show beside them.

Nothing here changes a model: the weights are only read.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from engine.model import ops
from engine.errors import ModelError
from specs.model_config import ModelConfig


# ============================================================================================ tokens
def token_table(tokenizer, ids: Sequence[int]) -> list[dict]:
    """One row per token: position, id, the piece as shown, its bytes, whether it is a special token."""
    pieces = tokenizer.token_strings(ids)
    return [dict(position=i, token_id=int(t), piece=p, bytes=len(tokenizer.token_bytes(t)),
                 special=int(t) in tokenizer.special_ids) for i, (t, p) in enumerate(zip(ids, pieces))]


def chars_per_token(text: str, n_tokens: int) -> float:
    """Characters of text each token stands for on average (English prose is about 4 with a 32-50K vocabulary)."""
    return len(text) / n_tokens if n_tokens else float("nan")


# ============================================================================================ embeddings
def embedding_row(embed: np.ndarray, token_id: int) -> np.ndarray:
    """The vector a token id looks up.   [V, D], id -> [D]"""
    if not 0 <= int(token_id) < embed.shape[0]:
        raise ModelError(f"token id must be between 0 and {embed.shape[0] - 1}, got {token_id}")
    return embed[int(token_id)]


def nearest_tokens(embed: np.ndarray, token_id: int, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The k tokens whose embeddings point most nearly the same way (cosine similarity), the token itself left
    out.   [V, D] -> ids [k], cosines [k] (most similar first)"""
    v = embedding_row(embed, token_id)
    norms = np.linalg.norm(embed, axis=1) * np.linalg.norm(v)                  # [V]
    cos = (embed @ v) / np.maximum(norms, 1e-30)                               # [V]
    cos[int(token_id)] = -np.inf
    top = np.argpartition(-cos, k)[:k]
    top = top[np.argsort(-cos[top], kind="stable")]
    return top, cos[top]


def top_k(probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely ids and their probabilities, most likely first.   [V] -> [k], [k]"""
    k = min(int(k), probs.size)
    top = np.argpartition(-probs, k - 1)[:k]
    top = top[np.argsort(-probs[top], kind="stable")]
    return top, probs[top]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of the logits at temperature 1.   [..., V] -> [..., V]"""
    return ops.softmax(np.asarray(logits, np.float64))


def logit_lens(weights, config: ModelConfig, resid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Read each layer's residual stream as if it were the last: final RMSNorm, then the LM head.
    resid [L, D] (one position, layer by layer) -> (top id per layer [L], its probability [L])"""
    h = ops.rms_norm(np.asarray(resid, np.float32), weights.final_norm, config.rms_norm_eps)   # [L, D]
    p = softmax(h @ weights.lm_head.T)                                                          # [L, V]
    best = np.argmax(p, axis=-1)
    return best, p[np.arange(len(best)), best]


# ============================================================================================ attention
def gqa_groups(config: ModelConfig) -> list[list[int]]:
    """Which query heads share each K/V head: head h reads K/V head h // G (G = h_q / h_kv)."""
    G = config.group_size
    return [list(range(kv * G, (kv + 1) * G)) for kv in range(config.num_kv_heads)]


def head_summary(pattern: np.ndarray) -> dict[str, np.ndarray]:
    """How much attention each head pays, averaged over the query rows, to the first token, to the previous token
    and to itself.   pattern [h, T, T] (all rows, keys = the same positions) -> three arrays [h]"""
    h, T, S = pattern.shape
    if T != S:
        raise ModelError(f"head_summary needs every query row of the prompt (a square pattern), got {T}×{S}")
    rows = np.arange(T)
    first = pattern[:, :, 0].mean(axis=1)
    prev = pattern[:, rows[1:], rows[1:] - 1].mean(axis=1) if T > 1 else np.zeros(h)
    self_ = pattern[:, rows, rows].mean(axis=1)
    return {"first token": first, "previous token": prev, "itself": self_}


def attention_row_steps(q: np.ndarray, k: np.ndarray, query_pos: int, head: int, group_size: int) -> dict:
    """One query row of one head, rebuilt from the model's own q and k: the dot products, the same divided by √d,
    and their softmax over the keys the query may see (positions 0..query_pos).
    q [T, h_q, d], k [T, h_kv, d] -> dict of [query_pos + 1] arrays and the scale."""
    d = q.shape[-1]
    qv = q[query_pos, head].astype(np.float64)                                 # [d]
    K = k[:query_pos + 1, head // group_size].astype(np.float64)               # [t+1, d]
    raw = K @ qv                                                               # [t+1]
    scale = 1.0 / math.sqrt(d)
    scaled = raw * scale
    return {"dot": raw, "scaled": scaled, "softmax": softmax(scaled), "scale": scale}


# ============================================================================================ RoPE
def rope_angles(config: ModelConfig, positions: Sequence[int], pairs: Sequence[int]) -> np.ndarray:
    """The angle (radians) each dimension pair is turned by at each position: pos · θ^(−2i/d).
    -> [len(positions), len(pairs)]"""
    inv = ops.rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)    # [d/2]
    return np.asarray(positions, np.float64)[:, None] * inv[None, list(pairs)]


def _rotate(model, x: np.ndarray, position: float) -> np.ndarray:
    """x [d] turned by RoPE to `position` (negative turns it back).   [d] -> [d]"""
    c = model.config
    inv = ops.rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)                   # [d/2]
    cos, sin = ops.rope_cos_sin(np.array([[position]], np.float64), inv)                # [1, 1, d/2]
    layout = getattr(model, "rope_layout", "half")
    rope = ops.apply_rope_half if layout == "half" else ops.apply_rope_interleaved
    return rope(x.astype(np.float32)[None, None, None, :], cos, sin)[0, 0, 0]


def rope_relative_check(model, q: np.ndarray, k: np.ndarray, m: int, n: int, shifts: Sequence[int]) -> list[dict]:
    """RoPE's promise, checked on the model's own vectors: the score of query position m with key position n
    depends only on m − n. q [d] and k [d] are the rotated vectors the model used at m and n; they are turned
    back to position 0, then both moved by each shift s and dotted again. Every row should give the same score."""
    q0, k0 = _rotate(model, q, -m), _rotate(model, k, -n)
    out = []
    for s in shifts:
        score = float(np.dot(_rotate(model, q0, m + s).astype(np.float64), _rotate(model, k0, n + s)))
        out.append({"query position": m + s, "key position": n + s, "distance": m - n, "q·k": score})
    return out


# ============================================================================================ a generation record
def record_timeline(rec) -> dict:
    """What a recorded generation cost, from its own timers: TTFT (prefill + first token), each inter-token
    latency, the mean ITL and the decode rate 1 / mean ITL."""
    seconds = np.array([s.seconds for s in rec.steps], np.float64)
    itl = seconds[1:]
    mean_itl = float(itl.mean()) if itl.size else float("nan")
    return {"ttft_ms": float(seconds[0] * 1e3) if seconds.size else float("nan"),
            "itl_ms": itl * 1e3, "mean_itl_ms": mean_itl * 1e3,
            "median_itl_ms": float(np.median(itl) * 1e3) if itl.size else float("nan"),
            "tokens_per_s": 1.0 / mean_itl if mean_itl > 0 else float("nan"),
            "total_ms": float(seconds.sum() * 1e3)}


def kv_cache_shape(config: ModelConfig, tokens: int) -> tuple[int, int, int, int, int]:
    """The cache as one array: [layers, 2 (K and V), kv_heads, tokens, head_dim]."""
    return (config.num_layers, 2, config.num_kv_heads, int(tokens), config.head_dim)


def kv_cache_bytes_from_shape(config: ModelConfig, tokens: int, bytes_per_element: int = 4) -> int:
    """Bytes of that array: the product of its shape times bytes per element (4 in the engine's float32)."""
    return int(np.prod(kv_cache_shape(config, tokens), dtype=np.int64)) * int(bytes_per_element)


def kv_rows_read(rec) -> dict[str, list[int]]:
    """Per step, K/V rows each layer writes (the new tokens) and reads (the whole cache so far): written once,
    read at every later step."""
    written, read = [], []
    before = 0
    for s in rec.steps:
        written.append(s.cache_tokens - before)
        read.append(s.cache_tokens)
        before = s.cache_tokens
    return {"written": written, "read": read}


def sweep_lengths(max_tokens: int, start: int = 16, count: int = 6) -> tuple[int, ...]:
    """Prompt lengths for a TTFT/ITL sweep: doubling from `start`, at most `count` of them, none past max_tokens."""
    out, n = [], start
    while n <= max_tokens and len(out) < count:
        out.append(n)
        n *= 2
    return tuple(out) or (max(1, max_tokens),)


def subsequence_end(ids: Sequence[int], part: Sequence[int]) -> int | None:
    """Position of the last token of the last occurrence of `part` inside `ids` (None if absent): where the
    user's own words end inside a chat-formatted prompt."""
    n, m = len(ids), len(part)
    for start in range(n - m, -1, -1):
        if m and list(ids[start:start + m]) == list(part):
            return start + m - 1
    return None


def causal_check(pattern: np.ndarray) -> dict:
    """What a causal attention map must satisfy, measured on one head's [T, T] weights: each row sums to 1
    (largest deviation), and every entry above the diagonal (a key after its query) is exactly 0."""
    T = pattern.shape[0]
    upper = pattern[np.triu_indices(T, k=1)]
    return {"max_row_error": float(np.abs(pattern.sum(axis=1) - 1).max()),
            "zeros_above": int((upper == 0).sum()), "entries_above": int(upper.size)}


def window_check(pattern: np.ndarray, window: int) -> dict:
    """What a sliding-window layer's map must also satisfy, on one head's [T, S] weights (key slot = position):
    every key at least `window` positions behind its query gets exactly 0 weight (outside the band)."""
    T, S = pattern.shape
    behind = np.arange(T)[:, None] - np.arange(S)[None, :] >= window          # [T, S] key too far back
    outside = pattern[behind]
    return {"zeros_outside": int((outside == 0).sum()), "entries_outside": int(outside.size)}


def max_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a − b| over all entries (how far a rebuilt result is from the captured one)."""
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def support_size(probs: np.ndarray) -> int:
    """How many tokens still have a chance of being drawn (probability > 0)."""
    return int((probs > 0).sum())


def token_end_times_ms(rec) -> np.ndarray:
    """When each token of a recorded run exists, in ms since the request: running sum of the steps' times."""
    return np.cumsum([s.seconds * 1e3 for s in rec.steps])
