"""A device profile's curves, for a lesson: the efficiency (datasheet roofline ÷ measured time) of a model's own
weight GEMMs by tokens per step, of its decode attention by context at a few batch sizes, and of the all-reduce by
message size, each point marked where it lies past the measured table; and the sentences that read them.

    efficiency = roofline ms / measured ms       (`calculators.sizing.measured_ops`: the roofline is
                                                  max(FLOPs / peak, bytes / bandwidth) of the datasheet)

A point is "compute-bound" where the roofline's FLOP term is the larger one: there the efficiency is the fraction
of peak FLOP/s reached; elsewhere it is the fraction of the datasheet bandwidth (for an all-reduce: of the link's
ring bound, 2(n − 1)/n × the message over one direction of the link).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calculators import arch
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.measured_step import (attention_shape, decode_attention_op, gemm_dtype, kernel_format,
                                                layer_gemms, lm_head_dtype, moe_shape)
from calculators.sizing.measured_ops import allreduce_ms, gemm_ms, moe_ms, peak_flops, ring_collective_ms
from calculators.units import fmt_num
from specs.devices import Device
from specs.model_config import ModelConfig

TOKEN_GRID = 2.0 ** np.arange(15)                 # tokens per step: 1 … 16,384
CONTEXT_GRID = 2.0 ** np.arange(10, 18)           # cached positions: 1,024 … 131,072
ATTENTION_BATCHES = (1, 32, 256)
MESSAGE_GRID = 2.0 ** np.arange(10, 31)           # all-reduce messages: 1 KiB … 1 GiB
ALLREDUCE_GPUS = (2, 4, 8)


@dataclass(frozen=True)
class Curve:
    """One op swept along one size `x`: roofline and measured ms, and per point whether it lies past the measured
    table (`extrapolated`) and whether the roofline there is the FLOP term (`compute_bound`)."""
    label: str
    x: np.ndarray
    ideal_ms: np.ndarray
    ms: np.ndarray
    extrapolated: np.ndarray
    compute_bound: np.ndarray
    shape: str = ""
    note: str = ""

    @property
    def efficiency(self) -> np.ndarray:
        return self.ideal_ms / self.ms


def _flop_bound(flops, ideal_ms, peak: float) -> np.ndarray:
    """Whether the roofline is its FLOP term: FLOPs / peak is (to rounding) the roofline itself."""
    return np.asarray(flops, dtype=float) / peak * 1e3 >= np.asarray(ideal_ms) * (1 - 1e-9)


def gemm_curves(profile, device: Device, config: ModelConfig, tp: int = 1, weight_dtype: str = "bf16",
                tokens=TOKEN_GRID) -> list[Curve]:
    """The model's weight GEMMs on one GPU of TP `tp` (`measured_step.layer_gemms`: qkv, o, gate + up, down, ...),
    the fused MoE when it has one, and the LM head, each at m = `tokens` tokens per step."""
    wd = kernel_format(config, weight_dtype)
    m = np.asarray(tokens, dtype=float)
    mesh = Mesh(tp=tp)
    head = lm_head_dtype(wd)
    shapes = [(name, n, k, gemm_dtype(name, wd)) for name, n, k, _ in layer_gemms(config, mesh)]
    shapes.append(("LM head", max(1, config.vocab_size // tp), config.hidden_size, head))
    out = []
    for name, n, k, dtype in shapes:
        ideal, ms, past = gemm_ms(profile, device, m, n, k, dtype)
        note = gemm_ms(profile, device, 1.0, n, k, dtype).note
        out.append(Curve(name, m, ideal, ms, past, _flop_bound(2.0 * m * n * k, ideal, peak_flops(device, dtype)),
                         f"{k:,} × {n:,} ({dtype})", note))
    moe = moe_shape(config, mesh)
    if moe:
        moe.pop("layers")
        ideal, ms, past = moe_ms(profile, device, m, dtype=wd, **moe)
        out.insert(len(out) - 1, Curve("routed experts (fused MoE)", m, ideal, ms, past, np.zeros_like(past),
                                       f"{moe['experts']} experts top-{moe['topk']}, TP {moe['tp']} × EP {moe['ep']}"))
    return out


def decode_attention_curves(profile, device: Device, config: ModelConfig, tp: int = 1, kv_dtype: str = "bf16",
                            batches=ATTENTION_BATCHES, contexts=CONTEXT_GRID) -> list[Curve]:
    """One layer's decode attention on one GPU of TP `tp` (heads / tp), one curve per batch size, along the
    context each row reads (MLA's from the profile's MLA table: `measured_step.decode_attention_op`)."""
    mesh = Mesh(tp=tp)
    h = max(1, config.num_heads // tp)
    b = np.asarray(batches, dtype=float)
    ctx = np.asarray(contexts, dtype=float)
    ideal, ms, past = (np.zeros((len(b), len(ctx))) for _ in range(3))
    note = ""
    for j, c in enumerate(ctx):
        ideal[:, j], ms[:, j], past[:, j] = decode_attention_op(profile, device, config, mesh, b, c, kv_dtype)
        note = note or decode_attention_op(profile, device, config, mesh, 1.0, c, kv_dtype).note
    per_position = 2.0 * h * (2 * config.kv_lora_rank + config.qk_rope_head_dim) if arch.is_mla(config) else \
        4.0 * h * config.head_dim                       # FLOPs per cached position a row reads
    bound = _flop_bound(per_position * b[:, None] * ctx[None, :], ideal, peak_flops(device, "bf16"))
    shape = attention_shape(config, mesh) + ("" if arch.is_mla(config) else f", head dim {config.head_dim}")
    return [Curve(f"batch {int(bi):,}", ctx, ideal[i], ms[i], past[i].astype(bool), bound[i],
                  f"{shape}, {kv_dtype} KV", note)
            for i, bi in enumerate(b)]


def allreduce_curves(profile, device: Device, gpus=ALLREDUCE_GPUS, sizes=MESSAGE_GRID) -> list[Curve]:
    """The all-reduce of each message size over each GPU count the profile measured, against the ring bound of
    the device's own link; [] where the profile has no all-reduce table or the device no peer link."""
    link = device.interconnect_bytes_per_s
    if not link or "allreduce" not in getattr(profile, "tables", {}):
        return []
    have = set(np.asarray(profile.tables["allreduce"]["gpus"]).astype(int).tolist())
    s = np.asarray(sizes, dtype=float)
    out = []
    for g in gpus:
        priced = allreduce_ms(profile, link, s, g) if g in have else None
        if priced is not None:
            ideal, ms, past = priced
            out.append(Curve(f"{g} GPUs", s, ideal, ms, past, np.zeros_like(past), f"{g} GPUs"))
    return out


