"""Parse a Hugging Face `config.json` dict of a decoder-only model into a `ModelConfig`.

Families understood (the keys each one uses are listed next to its branch below):
- Llama, Mistral, Mixtral, Qwen2/2.5, Qwen3 (dense and MoE): GQA, optional sliding window, MoE experts.
- Gemma 2 / Gemma 3: sliding-window layers in a pattern (Gemma 2 alternates; Gemma 3 has 5 local : 1 global),
  four norms per layer, tied embeddings; multimodal configs are read from their `text_config`.
- DeepSeek V2 / V3: multi-head latent attention (kv_lora_rank, q_lora_rank, qk_rope_head_dim, ...) and MoE with
  `first_k_dense_replace` dense layers and `n_shared_experts`.
- Qwen3-Next: hybrid layers (gated-delta-rule linear attention + full attention every `full_attention_interval`-th
  layer, or an explicit `layer_types` list), gated attention output, very sparse MoE with a shared expert.
- OPT / GPT-2 style: no `num_key_value_heads` means MHA, a 2-matrix MLP, LayerNorm with biases, learned positions,
  GPT-2 key names (n_embd, n_head, n_layer, n_positions, n_inner).
Encoder-decoder (T5, BART, Whisper, ...) and encoder-only (BERT, ...) models are refused.
Every problem raises `SpecError` whose message names the key to fix.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specs.model_config import ModelConfig, SpecError

# Upper bounds that no real decoder-only model comes near; larger values are typos (or unit mix-ups).
_MAX = {
    "hidden size": 1 << 20, "attention heads": 1 << 14, "key/value heads": 1 << 14, "head dim": 1 << 14,
    "layers": 10_000, "FFN size": 1 << 24, "vocabulary size": 1 << 26, "context length": 1 << 34,
    "experts": 1 << 16, "experts per token": 1 << 16, "shared experts": 1 << 10, "MoE FFN size": 1 << 24,
    "sliding window": 1 << 34, "latent rank": 1 << 16, "linear-attention heads": 1 << 14,
    "linear-attention head dim": 1 << 14, "convolution width": 1 << 10, "dense layers": 10_000,
    "MoE layer step": 10_000, "full-attention interval": 10_000, "position table rows": 1 << 34,
}

ENCODER_DECODER = {"t5", "mt5", "umt5", "longt5", "bart", "mbart", "whisper", "pegasus", "pegasus_x", "marian",
                   "led", "prophetnet", "fsmt", "blenderbot", "blenderbot-small", "m2m_100", "nllb-moe",
                   "switch_transformers", "encoder-decoder", "speech-encoder-decoder", "vision-encoder-decoder",
                   "seamless_m4t", "seamless_m4t_v2", "bigbird_pegasus", "plbart", "mvp", "xlm-prophetnet"}
ENCODER_ONLY = {"bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "distilbert", "electra", "albert",
                "camembert", "modernbert", "nomic_bert", "mpnet", "ernie"}
# Families whose MLP is two matrices (up, down) with a plain activation instead of a gated (3-matrix) one.
NON_GATED_MLP = {"opt", "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "bloom", "falcon", "phi", "starcoder2", "mpt",
                 "gpt_neo", "codegen"}
LAYERNORM_FAMILIES = NON_GATED_MLP | {"stablelm", "olmo"}
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "opt", "gpt_bigcode", "bloom", "gpt_neo",
                   "codegen", "starcoder2"}
QK_NORM_FAMILIES = {"gemma3", "gemma3_text", "qwen3", "qwen3_moe", "qwen3_next", "olmo2", "olmoe"}
# Keys a family's config class fills in when config.json leaves them out (HF writes only non-default keys).
FAMILY_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
                    "rms_norm_eps": 1e-6, "sliding_window": 4096, "sliding_window_pattern": 6, "head_dim": 256},
    "gemma2": {"head_dim": 256, "sliding_window": 4096},
    "gemma3": {"vocab_size": 262208, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
               "rms_norm_eps": 1e-6, "sliding_window": 4096, "sliding_window_pattern": 6, "head_dim": 256},
    "qwen3_next": {"full_attention_interval": 4, "linear_conv_kernel_dim": 4},
}
LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")


def _get(cfg: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _int(cfg: dict, what: str, *keys: str, default: Any = None, allow_zero: bool = False) -> int:
    """The first present key as a positive integer (or `default`); anything else is a SpecError."""
    v = _get(cfg, *keys, default=default)
    if v is None:
        raise SpecError(f"config.json has no {keys[0]!r} ({what})")
    kind = "a non-negative integer" if allow_zero else "a positive integer"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v:
        raise SpecError(f"config.json: {keys[0]!r} ({what}) must be {kind}, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise SpecError(f"config.json: {keys[0]!r} ({what}) must be {kind}, got {v!r}")
    limit = _MAX.get(what)
    if limit is not None and v > limit:
        raise SpecError(f"config.json: {keys[0]!r} ({what}) = {v!r} is implausibly large (limit {limit:,})")
    return int(v)


def _opt_int(cfg: dict, what: str, *keys: str, allow_zero: bool = False) -> int | None:
    return _int(cfg, what, *keys, allow_zero=allow_zero) if _get(cfg, *keys) is not None else None


def _float(cfg: dict, what: str, *keys: str, default: float) -> float:
    v = _get(cfg, *keys, default=default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SpecError(f"config.json: {keys[0]!r} ({what}) must be a positive number, got {v!r}")
    return float(v)


def _flag(cfg: dict, key: str, default: bool) -> bool:
    v = cfg.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise SpecError(f"config.json: {key!r} must be true or false, got {v!r}")
    return v


def _layer_types(cfg: dict, model_type: str, layers: int, window: int | None,
                 linear: bool) -> tuple[str, ...] | None:
    """Per-layer attention kind, from an explicit list or from the family's pattern rule."""
    lt = cfg.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list) or len(lt) != layers:
            raise SpecError(f"config.json: 'layer_types' must be a list of {layers} entries (one per layer)")
        bad = sorted({str(t) for t in lt if t not in LAYER_KINDS})
        if bad:
            raise SpecError(f"config.json: 'layer_types' has unsupported entries {bad}; "
                            f"supported: {', '.join(LAYER_KINDS)}")
        return tuple(lt)
    if linear:  # Qwen3-Next: a full-attention layer every `full_attention_interval`-th layer, the rest linear
        k = _int(cfg, "full-attention interval", "full_attention_interval", default=4)
        return tuple("full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(layers))
    if window is None:
        return None
    if model_type == "gemma2":  # layer 0 local, layer 1 global, ...
        return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers))
    if model_type in ("gemma3", "gemma3_text"):  # 5 local : 1 global
        k = _int(cfg, "sliding window pattern", "sliding_window_pattern", default=6)
        return tuple("sliding_attention" if (i + 1) % k else "full_attention" for i in range(layers))
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # Qwen: the first `max_window_layers` layers use full attention, the rest the window
        m = _int(cfg, "window start layer", "max_window_layers", default=layers, allow_zero=True)
        return tuple("full_attention" if i < m else "sliding_attention" for i in range(layers))
    return tuple("sliding_attention" for _ in range(layers))  # Mistral: every layer windowed


