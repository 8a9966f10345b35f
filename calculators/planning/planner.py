"""Capacity planner: which device, how many, split how, at what batch cap and precision, to serve a workload
within its latency targets, ranked by $ per 1M tokens, each plan naming the constraint that binds it.

Search space: device × GPU count × TP × PP × batch cap × weight precision × KV precision. Every candidate is
evaluated at once with NumPy arrays, with the same formulas as `calculators.multi_gpu.tensor_parallel` for memory,
decode at the cap and prefill (the tests check they agree), and the loaded server of
`calculators.serving.steady_state` on the candidate's own mixed step (the step `step.step_cost` and
`throughput.step_time` compute one candidate at a time: the tests check the planner equals `serve_at`):
    per replica at λ = rate / replicas:  τ = step(λ·E[O−1]·τ decode rows, λ·E[I]·τ prompt tokens)
                                          (the stack's efficiency for the device's vendor and the weights' precision)
    ITL at the load  τ, the mean token gap with the prefills' share of every step included
    TTFT p99         the prompt chain (whole prompts) or the chunk-budget queue, + the wait for a free slot
    capacity         the rate beyond which no τ exists, the slots overflow or the prompts exceed the budget
Constraints: memory, ITL at the load ≤ target (bound by bandwidth, compute or communication, whichever dominates
the decode step), TTFT p99 ≤ target (compute, or queueing when the wait dominates), the rate below capacity
(queueing). A plan's binding constraint is the one with the least slack (used / limit closest to 1); plans of
equal cost are ranked by that slack (the most headroom first).
Cost at the load: every GPU is paid, busy or not: $/1M = gpus × price / (rate × tokens per request × 3,600) × 10^6,
split into $ per 1M input and per 1M output tokens by the GPU time each takes.
Bounds no load can beat screen the candidates first (a token gap is at least a one-sequence step, a TTFT at least
the p99 prompt's prefill alone); the candidates of the cheapest REFINED_LEVELS GPU counts per device then get the
full steady state (the prompt chain), the rest keep the screening model (prompts per step drawn independently).
MoE models are also tried with expert parallelism over each TP group (EP = TP), and with attention data-parallel
and the experts over an EP group (attention TP t × DP d, EP = t·d, one group or several side by side:
`calculators.planning.wide_ep`, costed with `serve_at`'s step; their rows have dp = d per group and replicas =
d × groups, every other row dp = 1). A prefix-cache hit rate h
(Workload.prefix_hit_rate) leaves ceil(P·(1 − h)) new prompt tokens to prefill, attending over all P. FP4
weights are tried only on devices with FP4 tensor cores. Not searched: context parallelism, speculative decoding,
wide EP with pipeline parallelism.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from calculators import arch
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.latency import Efficiency, gemm_mfu, stage_with_host, step_weight_bytes
from calculators.sizing.memory import DEFAULT_GPU_MEMORY_UTILIZATION, RuntimeOverheads, ffn_width
from calculators.sizing.params import bytes_per_param, expert_params, param_breakdown
from calculators.sizing.roofline import forward_flops_split, gpu_time, step_peaks
from calculators.multi_gpu.tensor_parallel import Mesh, mesh_problem
from calculators.planning.screening import apply_bounds, no_steady_state, peak_or_nan, screened_steady_state
from calculators.planning.measured_step import measured_allreduce_ms, resolve_profile
from calculators.planning.plan_workload import Workload
from calculators.planning.planner_measured import gpu_ms as measured_gpu_ms, measured_layouts
from calculators.planning.serve_at import decode_context
from calculators.planning.step import TOKEN_GRID, context_slope
from calculators.units import check_fraction
from calculators.multi_gpu.collectives import allreduce_ms as collective_ms
from calculators.multi_gpu.moe import routing_imbalance
from specs.devices import Device, Link, device_link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import Stack, load_stack

GiB = 2 ** 30
CONSTRAINTS = ("memory", "bandwidth", "compute", "communication", "queueing")
REASONS = ("feasible", "mesh", "precision", "memory", "itl", "utilisation", "concurrency", "ttft", "no price")


@dataclass(frozen=True)
class SearchSpace:
    """What the planner may choose. TP degrees that do not divide the model's heads are dropped (and said)."""
    gpu_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8)
    batch_caps: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    weight_dtypes: tuple[str, ...] = ("bf16", "fp8", "int4", "fp4")   # fp4 only where the device has it
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")
    expert_parallel: bool = True          # MoE models: also try EP = TP, and attention TP × DP with EP over all GPUs


@dataclass
class PlanResult:
    """All candidates as columns (NumPy arrays), plus which are feasible, ranked."""
    columns: dict
    feasible_order: np.ndarray          # indices of feasible candidates, cheapest first
    reasons: dict = field(default_factory=dict)     # reason -> count of rejected candidates
    notes: list = field(default_factory=list)
    workload: Workload | None = None

    @property
    def n_candidates(self) -> int:
        return len(self.columns["tp"])

    def plan(self, i: int) -> dict:
        """One candidate as plain Python values, with the sentence saying why it passes or fails."""
        row = {k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in self.columns.items()}
        row["why"] = _sentence(self.columns, i, self.workload)
        return row

    def ranked(self, top: int = 20) -> list[dict]:
        return [self.plan(int(i)) for i in self.feasible_order[:top]]

    def rejected(self, top: int = 50) -> list[dict]:
        """Rejected candidates nearest to feasible first (smallest worst over-limit ratio), with their reason."""
        bad = np.flatnonzero(~self.columns["feasible"])
        order = bad[np.lexsort((self.columns["worst_ratio"][bad], self.columns["reason"][bad] == "mesh"))]
        return [self.plan(int(i)) for i in order[:top]]

    def find(self, device: str, gpus: int, tp: int, pp: int, batch_cap: int, weight_dtype: str,
             kv_dtype: str, ep: int | None = None) -> list[dict]:
        """The candidates with exactly this layout (for an MoE model: without expert parallelism, with EP = TP
        and, when TP < GPUs and PP = 1, with EP over groups of the GPUs, one or several; `ep` picks one), each
        with `why` and, when feasible, its `rank` among the feasible plans (1 = cheapest). [] when the layout is
        outside the search space."""
        col = self.columns
        hit = np.flatnonzero((col["device"] == device) & (col["gpus"] == gpus) & (col["tp"] == tp)
                             & (col["pp"] == pp) & (col["batch_cap"] == batch_cap)
                             & (col["weight_dtype"] == weight_dtype) & (col["kv_dtype"] == kv_dtype)
                             & ((col["ep"] == ep) if ep is not None else True))
        rank = {int(i): r + 1 for r, i in enumerate(self.feasible_order)}
        return [{**self.plan(int(i)), "rank": rank.get(int(i))} for i in hit]

    def no_plan_reason(self) -> str | None:
        if len(self.feasible_order):
            return None
        parts = [f"{n:,} × {r}" for r, n in sorted(self.reasons.items(), key=lambda kv: -kv[1]) if n]
        return "no feasible plan among {:,} candidates: {}".format(self.n_candidates, "; ".join(parts) or "none") + \
            ("" if not self.notes else " (" + "; ".join(self.notes) + ")")


