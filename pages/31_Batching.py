"""Batching: throughput and per-stream ITL versus batch size from the step-time model, the two critical batches,
and the engine's measured tokens/s for 1, 2, 4, ... streams decoding together.

Numbers: `calculators.serving.batching` (batch_curve, kv_critical_batch, compute_critical_batch, explain_*),
`engine.serve.serving_runs.batching_run` (measured: the scheduler's tokens/s and the weight products alone in plain
NumPy, the ceiling). Every sentence stating a result comes from `ui.batching_claims`, from the numbers beside it.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from calculators.serving.batching import (REFERENCE_003, batch_curve, compute_critical_batch, explain_batch_step,
                                  explain_compute_critical_batch, explain_kv_critical_batch, kv_critical_batch,
                                  reference_batch_table)
from calculators.units import GB, MB, fmt_bytes, fmt_num
from engine.serve.serving_runs import batching_run
from engine.threads import measured_under_load
from specs.model_config import SpecError
from specs.sources import readable_source
from ui import df_with_download, formula_expander, int_field, model_picker, setup_page, show_error
from ui.serving import measured_run, step_model_inputs
from ui.charts import style as chart_style
from ui.predict import prediction_box
from ui.batching_claims import batch_text, ceiling_label, measured_words, theory_words
from ui.narration import busy_notice, spread
from ui.world import CLASS, current_world
from ui.metrics import metric_row

TABLE_BATCHES = (1, 8, 32, 128)
PREDICT_STREAMS = 8               # the question: speed-up of this many streams over one
# The measured default: streams and lengths where the weight read dominates a step on a 2-core laptop (16 short
# streams reach 4-5× one stream there, about all its BLAS allows), in about 20 s on a quiet machine.
DEFAULT_STREAMS, DEFAULT_TOKENS, DEFAULT_PROMPT = 16, 8, 8


def batch_points(largest: int) -> list[int]:
    """1, 2, 4, ... up to `largest`, plus the table's batches."""
    pts = {1 << k for k in range(0, max(largest, 1).bit_length())} | {b for b in TABLE_BATCHES if b <= largest}
    return sorted(pts | {largest})


