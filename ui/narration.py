"""Sentences that say what a chart or a table on a lesson page shows, built from the numbers it shows, so they
stay true whichever way a run comes out (a batch worth less than one stream, two allocators that tie, a chunk that
costs nothing). Words only: every number comes from the page's own results.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from calculators.units import fmt_num
from engine.threads import BUSY_CORES


def _ids(ids) -> str:
    return ", ".join(ids) if ids else "none"


def scheduler_step_words(report) -> str:
    """One scheduler step (`engine.serve.scheduler.StepReport`) in words: who was prefilled and with how many
    prompt tokens, who decoded one token, who finished and who was preempted."""
    pre = ", ".join(f"{r} ({n:,} prompt tokens)" for r, n in report.prefilled.items()) or "none"
    return (f"Step {report.step:,}: prefilled {pre}; decoded one token for {_ids(report.decoded)}; finished "
            f"{_ids(report.finished)}; preempted {_ids(report.preempted)}.")


def gap_words(df: pd.DataFrame) -> str:
    """Why the measured times sit above the predicted ones, with the gap of this run."""
    itl = (df["ITL measured (ms)"] / df["ITL predicted (ms)"]).median()
    ttft = (df["TTFT measured (ms)"] / df["TTFT predicted (ms)"]).median()
    return (f"**Measured against predicted:** the decode steps took about **{itl:.1f}×** the prediction and the "
            f"prefills **{ttft:.1f}×**. The prediction is a floor: it assumes every byte moves at the measured "
            "bandwidth and every FLOP runs at the measured peak. A real step also pays Python and NumPy's cost per "
            "operation (hundreds per token), small matrix products that reach less than the peak, and the "
            "norms, attention and sampling that read and write activations. The ratio is this engine's "
            "efficiency; the sizing pages call its inverse MBU (decode) and MFU (prefill).")


def allocator_words(s: dict) -> str:
    """What the three runs show, in sentences true of these numbers (the lines on top of each other included)."""
    r, c, p = s["reserve"], s["contiguous"], s["paged"]
    out = (f"Paging ran up to **{p['max_batch']}** requests at once against **{r['max_batch']}** with reserve-for-max "
           f"and **{c['max_batch']}** with contiguous growth, and finished the stream in **{p['steps']:,}** steps "
           f"(reserve {r['steps']:,}, contiguous {c['steps']:,}). Mean waste: "
           f"{fmt_num(100 * r['mean_waste_fraction'], 3)}% / {fmt_num(100 * c['mean_waste_fraction'], 3)}% / "
           f"{fmt_num(100 * p['mean_waste_fraction'], 3)}% of what each allocated.")
    if c["steps"] == p["steps"] and c["max_batch"] == p["max_batch"]:
        out += (f" Contiguous growth kept up with paging here (its wide orange line lies under the blue one) only "
                f"by moving requests: **{c['relocations']:,} relocations copying {c['copied_tokens']:,} token "
                f"positions** of K/V, work paging never does (0 copies). When no hole is large enough to copy "
                "into, contiguous growth must preempt a request instead.")
    return out


def chunk_words(step: float, whole: float, chunked: float, linear: float, chunk: int) -> str:
    """What the two simulated runs show, in a sentence true of these numbers."""
    if chunked <= step * 1.01:
        return (f"Whole, the prompt freezes every stream for {fmt_num(whole, 3)} ms. In chunks of {chunk:,} tokens "
                "the streams see **no bump at all**: each chunk fits in the compute a decode step leaves idle "
                "(the step is bandwidth-bound). Make the chunk larger to see where chunks start to cost.")
    return (f"Whole, the prompt freezes every stream for {fmt_num(whole, 3)} ms once. In chunks of {chunk:,} tokens "
            f"the streams see several small bumps of at most {fmt_num(chunked, 3)} ms instead (the linear estimate "
            f"{fmt_num(linear, 3)} ms is a pessimistic bound: part of each chunk fits in compute the decode step "
            "leaves idle).")


def acceptance_words(model, layers: int, alpha: float) -> str:
    """What the measured α says about this draft, true of the model that ran (random or trained weights)."""
    L = model.config.num_layers
    if model.random_weights:
        return (f"{model.name} has random weights: its first {layers} layers guess the full model's choices no "
                "better than chance, so almost nothing is accepted.")
    if math.isnan(alpha):
        return "No guess was checked in this run (too few new tokens)."
    return (f"{model.name} is a trained model: the draft (its first {layers} of {L} layers, with the same output "
            f"head) agreed with the full model on {alpha:.0%} of its guesses here. More draft layers guess better "
            "but cost more per guess.")


def goodput_words(rows: list[dict]) -> str:
    """Where goodput leaves throughput in this sweep, in one sentence."""
    short = [r for r in rows if r["goodput_tok_s"] < 0.995 * r["throughput_tok_s"]]
    if not short:
        return ("Goodput equals throughput at every load here: every request meets both targets. Tighten a target "
                "(above) to see where the tail starts to cost.")
    worst = rows[-1]
    return (f"Goodput leaves throughput from load **{short[0]['load']:g}**: at {worst['load']:g} of capacity only "
            f"**{worst['goodput_tok_s'] / worst['throughput_tok_s']:.0%}** of the tokens belong to requests that met "
            "both targets. The server is busier, yet it serves fewer users well.")


def steady_state_gap_words(loads, simulated_p99, steady_p99, tolerance: float = 0.20) -> str:
    """How far the steady state's TTFT p99 sits from the simulated one on this sweep, in words: within the
    tolerance the planner's referee test holds it to (20% on p99), or by how much it parts and from which load."""
    pairs = [(float(u), float(s), float(m)) for u, s, m in zip(loads, simulated_p99, steady_p99) if s > 0]
    none = [u for u, s, m in pairs if not math.isfinite(m)]
    gaps = [(u, m / s - 1) for u, s, m in pairs if math.isfinite(m)]
    off = [(u, g) for u, g in gaps if abs(g) > tolerance]
    tail = (f" From load {none[0]:g} it finds no steady state: its capacity is below the simulator's."
            if none else "")
    if not off:
        return f"Here it is within {tolerance:.0%} of the simulated p99 at every load it solves." + tail
    u0, (uw, gw) = off[0][0], max(off, key=lambda x: abs(x[1]))
    return (f"Here it parts from the simulated p99 from load {u0:g} (at {uw:g} it is {abs(gw):.0%} "
            f"{'below' if gw < 0 else 'above'}). The steady state is held to the simulator on a grid of data-centre "
            "cases (`bench/bench_steady_state.py`); a server like this one, whose prefill costs many decode steps, "
            "lies outside it, and the simulated curve is the one to trust." + tail)


