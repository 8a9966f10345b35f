"""This layout, this rate: what TTFT, TPOT and ITL? A deployment under a Poisson request rate, as the steady state
of `calculators.serving.steady_state` on the deployment's own mixed step.

The step cost is `throughput.step_time`'s, opened up to any mix: a step on the busiest GPU carries n decode rows
(each at the time-weighted mean context of a decoding sequence) and p prompt tokens, in min(n, pp) microbatches:
    GEMMs      max(weights read for n + p tokens (the experts they touch) / (bandwidth · MBU),
                   their FLOPs (n decode rows + p prompt tokens) / tp / (peak · MFU at the weights' precision)
                   + the busiest EP rank's extra expert FLOPs)
    attention  max(KV of the n rows / (bandwidth · MBU), its FLOPs / tp / (peak · MFU at attention's precision))
    step       max(m, pp) · (GEMMs + attention + collectives(n + p tokens), then the step and per-sequence host
               costs added, or overlapped where the stack has an overlap scheduler: `Efficiency.stage_ms`)
With every request queued (n = B, p = B·I/O, context I + O/2) it is exactly `throughput.step_time`, so the
capacity under a rate never exceeds the maximum throughput `throughput` reports for the same deployment.
The scheduler's caps become the steady state's: slots = min(KV memory, max sequences) per replica, and the
prompt budget per step = max batched tokens (vLLM also counts the decode rows in it; left out here, which
overstates the prompt budget by n / max batched tokens). The step says how it grows with the cached context its
decode rows read (`step.ms_per_context_token`, `context_slope`), so the slot wait counts the arrivals' dispersion
as the simulator's step does (`steady_state.context_dispersion`).
"""
from __future__ import annotations

import math

import numpy as np

from calculators import arch
from calculators.planning.throughput import batch_limits, deployment_defaults, max_throughput
from calculators.serving.finite_run import finite_run
from calculators.serving.lengths import Lengths
from calculators.serving.steady_state import Load, capacity, check_rate, operating_point
from calculators.sizing.latency import Efficiency, gemm_mfu, stage_with_host, step_weight_bytes
from calculators.sizing.roofline import forward_flops_split, gpu_time, step_peaks
from calculators.multi_gpu.tensor_parallel import (Mesh, _comm_per_stage_ms, _expert_flops_extra, _link_for,
                                                   _need_link, check_mesh, expert_imbalance_for, per_gpu_kv_bytes,
                                                   per_gpu_weight_bytes, stage_layers)
from calculators.units import check_int, default_kv_dtype
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack

TOKEN_GRID = np.unique(np.round(np.geomspace(1, 1 << 20, 97))).astype(float)   # tokens per step: 1 .. 1M
LOG_GRID = np.log(TOKEN_GRID)


def lengths_of(x, what: str) -> Lengths:
    """A `Lengths` from a Lengths or a whole number (fixed)."""
    if isinstance(x, Lengths):
        return x.check()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not float(x).is_integer() or x < 1:
        raise SpecError(f"{what} must be a whole number of tokens ≥ 1 or a length distribution, got {x!r}")
    return Lengths.fixed(int(x))


def decode_context(prompt: Lengths, output: Lengths) -> float:
    """Time-weighted mean context of a decoding sequence: E[(O−1)(I + (O−2)/2)] / E[O−1] + 1 (prompts and outputs
    independent; a long output is decoding for longer, so it weighs more)."""
    d = max(output.mean_tokens - 1, 1e-9)
    return prompt.mean_tokens + output.moment(lambda x: (x - 1) * (x - 2) / 2) / d + 1


def step_tables(config: ModelConfig, mesh: Mesh, link: Link | None, stack: Stack, weight_dtype: str = "bf16",
                expert_imbalance: float | None = None, ratio: np.ndarray | None = None) -> dict:
    """The token-dependent parts of the deployment's step on TOKEN_GRID (tokens per microbatch), computed by the
    scalar calculators: `ratio` the share of the resident weights the tokens touch (the experts they reach),
    `extra` the busiest EP rank's expert FLOPs beyond the mean, `comm` the stage's collectives in ms. They do not
    depend on the KV precision, and `ratio` not on the weights' (a ratio of bytes) nor on the layout: pass it to
    reuse it for another layout."""
    c, g = config, TOKEN_GRID
    share = stage_layers(c, mesh.pp) / c.num_layers
    moe = arch.is_moe(c)
    if ratio is None:
        full = step_weight_bytes(c, weight_dtype, rows=1 << 30)
        ratio = np.array([step_weight_bytes(c, weight_dtype, rows=int(t)) / full for t in g]) if moe else \
            np.ones_like(g)
    imb = [expert_imbalance_for(c, mesh, t, expert_imbalance) for t in g]
    extra = np.array([_expert_flops_extra(c, mesh, t, i) * share for t, i in zip(g, imb)])
    comm = np.array([_comm_per_stage_ms(c, mesh, int(math.ceil(t)), link, stack, i) for t, i in zip(g, imb)])
    return dict(ratio=ratio, extra=extra, comm=comm)