def prompt_scv(wl: Workload) -> float:
    """Squared coefficient of variation of the prefill time, read off the prompt lengths (a prefill's time grows
    with its prompt): 0 when the p99 prompt equals the mean (one length), 1 when p99 = ln(100) × mean (the
    exponential's ratio), linear in between and capped at 1."""
    return min(1.0, max(0.0, (wl.p99_prompt / wl.prompt_tokens - 1) / (math.log(100) - 1))) ** 2


def _model_scalars(c: ModelConfig, wl: Workload, kv_dtypes, weight_dtypes, batch_caps, pp_values) -> dict:
    """Everything that depends on the model and the workload only: computed once, by the scalar calculators."""
    b = param_breakdown(c)
    mean_ctx = wl.prompt_tokens + max(wl.output_tokens - 1, 0) // 2 + 1
    kv_seq = {kd: kv_cache_bytes(c, mean_ctx, 1, kd) for kd in kv_dtypes}
    mem_ctx = wl.prompt_tokens + wl.output_tokens
    kv_seq_mem = {kd: kv_cache_bytes(c, mem_ctx, 1, kd) for kd in kv_dtypes}
    rows_needed = sorted({1} | {math.ceil(B / min(B, p)) for B in batch_caps for p in pp_values})
    full = step_weight_bytes(c, "bf16", rows=1 << 30)
    ratio = {r: step_weight_bytes(c, "bf16", rows=r) / full for r in rows_needed}
    ratio_prefill = {P: step_weight_bytes(c, "bf16", rows=wl.new_prompt_tokens(P)) / full
                     for P in (wl.prompt_tokens, wl.p99_prompt)}
    return dict(params=b, mean_ctx=mean_ctx, kv_seq=kv_seq, mem_ctx=mem_ctx, kv_seq_mem=kv_seq_mem, read_ratio=ratio,
                read_ratio_prefill=ratio_prefill,
                # FLOPs split by precision: dict(weights=, attention=) (`roofline.forward_flops_split`)
                decode_flops_per_row=forward_flops_split(c, 1, mean_ctx, 1),
                # a prefix-cache hit skips the cached tokens' FLOPs; the new ones still attend over the whole prompt
                prefill_flops={P: forward_flops_split(c, wl.new_prompt_tokens(P), P, 1)
                               for P in (wl.prompt_tokens, wl.p99_prompt)},
                ffn=ffn_width(c))


def _grid(devices, space: SearchSpace, c: ModelConfig):
    """Cartesian product of the choices as flat arrays (mesh-invalid TP/PP kept, marked), and each candidate's
    layout: the number shared by the candidates that differ only in their batch cap. For an MoE model each
    layout is tried with and without expert parallelism over its TP group (EP = TP)."""
    ep_opts = np.array([False, True] if arch.is_moe(c) and space.expert_parallel else [False])
    di, g, tp, pp, B, wd, kd, ep_on = np.meshgrid(
        np.arange(len(devices)), np.array(space.gpu_counts), np.array(space.tp), np.array(space.pp),
        np.array(space.batch_caps), np.arange(len(space.weight_dtypes)), np.arange(len(space.kv_dtypes)), ep_opts,
        indexing="ij")
    keep = ~(ep_on & (tp == 1)).ravel()                    # EP over a 1-GPU TP group is the plain layout again
    caps = (slice(None),) * 4 + (slice(0, 1),)            # the batch cap is the fifth axis
    layout = np.broadcast_to(np.arange(di[caps].size).reshape(di[caps].shape), di.shape)
    return [a.ravel()[keep] for a in (di, g, tp, pp, B, wd, kd, ep_on, layout)]