def theory(model, context: int, largest: int, first) -> None:
    """The step model's chart, its three numbers and what they say in `first` (the first screen); the arithmetic and
    the tables where the page is."""
    rows = batch_curve(model, context, batch_points(largest))
    b_kv, b_c = kv_critical_batch(model, context), compute_critical_batch(model, context)
    df = pd.DataFrame(rows)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=df["batch"], y=df["total_tok_s"], name="tokens/s, all streams", mode="lines+markers",
                             line=dict(width=3, color="#4c78a8")), secondary_y=False)
    fig.add_trace(go.Scatter(x=df["batch"], y=df["itl_ms"], name="ITL per stream (ms)", mode="lines+markers",
                             line=dict(width=3, color="#e45756", dash="dot")), secondary_y=True)
    top = float(df["total_tok_s"].max())
    for b, label, color in ((b_kv, "KV read ≥ weight read", "#9d755d"), (b_c, "compute-bound", "#54a24b")):
        if not math.isinf(b) and b <= largest:
            fig.add_trace(go.Scatter(x=[b, b], y=[0, top], mode="lines", name=f"{label} from batch {batch_text(b)}",
                                     line=dict(dash="dash", color=color, width=2)), secondary_y=False)
    fig.update_xaxes(type="log", title="batch (sequences decoding together)")
    fig.update_yaxes(title="tokens/s, all streams", secondary_y=False)
    fig.update_yaxes(title="ms per token, each stream", secondary_y=True)
    fig.update_layout(height=460, title=f"{model.name}, {context:,} tokens of context each",
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=10, r=10, t=60, b=10))
    first.plotly_chart(chart_style(fig))
    c = first.columns(3)
    c[0].metric("KV read ≥ weight read from batch", batch_text(b_kv),
                help="From this batch on the sequences' KV caches cost more bandwidth than the weights.")
    c[1].metric("Compute-bound from batch", batch_text(b_c),
                help="From this batch on a decode step's FLOPs take longer than its memory traffic.")
    c[2].metric(f"Throughput gain, batch {rows[-1]['batch']:,} vs 1",
                f"{fmt_num(rows[-1]['gain_vs_first'], 3)}×",
                help=f"each stream slows from {fmt_num(rows[0]['itl_ms'], 3)} to {fmt_num(rows[-1]['itl_ms'], 3)} "
                     "ms per token")
    first.markdown(theory_words(rows, b_kv, b_c))
    formula_expander("The arithmetic", "\n\n".join(
        f"**{e.name}** `{e.symbolic}`\n\n{e.formula}  \n_{e.source}_" for e in (
            explain_batch_step(model, 32, context), explain_kv_critical_batch(model, context),
            explain_compute_critical_batch(model, context))) +
        "\n\nThe compute side of each step (FLOPs ÷ peak) is in the table; the step takes the larger of the two.")
    table = pd.DataFrame({"batch": df["batch"], "weights (GB)": df["weight_bytes"] / GB,
                          "KV read (GB)": df["kv_read_bytes"] / GB, "memory time (ms)": df["memory_ms"],
                          "compute time (ms)": df["compute_ms"], "step (ms)": df["step_ms"], "bound": df["bound"],
                          "tokens/s all streams": df["total_tok_s"], "tokens/s per stream": df["per_stream_tok_s"]})
    df_with_download(table, "batching_curve", show={
        "batch": None, "step (ms)": None, "bound": None, "tokens/s all streams": "tokens/s, all",
        "tokens/s per stream": "tokens/s, each", "memory time (ms)": "memory (ms)", "compute time (ms)": "compute (ms)",
        "KV read (GB)": None, "weights (GB)": None})
    with st.expander("The reference text's table (\"LLM Inference: From Black Box to Production\", Detail 21), "
                     "from its own rounded inputs"):
        ref = pd.DataFrame(reference_batch_table())
        df_with_download(pd.DataFrame({"batch": ref["batch"], "KV read (MB)": ref["kv_read_bytes"] / MB,
                                       "total read (GB)": ref["total_bytes"] / GB, "step (ms)": ref["step_ms"],
                                       "tokens/s all streams": ref["total_tok_s"],
                                       "tokens/s per stream": ref["per_stream_tok_s"]}), "batching_reference_003",
                         column_config={"step (ms)": st.column_config.NumberColumn(format="%.2f"),
                                        "KV read (MB)": st.column_config.NumberColumn(format="%.0f"),
                                        "total read (GB)": st.column_config.NumberColumn(format="%.2f"),
                                        "tokens/s all streams": st.column_config.NumberColumn(format="%.0f"),
                                        "tokens/s per stream": st.column_config.NumberColumn(format="%.0f")})
        st.caption(readable_source(REFERENCE_003.name, markdown=False) + f": {fmt_bytes(REFERENCE_003.weight_bytes)} of weights, "
                   f"{fmt_bytes(REFERENCE_003.kv_bytes_per_token)} per token, 300 tokens of context. The text divides "
                   "by the step rounded to 0.01 ms, so its tokens/s differ from these by under 0.4%.")
    st.caption("Ideal step model: the device's bandwidth and peak FLOP/s (datasheet, or this machine as measured), "
               "weights read once per step, every sequence at the same context. Real servers reach 50-70% of "
               "datasheet bandwidth, so absolute times are optimistic; the shape (where ITL stays flat and "
               "throughput climbs, and where that ends) is what carries over.")