def step_terms(config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
               efficiency: Efficiency, decode_ctx: float, prompt_len: float) -> dict:
    """The token-independent numbers of the deployment's step on its busiest GPU: resident weights, KV bytes and
    FLOPs of one decode row (weight GEMMs and attention apart, `roofline.forward_flops_split`), FLOPs per prompt
    token, the bandwidth and the two peaks they run at (`roofline.step_peaks`), its fixed costs and whether the
    stack overlaps them with the GPU's work. `kv_token` and `attention_token`: what one more cached position adds
    to a decode row's KV read and attention FLOPs, kv_row(ctx + 1) − kv_row(ctx) (sliding layers past their
    window and a linear layer's state add nothing; MLA's absorbed products do not grow with the context)."""
    c = config
    share = stage_layers(c, mesh.pp) / c.num_layers
    ctx = max(1, int(round(decode_ctx)))
    P = max(1, int(round(prompt_len)))
    fr, fp = forward_flops_split(c, 1, ctx, 1), forward_flops_split(c, P, P, 1)
    kv_row = per_gpu_kv_bytes(c, mesh, ctx, 1, kv_dtype)
    pk = step_peaks(device, weight_dtype, kv_dtype)
    return dict(weights=per_gpu_weight_bytes(c, mesh, weight_dtype), kv_row=kv_row,
                kv_token=per_gpu_kv_bytes(c, mesh, ctx + 1, 1, kv_dtype) - kv_row,
                flops_row=fr["weights"] / mesh.tp * share, flops_prompt_token=fp["weights"] / P / mesh.tp * share,
                attention_row=fr["attention"] / mesh.tp * share,
                attention_token=(forward_flops_split(c, 1, ctx + 1, 1)["attention"] - fr["attention"]) / mesh.tp
                * share,
                attention_prompt_token=fp["attention"] / P / mesh.tp * share,
                peak=pk["weights"], peak_attention=pk["attention"],
                bandwidth=device.memory_bandwidth_bytes_per_s * efficiency.decode_mbu,
                decode_mfu=efficiency.decode_mfu, gemm_half_tokens=efficiency.gemm_half_tokens,
                step_overhead_ms=efficiency.step_overhead_ms, sequence_overhead_ms=efficiency.sequence_overhead_us / 1e3,
                overlap_host=float(bool(efficiency.overlap_host)),
                pp=float(mesh.pp), ep_per_tp=max(1.0, mesh.ep / mesh.tp))


def on_grid(table: np.ndarray, tokens) -> np.ndarray:
    """A TOKEN_GRID table read at `tokens`, linear in log tokens (np.interp). `table` is [G], or [K, G] with one
    row per candidate: then the last axis of `tokens` runs over the K candidates."""
    table = np.asarray(table, dtype=float)
    lt = np.log(np.maximum(tokens, 1.0))
    if table.ndim == 1:
        return np.interp(lt, LOG_GRID, table)
    pos = np.interp(lt, LOG_GRID, np.arange(len(LOG_GRID), dtype=float))
    i0 = np.minimum(pos.astype(int), len(LOG_GRID) - 2)
    f = pos - i0
    k = np.broadcast_to(np.arange(table.shape[0]), pos.shape) if table.shape[0] > 1 else 0
    return table[k, i0] * (1 - f) + table[k, i0 + 1] * f


