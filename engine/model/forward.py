"""The forward pass as small named steps (picoGPT spirit), each short enough to show beside the numbers it makes:

    x = embed(tokens, w, p)                   # [B, T] ids -> [B, T, D]
    for li, lw in enumerate(w.layers):
        x = block(x, lw, li, p)               # x + attention_block(x), then x + feed_forward(x)
    logits = lm_head(x, w, p, all_logits)     # [B, T, D] -> [B, V] (or [B, T, V])

`p` is a `Pass`: what every step of ONE call shares (positions, RoPE angles, the KV cache) and that call's own
instruments (trace, hooks). Nothing here is stored on the model, which stays read-only and shared.
Lines starting `if p.trace` count FLOPs and bytes (engine/model/trace.py); lines starting `if p.hooks` report named
activations (engine/model/hooks.py). Without instruments each costs one `if`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.model import ops
from engine.errors import ModelError
from engine.model.hooks import Hooks
from engine.model.kv_cache import KVCache
from engine.model.trace import Trace
from specs.model_config import ModelConfig

QUERY_BLOCK = 512    # queries per attention block: scores never exceed [B, h_q, QUERY_BLOCK, S]


@dataclass
class Pass:
    """What the steps of one forward call share. Built by `Pass.begin`, dropped when the call returns."""
    config: ModelConfig
    cache: KVCache
    n_valid: np.ndarray       # [B] real new tokens per row (the rest of the row is padding)
    start: np.ndarray         # [B] cache length before the call = position of each row's first new token
    positions: np.ndarray     # [B, T] absolute positions of the new tokens
    key_valid: np.ndarray     # [B, S] key j is a real token of row b
    rotation: ops.Rotation    # RoPE at the new tokens' positions (built once, applied in every layer)
    trace: Trace | None
    hooks: Hooks | None
    masked: bool              # False only when every query sees every key (one new token, no padding)
    local: "LocalKeys | None" = None   # sliding-window layers' keys (Gemma 3's local layers), None without any

    @classmethod
    def begin(cls, config: ModelConfig, tokens: np.ndarray, cache: KVCache, n_valid, inv_freq: np.ndarray,
              rope_layout: str, trace: Trace | None, hooks: Hooks | None,
              inv_freq_local: np.ndarray | None = None) -> "Pass":
        if tokens.ndim != 2:
            raise ModelError(f"tokens must be [batch, time], got shape {tokens.shape}")
        B, T = tokens.shape
        n_valid = np.full(B, T, np.int64) if n_valid is None else np.asarray(n_valid, np.int64)
        if B != cache.batch or n_valid.shape != (B,) or np.any(n_valid < 1) or np.any(n_valid > T):
            raise ModelError("tokens, n_valid and the cache batch size do not agree")
        if tokens.min() < 0 or tokens.max() >= config.vocab_size:
            raise ModelError(f"token id out of range [0, {config.vocab_size})")
        cache.check_room(n_valid)
        if hooks:
            hooks.begin_pass(config, T)
        start = cache.lengths.copy()
        positions = start[:, None] + np.arange(T)[None, :]
        n_keys = int((start + n_valid).max())
        key_valid = np.arange(n_keys)[None, :] < (start + n_valid)[:, None]
        rotation = ops.rope_rotation(*ops.rope_cos_sin(positions, inv_freq), rope_layout)
        if trace is not None:
            trace.start()
        masked = T > 1 or not key_valid.all()
        local = LocalKeys.begin(config, cache, positions, start + n_valid, inv_freq_local, rope_layout)
        return cls(config, cache, n_valid, start, positions, key_valid, rotation, trace, hooks or None, masked, local)

    @property
    def n_keys(self) -> int:          # S: keys the longest row attends (cached + new)
        return self.key_valid.shape[1]

    @property
    def rows(self) -> int:            # useful (non-padding) token rows, what the trace counts
        return int(self.n_valid.sum())

    def local_first_slot(self, start: int, window: int) -> int:
        """First key slot any query start.. of any row can see on a sliding-window layer (older ones are hidden
        for all of them, so a long prompt's block skips them)."""
        oldest = self.positions[:, start] - window + 1 - self.local.first                # [B]
        return int(max(0, oldest.min()))

    def window(self, li: int) -> int | None:
        """W on a sliding-window layer (it sees the last W positions), None on a full-attention layer."""
        return self.config.layer_window(li) if self.local is not None else None

    def hidden(self, start: int, end: int, window: int | None = None, first: int = 0) -> np.ndarray | None:
        """Which keys the queries start..end-1 may NOT see (future, padding, or, on a sliding-window layer, more
        than W - 1 positions back), for key slots first.. .   -> [B, 1, 1, t, S] bool or None"""
        q = self.positions[:, start:end]
        if window is not None:
            lk = self.local
            return ~ops.window_visible(q, lk.positions[:, first:], lk.valid[:, first:], window)[:, None, None]
        if not self.masked:
            return None
        return ~ops.causal_visible(q, self.n_keys, self.key_valid)[:, None, None]


@dataclass
class LocalKeys:
    """Where the keys of the sliding-window layers are: a cache may have dropped positions older than the window,
    so key slot j of row b holds position first[b] + j, not j. Also their RoPE angles (Gemma 3 rotates local
    layers with their own base, 10,000, and global layers with 1,000,000)."""
    first: np.ndarray         # [B] position in slot 0
    positions: np.ndarray     # [B, S_local] position held in each slot
    valid: np.ndarray         # [B, S_local] slot holds a real key (after this pass's writes)
    rotation: ops.Rotation | None   # RoPE of the new tokens with the local base (None: the global one)

    @classmethod
    def begin(cls, config: ModelConfig, cache: KVCache, positions: np.ndarray, ends: np.ndarray,
              inv_freq_local: np.ndarray | None, rope_layout: str) -> "LocalKeys | None":
        layers = [li for li in range(config.num_layers) if config.layer_window(li) is not None]
        if not layers:
            return None
        first = np.asarray(cache.first_kept(layers[0]), np.int64).copy()  # the same on every window layer
        n_slots = int((ends - first).max())
        pos = first[:, None] + np.arange(n_slots)[None, :]
        rotation = (None if inv_freq_local is None else
                    ops.rope_rotation(*ops.rope_cos_sin(positions, inv_freq_local), rope_layout))
        return cls(first, pos, pos < ends[:, None], rotation)

    @property
    def n_keys(self) -> int:
        return self.positions.shape[1]


def embed(tokens: np.ndarray, w, p: Pass) -> np.ndarray:
    """Each token id picks its row of the embedding table.   [B, T] -> [B, T, D]"""
    x = w.embed[tokens]
    if p.config.embed_scale != 1.0:                                                  # Gemma: × sqrt(D)
        x *= np.float32(p.config.embed_scale)
    if p.trace is not None:
        D = w.embed.shape[1]
        p.trace.add("embedding", None, weight_bytes=p.rows * D * 4,
                    shape=f"gather {p.rows} rows of {list(w.embed.shape)}")
    if p.hooks:
        p.hooks("hook_embed", x)
    return x


def block(x: np.ndarray, lw, li: int, p: Pass) -> np.ndarray:
    """One transformer layer: attention, then feed-forward, each ADDED to the residual stream.   [B, T, D] -> same"""
    if p.hooks:
        p.hooks(f"blocks.{li}.hook_resid_pre", x)
    x = x + attention_block(x, lw, li, p)
    if p.hooks:
        p.hooks(f"blocks.{li}.hook_resid_mid", x)
    x = x + feed_forward(x, lw, li, p)
    if p.hooks:
        p.hooks(f"blocks.{li}.hook_resid_post", x)
    return x


def attention_block(x: np.ndarray, lw, li: int, p: Pass) -> np.ndarray:
    """RMSNorm, fused Q/K/V projection, RoPE, append K/V to the cache, attend, output projection.
    Gemma 3 adds: RMSNorm of each q and k head before RoPE, its own RoPE base on sliding-window layers, and a norm
    of the output before it joins the residual stream.
    [B, T, D] -> [B, T, D] (what attention adds to the residual stream)"""
    c, (B, T, D) = p.config, x.shape
    h_q, h_kv, d, q_dim, kv_dim = c.num_heads, c.num_kv_heads, c.head_dim, c.q_dim, c.kv_dim
    window = p.window(li)                                                            # None: full attention
    h = ops.rms_norm(x, lw.attn_norm, c.rms_norm_eps)                                # [B, T, D]
    if p.trace is not None:
        p.trace.add("attn_norm", li, weight_bytes=D * 4, shape=f"[{B}, {T}, {D}]")
    qkv = linear(h, lw.wqkv, "qkv_proj", li, p)                                      # [B, T, q_dim + 2·kv_dim]
    qk = qkv[..., :q_dim + kv_dim].reshape(B, T, h_q + h_kv, d)                      # [B, T, h_q + h_kv, d]
    v = qkv[..., q_dim + kv_dim:].reshape(B, T, h_kv, d)                             # [B, T, h_kv, d]
    if lw.q_norm is not None:                                                        # Gemma 3: per-head q/k norm
        qk = np.concatenate([ops.rms_norm(qk[:, :, :h_q], lw.q_norm, c.rms_norm_eps),
                             ops.rms_norm(qk[:, :, h_q:], lw.k_norm, c.rms_norm_eps)], axis=2)
    rotate = p.local.rotation if window is not None and p.local.rotation is not None else p.rotation
    qk = rotate(qk)                                                                  # q and k heads: same angles
    q, k = qk[:, :, :h_q], qk[:, :, h_q:]                                            # [B, T, h_q|h_kv, d]
    if p.hooks:
        for name, a in (("hook_q", q), ("hook_k", k), ("hook_v", v)):
            p.hooks(f"blocks.{li}.attn.{name}", a)
    p.cache.write(li, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), p.n_valid)
    if p.hooks:
        p.hooks(f"blocks.{li}.attn.hook_kv_cache", p.start + p.n_valid)
    if p.trace is not None:
        p.trace.add("rope_and_kv_append", li, kv_write_bytes=float(p.rows * 2 * kv_dim * 4),
                    shape=f"append [{B}, {h_kv}, {T}, {d}] to K and V")
    K, V = p.cache.read(li, p.n_keys if window is None else p.local.n_keys)          # [B, h_kv, S, d] each
    qg = q.reshape(B, T, h_kv, c.group_size, d).transpose(0, 2, 3, 1, 4)             # [B, h_kv, G, T, d]
    o = attention(qg, K, V, li, p).transpose(0, 3, 1, 2, 4).reshape(B, T, q_dim)     # [B, T, h_q·d]
    if p.trace is not None:
        ctx = p.start + p.n_valid                                                    # keys per sequence
        if window is not None:                                # each query sees at most W keys
            ctx = np.minimum(ctx, window)
        p.trace.add("attention", li, flops=2 * 2.0 * d * h_q * float((p.n_valid * ctx).sum()),
                    kv_read_bytes=float(ctx.sum() * 2 * kv_dim * 4),
                    shape=f"[{B}, {h_q}, {T}, {d}] · [{B}, {h_kv}, {p.n_keys}, {d}]")
    out = linear(o, lw.wo, "o_proj", li, p)                                          # [B, T, D]
    if lw.post_attn_norm is not None:                                                # Gemma: norm what it adds
        out = ops.rms_norm(out, lw.post_attn_norm, c.rms_norm_eps)
    return out


