"""Queueing and SLOs: the ρ/(1 − ρ) hockey stick next to the simulator's measured waits, p99 TTFT and goodput
against load, and the batch cap as the operator's knob.

Numbers: `calculators.serving.queueing` (queue_wait_factor), `calculators.explain.explain_queue_wait`,
`calculators.serving.slo` (load_sweep, batch_cap_sweep, goodput) on `calculators.serving.serving_sim`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.explain import explain_queue_wait
from calculators.serving.queueing import md1_wait_factor, queue_wait_factor
from calculators.serving.slo import (ITL_TARGET_TIMES, KNOB_LOAD, TTFT_TARGET_TIMES, batch_cap_sweep, load_sweep,
                                    suggested_rate, suggested_targets)
from calculators.units import fmt_num
from calculators.serving.lengths import from_kind
from calculators.serving.steady_state import sweep_for_model
from calculators.serving.workload import LENGTH_KINDS, synthetic_workload
from specs.model_config import SpecError
from ui import df_with_download, float_field, formula_expander, int_field, setup_page, show_error
from ui.model_source import choice_field
from ui.serving import remembered, step_model_inputs, style
from ui.narration import best_cap_words, goodput_words, steady_state_gap_words

LOADS = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
# The columns each table draws, with short headings, so that it fits 1366 px; the CSV keeps every column.
ONE_SERVER_SHOWN = {"load": "load ρ", "measured_rho": "measured ρ", "service_mean_ms": "service (ms)",
                    "wait_mean_ms": "wait (ms)", "wait_over_service": "wait ÷ service", "md1_wait_over_service":
                    "M/D/1", "mg1_wait_over_service": "M/G/1", "mm1_wait_factor": "M/M/1"}
BATCHED_SHOWN = {"load": "load ρ", "arrival_rate_rps": "requests/s", "mean_batch_busy": "mean batch",
                 "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p99_ms": "TTFT p99 (ms)", "tpot_p99_ms": "TPOT p99 (ms)",
                 "throughput_tok_s": "tokens/s", "goodput_tok_s": "goodput tokens/s",
                 "fraction_meeting_slo": "meeting targets"}
KNOB_SHOWN = {"max_batch": "batch cap", "ttft_p99_ms": "TTFT p99 (ms)", "itl_p99_ms": "ITL p99 (ms)",
              "tpot_p99_ms": "TPOT p99 (ms)", "mean_batch": "mean batch", "throughput_tok_s": "tokens/s",
              "goodput_tok_s": "goodput tokens/s", "fraction_meeting_slo": "meeting targets"}
CAPS = (1, 2, 4, 8, 16, 32, 64)
CURVE = [i / 100 for i in range(1, 97)]


def closed_form() -> None:
    c = st.columns([1, 3])
    rho = float_field("Utilisation ρ", 0.9, 0.01, 0.99, key="queue.rho", where=c[0],
                      help="Fraction of the server's capacity in use, below 1: at or above full capacity the queue "
                           "grows without limit, so there is no steady wait.")
    if rho is None:
        return
    try:
        queue_wait_factor(rho)                   # refuses ρ ≥ 1 (and ρ ≤ 0) with a message
        ex = explain_queue_wait(rho)
    except SpecError as e:
        show_error(f"{e}: at or above full capacity the queue grows without limit, so there is no steady wait.")
        return
    c[1].metric("Mean wait, in units of one service time (M/M/1)", fmt_num(ex.value, 3))
    formula_expander("The formula", f"**{ex.name}** `{ex.symbolic}`: {ex.formula}  \n_{ex.source}_\n\n"
                     "1 at 50%, 9 at 90%, 19 at 95%. M/M/1: Poisson arrivals, exponential service, one server. "
                     "With every service equally long (M/D/1) the wait is half that; for any service-time spread, "
                     "Pollaczek-Khinchine: Wq = λ·E[S²] / (2(1 − ρ)).")


def one_server(model, n: int, prompt: float, output: float, out_kind: str, first=None) -> None:
    """The heading, the hockey stick and its caption in `first` (the page's first screen), the table here."""
    first = first if first is not None else st.container()
    first.subheader("One request at a time: the simulator against the formulas")
    try:
        rows = remembered("queue.one", (model, n, prompt, output, out_kind),
                          lambda: load_sweep(model, LOADS, n=n, prompt_mean=prompt, output_mean=output, max_batch=1,
                                             output_kind=out_kind))
    except SpecError as e:
        show_error(e)
        return
    df = pd.DataFrame(rows)
    fig = go.Figure()
    fig.add_scatter(x=CURVE, y=[queue_wait_factor(r) for r in CURVE], name="ρ/(1 − ρ)  (M/M/1)",
                    line=dict(width=3, color="#e45756"))
    fig.add_scatter(x=CURVE, y=[md1_wait_factor(r) for r in CURVE], name="ρ/(2(1 − ρ))  (M/D/1)",
                    line=dict(width=3, dash="dot", color="#f58518"))
    fig.add_scatter(x=df["measured_rho"], y=df["mg1_wait_over_service"], mode="markers", name="M/G/1 at the "
                    "measured load", marker=dict(size=11, symbol="x", color="#54a24b"))
    fig.add_scatter(x=df["measured_rho"], y=df["wait_over_service"], mode="markers", name="simulated",
                    marker=dict(size=12, color="#4c78a8"))
    fig.update_yaxes(range=[0, 25])
    first.plotly_chart(style(fig, f"Mean wait ÷ service time, batch cap 1, output lengths {out_kind}",
                             "utilisation ρ", "wait ÷ service time", height=460), key="queue.hockey")
    first.caption("Fixed lengths make every service equally long, so the simulated server is an M/D/1 queue and its "
                  "waits sit on the dotted curve; geometric output lengths spread the service times and move them "
                  "towards (or past) the M/M/1 curve. Either way: near full load the wait explodes. The formulas are "
                  "steady-state averages; near ρ = 1 a queue takes very long to settle, so a run of a few thousand "
                  "requests measures less than the formula there (more requests per run bring it closer).")
    df_with_download(df, "queue_one_server", column_config={
        k: st.column_config.NumberColumn(format="%.4g") for k in df.columns}, show=ONE_SERVER_SHOWN)


def batched(model, n: int, prompt: float, output: float, out_kind: str, ttft_slo: float,
            itl_slo: float) -> float | None:
    """The load sweep at one batch cap; returns the capacity it measured (None when it could not run)."""
    st.subheader("A batched server under load")
    cap = int_field("Batch cap", 16, 1, 4096, key="queue.cap")
    if cap is None:
        return None
    try:
        rows = remembered("queue.batched", (model, n, prompt, output, out_kind, cap, ttft_slo, itl_slo),
                          lambda: load_sweep(model, LOADS, n=n, prompt_mean=prompt, output_mean=output, max_batch=cap,
                                             output_kind=out_kind, ttft_slo_ms=ttft_slo, tpot_slo_ms=itl_slo))
    except SpecError as e:
        show_error(e)
        return None
    df = pd.DataFrame(rows)
    theory = pd.DataFrame(sweep_for_model(model, df["load"], rows[0]["capacity_rps"], from_kind("fixed", prompt),
                                          from_kind(out_kind, output, 1 << 20), slots=cap))
    fig = go.Figure([go.Scatter(x=df["load"], y=df["ttft_p99_ms"], name="TTFT p99 (simulated)", mode="lines+markers"),
                     go.Scatter(x=df["load"], y=df["ttft_p50_ms"], name="TTFT p50 (simulated)", mode="lines+markers"),
                     go.Scatter(x=df["load"], y=theory["ttft_p99_ms"], name="TTFT p99 (steady state)",
                                mode="lines", line=dict(dash="dot", width=3)),
                     go.Scatter(x=df["load"], y=theory["ttft_p50_ms"], name="TTFT p50 (steady state)",
                                mode="lines", line=dict(dash="dot", width=3))])
    fig.add_scatter(x=[LOADS[0], LOADS[-1]], y=[ttft_slo, ttft_slo], mode="lines", name="TTFT target",
                    line=dict(dash="dash", color="gray"))
    fig.update_yaxes(type="log")
    st.plotly_chart(style(fig, f"TTFT against load, batch cap {cap}", "load (fraction of capacity)", "ms",
                          height=420), key="queue.ttft")
    fig = go.Figure([go.Bar(x=df["load"].astype(str), y=df["throughput_tok_s"], name="throughput"),
                     go.Bar(x=df["load"].astype(str), y=df["goodput_tok_s"], name="goodput (within targets)")])
    fig.update_layout(barmode="group")
    st.plotly_chart(style(fig, "Throughput and goodput", "load (fraction of capacity)", "tokens/s", height=400),
                    key="queue.goodput")
    df_with_download(df, "queue_batched", column_config={
        k: st.column_config.NumberColumn(format="≈ %.0f" if k.startswith("mean_batch") else "%.4g")   # a batch: whole
        for k in df.columns}, show=BATCHED_SHOWN)
    st.caption(f"Capacity = {fmt_num(rows[0]['capacity_rps'], 3)} requests/s: the rate the simulator sustains "
               "with an endless queue at this cap. Goodput counts the throughput of requests meeting both "
               "targets (TTFT, and mean inter-token latency). Dotted: the steady state the capacity planner uses "
               "(`calculators.serving.steady_state`) at the same rates, computed in closed form, not simulated. "
               + steady_state_gap_words(df["load"], df["ttft_p99_ms"], theory["ttft_p99_ms"]))
    st.markdown(goodput_words(rows))
    return float(rows[0]["capacity_rps"])



def knob(model, n: int, prompt: float, output: float, out_kind: str, ttft_slo: float, itl_slo: float,
         capacity: float | None) -> None:
    st.subheader("The batch cap as the knob")
    rate = float_field("Arrival rate (requests/s)", suggested_rate(capacity) if capacity else 1.0, 0.001, 1e6,
                       key=f"queue.rate.{model.name}",
                       help=f"Suggested: {KNOB_LOAD:.0%} of the capacity the section above measured at its batch cap.")
    if rate is None:
        return
    try:
        w = synthetic_workload(n, rate, prompt, output, output_kind=out_kind)
        rows = remembered("queue.knob", (model, n, prompt, output, out_kind, rate, ttft_slo, itl_slo),
                          lambda: batch_cap_sweep(model, w, CAPS, ttft_slo_ms=ttft_slo, tpot_slo_ms=itl_slo))
    except SpecError as e:
        show_error(e)
        return
    df = pd.DataFrame(rows)
    fig = go.Figure([go.Scatter(x=df["max_batch"], y=df["throughput_tok_s"], name="throughput", mode="lines+markers"),
                     go.Scatter(x=df["max_batch"], y=df["goodput_tok_s"], name="goodput", mode="lines+markers")])
    fig.update_xaxes(type="log")
    st.plotly_chart(style(fig, f"{rate:g} requests/s: throughput and goodput by batch cap", "batch cap",
                          "tokens/s", height=420), key="queue.knob")
    st.markdown(best_cap_words(rows))
    df_with_download(df, "batch_cap_sweep", column_config={
        k: st.column_config.NumberColumn(format="≈ %.0f" if k.startswith("mean_batch") else "%.4g")
        for k in df.columns}, show=KNOB_SHOWN)



def main() -> None:
    """The run's inputs in one row and the hockey stick under them (a projector's first screen at 1366×768); the
    intro, the closed form, the targets, the batched server and the knob below."""
    setup_page("Queueing and SLOs", icon=":material/queue:")
    st.title("Queueing and SLOs")
    top = st.container()                  # the inputs and the chart; the sidebar's notes on the world come after
    model = step_model_inputs()
    st.markdown(
        "Requests arrive when users press Enter, not when a slot frees up. Below full capacity the queue is "
        "usually short, but the wait grows like ρ/(1 − ρ): gently at first, then explosively near 100%. An "
        "operator therefore cares about the tail (p99 time to first token) and about goodput, the throughput "
        "that actually meets the latency targets, and tunes the batch cap to trade one user's speed for "
        "everyone's throughput.")
    closed_form()
    if model is None:
        return
    c = top.columns(4)
    n = int_field("Requests per run", 2000, 50, 20_000, key="queue.n", where=c[0])
    prompt = float_field("Prompt tokens", 100, 1, 1e6, key="queue.prompt", where=c[1])
    output = float_field("Output tokens (mean)", 50, 1, 1e6, key="queue.output", where=c[2])
    out_kind = choice_field("Output lengths", LENGTH_KINDS, "fixed", key="queue.kind", where=c[3])
    if None in (n, prompt, output):
        return
    one_server(model, n, prompt, output, out_kind, top)
    hint = suggested_targets(model, prompt, output)
    scale = model.name                                   # a new model or machine starts from its own targets
    c = st.columns(2)
    ttft_slo = float_field("TTFT target (ms)", hint["ttft_ms"], 0.001, 1e9, key=f"queue.ttft_slo.{scale}", where=c[0],
                           help=f"Suggested: {TTFT_TARGET_TIMES:g} × this server's unloaded TTFT "
                                f"({hint['unloaded_ttft_ms']:.3g} ms: the prompt's prefill, alone on the server).")
    itl_slo = float_field("ITL target (ms per token)", hint["itl_ms"], 0.001, 1e9, key=f"queue.itl_slo.{scale}",
                          where=c[1], help=f"Suggested: {ITL_TARGET_TIMES:g} × one decode step of a lone request "
                                       f"({hint['unloaded_itl_ms']:.3g} ms).")
    if None in (ttft_slo, itl_slo):
        return
    capacity = batched(model, n, prompt, output, out_kind, ttft_slo, itl_slo)
    knob(model, n, prompt, output, out_kind, ttft_slo, itl_slo, capacity)


main()
