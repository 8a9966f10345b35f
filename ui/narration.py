"""Sentences that say what a chart or a table on a lesson page shows, built from the numbers it shows, so they
stay true whichever way a run comes out (a batch worth less than one stream, two allocators that tie, a chunk that
costs nothing). Words only: every number comes from the page's own results.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from calculators.units import fmt_num


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
    """What the batch's tokens/s against one lone stream means right now, true whichever way it came out."""
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
