"""The formula behind every number: each `explain_*` returns an `Explained` with value, unit, the symbolic
formula, the same formula with this case's numbers substituted, and the source.

The value is computed FROM the formula text (a small arithmetic expression evaluated on named numbers), so the
text a page shows can never drift from the number it shows; tests check each value against the calculator
function that owns it. Pages call these and hold no formula themselves.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

from calculators import arch
from calculators.sizing.kv_cache import CONV_STATE_BYTES, STATE_BYTES
from calculators.sizing.params import attention_parts_per_layer, bytes_per_param, \
    param_breakdown
from calculators.sizing.latency import step_weight_bytes
from calculators.sizing.roofline import kv_bytes_step, step_ops
from calculators.units import bytes_per_element, default_kv_dtype, fmt_bytes, fmt_count, fmt_num
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError

_FUNCS = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "round": round}
_PRETTY = [("**", "^"), ("*", " × "), ("/", " ÷ ")]


@dataclass(frozen=True)
class Explained:
    name: str            # the quantity, as named in the calculators ("kv_bytes_per_token")
    value: float
    unit: str            # "bytes", "ms", "FLOP", "FLOP/byte", "params", "%", "tokens", ...
    symbolic: str        # "2 × L × h_kv × d_k × b"
    formula: str         # "2 × 22 × 4 × 64 × 2 = 22,528 bytes (22.5 KB)"
    source: str          # reference file and section, paper or datasheet
    description: str = ""

    def to_dict(self) -> dict:
        return dict(name=self.name, value=self.value, unit=self.unit, symbolic=self.symbolic, formula=self.formula,
                    source=self.source, description=self.description)


def _check_expr(expr: str, names: set[str]) -> None:
    tree = ast.parse(expr, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Call, ast.Add,
               ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.FloorDiv, ast.Mod)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise SpecError(f"formula {expr!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and node.id not in names and node.id not in _FUNCS:
            raise SpecError(f"formula {expr!r} uses {node.id!r}, which has no value")


def _num(v: float) -> str:
    v = float(v)
    if v.is_integer() and abs(v) < 1e7:
        return f"{int(v):,}"
    if v != 0 and (abs(v) >= 1e7 or abs(v) < 1e-3):
        m, e = f"{v:.4e}".split("e")
        return f"{m.rstrip('0').rstrip('.')}e{int(e)}"
    return f"{v:.4g}"


def _display(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{_num(value)} bytes ({fmt_bytes(value)})" if value >= 1000 else f"{_num(value)} bytes"
    if unit in ("FLOP", "params", "elements"):
        return f"{_num(value)} {unit} ({fmt_count(value)})" if value >= 1000 else f"{_num(value)} {unit}"
    if unit == "%":
        return f"{fmt_num(value, 3)}%"
    if unit == "$":
        return f"${fmt_num(value, 3)}"
    if float(value).is_integer():
        return f"{_num(value)} {unit}".strip()
    return f"{fmt_num(value, 4)} {unit}".strip()


def explain(name: str, expr: str, unit: str, source: str, description: str = "", **values: float) -> Explained:
    """Evaluate `expr` (Python arithmetic on the keyword names, plus min/max/ceil/floor) and render it twice:
    with the names, and with the numbers."""
    _check_expr(expr, set(values))
    value = float(eval(compile(ast.parse(expr, mode="eval"), "<formula>", "eval"),
                       {"__builtins__": {}, **_FUNCS}, dict(values)))

    def render(sub) -> str:
        s = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: sub(m.group(0)), expr)
        for a, b in _PRETTY:
            s = s.replace(a, b) if a != "*" else re.sub(r"(?<!\*)\*(?!\*)", b, s)
        return re.sub(r"\s+", " ", s).strip()

    symbolic = render(lambda n: n)
    numeric = render(lambda n: _num(values[n]) if n in values else n)
    return Explained(name, value, unit, symbolic, f"{numeric} = {_display(value, unit)}", source, description)


# ---------------------------------------------------------------------------------------------------------------
# Model size
# ---------------------------------------------------------------------------------------------------------------
def explain_params(config: ModelConfig) -> list[Explained]:
    """Parameter counts by component, each with its formula; the last entries are total (and active for MoE)."""
    c, b = config, param_breakdown(config)
    D, V, L = c.hidden_size, c.vocab_size, c.num_layers
    src = "003 Details 2a, 8; reference 000 (weight shapes)"
    if c.learned_position_embeddings:
        out = [explain("embedding_params", "V * D + P * D", "params", src, "token table + learned positions",
                       V=V, D=D, P=c.learned_position_embeddings)]
    else:
        out = [explain("embedding_params", "V * D", "params", src, "token table", V=V, D=D)]
    kinds = arch.kind_counts(c)
    attn_terms, attn_vals = [], {}
    for kind, n in kinds.items():
        if n:
            key = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}[kind]
            attn_terms.append(f"L_{key} * A_{key}")
            attn_vals[f"L_{key}"] = n
            attn_vals[f"A_{key}"] = sum(attention_parts_per_layer(c, kind).values())
    out.append(explain("attention_params", " + ".join(attn_terms), "params", src,
                       "per-layer attention weights (A_*) × layers of that kind", **attn_vals))
    n_moe = arch.moe_layer_count(c)
    if n_moe < L:
        m = 2 if c.mlp == "gelu" else 3
        expr = f"L_dense * ({m} * D * F + F + D)" if c.linear_bias else f"L_dense * {m} * D * F"
        out.append(explain("ffn_params", expr, "params", "003 Detail 8 (3 × 2,048 × 5,632 ≈ 34.6M per TinyLlama layer)",
                           "dense FFN layers", L_dense=L - n_moe, D=D, F=c.intermediate_size))
    if n_moe:
        Fm = c.moe_intermediate_size or c.intermediate_size
        out.append(explain("experts_params", "L_moe * (E * 3 * D * F_e + shared + D * E)", "params",
                           "Mixtral / DeepSeek / Qwen MoE configs", "routed experts + shared experts + router",
                           L_moe=n_moe, E=c.num_experts, D=D, F_e=Fm, shared=b.experts_shared // n_moe))
    out.append(explain("norm_params", "(n_norm * L + 1) * D * w", "params", "RMSNorm weight (LayerNorm: + bias)",
                       n_norm=c.norms_per_layer, L=L, D=D, w=2 if c.norm_type == "layernorm" else 1))
    out.append(explain("lm_head_params", "V * D * untied", "params", "003 Detail 2b", "0 when tied to the embedding",
                       V=V, D=D, untied=0 if c.tie_word_embeddings else 1))
    parts = {"emb": b.embedding, "attn": b.attention, "ffn": b.ffn_dense + b.experts_routed + b.experts_shared
             + b.router, "norms": b.norms, "head": b.lm_head}
    out.append(explain("total_params", "emb + attn + ffn + norms + head", "params", src, **parts))
    if arch.is_moe(c):
        Fm = c.moe_intermediate_size or c.intermediate_size
        out.append(explain("active_params", "total - L_moe * (E - k) * 3 * D * F_e", "params",
                           "top-k routing: unused experts do no work", total=b.total, L_moe=n_moe,
                           E=c.num_experts, k=c.num_experts_per_tok, D=D, F_e=Fm))
    return out


def explain_weight_bytes(config: ModelConfig, dtype: str = "bf16", group_size: int | None = None,
                         scale_dtype: str = "fp16") -> Explained:
    n = param_breakdown(config).total
    if group_size:
        return explain("weight_bytes", "N * (bits / 8 + s / g)", "bytes", "003 Detail 18 (scales per group)",
                       N=n, bits=bytes_per_param(dtype) * 8, s=bytes_per_element(scale_dtype), g=group_size)
    return explain("weight_bytes", "N * b", "bytes", "003 Detail 2a / 18 (parameters × bytes per parameter)",
                   N=n, b=bytes_per_param(dtype))


# ---------------------------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------------------------
def explain_kv_bytes_per_token(config: ModelConfig, kv_dtype: str = "fp16") -> Explained:
    c, b = config, bytes_per_element(kv_dtype)
    n = arch.kind_counts(c)
    L_attn = n[arch.FULL] + n[arch.SLIDING]
    if arch.is_mla(c):
        return explain("kv_bytes_per_token", "L * (r_kv + d_rope) * b", "bytes",
                       "003 Detail 6; DeepSeek-V2 paper Table 1 (latent + decoupled RoPE key per layer)",
                       L=L_attn, r_kv=c.kv_lora_rank, d_rope=c.qk_rope_head_dim, b=b)
    return explain("kv_bytes_per_token", "2 * L * h_kv * d_k * b", "bytes",
                   "003 Details 6 and 10 (K and V, every attention layer; linear layers keep a fixed state)",
                   L=L_attn, h_kv=c.num_kv_heads, d_k=c.head_dim, b=b)


def explain_kv_cache_bytes(config: ModelConfig, tokens: int, batch: int = 1, kv_dtype: str = "fp16") -> Explained:
    """Sequence KV: full layers keep every token, sliding ones min(tokens, W), linear ones a fixed state."""
    c, b = config, bytes_per_element(kv_dtype)
    n = arch.kind_counts(c)
    per = (c.kv_lora_rank + c.qk_rope_head_dim) if arch.is_mla(c) else 2 * c.kv_dim
    terms, vals = [], dict(B=batch, T=tokens, e=per, b=b)
    if n[arch.FULL]:
        terms.append("L_full * T * e * b")
        vals["L_full"] = n[arch.FULL]
    if n[arch.SLIDING]:
        terms.append("L_swa * min(T, W) * e * b")
        vals.update(L_swa=n[arch.SLIDING], W=c.sliding_window)
    if n[arch.LINEAR]:
        L = arch.linear_dims(c)
        terms.append("L_lin * (H * d_kk * d_vv * s_state + (k_conv - 1) * C * s_conv)")
        vals.update(L_lin=n[arch.LINEAR], H=L["state_heads"], d_kk=L["head_k"], d_vv=L["head_v"],
                    k_conv=L["conv_kernel"], C=L["conv_dim"], s_state=STATE_BYTES, s_conv=CONV_STATE_BYTES)
    return explain("kv_cache_bytes", f"B * ({' + '.join(terms)})", "bytes",
                   "003 Details 6 and 10; reference 002 (fixed float32 state of linear-attention layers)",
                   "e = cached elements per token per layer", **vals)


# ---------------------------------------------------------------------------------------------------------------
# Compute and time
# ---------------------------------------------------------------------------------------------------------------
def explain_forward_flops(config: ModelConfig, new_tokens: int, context_tokens: int, batch: int = 1) -> Explained:
    c = config
    plain = (not arch.is_mla(c) and not arch.is_moe(c) and arch.kind_counts(c)[arch.LINEAR] == 0
             and c.mlp != "gelu" and not c.attn_output_gate
             and (arch.kind_counts(c)[arch.SLIDING] == 0 or c.sliding_window >= context_tokens))
    src = "roofline.py convention; reference 000 shapes; 003 Detail 12"
    if plain:
        return explain("forward_flops",
                       "B * (L * (2*T*D*(q + 2*kv) + 2*T*q*D + 2*T*3*D*F + 4*T*S*d*h) + 2*D*V)", "FLOP", src,
                       "projections + attention (full T × S rectangle) per layer, LM head for one row",
                       B=batch, L=c.num_layers, T=new_tokens, S=context_tokens, D=c.hidden_size, q=c.q_dim,
                       kv=c.kv_dim, F=c.intermediate_size, d=c.head_dim, h=c.num_heads, V=c.vocab_size)
    ops = step_ops(c, new_tokens, context_tokens, batch)
    proj = sum(o.flops * o.count for o in ops if o.kind == "matmul" and o.name != "lm_head")
    att = sum(o.flops * o.count for o in ops if o.kind == "attention")
    head = sum(o.flops for o in ops if o.name == "lm_head")
    return explain("forward_flops", "projections + attention + lm_head", "FLOP", src,
                   "sums of 2·M·N·K over every matmul of the step (see the roofline table)",
                   projections=proj, attention=att, lm_head=head)


def explain_bandwidth_floor(bytes_read: float, bandwidth_bytes_per_s: float) -> Explained:
    return explain("bandwidth_floor_ms", "bytes / bandwidth * 1000", "ms", "003 Detail 12 (the bandwidth floor)",
                   bytes=bytes_read, bandwidth=bandwidth_bytes_per_s)


def explain_engine_itl_floor(config: ModelConfig, bandwidth_bytes_per_s: float, context_tokens: int) -> Explained:
    """The NumPy engine's decode floor on a measured machine (`engine_floor.engine_itl_floor_ms`): float32 bytes
    the step reads and writes by the Trace convention, over the measured matvec bandwidth."""
    from calculators.sizing.engine_floor import engine_decode_bytes
    b = engine_decode_bytes(config, context_tokens)
    return explain("engine_itl_floor_ms", "(weights + kv_read + kv_written) / bandwidth * 1000", "ms",
                   "003 Detail 12 (the bandwidth floor), with the bytes the engine's Trace counts",
                   weights=b["weights"], kv_read=b["kv_read"], kv_written=b["kv_written"],
                   bandwidth=bandwidth_bytes_per_s)


def explain_decode_floor(config: ModelConfig, device: Device, context_tokens: int, batch: int = 1,
                         weight_dtype: str = "bf16", kv_dtype: str | None = None) -> Explained:
    """(weights + KV read + KV written) / bandwidth, the ITL floor of `latency.decode_step_ms` with IDEAL."""
    kv = kv_bytes_step(config, 1, context_tokens, kv_dtype or default_kv_dtype(weight_dtype), batch)
    return explain("bandwidth_floor_ms", "(weights + kv_read + kv_written) / bandwidth * 1000", "ms",
                   "003 Details 12 and 21 (weights once per step + every sequence's KV cache)",
                   weights=step_weight_bytes(config, weight_dtype, rows=batch), kv_read=kv["read"],
                   kv_written=kv["written"], bandwidth=device.memory_bandwidth_bytes_per_s)


def explain_prefill(config: ModelConfig, device: Device, prompt_tokens: int, batch: int = 1,
                    weight_dtype: str = "bf16", kv_dtype: str | None = None, efficiency=None) -> Explained:
    """Prefill time of `latency.prefill_ms`: the slower of compute at MFU and the memory traffic at MBU."""
    from calculators.sizing.latency import IDEAL, prefill_ms
    e = efficiency or IDEAL
    p = prefill_ms(config, device, prompt_tokens, batch, weight_dtype, kv_dtype, e)
    return explain("prefill_ms", "max(flops / (peak * mfu), bytes / (bandwidth * mbu)) * 1000 + step_overhead_ms"
                   " + batch * sequence_overhead_us / 1000", "ms",
                   "003 Details 11-12 (prefill: compute-bound once the prompt is long); fixed step cost: "
                   "specs/stacks.json", flops=p["flops"], peak=device.peak(p["precision"]), mfu=e.prefill_mfu,
                   bytes=p["bytes"], bandwidth=device.memory_bandwidth_bytes_per_s, mbu=e.prefill_mbu,
                   step_overhead_ms=e.step_overhead_ms, batch=batch, sequence_overhead_us=e.sequence_overhead_us)


def explain_itl(config: ModelConfig, device: Device, context_tokens: int, batch: int = 1,
                weight_dtype: str = "bf16", kv_dtype: str | None = None, efficiency=None) -> Explained:
    """One decode step (`latency.decode_step_ms`): the slower of the memory traffic at MBU and compute at MFU."""
    from calculators.sizing.latency import IDEAL, decode_step_ms
    e = efficiency or IDEAL
    d = decode_step_ms(config, device, context_tokens, batch, weight_dtype, kv_dtype, e)
    return explain("itl_ms", "max(bytes / (bandwidth * mbu), flops / (peak * mfu)) * 1000 + step_overhead_ms"
                   " + batch * sequence_overhead_us / 1000", "ms",
                   "003 Details 12 and 21 (decode: bandwidth-bound); fixed step cost: specs/stacks.json",
                   bytes=d["bytes"], bandwidth=device.memory_bandwidth_bytes_per_s, mbu=e.decode_mbu,
                   flops=d["flops"], peak=device.peak(d["precision"]), mfu=e.decode_mfu,
                   step_overhead_ms=e.step_overhead_ms, batch=batch, sequence_overhead_us=e.sequence_overhead_us)


def explain_compute_time(flops: float, peak_flop_s: float, efficiency: float = 1.0) -> Explained:
    return explain("compute_ms", "flops / (peak * mfu) * 1000", "ms", "003 Detail 11 (prefill is compute-bound)",
                   flops=flops, peak=peak_flop_s, mfu=efficiency)


def explain_total_latency(ttft_ms: float, itl_ms: float, output_tokens: int) -> Explained:
    return explain("total_latency_ms", "ttft + itl * (n - 1)", "ms", "003 Details 11 and 21",
                   "the first token comes from prefill", ttft=ttft_ms, itl=itl_ms, n=output_tokens)


def explain_arithmetic_intensity(flops: float, bytes_moved: float) -> Explained:
    return explain("arithmetic_intensity", "flops / bytes", "FLOP/byte", "003 Detail 12", flops=flops,
                   bytes=bytes_moved)


def explain_ridge_point(device: Device, precision: str = "bf16") -> Explained:
    return explain("ridge_flop_per_byte", "peak / bandwidth", "FLOP/byte", "Williams et al. 2009; 003 Detail 12",
                   f"{device.name}: below this intensity an op is memory-bound", peak=device.peak(precision),
                   bandwidth=device.memory_bandwidth_bytes_per_s)


def explain_throughput(batch: int, step_ms: float) -> Explained:
    return explain("total_tok_s", "batch / (step_ms / 1000)", "tok/s", "003 Detail 21", batch=batch,
                   step_ms=step_ms)


def explain_cost_per_million(price_usd_per_hour: float, tokens_per_s: float) -> Explained:
    return explain("usd_per_million_tokens", "price / (tok_s * 3600) * 1000000", "$",
                   "price per hour is an assumption (specs/devices.json)", price=price_usd_per_hour,
                   tok_s=tokens_per_s)


# ---------------------------------------------------------------------------------------------------------------
# Memory, attention kernels, quantization, serving, parallelism
# ---------------------------------------------------------------------------------------------------------------
def explain_prefill_scratch(seq_len: int, dim: int, q_dim: int, kv_dim: int, ffn_dim: int,
                            bytes_per_elem: float = 2) -> Explained:
    return explain("prefill_scratch_bytes", "S * (5*dim + 2*q_dim + 2*kv_dim + 3*ffn) * b", "bytes",
                   "004 Scratch Buffer Layout (the text's 'about 700 MB' is not what the formula gives)",
                   S=seq_len, dim=dim, q_dim=q_dim, kv_dim=kv_dim, ffn=ffn_dim, b=bytes_per_elem)


def explain_unfused_attention(seq_len: int, head_dim: int, bytes_per_elem: float = 2) -> Explained:
    return explain("unfused_attention_bytes_per_head", "4 * N * d * b + 4 * N**2 * b", "bytes", "003 Detail 17",
                   "Q, K, V read + O written, S and P each written once and read once", N=seq_len, d=head_dim,
                   b=bytes_per_elem)


def explain_quantize_value(x: float, max_abs: float, bits: int = 8) -> list[Explained]:
    """The round trip of one weight (`quantization.quantize_value`): scale, code, reconstruction, error."""
    qmax = 2 ** (bits - 1) - 1
    src = "003 Detail 18"
    s = explain("scale", "m / qmax", "", src, m=max_abs, qmax=qmax)
    q = explain("q", "max(-qmax - 1, min(qmax, round(x / scale)))", "", src, x=x, scale=s.value, qmax=qmax)
    w = explain("dequantized", "q * scale", "", src, q=q.value, scale=s.value)
    e = explain("error", "max(w_hat - x, x - w_hat)", "", src, w_hat=w.value, x=x)
    return [s, q, w, e]


def explain_speculative(acceptance: float, draft_tokens: int = 4) -> Explained:
    if acceptance == 1:
        return explain("expected_tokens_per_pass", "K + 1", "tokens", "003 Detail 19", K=draft_tokens)
    return explain("expected_tokens_per_pass", "(1 - a**(K + 1)) / (1 - a)", "tokens",
                   "003 Detail 19; Leviathan et al. 2022", a=acceptance, K=draft_tokens)


def explain_queue_wait(utilization: float) -> Explained:
    return explain("queue_wait_factor", "rho / (1 - rho)", "× service time", "003 Detail 21 (M/M/1)",
                   rho=utilization)


def explain_pipeline_bubble(stages: int, microbatches: int) -> Explained:
    return explain("pipeline_bubble_percent", "100 * (p - 1) / (m + p - 1)", "%", "003 Detail 22; GPipe",
                   p=stages, m=microbatches)


def explain_tp_floor(weight_bytes: float, bandwidth_bytes_per_s: float, tp: int) -> Explained:
    return explain("tp_bandwidth_floor_ms", "weights / tp / bandwidth * 1000", "ms", "003 Detail 22",
                   weights=weight_bytes, tp=tp, bandwidth=bandwidth_bytes_per_s)


def explain_paging(tokens: int, block_size: int = 16) -> list[Explained]:
    blocks = explain("blocks", "ceil(n / B)", "blocks", "003 Detail 16", n=tokens, B=block_size)
    empty = explain("empty_slots", "ceil(n / B) * B - n", "slots", "003 Detail 16", n=tokens, B=block_size)
    return [blocks, empty]


def explain_prefix_saving(prompt_tokens: int, cached_tokens: int) -> Explained:
    return explain("prefill_saved_percent", "100 * c / p", "%", "003 Detail 20", c=cached_tokens, p=prompt_tokens)


def explain_context_parallel_kv(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int,
                                bytes_per_elem: float = 2, cp: int = 1, tp: int = 1) -> Explained:
    return explain("kv_bytes_per_device", "2 * h_kv * d * T * b * L / (cp * tp) * max(1, tp / h_kv)", "bytes",
                   "003 Detail 22; KV heads replicated once TP exceeds them", h_kv=num_kv_heads, d=head_dim,
                   T=tokens, b=bytes_per_elem, L=num_layers, cp=cp, tp=tp)
