"""The Walkthrough's sentences about its own numbers, as pure functions: each sentence says only what the numbers
it is given show, and says the opposite when they show the opposite (tests/ui/test_walk_claims.py feeds both).

    decode_beat_sentence(ttft_ms, itl_ms)    -> "Reading the prompt (prefill) took ... Each next word then took ..."
    binding_sentence(binding, worst_ratio)   -> "what limits it: memory, at 92% of what the GPU allows"
"""
from __future__ import annotations

import numpy as np

STEADY_SPREAD = 0.25     # every decode step within ±25% of the median step: a steady beat
BINDS_AT = 0.7           # a limit used to 70% or more binds the plan; below, the plan has room to spare


def decode_spread(itl_ms) -> tuple[float, float, float, float]:
    """(median, fastest, slowest, spread) of the decode steps' times in ms; spread = the largest distance of a step
    from the median, as a share of the median (0.1 = every step within ±10%)."""
    x = np.asarray(itl_ms, dtype=float)
    med = float(np.median(x))
    lo, hi = float(x.min()), float(x.max())
    return med, lo, hi, (max(hi - med, med - lo) / med if med > 0 else float("inf"))


def decode_beat_sentence(ttft_ms: float, itl_ms, steady_within: float = STEADY_SPREAD) -> str:
    """What the run's prefill and decode times say: the pause before the first word, then the beat of the next
    ones, called steady only when every decode step is within `steady_within` of the median (the test is named in
    the sentence), otherwise the spread is given with the slowest step."""
    head = f"Reading the prompt (prefill) took **{ttft_ms:,.0f} ms**: that is the pause before the first word."
    steps = [v for v in np.asarray(itl_ms, dtype=float).ravel() if np.isfinite(v)]
    if not steps:
        return head + " The reply had one token, so there was no decode step to time."
    med, lo, hi, spread = decode_spread(steps)
    if len(steps) < 3:
        return head + (f" Each next word then took about **{med:,.0f} ms** (decode); {len(steps)} step"
                       f"{'s are' if len(steps) > 1 else ' is'} too few to call the beat steady or not.")
    if spread <= steady_within:
        return head + (f" Each next word then took about **{med:,.0f} ms** (decode), at a steady beat: all "
                       f"{len(steps)} steps took {lo:,.0f} to {hi:,.0f} ms, within ±{steady_within:.0%} of the "
                       "median.")
    slow = "slowest" if hi - med >= med - lo else "fastest"
    far = hi if slow == "slowest" else lo
    first = " (the first one: a warm-up)" if slow == "slowest" and steps[0] == hi else ""
    return head + (f" Each next word then took **{med:,.0f} ms** at the median (decode), but not at a steady beat: "
                   f"the {len(steps)} steps ranged from {lo:,.0f} to {hi:,.0f} ms, the {slow}{first} "
                   f"{far / med:.1f}× the median (steady would be within ±{steady_within:.0%}). Other programs "
                   "busy on the same cores also make a step longer.")


LIMIT_WORDS = {"memory": "GPU memory", "bandwidth": "memory bandwidth", "compute": "compute",
               "communication": "the links between GPUs", "queueing": "queueing"}


def binding_sentence(binding: str, worst_ratio: float, gpus: int, binds_at: float = BINDS_AT) -> str:
    """What limits a plan, and how close it comes: a limit used to `binds_at` or more binds it; below that the
    plan meets every target with room to spare, and the sentence says which limit is nearest and how far."""
    what = LIMIT_WORDS.get(binding, binding)
    if worst_ratio >= binds_at:
        return f"what limits it: {what}, at {worst_ratio:.0%} of what the hardware allows"
    size = "one GPU (the smallest plan) meets" if gpus == 1 else f"these {gpus} GPUs meet"
    return (f"nothing binds: {size} every target with room to spare (its nearest limit, {what}, is at "
            f"{worst_ratio:.0%} of what the hardware allows)")