def gather_scatter_curves(profile, device: Device, sizes=MESSAGE_GRID) -> list[Curve]:
    """The all-gather and the reduce-scatter of each buffer size (the whole gathered or reduced buffer) on the
    most GPUs the profile measured, against the ring's wire time on the device's own link
    (`measured_ops.ring_collective_ms`); [] where the profile has neither table or the device no peer link."""
    link = device.interconnect_bytes_per_s
    tables = getattr(profile, "tables", {})
    if not link:
        return []
    s = np.asarray(sizes, dtype=float)
    out = []
    for table, label in (("allgather", "all-gather"), ("reduce_scatter", "reduce-scatter")):
        if table not in tables:
            continue
        g = int(max(np.asarray(tables[table]["gpus"], dtype=float)))
        priced = ring_collective_ms(profile, table, link, s, g)
        if priced is not None:
            ideal, ms, past = priced
            out.append(Curve(f"{label}, {g} GPUs", s, ideal, ms, past, np.zeros_like(past), f"{g} GPUs"))
    return out


def a2a_curves(profile, device: Device, config: ModelConfig, weight_dtype: str = "bf16",
               tokens=TOKEN_GRID) -> list[Curve]:
    """Wide EP's dispatch and combine of one MoE layer (DeepEP, the faster backend at each size) by tokens per GPU,
    on each EP size the profile measured, against the device's one-way link roofline (`measured_ops.moe_a2a_ms`:
    each token sent once to each distinct remote GPU holding one of its experts); [] for a dense model, a device
    without a peer link, or a profile without the table."""
    from calculators.planning.measured_step import dispatch_format
    from calculators.sizing.measured_ops import moe_a2a_ms
    link = device.interconnect_bytes_per_s
    table = getattr(profile, "tables", {}).get("moe_a2a")
    if not config.num_experts or not link or not table:
        return []
    t = np.asarray(tokens, dtype=float)
    shape = dict(hidden=config.hidden_size, topk=config.num_experts_per_tok, experts=config.num_experts)
    out = []
    for ep in sorted({int(e) for e in np.asarray(table["ep"], dtype=float)}):
        if config.num_experts % ep:
            continue
        for phase, dtype in (("dispatch", dispatch_format(weight_dtype)), ("combine", "bfloat16")):
            priced = moe_a2a_ms(profile, link, t, phase=phase, dtype=dtype, ep=ep, **shape)
            if priced is not None:
                ideal, ms, past = priced
                out.append(Curve(f"{phase}, EP {ep} ({dtype})", t, ideal, ms, past, np.zeros_like(past),
                                 f"{config.hidden_size:,} values a token, top-{config.num_experts_per_tok} of "
                                 f"{config.num_experts} experts"))
    return out


