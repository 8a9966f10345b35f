"""Parse a Hugging Face `config.json` dict into a `ModelConfig`.

Handles the Llama family (Llama, Mistral, Qwen2, ...) here; other families extend `parse_hf_config`.
Every problem raises `SpecError` with a message naming the key to fix.
"""
from __future__ import annotations

import math
from typing import Any

from specs.model_config import ModelConfig, SpecError


def _get(cfg: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _int(cfg: dict, what: str, *keys: str, default: Any = None) -> int:
    v = _get(cfg, *keys, default=default)
    if v is None:
        raise SpecError(f"config.json has no {keys[0]!r} ({what})")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v or v <= 0:
        raise SpecError(f"config.json: {keys[0]!r} ({what}) must be a positive integer, got {v!r}")
    return int(v)


def parse_hf_config(cfg: dict, name: str | None = None) -> ModelConfig:
    if not isinstance(cfg, dict):
        raise SpecError("config.json must be a JSON object")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
    model_type = str(cfg.get("model_type", "llama"))
    name = name or cfg.get("_name_or_path") or model_type
    hidden = _int(cfg, "hidden size", "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "attention heads", "num_attention_heads", "n_head", "num_heads")
    kv_heads = _int(cfg, "key/value heads", "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _int(cfg, "head dim", "head_dim", default=hidden // heads if hidden % heads == 0 else None)
    layers = _int(cfg, "layers", "num_hidden_layers", "n_layer", "num_layers")
    inter = _int(cfg, "FFN size", "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    vocab = _int(cfg, "vocabulary size", "vocab_size")
    ctx = _int(cfg, "context length", "max_position_embeddings", "n_positions", "max_seq_len", default=2048)
    theta = float(_get(cfg, "rope_theta", default=10000.0))
    eps = float(_get(cfg, "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", default=1e-6))
    rope_scaling = cfg.get("rope_scaling")
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise SpecError("config.json: 'rope_scaling' must be an object or null")
    if heads % kv_heads:
        raise SpecError(f"config.json: num_attention_heads ({heads}) is not a multiple of "
                        f"num_key_value_heads ({kv_heads})")
    attention = "mha" if kv_heads == heads else ("mqa" if kv_heads == 1 else "gqa")
    return ModelConfig(
        name=str(name), hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=ctx,
        rope_theta=theta, rope_scaling=rope_scaling, rms_norm_eps=eps,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16"),
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id"),
        model_type=model_type, attention=attention, sliding_window=cfg.get("sliding_window"),
    )
