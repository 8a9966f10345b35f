"""Maximum throughput of a deployment: every request queued at once, fixed prompt and output lengths (what
`trtllm-bench throughput` and `vllm bench throughput` report).

In the steady state a replica keeps B sequences decoding; each step every one of them emits a token, and the
requests that finish (B / O per step on average) are replaced by new ones whose prompts (I tokens each) are
prefilled in the same step (chunked prefill), so one step carries B decode rows and B·I/O prompt tokens:
    B          = min(B_memory, max sequences, B_tokens)       whichever binds is reported
    B_memory   = sequences whose KV fits next to the weights: I + O tokens each when the stack reserves a
                 request's whole KV up front (TensorRT-LLM), I + O/2 on average when it grows (vLLM, SGLang)
    B_tokens   = max batched tokens per step × O / (I + O)    (decode rows + their share of prompt tokens)
    step       = max(weight bytes / (bandwidth·MBU), GEMM FLOPs / (peak·MFU))
                 + max(KV bytes / (bandwidth·MBU), attention FLOPs / (its peak·MFU)) + all-reduces + host costs
                 (the GEMMs and attention run one after the other; the host's costs overlap the GPU's work where
                 the stack has an overlap scheduler: `Efficiency.stage_ms`)
                 (MBU = decode_mbu, MFU = decode_mfu · t/(t + t½) at t tokens: `Efficiency.mfu_at`)
                 bytes = weights (the experts the step's tokens touch) + KV of B sequences at context I + O/2
                 FLOPs = B decode rows at that context + B/O prompts of I tokens; the weight GEMMs at the
                 weights' peak, attention (QKᵀ, P·V, MLA's absorbed products) at attention's own precision
                 (`roofline.attention_precision_for`: FP8 with an FP8 KV cache, else BF16, never FP4)
    output tok/s = B / step × replicas;  total tok/s = output × (I + O) / O
With pipeline parallelism the B sequences run as pp microbatches and a step takes pp stage times.
"""
from __future__ import annotations

import math

import numpy as np

from calculators import arch
from calculators.planning.step import pricing_words, step_cost
from calculators.sizing.latency import Efficiency
from calculators.sizing.roofline import gpu_time, step_peaks
from calculators.multi_gpu.tensor_parallel import (Mesh, _link_for,
                                                   _need_link, check_mesh, expert_imbalance_for,
                                                   max_batch_per_replica)
from calculators.units import check_fraction, check_int, default_kv_dtype
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack

GiB = 2 ** 30


def reserved_context(prompt_tokens: int, output_tokens: int, kv_reservation: str) -> int:
    """KV tokens one sequence holds on average: I + O when reserved up front ('full'), I + O/2 when it grows
    ('on_demand': a sequence holds I + t tokens at its t-th step, O/2 on average over its life)."""
    if kv_reservation == "full":
        return prompt_tokens + output_tokens
    return prompt_tokens + math.ceil(output_tokens / 2)


