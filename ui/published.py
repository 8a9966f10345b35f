"""The published data-centre serving table on the Calibration page: each figure read in its source, the
planner's prediction with the default settings of the source's stack, and the error (pages only call this)."""
from __future__ import annotations

import inspect

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import calculators.planning.published as published_module
from calculators.planning.accuracy import BAR_MEDIAN, BAR_WORST, bar_by_pricing, group_value_words
from calculators.planning.published import committed_comparison, compare_all, error_table, stack_key_of
from specs.stacks import load_stack
from ui.charts import style as chart_style
from ui.headings import human_heading
from ui.widgets import df_with_download, formula_expander


# the published figure's quantity and unit, short enough for a projector's table
MEASURES = {"output_tok_s": "tok/s", "itl_ms": "ITL ms", "ttft_ms": "TTFT ms", "e2e_ms": "E2E ms"}


@st.cache_data(show_spinner=False)
def _committed(pricing: str) -> dict | None:
    """The rows as bench/bench_published.py last priced them (instant; None where the file does not hold them)."""
    return committed_comparison(pricing)


@st.cache_data(show_spinner=False)
def _priced_now() -> dict:
    """The rows priced here by the closed form (seconds): where the committed file is older than the table."""
    return compare_all()


def _planner_pricing(choices: list[str]) -> str:
    """The pricing the page opens on: the one the planner here uses when nobody says (measured kernels where a
    profile is installed, from aiconfigurator-core or this project's profiler, and $INFERENCE_LAB_PROFILE does not
    ask for the closed form; and committed), so the error shown first is the error of the numbers it gives."""
    from calculators.planning.measured_step import default_profile_choice
    from specs.profiles import available_profiles
    measured = "measured kernels" in choices and default_profile_choice() != "none" and bool(available_profiles())
    return "measured kernels" if measured else "closed form"


