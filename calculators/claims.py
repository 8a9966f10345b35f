"""Claims from data: each sentence a lesson states as a result (steady, forms, bound, meets, cheaper) comes from one
function here, of the numbers shown beside it, and names the condition it tested; when the numbers say otherwise
the sentence says so. Words only, no formula of their own: the numbers come from the page's run or calculator.

Pages call these and write no verdict themselves; the Walkthrough and the lesson pages share them, so a headline
and the section under it come from the same evaluation.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from calculators.units import fmt_num

STEADY_BAND = 1.5        # 8 steps in 10 within 1.5× of each other (90th ≤ 1.5 × 10th percentile) ...
STEADY_OUTLIER = 3.0     # ... and none above 3× the median: a steady beat


def _ms(x: float) -> str:
    return f"{fmt_num(x, 3)} ms"


# ============================================================================================ decode steps
def decode_beat_is_steady(step_ms: Sequence[float]) -> bool | None:
    """Whether decode steps came at a steady beat: 90th percentile ≤ 1.5 × 10th and the slowest ≤ 3 × median.
    None for fewer than two steps (nothing to tell)."""
    v = np.asarray(step_ms, float)
    if v.size < 2:
        return None
    lo, med, hi = np.percentile(v, [10, 50, 90])
    return bool(hi <= STEADY_BAND * lo and v.max() <= STEADY_OUTLIER * med)


def decode_beat_claim(step_ms: Sequence[float], busy: bool = False) -> str:
    """The sentence about one run's decode steps (each does the same work, one token through every layer): steady
    or not, with the spread it tested; `busy` (the machine's load during the run) is the reason given when not."""
    steady = decode_beat_is_steady(step_ms)
    if steady is None:
        return "Too few decode steps to say how steady they were."
    v = np.asarray(step_ms, float)
    lo, med, hi = (float(x) for x in np.percentile(v, [10, 50, 90]))
    if steady:
        return (f"**A steady beat:** 8 steps in 10 took between {fmt_num(lo, 3)} and {_ms(hi)}, within "
                f"{STEADY_BAND:g}× of each other, and none took over {STEADY_OUTLIER:g}× the median of {_ms(med)} "
                f"(the slowest: {_ms(float(v.max()))}). Each step does the same work, one token through every layer.")
    why = (" The machine was busy: a step's time here depends on when the other programs let the engine run, more "
           "than on the step's own work." if busy else
           " Other work in this process or a first-use cost (memory, caches) slowed some steps: the median is the "
           "step's own cost.")
    broke = []
    if hi > STEADY_BAND * lo:
        broke.append(f"8 in 10 spread from {fmt_num(lo, 3)} to {_ms(hi)}, more than {STEADY_BAND:g}× apart")
    if v.max() > STEADY_OUTLIER * med:
        broke.append(f"the slowest, {_ms(float(v.max()))}, took over {STEADY_OUTLIER:g}× the median of {_ms(med)}")
    return (f"**Not a steady beat on this run:** steps took from {fmt_num(float(v.min()), 3)} to "
            f"{_ms(float(v.max()))} ({'; '.join(broke)}), though each does the same work, one token through every "
            "layer." + why)


# ============================================================================================ logit lens
LATE = 0.5               # "forms in the later layers": the final answer first leads in the second half of the stack


def lens_first_layer(top: Sequence) -> int:
    """The first layer from which the final layer's top token stays on top to the end."""
    k = len(top) - 1
    while k > 0 and top[k - 1] == top[-1]:
        k -= 1
    return k


def logit_lens_claim(top: Sequence[str], probs: Sequence[float]) -> str:
    """What a logit lens shows, from its own rows (top token and its probability, one per layer): where the model's
    final answer first leads and stays, whether that is in the later half, and whether an earlier layer was more
    confident than the last one. Confidence is not correctness: the lens says what a layer would pick, not
    whether that pick is right."""
    n = len(top)
    if n == 0:
        return "No layers to read."
    k, last = lens_first_layer(top), n - 1
    final, p_final = top[-1], float(probs[-1])
    pick = f"The model's final pick, `{final}` ({p_final:.0%}),"
    if k == 0:
        where = f"{pick} leads at every layer (0 to {last}): nothing forms late on this prompt."
    elif k == last:
        where = (f"{pick} appears only at the last layer ({last}): on this prompt the answer forms in the later "
                 "layers; every earlier one would pick another token.")
    elif k >= LATE * last:
        where = (f"{pick} leads from layer {k} of 0 to {last} on: on this prompt the answer forms in the later "
                 "layers; the earlier ones pick other tokens.")
    else:
        where = (f"{pick} leads from layer {k} of 0 to {last} on: on this prompt it leads early, before the middle, "
                 "and the later layers keep it.")
    j = int(np.argmax(np.asarray(probs, float)))
    if j != last and float(probs[j]) > p_final:
        where += (f" Layer {j} is the most confident ({float(probs[j]):.0%} on `{top[j]}`), more than the last "
                  f"layer ({p_final:.0%}) although only the last layer's pick is the model's output.")
    return where + (" Confidence is not correctness: a bar's length is how sure a layer would be of its top token, "
                    "not whether that token is right.")


def logit_lens_forms_late(top: Sequence) -> bool:
    """The condition `logit_lens_claim` tests for 'forms in the later layers'."""
    return len(top) > 1 and lens_first_layer(top) >= max(1, LATE * (len(top) - 1))


# ============================================================================================ roofline
FAR = 4.0                # "far to the left/right": at least 4× from the ridge; within 2× it is "near the ridge"
NEAR = 2.0


def roofline_side_claim(phase: str, points: Sequence[tuple[str, float]], ridge: float) -> str:
    """Where one phase's ops sit against the ridge point, from their intensities (FLOP per byte): how many lie
    left (memory-bound) and right (compute-bound), and how far the nearest ones are (far: 4× or more, near: within
    2×). `points`: (op name, intensity) of the ops drawn."""
    pts = [(n, float(x)) for n, x in points if x > 0]
    if not pts or not ridge > 0:
        return f"**{phase.capitalize()}:** no op with FLOPs to place."
    left = [(n, x) for n, x in pts if x < ridge]
    right = [(n, x) for n, x in pts if x >= ridge]
    r = fmt_num(ridge, 3)
    out = f"**{phase.capitalize()}:** "
    if not right:
        name, top = max(left, key=lambda p: p[1])
        out += f"all {len(left)} ops sit left of the ridge ({r} FLOP/B), memory-bound; "
        if top * FAR <= ridge:
            out += (f"even the most intense, {name} at {fmt_num(top, 3)} FLOP/B, is {fmt_num(ridge / top, 2)}× "
                    "below it: far to the left.")
        elif top * NEAR > ridge:
            out += (f"the most intense, {name} at {fmt_num(top, 3)} FLOP/B, sits near the ridge "
                    f"({fmt_num(top / ridge, 2)}× of it): memory-bound, but only just, not far to the left.")
        else:
            out += f"the most intense, {name} at {fmt_num(top, 3)} FLOP/B, is {fmt_num(ridge / top, 2)}× below it."
        return out
    if not left:
        name, low = min(right, key=lambda p: p[1])
        far = " far to the right" if low >= FAR * ridge else ""
        return (out + f"all {len(right)} ops sit right of the ridge ({r} FLOP/B){far}, compute-bound; the least "
                f"intense, {name}, at {fmt_num(low, 3)} FLOP/B ({fmt_num(low / ridge, 2)}× the ridge).")
    return (out + f"{len(right)} of {len(pts)} ops sit right of the ridge ({r} FLOP/B), compute-bound "
            f"({', '.join(n for n, _ in right)}); {len(left)} sit left of it, memory-bound "
            f"({', '.join(n for n, _ in left)}).")


# ============================================================================================ words
def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 replica', '3 replicas' (with thousands separators)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


# ============================================================================================ capacity plan
def plan_limit(best: dict, itl_target_ms: float, ttft_target_ms: float, at: dict | None = None
               ) -> tuple[str, float, str]:
    """The limit a plan is closest to, as (its name, used / limit, what the ratio is of): the one of the plan's
    figures with the planner's `worst_ratio` (memory needed / usable per GPU, mean ITL at the load / the ITL target,
    TTFT p99 / its target, sequences in flight / the batch cap, else the prefill budget's share of a step), its
    ratio read from `at` (the evaluation at the rate) where that has the figure."""
    itl = at["tpot_ms"] if at is not None else best["itl_at_load_ms"]
    ttft = at["ttft_p99_ms"] if at is not None else best["ttft_p99_ms"]
    kind = f", the step {best['itl_kind']}-bound" if best.get("itl_kind") else ""
    limits = {   # name: (the planner's ratio, the ratio shown, what it is of)
        "memory": (best["per_gpu_needed_bytes"] / best["usable_bytes"],) * 2 + ("the usable memory of one GPU",),
        "ITL": (best["itl_at_load_ms"] / itl_target_ms, itl / itl_target_ms,
                f"the ITL target ({fmt_num(itl, 3)} of {fmt_num(itl_target_ms, 3)} ms{kind})"),
        "TTFT": (best["ttft_p99_ms"] / ttft_target_ms, ttft / ttft_target_ms,
                 f"the TTFT p99 target ({fmt_num(ttft, 3)} of {fmt_num(ttft_target_ms, 3)} ms)"),
        "batch cap": (best["utilisation"],) * 2 + (f"its batch cap of {best['batch_cap']:,} sequences in flight",),
    }
    worst = best.get("worst_ratio")
    if worst is None:
        name = max(limits, key=lambda k: limits[k][0] if math.isfinite(limits[k][0]) else math.inf)
    else:
        name = min(limits, key=lambda k: abs(limits[k][0] - worst))
        if not math.isclose(limits[name][0], worst, rel_tol=1e-6):
            return "prefill budget", float(worst), "the prompt tokens a step may carry"
    return name, float(limits[name][1]), limits[name][2]


def plan_claim(best: dict, itl_target_ms: float, ttft_target_ms: float, at: dict | None,
               unchecked: str | None = None) -> str:
    """The capacity plan's verdict in one sentence, from one evaluation at the requested rate (`at`, serve_at's
    result): meets or misses each target (the ITL target is the mean gap between tokens at the load), the limit it
    is closest to and what that percentage is of, and the rate against the layout's capacity. `unchecked`: why
    the plan could not be evaluated at the rate (then it is not said to meet anything)."""
    if at is None:
        return (f"**Not checked at your rate:** {unchecked or 'the plan could not be evaluated'}. The search ranked "
                "it first from its own estimate, but nothing on this page says it meets the targets; change the "
                "workload so that the check can run.")
    itl, ttft = at["tpot_ms"], at["ttft_p99_ms"]
    misses = []
    if not at["stable"]:
        misses.append(f"the rate is above what it serves ({at['verdict']})")
    if not ttft <= ttft_target_ms:
        misses.append(f"TTFT p99 {fmt_num(ttft, 3)} ms is above the {fmt_num(ttft_target_ms, 3)} ms target")
    if not itl <= itl_target_ms:
        misses.append(f"the mean ITL {fmt_num(itl, 3)} ms is above the {fmt_num(itl_target_ms, 3)} ms target")
    if misses:
        return "**It misses the targets at your rate:** " + "; ".join(misses) + "."
    name, ratio, of = plan_limit(best, itl_target_ms, ttft_target_ms, at)
    return (f"**It meets both targets at your rate:** TTFT p99 {fmt_num(ttft, 3)} ms (target "
            f"{fmt_num(ttft_target_ms, 3)} ms) and mean ITL {fmt_num(itl, 3)} ms (target {fmt_num(itl_target_ms, 3)} "
            f"ms, the mean gap between tokens at the load). The limit it is closest to is **{name}**: {ratio:.0%} "
            f"of {of}. The rate is {at['utilisation']:.0%} of this layout's capacity "
            f"({fmt_num(at['capacity_requests_per_s'], 3)} requests/s, the most it sustains).")


def itl_target_claim(mean_ms: float, p99_ms: float, target_ms: float) -> str:
    """Which ITL the target is: the mean gap at the load. Meets or misses, and the p99 gap against it (not a
    target here, said so when it is above)."""
    head = (f"The ITL target ({fmt_num(target_ms, 3)} ms) is for the mean gap between tokens: "
            f"{fmt_num(mean_ms, 3)} ms {'meets it' if mean_ms <= target_ms else 'misses it'}.")
    tail = (f" The p99 gap ({fmt_num(p99_ms, 3)} ms) is above {fmt_num(target_ms, 3)} ms; no target is set on it."
            if p99_ms > target_ms else
            f" Even the p99 gap ({fmt_num(p99_ms, 3)} ms) is within it.")
    return head + tail


def cheaper_claim(a: str, a_usd: float | None, b: str, b_usd: float | None, unit: str = "per 1M tokens") -> str:
    """Which of two designs costs less, from their two prices, the cheaper one's first."""
    if a_usd is None or b_usd is None or not (math.isfinite(a_usd) and math.isfinite(b_usd)):
        return "No price for one of them: no cost comparison."
    if a_usd == b_usd:
        return f"**{a.capitalize()} and {b} cost the same here** (${a_usd:,.3f} {unit})."
    (w, wu), (l, lu) = sorted(((a, a_usd), (b, b_usd)), key=lambda p: p[1])
    return f"**{w.capitalize()} is cheaper here:** ${wu:,.3f} {unit}, against ${lu:,.3f} {l}."


# ============================================================================================ tokenizers
def token_count_claim(a: str, n_a: int, vocab_a: int, b: str, n_b: int, vocab_b: int) -> str:
    """Two tokenizers on the same text: which needed fewer tokens, by how much, against their vocabulary sizes
    (a larger vocabulary usually needs fewer tokens; said only when this text shows it)."""
    if n_a == n_b:
        return f"Both cut this text into {plural(n_a, 'token')}."
    (few, nf, vf), (many, nm, vm) = sorted(((a, n_a, vocab_a), (b, n_b, vocab_b)), key=lambda t: t[1])
    out = (f"**{few}** needs **{plural(nf, 'token')}** for this text and **{many}** {plural(nm, 'token')}: "
           f"{fmt_num(nm / nf, 3)}× as many.")
    if vf > vm:
        out += (f" The larger vocabulary ({vf:,} ids against {vm:,}) holds longer pieces, so fewer of them "
                "cover the text; each costs a forward pass when generated.")
    elif vf < vm:
        out += (f" Here the smaller vocabulary ({vf:,} ids against {vm:,}) needed fewer: its pieces fit this "
                "text better than the larger one's.")
    return out


def tp_gain_claim(rows: Sequence[dict]) -> str:
    """What the TP rows shown (`parallel_step.tp_step_scaling`, in increasing degree) say about splitting further:
    the first degree whose ITL is no lower than the one before (what stays fixed, the all-reduces and the host's
    work, outweighs what the split saves), or, where every step up still gains, how much the last one bought
    against the factor the split alone would give."""
    ok = [r for r in rows if r.get("problem") is None]
    if len(ok) < 2:
        return ""
    for a, b in zip(ok, ok[1:]):
        if b["itl_ms"] >= a["itl_ms"]:
            return (f"Here TP {b['tp']} is no faster than TP {a['tp']} ({_ms(b['itl_ms'])} against "
                    f"{_ms(a['itl_ms'])}): its all-reduces ({_ms(b['allreduce_ms'])}) and the host's work "
                    f"({_ms(b['host_ms'])}) outweigh what the split saves.")
    a, b = ok[-2], ok[-1]
    gains = [x["itl_ms"] / y["itl_ms"] for x, y in zip(ok, ok[1:])]
    shrinking = all(g2 < g1 for g1, g2 in zip(gains, gains[1:]))
    return (f"Here every step up still gains{', by less each time' if shrinking else ''}: TP {a['tp']} → {b['tp']} "
            f"splits the reads "
            f"{b['tp'] / a['tp']:g}× but cuts the ITL only {a['itl_ms'] / b['itl_ms']:.2f}× ({_ms(a['itl_ms'])} → "
            f"{_ms(b['itl_ms'])}), the all-reduces ({_ms(b['allreduce_ms'])}) and the host's work "
            f"({_ms(b['host_ms'])}) staying.")
