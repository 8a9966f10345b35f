"""Latency, throughput and cost: the bandwidth floor, prefill/TTFT, ITL, total latency, batching and $/1M tokens.

003 Details 11-13 and 21:
- Decode is bandwidth-bound: a step cannot be faster than (weight bytes + KV bytes read) / memory bandwidth.
- Prefill is compute-bound once the prompt is long: time ≈ FLOPs / peak FLOP/s (or the weight read, if longer).
- Total latency = TTFT + ITL × (output_tokens − 1).
"Ideal" numbers use datasheet peaks; "realistic" ones divide by efficiency knobs (`Efficiency`): model bandwidth
utilisation (MBU, decode) and model FLOP/s utilisation (MFU, prefill), whose defaults and sources are below.
Weights in the floor follow 003's lower-bound model "one full weight read per token" (all parameters; for an MoE
model, the experts a step touches); the op-by-op roofline in `roofline.py` instead counts only the embedding rows
gathered, so its step bytes are lower by V·D·bytes (131 MB for TinyLlama).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from calculators import arch
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.params import bytes_per_param, expert_params, param_breakdown
from calculators.sizing.roofline import (compute_precision_for, experts_touched, forward_flops_split, gpu_time,
                                         kv_bytes_step, step_peaks)
from calculators.units import check_fraction, check_int, check_nonneg, check_positive, default_kv_dtype
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, check_stack_device, device_class, load_stack


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak a real serving stack reaches. Defaults are typical published figures (assumptions):
    - decode_mbu 0.6: Databricks/MosaicML, "LLM Inference Performance Engineering: Best Practices" (2023,
      https://www.databricks.com/blog/llm-inference-performance-engineering-best-practices) report model
      bandwidth utilisation of roughly 50-70% at small batch on A100/H100.
    - prefill_mfu 0.7 (was 0.5, which predicted TTFTs 1.4-1.6× slower than measured-kernel models such as
      NVIDIA aiconfigurator's): large BF16/FP8 GEMMs reach about 70-80% of the dense peak with cuBLAS on A100 and
      H100 (NVIDIA cuBLAS / Transformer Engine GEMM benchmarks), and Pope et al., "Efficiently Scaling
      Transformer Inference" (2022, arXiv:2211.05102) reach 76% MFU on large prefills. Attention, norms and
      launch gaps keep a whole prefill a little below the GEMM figure. Calibrate it (`calculators.planning.calibration`).
    - prefill_mbu 0.8: a long prefill streams the weights once in large, well-coalesced GEMM tiles.
    - step_overhead_ms 0: a fixed cost every forward step pays whatever its size (kernel launches, the scheduler,
      sampling); a serving stack's value per device class comes from `for_stack` (specs/stacks.json).
    - sequence_overhead_us 0: a cost per sequence in the step (the scheduler's and sampler's bookkeeping for each
      running request), so a step of B sequences pays step_overhead_ms + B × sequence_overhead_us / 1000.
    - gemm_half_tokens 0: see `mfu_at` (the serving step's MFU as a function of the tokens it carries).
    - overlap_host False: whether the stack prepares the next step on the host while the GPU runs this one (an
      overlap scheduler: TensorRT-LLM's PyTorch backend and SGLang by default), so the step and per-sequence
      overheads hide behind the GPU's work instead of adding to it (`stage_ms`)."""
    decode_mbu: float = 0.6
    prefill_mfu: float = 0.7
    prefill_mbu: float = 0.8
    decode_mfu: float = 0.5
    step_overhead_ms: float = 0.0
    sequence_overhead_us: float = 0.0
    gemm_half_tokens: float = 0.0       # a serving step's MFU = decode_mfu · t/(t + this) at t tokens (0: flat)
    overlap_host: bool = False          # the host's per-step work overlaps the GPU's (see `stage_ms`)

    def __post_init__(self):
        for k, v in asdict(self).items():
            if k == "overlap_host":
                if not isinstance(v, bool):
                    raise SpecError(f"overlap_host must be true or false, got {v!r}")
            elif k in ("step_overhead_ms", "sequence_overhead_us", "gemm_half_tokens"):
                check_nonneg(k, v, limit=1e4)
            else:
                check_fraction(k, v)

    @classmethod
    def for_stack(cls, stack: "Stack | str | None" = None, device: Device | None = None,
                  weight_dtype: str | None = None, config: ModelConfig | None = None) -> "Efficiency":
        """The default efficiencies and fixed step cost of a serving stack (vLLM when None) on `device`'s class,
        for the device's vendor, the weights' precision and the model's kind (dense, or mixture of experts when
        `config` is one) where the stack's data distinguishes them (fitted to the fit rows of
        bench/published_serving.csv; specs/stacks.json says which)."""
        s = stack if isinstance(stack, Stack) else load_stack(stack)
        if device is not None:
            check_stack_device(s, device)
        over = s.overhead_ms(device_class(device)) if device is not None else s.overhead_ms("other")
        prec = compute_precision_for(weight_dtype) if weight_dtype else None
        eff = s.efficiency_for(device.vendor if device is not None else "", prec,
                               moe=config is not None and arch.is_moe(config))
        over = float(eff.pop("step_overhead_ms", over))
        return cls(**{k: float(v) for k, v in eff.items()}, step_overhead_ms=over, overlap_host=s.overlap_host)

    def mfu_at(self, tokens):
        """MFU of a serving step that multiplies `tokens` rows through the weights: decode_mfu · t / (t + t½).
        A GEMM with few rows leaves most of the tensor cores' tiles idle and pays its launch and epilogue fixed
        costs; t½ (the tokens at which half of decode_mfu is reached) is fitted per stack (specs/stacks.json).
        With t½ = 0 the MFU is flat. Arrays broadcast."""
        return gemm_mfu(self.decode_mfu, self.gemm_half_tokens, tokens)

    def overhead_ms(self, sequences: int | float = 1) -> float:
        """Fixed cost of one step that carries `sequences` sequences: step + per-sequence part, in ms."""
        return self.step_overhead_ms + sequences * self.sequence_overhead_us / 1e3

    def stage_ms(self, gpu_ms, sequences=1):
        """A step's time from its GPU time (memory or compute, collectives), its fixed cost and the host's work for
        `sequences` sequences (`stage_with_host`). Arrays broadcast."""
        return stage_with_host(gpu_ms, self.step_overhead_ms,
                               np.asarray(sequences, dtype=float) * self.sequence_overhead_us / 1e3, self.overlap_host)


