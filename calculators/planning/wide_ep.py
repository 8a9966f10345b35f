"""Wide expert parallelism for the capacity planner: an MoE model served with data-parallel attention and its
experts spread over all the GPUs (DeepSeek-V3/R1 or Qwen3-235B on 8 GPUs as attention TP t × DP d, EP = t·d;
SGLang `--enable-dp-attention --ep-size`, vLLM `--data-parallel-size --enable-expert-parallel`).

Candidates: for each GPU count g of the search space and each TP degree t < g dividing g, the layout
`Mesh(tp=t, ep=g, gpus=g)`: d = g / t attention replicas (each with its own requests and KV cache, the request
rate split evenly over them), the routed experts sharded over all g GPUs, attention, dense layers and shared
experts replicated per replica and split t ways. Layouts `mesh_problem` refuses (EP not dividing the experts, TP
not dividing the heads) are not tried. No pipeline parallelism.

Each candidate is costed with `serve_at`'s step (`serve_at.step_terms`, `step_tables`, `mixed_step`: dispatch
and combine all-to-alls, the busiest EP rank's expert imbalance, the experts the tokens of all d replicas
touch) and `serve_at`'s steady state per replica at rate / d, vectorised over the candidates of a device; its
memory is `tensor_parallel.per_gpu_memory`'s sum (weights + KV of the batch cap + activations + overheads). The
figures come back as the planner's columns (`planner._rank` ranks them with the rest):
    itl_ms       the step of `batch_cap` decode rows alone (its memory, compute and collectives say what binds)
    prefill_ms   the step of the mean (p99) prompt alone
"""
from __future__ import annotations

import numpy as np

from calculators import arch
from calculators.multi_gpu.tensor_parallel import (Mesh, mesh_problem, per_gpu_activation_bytes, per_gpu_kv_bytes,
                                                   per_gpu_weight_bytes)
from calculators.planning.serve_at import decode_context, mixed_step, step_tables, step_terms
from calculators.sizing.roofline import compute_precision_for
from specs.model_config import ModelConfig, SpecError


def wide_ep_layouts(config: ModelConfig, gpu_counts, tp_degrees) -> list[Mesh]:
    """Every layout attention TP t × DP (g / t) with EP = g over g GPUs (t < g) that `mesh_problem` accepts."""
    if not arch.is_moe(config):
        return []
    return [m for g in sorted(set(gpu_counts)) for t in sorted(set(tp_degrees)) if t < g and g % t == 0
            for m in [Mesh(tp=t, pp=1, ep=g, gpus=g)] if mesh_problem(config, m) is None]