def linear(x: np.ndarray, W: np.ndarray, op: str, li: int, p: Pass) -> np.ndarray:
    """y = x · Wᵀ (W kept [out, in]): 2·rows·in·out FLOPs, one read of W.   [B, T, in] -> [B, T, out]"""
    y = ops.matmul_t(x, W)                                                           # one BLAS call for the batch
    if p.trace is not None:
        B, T, n_in = x.shape
        p.trace.add(op, li, flops=2.0 * p.rows * n_in * W.shape[0], weight_bytes=W.nbytes,
                    shape=f"[{B}, {T}, {n_in}] @ [{n_in}, {W.shape[0]}]")
    return y


def attention(q: np.ndarray, K: np.ndarray, V: np.ndarray, li: int, p: Pass) -> np.ndarray:
    """softmax(q·Kᵀ/√d, future keys hidden)·V, QUERY_BLOCK queries at a time, so one block of scores at most.
    Gemma scales by 1/√query_pre_attn_scalar instead of 1/√d; on a sliding-window layer keys more than W - 1
    positions back are hidden too (and, without hooks, a block skips key slots no query of it can see).
    q [B, h_kv, G, T, d] (query head = kv_head·G + g), K, V [B, h_kv, S, d] -> [B, h_kv, G, T, d]"""
    T, window = q.shape[3], p.window(li)
    scale = 1.0 / math.sqrt(p.config.query_pre_attn_scalar or q.shape[-1])
    blocks = []
    for s in range(0, T, QUERY_BLOCK):
        e = min(s + QUERY_BLOCK, T)
        first = 0 if window is None or p.hooks else p.local_first_slot(s, window)   # earlier slots: all hidden
        scores = ops.gqa_attention_scores(q[:, :, :, s:e], K[:, :, first:], scale)  # [B, h_kv, G, t, S]
        hidden = p.hidden(s, e, window, first)                                       # [B, 1, 1, t, S] or None
        if hidden is not None:
            np.copyto(scores, -np.inf, where=hidden)
        if p.hooks:
            p.hooks.attention(li, "hook_scores", by_position(scores, p, window, -np.inf), s, e)
        pattern = ops.softmax_(scores, hidden_keys=hidden is not None)               # in place: rows sum to 1
        if p.hooks:
            p.hooks.attention(li, "hook_pattern", by_position(pattern, p, window, 0.0), s, e)
        blocks.append(ops.gqa_attention_output(pattern, V[:, :, first:]))          # [B, h_kv, G, t, d]
        del scores, pattern                                                          # before the next block exists
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=3)