def best_cap_words(rows: list[dict]) -> str:
    """The best cap for goodput, and the caps that tie with it (a cap the load never fills changes nothing)."""
    best = max(rows, key=lambda r: r["goodput_tok_s"])
    ties = [r["max_batch"] for r in rows if r["goodput_tok_s"] >= 0.995 * best["goodput_tok_s"]]
    lead = (f"Best cap for goodput here: **{ties[0]}** ({fmt_num(best['goodput_tok_s'], 4)} tokens/s, "
            f"{fmt_num(100 * best['fraction_meeting_slo'], 3)}% of requests within both targets). ")
    if len(ties) > 1:
        return lead + (f"Caps {ties[0]} to {ties[-1]} do equally well: at this rate the running batch rarely "
                       f"needs more than {ties[0]} slots, so a larger cap is seldom reached and changes nothing "
                       "measurable. A smaller "
                       "cap queues requests (TTFT). Raise the rate to see a large cap slow every stream (ITL).")
    return lead + ("A smaller cap queues requests (TTFT); a larger one slows every stream (ITL) once the batch "
                   "passes the critical size.")


def measured_text(v: float) -> str:
    """A measured rate for a table cell: the number, or why there is none yet (never a bare "None")."""
    return f"{v:,.1f}" if np.isfinite(v) else "not measured yet"


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def speedup_words(snap, speedup: float, window_s: float = 10.0) -> str:
    """What the batch's tokens/s against one lone stream means right now, true whichever way it came out; nothing
    ("") while no request is running (the last 10 s of steps are a batch that has left: "worth 1.00 lone
    streams" beside "Requests running now 0")."""
    if snap.running == 0:
        return ""
    if speedup >= 1:
        return (f"The batch is worth **{fmt_num(speedup, 3)}** lone streams: every step reads the weights once for "
                "all the requests in it.")
    recent = [s for s in snap.steps if s.ended_at >= snap.taken_at - window_s]
    prompt = sum(s.prefill_tokens for s in recent)
    busy = sum(s.seconds for s in recent if s.prefill_tokens)
    total = sum(s.seconds for s in recent)
    return (f"Right now the batch delivers **{fmt_num(speedup, 3)}×** the tokens/s of one stream alone: fewer, not "
            f"more. In the last {window_s:g} s the server also read {prompt:,} prompt tokens, and those prefill "
            f"steps took {busy / total:.0%} of its time while making almost no new tokens. On this CPU a step with "
            "more sequences also costs nearly proportionally more arithmetic. The batching gain of the lesson "
            "shows when steps are limited by reading the weights, with the prompts already read.") if total > 0 \
        else f"The batch delivers {fmt_num(speedup, 3)}× the tokens/s of one stream alone."