def lift_rope_parameters(cfg: dict) -> dict:
    """transformers >= 5 writes {"rope_parameters": {"rope_theta": ..., "rope_type": ..., ...}} instead of the
    classic top-level rope_theta / rope_scaling keys; copy them up (classic keys win when both are present)."""
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, dict):
        return cfg
    if isinstance(rp.get("full_attention"), dict):       # one entry per layer type (Gemma 3): global layers'
        rp = rp["full_attention"]                        # here; the local base is read by `_gemma_fields`
    cfg = dict(cfg)
    if "rope_theta" in rp:
        cfg.setdefault("rope_theta", rp["rope_theta"])
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    if scaling.get("rope_type", "default") != "default" and cfg.get("rope_scaling") is None:
        cfg["rope_scaling"] = scaling
    return cfg


GEMMA_FAMILIES = ("gemma2", "gemma3", "gemma3_text")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")


def _gemma_fields(cfg: dict, model_type: str, hidden: int, head_dim: int) -> dict:
    """Gemma 2/3: embeddings × sqrt(D), GeGLU (tanh GELU), scores ÷ sqrt(query_pre_attn_scalar), and for Gemma 3
    its own RoPE base on the sliding-window layers (`rope_local_base_freq`, or transformers 5's
    rope_parameters["sliding_attention"])."""
    if model_type not in GEMMA_FAMILIES:
        return {}
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh")
    if act not in GELU_TANH:
        raise SpecError(f"config.json: hidden_activation {act!r} is not a Gemma activation ({', '.join(GELU_TANH)})")
    out = dict(hidden_activation="gelu_tanh", embed_scale=math.sqrt(hidden),
               query_pre_attn_scalar=_float(cfg, "query scale", "query_pre_attn_scalar", default=head_dim))
    cap = cfg.get("final_logit_softcapping")
    if cap is not None:
        out["final_logit_softcapping"] = _float(cfg, "logit soft cap", "final_logit_softcapping", default=1.0)
    if model_type != "gemma2":
        rp = cfg.get("rope_parameters")
        local = rp.get("sliding_attention") if isinstance(rp, dict) else None
        base = local.get("rope_theta") if isinstance(local, dict) else None
        out["rope_local_theta"] = float(base) if base is not None else \
            _float(cfg, "local RoPE base", "rope_local_base_freq", default=10000.0)
    return out


