"""What the planner's two searches share (`planner` over TP/PP/EP = TP layouts, `wide_ep` over attention DP with
experts across all the GPUs): the steady state of a device's candidates, screened then refined, the bounds no
load can beat, and the peak a weight format runs at.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from calculators.planning.rank_wait import waiting_step, with_rank_wait
from calculators.serving.steady_state import Load, operating_point
from calculators.sizing.roofline import compute_precision_for
from calculators.units import GiB
from specs.devices import Device
from specs.model_config import SpecError
from specs.stacks import Stack

if TYPE_CHECKING:
    from calculators.planning.plan_workload import Workload

REFINED_LEVELS = 3        # GPU counts per device whose plans get the full steady state (the ranks a reader sees)


def apply_bounds(ld: dict, base, viable, slots_ok, itl_one, pre_p99) -> None:
    """Candidates out on a bound no load can beat (in memory, but not viable): say which, with the bound's own
    number, in the steady state's columns `ld` (changed in place)."""
    bounded = base & ~viable
    ld["tpot_ms"] = np.where(bounded, itl_one, ld["tpot_ms"])
    ld["ttft_p99_ms"] = np.where(bounded, pre_p99, ld["ttft_p99_ms"])
    ld["slot_utilisation"] = np.where(bounded & ~slots_ok, np.inf, np.where(bounded, 0.0, ld["slot_utilisation"]))
    ld["step_stable"] = np.where(bounded, True, ld["step_stable"])
    ld["prefill_budget_utilisation"] = np.where(bounded, 0.0, ld["prefill_budget_utilisation"])


def peak_or_nan(device: Device, weight_dtype: str) -> float:
    """The device's peak FLOP/s for the weights' compute precision; NaN where it has no such tensor cores (FP4
    weights on a device without FP4: refused, never upcast)."""
    try:
        return device.flops_for(compute_precision_for(weight_dtype))[0]
    except SpecError:
        return np.nan


def no_steady_state(n: int) -> dict:
    """The steady-state columns of `n` candidates not (yet) solved: inf, unstable."""
    out = {k: np.full(n, np.inf) for k in STEADY_STATE + ("wait_p99_ms", "rank_wait_ms")}
    out["stable"], out["step_stable"] = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    return out


STEADY_STATE = ("tpot_ms", "ttft_p99_ms", "ttft_p50_ms", "itl_p99_ms", "step_ms", "in_flight", "slot_utilisation",
                "prefill_budget_utilisation")


def screened_steady_state(step_for, wl: Workload, lam, slots, cost, stack: Stack, device: Device,
                          ranks=None, share: float = 1.0) -> dict:
    """The steady state of candidates (one device) at their per-replica rates `lam`: screened with prompts per step
    drawn independently, then the prompt chain on those near the targets at the cheapest REFINED_LEVELS costs.
    `step_for(idx)` is the vectorised step of the candidates `idx`; the prompt budget per step is the stack's
    max batched tokens on `device`. `ranks`: each candidate's attention-DP ranks per EP group (None: 1), whose
    steps wait for the busiest rank's prompts (`rank_wait`, with `share` its FLOPs share of a prompt), as
    `serve_at`'s do. Returns the planner's steady-state columns."""
    chunk = float(stack.scheduler_limits(device.memory_bytes / GiB, device.name)[1])
    prompt, output = wl.prompt_lengths(new_only=True), wl.output_lengths()
    load = Load(prompt, output, chunk=chunk, slots=slots)

    every = step_for(np.arange(len(lam)))
    if ranks is not None:                        # attention DP: each step waits for the busiest rank's prompts
        every = with_rank_wait(every, np.asarray(ranks, dtype=float), share, prompt.mean_tokens, load.decode_tokens,
                               chunk, float(np.max(slots)))

    def stepped(idx):                            # a subset of the candidates: the wait's table rows already made
        step = step_for(idx)
        return waiting_step(step, every.table[idx], every.log_rows) if hasattr(every, "table") else step
    op = operating_point(every, lam, load, chain=False)
    near = op["stable"] & (op["tpot_ms"] <= 1.25 * wl.itl_ms) & (op["ttft_p99_ms"] <= 2.0 * wl.ttft_p99_ms)
    levels = np.unique(cost[near])
    near &= cost <= (levels[min(REFINED_LEVELS, len(levels)) - 1] if len(levels) else 0)
    if near.any():
        keep = np.flatnonzero(near)
        op2 = operating_point(stepped(keep), lam[keep], Load(prompt, output, chunk=chunk, slots=slots[keep]),
                              near_step_ms=op["step_ms"][keep])
        for k2 in op:
            op[k2] = np.array(op[k2], dtype=np.asarray(op2[k2]).dtype, copy=True)
            op[k2][keep] = op2[k2]
    waited = np.zeros(len(lam))
    if hasattr(every, "rank_wait"):                      # attention DP: the busiest rank's wait in each step
        waited = np.where(op["stable"], every.rank_wait(np.where(op["stable"], op["decode_rows"], 0.0)), np.inf)
    return dict({k: op[k] for k in STEADY_STATE}, wait_p99_ms=op["slot_wait_p99_ms"] + op["prefill_wait_p99_ms"],
                rank_wait_ms=waited,
                stable=op["stable"], step_stable=op["steps_converge"])