# ------------------------------------------------------------------------------------------- sentences
def pct(x: float) -> str:
    """0.56 -> "56%", 0.004 -> "0.4%" (a small share keeps a digit instead of reading "0%")."""
    return f"{100 * x:.0f}%" if 100 * x >= 0.95 else f"{100 * x:.1g}%"


def tokens_text(n: float) -> str:
    n = int(n)
    return f"{n:,} token" + ("" if n == 1 else "s")


def gemm_caption(c: Curve) -> str:
    """What one GEMM curve says: its efficiency at the fewest tokens (bandwidth-bound there), then where its
    roofline turns compute-bound and the fraction of peak FLOP/s it reaches past that, or that it never does."""
    eff, x, cb = c.efficiency, c.x, np.asarray(c.compute_bound, dtype=bool)
    trusted = ~np.asarray(c.extrapolated, dtype=bool)
    if cb[0]:
        head = f"At {tokens_text(x[0])} the {c.label} GEMM is already compute-bound, at {pct(eff[0])} of peak FLOP/s"
    else:
        head = f"At {tokens_text(x[0])} the {c.label} GEMM streams its weights at {pct(eff[0])} of the datasheet " \
               "bandwidth"
    if not cb.any():
        best = int(np.argmax(eff))
        tail = f"; up to {tokens_text(x[-1])} it stays bandwidth-bound, at best {pct(eff[best])} (at " \
               f"{tokens_text(x[best])})"
    elif cb[0]:
        best = int(np.argmax(eff))
        tail = f"; its best is {pct(eff[best])} at {tokens_text(x[best])}"
    else:
        turn = int(np.argmax(cb))
        pool = cb & trusted if (cb & trusted).any() else cb
        top = float(eff[pool].max())
        near = int(np.argmax(pool & (eff >= top - 0.05)))        # where it first comes within 5 points of its best
        reach = " and reaches" if near == turn else f", and from {tokens_text(x[near])} it reaches"
        tail = f"; from {tokens_text(x[turn])} it is compute-bound{reach} {pct(top)} of peak FLOP/s"
    past = "" if not np.asarray(c.extrapolated).all() else \
        " (every point lies past the measured table: the edge's efficiency, held)"
    return head + tail + past + "."


def over_roofline_caption(curves: list[Curve]) -> str:
    """A sentence for each curve that passes 100% of its roofline (the fused MoE, whose roofline reads the experts
    uniformly random routing touches while the table was measured with a skewed router), else ""."""
    out = []
    for c in curves:
        i = int(np.argmax(c.efficiency))
        if c.efficiency[i] <= 1.0:
            continue
        why = ("its roofline reads the experts that uniformly random routing touches, E·(1 − (1 − k/E)^t), and the "
               "table was measured with a skewed router (aiconfigurator's default, a power law of exponent 1.01), "
               "under which the same tokens touch fewer experts, so fewer weights are read"
               if c.label.startswith("routed experts") else
               "the measured kernel moves less than the roofline counts")
        out.append(f"The {c.label} reaches {pct(c.efficiency[i])} of its roofline at {tokens_text(c.x[i])}: {why}.")
    return " ".join(out)


def attention_caption(curves: list[Curve]) -> str:
    """What the decode-attention curves say: the best fraction of the datasheet any batch and context reaches,
    and the smallest step's (the fewest rows at the shortest context), contrasted when it is under half of it."""
    pts = [(float(e), c, float(x), bool(b)) for c in curves
           for e, x, b, ex in zip(c.efficiency, c.x, c.compute_bound, c.extrapolated) if not ex]
    if not pts:
        pts = [(float(e), c, float(x), bool(b)) for c in curves
               for e, x, b in zip(c.efficiency, c.x, c.compute_bound)]
    e, c, x, bound = max(pts, key=lambda p: p[0])
    what = "reaches {} of peak FLOP/s" if bound else "streams the KV cache at {} of the datasheet bandwidth"
    text = f"At {c.label} and {x:,.0f} cached positions decode attention {what.format(pct(e))}"
    small = curves[0]
    e0 = float(small.efficiency[0])
    if c is small and x == float(small.x[0]):
        pass                                             # the smallest step is the best one: nothing to contrast
    elif e0 < 0.5 * e:
        text += f"; at {small.label} and {small.x[0]:,.0f} positions only {pct(e0)}: a step that small is mostly " \
                "the kernel's fixed cost, not streaming"
    else:
        text += f"; even {small.label} at {small.x[0]:,.0f} positions reaches {pct(e0)}"
    if e > 1.0:
        text += ". Above 100% is faster than the datasheet's memory bandwidth allows: the KV cache was read from " \
                "on-chip cache (L2), or the table was measured on terms the roofline does not assume"
    return text + "."


