"""`ModelConfig`: the architecture numbers of a decoder-only transformer.

Shared by `engine/` (which runs the model) and `calculators/` (which predict its cost). Field names follow the
reference's symbols where it has them (000: D, F, L, h_q, h_kv, d_k, V).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


class SpecError(ValueError):
    """A model or device description that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int                 # D, width of the residual stream
    num_layers: int                  # L
    num_heads: int                   # h_q, query heads
    num_kv_heads: int                # h_kv, key/value heads (== h_q for MHA, 1 for MQA)
    head_dim: int                    # d_k
    intermediate_size: int           # F, FFN inner width (per expert for MoE)
    vocab_size: int                  # V
    max_position_embeddings: int     # context window, tokens
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # e.g. {"rope_type": "llama3", "factor": 8, ...}
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    torch_dtype: str = "float16"     # dtype the checkpoint is published in
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    model_type: str = "llama"
    # --- attention variants (used by the calculators; the engine runs plain Llama) ---
    attention: str = "gqa"           # "mha" | "gqa" | "mqa" | "mla" | derived from heads when not MLA
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None  # per layer: "full_attention" | "sliding_attention" | "linear_attention"
    # MLA (DeepSeek-V2/V3): cached latent + decoupled RoPE key
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Linear attention (gated delta rule, Qwen3-Next): fixed recurrent state per layer
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    # Mixture of experts
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    num_shared_experts: int | None = None
    moe_intermediate_size: int | None = None
    first_k_dense_layers: int = 0
    mlp: str = "swiglu"              # "swiglu" (3 matrices) | "gelu" (2 matrices, OPT/GPT-style)
    source: str = ""                 # where these numbers come from (URL of config.json, paper, ...)
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    # --- appended for the calculators (optional; the defaults describe a plain Llama layer) ---
    qkv_bias: bool = False           # biases on the q/k/v projections (Qwen2)
    linear_bias: bool = False        # a bias on every linear layer, MLP included (OPT, GPT-2)
    norm_type: str = "rmsnorm"       # "rmsnorm" (weight only) | "layernorm" (weight + bias)
    norms_per_layer: int = 2         # Gemma 2/3 add post-attention and post-FFN norms: 4
    qk_norm: bool = False            # per-head norm on q and k (Gemma 3, Qwen3)
    attn_output_gate: bool = False   # Qwen3-Next: q_proj also emits a sigmoid gate, so it is 2x wide
    learned_position_embeddings: int = 0   # rows of a learned absolute-position table (GPT-2, OPT)
    shared_expert_intermediate_size: int | None = None  # Qwen-style shared expert width (one expert)
    moe_layer_step: int = 1          # after the first dense layers, every k-th layer is MoE
    linear_conv_kernel_dim: int | None = None  # gated delta net: short causal convolution width
    # --- what the engine runs differently for Gemma 3 (the defaults describe a plain Llama) ---
    rope_local_theta: float | None = None      # RoPE base of the sliding-window layers (Gemma 3: 10,000)
    query_pre_attn_scalar: float | None = None  # scores scaled by 1/sqrt(this) instead of 1/sqrt(d_k) (Gemma)
    hidden_activation: str = "silu"            # gate activation of the MLP: "silu" (SwiGLU) | "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0                   # embeddings multiplied by this before layer 0 (Gemma: sqrt(D))
    final_logit_softcapping: float | None = None  # logits -> c·tanh(logits/c) (Gemma 2; None for Gemma 3)
    # --- how the checkpoint is published, where its config says (quantization_config) ---
    fp8_weight_block: tuple[int, int] | None = None  # FP8 weights scaled per block of this many (rows, columns):
    # DeepSeek-V3/R1's 128 x 128; None for per-tensor FP8 or an unquantized checkpoint

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "max_position_embeddings"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"{self.name or 'model'}: {f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"{self.name}: num_attention_heads ({self.num_heads}) must be a multiple of "
                            f"num_key_value_heads ({self.num_kv_heads})")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise SpecError(f"{self.name}: rope_theta must be a positive number, got {self.rope_theta!r}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise SpecError(f"{self.name}: rms_norm_eps must be a positive number, got {self.rms_norm_eps!r}")

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:          # h_q * d_k
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:         # h_kv * d_k
        return self.num_kv_heads * self.head_dim

    def layer_window(self, layer: int) -> int | None:
        """W when layer `layer` attends only the last W positions (a sliding-window layer), else None."""
        if self.sliding_window is None or self.layer_types is None:
            return None
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    @property
    def group_size(self) -> int:     # G = h_q / h_kv, query heads sharing one K/V head
        return self.num_heads // self.num_kv_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        e = self.eos_token_id
        if e is None:
            return ()
        return tuple(e) if isinstance(e, (list, tuple)) else (int(e),)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra", None)
        return d