def wide_ep_candidates(config: ModelConfig, devices, wl, space, stack, eff_tab, usable_fraction, overheads,
                       embeddings_16bit: bool, links) -> dict:
    """The planner's raw columns (see `planner._rank`) for every wide-EP layout × device × batch cap × weight
    and KV precision that runs (the device has an interconnect and the weight format's tensor cores)."""
    from calculators.planning.planner import apply_bounds, no_steady_state, screened_steady_state
    c = config
    meshes = wide_ep_layouts(c, space.gpu_counts, space.tp)
    mem_ctx = wl.prompt_tokens + wl.output_tokens
    prompt, output = wl.prompt_lengths(new_only=True), wl.output_lengths()
    ctx = decode_context(wl.prompt_lengths(), output)
    caps = np.array(space.batch_caps, dtype=float)
    ratio = step_tables(c, Mesh(), None, stack)["ratio"]          # experts touched: the same for every layout
    parts = {k: [] for k in ("di", "mesh", "wdi", "kdi", "B", "terms", "w", "kv", "act", "over", "peak", "price")}
    tables = []
    for d, dev in enumerate(devices):
        if links[d] is None:
            continue
        for m in meshes:
            tab = None
            act = np.array([per_gpu_activation_bytes(c, m, mem_ctx, int(B)) for B in caps])
            over = overheads.total_bytes(m.gpus_per_replica)      # as tensor_parallel.per_gpu_memory
            for wi, wd in enumerate(space.weight_dtypes):
                eff = eff_tab[d][wi]
                try:
                    peak = dev.flops_for(compute_precision_for(wd))[0]
                except SpecError:
                    continue
                if eff is None:
                    continue
                w = per_gpu_weight_bytes(c, m, wd, None, embeddings_16bit)
                if w + over + act[0] > dev.memory_bytes * usable_fraction:
                    continue
                if tab is None:
                    tab = step_tables(c, m, links[d], stack, ratio=ratio)
                for ki, kd in enumerate(space.kv_dtypes):
                    terms = step_terms(c, dev, m, wd, kd, eff, ctx, wl.prompt_tokens)
                    kv = per_gpu_kv_bytes(c, m, mem_ctx, 1, kd) * caps
                    for j, B in enumerate(caps):
                        for k, v in (("di", d), ("mesh", m), ("wdi", wi), ("kdi", ki), ("B", B), ("terms", terms),
                                     ("w", w), ("kv", kv[j]), ("act", act[j]), ("over", over), ("peak", peak),
                                     ("price", dev.price_usd_per_hour or np.nan)):
                            parts[k].append(v)
                        tables.append(tab)
    n = len(parts["B"])
    di = np.array(parts["di"], dtype=int)
    g = np.array([m.total_gpus for m in parts["mesh"]], dtype=int)
    tp = np.array([m.tp for m in parts["mesh"]], dtype=int)
    B = np.array(parts["B"])
    w, kv, act, over = (np.array(parts[k], dtype=float) for k in ("w", "kv", "act", "over"))
    usable = np.array([devices[i].memory_bytes for i in di], dtype=float) * usable_fraction
    needed = w + kv + act + over
    out = dict(di=di, gpus=g, tp=tp, pp=np.ones(n, dtype=int), ep=g.copy(), dp=g // np.maximum(tp, 1),
               replicas=g // np.maximum(tp, 1), batch_cap=B.astype(int), wdi=np.array(parts["wdi"], dtype=int),
               kdi=np.array(parts["kdi"], dtype=int), per_gpu_weight_bytes=w, per_gpu_kv_bytes=kv,
               per_gpu_needed_bytes=needed, usable_bytes=usable, mesh_ok=np.ones(n, dtype=bool),
               peak=np.array(parts["peak"], dtype=float), price=np.array(parts["price"], dtype=float))
    base = needed <= usable
    lam = wl.requests_per_s / np.maximum(out["replicas"], 1)

    def step_of(idx):
        """One vectorised step over the candidates `idx` (the last axis of n and p runs over them)."""
        return mixed_step({k: np.array([parts["terms"][i][k] for i in idx], dtype=float) for k in parts["terms"][0]},
                          {k: np.stack([tables[i][k] for i in idx]) for k in ("ratio", "extra", "comm")})
    figures = {k: np.full(n, np.inf) for k in ("itl_ms", "decode_memory_ms", "decode_compute_ms", "decode_comm_ms",
                                               "prefill_ms", "prefill_p99_ms", "itl_one")}
    for d in range(len(devices)):                # each candidate's step alone: decode at the cap and at 1, prefill
        sel = np.flatnonzero(di == d)
        if not len(sel):
            continue
        step = step_of(sel)
        figures["itl_ms"][sel] = step(B[sel], 0.0)
        figures["decode_memory_ms"][sel], figures["decode_compute_ms"][sel], figures["decode_comm_ms"][sel] = \
            step.parts(B[sel], 0.0)
        figures["itl_one"][sel] = step(np.ones(len(sel)), 0.0)
        for col, P in (("prefill_ms", wl.prompt_tokens), ("prefill_p99_ms", wl.p99_prompt)):
            figures[col][sel] = step(0.0, np.full(len(sel), float(wl.new_prompt_tokens(P))))
    # the planner's bounds no load beats, then its steady state where they pass
    itl_one = figures.pop("itl_one")
    slots_ok = lam * wl.output_tokens * itl_one / 1e3 < B
    viable = base & (itl_one <= wl.itl_ms) & (figures["prefill_p99_ms"] <= wl.ttft_p99_ms) & slots_ok
    ld = no_steady_state(n)
    for d, dev in enumerate(devices):
        keep = np.flatnonzero(viable & (di == d))
        if len(keep):
            st = screened_steady_state(lambda idx: step_of(keep[idx]), wl, lam[keep], B[keep], g[keep], stack, dev)
            for k in ld:
                ld[k][keep] = st[k]
    apply_bounds(ld, base, viable, slots_ok, itl_one, figures["prefill_p99_ms"])
    return dict(out, **figures, base=base, viable=viable, **ld)