def mixed_step(terms: dict, tables: dict):
    """The step(n decode rows, p prompt tokens) -> ms of the module docstring, from `step_terms` and
    `step_tables`. Every term may be an array over K candidates (the tables then [K, G]): n and p broadcast
    against them, the last axis running over the candidates. `step.parts(n, p)` gives every term (bytes,
    FLOPs, memory/compute/collective/fixed ms, passes, the step) of one microbatch's stage;
    `step.ms_per_context_token(n, p)` the step's growth per cached position its decode rows read
    (`context_slope`: the slot wait's dispersion in `steady_state.context_dispersion`)."""
    t, tb = terms, tables

    def parts(n, p) -> dict:
        """The step's terms at (n, p), on the busiest GPU per microbatch: the weight GEMMs (weights read, their
        FLOPs) and attention (the rows' KV read, its FLOPs) each on its own roofline, one after the other
        (`roofline.gpu_time`), the collectives, the host's fixed work (added, or overlapped where the stack
        does: `Efficiency.stage_ms`), the microbatch passes, and the step."""
        n, p = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(p, dtype=float))
        m = np.minimum(np.maximum(n, 1.0), t["pp"])
        rows, tok = n / m, (n + p) / m
        mfu = gemm_mfu(t["decode_mfu"], t["gemm_half_tokens"], tok)
        weight_bytes = t["weights"] * on_grid(tb["ratio"], tok * t["ep_per_tp"])
        kv_bytes = t["kv_row"] * rows
        gemm_flops = t["flops_row"] * rows + t["flops_prompt_token"] * p / m + on_grid(tb["extra"], tok)
        attention_flops = t["attention_row"] * rows + t["attention_prompt_token"] * p / m
        mem_w, mem_kv = weight_bytes / t["bandwidth"] * 1e3, kv_bytes / t["bandwidth"] * 1e3
        comp_w = gemm_flops / (t["peak"] * mfu) * 1e3
        comp_a = attention_flops / (t["peak_attention"] * mfu) * 1e3
        comm = on_grid(tb["comm"], tok)
        fixed, per_seq = t["step_overhead_ms"], rows * t["sequence_overhead_ms"]
        gpu = gpu_time(mem_w, comp_w, mem_kv, comp_a) + comm
        stage = stage_with_host(gpu, fixed, per_seq, np.asarray(t["overlap_host"]) > 0)
        passes = np.maximum(m, t["pp"])
        return dict(weight_bytes=weight_bytes, kv_bytes=kv_bytes, bandwidth=t["bandwidth"], gemm_flops=gemm_flops,
                    attention_flops=attention_flops, gemm_flop_s=t["peak"] * mfu,
                    attention_flop_s=t["peak_attention"] * mfu, weights_memory_ms=mem_w, kv_memory_ms=mem_kv,
                    gemm_compute_ms=comp_w, attention_compute_ms=comp_a,
                    memory_ms=mem_w + mem_kv, compute_ms=comp_w + comp_a, comm_ms=comm,
                    fixed_ms=fixed * np.ones_like(rows),
                    sequences_ms=per_seq, gpu_ms=gpu, overlap_host=np.asarray(t["overlap_host"]) > 0, microbatches=m,
                    passes=passes, step_ms=passes * stage)

    def step(n, p):
        return parts(n, p)["step_ms"]

    def ms_per_context_token(n, p):
        """∂step/∂(cached positions the n decode rows read), `context_slope` on this step's terms: one more
        position costs `kv_token` bytes at the bandwidth or `attention_token` FLOPs at attention's FLOP/s."""
        d = parts(n, p)
        return context_slope(d["passes"], d["microbatches"], d["kv_memory_ms"] >= d["attention_compute_ms"],
                             t["kv_token"] / t["bandwidth"] * 1e3, t["attention_token"] / d["attention_flop_s"] * 1e3,
                             d["overlap_host"] & (d["sequences_ms"] > d["gpu_ms"] + d["fixed_ms"]))
    step.parts = parts
    step.ms_per_context_token = ms_per_context_token
    return step


def context_slope(passes, microbatches, kv_binds, kv_ms_per_position, attention_ms_per_position, hidden):
    """β = ∂step/∂A in ms per cached position, A the positions the n decode rows read in all (the step's
    `ms_per_context_token`, which `steady_state.context_dispersion` uses): each of the m microbatches holds A/m
    of them and the step runs `passes` of its stage, so
        β = passes/m · (KV bytes per position / bandwidth          where the KV read binds attention's roofline,
                        attention FLOPs per position / its FLOP/s   where its FLOPs do)
    and 0 where the host's per-sequence work overlaps the GPU's and is the longer (`hidden`:
    `latency.stage_with_host`)."""
    per = np.where(kv_binds, kv_ms_per_position, attention_ms_per_position)
    return np.where(hidden, 0.0, passes / microbatches * per)


def step_cost(config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
              efficiency: Efficiency, link: Link | None, stack: Stack, decode_ctx: float, prompt_len: float,
              expert_imbalance: float | None = None):
    """The deployment's mixed step, step(n decode rows, p prompt tokens) -> ms, vectorised (see the module
    docstring). The token-dependent parts (experts touched, collectives, expert imbalance) are computed by the
    scalar calculators on a log grid of tokens per microbatch and interpolated."""
    return mixed_step(step_terms(config, device, mesh, weight_dtype, kv_dtype, efficiency, decode_ctx, prompt_len),
                      step_tables(config, mesh, link, stack, weight_dtype, expert_imbalance))


