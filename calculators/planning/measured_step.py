"""A serving step priced op by op from a device profile (`calculators.sizing.measured_ops`): the ops one step of a
deployment runs on its busiest GPU, each with its datasheet roofline and its measured time side by side.

The ops of one layer, per GPU of a TP group of t (`layer_gemms`):
    qkv projection   m × D  ·  D × (h_q + 2 h_kv)·d / t        o projection   m × h_q·d/t  ·  h_q·d/t × D
    gate + up        m × D  ·  D × 2F/t                        down           m × F/t  ·  F/t × D
    (an MoE layer: the routed experts as one fused MoE op over TP t/e × EP e, plus any shared expert's GEMMs)
    attention        decode rows at their context; prompts of P tokens causally (per layer, heads / t)
and once per step the LM head (m = the sequences that sample a token, V/t columns). m is the tokens the step
carries. A step = Σ ops + the collectives + the stack's host work (`step.mixed_step`).

An MLA layer (DeepSeek) runs its low-rank projections (q_a, q_b, kv_a, the absorbed W_UK and W_UV as GEMMs of the
same FLOPs and weights, o) and its attention from the profile's MLA tables; a gated-delta-rule layer (Qwen3-Next's
linear attention) its projections (in_proj_qkvz, in_proj_ba, out_proj) and its conv + delta rule from the profile's
linear-attention table. What a profile cannot price falls back to the closed form, and `profile_support` says why:
MLA or linear attention where the profile measured none.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from calculators import arch
from calculators.multi_gpu.collectives import allreduce_ms as closed_allreduce_ms
from calculators.multi_gpu.parallel import tp_allreduce_bytes
from calculators.multi_gpu.moe import exchange_bytes, moe_layer_comm_ms
from calculators.multi_gpu.tensor_parallel import Mesh, exchange_tokens, expert_imbalance_for, stage_layers
from calculators.sizing.measured_ops import (ACT_BYTES, Priced, allreduce_ms, decode_attention_ms, elementwise_ms,
                                             gemm_format, gemm_ms, linear_decode_ms, linear_prefill_ms,
                                             mla_decode_ms, mla_prefill_ms, moe_a2a_ms, moe_ms,
                                             prefill_attention_ms, ring_collective_ms)
from calculators.units import fmt_num
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack

# the tokens per step at which the measured parts are tabulated: the powers of two and their 1.5× (the sizes
# profiles measure) with the planner's log grid between them, so a measured size is read back exactly
MEASURED_GRID = np.unique(np.concatenate([2.0 ** np.arange(21), 1.5 * 2.0 ** np.arange(20),
                                          np.round(np.geomspace(1, 1 << 20, 97))]))
MEASURED_LOG_GRID = np.log(MEASURED_GRID)


def read_log_grid(table, log_grid: np.ndarray, tokens) -> np.ndarray:
    """A table on the tokens whose logs are `log_grid`, read at `tokens` (≥ 1), linear in log tokens (np.interp).
    `table` is [G], or [K, G] with one row per candidate: then the last axis of `tokens` runs over the K."""
    table = np.asarray(table, dtype=float)
    lt = np.log(np.maximum(tokens, 1.0))
    if table.ndim == 1:
        return np.interp(lt, log_grid, table)
    pos = np.interp(lt, log_grid, np.arange(len(log_grid), dtype=float))
    i0 = np.minimum(pos.astype(int), len(log_grid) - 2)
    f = pos - i0
    k = np.broadcast_to(np.arange(table.shape[0]), pos.shape) if table.shape[0] > 1 else 0
    return table[k, i0] * (1 - f) + table[k, i0 + 1] * f


def on_measured_grid(table, tokens):
    """A MEASURED_GRID table ([G] or [K, G], `read_log_grid`) read at `tokens`."""
    return read_log_grid(table, MEASURED_LOG_GRID, tokens)


WEIGHT_FORMATS = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block", "fp4": "fp4",
                  "int8": "int8", "int4": "int4", "fp32": "fp32"}


def kernel_format(config: ModelConfig, weight_dtype: str) -> str:
    """The weight format whose kernels run a model's `weight_dtype` weights: FP8 weights of a checkpoint published
    block-scaled (`ModelConfig.fp8_weight_block`: DeepSeek-V3/R1's 128 x 128 blocks) run block-FP8 GEMMs and fused
    MoE (DeepGEMM, CUTLASS blockwise), which a profile measures apart from per-tensor FP8 and which run slower: on
    an H200 (TensorRT-LLM, aiconfigurator-core 0.12) DeepSeek-R1's experts for 8,192 tokens take 2.18 ms a layer in
    fp8_block, where per-tensor FP8 kernels of other shapes would price them at 1.16. Any other dtype is itself."""
    wd = WEIGHT_FORMATS.get(str(weight_dtype), str(weight_dtype))
    return "fp8_block" if wd == "fp8" and config.fp8_weight_block else wd


def lm_head_dtype(weight_dtype: str) -> str:
    """The LM head's weight format: serving stacks keep it in 16 bits when the layers are quantized; a float
    model (bf16, fp16, or fp32 on a CPU) keeps its own."""
    return weight_dtype if weight_dtype in ("bf16", "fp16", "fp32") else "bf16"


def gemm_dtype(name: str, weight_dtype: str) -> str:
    """The weight format a layer GEMM runs in: the MoE router stays in 16 bits in quantized checkpoints (ModelOpt
    and DeepSeek's FP8 leave `mlp.gate` unquantized; aiconfigurator prices it in bf16 too), like the LM head;
    every other layer GEMM in the model's weight format."""
    return lm_head_dtype(weight_dtype) if name == "router" else weight_dtype


def profile_support(config: ModelConfig, profile=None) -> str | None:
    """Why a profile (this one, when given) cannot price this model's step (None if it can)."""
    tables = getattr(profile, "tables", None)
    if arch.is_mla(config) and tables is not None and not {"mla_generation", "mla_context"} <= set(tables):
        return f"{config.name} uses MLA, and profile {profile.name} measured no MLA kernels"
    if arch.kind_counts(config)[arch.LINEAR] and tables is not None and "linear_attention" not in tables:
        return f"{config.name} has linear-attention layers, and profile {profile.name} measured none"
    return None


def format_problem(profile, weight_dtype: str) -> str | None:
    """Why `profile` cannot price a step in `weight_dtype` weights (no GEMM table for the format or a wider one:
    INT4's weight-only kernels), None if it can or there is no profile. Such a step takes the closed form, as the
    planner's candidates in that format do."""
    if profile is None:
        return None
    wd = WEIGHT_FORMATS.get(str(weight_dtype), str(weight_dtype))
    if gemm_format(profile, wd) is not None:
        return None
    why = " (INT4 runs weight-only kernels that no profile measures)" if wd == "int4" else ""
    return f"profile {profile.name} measured no {wd} GEMMs{why}"


def _ffn_gemms(config: ModelConfig, width: int, tp: int, count: float) -> list[tuple[str, int, int, float]]:
    up = 2 * width if config.mlp == "swiglu" else width
    return [("gate + up" if config.mlp == "swiglu" else "up", max(1, up // tp), config.hidden_size, count),
            ("down", config.hidden_size, max(1, width // tp), count)]


def layer_gemms(config: ModelConfig, mesh: Mesh) -> list[tuple[str, int, int, float]]:
    """(name, n, k, layers) of the dense weight GEMMs on the busiest GPU's stage, per token row; the routed
    experts are `moe_shape`'s."""
    c, tp = config, mesh.tp
    layers = stage_layers(c, mesh.pp)
    share = layers / c.num_layers
    lin = linear_layers(c, mesh)
    out = _mla_gemms(c, tp, layers) if arch.is_mla(c) else _attention_gemms(c, tp, layers - lin)
    if lin:
        out += _linear_gemms(c, tp, lin)
    moe_layers = arch.moe_layer_count(c) * share if arch.is_moe(c) else 0.0
    dense_layers = layers - moe_layers
    if dense_layers > 0:
        out += _ffn_gemms(c, c.intermediate_size, tp, dense_layers)
    if moe_layers:
        shared = c.shared_expert_intermediate_size or (c.num_shared_experts or 0) * (c.moe_intermediate_size or 0)
        if shared:
            out += [(f"shared expert {n}", nn, k, cnt) for n, nn, k, cnt in _ffn_gemms(c, shared, tp, moe_layers)]
        out.append(("router", c.num_experts, c.hidden_size, moe_layers))
    return out


def _attention_gemms(c: ModelConfig, tp: int, layers: float) -> list[tuple[str, int, int, float]]:
    kv = max(1, c.num_kv_heads // tp) * c.head_dim
    return [("qkv projection", arch.q_out_dim(c) // tp + 2 * kv, c.hidden_size, layers),
            ("o projection", c.hidden_size, c.q_dim // tp, layers)]


def linear_layers(config: ModelConfig, mesh: Mesh) -> float:
    """The gated-delta-rule (linear attention) layers on the busiest stage."""
    n = arch.kind_counts(config)[arch.LINEAR]
    return n * stage_layers(config, mesh.pp) / config.num_layers if n else 0.0


def _linear_gemms(c: ModelConfig, tp: int, layers: float) -> list[tuple[str, int, int, float]]:
    """A gated-delta-rule layer's projections on one GPU of a TP group (heads split): q, k, v and the output gate
    z (in_proj_qkvz), the update and decay gates (in_proj_ba), and out_proj."""
    L, D = arch.linear_dims(c), c.hidden_size
    return [("in_proj_qkvz (linear attention)", max(1, (2 * L["key_dim"] + 2 * L["value_dim"]) // tp), D, layers),
            ("in_proj_ba (linear attention)", max(1, 2 * L["num_v_heads"] // tp), D, layers),
            ("out_proj (linear attention)", D, max(1, L["value_dim"] // tp), layers)]


def _linear_heads(config: ModelConfig, mesh: Mesh) -> tuple[int, int, int, int]:
    L = arch.linear_dims(config)
    return (max(1, L["num_k_heads"] // mesh.tp), max(1, L["num_v_heads"] // mesh.tp), L["head_k"], L["head_v"])


def linear_decode_op(profile, device: Device, config: ModelConfig, mesh: Mesh, rows):
    """One gated-delta-rule layer's decode step of `rows` sequences on one GPU of the TP group."""
    return linear_decode_ms(profile, device, rows, *_linear_heads(config, mesh))


def linear_prefill_op(profile, device: Device, config: ModelConfig, mesh: Mesh, tokens, batch=1.0):
    """One gated-delta-rule layer's prefill of `batch` prompts of `tokens` on one GPU of the TP group."""
    return linear_prefill_ms(profile, device, tokens, *_linear_heads(config, mesh), batch=batch)


def _mla_gemms(c: ModelConfig, tp: int, layers: float) -> list[tuple[str, int, int, float]]:
    """MLA's projections on one GPU of a TP group (heads split, the latent down-projections replicated): q_a and
    q_b (or one q projection), kv_a (the latent and the shared RoPE key), the absorbed W_UK and W_UV (per-head
    products, priced as one GEMM of the same FLOPs and weight bytes) and o."""
    h, D = max(1, c.num_heads // tp), c.hidden_size
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    q = [("q_a projection", c.q_lora_rank, D, layers), ("q_b projection", h * qk, c.q_lora_rank, layers)] \
        if c.q_lora_rank else [("q projection", h * qk, D, layers)]
    return q + [("kv_a projection", c.kv_lora_rank + c.qk_rope_head_dim, D, layers),
                ("q absorb (W_UK)", h * c.kv_lora_rank, c.qk_nope_head_dim, layers),
                ("v up-projection (W_UV)", h * c.v_head_dim, c.kv_lora_rank, layers),
                ("o projection", D, h * c.v_head_dim, layers)]


def decode_attention_op(profile, device: Device, config: ModelConfig, mesh: Mesh, rows, context: float,
                        kv_dtype: str):
    """One layer's decode attention on one GPU of the TP group: MLA's (absorbed, from the MLA table) or
    GQA/MQA's (heads and KV heads split by TP)."""
    h, kvh = _heads(config, mesh)
    c = config
    if arch.is_mla(c):
        return mla_decode_ms(profile, device, rows, context, h, c.kv_lora_rank, c.qk_rope_head_dim, kv_dtype)
    return decode_attention_ms(profile, device, rows, context, h, kvh, c.head_dim, kv_dtype)


def prefill_attention_op(profile, device: Device, config: ModelConfig, mesh: Mesh, tokens, kv_dtype: str,
                         batch=1.0):
    """One layer's causal prefill attention of `batch` prompts of `tokens` on one GPU of the TP group (MLA's
    from the MLA table)."""
    h, kvh = _heads(config, mesh)
    c = config
    if arch.is_mla(c):
        return mla_prefill_ms(profile, device, tokens, h, c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim,
                              kv_dtype, batch=batch)
    return prefill_attention_ms(profile, device, tokens, h, kvh, c.head_dim, kv_dtype, batch=batch)


def attention_shape(config: ModelConfig, mesh: Mesh) -> str:
    """The attention's per-GPU heads in words, for an op table."""
    h, kvh = _heads(config, mesh)
    if arch.is_mla(config):
        return f"{h} heads, MLA latent {config.kv_lora_rank} + {config.qk_rope_head_dim}"
    return f"{h} heads / {kvh} KV"


def experts_fan_in(mesh: Mesh) -> float:
    """How many replicas' tokens one GPU's experts see: ep / tp where the EP group spans data-parallel replicas
    (attention DP, wide EP: every replica dispatches its tokens to every expert's GPU), else 1 (EP inside the TP
    group: the group's GPUs share one replica's tokens). A measured MoE table counts the tokens of the whole EP
    group, so a replica's g tokens are g × this there."""
    return mesh.ep / mesh.tp if mesh.ep > mesh.tp else 1.0


def moe_shape(config: ModelConfig, mesh: Mesh) -> dict | None:
    """The fused-MoE op's sizes on one GPU and the stage's MoE layers (None for a dense model)."""
    c = config
    if not arch.is_moe(c):
        return None
    ep = max(1, mesh.ep)
    return dict(hidden=c.hidden_size, inter=c.moe_intermediate_size or c.intermediate_size, experts=c.num_experts,
                topk=c.num_experts_per_tok, tp=max(1, mesh.tp // ep), ep=ep, layers=moe_layers_per_stage(c, mesh))


def attention_layers(config: ModelConfig, mesh: Mesh) -> list[tuple[int | None, float]]:
    """(window or None, layers on the busiest stage) for each attention kind the stage runs."""
    c = config
    share = stage_layers(c, mesh.pp) / c.num_layers
    counts = arch.kind_counts(c)
    out = []
    if counts[arch.FULL]:
        out.append((None, counts[arch.FULL] * share))
    if counts[arch.SLIDING]:
        out.append((c.sliding_window, counts[arch.SLIDING] * share))
    return out


KERNELS_PER_LAYER = 4       # two fused residual-add + norm kernels, RoPE, the gate's activation
KERNELS_PER_STEP = 2        # the final norm and the sampler


def kernels_per_layer(config: ModelConfig) -> int:
    """The small kernels of one layer: KERNELS_PER_LAYER, plus MLA's norms of its latents (q_a's and kv_a's)."""
    if arch.is_mla(config):
        return KERNELS_PER_LAYER + (2 if config.q_lora_rank else 1)
    return KERNELS_PER_LAYER


def elementwise_bytes_per_token(config: ModelConfig, mesh: Mesh) -> float:
    """Bytes the small kernels of one layer move per token on one GPU: two fused residual-add + norms (each
    reads and writes the hidden state and the residual), RoPE over q and k, and the gate's activation (reads
    gate and up, writes their product), all in 16 bits."""
    c, tp = config, mesh.tp
    ffn = (c.moe_intermediate_size or c.intermediate_size) * (c.num_experts_per_tok or 1) if arch.is_moe(c) \
        else c.intermediate_size
    if arch.is_mla(c):             # RoPE over the heads' rope part and the shared key, the latents' norms
        qk = max(1, c.num_heads // tp) * c.qk_rope_head_dim + c.qk_rope_head_dim + c.kv_lora_rank + \
            (c.q_lora_rank or 0)
    else:
        qk = (arch.q_out_dim(c) + max(1, c.num_kv_heads // tp) * c.head_dim * tp) / tp
    return (2 * 4 * c.hidden_size + 2 * qk + 3 * ffn / tp) * ACT_BYTES


def _heads(config: ModelConfig, mesh: Mesh) -> tuple[int, int]:
    return max(1, config.num_heads // mesh.tp), max(1, config.num_kv_heads // mesh.tp)


def step_grid_tables(profile, config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
                     decode_ctx: float, prompt_len: float, grid: np.ndarray) -> dict:
    """The measured parts of a step on a grid of tokens per microbatch, in ms on the busiest GPU:
        gemm         every weight GEMM and the fused MoE at m = g tokens
        decode_attn  attention of g decode rows at `decode_ctx` cached positions
        prefill_attn attention of g prompt tokens as prompts of `prompt_len` (a chunk of g < P tokens alone)
        lm_head      the LM head for g sequences
    and their datasheet rooflines (`*_ideal`) and where any was extrapolated (`extrapolated`)."""
    problem = profile_support(config, profile)
    if problem:
        raise SpecError(problem)
    wd = kernel_format(config, weight_dtype)
    g = np.asarray(grid, dtype=float)
    past = np.zeros_like(g, dtype=bool)
    gemm, gemm_ideal = np.zeros_like(g), np.zeros_like(g)
    for name, n, k, count in layer_gemms(config, mesh):
        ideal, ms, ex = gemm_ms(profile, device, g, n, k, gemm_dtype(name, wd))
        gemm += count * ms
        gemm_ideal += count * ideal
        past |= ex
    moe = moe_shape(config, mesh)
    if moe:
        layers = moe.pop("layers")
        ideal, ms, ex = moe_ms(profile, device, g * experts_fan_in(mesh), dtype=wd, **moe)
        gemm += layers * ms
        gemm_ideal += layers * ideal
        past |= ex
    dec, dec_ideal, pre, pre_ideal = (np.zeros_like(g) for _ in range(4))
    P = max(1.0, float(prompt_len))
    for window, count in attention_layers(config, mesh):
        ctx = min(decode_ctx, window) if window else decode_ctx
        ideal, ms, ex = decode_attention_op(profile, device, config, mesh, g, max(ctx, 1.0), kv_dtype)
        dec += count * ms
        dec_ideal += count * ideal
        past |= ex
        whole = g >= P                                   # whole prompts: g / P of them at P tokens each
        tok = np.where(whole, P, g)
        batch = np.where(whole, g / P, 1.0)
        p_ideal, p_ms = _prefill_rows(lambda t, b: prefill_attention_op(profile, device, config, mesh, t, kv_dtype,
                                                                         batch=b), tok, batch, window)
        pre += count * p_ms
        pre_ideal += count * p_ideal
    lin = linear_layers(config, mesh)
    if lin:                                              # gated delta rule: its state, not the context, is read
        ideal, ms, ex = linear_decode_op(profile, device, config, mesh, g)
        dec += lin * ms
        dec_ideal += lin * ideal
        past |= ex
        whole = g >= P
        p_ideal, p_ms = _prefill_rows(lambda t, b: linear_prefill_op(profile, device, config, mesh, t, batch=b),
                                      np.where(whole, P, g), np.where(whole, g / P, 1.0), None)
        pre += lin * p_ms
        pre_ideal += lin * p_ideal
    vocab_n = max(1, config.vocab_size // mesh.tp)
    head_dtype = lm_head_dtype(wd)
    lm_ideal, lm, ex = gemm_ms(profile, device, g, vocab_n, config.hidden_size, head_dtype)
    past |= ex
    layers = stage_layers(config, mesh.pp)
    small = elementwise_ms(profile, device, g * elementwise_bytes_per_token(config, mesh) * layers,
                           kernels_per_layer(config) * layers + KERNELS_PER_STEP)
    ew_ideal, ew = small if small is not None else (np.zeros_like(g), np.zeros_like(g))
    return dict(elementwise=ew, elementwise_ideal=ew_ideal, gemm=gemm, gemm_ideal=gemm_ideal, decode_attn=dec,
                decode_attn_ideal=dec_ideal, prefill_attn=pre, prefill_attn_ideal=pre_ideal, lm_head=lm,
                lm_head_ideal=lm_ideal, extrapolated=past)


def _prefill_rows(op, tokens, batch, window):
    """Prefill attention at each (tokens, batch) pair of the grid: whole prompts (batch ≥ 1 at the prompt's
    length, priced along the batch) and a chunk shorter than a prompt (batch 1, priced along its tokens); past a
    sliding window a token attends to `window` keys, so it costs what a window-long prompt's tokens cost.
    `op(tokens, batch)`: one layer's prefill op, (ideal, ms, extrapolated)."""
    ideal, ms = np.zeros_like(tokens), np.zeros_like(tokens)
    chunk = batch <= 1.0
    for sel, by_batch in ((~chunk, True), (chunk, False)):
        if not sel.any():
            continue
        t, b = tokens[sel], batch[sel]
        t_eff = np.minimum(t, window) if window else t
        scale = t / t_eff
        if by_batch:
            i, m, _ = op(float(t_eff[0]), b)
        else:
            i, m, _ = op(t_eff, 1.0)
        ideal[sel], ms[sel] = i * scale, m * scale
    return ideal, ms


def step_ops_table(profile, config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
                   decode_rows: int, context: float, prompt_tokens: int = 0, prompt_len: int | None = None,
                   compute_scale: float = 1.0, memory_scale: float = 1.0) -> list[dict]:
    """Every op of one step (decode_rows rows at `context`, plus `prompt_tokens` prompt tokens in prompts of
    `prompt_len`) on the busiest GPU: its shape, its roofline and measured ms for all the stage's layers, their
    ratio, whether it was extrapolated, and (`slower_than_bf16`) where its quantized kernel measures slower than
    the profile's bf16 one. What a page or the `ops` command shows beside the step.
    `compute_scale` and `memory_scale` (a borrowed profile's, `derated`): the measured times on the derated device,
    the rooflines on the datasheet's."""
    if compute_scale != 1.0 or memory_scale != 1.0:
        args = (mesh, weight_dtype, kv_dtype, decode_rows, context, prompt_tokens, prompt_len)
        slow = step_ops_table(profile, config, derated(device, compute_scale, memory_scale), *args)
        for row, own in zip(slow, step_ops_table(profile, config, device, *args)):
            row.update(ideal_ms=own["ideal_ms"], efficiency=own["ideal_ms"] / row["measured_ms"])
        return slow
    problem = profile_support(config, profile)
    if problem:
        raise SpecError(problem)
    wd = kernel_format(config, weight_dtype)
    m = int(decode_rows) + int(prompt_tokens)
    if m < 1:
        raise SpecError("a step carries at least one token: give decode rows or prompt tokens")
    rows = []

    def add(name, shape, priced: Priced, count, wide=None, dtype=""):
        slower = _slower_than_16_bits(priced, wide, count, dtype)
        rows.append(dict(op=name, shape=shape, layers=count, ideal_ms=priced.ideal_ms * count,
                         measured_ms=priced.ms * count, efficiency=priced.efficiency,
                         extrapolated=priced.extrapolated, note="; ".join(x for x in (priced.note, slower) if x),
                         slower_than_bf16=slower))
    for name, n, k, count in layer_gemms(config, mesh):
        dt = gemm_dtype(name, wd)
        add(name, f"{m:,} × {k:,} · {k:,} × {n:,} ({dt})", gemm_ms(profile, device, m, n, k, dt), count,
            _in_16_bits(lambda w: gemm_ms(profile, device, m, n, k, w), dt), dt)
    moe = moe_shape(config, mesh)
    if moe:
        layers = moe.pop("layers")
        fan = experts_fan_in(mesh)
        seen = f"{m:,} tokens × {fan:g} replicas" if fan > 1 else f"{m:,} tokens"
        add("routed experts (fused MoE)",
            f"{seen}, {moe['experts']} experts top-{moe['topk']}, {moe['hidden']:,} × {moe['inter']:,}, "
            f"TP {moe['tp']} × EP {moe['ep']}", moe_ms(profile, device, m * fan, dtype=wd, **moe), layers,
            _in_16_bits(lambda w: moe_ms(profile, device, m * fan, dtype=w, **moe), wd), wd)
    heads = attention_shape(config, mesh)
    P = int(prompt_len or prompt_tokens or 1)            # the step's prompts: n_prompts of tok tokens each
    n_prompts, tok = max(1.0, prompt_tokens / P), min(P, int(prompt_tokens))
    for window, count in attention_layers(config, mesh):
        tag = f" (window {window:,})" if window else ""
        if decode_rows:
            ctx = min(context, window) if window else context
            add("decode attention" + tag, f"{decode_rows:,} rows × {ctx:,.0f} positions, {heads}",
                decode_attention_op(profile, device, config, mesh, int(decode_rows), max(float(ctx), 1.0),
                                    kv_dtype), count)
        if prompt_tokens:
            add("prefill attention" + tag, f"{n_prompts:g} prompt(s) × {tok:,} tokens, {heads}",
                prefill_attention_op(profile, device, config, mesh, float(min(tok, window) if window else tok),
                                     kv_dtype, batch=n_prompts), count)
    lin = linear_layers(config, mesh)
    if lin:
        kh, vh, dk, dv = _linear_heads(config, mesh)
        state = f"{kh} key / {vh} value heads, state {dk} × {dv}"
        if decode_rows:
            add("linear attention (gated delta rule)", f"{decode_rows:,} rows, {state}",
                linear_decode_op(profile, device, config, mesh, int(decode_rows)), lin)
        if prompt_tokens:
            add("linear attention prefill", f"{n_prompts:g} prompt(s) × {tok:,} tokens, {state}",
                linear_prefill_op(profile, device, config, mesh, float(tok), batch=n_prompts), lin)
    sequences = int(decode_rows) + (math.ceil(prompt_tokens / P) if prompt_tokens else 0)
    head_dtype = lm_head_dtype(wd)
    add("LM head", f"{sequences:,} × {config.hidden_size:,} · {config.hidden_size:,} × "
        f"{max(1, config.vocab_size // mesh.tp):,}",
        gemm_ms(profile, device, sequences, max(1, config.vocab_size // mesh.tp), config.hidden_size, head_dtype), 1)
    layers = stage_layers(config, mesh.pp)
    kernels = kernels_per_layer(config) * layers + KERNELS_PER_STEP
    small = elementwise_ms(profile, device, m * elementwise_bytes_per_token(config, mesh) * layers, kernels)
    if small is not None:
        rows.append(dict(op="norms, RoPE, activation, sampling", shape=f"{m:,} tokens, {kernels:,} kernels",
                         layers=layers,
                         ideal_ms=float(small[0]), measured_ms=float(small[1]),
                         efficiency=float(small[0] / small[1]), extrapolated=False, note="memory-bound small kernels",
                         slower_than_bf16=""))
    return rows


def _in_16_bits(price, dtype: str) -> Priced | None:
    """The same op priced from the profile's bf16 table (`price(dtype)`), where the op runs in a narrower format
    and the profile measured bf16 at it; else None."""
    if dtype in ("bf16", "fp16", "fp32"):
        return None
    try:
        wide = price("bf16")
    except SpecError:
        return None
    return None if wide.note else wide


def _slower_than_16_bits(priced: Priced, wide: Priced | None, count: float, dtype: str) -> str:
    """A note where the profile's quantized kernel measures slower than its bf16 kernel at the same shape (by
    10% or more): the planner takes the format asked for, and the user should know that here it costs time."""
    if wide is None or priced.ms < 1.1 * wide.ms:
        return ""
    return (f"this profile's bf16 kernel is faster at this shape: {fmt_num(wide.ms * count, 3)} ms in these "
            f"layers against {fmt_num(priced.ms * count, 3)} ms in {dtype}")


def derated(device: Device, compute_scale: float, memory_scale: float = 1.0) -> Device:
    """`device` with every datasheet peak FLOP/s divided by `compute_scale` and its memory bandwidth by
    `memory_scale`: what a borrowed profile's efficiencies are read against, so its compute-bound ops (large GEMMs,
    prefill attention) take `compute_scale` × longer than the profiled device's efficiency at this datasheet would
    say, and its memory-bound ops (decode GEMVs, decode attention, the small kernels) `memory_scale` × longer. The
    device itself where both scales are 1."""
    if compute_scale == 1.0 and memory_scale == 1.0:
        return device
    return replace(device, peak_flops={k: v / compute_scale for k, v in device.peak_flops.items()},
                   peak_flops_sparse={k: v / compute_scale for k, v in device.peak_flops_sparse.items()},
                   memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s / memory_scale)


def allreduces_per_stage(config: ModelConfig, mesh: Mesh) -> float:
    """The TP all-reduces one pipeline stage runs per step (as `tensor_parallel._comm_per_stage_ms` counts them):
    two per layer (after attention, after the FFN), or, where the EP group spans data-parallel replicas, one per
    layer plus one per dense-FFN layer (the MoE layers exchange tokens by all-to-all instead); 0 without TP."""
    if mesh.tp == 1:
        return 0.0
    layers = stage_layers(config, mesh.pp)
    if mesh.ep > mesh.tp:
        return layers * (2.0 - arch.moe_layer_count(config) / config.num_layers)
    return 2.0 * layers


def measured_collectives(profile, config: ModelConfig, mesh: Mesh, link: Link | None, stack, tokens,
                         closed_ms, weight_dtype: str = "bf16", expert_imbalance: float | None = None
                         ) -> np.ndarray | None:
    """The stage's collectives at each token count of `tokens` with its TP all-reduces priced from the profile's
    measured all-reduce table (`measured_ops.allreduce_ms`: efficiency against the link's roofline, interpolated
    in log bytes, so a borrowed profile is read at this link's datasheet) in place of the closed form's:
        closed_ms + all-reduces per stage × (measured − closed form) of one [tokens, D] all-reduce
    and, where the EP group spans data-parallel replicas (wide EP), each MoE layer's token exchange the stack
    runs (`Stack.moe_dp_comm`) from its measured tables: all-gather + reduce-scatter (`measured_gather_scatter_ms`)
    or DeepEP's dispatch and combine (`measured_a2a_ms`), in place of the closed form's (`moe.moe_layer_comm_ms`
    by the same method, at the same imbalance). None where the profile measured neither (the closed form
    stands)."""
    if link is None:
        return None
    t = np.asarray(tokens, dtype=float)
    out, used = np.asarray(closed_ms, dtype=float).copy(), False
    n = allreduces_per_stage(config, mesh)
    if n:
        message = np.array([tp_allreduce_bytes(config.hidden_size, int(math.ceil(x))) for x in t])
        measured = measured_allreduce_ms(profile, link, message, mesh.tp)
        if measured is not None:
            closed = np.array([closed_allreduce_ms(b, mesh.tp, link, stack) for b in message])
            out, used = out + n * (measured - closed), True
    method = stack.moe_dp_comm if isinstance(stack, Stack) else load_stack(stack).moe_dp_comm
    exchange = (measured_a2a_ms(profile, config, mesh, link, weight_dtype, t) if method == "all_to_all" else
                measured_gather_scatter_ms(profile, config, mesh, link, weight_dtype, t)) \
        if mesh.ep > mesh.tp else None
    if exchange is not None:
        rows = [int(math.ceil(x)) for x in t]
        closed = np.array([moe_layer_comm_ms(exchange_tokens(r, mesh), config, mesh.ep, link,
                                             exchange_bytes(weight_dtype),
                                             expert_imbalance_for(config, mesh, r, expert_imbalance), method=method)
                           for r in rows])
        out, used = out + moe_layers_per_stage(config, mesh) * (exchange - closed), True
    return out if used else None


def measured_gather_scatter_ms(profile, config: ModelConfig, mesh: Mesh, link: Link, weight_dtype: str, tokens):
    """One MoE layer's all-gather + reduce-scatter on a wide-EP mesh (`Stack.moe_dp_comm` "allgather_reducescatter")
    for `tokens` tokens per replica: each of the ep GPUs gathers every GPU's tokens / tp (NVFP4 ahead of FP4
    experts, else 16 bits: `moe.exchange_bytes`) and reduce-scatters their 16-bit outputs, from the profile's
    measured NCCL tables (`measured_ops.ring_collective_ms`); None where either was not measured."""
    per_gpu = np.maximum(np.asarray(tokens, dtype=float) / mesh.tp, 1.0)
    vectors = per_gpu * mesh.ep * config.hidden_size
    parts = [ring_collective_ms(profile, table, link.bytes_per_s, vectors * size, mesh.ep)
             for table, size in (("allgather", exchange_bytes(weight_dtype)), ("reduce_scatter", 2.0))]
    if any(p is None for p in parts):
        return None
    return sum(np.asarray(p[1], dtype=float) for p in parts)


def moe_layers_per_stage(config: ModelConfig, mesh: Mesh) -> float:
    """The MoE layers one pipeline stage runs."""
    return arch.moe_layer_count(config) * stage_layers(config, mesh.pp) / config.num_layers


def dispatch_format(weight_dtype: str) -> str:
    """What a wide-EP dispatch sends: NVFP4 activations for FP4 experts (quantized before the all-to-all), else
    16-bit; the combine sends 16-bit results back."""
    return "nvfp4" if WEIGHT_FORMATS.get(str(weight_dtype), str(weight_dtype)) == "fp4" else "bfloat16"


def measured_a2a_ms(profile, config: ModelConfig, mesh: Mesh, link: Link, weight_dtype: str, tokens):
    """One MoE layer's dispatch + combine on the busiest GPU of a wide-EP mesh for `tokens` tokens per replica
    (each of the replica's tp GPUs sends tokens / tp), from the profile's measured all-to-all table
    (`measured_ops.moe_a2a_ms`: DeepEP, the fastest backend at each size); None where either phase was not
    measured in its format. The tables' routing is their benchmark's (random), so `expert_imbalance` does not
    move them."""
    per_gpu = np.maximum(np.asarray(tokens, dtype=float) / mesh.tp, 1.0)
    shape = dict(hidden=config.hidden_size, topk=config.num_experts_per_tok, experts=config.num_experts, ep=mesh.ep)
    parts = [moe_a2a_ms(profile, link.bytes_per_s, per_gpu, phase=phase, dtype=dtype, **shape)
             for phase, dtype in (("dispatch", dispatch_format(weight_dtype)), ("combine", "bfloat16"))]
    if any(p is None for p in parts):
        return None
    return sum(np.asarray(p[1], dtype=float) for p in parts)


def measured_allreduce_ms(profile, link: Link, message_bytes, gpus: int):
    """One all-reduce of `message_bytes` (array allowed) over `gpus` GPUs on `link`, ms, from the profile's
    measured table (`measured_ops.allreduce_ms`); None where the profile measured none."""
    priced = allreduce_ms(profile, link.bytes_per_s, message_bytes, int(gpus))
    if priced is None:
        return None
    return priced.ms if np.ndim(message_bytes) == 0 else priced[1]


AUTO = "auto"
PROFILE_ENV = "INFERENCE_LAB_PROFILE"


def default_profile_choice() -> str:
    """What prices a step when nobody says: $INFERENCE_LAB_PROFILE, else "auto" (`resolve_profile`). The commands'
    --profile default and a page's measured-kernels switch both start from it, so they price alike."""
    import os
    return os.environ.get(PROFILE_ENV, AUTO)


def nearest_profiled(device: Device, stack_key: str) -> Device | None:
    """The profiled device (on this stack) whose datasheet is closest to `device`'s in log bandwidth and log BF16
    peak, among devices of its kind (a GPU for a GPU); None when nothing is profiled."""
    from specs.devices import load_device
    from specs.profiles import profiled_devices
    best, dist = None, math.inf
    for name in profiled_devices(stack_key):
        try:
            d = load_device(name)
        except SpecError:                    # a profile's own device (this CPU): no datasheet to compare with
            continue
        if d.kind != device.kind:
            continue
        x = (math.log(d.memory_bandwidth_bytes_per_s / device.memory_bandwidth_bytes_per_s) ** 2
             + math.log(d.peak("bf16") / device.peak("bf16")) ** 2)
        if x < dist:
            best, dist = d, x
    return best


def _derate_words(stack_key: str, device: Device) -> str:
    """How a borrowed profile's work is slowed on `device` (the stack's `measured_host` fit)."""
    try:
        stack = load_stack(stack_key)
        host = stack.measured_host(device.vendor)
    except SpecError:
        return ""
    if not host or (host["borrowed_compute_scale"] == 1.0 and host["borrowed_memory_scale"] == 1.0):
        return ""
    of = f" of {stack.build_doc.get('name', stack.build)}" if stack.build else ""
    return (f", its compute-bound work {host['borrowed_compute_scale']:g}x slower, its memory-bound work "
            f"{host['borrowed_memory_scale']:g}x slower and a {host['step_overhead_ms']:g} ms step, fitted on "
            f"published {device.vendor or device.name} rows{of}")


def resolve_profile(profile, device: Device, stack_key: str, config: ModelConfig | None = None,
                    weight_dtype: str | None = None):
    """The profile a command prices with, and a sentence saying which and why:
        None or "none"   the closed form
        "auto"           the newest profile measured on this device and stack; for a device nothing measured,
                         the nearest profiled device of its kind (its kernels' efficiencies at this device's
                         datasheet roofline: `measured_ops.profile_device`); the closed form when nothing is
        a name or path   that profile (`specs.profiles.load_profile`)
        a Profile        itself
    A model the profile cannot price (`profile_support`), or with `weight_dtype` a weight format it has no GEMMs for
    (`format_problem`), falls back to the closed form, and the sentence says so."""
    if profile is None or profile == "none":
        return None, "closed form (asked for)"
    from specs.profiles import load_profile, profile_for
    note = ""
    if profile == AUTO:
        full_key, stack_key = stack_key, stack_key.partition("@")[0]      # a build ('vllm@...') runs its stack's
        found = profile_for(device.name, stack_key)                        # kernels, with its own factors
        if found is None:
            near = nearest_profiled(device, stack_key)
            if near is None:
                return None, f"closed form: no kernels measured with {stack_key} are installed"
            found = profile_for(near.name, stack_key)
            note = (f" (nothing measured on {device.name}: the efficiencies of the nearest profiled device, "
                    f"{near.name}, at {device.name}'s datasheet roofline without its GEMMs' kernel-size cliffs, "
                    f"its quantized kernels no less efficient than its bf16 ones"
                    f"{_derate_words(full_key, device)})")
        profile = found
    elif isinstance(profile, str):
        profile = load_profile(profile)
    problem = profile_support(config, profile) if config is not None else None
    problem = problem or (format_problem(profile, weight_dtype) if weight_dtype is not None else None)
    if problem:
        return None, f"closed form: {problem}"
    return profile, f"measured kernels: {profile.name}{note}"
