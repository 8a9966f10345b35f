"""Which kind each layer is: full attention, sliding-window attention, linear (gated delta rule) attention, MLA;
dense FFN or mixture of experts. Every calculator walks layers through these helpers so one rule holds everywhere.
"""
from __future__ import annotations

import functools
import threading
from collections import Counter

from specs.model_config import ModelConfig, SpecError

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"


def check_config(config) -> ModelConfig:
    if not isinstance(config, ModelConfig):
        raise SpecError(f"expected a ModelConfig, got {type(config).__name__}")
    return config


def layer_kinds(config: ModelConfig) -> tuple[str, ...]:
    """Attention kind per layer. Without `layer_types`, a model with a sliding window windows every layer
    (Mistral); otherwise every layer is full attention."""
    c = check_config(config)
    if c.layer_types is not None:
        if len(c.layer_types) != c.num_layers:
            raise SpecError(f"{c.name}: layer_types has {len(c.layer_types)} entries for {c.num_layers} layers")
        return tuple(c.layer_types)
    kind = SLIDING if c.sliding_window else FULL
    return (kind,) * c.num_layers


def kind_counts(config: ModelConfig) -> dict[str, int]:
    """{'full_attention': n, 'sliding_attention': n, 'linear_attention': n} (all three keys present)."""
    n = Counter(layer_kinds(config))
    return {FULL: n.get(FULL, 0), SLIDING: n.get(SLIDING, 0), LINEAR: n.get(LINEAR, 0)}


def is_mla(config: ModelConfig) -> bool:
    return config.kv_lora_rank is not None


def per_config(fn):
    """Memoise `fn(config, *args)`, a pure function of a (frozen) ModelConfig and hashable arguments, by the
    config's identity and the arguments (a ModelConfig holds dicts, so it cannot be hashed). The cache holds the
    config itself, so its id cannot be reused while cached; the oldest of 512 entries goes first. Unhashable
    arguments are computed, not cached."""
    cache: dict = {}
    lock = threading.Lock()

    @functools.wraps(fn)
    def cached(config, *args, **kw):
        try:
            key = (id(config), args, tuple(sorted(kw.items())))
            hit = cache.get(key)
        except TypeError:
            return fn(config, *args, **kw)
        if hit is not None and hit[0] is config:
            return hit[1]
        out = fn(config, *args, **kw)
        with lock:                            # browser sessions run in threads: evict and insert one at a time
            if len(cache) >= 512:
                cache.pop(next(iter(cache)), None)
            cache[key] = (config, out)
        return out
    return cached


def is_moe(config: ModelConfig) -> bool:
    return bool(config.num_experts)


def is_moe_layer(config: ModelConfig, i: int) -> bool:
    """DeepSeek: layers from `first_k_dense_replace` on; Qwen-MoE: every `decoder_sparse_step`-th layer."""
    c = config
    return is_moe(c) and i >= c.first_k_dense_layers and (i + 1) % max(c.moe_layer_step, 1) == 0


def moe_layer_count(config: ModelConfig) -> int:
    """Layers i < L with `is_moe_layer`: i ≥ first_k_dense_layers and (i + 1) a multiple of the step s, i.e. the
    multiples of s in (first_k, L]: floor(L / s) − floor(first_k / s) (counted, not looped: the planner asks often)."""
    c = config
    if not is_moe(c) or c.first_k_dense_layers >= c.num_layers:
        return 0
    s = max(c.moe_layer_step, 1)
    return c.num_layers // s - c.first_k_dense_layers // s


def window_tokens(config: ModelConfig, kind: str, tokens: int) -> int:
    """Keys a layer of `kind` keeps for a sequence of `tokens`: all of them, or min(tokens, window)."""
    if kind == SLIDING:
        if not config.sliding_window:
            raise SpecError(f"{config.name}: sliding_attention layers need a sliding_window")
        return min(tokens, config.sliding_window)
    return tokens


def q_out_dim(config: ModelConfig) -> int:
    """Width of q_proj's output: h_q·d_k, doubled when the projection also emits an output gate (Qwen3-Next)."""
    return config.q_dim * (2 if config.attn_output_gate else 1)


def linear_dims(config: ModelConfig) -> dict[str, int]:
    """Gated-delta-rule layer sizes (Qwen3-Next): key_dim, value_dim, state heads, conv channels."""
    c = config
    if c.linear_num_value_heads is None:
        raise SpecError(f"{c.name} has linear_attention layers but no linear_num_value_heads")
    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    key_dim, value_dim = nk * dk, nv * dv
    return dict(num_k_heads=nk, num_v_heads=nv, head_k=dk, head_v=dv, key_dim=key_dim, value_dim=value_dim,
                state_heads=max(nk, nv),                          # 002: num_sab_heads = max(q/k heads, v heads)
                conv_dim=2 * key_dim + value_dim, conv_kernel=c.linear_conv_kernel_dim or 4)