def by_position(x: np.ndarray, p: Pass, window: int | None, fill: float) -> np.ndarray:
    """What hooks see: key columns by position. A sliding-window cache that dropped positions 0..first-1 holds key
    slot j = position first + j; one sequence's row gets `first` columns of `fill` in front (weight 0: out of the
    window).   [1, h_kv, G, t, S] -> [1, h_kv, G, t, first + S]"""
    first = int(p.local.first[0]) if window is not None and x.shape[0] == 1 else 0
    if not first:
        return x
    return np.concatenate([np.full((*x.shape[:-1], first), fill, x.dtype), x], axis=-1)


def feed_forward(x: np.ndarray, lw, li: int, p: Pass) -> np.ndarray:
    """RMSNorm, then SwiGLU: down(SiLU(gate(h)) · up(h)), gate and up fused. Gemma: GeGLU (tanh GELU instead of
    SiLU) and a norm of the output before it joins the residual stream.   [B, T, D] -> [B, T, D]"""
    c, (B, T, D) = p.config, x.shape
    F = c.intermediate_size
    h = ops.rms_norm(x, lw.ffn_norm, c.rms_norm_eps)                                 # [B, T, D]
    if p.trace is not None:
        p.trace.add("ffn_norm", li, weight_bytes=D * 4, shape=f"[{B}, {T}, {D}]")
    gu = linear(h, lw.w_gate_up, "gate_up_proj", li, p)                              # [B, T, 2F]
    if c.hidden_activation == "gelu_tanh":
        act = ops.gelu_tanh_glu(gu[..., :F], gu[..., F:])                            # [B, T, F] GELU(gate)·up
    else:
        act = ops.swiglu(gu[..., :F], gu[..., F:])                                   # [B, T, F] SiLU(gate)·up
    if p.hooks:
        p.hooks(f"blocks.{li}.mlp.hook_act", act)
    out = linear(act, lw.w_down, "down_proj", li, p)                                 # [B, T, D]
    if lw.post_ffn_norm is not None:                                                 # Gemma: norm what it adds
        out = ops.rms_norm(out, lw.post_ffn_norm, c.rms_norm_eps)
    return out


