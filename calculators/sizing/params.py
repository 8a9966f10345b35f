"""Parameter counts by component and the bytes they take at each precision.

Shapes follow the Hugging Face implementations of each family (Llama/Mistral/Qwen2: q,k,v,o + gate/up/down;
DeepSeek V2/V3 MLA: q_a/q_b/kv_a/kv_b/o with their latent norms; Qwen3-Next gated DeltaNet: in_proj_qkvz,
in_proj_ba, depthwise conv, out_proj; OPT/GPT-2: two-matrix MLP, LayerNorm and linear biases) and reference 000
(w_q [D, h_q, d_k], w_k/w_v [D, h_kv, d_k], w_o [h_q, d_k, D], w_gate/w_up [D, F], w_down [F, D], w_emb [V, D]).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from calculators import arch
from calculators.units import DTYPE_BITS, bytes_per_element, check_int, dtype_name
from specs.model_config import ModelConfig, SpecError


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts of a whole model, by component. `active` = what one token uses (MoE: top-k + shared)."""
    embedding: int            # token table V·D (+ learned position table)
    attention: int            # every layer's attention weights (q/k/v/o or MLA or linear-attention pieces)
    ffn_dense: int            # dense FFN layers (gate/up/down, or up/down for GELU MLPs)
    experts_routed: int       # all routed experts of all MoE layers
    experts_shared: int       # shared experts (always active)
    router: int               # MoE gating matrices
    norms: int                # per-layer norms + final norm
    lm_head: int              # V·D, or 0 when tied to the embedding
    total: int
    active: int               # per token: total minus the routed experts it does not use
    tied: bool
    attention_parts: dict = field(default_factory=dict)  # name -> count over all layers

    def as_dict(self) -> dict:
        return asdict(self)


def attention_parts_per_layer(config: ModelConfig, kind: str = arch.FULL) -> dict[str, int]:
    """Weights of ONE attention layer of `kind`, by tensor (biases and q/k norms included)."""
    c, D = config, config.hidden_size
    if kind == arch.LINEAR:
        L = arch.linear_dims(c)
        return {"in_proj_qkvz": D * (2 * L["key_dim"] + 2 * L["value_dim"]),   # q, k, v and the output gate z
                "in_proj_ba": D * 2 * L["num_v_heads"],                       # beta (update) and alpha (decay)
                "conv1d": L["conv_dim"] * L["conv_kernel"],                   # depthwise causal conv, no bias
                "dt_bias_A_log": 2 * L["num_v_heads"],
                "norm": L["head_v"],
                "out_proj": L["value_dim"] * D}
    if arch.is_mla(c):
        h, nope, rope, vd = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        r_kv, r_q = c.kv_lora_rank, c.q_lora_rank
        parts = {"q_a_proj": D * r_q, "q_a_norm": r_q, "q_b_proj": r_q * h * (nope + rope)} if r_q else \
            {"q_proj": D * h * (nope + rope)}
        parts.update({"kv_a_proj": D * (r_kv + rope),        # latent c_kv plus the shared decoupled RoPE key
                      "kv_a_norm": r_kv,
                      "kv_b_proj": r_kv * h * (nope + vd),   # up-projection to per-head K_nope and V
                      "o_proj": h * vd * D})
        return parts
    qo, kv = arch.q_out_dim(c), c.kv_dim
    parts = {"q_proj": D * qo, "k_proj": D * kv, "v_proj": D * kv, "o_proj": c.q_dim * D}
    if c.qkv_bias or c.linear_bias:
        parts["qkv_bias"] = qo + 2 * kv
    if c.linear_bias:
        parts["o_bias"] = D
    if c.qk_norm:
        parts["qk_norm"] = 2 * c.head_dim
    return parts


def dense_ffn_params_per_layer(config: ModelConfig, width: int | None = None) -> int:
    """One dense FFN: 3·D·F for gated (SwiGLU/GeGLU: gate, up, down), 2·D·F for a plain GELU/ReLU MLP, plus
    biases when the family has them. 003 Detail 8: TinyLlama 3 × 2,048 × 5,632 ≈ 34.6M per layer."""
    c = config
    F = c.intermediate_size if width is None else width
    n = (2 if c.mlp == "gelu" else 3) * c.hidden_size * F
    if c.linear_bias:
        n += F + c.hidden_size
    return n


def expert_params(config: ModelConfig) -> int:
    """One routed expert: a gated FFN of width moe_intermediate_size."""
    return 3 * config.hidden_size * (config.moe_intermediate_size or config.intermediate_size)