def batch_limits(config: ModelConfig, device: Device, mesh: Mesh, prompt_tokens: int, output_tokens: int,
                 weight_dtype: str, kv_dtype: str, stack: Stack, gpu_memory_utilization: float,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> dict:
    """The three caps on concurrent sequences per replica and which one binds."""
    seqs, tokens = stack.scheduler_limits(device.memory_bytes / GiB, device.name)
    seqs = check_int("max sequences", max_num_seqs, limit=1 << 20) if max_num_seqs is not None else seqs
    tokens = check_int("max batched tokens", max_num_batched_tokens, limit=1 << 24) \
        if max_num_batched_tokens is not None else tokens
    ctx = reserved_context(prompt_tokens, output_tokens, stack.kv_reservation)
    b_mem = max_batch_per_replica(config, device, mesh, ctx, weight_dtype, kv_dtype, limit=1 << 17,
                                  usable_fraction=gpu_memory_utilization,
                                  kv_fraction_of_free=stack.kv_fraction_of_free, moe_dp_comm=stack.moe_dp_comm)
    b_tok = max(1, tokens * output_tokens // (prompt_tokens + output_tokens))
    caps = {"memory (KV cache)": b_mem, "scheduler max sequences": seqs, "scheduler token budget": b_tok}
    binding = min(caps, key=caps.get)
    return dict(batch=caps[binding], binding=binding, caps=caps, reserved_context_tokens=ctx,
                max_num_seqs=seqs, max_num_batched_tokens=tokens)


def step_time(config: ModelConfig, device: Device, mesh: Mesh, batch: int, prompt_tokens: int, output_tokens: int,
              weight_dtype: str, kv_dtype: str, efficiency: Efficiency, link: Link | None, stack: Stack,
              expert_imbalance: float | None = None, profile=None, prompting_rows: float | None = None) -> dict:
    """One steady-state step of `batch` decode rows plus prompting_rows·I/O prompt tokens on the busiest GPU: the
    deployment's step (`step.step_cost`, the one step model) at that mix, each microbatch holding ⌈batch / m⌉
    rows at context I + O/2. `prompting_rows`: the rows whose next prompts are spread over the steps (default
    `batch`, every row's: the step the deployment averages). The steps one user of a fixed number of users sees
    between its tokens carry the OTHER users' prompts only (its own came before its first token): batch − 1."""
    c, I, O = config, prompt_tokens, output_tokens
    m = min(batch, mesh.pp)
    rows = math.ceil(batch / m)
    prompting = rows * m if prompting_rows is None else max(0.0, float(prompting_rows))
    step_tokens = rows + prompting / m * I / O
    cost = step_cost(c, device, mesh, weight_dtype, kv_dtype, efficiency, link, stack, I + O // 2, I,
                     expert_imbalance, profile)
    d = {k: float(np.asarray(v)) for k, v in cost.parts(rows * m, prompting * I / O).items()}
    pk = step_peaks(device, weight_dtype, kv_dtype)
    gpu_roofline = float(gpu_time(d["weights_memory_ms"], d["gemm_compute_ms"], d["kv_memory_ms"],
                                  d["attention_compute_ms"]))
    bound = "compute" if d["compute_ms"] > d["memory_ms"] else "memory bandwidth"
    if d["comm_ms"] > d.get("measured_gpu_ms", gpu_roofline):
        bound = "communication"
    out = dict(step_ms=d["step_ms"], stage_ms=d["step_ms"] / d["passes"], overlap_host=bool(efficiency.overlap_host),
               overhead_ms=efficiency.overhead_ms(rows), bound=bound, precision=pk["precision"],
               attention_precision=pk["attention_precision"], microbatches=m,
               expert_imbalance=expert_imbalance_for(c, mesh, step_tokens, expert_imbalance))
    out.update({k: d[k] for k in ("memory_ms", "compute_ms", "comm_ms", "weights_memory_ms", "kv_memory_ms",
                                  "gemm_compute_ms", "attention_compute_ms", "fixed_ms", "sequences_ms")})
    out.update({k: v for k, v in d.items() if k.startswith(("measured_", "roofline_"))})
    return out


def deployment_defaults(device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str | None, stack: Stack,
                        gpu_memory_utilization: float | None, efficiency: Efficiency | None, link: Link | None,
                        config: ModelConfig | None = None):
    """What a deployment leaves unsaid, filled from the stack: the KV dtype, the memory fraction, the efficiency
    for the device's vendor, the weights' precision and the model's kind (`config`), and the interconnect (a
    multi-GPU layout must have one)."""
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    gmu = check_fraction("gpu_memory_utilization", gpu_memory_utilization if gpu_memory_utilization is not None
                         else stack.gpu_memory_utilization)
    eff = efficiency or Efficiency.for_stack(stack, device, weight_dtype, config)
    lk = _link_for(device, link)
    _need_link(mesh, lk, device)
    return kd, gmu, eff, lk


def max_throughput(config: ModelConfig, device: Device, mesh: Mesh, prompt_tokens: int, output_tokens: int,
                   weight_dtype: str = "bf16", kv_dtype: str | None = None, stack: Stack | str | None = None,
                   gpu_memory_utilization: float | None = None, efficiency: Efficiency | None = None,
                   link: Link | None = None, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None, expert_imbalance: float | None = None,
                   profile=None) -> dict:
    """Output and total tokens/s of `mesh.total_gpus` GPUs with every request queued, as `stack` (vLLM when
    None) would serve it with its default limits; what binds the batch and what binds the step."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    check_mesh(config, mesh)
    I = check_int("prompt tokens", prompt_tokens, limit=1 << 24)
    O = check_int("output tokens", output_tokens, limit=1 << 24)
    if I + O > config.max_position_embeddings:
        raise SpecError(f"prompt + output = {I + O:,} tokens exceeds {config.name}'s context window of "
                        f"{config.max_position_embeddings:,}")
    kd, gmu, eff, lk = deployment_defaults(device, mesh, weight_dtype, kv_dtype, s, gpu_memory_utilization,
                                           efficiency, link, config)
    lim = batch_limits(config, device, mesh, I, O, weight_dtype, kd, s, gmu, max_num_seqs, max_num_batched_tokens)
    if lim["caps"]["memory (KV cache)"] == 0:
        raise SpecError(f"{config.name} in {weight_dtype} does not fit on {mesh.gpus_per_replica} × {device.name} "
                        f"with one sequence of {lim['reserved_context_tokens']:,} tokens at "
                        f"gpu_memory_utilization {gmu:g}: add GPUs (TP/PP) or use narrower weights")
    B = lim["batch"]
    st = step_time(config, device, mesh, B, I, O, weight_dtype, kd, eff, lk, s, expert_imbalance, profile)
    replica = B / st["step_ms"] * 1e3
    out = replica * mesh.replicas
    return dict(output_tok_s=out, total_tok_s=out * (I + O) / O, requests_per_s=out / O,
                output_tok_s_per_gpu=out / mesh.total_gpus, max_batch=B, batch_binding=lim["binding"],
                batch_caps=lim["caps"], step_ms=st["step_ms"], step_bound=st["bound"], memory_ms=st["memory_ms"],
                compute_ms=st["compute_ms"], comm_ms=st["comm_ms"], overhead_ms=st["overhead_ms"],
                **{k: st[k] for k in ("weights_memory_ms", "kv_memory_ms", "gemm_compute_ms", "attention_compute_ms",
                                      "overlap_host", "fixed_ms", "sequences_ms")},
                replicas=mesh.replicas, gpus=mesh.total_gpus, stack=s.name, kv_reservation=s.kv_reservation,
                reserved_context_tokens=lim["reserved_context_tokens"], gpu_memory_utilization=gmu,
                max_num_seqs=lim["max_num_seqs"], max_num_batched_tokens=lim["max_num_batched_tokens"],
                efficiency=dict(decode_mbu=eff.decode_mbu, decode_mfu=eff.decode_mfu,
                                gemm_half_tokens=eff.gemm_half_tokens, step_overhead_ms=eff.step_overhead_ms),
                binds=f"batch: {lim['binding']} ({B:,} sequences); step: {st['bound']}",
                is_moe=arch.is_moe(config), expert_imbalance=st["expert_imbalance"],
                priced_from=pricing_words(profile, weight_dtype),
                **{k: st[k] for k in st if k.startswith(("measured_", "roofline_"))})
