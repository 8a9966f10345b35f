"""The leanest NumPy decode step for a Llama: what the work between the weight products costs at the very least
with NumPy on this machine, so that `bench_engine.py` can show how close to it the engine's named steps come.

Not an engine: one sequence, full attention, the Hugging Face ("half") RoPE layout, no hooks, no trace, no
checks. One flat loop with the dimensions in locals, the residual stream updated in place, RMSNorm's scale as a
Python float, and the fewest NumPy calls each step needs. `bench_engine.py` checks its logits against the engine's
before timing it.
"""
from __future__ import annotations

import math

import numpy as np


class LeanDecoder:
    """Decode steps of `model` (a `engine.Model`, Llama family) on its own copy of a one-sequence KV cache."""

    def __init__(self, model, cache) -> None:
        c = model.config
        gemma_like = c.embed_scale != 1.0 or c.final_logit_softcapping or model.weights.layers[0].q_norm is not None
        if model.rope_layout != "half" or c.sliding_window or gemma_like or c.hidden_activation == "gelu_tanh":
            raise ValueError("the lean loop covers Llama models with the Hugging Face RoPE layout only")
        self.model, self.c = model, c
        self.k = [a[0].copy() for a in cache.k]                        # [h_kv, capacity, d] per layer
        self.v = [a[0].copy() for a in cache.v]
        self.pos = int(cache.lengths[0])
        half = c.head_dim // 2
        self.partner = np.concatenate([np.arange(half, 2 * half), np.arange(half)])

    def step(self, token: int) -> np.ndarray:
        """One token at the next position.   -> logits [V]"""
        c, w, pos = self.c, self.model.weights, self.pos
        h_q, h_kv, d, G, F = c.num_heads, c.num_kv_heads, c.head_dim, c.group_size, c.intermediate_size
        qk_end, eps, inv_d = c.q_dim + c.kv_dim, c.rms_norm_eps, 1.0 / c.hidden_size
        scale = np.float32(1.0 / math.sqrt(d))
        angle = pos * self.model._inv_freq
        cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        cos_full, signed_sin = np.concatenate([cos, cos]), np.concatenate([-sin, sin])
        x = w.embed[token].copy()
        n = pos + 1
        for lw, K, V in zip(w.layers, self.k, self.v):
            h = x * lw.attn_norm
            h *= np.float32(1.0 / math.sqrt(float(x @ x) * inv_d + eps))
            qkv = lw.wqkv @ h
            qk = qkv[:qk_end].reshape(h_q + h_kv, d)
            r = qk[:, self.partner]
            r *= signed_sin
            r += qk * cos_full
            K[:, pos] = r[h_q:]
            V[:, pos] = qkv[qk_end:].reshape(h_kv, d)
            s = np.matmul(r[:h_q].reshape(h_kv, G, d), K[:, :n].swapaxes(-1, -2))
            s -= s.max(-1, keepdims=True)
            s *= scale
            np.exp(s, out=s)
            o = np.matmul(s, V[:, :n])
            o /= s.sum(-1, keepdims=True)
            x += lw.wo @ o.reshape(-1)
            h = x * lw.ffn_norm
            h *= np.float32(1.0 / math.sqrt(float(x @ x) * inv_d + eps))
            gu = lw.w_gate_up @ h
            a = np.negative(gu[:F])
            np.exp(a, out=a)
            a += 1.0
            np.divide(gu[:F], a, out=a)
            a *= gu[F:]
            x += lw.w_down @ a
        h = x * w.final_norm
        h *= np.float32(1.0 / math.sqrt(float(x @ x) * inv_d + eps))
        self.pos += 1
        return h @ w.lm_head.T
