"""This layout, this rate: what TTFT, TPOT and ITL? A deployment under a Poisson request rate, as the steady state
of `calculators.serving.steady_state` on the deployment's own mixed step.

The step is the deployment's (`step.step_cost`: n decode rows and p prompt tokens on the busiest GPU, priced
from the closed form or from kernels measured on that GPU and stack).
With every request queued (n = B, p = B·I/O, context I + O/2) it is exactly `throughput.step_time`, so the
capacity under a rate never exceeds the maximum throughput `throughput` reports for the same deployment.
The scheduler's caps become the steady state's: slots = min(KV memory, max sequences) per replica, and the
prompt budget per step = max batched tokens (vLLM also counts the decode rows in it; left out here, which
overstates the prompt budget by n / max batched tokens). The step says how it grows with the cached context its
decode rows read (`step.ms_per_context_token`, `context_slope`), so the slot wait counts the arrivals' dispersion
as the simulator's step does (`steady_state.context_dispersion`).
With attention data-parallel (experts across the replicas) every rank's step waits for the busiest rank's prompts
(`rank_wait`): requests that arrive at random (a Poisson rate, `serve_at`, `max_rate_under_slo`, a finite run at a
rate) land on one rank at a time; an offline run of fixed lengths keeps its ranks in lockstep and waits for none.
"""
from __future__ import annotations

import math

import numpy as np

from calculators.planning.rank_wait import attention_dp_ranks, local_share, with_rank_wait
from calculators.planning.step import pricing_words, step_cost
from calculators.planning.throughput import batch_limits, deployment_defaults, max_throughput
from calculators.serving.finite_run import finite_run
from calculators.serving.lengths import Lengths
from calculators.serving.steady_state import Load, capacity, check_rate, operating_point
from calculators.sizing.latency import Efficiency
from calculators.multi_gpu.tensor_parallel import (Mesh, _link_for,
                                                   _need_link, check_mesh)
from calculators.units import check_int, default_kv_dtype
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack


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


def random_arrivals_step(step, config: ModelConfig, mesh: Mesh, load: Load):
    """A replica's step under requests that arrive at random: with attention DP, plus the wait for the busiest
    rank (`rank_wait.with_rank_wait`); any other layout's step as it is."""
    ranks = attention_dp_ranks(mesh)
    if ranks == 1:
        return step
    return with_rank_wait(step, ranks, local_share(config, load.prompt.mean_tokens), load.prompt.mean_tokens,
                          load.decode_tokens, load.chunk, load.slots)


def _replica(config: ModelConfig, device: Device, mesh: Mesh, I: Lengths, O: Lengths, weight_dtype: str,
             kv_dtype: str | None, s: Stack, gpu_memory_utilization: float | None, efficiency: Efficiency | None,
             link: Link | None, max_num_seqs: int | None, max_num_batched_tokens: int | None,
             expert_imbalance: float | None, chunked_prefill: bool = True, profile=None, lockstep: bool = False):
    """One replica of the deployment as the steady state sees it: its step cost, its Load (slots = min(KV memory,
    max sequences), the prompt budget per step) and the defaults filled from the stack. `lockstep`: the requests
    start and end on every rank together (an offline run of fixed lengths), so no rank waits for another."""
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
                     expert_imbalance, profile)
    budget = float(lim["max_num_batched_tokens"]) if chunked_prefill else math.inf
    load = Load(I, O, chunk=budget, slots=float(slots))
    if not lockstep:
        step = random_arrivals_step(step, config, mesh, load)
    return step, load, kd, gmu, eff, lk