def _replica(config: ModelConfig, device: Device, mesh: Mesh, I: Lengths, O: Lengths, weight_dtype: str,
             kv_dtype: str | None, s: Stack, gpu_memory_utilization: float | None, efficiency: Efficiency | None,
             link: Link | None, max_num_seqs: int | None, max_num_batched_tokens: int | None,
             expert_imbalance: float | None, chunked_prefill: bool = True):
    """One replica of the deployment as the steady state sees it: its step cost, its Load (slots = min(KV memory,
    max sequences), the prompt budget per step) and the defaults filled from the stack."""
    check_mesh(config, mesh)
    kd, gmu, eff, lk = deployment_defaults(device, mesh, weight_dtype, kv_dtype, s, gpu_memory_utilization,
                                           efficiency, link, config)
    i_mean, o_mean = int(math.ceil(I.mean_tokens)), int(math.ceil(O.mean_tokens))
    top_i, top_o = int(max(I.quantile(0.99), i_mean)), int(max(O.quantile(0.99), o_mean))
    top = top_i + top_o
    if top > config.max_position_embeddings:
        raise SpecError(f"a p99 request ({top_i:,} prompt + {top_o:,} output ≈ {top:,} tokens, the 99th percentiles "
                        f"of the length distributions) exceeds {config.name}'s context window of "
                        f"{config.max_position_embeddings:,}: lower the p99 prompt or output")
    lim = batch_limits(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, gmu, max_num_seqs,
                       max_num_batched_tokens)
    slots = min(lim["caps"]["memory (KV cache)"], lim["max_num_seqs"])
    if slots == 0:
        raise SpecError(f"{config.name} in {weight_dtype} does not fit on {mesh.gpus_per_replica} × {device.name} "
                        f"with one sequence of {lim['reserved_context_tokens']:,} tokens: add GPUs or use narrower "
                        "weights")
    step = step_cost(config, device, mesh, weight_dtype, kd, eff, lk, s, decode_context(I, O), I.mean_tokens,
                     expert_imbalance)
    budget = float(lim["max_num_batched_tokens"]) if chunked_prefill else math.inf
    return step, Load(I, O, chunk=budget, slots=float(slots)), kd, gmu, eff, lk


