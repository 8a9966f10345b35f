"""Prefill and decode, measured: the teacher's run as a timeline (one prefill bar, then one tick per token), TTFT,
the inter-token latency distribution and tokens/s; then a prompt-length sweep on this machine showing TTFT grow
and what ITL does, beside the calculators' prediction for this machine.

Numbers: `engine.record_generation` (the run), `engine.instruments.readout.record_timeline`, `engine.instruments.profile.profile_run`
(the sweep), `calculators.sizing.latency.prefill_ms` / `decode_step_ms` on `specs.devices.measure_this_machine`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from calculators.claims import decode_beat_claim
from calculators.sizing.latency import decode_step_ms, prefill_ms
from engine import Model
from engine.instruments.profile import profile_run
from engine import threads
from engine.instruments.readout import record_timeline, sweep_lengths, token_end_times_ms
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, model_picker, setup_page, show_error
from ui.charts import figure, style
from ui.inside import Prompt, run_settings, session_cached, step_texts, teacher_prompt, teacher_run
from ui.metrics import metric_row
from ui.model_source import measured_machine
from ui.narration import busy_notice, gap_words, step_spread, sweep_words

ENGINE_DTYPE = "fp32"               # the engine's weights, activations and cache are float32
SWEEP_STEPS = 4                     # decode steps timed per prompt length (the median is reported)
SWEEP_KEY = "pd.sweep_max"


MAX_LABELS = 8                      # token texts written on the timeline (more would overlap)


def timeline(rec, texts: list[str], tl: dict) -> None:
    ends = token_end_times_ms(rec)                                              # ms at which each token exists
    every = max(1, -(-len(texts) // MAX_LABELS))
    shown = [t if i % every == 0 else "" for i, t in enumerate(texts)]
    traces = [dict(type="bar", y=["run"], x=[tl["ttft_ms"]], base=[0], orientation="h", name="prefill (whole prompt)",
                   marker=dict(color="#f59e0b"), text=[f"prefill {tl['ttft_ms']:.0f} ms"], textposition="inside")]
    if len(ends) > 1:
        traces.append(dict(type="bar", y=["run"] * (len(ends) - 1), x=np.diff(ends), base=ends[:-1],
                           orientation="h", name="decode steps (one token each)", marker=dict(color="#2563eb"),
                           marker_line=dict(color="white", width=2)))
    sides = ["top center" if (i // every) % 2 == 0 else "bottom center" for i in range(len(texts))]
    traces.append(dict(type="scatter", x=ends, y=["tokens"] * len(ends), mode="markers+text", text=shown,
                       textposition=sides, name="a token appears", cliponaxis=False,
                       marker=dict(symbol="line-ns-open", size=18, color="#111827")))
    fig = figure(*traces, barmode="overlay", xaxis=dict(title="time since the request (ms)"),
                 yaxis=dict(categoryorder="array", categoryarray=["run", "tokens"]))
    st.plotly_chart(style(fig, height=330), width="stretch")
    if every > 1:
        st.caption(f"Each tick is one token; one token in {every} has its text written (more would overlap).")


def itl_histogram(tl: dict) -> None:
    med = tl["median_itl_ms"]
    fig = figure(dict(type="histogram", x=tl["itl_ms"], nbinsx=20, marker=dict(color="#2563eb")),
                 shapes=[dict(type="line", x0=med, x1=med, y0=0, y1=1, yref="paper", line=dict(dash="dot"))],
                 annotations=[dict(x=med, y=0.98, yref="paper", yanchor="top", xanchor="left", xshift=6,
                                   text=f"median {med:.1f} ms", showarrow=False, bgcolor="rgba(255,255,255,0.85)")],
                 xaxis=dict(title="inter-token latency (ms)"), yaxis=dict(title="decode steps"))
    st.plotly_chart(style(fig, height=320, legend_top=False), width="stretch")


def run_section(model: Model, prompt: Prompt, top) -> None:
    """The run's numbers and timeline in `top` (the page's first screen); how they were measured under them."""
    settings = run_settings(model)
    if settings is None:
        return
    try:
        with top, st.spinner("Generating …"):
            rec = teacher_run(model, prompt, *settings)
    except SpecError as e:
        show_error(e, top)
        return
    texts = step_texts(model, rec)
    tl = record_timeline(rec)
    load = threads.status()
    notice = busy_notice(load.others_busy, load.cores, step_spread(tl["itl_ms"]))
    with top:
        metric_row([("TTFT (ms)", f"{tl['ttft_ms']:,.1f}", "Time to first token: the prefill of the whole prompt."),
                    ("Median ITL (ms)", f"{tl['median_itl_ms']:,.1f}" if len(tl["itl_ms"]) else "–",
                     "Inter-token latency: one decode step."),
                    ("Decode speed (tokens/s)",
                     f"{tl['tokens_per_s']:,.1f}" if np.isfinite(tl["tokens_per_s"]) else "–", "1 / mean ITL"),
                    ("Whole run (ms)", f"{tl['total_ms']:,.0f}", f"{len(rec.steps)} tokens")])
        timeline(rec, texts, tl)
        if notice:
            st.warning(notice, icon=":material/warning:")
    st.caption(f"Measured on this server: {model.name}, float32 NumPy, one sequence (batch 1), a "
               f"{len(prompt.ids):,}-token prompt, {len(rec.steps)} new tokens ({rec.finish_reason}).")
    if len(tl["itl_ms"]):
        itl_histogram(tl)
    st.markdown(decode_beat_claim(tl["itl_ms"], busy=notice is not None))
    formula_expander("Where these numbers come from",
                     "Each forward pass has its own wall-clock timer in the run's record:\n\n"
                     "- **TTFT** = the prefill pass over all prompt tokens (it also yields the first token).\n"
                     "- **ITL** = one decode pass, one token through every layer; the histogram shows every step.\n"
                     "- **tokens/s** = 1 ÷ mean ITL (`engine.instruments.readout.record_timeline`).\n\nSource: 003 Detail 11")
    df = pd.DataFrame({"step": [s.step for s in rec.steps], "token": texts,
                       "seconds": [round(s.seconds, 6) for s in rec.steps],
                       "cache_tokens": [s.cache_tokens for s in rec.steps]})
    df_with_download(df, "run_timeline")


def sweep(model: Model, lengths: tuple[int, ...]) -> pd.DataFrame:
    rows = []
    for n in lengths:
        run = profile_run(model, n, SWEEP_STEPS)
        rows.append({"prompt tokens": n, "TTFT measured (ms)": run.prefill_ms, "ITL measured (ms)": run.itl_ms})
    return pd.DataFrame(rows)



def sweep_section(model: Model) -> None:
    st.subheader("Longer prompts: what happens to TTFT and to ITL?")
    st.markdown("Prefill handles the whole prompt in one pass, so its time grows with the prompt. A decode step "
                "handles one token and mostly reads the weights, so it barely notices how long the prompt was.")
    ctx = model.config.max_position_embeddings
    lengths = sweep_lengths(ctx - SWEEP_STEPS - 1)
    st.caption(f"Prompt lengths: {', '.join(f'{n:,}' for n in lengths)} tokens of random ids, {SWEEP_STEPS} decode "
               "steps "
               "each (the median step is shown).")
    key = (model.source, lengths)
    have = st.session_state.get(SWEEP_KEY) == key
    if not have and not st.button("Run the sweep", key="pd.run_sweep", icon=":material/speed:",
                                  help="A few seconds for the default model."):
        return
    with st.spinner("Measuring each prompt length …"):
        df, load = session_cached("sweep", key, lambda: threads.measured_under_load(lambda: sweep(model, lengths),
                                                                             matrices=model.weight_matrices))
        df = df.copy()
        device = measured_machine()
    st.session_state[SWEEP_KEY] = key
    notice = busy_notice(load.others, load.cores)
    if notice:
        st.warning(notice, icon=":material/warning:")
    df["TTFT predicted (ms)"] = [prefill_ms(model.config, device, n, weight_dtype=ENGINE_DTYPE)["prefill_ms"]
                                 for n in df["prompt tokens"]]
    df["ITL predicted (ms)"] = [decode_step_ms(model.config, device, n, weight_dtype=ENGINE_DTYPE)["step_ms"]
                                for n in df["prompt tokens"]]
    traces = [dict(type="scatter", x=list(df["prompt tokens"]), y=list(df[col]), name=col, mode="lines+markers",
                   line=dict(color=color, dash=dash))
              for col, color, dash in (("TTFT measured (ms)", "#f59e0b", "solid"),
                                       ("TTFT predicted (ms)", "#f59e0b", "dot"),
                                       ("ITL measured (ms)", "#2563eb", "solid"),
                                       ("ITL predicted (ms)", "#2563eb", "dot"))]
    fig = figure(*traces, xaxis=dict(title="prompt length (tokens)"), yaxis=dict(title="time (ms)", type="log"))
    st.plotly_chart(style(fig, height=430), width="stretch")
    st.caption(f"Prediction for this machine as measured by NumPy: {device.memory_bandwidth_gb_s:,.1f} GB/s, "
               f"{device.peak(ENGINE_DTYPE) / 1e9:,.1f} GFLOP/s in float32; each step takes the larger of its "
               "compute time and its memory time (the roofline).")
    st.markdown(sweep_words(df, notice is not None))
    st.markdown(gap_words(df))
    df_with_download(df.round(3), "prefill_decode_sweep")
    formula_expander("The prediction", "TTFT ≈ max(prefill FLOPs ÷ peak FLOP/s, bytes ÷ bandwidth) and "
                     "ITL ≈ max(step FLOPs ÷ peak, (weights + KV cache) ÷ bandwidth), with this machine's measured "
                     "peak and bandwidth (`calculators.sizing.latency.prefill_ms`, `decode_step_ms`, float32).\n\n"
                     "Source: 003 Details 11 and 12")


def main() -> None:
    """The run's numbers and timeline first (a projector's first screen at 1366×768); the intro, the prompt and
    the run settings under them, then the prompt-length sweep."""
    setup_page("Prefill and decode, measured", icon=":material/timer:")
    st.title("Prefill and decode, measured")
    top = st.container()
    st.markdown("A reply has two phases. First the model reads the whole prompt in one pass (prefill): that is the "
                "wait before the first token. Then it produces one token per pass (decode), each pass the same "
                "work, so on a quiet machine the tokens come at a steady beat. Here is your run on this server, timed pass by pass.")
    model = model_picker()
    prompt = teacher_prompt(model)
    if model is None or prompt is None:
        return
    run_section(model, prompt, top)
    sweep_section(model)


main()
