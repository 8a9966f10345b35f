"""The leanest NumPy decode step for a Llama: what the work between the weight products costs at the very least
with NumPy on this machine, so that `bench_engine.py` can show how close to it the engine's named steps come.

Not an engine: one sequence, full attention, the Hugging Face ("half") RoPE layout, no hooks, no trace, no
checks. One flat loop with the dimensions in locals, the residual stream updated in place, and the fewest NumPy
calls each step needs; it borrows the engine's one-row RMSNorm, SwiGLU and RoPE tables (`ops`). `bench_engine.py` checks its logits against the engine's
before timing it.
"""
from __future__ import annotations

import math

import numpy as np

from engine.model import ops


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

    def step(self, token: int) -> np.ndarray:
        """One token at the next position.   -> logits [V]"""
        c, w, pos = self.c, self.model.weights, self.pos
        h_q, h_kv, d, G, F = c.num_heads, c.num_kv_heads, c.head_dim, c.group_size, c.intermediate_size
        qk_end, eps = c.q_dim + c.kv_dim, c.rms_norm_eps
        scale = np.float32(1.0 / math.sqrt(d))
        rot = ops.rope_rotation(*ops.rope_cos_sin(np.array([pos]), self.model._inv_freq), "half")
        cos_full, signed_sin = rot.cos.reshape(d), rot.signed_sin.reshape(d)
        x = w.embed[token].copy()
        n = pos + 1
        for lw, K, V in zip(w.layers, self.k, self.v):
            qkv = lw.wqkv @ ops.rms_norm(x, lw.attn_norm, eps)
            qk = qkv[:qk_end].reshape(h_q + h_kv, d)
            r = qk[:, rot.partner]
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
            gu = lw.w_gate_up @ ops.rms_norm(x, lw.ffn_norm, eps)
            x += lw.w_down @ ops.swiglu(gu[:F], gu[F:])
        self.pos += 1
        return ops.rms_norm(x, w.final_norm, eps) @ w.lm_head.T