def finite_run_at(config: ModelConfig, device: Device, mesh: Mesh, rate: float, requests: int, prompt: int,
                  output: int, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                  stack: Stack | str | None = None, efficiency: Efficiency | None = None) -> dict:
    """A finite run of `requests` requests sent at `rate`/s (all replicas; each replica gets its share; math.inf:
    all queued at once, an offline benchmark such as `trtllm-bench throughput`),
    followed step by step on the deployment's step (`calculators.serving.finite_run`): what a benchmark of N
    requests at a QPS reports (throughput = N / makespan, mean ITL, mean TTFT), past capacity included, where the
    steady state does not exist."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    step, load, *_ = _replica(config, device, mesh, I, O, weight_dtype, kv_dtype, s, None, efficiency, None, None,
                              None, None)
    per = max(1, math.ceil(check_int("requests", requests, limit=1 << 24) / mesh.replicas))
    lam = math.inf if rate == math.inf else check_rate(rate) / mesh.replicas
    r = finite_run(step, lam, per, I.mean_tokens, int(round(O.mean_tokens)),
                   slots=load.slots, chunk=load.chunk)
    r["achieved_rps"] *= mesh.replicas
    return r


def serve_at(config: ModelConfig, device: Device, mesh: Mesh, rate: float, prompt, output,
             weight_dtype: str = "bf16", kv_dtype: str | None = None, stack: Stack | str | None = None,
             gpu_memory_utilization: float | None = None, efficiency: Efficiency | None = None,
             link: Link | None = None, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
             expert_imbalance: float | None = None, chunked_prefill: bool = True,
             with_capacity: bool = True) -> dict:
    """The deployment at `rate` requests/s (all replicas): the operating point per replica, TTFT p50/p99, TPOT,
    ITL p50/p99, throughput, the capacity (requests/s the replicas sustain under a Poisson rate) and, when the
    rate is above it, by how much. `prompt`/`output`: token counts (fixed) or `Lengths`."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    lam = check_rate(rate)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    step, load, kd, gmu, eff, lk = _replica(config, device, mesh, I, O, weight_dtype, kv_dtype, s,
                                            gpu_memory_utilization, efficiency, link, max_num_seqs,
                                            max_num_batched_tokens, expert_imbalance, chunked_prefill)
    i_mean, o_mean = int(math.ceil(I.mean_tokens)), int(math.ceil(O.mean_tokens))
    per_replica = lam / mesh.replicas
    op = operating_point(step, per_replica, load)
    offline = max_throughput(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, gmu, eff, lk,
                             max_num_seqs, max_num_batched_tokens, expert_imbalance)
    cap = min(float(capacity(step, load)) * mesh.replicas, offline["requests_per_s"]) if with_capacity else \
        offline["requests_per_s"]
    val = {k: float(v) for k, v in op.items()}
    stable = bool(op["stable"]) and (lam <= cap or not with_capacity)
    verdict = (f"serves {lam:g} requests/s ({lam / cap:.0%} of its capacity of {cap:.3g} requests/s)" if stable else
               f"this layout serves at most {cap:.3g} requests/s: {lam:g} is {lam / cap:.2f}× that, and the queue "
               "grows without bound")
    return dict(rate_requests_per_s=lam, capacity_requests_per_s=cap, stable=stable,
                utilisation=lam / cap if cap > 0 else math.inf, verdict=verdict,
                in_flight_per_replica=val["in_flight"], decode_rows_per_step=val["decode_rows"],
                prompt_tokens_per_step=val["prompt_tokens_per_step"], step_ms=val["step_ms"],
                ttft_p50_ms=val["ttft_p50_ms"], ttft_p99_ms=val["ttft_p99_ms"], tpot_ms=val["tpot_ms"],
                itl_p50_ms=val["itl_p50_ms"], itl_p99_ms=val["itl_p99_ms"],
                slot_wait_p99_ms=val["slot_wait_p99_ms"], prefill_wait_p99_ms=val["prefill_wait_p99_ms"],
                slot_utilisation=val["slot_utilisation"],
                prefill_budget_utilisation=val["prefill_budget_utilisation"],
                output_tok_s=lam * O.mean_tokens if stable else math.inf,
                output_tok_s_per_gpu=lam * O.mean_tokens / mesh.total_gpus if stable else math.inf,
                slots_per_replica=int(load.slots), prefill_budget_tokens=load.chunk, replicas=mesh.replicas,
                gpus=mesh.total_gpus, stack=s.name, prompt=I.describe(), output=O.describe(),
                max_throughput_requests_per_s=offline["requests_per_s"],
                efficiency=dict(decode_mbu=eff.decode_mbu, decode_mfu=eff.decode_mfu,
                                gemm_half_tokens=eff.gemm_half_tokens, step_overhead_ms=eff.step_overhead_ms))


def max_rate_under_slo(config: ModelConfig, device: Device, mesh: Mesh, prompt, output, weight_dtype: str,
                       kv_dtype: str | None, stack: Stack | str | None, efficiency: Efficiency | None = None,
                       ttft_p99_ms: float = math.inf, tpot_ms: float = math.inf, points: int = 48) -> float:
    """The highest request rate (all replicas) whose steady state meets TTFT p99 ≤ `ttft_p99_ms` and TPOT ≤
    `tpot_ms` (MLPerf Server's question): the operating point on a grid of rates up to the maximum throughput,
    then a finer grid between the last rate that meets them and the first that does not."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    eff = efficiency or Efficiency.for_stack(s, device, weight_dtype, config)
    lk = _link_for(device, None)
    _need_link(mesh, lk, device)
    i_mean, o_mean = int(math.ceil(I.mean_tokens)), int(math.ceil(O.mean_tokens))
    lim = batch_limits(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, s.gpu_memory_utilization)
    slots = min(lim["caps"]["memory (KV cache)"], lim["max_num_seqs"])
    if slots == 0:
        return 0.0
    step = step_cost(config, device, mesh, weight_dtype, kd, eff, lk, s, decode_context(I, O), I.mean_tokens)
    load = Load(I, O, chunk=float(lim["max_num_batched_tokens"]), slots=float(slots))
    top = max_throughput(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, efficiency=eff,
                         link=lk)["requests_per_s"] / mesh.replicas

    def meets(rates):
        op = operating_point(step, rates, load)
        return op["stable"] & (op["ttft_p99_ms"] <= ttft_p99_ms) & (op["tpot_ms"] <= tpot_ms)
    lo, hi = 0.0, top * 1.02
    for _ in range(2):
        grid = np.linspace(lo, hi, points + 1)[1:]
        ok = meets(grid)
        if not ok.any():
            hi = grid[0]
            continue
        last = int(np.flatnonzero(ok)[-1])
        lo, hi = grid[last], (grid[last + 1] if last + 1 < len(grid) else hi)
    return lo * mesh.replicas