def finite_run_at(config: ModelConfig, device: Device, mesh: Mesh, rate: float, requests: int, prompt: int,
                  output: int, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                  stack: Stack | str | None = None, efficiency: Efficiency | None = None, profile=None,
                  max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> dict:
    """A finite run of `requests` requests sent at `rate`/s (all replicas; each replica gets its share; math.inf:
    all queued at once, an offline benchmark such as `trtllm-bench throughput`) under the stack's scheduler caps
    (or those given),
    followed step by step on the deployment's step (`calculators.serving.finite_run`): what a benchmark of N
    requests at a QPS reports (throughput = N / makespan, mean ITL, mean TTFT), past capacity included, where the
    steady state does not exist."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    step, load, *_ = _replica(config, device, mesh, I, O, weight_dtype, kv_dtype, s, None, efficiency, None,
                              max_num_seqs, max_num_batched_tokens, None, profile=profile,
                              lockstep=rate == math.inf and I.kind == "fixed" and O.kind == "fixed")
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
             with_capacity: bool = True, profile=None) -> dict:
    """The deployment at `rate` requests/s (all replicas): the operating point per replica, TTFT p50/p99, TPOT,
    ITL p50/p99, throughput, the capacity (requests/s the replicas sustain under a Poisson rate) and, when the
    rate is above it, by how much. `prompt`/`output`: token counts (fixed) or `Lengths`."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    lam = check_rate(rate)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    step, load, kd, gmu, eff, lk = _replica(config, device, mesh, I, O, weight_dtype, kv_dtype, s,
                                            gpu_memory_utilization, efficiency, link, max_num_seqs,
                                            max_num_batched_tokens, expert_imbalance, chunked_prefill, profile)
    i_mean, o_mean = int(math.ceil(I.mean_tokens)), int(math.ceil(O.mean_tokens))
    per_replica = lam / mesh.replicas
    op = operating_point(step, per_replica, load)
    offline = max_throughput(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, gmu, eff, lk,
                             max_num_seqs, max_num_batched_tokens, expert_imbalance, profile)
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
                ttft_p50_ms=val["ttft_p50_ms"], ttft_p99_ms=val["ttft_p99_ms"],
                ttft_mean_ms=None if math.isnan(val["ttft_mean_ms"]) else val["ttft_mean_ms"], tpot_ms=val["tpot_ms"],
                itl_p50_ms=val["itl_p50_ms"], itl_p99_ms=val["itl_p99_ms"],
                slot_wait_p99_ms=val["slot_wait_p99_ms"], prefill_wait_p99_ms=val["prefill_wait_p99_ms"],
                slot_utilisation=val["slot_utilisation"],
                prefill_budget_utilisation=val["prefill_budget_utilisation"],
                output_tok_s=lam * O.mean_tokens if stable else math.inf,
                output_tok_s_per_gpu=lam * O.mean_tokens / mesh.total_gpus if stable else math.inf,
                rank_wait_ms=float(step.rank_wait(val["decode_rows"])) if hasattr(step, "rank_wait") else 0.0,
                slots_per_replica=int(load.slots), prefill_budget_tokens=load.chunk, replicas=mesh.replicas,
                gpus=mesh.total_gpus, stack=s.name, prompt=I.describe(), output=O.describe(),
                max_throughput_requests_per_s=offline["requests_per_s"],
                efficiency=dict(decode_mbu=eff.decode_mbu, decode_mfu=eff.decode_mfu,
                                gemm_half_tokens=eff.gemm_half_tokens, step_overhead_ms=eff.step_overhead_ms),
                priced_from=pricing_words(profile, weight_dtype))


def max_rate_under_slo(config: ModelConfig, device: Device, mesh: Mesh, prompt, output, weight_dtype: str,
                       kv_dtype: str | None, stack: Stack | str | None, efficiency: Efficiency | None = None,
                       ttft_p99_ms: float = math.inf, tpot_ms: float = math.inf, points: int = 48,
                       profile=None, max_num_seqs: int | None = None,
                       max_num_batched_tokens: int | None = None) -> float:
    """The highest request rate (all replicas) whose steady state meets TTFT p99 ≤ `ttft_p99_ms` and TPOT ≤
    `tpot_ms` (MLPerf Server's question): the operating point on a grid of rates up to the maximum throughput,
    then a finer grid between the last rate that meets them and the first that does not, and never above the
    maximum throughput (as `serve_at`'s capacity). The scheduler caps are the stack's defaults, or those given (per
    replica)."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    eff = efficiency or Efficiency.for_stack(s, device, weight_dtype, config)
    lk = _link_for(device, None)
    _need_link(mesh, lk, device)
    i_mean, o_mean = int(math.ceil(I.mean_tokens)), int(math.ceil(O.mean_tokens))
    lim = batch_limits(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, s.gpu_memory_utilization,
                       max_num_seqs, max_num_batched_tokens)
    slots = min(lim["caps"]["memory (KV cache)"], lim["max_num_seqs"])
    if slots == 0:
        return 0.0
    step = step_cost(config, device, mesh, weight_dtype, kd, eff, lk, s, decode_context(I, O), I.mean_tokens,
                     profile=profile)
    load = Load(I, O, chunk=float(lim["max_num_batched_tokens"]), slots=float(slots))
    step = random_arrivals_step(step, config, mesh, load)
    top = max_throughput(config, device, mesh, i_mean, o_mean, weight_dtype, kd, s, efficiency=eff,
                         link=lk, profile=profile, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens)["requests_per_s"] / mesh.replicas

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
    return min(lo, top) * mesh.replicas
