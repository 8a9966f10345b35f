"""Wide expert parallelism for the capacity planner: an MoE model served with data-parallel attention and its
experts spread over all the GPUs (DeepSeek-V3/R1 or Qwen3-235B on 8 GPUs as attention TP t × DP d, EP = t·d;
SGLang `--attn-dp-size --ep-size`, vLLM `--data-parallel-size --enable-expert-parallel`).

Candidates: for each GPU count g of the search space, each EP group size e of the search space's GPU counts
dividing g, and each TP degree t < e dividing e, g / e groups side by side of the layout `Mesh(tp=t, ep=e,
gpus=e)` (16 GPUs as two EP-8 server instances, or one EP-16): d = e / t attention replicas per group, g / t in
all (each with its own requests and KV cache, the request rate split evenly over them), the routed experts of a
group sharded over its e GPUs, attention, dense layers and shared experts replicated per replica and split t ways.
Layouts `mesh_problem` refuses (EP not dividing the experts, TP not dividing the heads) are not tried. No pipeline
parallelism.

Each candidate is costed with `serve_at`'s step (`step.step_inputs`, `step_tables`, `mixed_step`: dispatch
and combine all-to-alls, the busiest EP rank's expert imbalance, the experts the tokens of all d replicas
touch; from the device's measured kernels where the planner was given a profile, as `step.step_cost`),
vectorised over the candidates of a device, and the steady state per replica at rate / d, each step waiting for
the group's busiest rank's prompts (`rank_wait`), as the planner solves it (`planner.screened_steady_state`:
screened, then `serve_at`'s prompt chain near the targets at the three cheapest GPU counts, where the figures
equal `serve_at`'s for the same layout and rate); its memory is `tensor_parallel.per_gpu_memory`'s sum
(weights + KV of the batch cap + activations + overheads, and DeepEP's all-to-all buffers where the stack runs
DeepEP, `deepep.wide_ep_buffer_bytes` at vLLM's defaults: ≈ 4.9 GB per GPU for DeepSeek-R1; the stacks' default
exchange gathers through NCCL and holds none). The figures come back as the planner's columns (`planner._rank`
ranks them with the rest):
    itl_ms       the step of `batch_cap` decode rows alone (its memory, compute and collectives say what binds)
    prefill_ms   the step of the mean (p99) prompt alone
"""
from __future__ import annotations

import functools

import numpy as np

from calculators import arch
from calculators.multi_gpu.tensor_parallel import (Mesh, deepep_buffer_bytes, mesh_problem, per_gpu_activation_bytes,
                                                   per_gpu_kv_bytes, per_gpu_weight_bytes)
from calculators.planning.rank_wait import local_share
from calculators.planning.screening import apply_bounds, no_steady_state, peak_or_nan, screened_steady_state
from calculators.planning.serve_at import decode_context
from calculators.planning.step import mixed_step, step_inputs, step_tables
from specs.model_config import ModelConfig


def wide_ep_layouts(config: ModelConfig, gpu_counts, tp_degrees) -> list[Mesh]:
    """Every layout attention TP t × DP (g / t) with EP = g over g GPUs (t < g) that `mesh_problem` accepts."""
    if not arch.is_moe(config):
        return []
    return [m for g in sorted(set(gpu_counts)) for t in sorted(set(tp_degrees)) if t < g and g % t == 0
            for m in [Mesh(tp=t, pp=1, ep=g, gpus=g)] if mesh_problem(config, m) is None]


def wide_ep_groups(config: ModelConfig, gpu_counts, tp_degrees) -> list[tuple[Mesh, int]]:
    """(one EP group's layout, how many groups) for every GPU count g: groups of e GPUs (e one of the GPU counts,
    dividing g), each a `wide_ep_layouts` layout over its e GPUs."""
    counts = sorted(set(gpu_counts))
    return [(m, g // m.gpus) for g in counts for m in wide_ep_layouts(config, [e for e in counts if g % e == 0],
                                                                      tp_degrees)]