def published_serving_section() -> None:
    """The median / worst error of bench/published_serving.csv and its error chart right under them (the Calibration
    page's first screen at 1366×768; what the rows are in an expander between), then the error by regime and the
    table. Priced by the closed form, or by measured kernels where bench/bench_published.py ran with them."""
    st.subheader("Published data-centre measurements")
    choices = ["closed form"] + (["measured kernels"] if _committed("measured kernels") else [])
    pricing = st.radio("Priced by", choices, index=choices.index(_planner_pricing(choices)), horizontal=True,
                       key="published.pricing",
                       help="Closed form: datasheet rooflines at each stack's fitted efficiencies. Measured kernels: "
                            "each op from kernels measured on the GPU and stack (aiconfigurator-core), as the "
                            "planner prices when that extra is installed; recorded by bench/bench_published.py")
    res = _committed(pricing) or _priced_now()        # measured kernels is offered only where committed
    df = pd.DataFrame(res["rows"])
    df["error %"] = 100 * df["error"]
    df["stack"] = [load_stack(stack_key_of(r)).name for r in res["rows"]]        # a build says so
    table = pd.DataFrame(error_table(res["rows"]))
    alls = {r["split"]: r for r in table.to_dict("records") if r["group"] == "all"}
    c = st.columns(5)
    c[0].metric("Figures priced", f"{len(df)}", help=f"{len(res['unpriced'])} more are listed in the table file but "
                "not priced: their source states no mean input length")
    if "test" in alls:
        t = alls["test"]
        c[1].metric("Held-out rows: median |error|", f"{100 * t['median_abs_error']:.1f}%",
                    help=f"{t['n']} test rows, declared (every third row) before any fit; worst "
                         f"{100 * t['worst_abs_error']:.1f}%")
        c[2].metric("Held-out rows: worst |error|", f"{100 * t['worst_abs_error']:.1f}%")
    if "fit" in alls:
        f = alls["fit"]
        fit_help = (f"{f['n']} fit rows: the efficiencies were fitted on these, so their error is not an accuracy; "
                    "shown beside the held-out rows")
        c[3].metric("Fit rows: median |error|", f"{100 * f['median_abs_error']:.1f}%", help=fit_help)
        c[4].metric("Fit rows: worst |error|", f"{100 * f['worst_abs_error']:.1f}%", help=fit_help)
    with st.expander("What the rows are, and the error's sign"):
        st.markdown("Each row is a figure read in its source (MLPerf Inference results, TensorRT-LLM's performance "
                    "overview, NVIDIA NIM, AMD ROCm and vLLM pages) with its exact settings. The prediction uses the "
                    "default settings of the stack the source names (specs/stacks.json: its all-reduce, scheduler "
                    "limits, efficiencies and fixed step cost). Those efficiencies were fitted on the **fit** rows "
                    "only; the **test** rows were set aside before fitting, so their error is the accuracy to expect. "
                    "An MLPerf row is priced at its dataset's prompt and answer lengths (specs/mlperf_lengths.json), "
                    "not at their means; its label shows the means ('mean 222/290'). AMD's MLPerf v5.1 rows ran "
                    "AMD's own harness and are priced as a build of vLLM with its own AMD factors, fitted on its fit "
                    "rows; that split was chosen with the held-out errors in view, so read AMD's held-out figures as "
                    "somewhat optimistic (docs/measured-kernels.md). "
                    "Error = predicted speed ÷ published speed − 1: + means the planner is too optimistic.")
    # attention data-parallel rows say so: TP 8 with DP 8 is 8 replicas of TP 1 attention, experts over all 8
    # a row priced at its dataset's length distributions (MLPerf) shows the means of them
    label = [f"{m} {w}, {g}×{d} TP{t}{'' if str(dp or 1) == '1' else f' DP{dp}'}{'' if e == '1' else f' EP{e}'}, "
             f"{'mean ' if ln else ''}{i}/{o}, {mo} {cc}".strip()
             for m, w, g, d, t, dp, e, i, o, mo, cc, ln in zip(df.model, df.weights, df.gpus, df.device, df.tp, df.dp,
                                                               df.ep, df.prompt_tokens, df.output_tokens, df["mode"],
                                                               df.concurrency, df["lengths"].fillna(""))]
    fig = go.Figure(go.Bar(y=[f"{sp} · {lab} · {human_heading(m)}" for sp, lab, m in zip(df.split, label, df.metric)],
                           x=df["error %"], orientation="h",
                           marker_color=[("#a93226" if sp == "test" else "#e6b0aa") if abs(x) > 35 else
                                         ("#2e86c1" if sp == "test" else "#9ab7d3")
                                         for x, sp in zip(df["error %"], df.split)]))
    for x in (-15, 15):
        fig.add_vline(x=x, line_dash="dot", line_color="gray")
    fig.update_layout(height=28 * len(df) + 120, font=dict(size=14), xaxis_title="error (%): + = too optimistic",
                      title="Prediction error per published figure<br>(dark: held-out test rows; red: off by more than 35%; "
                            "dotted: ±15%)",
                      margin=dict(l=10, r=10, t=60, b=10), yaxis=dict(autorange="reversed"))
    st.plotly_chart(chart_style(fig))
    show = table.assign(**{"median |error| %": 100 * table["median_abs_error"],
                           "worst |error| %": 100 * table["worst_abs_error"]}).drop(
        columns=["median_abs_error", "worst_abs_error"])
    words = show.assign(value=[group_value_words(v) for v in show["value"]])      # the CSV keeps the identifiers
    df_with_download(show, "accuracy_by_regime", drawn=words, column_config={
        "median |error| %": st.column_config.NumberColumn(format="%.1f"),
        "worst |error| %": st.column_config.NumberColumn(format="%.1f")})
    st.markdown("**Closed form or measured kernels, regime by regime** (held-out rows; issue 36's bar: median "
                f"≤ {100 * BAR_MEDIAN:.0f}%, worst ≤ {100 * BAR_WORST:.0f}%). With aiconfigurator-core installed the "
                "planner prices each op from kernels measured on the GPU and stack: these are its errors, from "
                "bench/published_accuracy.json as `python bench/bench_published.py` last wrote it.")
    bar = pd.DataFrame(bar_by_pricing())
    df_with_download(bar, "accuracy_closed_form_and_measured", column_config={
        c: st.column_config.NumberColumn(format="%.1f") for c in bar.columns if c.endswith("%")})
    df["measure"] = [MEASURES.get(m, m) for m in df.metric]
    keep = ["split", "regime", "stack", "model", "weights", "device", "gpus", "tp", "ep", "prompt_tokens",
            "output_tokens", "lengths", "mode", "concurrency", "metric", "measure", "published", "predicted", "error %",
            "source", "settings", "url"]
    # a projector shows the figure and its error; the settings, source text and link are in the CSV
    df_with_download(df[keep], "published_serving", column_config={
        "predicted": st.column_config.NumberColumn(format="%.2f"),
        "error %": st.column_config.NumberColumn(format="%+.0f%%"),
        "url": st.column_config.LinkColumn("source")}, show={
        "model": None, "device": None, "gpus": "GPUs", "weights": None, "measure": None, "published": None,
        "predicted": None, "error %": None, "split": None, "stack": None, "regime": None, "prompt_tokens": "prompt",
        "output_tokens": "output", "lengths": "lengths of", "concurrency": "conc.", "tp": "TP", "ep": "EP",
        "mode": None})
    formula_expander("How each figure is predicted", inspect.getdoc(published_module))