IDEAL = Efficiency(1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0)


def stage_with_host(gpu_ms, fixed_ms, sequences_ms, overlap):
    """A step = its GPU work + its fixed cost, with the per-sequence host work added, or hidden behind them:
        overlap:     max(gpu + fixed, sequences)
        otherwise:   gpu + fixed + sequences
    The fixed cost (`step_overhead_ms`: the step's many small kernels, sampling and the synchronisation between
    steps) lies on the GPU's timeline, so no scheduler hides it. The per-sequence work (`sequence_overhead_us` × the
    sequences: scheduling, detokenising and stop checks for each request) is the host's, which an overlap scheduler
    (TensorRT-LLM's PyTorch backend, SGLang) runs for step k + 1 while the GPU runs step k. Arrays broadcast."""
    gpu = np.asarray(gpu_ms, dtype=float) + fixed_ms
    return np.where(overlap, np.maximum(gpu, sequences_ms), gpu + sequences_ms)


def gemm_mfu(decode_mfu, half_tokens, tokens):
    """`Efficiency.mfu_at` with the efficiencies as arrays too (one per candidate): decode_mfu · t / (t + t½),
    flat where t½ = 0."""
    half = np.asarray(half_tokens, dtype=float)
    if not half.any():
        return decode_mfu
    t = np.maximum(tokens, 1.0)                         # an empty step does no GEMM: keep the ratio finite
    return np.where(half > 0, decode_mfu * t / (t + half), decode_mfu)