def wide_ep_candidates(config: ModelConfig, devices, wl, space, stack, eff_tab, usable_fraction, overheads,
                       embeddings_16bit: bool, links, profiles=None) -> dict:
    """The planner's raw columns (see `planner._rank`) for every wide-EP layout × device × weight and KV precision
    × batch cap on a device with an interconnect. Those whose weights do not fit, or whose weight format the device
    cannot run, are there too (rejected for memory or precision) but not costed. `profiles` (one per device, or
    None): a device with one is priced from its measured kernels, as `step.step_cost` prices the layout."""
    c = config
    mem_ctx = wl.prompt_tokens + wl.output_tokens
    ctx = decode_context(wl.prompt_lengths(), wl.output_lengths())
    caps = np.array(space.batch_caps, dtype=float)
    ratio = step_tables(c, Mesh(), None, stack)["ratio"]          # experts touched: the same for every layout

    @functools.cache                            # devices with the same interconnect share the token tables
    def tables_for(link, m, wd):                # the weight format sets what the MoE exchange sends (NVFP4 or 16 bits)
        return step_tables(c, m, link, stack, wd, ratio=ratio)

    @functools.cache
    def activations(m):
        return np.array([per_gpu_activation_bytes(c, m, mem_ctx, int(B)) for B in caps])

    @functools.cache
    def weights(m, wd):
        return per_gpu_weight_bytes(c, m, wd, None, embeddings_16bit)
    groups = []                                 # one per device × layout × precisions; the batch caps run inside
    for d, dev in enumerate(devices):
        if links[d] is None:
            continue
        for m, k in wide_ep_groups(c, space.gpu_counts, space.tp):
            act = activations(m)
            # as tensor_parallel.per_gpu_memory: runtime overheads + DeepEP's buffers where the stack runs DeepEP
            over = overheads.total_bytes(m.communicating_gpus) + deepep_buffer_bytes(c, m, stack.moe_dp_comm)
            for wi, wd in enumerate(space.weight_dtypes):
                peak, eff, w = peak_or_nan(dev, wd), eff_tab[d][wi], weights(m, wd)
                costed = eff is not None and not np.isnan(peak) and w + over + act[0] <= dev.memory_bytes * \
                    usable_fraction
                tables = tables_for(links[d], m, wd) if costed else None
                prof = profiles[d] if profiles is not None else None
                for ki, kd in enumerate(space.kv_dtypes):
                    terms, tb = step_inputs(c, dev, m, wd, kd, eff, links[d], stack, ctx, wl.prompt_tokens,
                                            profile=prof, tables=tables) if costed else (None, None)
                    groups.append(dict(di=d, mesh=m, k=k, wdi=wi, kdi=ki, w=w, act=act, over=over, peak=peak,
                                       kv=per_gpu_kv_bytes(c, m, mem_ctx, 1, kd), price=dev.price_usd_per_hour,
                                       terms=terms, tables=tb))
    K = len(caps)
    n = len(groups) * K
    group_of = np.repeat(np.arange(len(groups)), K)

    def col(f, dtype=float):
        return np.array([f(x) for x in groups], dtype=dtype)[group_of] if groups else np.zeros(0, dtype=dtype)
    B = np.tile(caps, len(groups))
    di, tp = col(lambda x: x["di"], int), col(lambda x: x["mesh"].tp, int)
    e = col(lambda x: x["mesh"].gpus, int)                      # one EP group's GPUs
    g = e * col(lambda x: x["k"], int)                          # all the groups'

    w, kv, over = col(lambda x: x["w"]), col(lambda x: x["kv"]) * B, col(lambda x: x["over"])
    act = np.concatenate([x["act"] for x in groups]) if groups else np.zeros(0)
    usable = np.array([dv.memory_bytes for dv in devices], dtype=float)[di] * usable_fraction
    needed = w + kv + act + over
    costed = col(lambda x: x["terms"] is not None, bool)
    out = dict(di=di, gpus=g, tp=tp, pp=np.ones(n, dtype=int), ep=e, dp=e // tp, replicas=g // tp,
               batch_cap=B.astype(int), wdi=col(lambda x: x["wdi"], int), kdi=col(lambda x: x["kdi"], int),
               per_gpu_weight_bytes=w, per_gpu_kv_bytes=kv, per_gpu_needed_bytes=needed, usable_bytes=usable,
               mesh_ok=np.ones(n, dtype=bool), peak=col(lambda x: x["peak"]),
               price=col(lambda x: x["price"] if x["price"] else np.nan))
    base = costed & (needed <= usable)
    lam = wl.requests_per_s / np.maximum(out["replicas"], 1)

    def step_of(idx):
        """One vectorised step over the candidates `idx` (the last axis of n and p runs over them)."""
        gs = [groups[i] for i in group_of[idx]]
        tables = {k: np.stack([x["tables"][k] for x in gs]) for k in ("ratio", "extra", "comm", "p2p")}
        if "measured" in gs[0]["tables"]:        # one pricing per call (`kinds`): all from kernels, or none
            tables["measured"] = {k: np.stack([x["tables"]["measured"][k] for x in gs])
                                  for k in gs[0]["tables"]["measured"]}
            tables["prompt_len"] = np.array([x["tables"]["prompt_len"] for x in gs], dtype=float)
        return mixed_step({k: np.array([x["terms"][k] for x in gs], dtype=float) for k in gs[0]["terms"]}, tables)
    figures = {k: np.full(n, np.inf) for k in ("itl_ms", "decode_memory_ms", "decode_compute_ms", "decode_comm_ms",
                                               "prefill_ms", "prefill_p99_ms", "itl_one")}
    measured = col(lambda x: x["tables"] is not None and "measured" in x["tables"], bool)
    kinds = [(d, m) for d in range(len(devices)) for m in (False, True)]   # a device's INT4 rows: the closed form
    for d, m in kinds:                           # each candidate's step alone: decode at the cap and at 1, prefill
        sel = np.flatnonzero(costed & (di == d) & (measured == m))
        if not len(sel):
            continue
        step = step_of(sel)
        figures["itl_ms"][sel] = step(B[sel], 0.0)
        at_cap = step.parts(B[sel], 0.0)
        for name, term in (("decode_memory_ms", "memory_ms"), ("decode_compute_ms", "compute_ms"),
                           ("decode_comm_ms", "comm_ms")):
            figures[name][sel] = at_cap[term]
        figures["itl_one"][sel] = step(np.ones(len(sel)), 0.0)
        for name, P in (("prefill_ms", wl.prompt_tokens), ("prefill_p99_ms", wl.p99_prompt)):
            figures[name][sel] = step(0.0, np.full(len(sel), float(wl.new_prompt_tokens(P))))
    # the planner's bounds no load beats, then its steady state where they pass
    itl_one = figures.pop("itl_one")
    slots_ok = lam * wl.output_tokens * itl_one / 1e3 < B
    viable = base & (itl_one <= wl.itl_ms) & (figures["prefill_p99_ms"] <= wl.ttft_p99_ms) & slots_ok
    ld = no_steady_state(n)
    share = local_share(c, wl.prompt_lengths(new_only=True).mean_tokens)   # the rank's own share of a prompt
    for d, m in kinds:
        keep = np.flatnonzero(viable & (di == d) & (measured == m))
        if len(keep):
            st = screened_steady_state(lambda idx: step_of(keep[idx]), wl, lam[keep], B[keep], g[keep], stack,
                                       devices[d], ranks=out["dp"][keep], share=share)
            for k in ld:
                ld[k][keep] = st[k]
    apply_bounds(ld, base, viable, slots_ok, itl_one, figures["prefill_p99_ms"])
    return dict(out, **figures, base=base, viable=viable, **ld)
