"""KV-cache size: per token and per sequence, for every attention variant.

003 Detail 6 ("The Three Levers") and Detail 10:
    KV bytes per token = Σ over attention layers of 2 (K and V) × h_kv × d_k × bytes_per_element
- MHA/GQA/MQA differ only in h_kv (TinyLlama FP16: 176 KB, 22 KB, 5.6 KB per token).
- Sliding-window layers keep min(tokens, window) positions (SWA; Gemma 2 alternates, Gemma 3 has 5 local : 1 global).
- MLA (DeepSeek V2/V3) caches one latent of kv_lora_rank plus the shared decoupled RoPE key of qk_rope_head_dim
  per layer: L × (d_c + d_h^R) elements per token (DeepSeek-V2 paper, Table 1: 60 × (512 + 64) = 34.6K).
- Linear-attention layers (gated delta rule, reference 002) cache nothing per token: each sequence keeps a fixed
  recurrent state [heads, head_k, head_v] in float32 per layer (plus a short-convolution state).
"""
from __future__ import annotations

from calculators import arch
from calculators.units import bytes_per_element, check_int, check_positive
from specs.model_config import ModelConfig

STATE_BYTES = 4          # 002: the recurrent state is float32
CONV_STATE_BYTES = 2     # the conv state holds activations (bf16)


def kv_elements_per_token_layer(config: ModelConfig, kind: str = arch.FULL) -> int:
    """Cached elements per token in one layer: 2·h_kv·d_k (K and V), kv_lora_rank + qk_rope_head_dim for MLA,
    0 for a linear-attention layer."""
    if kind == arch.LINEAR:
        return 0
    if arch.is_mla(config):
        return config.kv_lora_rank + config.qk_rope_head_dim
    return 2 * config.kv_dim


def kv_elements_per_token(config: ModelConfig) -> int:
    """Cached elements per token position over all layers (a sliding layer counts while under its window)."""
    return sum(kv_elements_per_token_layer(config, k) for k in arch.layer_kinds(config))


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str | float = "fp16") -> float:
    """Bytes of KV cache one token position adds, all layers. 003 Detail 10: TinyLlama GQA-4 at FP16:
    4 heads × 64 dims × 2 (K, V) × 22 layers × 2 B = 22,528 B = 22 KiB."""
    return kv_elements_per_token(config) * bytes_per_element(kv_dtype)


def kv_bytes_per_token_from_shape(num_layers: int, num_kv_heads: int, head_dim: int,
                                  bytes_per_elem: float = 2) -> float:
    """The lever formula of 003 Detail 6: 2 × L × h_kv × d_k × bytes (MHA: h_kv = h_q; MQA: h_kv = 1)."""
    L = check_int("num_layers", num_layers)
    h = check_int("num_kv_heads", num_kv_heads)
    d = check_int("head_dim", head_dim)
    return 2.0 * L * h * d * check_positive("bytes_per_elem", bytes_per_elem, 64)


def linear_state_bytes_per_layer(config: ModelConfig, include_conv: bool = True) -> float:
    """Fixed per-sequence state of one gated-delta-rule layer (reference 002): [max(h_k, h_v), head_k, head_v]
    float32, plus (optionally) the causal-conv state (kernel − 1) × conv channels in bf16. Context-independent."""
    L = arch.linear_dims(config)
    state = L["state_heads"] * L["head_k"] * L["head_v"] * STATE_BYTES
    conv = (L["conv_kernel"] - 1) * L["conv_dim"] * CONV_STATE_BYTES if include_conv else 0
    return float(state + conv)


def kv_cache_layers(config: ModelConfig, tokens: int, kv_dtype: str | float = "fp16",
                    include_conv: bool = True) -> list[dict]:
    """One row per layer kind present: kind, layers, tokens kept per layer, bytes per sequence (all such layers)."""
    c = config
    t = check_int("tokens", tokens, minimum=0, limit=1 << 40)
    b = bytes_per_element(kv_dtype)
    rows = []
    for kind, n in arch.kind_counts(c).items():
        if not n:
            continue
        if kind == arch.LINEAR:
            per_layer = linear_state_bytes_per_layer(c, include_conv)
            rows.append(dict(kind=kind, layers=n, tokens_kept=0, bytes=n * per_layer, fixed=True))
        else:
            kept = arch.window_tokens(c, kind, t)
            rows.append(dict(kind=kind, layers=n, tokens_kept=kept,
                             bytes=n * kept * kv_elements_per_token_layer(c, kind) * b, fixed=False))
    return rows


def kv_cache_bytes(config: ModelConfig, tokens: int, batch: int = 1, kv_dtype: str | float = "fp16",
                   include_linear_state: bool = True) -> float:
    """KV cache of `batch` sequences of `tokens` positions each: full layers keep every token, sliding layers
    min(tokens, window), linear-attention layers a fixed state. 003: TinyLlama at 2,048 tokens ≈ 45 MB (GQA-4);
    Llama-2-70B ≈ 0.67 GB (GQA-8) vs ≈ 5.4 GB had it used MHA."""
    B = check_int("batch", batch, limit=1 << 30)
    rows = kv_cache_layers(config, tokens, kv_dtype)
    return B * sum(r["bytes"] for r in rows if include_linear_state or not r["fixed"])


def mla_kv_elements_per_token(config: ModelConfig) -> int:
    """MLA cache per token: L × (kv_lora_rank + qk_rope_head_dim). DeepSeek-V2: 60 × (512 + 64) = 34,560."""
    if not arch.is_mla(config):
        raise ValueError(f"{config.name} does not use MLA")
    return kv_elements_per_token(config)


def kv_reduction(before: float, after: float) -> dict:
    """How much smaller: ratio before/after and percent saved, 100 × (1 − after/before).
    003 Detail 6: 860.2K → 34.6K elements is ≈ 25× fewer."""
    b, a = check_positive("before", before), check_positive("after", after)
    return dict(ratio=b / a, percent_saved=100.0 * (1 - a / b))