def allreduce_caption(curves: list[Curve], link_name: str, link_bytes_per_s: float) -> str:
    """What the all-reduce curves say, on the most GPUs measured: the smallest message's latency and its share of
    the link's ring bound, and the best share any message reaches (or that none gets past half of it)."""
    from calculators.units import fmt_bytes
    c = curves[-1]
    eff = c.efficiency
    best = int(np.argmax(eff))
    link = f"{link_name} ({fmt_num(link_bytes_per_s / 1e9, 3)} GB/s a direction)"
    text = f"On {c.label} a {fmt_bytes(c.x[0], binary=True)} all-reduce takes {fmt_num(c.ms[0] * 1e3, 3)} µs, " \
           f"{pct(eff[0]) if eff[0] >= 0.01 else 'under 1%'} of what the {link} allows: latency, not bandwidth"
    if eff[best] >= 0.5:
        first = int(np.argmax(eff >= eff[best] - 0.05))
        text += f"; from {fmt_bytes(c.x[first], binary=True)} it reaches {pct(eff[best])} of the link's ring bound"
    else:
        text += f"; no message measured gets past {pct(eff[best])} of the link's ring bound (best at " \
                f"{fmt_bytes(c.x[best], binary=True)})"
    return text + "."


def gather_scatter_caption(curves: list[Curve], link_name: str, stack_name: str, method: str) -> str:
    """What the all-gather / reduce-scatter curves say: each one's time and share of the ring's wire time at a
    16 MiB buffer (or the nearest drawn), and whether `stack_name` exchanges a MoE layer's tokens this way."""
    from calculators.units import fmt_bytes
    at = [int(np.argmin(np.abs(np.log(c.x / float(1 << 24))))) for c in curves]
    parts = [f"the {c.label.split(',')[0]} {fmt_num(c.ms[i] * 1e3, 3)} µs ({pct(c.efficiency[i])} of the ring's "
             f"wire time)" for c, i in zip(curves, at)]
    text = f"A {fmt_bytes(curves[0].x[at[0]], binary=True)} buffer on {curves[0].label.split(', ')[1]} of " \
           f"{link_name}: {' and '.join(parts)}. "
    if method == "allgather_reducescatter":
        return text + (f"{stack_name} moves a wide-EP MoE layer's tokens this way by default (attention "
                       "data-parallel ranks gather the group's tokens, run their experts on all of them and "
                       "reduce-scatter the outputs), and the planner prices that exchange with these.")
    return text + f"{stack_name} is set to DeepEP's all-to-all instead (below)."


def a2a_caption(curves: list[Curve], link_name: str, method: str = "all_to_all") -> str:
    """What the all-to-all curves say: each phase's time and share of the link at 1,024 tokens per GPU (or the
    largest measured below it), the best share either reaches, and whether the planner prices wide EP with them
    (`method`: the stack's `moe_dp_comm`)."""
    at = [int(np.argmin(np.abs(np.log(c.x / 1024.0)))) for c in curves]
    parts = [f"{c.label.split(',')[0]} {fmt_num(c.ms[i] * 1e3, 3)} µs ({pct(c.efficiency[i])} of the link)"
             for c, i in zip(curves, at)]
    best = max(curves, key=lambda c: float(c.efficiency.max()))
    return (f"At {tokens_text(curves[0].x[at[0]])} per GPU one MoE layer's {' and '.join(parts)} on {link_name}; "
            f"the best any size reaches is {pct(float(best.efficiency.max()))} ({best.label.split(' (')[0]}). "
            + ("The planner prices wide EP with these: a dispatch and a combine in every MoE layer." if
               method == "all_to_all" else "DeepEP is opt-in on this stack (its default exchange is the all-gather "
               "and reduce-scatter above), so the planner does not price wide EP with these."))


def borrowed_profiles(stack: str, profiled: list[str]) -> list[dict]:
    """Every device of the datasheet list that no profile measured on `stack` (`profiled`: the devices some
    profile did), and the profiled device whose efficiencies the planner prices it with (`measured_step.
    nearest_profiled`: closest in log bandwidth and log bf16 peak, of its own kind), or the closed form."""
    from calculators.planning.measured_step import nearest_profiled
    from specs.devices import all_devices
    rows = []
    for d in all_devices():
        if d.name in profiled:
            continue
        near = nearest_profiled(d, stack) if profiled else None
        rows.append(dict(device=d.name, kind=d.kind, vendor=d.vendor,
                         priced_with=f"{near.name}'s efficiencies at {d.name}'s roofline" if near else
                         f"the closed form (no {d.kind} measured on {stack})"))
    return rows