# ============================================================================================ measured lessons
BUSY_SPREAD = 0.5           # repeats whose range exceeds half their median: the timing is not steady
SHRANK = 0.95               # a measured time "shrank" only when it fell by more than 5%


def spread(values) -> float:
    """(max - min) / median of repeated timings (0 for one value)."""
    v = [float(x) for x in values]
    med = float(np.median(v)) if v else float("nan")
    return (max(v) - min(v)) / med if len(v) > 1 and med > 0 else 0.0


def step_spread(values) -> float:
    """(90th - 10th percentile) / median of steps that each do the same work (0 for fewer than two)."""
    v = np.asarray(values, float)
    if v.size < 2:
        return 0.0
    lo, med, hi = np.percentile(v, [10, 50, 90])
    return float((hi - lo) / med) if med > 0 else 0.0


def busy_notice(others: float | None, cores: int, spread_: float | None = None) -> str | None:
    """The busy-machine notice for a measured lesson, or None when the machine looked quiet: other programs'
    CPU during the run (`engine.threads.LoadReading.others`) and the spread between repeats."""
    loaded = others is not None and others >= BUSY_CORES
    noisy = spread_ is not None and spread_ > BUSY_SPREAD
    if not (loaded or noisy):
        return None
    why = []
    if loaded:
        why.append(f"other programs used **{others:.1f} of its {cores} cores** while this ran")
    if noisy:
        why.append(f"repeats of the same measurement differed by **{spread_:.0%}** of their median")
    return ("**This machine is busy:** " + " and ".join(why) + ". The engine waited for the cores as well as "
            "doing its work, so these timings are slower and noisier than the lesson's arithmetic: a difference "
            "smaller than that spread says nothing. Read the sentences below for what this run did show, and "
            "press again when the machine is quieter (fewer programs, fewer students on this server) to see the "
            "effect itself.")


def _busy_reason(busy: bool) -> str:
    return (" The machine was busy (see the notice above): a step's time here depends on when the other programs "
            "let the engine run, more than on the step's own work." if busy else "")


