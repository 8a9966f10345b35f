"""The chosen plan's numbers, opened up for a reader: the memory one GPU holds, what the deployment costs, the
formulas of its loaded step with this plan's numbers filled in, and those of the maximum throughput. Every number
comes from the planner's row (`planner.plan_rows`), `serve_at` (the same layout at the same rate) or
`throughput.max_throughput`; nothing here re-derives a model.

    λ per replica   = rate / replicas
    n               = λ·E[O − 1]·τ                    decode rows per step (τ: the planner's mean step at the load)
    p               = λ·E[I]·τ                        prompt tokens per step (the new tokens after prefix hits)
    step(n, p)      = passes × (max(weights, GEMMs) + max(KV, attention) + collectives + fixed)
                      (the fixed host work overlapped, max(…, fixed), where the stack overlaps it)
                      memory terms = bytes / (bandwidth·MBU), compute terms = FLOPs / (peak·MFU at the step's
                      tokens), the GEMMs at the weights' precision, attention at its own
    rank wait       = s · E[step(n, T(⌈K/d⌉)) − step(n, T(own))]   attention DP only: the busiest of d ranks' prompts
    ITL at the load = τ, the fixed point τ = E[step(n, p_k) + rank wait] over steps with and without a prompt
    TTFT p99        = slot wait p99 + prefill-budget wait p99 + own prefill p99
    $ per 1M tokens = GPUs × price / (rate × (E[I] + E[O]) × 3,600) × 10⁶, split into input and output by the
                      GPU time each takes (prefill vs decode share)
"""
from __future__ import annotations

from calculators.explain import Explained, explain
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.rank_wait import local_share
from calculators.planning.serve_at import decode_context, lengths_of
from calculators.planning.step import step_cost
from calculators.planning.throughput import batch_limits, deployment_defaults
from specs.devices import Device
from specs.model_config import ModelConfig
from specs.stacks import Stack, load_stack

SOURCE = "calculators.planning.planner and calculators.serving.steady_state"


def plan_mesh(row: dict) -> Mesh:
    """The plan row's layout (a `dp` column, when present, is the data-parallel size inside a replica's EP group)."""
    return Mesh(tp=int(row["tp"]), pp=int(row["pp"]), ep=int(row.get("ep", 1)), gpus=int(row["gpus"]))


def max_batched_tokens(config: ModelConfig, device: Device, row: dict, wl, stack: Stack | str | None) -> int:
    """The prompt-token budget per step the plan assumed: the row's own when it carries one, else the stack's
    default for this GPU (`Stack.scheduler_limits`, what `serve_at` and the launch command use)."""
    if row.get("max_batched_tokens"):
        return int(row["max_batched_tokens"])
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    lim = batch_limits(config, device, plan_mesh(row), wl.prompt_tokens, wl.output_tokens, row["weight_dtype"],
                       row["kv_dtype"], s, s.gpu_memory_utilization, max_num_seqs=int(row["batch_cap"]))
    return int(lim["max_num_batched_tokens"])


def memory_and_cost(row: dict, price_usd_per_hour: float | None) -> dict:
    """One GPU's memory as the planner sized it (weights, KV cache at the batch cap, the rest: activations, CUDA
    context and graphs, communication buffers) against the usable memory, and the deployment's price."""
    w, kv, need = row["per_gpu_weight_bytes"], row["per_gpu_kv_bytes"], row["per_gpu_needed_bytes"]
    return dict(weights_bytes=w, kv_bytes=kv, other_bytes=need - w - kv, needed_bytes=need,
                usable_bytes=row["usable_bytes"], free_bytes=row["usable_bytes"] - need,
                usd_per_hour=None if price_usd_per_hour is None else row["gpus"] * price_usd_per_hour,
                usd_per_million_tokens=row["usd_per_million_tokens"],
                usd_per_million_input_tokens=row["usd_per_million_input_tokens"],
                usd_per_million_output_tokens=row["usd_per_million_output_tokens"])


def step_terms(config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str | None,
               stack: Stack | str | None, prompt, output, n: float, p: float) -> dict:
    """The deployment's mixed step at n decode rows and p prompt tokens (`step.step_cost`), term by term,
    with the efficiencies it ran at."""
    s = stack if isinstance(stack, Stack) else load_stack(stack)
    I, O = lengths_of(prompt, "prompt tokens"), lengths_of(output, "output tokens")
    kd, _, eff, lk = deployment_defaults(device, mesh, weight_dtype, kv_dtype, s, None, None, None, config)
    step = step_cost(config, device, mesh, weight_dtype, kd, eff, lk, s, decode_context(I, O), I.mean_tokens)
    out = {k: float(v) for k, v in step.parts(n, p).items()}
    out.update(mbu=eff.decode_mbu, step_overhead_ms=eff.step_overhead_ms)
    return out