def bandwidth_floor_ms(bytes_read: float, bandwidth_bytes_per_s: float) -> float:
    """Lowest possible time to stream `bytes_read` once: bytes / bandwidth, in ms (003 Detail 12).
    2.2 GB: RTX 4090 (1,008 GB/s) 2.18 ms; A100 SXM 40GB (1,555 GB/s) 1.41 ms; H100 SXM (3,350 GB/s) 0.66 ms."""
    return check_nonneg("bytes_read", bytes_read) / check_positive("bandwidth", bandwidth_bytes_per_s) * 1e3


def step_weight_bytes(config: ModelConfig, weight_dtype: str = "bf16", rows: int = 1,
                      group_size: int | None = None) -> float:
    """Weight bytes a decode step reads in 003's model: every parameter once (TinyLlama FP16 ≈ 2.2 GB); for an MoE
    model the routed experts are replaced by the ones `rows` tokens touch (expected, uniform routing)."""
    b = param_breakdown(config)
    n = b.total
    if arch.is_moe(config):
        per_layer_hit = experts_touched(config.num_experts, config.num_experts_per_tok, rows)
        n = n - b.experts_routed + arch.moe_layer_count(config) * per_layer_hit * expert_params(config)
    return n * bytes_per_param(weight_dtype, group_size)


def decode_step_bytes(config: ModelConfig, context_tokens: int, batch: int = 1, weight_dtype: str = "bf16",
                      kv_dtype: str | None = None) -> dict:
    """Bytes one decode step moves: weights (see `step_weight_bytes`) + KV read (+ KV written, tiny), in bytes."""
    kv = kv_bytes_step(config, 1, context_tokens, kv_dtype or default_kv_dtype(weight_dtype), batch)
    w = step_weight_bytes(config, weight_dtype, rows=batch)
    return dict(weights=w, kv_read=kv["read"], kv_written=kv["written"], total=w + kv["read"] + kv["written"])


def decode_step_ms(config: ModelConfig, device: Device, context_tokens: int, batch: int = 1,
                   weight_dtype: str = "bf16", kv_dtype: str | None = None,
                   efficiency: Efficiency = IDEAL) -> dict:
    """One decode step (= ITL): the weight GEMMs' roofline max(weight bytes / (bandwidth·MBU), GEMM FLOPs /
    (peak·MFU)) + attention's max(KV bytes / (bandwidth·MBU), attention FLOPs / (its peak·MFU)) (`roofline.gpu_time`)
    + the step cost, each part shown."""
    by = decode_step_bytes(config, context_tokens, batch, weight_dtype, kv_dtype)
    fl = forward_flops_split(config, 1, context_tokens, batch)
    flops = fl["weights"] + fl["attention"]
    pk = step_peaks(device, weight_dtype, kv_dtype)
    prec = pk["precision"]
    bw = device.memory_bandwidth_bytes_per_s * efficiency.decode_mbu
    mem_w, mem_kv = by["weights"] / bw * 1e3, (by["kv_read"] + by["kv_written"]) / bw * 1e3
    comp_w = fl["weights"] / (pk["weights"] * efficiency.decode_mfu) * 1e3
    comp_a = fl["attention"] / (pk["attention"] * efficiency.decode_mfu) * 1e3
    mem_ms, comp_ms = mem_w + mem_kv, comp_w + comp_a
    over = efficiency.overhead_ms(batch)
    gpu = float(gpu_time(mem_w, comp_w, mem_kv, comp_a))
    return dict(step_ms=float(efficiency.stage_ms(gpu, batch)), memory_ms=mem_ms, compute_ms=comp_ms,
                overhead_ms=over, bytes=by["total"],
                flops=flops, bound="memory" if mem_ms >= comp_ms else "compute", precision=prec)


