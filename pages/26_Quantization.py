"""Quantization: what fewer bits per weight buy (size, bandwidth floor) by calculation, one weight's round trip
by hand, and what they cost by measurement on the loaded engine model (weight error, logit error, top-1
agreement, perplexity).

Numbers: `calculators.sizing.quantization` (precision_table, quantize/dequantize, quantization_error),
`calculators.explain` (formulas), `engine.model.quantize.measure_quantization` (the experiment).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import streamlit as st

from calculators.explain import explain_bandwidth_floor, explain_quantize_value, explain_weight_bytes
from calculators.sizing.quantization import dequantize, precision_table, q_range, quantization_error, quantize
from calculators.units import GB, fmt_bytes, fmt_num
from engine.model.quantize import (Scheme, below_16_bits, measure_quantization, quantization_memory_bytes,
                                   stored_precision)
from specs.model_config import ModelConfig, SpecError
from specs.sources import readable_source
from ui import (df_with_download, float_field, formula_expander, int_field, model_picker, remember, setup_page,
                show_error)
from calculators.multi_gpu.tensor_parallel import per_gpu_memory
from ui.multi_gpu import MultiGPU, multi_gpu_sidebar
from ui.server import heavy_job
from ui.model_source import choice_field, device_picker, model_source, units_note
from ui.charts import style as chart_style

DTYPES = ("fp32", "bf16", "fp8", "int8", "int4")
SCHEMES = [Scheme(8, "per_tensor"), Scheme(8, "per_channel"), Scheme(8, "per_group", 128), Scheme(4, "per_tensor"),
           Scheme(4, "per_channel"), Scheme(4, "per_group", 128), Scheme(4, "per_group", 64),
           Scheme(4, "per_group", 32)]
BY_LABEL = {s.label: s for s in SCHEMES}
DEFAULT_SCHEMES = ["INT8 per channel", "INT4 group 64"]
SCHEMES_KEY = "quant.schemes"
RESULTS_KEY = "quant.results"             # {(model source, scheme labels, lm_head): rows}


# ============================================================================================ calculated
def size_section(config: ModelConfig, device, setup: MultiGPU | None = None, first=None) -> None:
    """The heading, the group size and the chart in `first` (the page's first screen), the formula and the table
    where the page is."""
    first = first if first is not None else st.container()
    first.subheader(f"Calculated: {config.name} at each precision on {device.name}")
    cols = first.columns([1, 3])
    g = int_field("Scale group size (0 = no scales)", 0, 0, 1 << 20, key="quant.group", where=cols[0],
                  help="Integer formats store one fp16 scale per group of weights (GPTQ/AWQ use 64-128).")
    if g is None:
        return
    bw = device.memory_bandwidth_bytes_per_s
    rows = precision_table(config, bw, DTYPES, group_size=g or None)
    df = pd.DataFrame({
        "precision": [r["dtype"] for r in rows],
        "bits per weight": [r["bits_per_weight"] for r in rows],
        "weights (GB)": [r["weight_bytes"] / GB for r in rows],
        "bandwidth floor (ms/token)": [r["bandwidth_floor_ms"] for r in rows],
    })
    if setup is not None:
        df[f"fits on {setup.label()}, 1 × 2,048 tokens"] = [
            per_gpu_memory(config, device, setup.mesh, min(2048, config.max_position_embeddings), 1, r["dtype"],
                           None, **setup.memory_kw())["fits"] for r in rows]
    fig = px.bar(df, x="precision", y="weights (GB)", text=[f"{fmt_bytes(r['weight_bytes'])}<br>"  # 2 lines fit
                                                            f"{fmt_num(r['bandwidth_floor_ms'], 3)} ms/token"
                                                            for r in rows],
                 title=f"Weight size and the decode floor it sets (weights / {fmt_num(device.memory_bandwidth_gb_s, 4)}"
                       f" GB/s)")
    fig.update_traces(textangle=0, textposition="outside", cliponaxis=False, marker_color="#4C78A8")
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=60, b=10))
    cols[1].plotly_chart(chart_style(fig, span=3 / 4))
    int4 = explain_weight_bytes(config, "int4", group_size=g or None)
    floor = explain_bandwidth_floor(int4.value, bw)
    formula_expander("Formula: INT4 size and its floor",
                     f"**Size** `{int4.symbolic}`\n\n{int4.formula}\n\n**Floor** `{floor.symbolic}`\n\n"
                     f"{floor.formula}\n\nSources: {int4.source}; {floor.source}")
    df_with_download(df, "precision_table", column_config={
        c: st.column_config.NumberColumn(format="%.4g") for c in df.columns[1:5]})
    st.caption("Floors are for one GPU reading all the weights; the last column checks memory for the layout in "
               "the sidebar (weights + one 2,048-token sequence + overheads).")


def walkthrough_section() -> None:
    st.subheader("One weight through the round trip")
    st.markdown("A group's largest magnitude sets the step between grid points; each weight snaps to the nearest "
                "point and is stored as a small integer.")
    cols = st.columns(3)
    x = float_field("Weight x", 0.0217, -1e6, 1e6, key="quant.x", step=0.001, where=cols[0])
    m = float_field("Largest |w| in its group", 1.0, 1e-12, 1e6, key="quant.max", step=0.1, where=cols[1])
    bits = int(choice_field("Bits", ("8", "4"), "8", key="quant.bits", where=cols[2], horizontal=True))
    if x is None or m is None:
        return
    steps = explain_quantize_value(x, m, bits)
    labels = {"scale": "scale", "q": "stored integer q", "dequantized": "reconstructed ŵ", "error": "error |ŵ − x|"}
    c = st.columns(4)
    for col, e in zip(c, steps):
        col.metric(labels[e.name], f"{int(e.value):,}" if float(e.value).is_integer() else fmt_num(e.value, 3))
    df = pd.DataFrame({"step": [labels[e.name] for e in steps], "formula": [e.symbolic for e in steps],
                       "with numbers": [e.formula for e in steps], "value": [e.value for e in steps]})
    df_with_download(df, "one_weight_walkthrough")
    lo, hi = q_range(bits)
    st.caption(readable_source(f"Source: {steps[0].source}. ") + f"INT{bits} keeps integers in [{lo}, {hi}]; "
               f"the scale divides the largest magnitude by {hi}.")


def granularity_section() -> None:
    st.subheader("Why scales are kept per channel or per group")
    st.markdown("One outlier stretches the scale of everything that shares it. Below, a random 64 × 256 matrix "
                "(values around ±0.02) gets one outlier; each granularity quantizes it and the error is measured.")
    outlier = float_field("Outlier value", 1.0, 0.0, 1e6, key="quant.outlier", step=0.5)
    if outlier is None:
        return
    w = np.random.default_rng(0).normal(0.0, 0.02, (64, 256))
    w[3, 17] = outlier
    rows = []
    for bits in (8, 4):
        for gran, gs in (("per_tensor", 128), ("per_channel", 128), ("per_group", 64)):
            qt = quantize(w, bits, gran, group_size=gs)
            err = quantization_error(w, dequantize(qt))
            rows.append({"bits": bits, "granularity": gran.replace("_", " ") if gran != "per_group" else "per group of 64",
                         "scales stored": qt.num_scales, "relative RMSE": err["relative_rmse"],
                         "SQNR (dB)": err["sqnr_db"], "storage (bytes, fp16 scales)": qt.storage_bytes()})
    df = pd.DataFrame(rows)
    df_with_download(df, "granularity_vs_error", column_config={
        "relative RMSE": st.column_config.NumberColumn(format="%.4f"),
        "SQNR (dB)": st.column_config.NumberColumn(format="%.1f"),
        "storage (bytes, fp16 scales)": st.column_config.NumberColumn(format="localized")})
    st.caption("Error and storage from `calculators.sizing.quantization` (`quantize` → `dequantize` → `quantization_error`).")


# ============================================================================================ measured
def measured_section(model) -> None:
    st.subheader("Measured on the loaded model")
    if model is None:
        st.info("Load a model in the sidebar to measure what quantization does to it.")
        return
    st.markdown(
        f"Each scheme rounds every projection matrix of **{model.name}** to integers and back (norms, embedding "
        "and LM head stay float32), then runs the model on a fixed English paragraph and compares its logits with "
        "the float32 run. This reads the whole model once per scheme, so it runs only when you press the button.")
    stored = stored_precision(model)
    if below_16_bits(stored):
        st.info(f"**What the baseline is.** {model.name} was stored as **{stored}** in its file (weights already "
                "rounded to a few bits in blocks). The float32 run below is those weights de-quantized, the best "
                "reference this machine has: the original 16-bit weights are not shipped. Each scheme therefore "
                "rounds weights a second time, with plain round-to-nearest (no GPTQ/AWQ calibration), so its error "
                "overstates what a calibrated INT4 or INT8 does to the original model; the ranking of the schemes "
                "is what carries over.", icon=":material/info:")
    if model.random_weights:
        st.warning("Random weights: errors are real, but perplexity is that of a model that knows no language.",
                   icon=":material/casino:")
    cols = st.columns([3, 1])
    store = remember(SCHEMES_KEY, [s for s in DEFAULT_SCHEMES if s in BY_LABEL])
    chosen = cols[0].multiselect("Schemes", list(BY_LABEL), key=SCHEMES_KEY, on_change=store)
    head = cols[1].checkbox("Also the LM head", key="quant.lm_head",
                            help="Quantize the output projection (and the tied embedding) too.")
    key = (model.source, tuple(chosen), bool(head))
    results = st.session_state.setdefault(RESULTS_KEY, {})
    if st.button("Measure", key="quant.measure", type="primary", icon=":material/science:", disabled=not chosen):
        try:                                       # a heavy job: one at a time on the server, memory checked
            with heavy_job("the quantization measurement", quantization_memory_bytes(model, head)):
                bar = st.progress(0.0, text=f"Running {model.name} in float32 (the baseline) …")

                def progress(fraction: float, message: str) -> None:
                    bar.progress(min(max(fraction, 0.0), 1.0), text=message)

                try:
                    results[key] = measure_quantization(model, [BY_LABEL[c] for c in chosen],
                                                        include_lm_head=head, progress=progress)
                finally:
                    bar.empty()
        except SpecError as e:
            show_error(e)
            return
    if not chosen:
        st.info("Pick at least one scheme.")
        return
    rows = results.get(key)
    if rows is None:
        st.caption("Press **Measure** to run these schemes.")
        return
    df = pd.DataFrame(rows)
    quantized = df[df["bits"] < 32]
    charts = st.columns(2)
    for col, y, label, fmt in ((charts[0], "perplexity_change_pct", "Perplexity change (%)", ",.3~r"),
                               (charts[1], "top1_agreement", "Top-1 agreement", ".1%")):
        fig = px.bar(quantized, x="scheme", y=y, text_auto=fmt, labels={y: f"{label.lower()} vs fp32"},
                     title=label)
        fig.update_traces(marker_color="#4C78A8", textposition="outside", cliponaxis=False)
        fig.update_layout(height=340, margin=dict(l=10, r=10, t=50, b=10))
        if y == "top1_agreement":
            fig.update_yaxes(tickformat=".0%", range=[0, 1.08])
        col.plotly_chart(chart_style(fig, span=1 / 2))
    df_with_download(df, "measured_quantization", column_config={
        "weight_relative_rmse": st.column_config.NumberColumn("weight relative RMSE", format="%.4f"),
        "logit_max_abs_error": st.column_config.NumberColumn("max |Δ logit|", format="%.4f"),
        "logit_mean_abs_error": st.column_config.NumberColumn("mean |Δ logit|", format="%.4f"),
        "top1_agreement": st.column_config.NumberColumn("top-1 agreement", format="percent"),
        "perplexity": st.column_config.NumberColumn(format="%.4g"),
        "perplexity_change_pct": st.column_config.NumberColumn("perplexity change (%)", format="%.3f")},
        show=[*MEASURED_FIRST, *(c for c in df.columns if c not in MEASURED_FIRST)])      # what fits 1366 px
    st.caption(f"On {rows[0]['tokens']} tokens. Weight relative RMSE = RMS(ŵ − w) / RMS(w) over all projection "
               "matrices; top-1 agreement = share of positions whose most likely next token is unchanged "
               "(`engine.model.quantize.measure_quantization`).")


# The measured table's most telling columns first: a projector draws the leading ones that fit (ui.widgets).
MEASURED_FIRST = ("scheme", "bits", "perplexity_change_pct", "top1_agreement", "perplexity", "weight_relative_rmse",
                  "logit_mean_abs_error", "logit_max_abs_error")


def main() -> None:
    """The calculated sizes' chart under the title (a projector's first screen at 1366×768); the intro, the
    world's notes, the formula and the table under it, then the round trip, the granularity and the measurement."""
    setup_page("Quantization", icon=":material/compress:")
    st.title("Quantization")
    top = st.container()
    st.markdown(
        "Decode streams every weight once per token, so storing weights in 8 or 4 bits instead of 16 cuts the "
        "bytes moved, and the bandwidth floor, by 2× or 4×. The price is rounding error; here you calculate the "
        "gain and measure the error on a real model.")
    model = model_picker()
    config = model_source(engine=model)
    device = device_picker()
    setup = multi_gpu_sidebar(config, device)
    units_note()
    if config is None or device is None:
        st.info("Choose a model to size and a device in the sidebar.")
    else:
        try:
            size_section(config, device, setup, top)
        except SpecError as e:
            show_error(e)
    for section in (walkthrough_section, granularity_section, lambda: measured_section(model)):
        try:
            section()
        except SpecError as e:
            show_error(e)


main()