def plan_formulas(config: ModelConfig, device: Device, row: dict, wl, stack: Stack | str | None,
                  served: dict) -> list[Explained]:
    """The chosen plan's formulas with its numbers: λ per replica, n, p, the step's memory and compute terms,
    step(n, p), ITL at the load, TTFT p99 (from `served`, `serve_at`'s result for the same layout and rate) and
    the cost. Values: the planner's row, except TTFT's parts (serve_at)."""
    mesh = plan_mesh(row)
    lam_all, reps = wl.requests_per_s, int(row["replicas"])
    prompt_new = wl.prompt_lengths(new_only=True).mean_tokens
    decode_tokens = max(wl.output_lengths().mean_tokens - 1, 0.0)
    tau = row["step_ms_at_load"]
    lam = explain("lambda_per_replica", "rate / replicas", "req/s", SOURCE, "each replica's share of the rate",
                  rate=lam_all, replicas=reps)
    n = explain("decode_rows", "lam * E_O_minus_1 * tau / 1000", "rows", SOURCE,
                "decode rows per step (Little's law)", lam=lam.value, E_O_minus_1=decode_tokens, tau=tau)
    p = explain("prompt_tokens_per_step", "lam * E_I * tau / 1000", "tokens", SOURCE,
                "prompt tokens per step", lam=lam.value, E_I=prompt_new, tau=tau)
    t = step_terms(config, device, mesh, row["weight_dtype"], row["kv_dtype"], stack, wl.prompt_lengths(),
                   wl.output_lengths(), n.value, p.value)
    src = "step.step_cost"
    bw = device.memory_bandwidth_bytes_per_s
    mem_w = explain("weights_memory_ms", "weight_bytes / (bandwidth * mbu) * 1000", "ms", src,
                    "the weights (the experts the tokens touch) read once, busiest GPU",
                    weight_bytes=t["weight_bytes"], bandwidth=bw, mbu=t["mbu"])
    gemm = explain("gemm_compute_ms", "gemm_flops / flop_s * 1000", "ms", src,
                   "the weight GEMMs of the n rows and the p prompt tokens, at the weights' precision and the MFU "
                   "for that many tokens", gemm_flops=t["gemm_flops"], flop_s=t["gemm_flop_s"])
    mem_kv = explain("kv_memory_ms", "kv_bytes / (bandwidth * mbu) * 1000", "ms", src,
                     "the KV cache of the n rows read once", kv_bytes=t["kv_bytes"], bandwidth=bw, mbu=t["mbu"])
    attn = explain("attention_compute_ms", "attention_flops / flop_s * 1000", "ms", src,
                   "attention's products at attention's own precision (never FP4)",
                   attention_flops=t["attention_flops"], flop_s=t["attention_flop_s"])
    terms = dict(passes=t["passes"], weights=mem_w.value, gemm=gemm.value, kv=mem_kv.value, attention=attn.value,
                 collectives=t["comm_ms"], fixed=t["fixed_ms"], sequences=t["sequences_ms"])
    if t["overlap_host"]:
        step = explain("step_ms", "passes * max(max(weights, gemm) + max(kv, attention) + collectives + fixed, "
                       "sequences)", "ms", src, "one step at the mean load: GEMMs, then attention, each on its own "
                       "roofline, and the step's fixed GPU cost; the host's per-sequence work overlaps them (the "
                       "stack's overlap scheduler)", **terms)
    else:
        step = explain("step_ms", "passes * (max(weights, gemm) + max(kv, attention) + collectives + fixed + "
                       "sequences)", "ms", src, "one step at the mean load: GEMMs, then attention, each on its own "
                       "roofline, the step's fixed cost, then the host's per-sequence work", **terms)
    waits = []
    if int(row.get("dp", 1)) > 1 and row.get("rank_wait_ms"):   # attention DP: the busiest rank sets the step
        share = local_share(config, prompt_new)
        waits = [explain("rank_wait_ms", "share * busiest_minus_own_ms", "ms", "calculators.planning.rank_wait",
                         f"each step waits for the busiest of the {int(row['dp'])} attention ranks: its new prompts "
                         "(⌈K/d⌉ of K ~ Poisson(d·n/E[O−1]) dealt round-robin) against a rank's own, the step's "
                         "cost of the difference, times the share of a prompt's FLOPs that is not routed experts; "
                         "included in τ", share=share, busiest_minus_own_ms=row["rank_wait_ms"] / share)]
    itl = explain("itl_at_load_ms", "tau", "ms", SOURCE, "the mean token gap: the fixed point τ = mean step over "
                  "steps with and without a prompt (a step that carries a prompt is slower than step(n, p))",
                  tau=row["itl_at_load_ms"])
    own = served["ttft_p99_ms"] - served["slot_wait_p99_ms"] - served["prefill_wait_p99_ms"]
    ttft = explain("ttft_p99_ms", "slot_wait + budget_wait + own_prefill", "ms", SOURCE,
                   "each part at its p99, added (serve_at on this layout)", slot_wait=served["slot_wait_p99_ms"],
                   budget_wait=served["prefill_wait_p99_ms"], own_prefill=own)
    cost = explain("usd_per_million_tokens", "gpus * price / (rate * (E_I + E_O) * 3600) * 1000000", "$",
                   "prices: specs/devices.json or as edited", "every GPU is paid, busy or not",
                   gpus=row["gpus"], price=device.price_usd_per_hour or 0.0, rate=lam_all, E_I=wl.prompt_tokens,
                   E_O=wl.output_tokens)
    pre_share = explain("prefill_share", "prefill / (prefill + E_O * itl / in_flight)", "", SOURCE,
                        "the GPU time a request's prefill takes, against its decode's share of the steps",
                        prefill=row["prefill_ms"], E_O=wl.output_tokens, itl=row["itl_at_load_ms"],
                        in_flight=max(row["concurrency_per_replica"], 1.0))
    usd_in = explain("usd_per_million_input_tokens", "blend * (E_I + E_O) * share / E_I", "$", SOURCE,
                     blend=cost.value, E_I=wl.prompt_tokens, E_O=wl.output_tokens, share=pre_share.value)
    usd_out = explain("usd_per_million_output_tokens", "blend * (E_I + E_O) * (1 - share) / E_O", "$", SOURCE,
                      blend=cost.value, E_I=wl.prompt_tokens, E_O=wl.output_tokens, share=pre_share.value)
    return [lam, n, p, mem_w, gemm, mem_kv, attn, step, *waits, itl, ttft, cost, pre_share, usd_in, usd_out]