def plan(config: ModelConfig, devices: list[Device], workload: Workload, space: SearchSpace = SearchSpace(),
         efficiency: Efficiency | None = None, usable_fraction: float = DEFAULT_GPU_MEMORY_UTILIZATION,
         overheads: RuntimeOverheads = RuntimeOverheads(), embeddings_16bit: bool = True,
         link: Link | None = None, stack: Stack | str | None = None, profile=None) -> PlanResult:
    """Evaluate every candidate of `space` on `devices` for `workload`; feasible plans ranked by $/1M tokens at
    the load (then by ITL). The serving `stack` (vLLM when None) sets the all-reduce algorithm, and, unless
    `efficiency` is given, the efficiencies and the fixed step cost per device class. Bad input raises SpecError;
    an empty result carries `no_plan_reason()`. `profile` ("auto", a name or a Profile; None: the closed form):
    candidates on a device with kernels measured on it and the stack are priced from them
    (`planner_measured`), the rest by the closed form; the notes say which."""
    c, wl = config, workload.check()
    if not devices:
        raise SpecError("choose at least one device")
    stack = stack if isinstance(stack, Stack) else load_stack(stack)
    effs = [efficiency or Efficiency.for_stack(stack, dv, config=c) for dv in devices]
    eff_tab = [[efficiency or _eff_or_none(stack, dv, w, c) for w in space.weight_dtypes] for dv in devices]
    check_fraction("gpu_memory_utilization", usable_fraction)
    notes = []
    bad_tp = [t for t in space.tp if mesh_problem(c, Mesh(tp=t)) is not None]
    if bad_tp:
        notes.append(f"TP {', '.join(map(str, bad_tp))} cannot split {c.name}'s heads "
                     f"({c.num_heads} query, {c.num_kv_heads} KV)")
    S = _model_scalars(c, wl, space.kv_dtypes, space.weight_dtypes, space.batch_caps, space.pp)
    di, g, tp, pp, B, wdi, kdi, ep_on, layout = _grid(devices, space, c)
    ep = np.where(ep_on, tp, 1)
    p = S["params"]
    L, D, d, hkv, V = c.num_layers, c.hidden_size, c.head_dim, c.num_kv_heads, c.vocab_size
    mla = arch.is_mla(c)
    tpf, ppf, Bf = tp.astype(float), pp.astype(float), B.astype(float)

    # ---- mesh validity (the scalar rule, once per (tp, pp) pair)
    valid = {(t, q, e): mesh_problem(c, Mesh(tp=int(t), pp=int(q), ep=int(t) if e else 1, gpus=int(t * q))) is None
             for t in space.tp for q in space.pp for e in (False, True)}
    ok_table = np.array([[[valid[(t, q, e)] for e in (False, True)] for q in space.pp] for t in space.tp])
    mesh_ok = ok_table[np.searchsorted(space.tp, tp, sorter=np.argsort(space.tp)).clip(0, len(space.tp) - 1),
                       np.searchsorted(space.pp, pp, sorter=np.argsort(space.pp)).clip(0, len(space.pp) - 1),
                       ep_on.astype(int)] & (g % (tp * pp) == 0)
    replicas = np.where(mesh_ok, g // np.maximum(tp * pp, 1), 0)

    # ---- per-GPU memory (tensor_parallel.per_gpu_memory, vectorised)
    bpp = np.array([bytes_per_param(w) for w in space.weight_dtypes])[wdi]
    tbl = np.where(embeddings_16bit & (bpp < 2), 2.0, bpp)
    layers_bytes = (p.total - p.embedding - p.lm_head) * bpp
    stage = np.ceil(L / ppf)
    share = stage / L
    emb, head = p.embedding * tbl, p.lm_head * tbl
    tables = np.where(pp == 1, emb + head, np.maximum(emb, head if p.lm_head else emb))
    extra = 0.0 if mla else np.where(tpf > hkv, 2 * D * d * bpp * (1 - hkv / tpf) * stage, 0.0)
    w_gpu = layers_bytes * share / tpf + extra + tables / tpf
    rep = 1.0 if mla else np.maximum(1.0, tpf / hkv)
    kv_div = 1.0 if mla else rep / tpf
    kv_seq = np.array([S["kv_seq"][k] for k in space.kv_dtypes])[kdi] * share * kv_div
    kv_gpu = np.array([S["kv_seq_mem"][k] for k in space.kv_dtypes])[kdi] * share * kv_div * Bf
    rows_act = np.maximum(min(S["mem_ctx"], 4096), Bf)
    kv_w = c.kv_dim if mla else np.maximum(c.kv_dim // tp, d)
    act = rows_act * (5 * D + 2 * np.maximum(c.q_dim // tp, 1) + 2 * np.maximum(kv_w, 1)
                      + 3 * np.maximum(S["ffn"] // tp, 1)) * 2.0 + Bf * V / tpf * 4.0
    over = overheads.cuda_context_bytes + overheads.cuda_graph_bytes + \
        np.where(tp * pp > 1, overheads.comm_buffer_bytes, 0.0)
    mem_bytes = np.array([dv.memory_bytes for dv in devices])[di]
    usable = mem_bytes * usable_fraction
    needed = w_gpu + kv_gpu + act + over

    # ---- device and link numbers per candidate
    bw = np.array([dv.memory_bandwidth_bytes_per_s for dv in devices])[di]
    peak_tab = np.array([[peak_or_nan(dv, w) for w in space.weight_dtypes]
                         for dv in devices])
    peak = peak_tab[di, wdi]

    def _peak_attention(dv, w, k):
        try:
            return step_peaks(dv, w, k)["attention"]
        except SpecError:
            return np.nan
    peak_att = np.array([[[_peak_attention(dv, w, k) for k in space.kv_dtypes] for w in space.weight_dtypes]
                         for dv in devices])[di, wdi, kdi]
    dec_w, dec_a = S["decode_flops_per_row"]["weights"], S["decode_flops_per_row"]["attention"]
    links = [link if link is not None else device_link(dv) for dv in devices]
    has_link = np.array([lk is not None for lk in links])[di]
    lbw = np.array([lk.bytes_per_s if lk is not None else 1.0 for lk in links])[di]
    a0 = np.array([lk.alpha_base_s if lk is not None else 0.0 for lk in links])[di]
    a1 = np.array([lk.alpha_per_hop_s if lk is not None else 0.0 for lk in links])[di]
    price = np.array([dv.price_usd_per_hour if dv.price_usd_per_hour else np.nan for dv in devices])[di]
    overhead = np.array([e.step_overhead_ms for e in effs])[di]
    seq_over = np.array([e.sequence_overhead_us for e in effs])[di] / 1e3
    overlap = np.array([e.overlap_host for e in effs])[di]

    def host(gpu_ms, sequences, ov=overlap):
        """`Efficiency.stage_ms`, vectorised: the fixed step cost added to the GPU's work, the per-sequence host
        work added too, or overlapped with both (`latency.stage_with_host`)."""
        return stage_with_host(gpu_ms, overhead, sequences * seq_over, ov)

    def eff_of(field):                    # the stack's efficiency on each candidate's vendor and precision
        return np.array([[getattr(e, field) if e else np.nan for e in row] for row in eff_tab])[di, wdi]
    mbu, mfu, half = (eff_of(f) for f in ("decode_mbu", "decode_mfu", "gemm_half_tokens"))
    link_ok = has_link | (tp * pp == 1)

    def allreduce_ms(rows):
        """The stack's all-reduce of a [rows, D] activation (`collectives.allreduce`), once per distinct
        (device, TP, rows); where the candidate is priced from measured kernels, the profile's measured
        all-reduce (`measured_step.measured_allreduce_ms`, as `step.step_cost` prices it)."""
        rows_arr = np.broadcast_to(np.asarray(rows, dtype=float), tp.shape)
        on = np.zeros(len(tp), dtype=int) if meas is None else meas["on"].astype(int)
        uniq, inv = _unique_rows(di, tp, rows_arr, on)
        vals = np.array([tp_allreduce_ms(int(d), int(t), r, bool(o)) for d, t, r, o in uniq])
        return vals[inv] if len(vals) else np.zeros(len(tp))

    def tp_allreduce_ms(d: int, t: int, rows: float, measured: bool) -> float:
        if t == 1 or links[d] is None:
            return 0.0
        if measured and profiles[d] is not None:
            m = measured_allreduce_ms(profiles[d], links[d], rows * D * 2.0, t)
            if m is not None:
                return float(m)
        return collective_ms(rows * D * 2.0, t, links[d], stack)

    def layer_comm_ms(rows):
        """Per layer: the attention all-reduce and the FFN's (EP inside the TP group sums the experts' partial
        outputs with the same all-reduce)."""
        return 2 * allreduce_ms(rows)

    def p2p(rows):
        return np.where(pp > 1, (a0 + a1 + rows * D * 2.0 / lbw) * 1e3, 0.0)

    # ---- measured kernels where a device has a profile (the same tables as step.step_cost with it)
    ctx_loaded = decode_context(wl.prompt_lengths(), wl.output_lengths())
    profiles = [None] * len(devices)
    if profile is not None:
        for d, dv in enumerate(devices):
            profiles[d], words = resolve_profile(profile, dv, stack.full_key, c)
            notes.append(f"{dv.name}: priced from {words}")
    meas = measured_layouts(profiles, c, devices, di, tp, pp, ep, wdi, kdi, space.weight_dtypes, space.kv_dtypes,
                            ctx_loaded, wl.prompt_tokens, (wl.prompt_tokens, wl.p99_prompt), stack)
    if meas is not None:                  # the host's work that goes with measured kernels (`host` reads these)
        overhead = np.where(np.isnan(meas["step_overhead_ms"]), overhead, meas["step_overhead_ms"])
        seq_over = np.where(np.isnan(meas["sequence_overhead_ms"]), seq_over, meas["sequence_overhead_ms"])

    # ---- decode at the batch cap and at batch 1 (tensor_parallel.decode_step_parallel, vectorised)
    expert_flops_per_token = (c.num_experts_per_tok * 2 * expert_params(c) * arch.moe_layer_count(c)
                              if arch.is_moe(c) else 0.0)

    def extra_expert_flops(tokens):
        """The busiest EP rank's routed-expert FLOPs beyond the mean (`tensor_parallel._expert_flops_extra`)."""
        tok = np.broadcast_to(np.asarray(tokens, dtype=float), tp.shape)
        uniq, inv = _unique_rows(tok, ep)
        imb = np.array([1.0 if e == 1 else routing_imbalance(t, c.num_experts, c.num_experts_per_tok, int(e))
                        for t, e in uniq])[inv]
        return (imb - 1) * tok * expert_flops_per_token / tpf

    def decode(batch):
        m = np.minimum(batch, pp)
        rows = np.ceil(batch / m)
        uniq, inv = np.unique(rows, return_inverse=True)
        ratio = np.array([S["read_ratio"][int(r)] for r in uniq])[inv.ravel()]
        mem_w, mem_kv = w_gpu * ratio / (bw * mbu) * 1e3, kv_seq * rows / (bw * mbu) * 1e3
        mfu_r = gemm_mfu(mfu, half, rows)                  # the step's MFU at its tokens (`step.mixed_step`)
        comp_w = (dec_w * rows / tpf + extra_expert_flops(rows)) * share / (peak * mfu_r) * 1e3
        comp_a = dec_a * rows / tpf * share / (peak_att * mfu_r) * 1e3
        mem, comp = mem_w + mem_kv, comp_w + comp_a
        comm = stage * layer_comm_ms(rows)
        gpu = gpu_time(mem_w, comp_w, mem_kv, comp_a)
        if meas is not None:
            gpu = np.where(meas["on"], measured_gpu_ms(meas, rows, 0.0, rows, wl.prompt_tokens), gpu)
        step = host(gpu + comm, rows)
        return np.maximum(m, pp) * step + (pp - 1) * p2p(rows), mem, comp, comm
    itl, mem_ms, comp_ms, comm_ms = decode(Bf)
    itl_one = decode(np.ones_like(Bf))[0]

    # ---- prefill of one prompt alone, mean and p99 length: the mixed step at 0 decode rows (`step.mixed_step`:
    # the weights at the decode MBU, the FLOPs at the MFU of the prompt's tokens, no cached KV read)
    def prefill(P):
        f = S["prefill_flops"][P]
        mfu_p = gemm_mfu(mfu, half, float(wl.new_prompt_tokens(P)))
        cm_w = (f["weights"] / tpf + extra_expert_flops(float(P))) * share / (peak * mfu_p) * 1e3
        cm_a = f["attention"] / tpf * share / (peak_att * mfu_p) * 1e3
        mm_w, mm_kv = w_gpu * S["read_ratio_prefill"][P] / (bw * mbu) * 1e3, 0.0
        gpu = gpu_time(mm_w, cm_w, mm_kv, cm_a)
        if meas is not None:
            new = float(wl.new_prompt_tokens(P))
            ops = measured_gpu_ms(meas, 0.0, 0.0, new, wl.prompt_tokens)     # GEMMs, small kernels, LM head once
            gpu = np.where(meas["on"], ops + meas["prompt_attn"][P], gpu)
        st = host(gpu + stage * layer_comm_ms(float(wl.new_prompt_tokens(P))), 0.0)
        return ppf * st + (pp - 1) * p2p(float(wl.new_prompt_tokens(P))), cm_w + cm_a
    pre_mean, _ = prefill(wl.prompt_tokens)
    pre_p99, pre_comp = prefill(wl.p99_prompt)

    # ---- the loaded server (calculators.serving.steady_state on this candidate's mixed step) and cost
    lam = wl.requests_per_s / np.maximum(replicas, 1)
    base = mesh_ok & link_ok & ~np.isnan(peak) & (needed <= usable)
    # bounds no load can beat, so the steady state is solved only where it decides: a token gap is at least a
    # one-sequence decode step, a TTFT at least the p99 prompt's prefill alone, and B slots at best finish
    # B requests per (output × one-sequence step)
    slots_ok = lam * wl.output_tokens * itl_one / 1e3 < Bf
    viable = base & (itl_one <= wl.itl_ms) & (pre_p99 <= wl.ttft_p99_ms) & slots_ok
    ld = _loaded(c, wl, S, devices, stack, viable, lam, B, dict(
        w_gpu=w_gpu, kv_row=kv_seq, share=share, peak_att=peak_att, tpf=tpf, pp=pp, peak=peak, bw=bw, mbu=mbu,
        mfu=mfu, half=half, overhead=overhead, seq_over=seq_over, overlap=overlap, di=di, ep=ep, gpus=g.astype(float),
        layout=layout,
        comm_table=_comm_table(di, tp, links, stack, D, profiles), stage=stage, lbw=lbw, a01=a0 + a1,
        meas_on=np.zeros(len(tp), dtype=bool) if meas is None else meas["on"],
        meas_at=np.zeros(len(tp), dtype=np.intp) if meas is None else meas["at"]), meas)
    apply_bounds(ld, base, viable, slots_ok, itl_one, pre_p99)
    raw = dict(di=di, gpus=g, tp=tp, pp=pp, ep=ep, dp=np.ones_like(tp), replicas=replicas, batch_cap=B, wdi=wdi,
               kdi=kdi, per_gpu_weight_bytes=w_gpu, per_gpu_kv_bytes=kv_gpu, per_gpu_needed_bytes=needed,
               usable_bytes=usable, itl_ms=itl, decode_memory_ms=mem_ms, decode_compute_ms=comp_ms,
               decode_comm_ms=comm_ms, prefill_ms=pre_mean, prefill_p99_ms=pre_p99, mesh_ok=mesh_ok & link_ok,
               peak=peak, price=price, base=base, viable=viable, **ld)
    if arch.is_moe(c) and space.expert_parallel:
        from calculators.planning.wide_ep import wide_ep_candidates
        wide = wide_ep_candidates(c, devices, wl, space, stack, eff_tab, usable_fraction, overheads,
                                  embeddings_16bit, links, profiles)
        raw = {k: np.concatenate([v, np.asarray(wide[k], dtype=v.dtype)]) for k, v in raw.items()}
    return _rank(raw, wl, devices, space, notes)


def _rank(raw: dict, wl: Workload, devices, space: SearchSpace, notes: list) -> PlanResult:
    """Costs, verdicts and the ranking of every candidate from its figures `raw` (one array per figure)."""
    g, tp, B, price, peak = raw["gpus"], raw["tp"], raw["batch_cap"], raw["price"], raw["peak"]
    needed, usable, base, viable = raw["per_gpu_needed_bytes"], raw["usable_bytes"], raw["base"], raw["viable"]
    pre_mean, pre_p99 = raw["prefill_ms"], raw["prefill_p99_ms"]
    mem_ms, comp_ms, comm_ms = raw["decode_memory_ms"], raw["decode_compute_ms"], raw["decode_comm_ms"]
    tpot, ttft, in_flight = raw["tpot_ms"], raw["ttft_p99_ms"], raw["in_flight"]
    stable, rho = raw["stable"], raw["slot_utilisation"]
    prefill_share = raw["prefill_budget_utilisation"]
    usd_per_m = g * price / (wl.requests_per_s * (wl.prompt_tokens + wl.output_tokens) * 3600.0) * 1e6
    with np.errstate(invalid="ignore"):             # inf / inf: a candidate never costed (its share is moot)
        gpu_s_out = np.where(np.isfinite(tpot), wl.output_tokens * tpot / np.maximum(in_flight, 1.0), np.inf)
        pre_share = np.where(pre_mean + gpu_s_out > 0, pre_mean / (pre_mean + gpu_s_out), 0)
    usd_in = usd_per_m * (wl.prompt_tokens + wl.output_tokens) * pre_share / wl.prompt_tokens
    usd_out = usd_per_m * (wl.prompt_tokens + wl.output_tokens) * (1 - pre_share) / wl.output_tokens
    wait_ms = raw["wait_p99_ms"]

    # ---- verdicts (ITL: the mean token gap AT THE LOAD, prefill share included; TTFT: its p99 at the load)
    mem_r, itl_r, ttft_r = needed / usable, tpot / wl.itl_ms, ttft / wl.ttft_p99_ms
    conc_r = rho
    ok = {"mesh": raw["mesh_ok"], "precision": ~np.isnan(peak), "memory": mem_r <= 1,
          "utilisation": ~base | raw["step_stable"], "concurrency": ~base | (conc_r < 1),
          "itl": itl_r <= 1, "ttft": ttft_r <= 1, "no price": ~np.isnan(price)}
    feasible = np.logical_and.reduce(list(ok.values())) & viable & stable & ~np.isnan(price)
    code = np.zeros(len(tp), dtype=np.int8)              # index into REASONS; the first failing check wins
    names = list(ok)
    for name in reversed(names):
        code[~ok[name]] = REASONS.index(name)
    reason = np.array(REASONS, dtype=object)[code]
    k = {n: i for i, n in enumerate(CONSTRAINTS)}         # constraint codes, named once at the end
    itl_kind = np.where(comm_ms >= np.maximum(mem_ms, comp_ms), k["communication"],
                        np.where(mem_ms >= comp_ms, k["bandwidth"], k["compute"]))
    ttft_kind = np.where(wait_ms > pre_p99, k["queueing"], k["compute"])
    ratios = np.stack([mem_r, itl_r, ttft_r, prefill_share, conc_r])
    n_all = len(tp)
    kinds = np.stack([np.full(n_all, k["memory"]), itl_kind, ttft_kind, np.full(n_all, k["queueing"]),
                      np.full(n_all, k["queueing"])])
    ratios_clean = np.where(np.isfinite(ratios), ratios, np.inf)
    which = np.argmax(ratios_clean, axis=0)
    label = np.array(CONSTRAINTS, dtype=object)
    binding = label[kinds[which, np.arange(n_all)]]
    worst = ratios_clean[which, np.arange(n_all)]
    itl_kind, ttft_kind = label[itl_kind], label[ttft_kind]

    cols = dict(device=np.array([dv.name for dv in devices], dtype=object)[raw["di"]], gpus=g, tp=tp, pp=raw["pp"],
                ep=raw["ep"], dp=raw["dp"], replicas=raw["replicas"], batch_cap=B,
                weight_dtype=np.array(space.weight_dtypes, dtype=object)[raw["wdi"]],
                kv_dtype=np.array(space.kv_dtypes, dtype=object)[raw["kdi"]],
                per_gpu_weight_bytes=raw["per_gpu_weight_bytes"], per_gpu_kv_bytes=raw["per_gpu_kv_bytes"],
                per_gpu_needed_bytes=needed, usable_bytes=usable, itl_ms=raw["itl_ms"], prefill_ms=pre_mean,
                ttft_p99_ms=ttft, ttft_p50_ms=raw["ttft_p50_ms"], utilisation=rho,
                concurrency_per_replica=in_flight, itl_at_load_ms=tpot, itl_p99_at_load_ms=raw["itl_p99_ms"],
                step_ms_at_load=raw["step_ms"], rank_wait_ms=raw["rank_wait_ms"], prefill_share=prefill_share,
                usd_per_million_tokens=usd_per_m, usd_per_million_input_tokens=usd_in,
                usd_per_million_output_tokens=usd_out, feasible=feasible, binding=binding, worst_ratio=worst,
                reason=reason, itl_kind=itl_kind, ttft_kind=ttft_kind)
    idx = np.flatnonzero(feasible)
    order = idx[np.lexsort((worst[idx], usd_per_m[idx]))]      # ties in cost: the most headroom first
    counts = {r: int(np.sum(reason == r)) for r in REASONS if r != "feasible"}
    if not np.isfinite(price).any():
        notes.append("no chosen device has an hourly price: enter one")
    return PlanResult(columns=cols, feasible_order=order, reasons=counts, notes=notes, workload=wl)


def _unique_rows(*cols):
    """The distinct rows of equal-length columns and each element's row (np.unique(axis=0) without sorting
    floats row by row: each column is coded by its own 1-D unique, then the codes are combined into one integer)."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    values = []
    for col in cols:
        v, i = np.unique(np.asarray(col), return_inverse=True)
        code = code * len(v) + i.ravel()
        values.append(v)
    u, inv = np.unique(code, return_inverse=True)
    per_col = []
    for v in reversed(values):                   # the combined code read back, last column first
        u, i = np.divmod(u, len(v))
        per_col.append(v[i])
    return list(zip(*reversed(per_col))), inv.ravel()


def _eff_or_none(stack: Stack, device: Device, weight_dtype: str, config: ModelConfig) -> Efficiency | None:
    """The stack's efficiency for this device, weight format and model (None where the format does not run
    there)."""
    try:
        return Efficiency.for_stack(stack, device, weight_dtype, config)
    except SpecError:
        return None


def _comm_table(di, tp, links, stack: Stack, hidden: int, profiles=None):
    """Per (device, TP) group: the all-reduce pair of one layer (after attention and after the FFN) for each
    tokens count of TOKEN_GRID, in ms (`collectives.allreduce_ms`, the stack's algorithm), then the same groups
    priced from the device's profile where it measured all-reduces (`measured_step.measured_allreduce_ms`; the
    closed form's row again where not). Returns (group index per candidate, table [2 · groups, T]): a candidate
    priced from measured kernels reads row group + groups."""
    width = int(np.max(tp)) + 1
    uniq, inv = np.unique(di * width + tp, return_inverse=True)     # (device, TP) coded as one integer
    message = TOKEN_GRID * hidden * 2.0
    closed, measured = [], []
    for d, t in zip(uniq // width, uniq % width):
        d, t = int(d), int(t)
        if t == 1 or links[d] is None:
            closed.append(np.zeros(len(TOKEN_GRID)))
            measured.append(closed[-1])
            continue
        closed.append(np.array([2 * collective_ms(b, t, links[d], stack) for b in message]))
        m = None if profiles is None or profiles[d] is None else measured_allreduce_ms(profiles[d], links[d],
                                                                                        message, t)
        measured.append(closed[-1] if m is None else 2 * np.asarray(m, dtype=float))
    return inv.ravel(), np.array(closed + measured)


def _loaded(c: ModelConfig, wl: Workload, S: dict, devices, stack: Stack, viable, lam, B, a: dict,
            meas: dict | None = None) -> dict:
    """The steady state of every viable candidate at its per-replica rate (`calculators.serving.steady_state`),
    on the candidate's mixed step (`_MixedStep`): the same cost as `step.step_cost` with the planner's arrays.
    Screened first with prompts per step drawn independently; the prompt chain is run on the candidates near the
    targets. Non-viable candidates get inf."""
    n_all = len(B)
    out = no_steady_state(n_all)
    ctx = decode_context(wl.prompt_lengths(), wl.output_lengths())
    kv_scale = ctx / S["mean_ctx"]
    new_tok = wl.new_prompt_tokens(wl.prompt_tokens)
    dec_w = S["decode_flops_per_row"]["weights"]
    dec_a = S["decode_flops_per_row"]["attention"] * kv_scale       # attention grows with the context, as KV does
    f_tok = S["prefill_flops"][wl.prompt_tokens]["weights"] / new_tok
    a_tok = S["prefill_flops"][wl.prompt_tokens]["attention"] / new_tok
    e_tok = (c.num_experts_per_tok * 2 * expert_params(c) * arch.moe_layer_count(c)) if arch.is_moe(c) else 0.0
    groups, comm_tab = a["comm_table"]
    shared = dict(_token_tables(c, a["ep"][viable]), comm_flat=comm_tab.ravel(), ctx=ctx,
                  meas=None if meas is None else dict(flat=meas["flat"]), prompt_len=float(wl.prompt_tokens))
    for d, dev in enumerate(devices):
        sel = np.flatnonzero(viable & (a["di"] == d))
        if not len(sel):
            continue
        v = _columns({k: x for k, x in a.items() if k != "comm_table"}, sel)
        # the step's per-candidate constants, once (ms per row / per prompt token at MFU 1; ms per byte-row)
        to_w, to_a = v["share"] / v["tpf"] / v["peak"] * 1e3, v["share"] / v["tpf"] / v["peak_att"] * 1e3
        v.update(cw_row=dec_w * to_w, cw_tok=f_tok * to_w, cx=e_tok * to_w, ca_row=dec_a * to_a, ca_tok=a_tok * to_a,
                 mw=v["w_gpu"] / (v["bw"] * v["mbu"]) * 1e3, mk=v["kv_row"] * kv_scale / (v["bw"] * v["mbu"]) * 1e3,
                 p2p_row=np.where(v["pp"] > 1, c.hidden_size * 2.0 / v["lbw"] * 1e3, 0.0),
                 p2p_0=np.where(v["pp"] > 1, v["a01"] * 1e3, 0.0), ppf=v["pp"].astype(float), half_on=v["half"] > 0,
                 comm_at=(groups[sel] + v["meas_on"] * (len(comm_tab) // 2)) * comm_tab.shape[1])

        def step_for(idx, v=v):
            """The step of candidates `idx`, with its `ms_per_context_token` (the slot wait's dispersion)."""
            return _MixedStep(_columns(v, idx), shared)
        st = screened_steady_state(step_for, wl, lam[sel], B[sel].astype(float), a["gpus"][sel], stack, dev)
        for k2 in out:
            out[k2][sel] = st[k2]
    return out


def _token_tables(c: ModelConfig, ep) -> dict:
    """What the step reads on the log token grid, once per search: the share of the weights a step of t tokens
    reads (an MoE model's experts touched; None for a dense model) and the busiest EP rank's routing imbalance per
    EP degree > 1 in `ep`."""
    lg = np.log(TOKEN_GRID)
    tabs = dict(lg=lg, positions=np.arange(len(lg), dtype=float), weights_read=None, imbalance={})
    if arch.is_moe(c):
        full = step_weight_bytes(c, "bf16", rows=1 << 30)
        tabs["weights_read"] = np.array([step_weight_bytes(c, "bf16", rows=int(t)) / full for t in TOKEN_GRID])
        tabs["imbalance"] = {int(e): np.array([routing_imbalance(t, c.num_experts, c.num_experts_per_tok, int(e))
                                               for t in TOKEN_GRID]) for e in np.unique(ep) if e != 1}
    return tabs


def _columns(v: dict, idx) -> dict:
    """The candidates `idx` of the per-candidate arrays in `v` (what is not one value per candidate kept whole)."""
    n = len(v["layout"])
    return {k: (x[idx] if isinstance(x, np.ndarray) and x.shape == (n,) else x) for k, x in v.items()}


class _MixedStep:
    """The mixed step of some candidates (one device), step(n decode rows, p prompt tokens) -> ms, with the
    planner's arrays: per-candidate constants `v` and the token-grid tables `shared` (`_token_tables`, the
    all-reduce pairs flattened). The same cost as `step.mixed_step`; arrays broadcast over the candidates.
    Candidates of one layout (they differ only in their batch cap, which no step depends on) are asked the same
    (n, p) by the fixed point: the step is then computed once per layout (`distinct`)."""

    def __init__(self, v: dict, shared: dict):
        self.v, self.s = v, shared
        first, self.col = np.unique(v["layout"], return_index=True, return_inverse=True)[1:]
        self.rep = first
        self.distinct = _MixedStep(_columns(v, first), shared) if len(first) < len(v["layout"]) else None
        self.overlap_any = bool(np.any(v["overlap"]))
        self.pipelined = bool(np.any(v["pp"] > 1))
        self.imbalance = {e: tab for e, tab in shared["imbalance"].items() if np.any(v["ep"] == e)}
        flat, width = shared["comm_flat"], len(shared["lg"])
        self.has_comm = bool(np.any(flat[v["comm_at"][:, None] + np.arange(width)])) if len(v["comm_at"]) else False
        self.measured = shared.get("meas") is not None and bool(np.any(v["meas_on"]))

    def microbatch(self, n, p) -> tuple:
        """At (n, p), per microbatch: (microbatches m, rows, prompt tokens, tokens, log(tokens ≥ 1), the MFU at
        them, the KV read's ms, attention's FLOPs' ms)."""
        v = self.v
        n, p, _ = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(p, dtype=float), v["ppf"])
        m = np.maximum(n, 1.0)
        np.minimum(m, v["ppf"], out=m)
        rows, pm = n / m, p / m
        tok = n + p
        tok /= m
        t1 = np.maximum(tok, 1.0)
        mfu_t = t1 + v["half"]
        np.divide(t1, mfu_t, out=mfu_t)
        mfu_t = np.where(v["half_on"], mfu_t, 1.0)
        mfu_t *= v["mfu"]
        att_ms = v["ca_row"] * rows
        att_ms += v["ca_tok"] * pm
        att_ms /= mfu_t
        return m, rows, pm, tok, np.log(t1, out=t1), mfu_t, v["mk"] * rows, att_ms

    def comm_ms(self, log_tokens):
        """The candidate's all-reduce pair per layer at exp(log_tokens): linear in log tokens on its table."""
        pos = np.interp(log_tokens, self.s["lg"], self.s["positions"])
        i0 = pos.astype(np.intp)
        np.minimum(i0, len(self.s["lg"]) - 2, out=i0)
        f = pos - i0
        i0 += self.v["comm_at"]
        lo = self.s["comm_flat"].take(i0)
        i0 += 1
        hi = self.s["comm_flat"].take(i0)
        lo *= 1 - f
        hi *= f
        lo += hi
        return lo

    def stage(self, n, p) -> tuple:
        """One microbatch's stage at (n, p): (microbatches m, rows, the GPU's ms with the step's fixed cost, the
        host's per-sequence ms)."""
        v = self.v
        m, rows, pm, tok, lt, mfu_t, kv_ms, att_ms = self.microbatch(n, p)
        tab = self.s["weights_read"]
        mem_w = v["mw"] * np.interp(lt, self.s["lg"], tab) if tab is not None else v["mw"]
        comp_w = v["cw_row"] * rows
        comp_w += v["cw_tok"] * pm
        if self.imbalance:
            imb = np.ones_like(tok)
            for e, tab in self.imbalance.items():
                imb = np.where(v["ep"] == e, np.interp(lt, self.s["lg"], tab), imb)
            imb -= 1
            imb *= tok
            imb *= v["cx"]
            comp_w += imb
        comp_w /= mfu_t
        gpu_ms = np.maximum(mem_w, comp_w)
        gpu_ms += np.maximum(kv_ms, att_ms)
        if self.measured:
            at = np.broadcast_to(v["meas_at"], tok.shape)
            gpu_ms = np.where(v["meas_on"], measured_gpu_ms(dict(at=at, flat=self.s["meas"]["flat"]), rows, pm, tok,
                                                            self.s["prompt_len"]), gpu_ms)
        if self.has_comm:
            comm = self.comm_ms(lt)
            comm *= v["stage"]
            gpu_ms += comm
        gpu_ms += v["overhead"]
        return m, rows, gpu_ms, rows * v["seq_over"]

    def by_layout(self, f, n, p):
        """f(step, n, p) on one candidate per layout, spread back, where every candidate is asked what its layout's
        first is (checked); else f on all."""
        if self.distinct is not None:
            n, p, _ = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(p, dtype=float), self.v["ppf"])
            nd, pd = n.take(self.rep, axis=-1), p.take(self.rep, axis=-1)
            if np.array_equal(nd.take(self.col, axis=-1), n) and np.array_equal(pd.take(self.col, axis=-1), p):
                return f(self.distinct, nd, pd).take(self.col, axis=-1)      # C order, as computed on all
        return f(self, n, p)

    def __call__(self, n, p):
        """The step's ms at n decode rows and p prompt tokens (`step_ms`, once per layout where it can)."""
        return self.by_layout(_MixedStep.step_ms, n, p)

    def step_ms(self, n, p):
        """The step's ms at n decode rows and p prompt tokens: max(m, pp) stages, the host's work added or
        overlapped, and the pipeline's p2p sends."""
        v = self.v
        m, rows, gpu_ms, over_ms = self.stage(n, p)
        if self.overlap_any:
            stage_ms = stage_with_host(gpu_ms, 0.0, over_ms, v["overlap"])
        else:
            stage_ms = gpu_ms
            stage_ms += over_ms
        out = np.maximum(m, v["ppf"])
        out *= stage_ms
        if self.pipelined:                # the stage's activation of every token of the microbatch (`step.p2p_ms`)
            tok = (np.asarray(n, dtype=float) + np.asarray(p, dtype=float)) / m
            p2p = tok * v["p2p_row"]
            p2p += v["p2p_0"]
            p2p *= v["ppf"] - 1
            out += p2p
        return out

    def ms_per_context_token(self, n, p):
        """`context_slope` of the step (once per layout where it can)."""
        return self.by_layout(_MixedStep.context_slope, n, p)

    def context_slope(self, n, p):
        """`serve_at.context_slope` on this step: its KV read and attention scale with the context (kv_scale), so
        one more position costs a row mk/ctx, or ca_row/ctx at the MFU."""
        v, ctx = self.v, self.s["ctx"]
        m, _, _, _, _, mfu_t, kv_ms, att_ms = self.microbatch(n, p)
        hidden = False
        if self.overlap_any:
            _, _, gpu_ms, over_ms = self.stage(n, p)
            hidden = v["overlap"] & (over_ms > gpu_ms)
        return context_slope(np.maximum(m, v["pp"]), m, kv_ms >= att_ms, v["mk"] / ctx, v["ca_row"] / ctx / mfu_t,
                             hidden)


def _sentence(col: dict, i: int, wl: Workload) -> str:
    """Why candidate i passes or fails, in one sentence (built only for rows that are shown)."""
    r = col["reason"][i]
    if r == "feasible":
        return f"meets every target; binding: {col['binding'][i]} ({col['worst_ratio'][i]:.0%} of its limit)"
    if r == "precision":
        return "the device has no FP4 tensor cores: FP4 weights run only where they are native"
    if r == "mesh":
        return "TP × PP does not divide the GPU count or the model's heads/layers, or no interconnect"
    if r == "memory":
        return (f"memory: needs {col['per_gpu_needed_bytes'][i] / 1e9:.1f} GB per GPU, "
                f"{col['usable_bytes'][i] / 1e9:.1f} GB usable")
    if r == "itl":
        return (f"ITL at the load {col['itl_at_load_ms'][i]:.2f} ms > target {wl.itl_ms:g} ms (decode alone at the "
                f"cap: {col['itl_ms'][i]:.2f} ms, {col['itl_kind'][i]}-bound)")
    if r == "ttft":
        return (f"TTFT p99 {col['ttft_p99_ms'][i]:.0f} ms > target {wl.ttft_p99_ms:g} ms "
                f"({col['ttft_kind'][i]})")
    if r == "utilisation":
        return ("queueing: the rate exceeds what the replicas serve (the steps would grow without bound, or the "
                "prompts exceed the prefill token budget)")
    if r == "concurrency":
        return (f"queueing: needs {col['concurrency_per_replica'][i]:.0f} sequences in flight per replica, "
                f"batch cap {col['batch_cap'][i]}")
    return "no hourly price for this device: enter one"


def server_instances(row: dict) -> int:
    """Server instances (copies of the model) a plan row runs: its replicas, where a wide-EP row counts attention
    replicas, dp of them to an instance."""
    return int(row.get("replicas", 1)) // max(int(row.get("dp", 1)), 1)


def layout_words(row: dict) -> str:
    """A plan's layout in a few words: "TP 8 PP 1", "TP 4 PP 1 EP 4" (experts over the TP group), "TP 1 × DP 8
    attention, EP 8" (experts over all the GPUs), "2 × (TP 1 × DP 8 attention, EP 8)" (two EP groups side by
    side)."""
    dp, ep = int(row.get("dp", 1)), int(row.get("ep", 1))
    if dp > 1:
        groups = server_instances(row)
        one = f"TP {row['tp']} × DP {dp} attention, EP {ep}"
        return one if groups <= 1 else f"{groups} × ({one})"
    return f"TP {row['tp']} PP {row['pp']}" + (f" EP {ep}" if ep > 1 else "")


def plan_rows(res: PlanResult, top: int = 20) -> list[dict]:
    """Ranked feasible plans as plain dicts with the columns a reader needs (JSON/CSV export)."""
    keep = ("device", "gpus", "tp", "pp", "ep", "dp", "replicas", "batch_cap", "weight_dtype", "kv_dtype", "per_gpu_weight_bytes",
            "per_gpu_kv_bytes", "per_gpu_needed_bytes", "usable_bytes", "prefill_ms", "ttft_p50_ms", "ttft_p99_ms",
            "itl_ms", "itl_at_load_ms", "itl_p99_at_load_ms", "step_ms_at_load", "rank_wait_ms", "concurrency_per_replica", "utilisation", "usd_per_million_tokens", "usd_per_million_input_tokens", "usd_per_million_output_tokens",
            "binding", "worst_ratio", "why")
    return [{k: r[k] for k in keep} for r in res.ranked(top)]


def rejected_rows(res: PlanResult, top: int = 50) -> list[dict]:
    keep = ("device", "gpus", "tp", "pp", "ep", "dp", "replicas", "batch_cap", "weight_dtype", "kv_dtype", "reason",
            "why")
    return [{k: r[k] for k in keep} for r in res.rejected(top)]


__all__ = ["Workload", "SearchSpace", "PlanResult", "plan", "plan_rows", "rejected_rows", "layout_words", "server_instances",
           "CONSTRAINTS"]
