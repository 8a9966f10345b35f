"""Calibration: import measured serving results (vLLM benchmark JSON or a CSV), fit the efficiency knobs and show
predicted vs measured with the error.

Numbers: `calculators.planning.calibration` (read_vllm_json, read_csv, calibrate).
"""
from __future__ import annotations

import inspect

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import calculators.planning.calibration as calibration_module
from calculators.planning.calibration import EXAMPLE_MBU, EXAMPLE_MFU, calibrate, example_csv, read_csv, \
    read_vllm_json
from calculators.units import KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, remember, setup_page, show_error
from ui.widgets import remembered_value, set_remembered
from ui.world import world_weight_dtype
from ui.model_source import choice_field
from ui.model_source import sizing_with_gpus
from ui.charts import style as chart_style
from ui.published import published_serving_section

EXAMPLE_KEY = "cal.example"            # the example rows last put in the box (replaced while nobody edited them)


def example_rows(config, device, wd: str, kd: str) -> str:
    """The box's example, made for the model, device and precisions shown (`calculators.planning.calibration.
    example_csv`): while the box still holds the previous example, a new model or device brings its own, so the
    example never implies an efficiency above 1 on the machine it is shown with."""
    text = example_csv(config, device, wd, kd)
    ss = st.session_state
    if remembered_value("cal.text") in (None, ss.get(EXAMPLE_KEY)):
        set_remembered("cal.text", text)
    ss[EXAMPLE_KEY] = text
    return text


def main() -> None:
    setup_page("Calibration", icon=":material/tune:")
    st.title("Calibration")
    published_serving_section()           # its error chart first: a projector's first screen at 1366×768
    st.subheader("Your measurements")
    st.markdown("Predictions use datasheet peaks scaled by efficiency knobs. Measure your own server, paste the "
                "results here, and the knobs are fitted to them: the table then says how far each prediction is "
                "from what you measured.")
    chosen = sizing_with_gpus()
    if chosen is None:
        return
    config, device, setup = chosen
    cols = st.columns(3)
    wd_default, wd_key = world_weight_dtype("cal.wd", device, "fp16")
    wd = choice_field("Weight precision", WEIGHT_DTYPES, wd_default, key=wd_key, where=cols[0])
    kd = choice_field("KV precision", KV_DTYPES, default_kv_dtype(wd), key="cal.kd", where=cols[1])
    fmt = choice_field("Format", ("CSV", "vLLM benchmark JSON"), "CSV", key="cal.fmt", where=cols[2])
    tp = None
    if fmt != "CSV":
        tp = int_field("TP of the vLLM run", 1, 1, 512, key="cal.tp")
    example = example_rows(config, device, wd, kd)
    store = remember("cal.text", example)
    text = st.text_area("Measured results", key="cal.text", on_change=store, height=180,
                        help="CSV columns: prompt_tokens, output_tokens, batch, ttft_ms, itl_ms[, tp]. JSON: the "
                             "file benchmark_serving.py --save-result writes.")
    if text == example:
        st.caption(f"The example rows are made for {config.name} on {device.name} in {wd}: the times a server "
                   f"would measure at decode MBU {EXAMPLE_MBU:g} and prefill MFU {EXAMPLE_MFU:g}, so the fit "
                   "below gives those back. Replace them with your own measurements.")
    if setup is None or (fmt != "CSV" and tp is None):
        return
    try:
        rows = read_csv(text) if fmt == "CSV" else read_vllm_json(text, tp)
        fit = calibrate(config, device, rows, wd, kd, setup.link)
    except SpecError as e:
        show_error(e)
        return
    for words in fit["held_at_one"]:
        st.warning(words[0].upper() + words[1:], icon=":material/warning:")
    c = st.columns(3)
    c[0].metric("Decode MBU (fitted)", f"{fit['decode_mbu']:.2f}")
    c[1].metric("Prefill MFU (fitted)", f"{fit['prefill_mfu']:.2f}")
    c[2].metric("Per-call communication latency", f"{fit['alpha_ms_per_call'] * 1e3:.1f} µs",
                help="Fitted only when some row has TP > 1.")
    st.caption(f"Fixed per-step cost (fitted when three or more single-GPU rows differ in size): "
               f"{fit['step_overhead_ms']:.2f} ms.")
    df = pd.DataFrame(fit["rows"])
    fig = go.Figure()
    fig.add_scatter(x=df["measured_itl_ms"], y=df["predicted_itl_ms"], mode="markers", name="ITL",
                    marker=dict(size=12))
    fig.add_scatter(x=df["measured_ttft_ms"], y=df["predicted_ttft_ms"], mode="markers", name="TTFT",
                    marker=dict(size=12, symbol="diamond"))
    hi = float(max(df[["measured_itl_ms", "predicted_itl_ms", "measured_ttft_ms", "predicted_ttft_ms"]].max()))
    fig.add_scatter(x=[0, hi], y=[0, hi], mode="lines", name="perfect", line=dict(dash="dash", color="gray"))
    fig.update_layout(height=420, font=dict(size=14), xaxis_title="measured (ms)", yaxis_title="predicted (ms)",
                      title="Predicted vs measured after fitting", margin=dict(l=10, r=10, t=60, b=10))
    st.plotly_chart(chart_style(fig))
    df_with_download(df, "calibration", column_config={c: st.column_config.NumberColumn(format="%.3f")
                                                       for c in df.columns if df[c].dtype.kind == "f"}, show={
        "prompt_tokens": "prompt", "output_tokens": "output", "batch": None,
        "measured_itl_ms": "ITL meas.", "predicted_itl_ms": "ITL pred.", "itl_error_percent": "ITL err %",
        "measured_ttft_ms": "TTFT meas.", "predicted_ttft_ms": "TTFT pred.", "ttft_error_percent": "TTFT err %",
        "tp": "TP"})
    st.caption("Times in ms; error = predicted ÷ measured − 1. "
               f"Mean absolute error: ITL {fit['itl_mean_abs_error_percent']:.1f}%, TTFT "
               f"{fit['ttft_mean_abs_error_percent']:.1f}%.")
    formula_expander("How the knobs are fitted", inspect.getdoc(calibration_module))


main()