def _fp8_weight_block(cfg: dict) -> tuple[int, int] | None:
    """The block of FP8 weights sharing one scale (`quantization_config.weight_block_size`, quant_method fp8:
    DeepSeek-V3/R1 publish [128, 128]), None where the checkpoint is not block-scaled FP8."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or str(q.get("quant_method", "")).lower() != "fp8" or q.get("weight_block_size") is None:
        return None
    b = q["weight_block_size"]
    if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                 and x > 0 for x in b)):
        raise SpecError(f"quantization_config.weight_block_size must be two whole numbers > 0 (rows, columns of a "
                        f"block sharing one FP8 scale, e.g. [128, 128]), got {b!r}")
    return int(b[0]), int(b[1])


def parse_hf_config(cfg: dict, name: str | None = None) -> ModelConfig:
    """`ModelConfig` from a Hugging Face `config.json` dict (decoder-only models; see the module docstring)."""
    if not isinstance(cfg, dict):
        raise SpecError("config.json must be a JSON object (a dict of keys such as hidden_size, "
                        f"num_hidden_layers, ...), got {type(cfg).__name__}")
    outer_name = cfg.get("_name_or_path")
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg and "n_embd" not in cfg:
        # multimodal wrapper (Gemma 3, ...): the language model lives in text_config
        carried = {k: cfg[k] for k in ("torch_dtype", "bos_token_id", "eos_token_id") if k in cfg}
        cfg = {**carried, **cfg["text_config"], "_name_or_path": outer_name,
               "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    cfg = lift_rope_parameters(cfg)
    model_type = str(cfg.get("model_type") or "llama").lower()
    cfg = {**FAMILY_DEFAULTS.get(model_type, {}), **cfg}
    if model_type in ENCODER_DECODER or cfg.get("is_encoder_decoder") is True:
        raise SpecError(f"model_type {model_type!r} is an encoder-decoder model; only decoder-only models "
                        "(Llama, Mistral, Qwen, Gemma, DeepSeek, OPT, GPT-2, ...) are supported")
    if model_type in ENCODER_ONLY:
        raise SpecError(f"model_type {model_type!r} is an encoder-only model; only decoder-only models "
                        "(Llama, Mistral, Qwen, Gemma, DeepSeek, OPT, GPT-2, ...) are supported")
    name = name or outer_name or cfg.get("_name_or_path") or model_type

    hidden = _int(cfg, "hidden size", "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "attention heads", "num_attention_heads", "n_head", "num_heads")
    if cfg.get("multi_query") is True and _get(cfg, "num_key_value_heads", "num_kv_heads") is None:
        kv_heads = 1                                     # Falcon-7B style MQA flag
    else:
        kv_heads = _int(cfg, "key/value heads", "num_key_value_heads", "num_kv_heads", default=heads)
    if heads % kv_heads:
        raise SpecError(f"config.json: num_attention_heads ({heads}) is not a multiple of "
                        f"num_key_value_heads ({kv_heads})")
    layers = _int(cfg, "layers", "num_hidden_layers", "n_layer", "num_layers")
    vocab = _int(cfg, "vocabulary size", "vocab_size")
    ctx = _int(cfg, "context length", "max_position_embeddings", "n_positions", "max_seq_len",
               "seq_length", default=2048)
    theta = _float(cfg, "RoPE base", "rope_theta", default=10000.0)
    eps = _float(cfg, "norm epsilon", "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", default=1e-6)
    rope_scaling = cfg.get("rope_scaling")
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise SpecError("config.json: 'rope_scaling' must be an object or null")

    gpt_style = model_type in NON_GATED_MLP or "n_embd" in cfg
    inter = _int(cfg, "FFN size", "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)

    # --- attention shape: MLA, or plain heads -------------------------------------------------------------
    mla = _get(cfg, "kv_lora_rank") is not None
    mla_fields: dict = {}
    if mla:
        rope = _int(cfg, "decoupled RoPE key dim", "qk_rope_head_dim")
        nope = _int(cfg, "head dim", "qk_nope_head_dim")
        mla_fields = dict(kv_lora_rank=_int(cfg, "latent rank", "kv_lora_rank"),
                          q_lora_rank=_opt_int(cfg, "latent rank", "q_lora_rank"),
                          qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                          v_head_dim=_int(cfg, "head dim", "v_head_dim", default=nope))
        head_dim = nope + rope
    else:
        if _get(cfg, "head_dim") is None and hidden % heads:
            raise SpecError(f"config.json: hidden_size ({hidden}) is not divisible by num_attention_heads "
                            f"({heads}); add 'head_dim'")
        head_dim = _int(cfg, "head dim", "head_dim", default=hidden // heads)

    # --- linear attention (gated delta rule) ----------------------------------------------------------------
    linear = _get(cfg, "linear_num_value_heads") is not None or (
        isinstance(cfg.get("layer_types"), list) and "linear_attention" in cfg["layer_types"])
    lin_fields: dict = {}
    if linear:
        lin_fields = dict(
            linear_num_key_heads=_int(cfg, "linear-attention heads", "linear_num_key_heads"),
            linear_num_value_heads=_int(cfg, "linear-attention heads", "linear_num_value_heads"),
            linear_key_head_dim=_int(cfg, "linear-attention head dim", "linear_key_head_dim"),
            linear_value_head_dim=_int(cfg, "linear-attention head dim", "linear_value_head_dim"),
            linear_conv_kernel_dim=_int(cfg, "convolution width", "linear_conv_kernel_dim", default=4))
        nk, nv = lin_fields["linear_num_key_heads"], lin_fields["linear_num_value_heads"]
        if max(nk, nv) % min(nk, nv):
            raise SpecError(f"config.json: linear_num_value_heads ({nv}) and linear_num_key_heads ({nk}) "
                            "must divide one another")

    # --- sliding window and per-layer pattern ---------------------------------------------------------------
    window = _opt_int(cfg, "sliding window", "sliding_window")
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next") and not cfg.get("use_sliding_window"):
        window = None                                     # Qwen configs carry a window they do not use
    layer_types = _layer_types(cfg, model_type, layers, window, linear)
    if layer_types and "sliding_attention" in layer_types and window is None:
        raise SpecError("config.json: 'layer_types' has sliding_attention layers but no 'sliding_window'")

    # --- mixture of experts ---------------------------------------------------------------------------------
    n_exp = _opt_int(cfg, "experts", "num_local_experts", "n_routed_experts", "num_experts", allow_zero=True)
    moe_fields: dict = {}
    if n_exp:
        top_k = _int(cfg, "experts per token", "num_experts_per_tok", "moe_top_k", "top_k")
        if top_k > n_exp:
            raise SpecError(f"config.json: num_experts_per_tok ({top_k}) exceeds the number of experts ({n_exp})")
        shared_width = _opt_int(cfg, "MoE FFN size", "shared_expert_intermediate_size")
        n_shared = _int(cfg, "shared experts", "n_shared_experts", default=1 if shared_width else 0,
                        allow_zero=True)
        moe_fields = dict(
            num_experts=n_exp, num_experts_per_tok=top_k, num_shared_experts=n_shared,
            moe_intermediate_size=_int(cfg, "MoE FFN size", "moe_intermediate_size", default=inter),
            shared_expert_intermediate_size=shared_width,
            first_k_dense_layers=_int(cfg, "dense layers", "first_k_dense_replace", default=0, allow_zero=True),
            moe_layer_step=_int(cfg, "MoE layer step", "decoder_sparse_step", "moe_layer_freq", default=1))
        if model_type in ("llama4", "llama4_text"):
            # Llama 4: intermediate_size is the expert width, intermediate_size_mlp the dense layers' FFN; MoE
            # every `interleave_moe_layer_step`-th layer, each with one always-on shared expert of expert width
            moe_fields.update(moe_intermediate_size=inter, num_shared_experts=1,
                              moe_layer_step=_int(cfg, "MoE layer step", "interleave_moe_layer_step", default=1))
            inter = _int(cfg, "FFN size", "intermediate_size_mlp", default=inter)
        if moe_fields["first_k_dense_layers"] > layers:
            raise SpecError(f"config.json: first_k_dense_replace ({moe_fields['first_k_dense_layers']}) "
                            f"exceeds num_hidden_layers ({layers})")

    # --- small per-family details (biases, norms, positions, tying) ------------------------------------------
    if model_type == "opt":
        pos_rows = ctx + 2                                # OPT's learned positions are offset by 2
    elif model_type in ("gpt2", "gpt_bigcode", "gpt_neo"):
        pos_rows = ctx
    else:
        pos_rows = 0
    linear_bias = model_type in ("opt", "gpt2", "gpt_bigcode", "gpt_neo", "phi", "starcoder2", "gptj",
                                 "codegen") or (model_type == "gpt_neox" and _flag(cfg, "use_bias", True))
    if model_type == "opt":
        linear_bias = _flag(cfg, "enable_bias", True)
    qkv_bias = model_type in ("qwen2", "qwen2_moe") or _flag(cfg, "attention_bias", False) or \
        _flag(cfg, "qkv_bias", False)
    if mla:
        attention = "mla"
    else:
        attention = "mha" if kv_heads == heads else ("mqa" if kv_heads == 1 else "gqa")
    source = str(outer_name or cfg.get("_name_or_path") or "")

    return ModelConfig(
        name=str(name), hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=ctx,
        rope_theta=theta, rope_scaling=rope_scaling, rms_norm_eps=eps,
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings", model_type in TIED_BY_DEFAULT),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16"),
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id"),
        model_type=model_type, attention=attention, sliding_window=window, layer_types=layer_types,
        mlp="gelu" if gpt_style else "swiglu", source=source,
        qkv_bias=qkv_bias, linear_bias=linear_bias,
        norm_type="layernorm" if model_type in LAYERNORM_FAMILIES or gpt_style else "rmsnorm",
        norms_per_layer=4 if model_type in ("gemma2", "gemma3", "gemma3_text") else
        (1 if model_type in ("gptj", "phi", "codegen") else 2),
        qk_norm=model_type in QK_NORM_FAMILIES,
        attn_output_gate=_flag(cfg, "attn_output_gate", model_type == "qwen3_next"),
        learned_position_embeddings=pos_rows, fp8_weight_block=_fp8_weight_block(cfg),
        **mla_fields, **lin_fields, **moe_fields, **_gemma_fields(cfg, model_type, hidden, head_dim),
    )


def config_from_json_file(path: str | Path, name: str | None = None) -> ModelConfig:
    """A `ModelConfig` from a Hugging Face config.json on disk (its folder's name unless `name` is given)."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"config file not found: {p}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"{p} is not valid JSON ({e}); expected a Hugging Face config.json") from None
    return parse_hf_config(cfg, name=name or p.parent.name or p.stem)