def chunk_measured_words(whole: dict, chunked: dict, chunk: int, busy: bool) -> str:
    """What the engine's two runs (whole prompt, chunks) show, in sentences true of these numbers."""
    w, c = whole["itl_max_ms"], chunked["itl_max_ms"]
    wm, cm = whole["itl_p50_ms"], chunked["itl_p50_ms"]
    tw, tc = whole["long_prompt_ttft_ms"], chunked["long_prompt_ttft_ms"]
    gap = f"from {fmt_num(w, 3)} to {fmt_num(c, 3)} ms"
    if c < SHRANK * w:
        out = (f"With chunks of {chunk:,} tokens the decoding requests' worst gap **shrank** {gap}: no step had to "
               "carry the whole prompt.")
    else:
        out = (f"With chunks of {chunk:,} tokens the decoding requests' worst gap **did not shrink** here ({gap})."
               + (_busy_reason(True) if busy else
                  " At this size the whole prompt costs about as much as a decode step (the engine's cost per pass "
                  "outweighs the prompt's arithmetic): make the long prompt longer to see chunks help."))
    out += f" Their median gap went from {fmt_num(wm, 3)} to {fmt_num(cm, 3)} ms."
    out += (f" The long prompt's first token came **later** with chunks ({fmt_num(tw, 3)} → {fmt_num(tc, 3)} ms): "
            "its prefill was spread over several steps." if tc > tw else
            f" The long prompt's first token did not come later here ({fmt_num(tw, 3)} → {fmt_num(tc, 3)} ms).")
    return out




def sweep_words(df: pd.DataFrame, busy: bool) -> str:
    """Whether TTFT grew and ITL stayed flat across the sweep, from its own rows."""
    first, last = df.iloc[0], df.iloc[-1]
    n0, n1 = int(first["prompt tokens"]), int(last["prompt tokens"])
    t = last["TTFT measured (ms)"] / first["TTFT measured (ms)"]
    itl = df["ITL measured (ms)"]
    i = float(itl.max() / itl.min())
    out = f"From {n0:,} to {n1:,} prompt tokens TTFT grew **{t:.1f}×**"
    if i <= 1.5 and t > 2 * i:
        return out + f" while ITL stayed **flat** (within {i:.2f}× across the sweep)."
    if t > 2 * i:
        return out + (f" and ITL changed up to {i:.1f}×, far less than TTFT: a decode step reads the weights "
                      "plus the cache, and the cache grew with the prompt." + _busy_reason(busy))
    return out + (f" and ITL changed up to {i:.1f}×: **not the expected picture** on this run." +
                  (_busy_reason(True) if busy else " Press again: one slow moment can move a short timing."))


def speculative_words(label: str, r: dict, busy: bool) -> str:
    """Whether drafting won or lost in this run, with α and the measured speedup."""
    s, a = r["speedup_measured"], r["alpha"]
    alpha = "no guess checked" if math.isnan(a) else f"α = {a:.2f}"
    if s >= 1.05:
        return (f"**{label}: drafting won**, {s:.2f}× plain decoding's speed ({alpha}, "
                f"{r['tokens_per_pass']:.2f} tokens per pass of the full model).")
    if s <= 0.95:
        return (f"**{label}: drafting lost**, {s:.2f}× plain decoding's speed ({alpha}, "
                f"{r['tokens_per_pass']:.2f} tokens per pass): too few guesses were accepted to pay for the "
                "verification passes." + _busy_reason(busy))
    return (f"**{label}: a tie**, {s:.2f}× plain decoding's speed ({alpha}, {r['tokens_per_pass']:.2f} tokens per "
            "pass)." + _busy_reason(busy))


def formula_gap_words(measured: float, predicted: float, verify_ratio: float) -> str:
    """How the measured speedup compares with the formula's, and why, true of these numbers."""
    if not (np.isfinite(measured) and np.isfinite(predicted)):
        return "The formula needs a measured α (no guess was checked)."
    if measured < 0.95 * predicted:
        why = (f" the verification pass of K + 1 tokens cost {verify_ratio:.1f}× a decode step here, the formula "
               "assumes 1×" if np.isfinite(verify_ratio) and verify_ratio > 1.05 else "")
        return (f"The measured speedup ({measured:.2f}×) fell below the bandwidth-bound formula's "
                f"({predicted:.2f}×)" + (":" + why if why else "") + ".")
    if measured > 1.05 * predicted:
        return (f"The measured speedup ({measured:.2f}×) came out above the formula's ({predicted:.2f}×): accepted "
                "guesses came in long runs, which the formula's one α per token does not model.")
    return f"The measured speedup ({measured:.2f}×) matches the formula's ({predicted:.2f}×) within 5%."
