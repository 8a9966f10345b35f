"""The same model with a different number of K/V heads: what its cache would weigh as MHA (one K/V head per query
head), as it is (GQA), or as MQA (one K/V head for all). 003 Detail 6: TinyLlama at FP16 holds 176 KB (MHA),
22 KB (GQA-4) or 5.5 KB (MQA) per token position.
"""
from __future__ import annotations

from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes
from specs.model_config import ModelConfig


def attention_variants(config: ModelConfig) -> dict[str, ModelConfig]:
    """MHA, the model as it is, and MQA: the config with num_kv_heads = num_heads, unchanged, and 1."""
    out = {"MHA": config.replace(num_kv_heads=config.num_heads)}
    if 1 < config.num_kv_heads < config.num_heads:
        out[f"GQA-{config.num_kv_heads} (this model)"] = config
    out["MQA"] = config.replace(num_kv_heads=1)
    return out


def kv_variant_rows(config: ModelConfig, tokens: int, kv_dtype: str | float = "fp32") -> list[dict]:
    """Per variant: K/V heads, bytes per token position (all layers) and bytes for `tokens` positions (003 Details
    6 and 10: 2 × L × h_kv × d_k × bytes per element, per token)."""
    return [dict(variant=name, kv_heads=c.num_kv_heads, bytes_per_token=kv_bytes_per_token(c, kv_dtype),
                 cache_bytes=kv_cache_bytes(c, tokens, kv_dtype=kv_dtype))
            for name, c in attention_variants(config).items()]