def measured(model, slot) -> None:
    st.subheader("Measured on the engine")
    st.markdown("The engine's scheduler decodes several greedy requests in one forward pass per step, reading the "
                "weights once for all of them; each stream count runs side by side with one stream, step by step, "
                "so a busy moment slows both. Beside it, the ceiling: the same step's weight products alone in "
                "plain NumPy (no attention, no scheduler), the most batching can give on this CPU.")
    c = st.columns(3)
    largest = int_field("Most streams", DEFAULT_STREAMS, 1, 32, key="batching.streams", where=c[0])
    new = int_field("Tokens per stream", DEFAULT_TOKENS, 2, 64, key="batching.new", where=c[1])
    plen = int_field("Prompt tokens", DEFAULT_PROMPT, 1, 256, key="batching.plen", where=c[2])
    if None in (largest, new, plen):
        return
    out = measured_run(
        "batching measurement", (model.source, largest, new, plen),
        lambda: measured_under_load(lambda: batching_run(model, batch_points(largest), prompt_len=plen,
                                                         new_tokens=new),
                                    matrices=model.weight_matrices),
        model=model, tokens=plen + new, sequences=largest, button="Measure", button_key="batching.measure",
        icon=":material/science:", spinner="Decoding on the engine …",
        hint="Press Measure to time the engine (a few seconds per stream count on this machine).")
    if not out:
        return
    rows, load = out
    at = [r["gain"] for r in rows if r["streams"] == PREDICT_STREAMS]
    slot.compare(measured=(at[0], f"the engine's scheduler, {PREDICT_STREAMS} streams ÷ one") if at else None)
    notice = busy_notice(load.others, load.cores, max(spread([r["gain_min"], r["gain"], r["gain_max"]])
                                                      for r in rows))
    if notice:
        st.warning(notice, icon=":material/warning:")
    last = rows[-1]
    metric_row([(f"Scheduler, {last['streams']:,} streams (× one stream)", f"{fmt_num(last['gain'], 3)}×",
                 "Decode tokens/s of all streams ÷ one stream's, measured side by side (median of rounds)."),
                (f"Ceiling, {last['streams']:,} rows (× one row)", f"{fmt_num(last['ceiling'], 3)}×",
                 "The step's weight products alone in plain NumPy: n rows against one row, n · t(1) / t(n)."),
                ("Share of the ceiling", f"{last['share']:.0%}", "Scheduler gain ÷ ceiling, round by round (median).")])
    df = pd.DataFrame(rows)
    x = df["streams"].astype(str)
    fig = go.Figure([
        go.Bar(x=x, y=df["gain"], name="measured: scheduler tokens/s ÷ one stream's", marker_color="#4c78a8",
               text=[f"{fmt_num(g, 3)}×" for g in df["gain"]], textposition="outside",
               error_y=dict(type="data", symmetric=False, array=df["gain_max"] - df["gain"],
                            arrayminus=df["gain"] - df["gain_min"])),
        go.Scatter(x=x, y=df["ceiling"], name=ceiling_label(rows), mode="lines+markers",
                   line=dict(color="#e45756", width=3)),
        go.Scatter(x=x, y=df["streams"], name="ideal: n streams, n×", mode="lines",
                   line=dict(color="#54a24b", dash="dash")),
    ])
    bits = next(model.weight_matrices()).dtype.itemsize * 8                      # the engine's weights: fp32
    fig.update_layout(title=f"{model.config.name} (fp{bits}): gain from batching on this machine",
                      xaxis_title="streams", yaxis_title="× one stream", height=420, xaxis=dict(type="category"))
    st.plotly_chart(chart_style(fig))
    st.markdown(measured_words(rows, notice is not None))
    df_with_download(df, "batching_measured", show={
        "streams": None, "gain": None, "ceiling": None, "share": "share of ceiling", "gain_min": "gain min",
        "gain_max": "gain max", "decode_tokens_per_s": "tokens/s", "decode_step_ms": "step (ms)",
        "weight_products_ms": "products (ms)", "products_gflop_s": "GFLOP/s"})


def main() -> None:
    """The step model's inputs and its chart first (a projector's first screen at 1366×768), its numbers under the
    chart; the intro, the prediction question and the engine's measurement below."""
    setup_page("Batching", icon=":material/stacked_bar_chart:")
    st.title("Batching")
    top = st.container()
    st.markdown(
        "A decode step streams every weight from memory to produce one token per sequence. Put several "
        "sequences in the same step and they share that weight read: as long as the weight read dominates the "
        "step, total throughput climbs with the batch while each user waits barely longer per token. That ends "
        "where the KV traffic, or the arithmetic, catches up with the weight read. The step model above says "
        "where that is for the device you pick; the engine measures it on this machine.")
    slot = prediction_box("batching.speedup_8")
    model = step_model_inputs()           # the sidebar; its notes on the world go under the chart
    if model is not None:
        c = top.columns(2)
        context = int_field("Context per sequence (tokens)", 300, 0, 10_000_000, key="batching.context", where=c[0])
        largest = int_field("Largest batch", 64 if current_world() == CLASS else 1024, 1, 1_000_000,
                            key="batching.largest", where=c[1])          # a CPU is compute-bound long before 1,024
        if None not in (context, largest):
            try:
                theory(model, context, largest, top)
                slot.compare(formula=(batch_curve(model, context, [1, PREDICT_STREAMS])[-1]["gain_vs_first"],
                                      f"step-time model, {model.name}, {context:,} tokens of context"))
            except SpecError as e:
                show_error(e, top)
    engine_model = model_picker()
    if engine_model is not None:
        measured(engine_model, slot)
        if not slot.measured and slot.revealed:
            st.caption(f"Set Most streams to {PREDICT_STREAMS} or more and press Measure to put the engine's own "
                       "speed-up beside the class's guesses.")


main()