def prefill_ms(config: ModelConfig, device: Device, prompt_tokens: int, batch: int = 1, weight_dtype: str = "bf16",
               kv_dtype: str | None = None, efficiency: Efficiency = IDEAL, start_position: int = 0) -> dict:
    """Prefill of `prompt_tokens` per sequence: the GEMMs' and attention's rooflines added (as `decode_step_ms`)
    + the step cost.
    FLOPs and KV bytes follow `roofline.py`'s convention; weights are one full read. 003 Detail 12: a
    1,000-token TinyLlama prefill ≈ 2.2 TFLOP over ≈ 2.2 GB of weights."""
    T = check_int("prompt_tokens", prompt_tokens)
    S = T + check_int("start_position", start_position, minimum=0)
    fl = forward_flops_split(config, T, S, batch)
    flops = fl["weights"] + fl["attention"]
    kv = kv_bytes_step(config, T, S, kv_dtype or default_kv_dtype(weight_dtype), batch)
    wb = step_weight_bytes(config, weight_dtype, rows=batch * T)
    by = wb + kv["read"] + kv["written"]
    pk = step_peaks(device, weight_dtype, kv_dtype)
    prec = pk["precision"]
    bw = device.memory_bandwidth_bytes_per_s * efficiency.prefill_mbu
    mem_w, mem_kv = wb / bw * 1e3, (kv["read"] + kv["written"]) / bw * 1e3
    comp_w = fl["weights"] / (pk["weights"] * efficiency.prefill_mfu) * 1e3
    comp_a = fl["attention"] / (pk["attention"] * efficiency.prefill_mfu) * 1e3
    comp_ms, mem_ms = comp_w + comp_a, mem_w + mem_kv
    over = efficiency.overhead_ms(batch)
    gpu = float(gpu_time(mem_w, comp_w, mem_kv, comp_a))
    return dict(prefill_ms=float(efficiency.stage_ms(gpu, batch)), compute_ms=comp_ms, memory_ms=mem_ms,
                overhead_ms=over, flops=flops, bytes=by,
                intensity_flop_per_byte=flops / by, bound="compute" if comp_ms > mem_ms else "memory",
                precision=prec)


def total_latency_ms(ttft_ms: float, itl_ms: float, output_tokens: int) -> float:
    """Total = TTFT + ITL × (output_tokens − 1): the first token comes from prefill (003 Detail 11).
    003 Detail 21: 5 ms + 199 × 1.4 ms ≈ 284 ms for a 200-token reply."""
    n = check_int("output_tokens", output_tokens)
    return check_nonneg("ttft_ms", ttft_ms) + check_nonneg("itl_ms", itl_ms) * (n - 1)


def throughput_tok_s(batch: int, step_ms: float) -> float:
    """Tokens per second from one decode step producing one token per sequence: batch / step time."""
    return check_int("batch", batch) / (check_positive("step_ms", step_ms) / 1e3)


def cost_per_million_tokens(price_usd_per_hour: float, tokens_per_s: float) -> float:
    """$ per 1M generated tokens = price per hour / (tokens per second × 3,600) × 10^6."""
    return check_positive("price_usd_per_hour", price_usd_per_hour) / (
        check_positive("tokens_per_s", tokens_per_s) * 3600.0) * 1e6


def batch_table(weight_bytes: float, kv_bytes_per_token: float, context_tokens: int, batches: tuple[int, ...],
                bandwidth_bytes_per_s: float) -> list[dict]:
    """003 Detail 21's batching table: each decode step reads the weights once plus every sequence's KV cache:
        step = (weights + batch × context × kv_per_token) / bandwidth;  total tok/s = batch / step.
    TinyLlama, A100 1,555 GB/s, 300 tokens × 22 KB: batch 1/8/32/128 → 1.42/1.45/1.55/1.96 ms,
    704/5,517/20,645/65,306 tok/s."""
    w = check_nonneg("weight_bytes", weight_bytes)
    per = check_nonneg("kv_bytes_per_token", kv_bytes_per_token)
    S = check_int("context_tokens", context_tokens, minimum=0)
    rows = []
    for b in batches:
        b = check_int("batch", b)
        kv = b * S * per
        step = bandwidth_floor_ms(w + kv, bandwidth_bytes_per_s)
        rows.append(dict(batch=b, weight_bytes=w, kv_read_bytes=kv, total_bytes=w + kv, step_ms=step,
                         total_tok_s=throughput_tok_s(b, step), per_stream_tok_s=1e3 / step))
    return rows