def moe_layer_parts(config: ModelConfig) -> dict[str, int]:
    """One MoE layer: router D·E, E routed experts, shared expert(s) (DeepSeek: n_shared × expert; Qwen: one
    expert of shared_expert_intermediate_size plus a 1-output gate)."""
    c, D = config, config.hidden_size
    parts = {"router": D * c.num_experts, "experts_routed": c.num_experts * expert_params(c)}
    if c.shared_expert_intermediate_size:
        parts["experts_shared"] = 3 * D * c.shared_expert_intermediate_size + D   # + shared_expert_gate
    else:
        parts["experts_shared"] = (c.num_shared_experts or 0) * expert_params(c)
    return parts


def norm_params(config: ModelConfig) -> int:
    """Norm vectors: norms_per_layer per layer + the final norm; LayerNorm has a bias as well as a weight."""
    per = config.hidden_size * (2 if config.norm_type == "layernorm" else 1)
    return (config.norms_per_layer * config.num_layers + 1) * per


def embedding_params(config: ModelConfig) -> int:
    """Token table V·D (reference 000: w_emb [V, D]) plus a learned position table (GPT-2, OPT) if any."""
    return config.vocab_size * config.hidden_size + config.learned_position_embeddings * config.hidden_size


@arch.per_config
def param_breakdown(config: ModelConfig) -> ParamBreakdown:
    """Count every parameter of the model by component (see the module docstring for the shapes)."""
    c = arch.check_config(config)
    kinds = arch.layer_kinds(c)
    attn_parts: dict[str, int] = {}
    for kind in kinds:
        for k, v in attention_parts_per_layer(c, kind).items():
            attn_parts[k] = attn_parts.get(k, 0) + v
    attention = sum(attn_parts.values())
    ffn_dense = routed = shared = router = 0
    for i in range(c.num_layers):
        if arch.is_moe_layer(c, i):
            p = moe_layer_parts(c)
            routed, shared, router = routed + p["experts_routed"], shared + p["experts_shared"], router + p["router"]
        else:
            ffn_dense += dense_ffn_params_per_layer(c)
    embedding = embedding_params(c)
    lm_head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    norms = norm_params(c)
    total = embedding + attention + ffn_dense + routed + shared + router + norms + lm_head
    unused = 0
    if arch.is_moe(c):
        unused = arch.moe_layer_count(c) * (c.num_experts - c.num_experts_per_tok) * expert_params(c)
    return ParamBreakdown(embedding=embedding, attention=attention, ffn_dense=ffn_dense, experts_routed=routed,
                          experts_shared=shared, router=router, norms=norms, lm_head=lm_head, total=total,
                          active=total - unused, tied=c.tie_word_embeddings, attention_parts=attn_parts)


def total_params(config: ModelConfig) -> int:
    """Every parameter (all experts of an MoE model)."""
    return param_breakdown(config).total


def active_params(config: ModelConfig) -> int:
    """Parameters one token touches: everything except the routed experts it is not sent to."""
    return param_breakdown(config).active


def bytes_per_param(dtype: str = "bf16", group_size: int | None = None, scale_dtype: str = "fp16",
                    zero_point: bool = False) -> float:
    """Bytes per weight: bits/8, plus per-group metadata (scale_bytes [+ zero-point bytes]) / group_size.
    e.g. int4 with group 128 and an fp16 scale: 0.5 + 2/128 = 0.515625 B (4.125 bits); GGUF Q4_0-like group 32:
    0.5 + 2/32 = 0.5625 B (4.5 bits). (003 Detail 18: real formats store scales per group.)"""
    b = DTYPE_BITS[dtype_name(dtype)] / 8
    if group_size is None:
        return b
    g = check_int("group_size", group_size, minimum=1, limit=1 << 30)
    return b + (bytes_per_element(scale_dtype) + (bytes_per_element(scale_dtype) if zero_point else 0)) / g


def weight_bytes(config_or_params: ModelConfig | int | float, dtype: str = "bf16", group_size: int | None = None,
                 scale_dtype: str = "fp16", zero_point: bool = False) -> float:
    """Bytes of all weights: parameters × bytes_per_param(dtype, group...). Accepts a ModelConfig or a count.
    003: TinyLlama 1.1B × 2 B ≈ 2.2 GB (FP16), 1.1 GB (INT8), 0.55 GB (INT4); 70B × 2 B = 140 GB."""
    if isinstance(config_or_params, ModelConfig):
        n = total_params(config_or_params)
    else:
        if isinstance(config_or_params, bool) or not isinstance(config_or_params, (int, float)) or \
                not math.isfinite(config_or_params) or config_or_params <= 0:
            raise SpecError(f"parameter count must be a positive number, got {config_or_params!r}")
        n = float(config_or_params)
    return n * bytes_per_param(dtype, group_size, scale_dtype, zero_point)


def embedding_bytes(config: ModelConfig, dtype: str = "fp16") -> float:
    """The token embedding table: V × D × bytes. 003 Detail 2a: 32,000 × 2,048 × 2 B = 131 MB."""
    return config.vocab_size * config.hidden_size * bytes_per_element(dtype)