def lm_head(x: np.ndarray, w, p: Pass, all_logits: bool = False) -> np.ndarray:
    """Final RMSNorm, then one score per vocabulary entry.   [B, T, D] -> [B, V] (last real token) or [B, T, V]"""
    c, B = p.config, x.shape[0]
    if not all_logits:
        x = x[np.arange(B), p.n_valid - 1][:, None, :]                               # [B, 1, D]
    x = ops.rms_norm(x, w.final_norm, c.rms_norm_eps)
    if p.hooks:
        p.hooks("hook_final_norm", x)
    if p.trace is not None:
        p.trace.add("final_norm", None, weight_bytes=c.hidden_size * 4,
                    shape=f"[{B}, {x.shape[1]}, {c.hidden_size}]")
    logits = ops.matmul_t(x, w.lm_head)                                             # [B, T', V]
    if p.trace is not None:
        out_rows = p.rows if all_logits else B
        p.trace.add("lm_head", None, flops=2.0 * out_rows * c.hidden_size * c.vocab_size,
                    weight_bytes=w.lm_head.nbytes,
                    shape=f"[{B}, {x.shape[1]}, {c.hidden_size}] @ [{c.hidden_size}, {c.vocab_size}]")
    if c.final_logit_softcapping:                                                    # Gemma 2 (not Gemma 3)
        logits = ops.softcap(logits, c.final_logit_softcapping)
    if p.hooks:
        p.hooks("hook_logits", logits)
    return logits if all_logits else logits[:, 0]