def batch_table_for(config: ModelConfig, device: Device, context_tokens: int,
                    batches: tuple[int, ...] = (1, 8, 32, 128), weight_dtype: str = "bf16",
                    kv_dtype: str | None = None) -> list[dict]:
    """`batch_table` from a model and a device (weights = all parameters; KV from `kv_cache_bytes`, so sliding
    windows and fixed states are honoured), plus $ per 1M tokens where the device has a price."""
    rows = []
    for b in batches:
        kv = kv_cache_bytes(config, context_tokens, b, kv_dtype or default_kv_dtype(weight_dtype))
        w = step_weight_bytes(config, weight_dtype, rows=b)
        step = bandwidth_floor_ms(w + kv, device.memory_bandwidth_bytes_per_s)
        tps = throughput_tok_s(b, step)
        rows.append(dict(batch=b, weight_bytes=w, kv_read_bytes=kv, total_bytes=w + kv, step_ms=step,
                         total_tok_s=tps, per_stream_tok_s=1e3 / step,
                         usd_per_million_tokens=None if device.price_usd_per_hour is None else
                         cost_per_million_tokens(device.price_usd_per_hour, tps)))
    return rows


def compute_utilization(flops: float, bytes_moved: float, device: Device, precision: str = "bf16") -> float:
    """Fraction of peak compute used when a step runs at the bandwidth floor: (FLOPs/bytes × bandwidth) / peak.
    003 Detail 12: ≈ 1 FLOP/byte × 1,555 GB/s / 312 TFLOP/s ≈ 0.5% on an A100."""
    return (flops / check_positive("bytes_moved", bytes_moved)) * device.memory_bandwidth_bytes_per_s / \
        device.peak(precision)


def generation_latency(config: ModelConfig, device: Device, prompt_tokens: int, output_tokens: int,
                       batch: int = 1, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                       efficiency: Efficiency | None = None, queue_ms: float = 0.0) -> dict:
    """Ideal and realistic side by side for one request shape: TTFT (= queue + prefill), ITL (a decode step at
    the mean context prompt + (output−1)/2, exact for the linear part of the KV read), total latency,
    tokens/s per stream and in total, and $ per 1M output tokens where the device has a price."""
    eff = efficiency or Efficiency()
    P, N = check_int("prompt_tokens", prompt_tokens), check_int("output_tokens", output_tokens)
    mean_ctx = P + max(N - 1, 0) // 2 + 1
    out = {}
    for label, e in (("ideal", IDEAL), ("realistic", eff)):
        pre = prefill_ms(config, device, P, batch, weight_dtype, kv_dtype, e)
        dec = decode_step_ms(config, device, mean_ctx, batch, weight_dtype, kv_dtype, e)
        ttft = check_nonneg("queue_ms", queue_ms) + pre["prefill_ms"]
        total = total_latency_ms(ttft, dec["step_ms"], N)
        tps = throughput_tok_s(batch, dec["step_ms"])
        out[label] = dict(ttft_ms=ttft, prefill_ms=pre["prefill_ms"], prefill_bound=pre["bound"],
                          itl_ms=dec["step_ms"], decode_bound=dec["bound"], total_ms=total,
                          per_stream_tok_s=1e3 / dec["step_ms"], total_tok_s=tps,
                          usd_per_million_tokens=None if device.price_usd_per_hour is None else
                          cost_per_million_tokens(device.price_usd_per_hour, tps))
    out["efficiency"] = asdict(eff)
    out["mean_context_tokens"] = mean_ctx
    return out