def throughput_formulas(result: dict, mesh: Mesh, prompt_tokens: int, output_tokens: int) -> list[Explained]:
    """`max_throughput`'s result as formulas with its numbers: the step of B sequences and the tokens/s."""
    src = "calculators.planning.throughput"
    terms = dict(pp=mesh.pp, weights=result["weights_memory_ms"], gemm=result["gemm_compute_ms"],
                 kv=result["kv_memory_ms"], attention=result["attention_compute_ms"], collectives=result["comm_ms"],
                 fixed=result["fixed_ms"], sequences=result["sequences_ms"])
    if result.get("overlap_host"):
        step = explain("step_ms", "pp * max(max(weights, gemm) + max(kv, attention) + collectives + fixed, "
                       "sequences)", "ms", src, "B decode rows + B/O prompts of I tokens per step; the host's "
                       "per-sequence work overlapped", **terms)
    else:
        step = explain("step_ms", "pp * (max(weights, gemm) + max(kv, attention) + collectives + fixed + sequences)",
                       "ms", src, "B decode rows + B/O prompts of I tokens per step", **terms)
    out = explain("output_tok_s", "B / step * 1000 * replicas", "tok/s", src, "every sequence emits a token a step",
                  B=result["max_batch"], step=result["step_ms"], replicas=result["replicas"])
    tot = explain("total_tok_s", "out * (I + O) / O", "tok/s", src, out=out.value, I=prompt_tokens, O=output_tokens)
    return [step, out, tot]


def formula_markdown(lines: list[Explained], labels: dict[str, str]) -> str:
    """Markdown for a formula expander: one paragraph per line, its name, the symbols, then the numbers."""
    return "\n\n".join(f"**{labels.get(e.name, e.name)}** `{e.symbolic}`  \n{e.formula}"
                       + (f"  \n_{e.description}_" if e.description else "") for e in lines)


__all__ = ["formula_markdown", "max_batched_tokens", "memory_and_cost", "plan_formulas", "plan_mesh",
           "step_terms", "throughput_formulas"]
