"""Roofline: every operation of a forward pass with its shapes, FLOPs, bytes and which ceiling it hits.

THE THEORY-vs-EXPERIMENT CONVENTION (the engine's counters in `engine/model/trace.py` follow the same rules, and are
checked against `forward_flops`, `weight_bytes_read` and `kv_bytes_step` exactly):
- FLOPs count matrix products only, 2·M·N·K each: per layer the Q, K, V, O projections and gate/up/down (SwiGLU)
  over the `new_tokens` rows; attention scores QKᵀ and P·V over the FULL rectangle new_tokens × context_tokens
  for every query head (no causal saving: 2·T·S·d_k·h_q each); plus the LM head, 2·D·V for ONE row per sequence
  (prefill computes the logits of the last position only, decode those of its one token; reference 004 stage 5).
  `context_tokens` = keys attended = start_position + new_tokens.
- Weight bytes read per forward = (every per-layer weight, norm vectors included, + final norm + the LM head
  matrix V·D + the gathered embedding rows new_tokens·D) × bytes_per_param; tied or not, the same rule.
- KV bytes: written = L · new_tokens · 2 · kv_dim · bytes; read = L · context_tokens · 2 · kv_dim · bytes
  (Llama-style layers; the cache is read once per layer, including the keys just written).
Extensions for other architectures, same spirit: a sliding-window layer attends to min(context, window) keys;
MLA is counted in its absorbed form (scores and P·V in the kv_lora_rank latent space, W_UK/W_UV as small per-head
matmuls; the latent cache of (kv_lora_rank + qk_rope_head_dim) per token is read once per layer); a gated-delta-
rule layer costs 6·h·d_k·d_v FLOPs per token (state read-out, delta, update) and reads + writes its float32 state
(with the conv state) once per step; an MoE layer runs top-k + shared experts per token and reads the weights of
the experts the step touches (expected distinct experts under uniform routing, E·(1 − (1 − k/E)^rows)).
Elementwise work (norms, RoPE, softmax, SiLU, residual adds) appears in the op table with an estimated FLOP count
and its activation traffic, but is excluded from `forward_flops` (matmul-only convention).
Activation traffic assumes unfused kernels except attention, which is taken as fused (FlashAttention: S and P
stay on chip; see `calculators/sizing/flash_attention.py` for the unfused traffic). Source: references 000 (op-by-op
shapes), 003 Details 11-12 (arithmetic intensity, roofline), 004 (prefill pipeline); Williams et al. 2009.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from calculators import arch
from calculators.sizing.kv_cache import linear_state_bytes_per_layer
from calculators.units import bytes_per_element, check_int, default_kv_dtype, dtype_name
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError

MATMUL_KINDS = ("matmul", "attention")


@dataclass
class Op:
    """One operation of a forward pass (one layer's worth; `count` = how many layers run it in the step)."""
    name: str
    kind: str                  # "matmul" | "attention" | "elementwise" | "gather" | "memory"
    shape: str                 # e.g. "[1, 2048] @ [2048, 256] -> [1, 256]"
    flops: float = 0.0
    weight_bytes: float = 0.0
    act_read_bytes: float = 0.0
    act_write_bytes: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    layer_kind: str | None = None
    count: int = 1
    group: str | None = None   # which layer group of the step it belongs to, e.g. "full_attention + MoE x58"

    @property
    def bytes_read(self) -> float:
        return self.weight_bytes + self.act_read_bytes + self.kv_read_bytes

    @property
    def bytes_written(self) -> float:
        return self.act_write_bytes + self.kv_write_bytes

    @property
    def bytes_total(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte of HBM traffic (0 when no traffic)."""
        return self.flops / self.bytes_total if self.bytes_total else 0.0


def _mm(name, R, K, N, wb, ab, *, bias=0, layer_kind=None, note=""):
    """A [R, K] @ [K, N] projection: 2·R·K·N FLOPs, reads its weights (+ bias) once and the activations,
    writes [R, N]."""
    shape = f"[{R}, {K}] @ [{K}, {N}] -> [{R}, {N}]" + (f" ({note})" if note else "")
    return Op(name, "matmul", shape, flops=2.0 * R * K * N, weight_bytes=(K * N + bias) * wb,
              act_read_bytes=R * K * ab, act_write_bytes=R * N * ab, layer_kind=layer_kind)


def _ew(name, R, width, ab, *, flops_per_elem=1.0, reads=1, weight_bytes=0.0, layer_kind=None):
    """An elementwise op over [R, width]: `reads` input tensors read, one written."""
    return Op(name, "elementwise", f"[{R}, {width}]", flops=flops_per_elem * R * width, weight_bytes=weight_bytes,
              act_read_bytes=reads * R * width * ab, act_write_bytes=R * width * ab, layer_kind=layer_kind)


def _norm(name, c: ModelConfig, R, width, wb, ab, layer_kind):
    nw = width * (2 if c.norm_type == "layernorm" else 1)
    return _ew(name, R, width, ab, flops_per_elem=4.0, weight_bytes=nw * wb, layer_kind=layer_kind)


def experts_touched(num_experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts hit by `rows` tokens routed uniformly at random to top_k of num_experts:
    E · (1 − (1 − k/E)^rows). One token touches exactly k; many tokens touch (almost) all E."""
    E, k = num_experts, top_k
    return E * (1.0 - (1.0 - k / E) ** rows)


def _attention_ops(c: ModelConfig, kind, B, T, S, wb, kvb, ab) -> list[Op]:
    R, D = B * T, c.hidden_size
    if kind == arch.LINEAR:
        L = arch.linear_dims(c)
        H, dk, dv = L["state_heads"], L["head_k"], L["head_v"]
        state = B * linear_state_bytes_per_layer(c)
        return [
            _mm("in_proj_qkvz", R, D, 2 * L["key_dim"] + 2 * L["value_dim"], wb, ab, layer_kind=kind),
            _mm("in_proj_ba", R, D, 2 * L["num_v_heads"], wb, ab, layer_kind=kind),
            Op("conv1d", "elementwise", f"depthwise [{R}, {L['conv_dim']}] * kernel {L['conv_kernel']}",
               flops=2.0 * R * L["conv_dim"] * L["conv_kernel"],
               weight_bytes=L["conv_dim"] * L["conv_kernel"] * wb,
               act_read_bytes=R * L["conv_dim"] * ab, act_write_bytes=R * L["conv_dim"] * ab, layer_kind=kind),
            Op("delta_rule_state", "attention",
               f"state [{B}, {H}, {dk}, {dv}] fp32, {T} token(s): read-out, delta, rank-1 update",
               flops=6.0 * R * H * dk * dv, act_read_bytes=R * (2 * L["key_dim"] + L["value_dim"]) * ab,
               act_write_bytes=R * L["value_dim"] * ab, kv_read_bytes=state, kv_write_bytes=state,
               layer_kind=kind),
            _ew("gated_norm", R, L["value_dim"], ab, flops_per_elem=6.0, reads=2,
                weight_bytes=(dv + 2 * L["num_v_heads"]) * wb, layer_kind=kind),
            _mm("out_proj", R, L["value_dim"], D, wb, ab, layer_kind=kind),
        ]
    Skeep = arch.window_tokens(c, kind, S)
    if arch.is_mla(c):
        h, nope, rope, vd, r_kv, r_q = (c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
                                        c.kv_lora_rank, c.q_lora_rank)
        lat = r_kv + rope
        ops = []
        if r_q:
            ops += [_mm("q_a_proj", R, D, r_q, wb, ab, layer_kind=kind),
                    _norm("q_a_norm", c, R, r_q, wb, ab, kind),
                    _mm("q_b_proj", R, r_q, h * (nope + rope), wb, ab, layer_kind=kind)]
        else:
            ops.append(_mm("q_proj", R, D, h * (nope + rope), wb, ab, layer_kind=kind))
        ops += [
            _mm("kv_a_proj", R, D, lat, wb, ab, layer_kind=kind, note="latent c_kv + shared RoPE key"),
            _norm("kv_a_norm", c, R, r_kv, wb, ab, kind),
            _ew("rope", R, h * rope + rope, ab, flops_per_elem=3.0, layer_kind=kind),
            Op("kv_append", "memory", f"append [{B}, {T}, {lat}] latent to the cache", act_read_bytes=R * lat * ab,
               kv_write_bytes=R * lat * kvb, layer_kind=kind),
            Op("q_absorb_W_UK", "matmul", f"[{R}, {h}, {nope}] @ [{h}, {nope}, {r_kv}] -> [{R}, {h}, {r_kv}]",
               flops=2.0 * R * h * nope * r_kv, weight_bytes=h * nope * r_kv * wb,
               act_read_bytes=R * h * nope * ab, act_write_bytes=R * h * r_kv * ab, layer_kind=kind),
            Op("attn_scores", "attention",
               f"[{B}, {h}, {T}, {lat}] . [{B}, {Skeep}, {lat}]^T -> [{B}, {h}, {T}, {Skeep}] (latent)",
               flops=2.0 * B * T * Skeep * h * lat, act_read_bytes=R * h * lat * ab,
               kv_read_bytes=B * Skeep * lat * kvb, layer_kind=kind),
            Op("softmax", "elementwise", f"[{B}, {h}, {T}, {Skeep}] on chip", flops=5.0 * B * h * T * Skeep,
               layer_kind=kind),
            Op("attn_pv", "attention", f"[{B}, {h}, {T}, {Skeep}] @ [{B}, {Skeep}, {r_kv}] -> [{B}, {h}, {T}, {r_kv}]",
               flops=2.0 * B * T * Skeep * h * r_kv, act_write_bytes=R * h * r_kv * ab, layer_kind=kind),
            Op("v_unabsorb_W_UV", "matmul", f"[{R}, {h}, {r_kv}] @ [{h}, {r_kv}, {vd}] -> [{R}, {h}, {vd}]",
               flops=2.0 * R * h * r_kv * vd, weight_bytes=h * r_kv * vd * wb,
               act_read_bytes=R * h * r_kv * ab, act_write_bytes=R * h * vd * ab, layer_kind=kind),
            _mm("o_proj", R, h * vd, D, wb, ab, layer_kind=kind),
        ]
        return ops
    hq, hkv, d, qd, kvd = c.num_heads, c.num_kv_heads, c.head_dim, c.q_dim, c.kv_dim
    qo = arch.q_out_dim(c)
    has_b = c.qkv_bias or c.linear_bias
    ops = [
        _mm("q_proj", R, D, qo, wb, ab, bias=qo if has_b else 0, layer_kind=kind,
            note="query + output gate" if c.attn_output_gate else ""),
        _mm("k_proj", R, D, kvd, wb, ab, bias=kvd if has_b else 0, layer_kind=kind),
        _mm("v_proj", R, D, kvd, wb, ab, bias=kvd if has_b else 0, layer_kind=kind),
    ]
    if c.qk_norm:
        ops.append(_ew("qk_norm", R, qd + kvd, ab, flops_per_elem=4.0, weight_bytes=2 * d * wb, layer_kind=kind))
    ops += [
        _ew("rope", R, qd + kvd, ab, flops_per_elem=3.0, layer_kind=kind),
        Op("kv_append", "memory", f"append [{B}, {hkv}, {T}, {d}] to K and V", act_read_bytes=2 * R * kvd * ab,
           kv_write_bytes=2 * R * kvd * kvb, layer_kind=kind),
        Op("attn_scores", "attention",
           f"[{B}, {hq}, {T}, {d}] . [{B}, {hkv}, {Skeep}, {d}]^T -> [{B}, {hq}, {T}, {Skeep}]",
           flops=2.0 * B * T * Skeep * d * hq, act_read_bytes=R * qd * ab, kv_read_bytes=B * Skeep * kvd * kvb,
           layer_kind=kind),
        Op("softmax", "elementwise", f"[{B}, {hq}, {T}, {Skeep}] on chip", flops=5.0 * B * hq * T * Skeep,
           layer_kind=kind),
        Op("attn_pv", "attention", f"[{B}, {hq}, {T}, {Skeep}] @ [{B}, {hkv}, {Skeep}, {d}] -> [{B}, {hq}, {T}, {d}]",
           flops=2.0 * B * T * Skeep * d * hq, kv_read_bytes=B * Skeep * kvd * kvb, act_write_bytes=R * qd * ab,
           layer_kind=kind),
    ]
    if c.attn_output_gate:
        ops.append(_ew("output_gate", R, qd, ab, flops_per_elem=5.0, reads=2, layer_kind=kind))
    ops.append(_mm("o_proj", R, qd, D, wb, ab, bias=D if c.linear_bias else 0, layer_kind=kind))
    return ops


def _ffn_ops(c: ModelConfig, moe: bool, R, wb, ab, kind) -> list[Op]:
    D = c.hidden_size
    if not moe:
        F, b = c.intermediate_size, c.linear_bias
        if c.mlp == "gelu":
            return [_mm("up_proj", R, D, F, wb, ab, bias=F if b else 0, layer_kind=kind),
                    _ew("gelu", R, F, ab, flops_per_elem=8.0, layer_kind=kind),
                    _mm("down_proj", R, F, D, wb, ab, bias=D if b else 0, layer_kind=kind)]
        return [_mm("gate_proj", R, D, F, wb, ab, layer_kind=kind),
                _mm("up_proj", R, D, F, wb, ab, layer_kind=kind),
                _ew("silu_mul", R, F, ab, flops_per_elem=5.0, reads=2, layer_kind=kind),
                _mm("down_proj", R, F, D, wb, ab, layer_kind=kind)]
    E, k, Fm = c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size or c.intermediate_size
    hit = experts_touched(E, k, R)
    ops = [_mm("router", R, D, E, wb, ab, layer_kind=kind),
           Op("experts_gate_up", "matmul",
              f"{k} of {E} experts per token: [{R}x{k}, {D}] @ [{D}, {2 * Fm}] ({hit:.1f} experts touched)",
              flops=2.0 * R * k * D * 2 * Fm, weight_bytes=hit * 2 * D * Fm * wb,
              act_read_bytes=R * D * ab, act_write_bytes=R * k * 2 * Fm * ab, layer_kind=kind),
           _ew("experts_silu_mul", R * k, Fm, ab, flops_per_elem=5.0, reads=2, layer_kind=kind),
           Op("experts_down", "matmul", f"[{R}x{k}, {Fm}] @ [{Fm}, {D}], weighted sum of {k}",
              flops=2.0 * R * k * Fm * D, weight_bytes=hit * Fm * D * wb,
              act_read_bytes=R * k * Fm * ab, act_write_bytes=R * D * ab, layer_kind=kind)]
    Fs = c.shared_expert_intermediate_size or (c.num_shared_experts or 0) * Fm
    if Fs:
        ops += [_mm("shared_gate_up", R, D, 2 * Fs, wb, ab, layer_kind=kind),
                _ew("shared_silu_mul", R, Fs, ab, flops_per_elem=5.0, reads=2, layer_kind=kind),
                _mm("shared_down", R, Fs, D, wb, ab, layer_kind=kind)]
        if c.shared_expert_intermediate_size:
            ops.append(_mm("shared_expert_gate", R, D, 1, wb, ab, layer_kind=kind))
    return ops


def layer_ops(config: ModelConfig, new_tokens: int, context_tokens: int, batch: int = 1,
              weight_dtype: str | float = "bf16", kv_dtype: str | float = "bf16", act_dtype: str | float = "bf16",
              layer_kind: str | None = None, moe_layer: bool | None = None) -> list[Op]:
    """The ops of ONE transformer layer, in execution order: norm, attention block, residual, norm, FFN, residual.
    `layer_kind` defaults to the kind of layer 0 of this config; `moe_layer` to whether the last layer is MoE."""
    c = arch.check_config(config)
    T, S, B = _check_tokens(new_tokens, context_tokens, batch)
    wb, kvb, ab = bytes_per_element(weight_dtype), bytes_per_element(kv_dtype), bytes_per_element(act_dtype)
    kind = layer_kind or arch.layer_kinds(c)[0]
    moe = arch.is_moe_layer(c, c.num_layers - 1) if moe_layer is None else moe_layer
    R, D = B * T, c.hidden_size
    names = ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm")[:c.norms_per_layer]
    ops = [_norm("attn_norm", c, R, D, wb, ab, kind)]
    ops += _attention_ops(c, kind, B, T, S, wb, kvb, ab)
    if "post_attn_norm" in names:
        ops.append(_norm("post_attn_norm", c, R, D, wb, ab, kind))
    ops.append(_ew("residual_add", R, D, ab, reads=2, layer_kind=kind))
    if "ffn_norm" in names:
        ops.append(_norm("ffn_norm", c, R, D, wb, ab, kind))
    ops += _ffn_ops(c, moe, R, wb, ab, kind)
    if "post_ffn_norm" in names:
        ops.append(_norm("post_ffn_norm", c, R, D, wb, ab, kind))
    ops.append(_ew("residual_add", R, D, ab, reads=2, layer_kind=kind))
    return ops


def _check_tokens(new_tokens, context_tokens, batch) -> tuple[int, int, int]:
    T = check_int("new_tokens", new_tokens, minimum=1, limit=1 << 32)
    S = check_int("context_tokens", context_tokens, minimum=1, limit=1 << 40)
    B = check_int("batch", batch, minimum=1, limit=1 << 24)
    if S < T:
        raise SpecError(f"context_tokens ({S}) must include the new tokens ({T}): context = start + new")
    return T, S, B


def step_ops(config: ModelConfig, new_tokens: int, context_tokens: int, batch: int = 1,
             weight_dtype: str | float = "bf16", kv_dtype: str | float = "bf16",
             act_dtype: str | float = "bf16") -> list[Op]:
    """All ops of one forward step: embedding gather, each distinct layer type once with `count` = how many
    layers share it, final norm (last positions only) and the LM head (one row per sequence)."""
    c = arch.check_config(config)
    T, S, B = _check_tokens(new_tokens, context_tokens, batch)
    wb, ab = bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    R, D, V = B * T, c.hidden_size, c.vocab_size
    pos = c.learned_position_embeddings
    ops = [Op("embedding", "gather", f"gather {R} rows of [{V}, {D}]" + (" + position rows" if pos else ""),
              weight_bytes=R * D * wb * (2 if pos else 1), act_write_bytes=R * D * ab)]
    groups: dict[tuple[str, bool], int] = {}
    for i, kind in enumerate(arch.layer_kinds(c)):
        key = (kind, arch.is_moe_layer(c, i))
        groups[key] = groups.get(key, 0) + 1
    for (kind, moe), n in groups.items():
        for op in layer_ops(c, T, S, B, weight_dtype, kv_dtype, act_dtype, layer_kind=kind, moe_layer=moe):
            op.count, op.group = n, f"{kind}{' + MoE' if moe else ''} x{n}"
            ops.append(op)
    ops.append(_norm("final_norm", c, B, D, wb, ab, None))
    lm = _mm("lm_head", B, D, V, wb, ab, note="last position of each sequence")
    ops.append(lm)
    return ops


def _total(ops: list[Op], attr: str, kinds: tuple[str, ...] | None = None) -> float:
    return float(sum(getattr(o, attr) * o.count for o in ops if kinds is None or o.kind in kinds))


@arch.per_config
def forward_flops(config: ModelConfig, new_tokens: int, context_tokens: int, batch: int = 1) -> float:
    """Matmul FLOPs of one forward pass (module convention): 2·M·N·K per projection over new_tokens rows,
    QKᵀ and P·V over the full new_tokens × context_tokens rectangle for every query head (2·T·S·d_k·h_q each),
    and the LM head for one row per sequence (2·D·V). Llama-style per layer:
        2·T·D·(q_dim + 2·kv_dim) + 2·T·q_dim·D + 2·T·3·D·F + 4·T·S·d_k·h_q ;  + 2·D·V once.
    003 Detail 12: TinyLlama decode ≈ 2 FLOPs × 1.1B params ≈ 2.2 GFLOP; prefill of 1,000 tokens ≈ 2.2 TFLOP."""
    return _total(step_ops(config, new_tokens, context_tokens, batch), "flops", MATMUL_KINDS)


# MLA's absorbed per-head products (q·W_UK, o·W_UV) run inside the attention kernel (FlashMLA, TensorRT-LLM's MLA),
# at the attention's precision, not at the weights' GEMM precision
ATTENTION_PRODUCTS = ("q_absorb_W_UK", "v_unabsorb_W_UV")


def _is_attention(op: Op) -> bool:
    return op.kind == "attention" or op.name in ATTENTION_PRODUCTS


def forward_flops_split(config: ModelConfig, new_tokens: int, context_tokens: int, batch: int = 1) -> dict:
    """`forward_flops` split by the precision each part runs at: dict(weights=the weight GEMMs (projections,
    FFN/experts, LM head) at the weights' precision, attention=QKᵀ and P·V (MLA: the latent scores and P·V and
    its absorbed W_UK/W_UV products; a delta-rule layer's state update) at the attention's precision). The two
    sum to `forward_flops`."""
    ops = step_ops(config, new_tokens, context_tokens, batch)
    att = float(sum(o.flops * o.count for o in ops if o.kind in MATMUL_KINDS and _is_attention(o)))
    return dict(weights=_total(ops, "flops", MATMUL_KINDS) - att, attention=att)


def weight_bytes_read(config: ModelConfig, new_tokens: int, bytes_per_param: str | float = 2,
                      batch: int = 1) -> float:
    """Weight bytes one forward pass reads (module convention): (every per-layer weight incl. norm vectors +
    final norm + LM head V·D + the gathered embedding rows new_tokens·D) × bytes_per_param, tied or not.
    `bytes_per_param` is a number (2 for bf16) or a dtype name. TinyLlama FP16 decode: 2.07 GB (003 Detail 12's
    "≈ 2.2 GB" is every parameter, the whole embedding table included; see `latency.step_weight_bytes`)."""
    return _total(step_ops(config, new_tokens, new_tokens, batch, weight_dtype=bytes_per_param), "weight_bytes")


def kv_bytes_step(config: ModelConfig, new_tokens: int, context_tokens: int, bytes_per_elem: str | float = 2,
                  batch: int = 1) -> dict:
    """KV-cache traffic of one forward pass (module convention), dict(read=, written=) in bytes:
    written = L · new_tokens · 2 · kv_dim · bytes, read = L · context_tokens · 2 · kv_dim · bytes (Llama-style;
    sliding layers read min(context, window), MLA reads its latent, linear layers read + write their state)."""
    ops = step_ops(config, new_tokens, context_tokens, batch, kv_dtype=bytes_per_elem)
    return dict(read=_total(ops, "kv_read_bytes"), written=_total(ops, "kv_write_bytes"))


def op_row(op: Op, device: Device | None = None, precision: str = "bf16") -> dict:
    """A table row for `op` (one layer's worth): shapes, FLOPs, bytes, intensity; with a device also compute and
    memory time (µs) and which one bounds it."""
    row = dict(name=op.name, kind=op.kind, layer_kind=op.layer_kind, group=op.group, shape=op.shape, count=op.count,
               flops=op.flops, weight_bytes=op.weight_bytes, kv_read_bytes=op.kv_read_bytes,
               kv_write_bytes=op.kv_write_bytes, bytes_read=op.bytes_read, bytes_written=op.bytes_written,
               intensity_flop_per_byte=op.intensity)
    if device is not None:
        peak = device.peak(precision)
        comp, mem = op.flops / peak, op.bytes_total / device.memory_bandwidth_bytes_per_s
        row.update(compute_us=comp * 1e6, memory_us=mem * 1e6, time_us=max(comp, mem) * 1e6,
                   bound="compute" if comp > mem else "memory",
                   attainable_flop_s=min(peak, op.intensity * device.memory_bandwidth_bytes_per_s))
    return row


def compute_precision_for(weight_dtype: str | float) -> str:
    """The matmul precision a weight format implies: fp8 weights -> fp8 math, fp4 (NVFP4/MXFP4) -> fp4 math on
    tensor cores that have it, fp32 -> fp32, everything else (bf16/fp16, weight-only int8/int4 dequantised on the
    fly) -> bf16 activations and math (003 Detail 18)."""
    if isinstance(weight_dtype, (int, float)):
        return "bf16"
    d = dtype_name(weight_dtype)
    return {"fp8": "fp8", "fp4": "fp4", "fp32": "fp32", "tf32": "tf32"}.get(d, "bf16")


def attention_precision_for(weight_dtype: str | float, kv_dtype: str | float | None = None) -> str:
    """The precision attention's matmuls (and its softmax) run at, whatever the weights: FP8 where the KV cache is
    FP8 (FP8 attention kernels: TensorRT-LLM's FP8 FMHA, FlashAttention-3, FlashMLA's FP8 path read an FP8 cache
    without widening it), FP32 with FP32 weights, otherwise BF16. Never FP4: no serving stack multiplies Q·Kᵀ or
    P·V in FP4 (an FP4 KV cache is dequantised to FP8 for it), so FP4 weights on Blackwell do not make attention
    run at the FP4 peak."""
    w = compute_precision_for(weight_dtype)
    if w in ("fp32", "tf32"):
        return w
    kd = kv_dtype if kv_dtype is not None else default_kv_dtype(weight_dtype)
    if isinstance(kd, (int, float)):
        return "fp8" if kd <= 1 else "bf16"
    return "fp8" if dtype_name(kd) in ("fp8", "fp4") else "bf16"


def step_peaks(device: Device, weight_dtype: str | float, kv_dtype: str | float | None = None) -> dict:
    """The two peaks a serving step's FLOPs meet (`forward_flops_split`): dict(weights=FLOP/s of the weight GEMMs,
    attention=FLOP/s of attention, precision=the weights' precision used, attention_precision=attention's), each
    with the device's wider-format fallback (`Device.flops_for`)."""
    pw, used = device.flops_for(compute_precision_for(weight_dtype))
    pa, used_a = device.flops_for(attention_precision_for(weight_dtype, kv_dtype))
    return dict(weights=pw, attention=pa, precision=used, attention_precision=used_a)


def gpu_time(memory_weights, compute_weights, memory_kv, compute_attention):
    """The GPU time of a step (any unit, arrays broadcast) whose weight GEMMs and attention run one after the
    other, each on its own roofline: max(weight bytes / bandwidth, GEMM FLOPs / peak) + max(KV bytes / bandwidth,
    attention FLOPs / its peak). One roofline over the whole step (max of all bytes, all FLOPs) would let the
    KV cache's reads hide behind the GEMMs' compute, which a stack that runs the layer's kernels in sequence
    never does."""
    return np.maximum(memory_weights, compute_weights) + np.maximum(memory_kv, compute_attention)


def compute_seconds(flops: dict, peaks: dict) -> float:
    """Seconds of tensor-core work at full peak: weight GEMMs at the weights' peak + attention at its own."""
    return flops["weights"] / peaks["weights"] + flops["attention"] / peaks["attention"]


def roofline(config: ModelConfig, device: Device, new_tokens: int, context_tokens: int, batch: int = 1,
             weight_dtype: str = "bf16", kv_dtype: str | None = None, act_dtype: str = "bf16",
             precision: str | None = None) -> dict:
    """Roofline report of one forward step on `device`: the op table of one layer (per layer kind), whole-step
    totals, the ridge point and chart points (ops as (intensity, attainable FLOP/s)).
    Time per op = max(FLOPs / peak, bytes / bandwidth); `step_time_ms_per_op` sums them (kernels in sequence),
    `step_time_ms` = max(total FLOPs / peak, total bytes / bandwidth) (the whole step as one roofline point)."""
    kv_dtype = kv_dtype or default_kv_dtype(weight_dtype)
    precision = precision or compute_precision_for(weight_dtype)
    ops = step_ops(config, new_tokens, context_tokens, batch, weight_dtype, kv_dtype, act_dtype)
    peak, used = device.flops_for(precision)
    bw = device.memory_bandwidth_bytes_per_s
    rows = [op_row(o, device, used) for o in ops]
    by_kind: dict[str, list[dict]] = {}       # "full_attention x22" -> the rows of one such layer
    for o, r in zip(ops, rows):
        if o.group is not None:
            by_kind.setdefault(o.group, []).append(r)
    flops_all = _total(ops, "flops")
    flops_mm = _total(ops, "flops", MATMUL_KINDS)
    bytes_all = _total(ops, "bytes_total")
    comp_s, mem_s = flops_all / peak, bytes_all / bw
    per_op_s = sum(max(o.flops / peak, o.bytes_total / bw) * o.count for o in ops)
    return dict(
        model=config.name, device=device.name, phase="decode" if new_tokens == 1 else "prefill",
        new_tokens=new_tokens, context_tokens=context_tokens, batch=batch, precision=used,
        peak_flop_s=peak, bandwidth_bytes_per_s=bw, ridge_flop_per_byte=peak / bw,
        layers=by_kind, step_rows=rows,
        totals=dict(flops=flops_all, matmul_flops=flops_mm, weight_bytes=_total(ops, "weight_bytes"),
                    kv_read_bytes=_total(ops, "kv_read_bytes"), kv_write_bytes=_total(ops, "kv_write_bytes"),
                    activation_bytes=_total(ops, "act_read_bytes") + _total(ops, "act_write_bytes"),
                    bytes=bytes_all, intensity_flop_per_byte=flops_all / bytes_all,
                    compute_ms=comp_s * 1e3, memory_ms=mem_s * 1e3, step_time_ms=max(comp_s, mem_s) * 1e3,
                    step_time_ms_per_op=per_op_s * 1e3, bound="compute" if comp_s > mem_s else "memory"),
        chart=[dict(name=r["name"], layer_kind=r["layer_kind"], intensity_flop_per_byte=r["intensity_flop_per_byte"],
                    attainable_flop_s=r["attainable_flop_s"], flops=r["flops"], bound=r["bound"])
               for r in rows if r["flops"] > 0 and r["intensity_flop_per_byte"] > 0],
    )


def roofline_curve(device: Device, precision: str = "bf16", min_intensity: float = 0.1,
                   max_intensity: float = 1e5, points: int = 64) -> list[dict]:
    """The roof itself for a chart: attainable FLOP/s = min(peak, intensity × bandwidth) on a log grid."""
    import math
    peak, bw = device.peak(precision), device.memory_bandwidth_bytes_per_s
    lo, hi = math.log10(min_intensity), math.log10(max_intensity)
    xs = [10 ** (lo + (hi - lo) * i / (points - 1)) for i in range(points)]
    return [dict(intensity_flop_per_byte=x, attainable_flop_s=min(peak, x * bw)) for x in xs]


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved (003 Detail 12): decode ≈ 2.2 GFLOP / 2.2 GB ≈ 1; batch 32 ≈ 32."""
    if bytes_moved <= 0:
        raise SpecError(f"bytes moved must be positive, got {bytes_moved!r}")
    return flops / bytes_moved


def as_dict(op: Op) -> dict:
    d = asdict(op)
    d.update(bytes_read=op.bytes_read, bytes_written=op.bytes_written, intensity_flop_per_byte=op.intensity)
    return d
