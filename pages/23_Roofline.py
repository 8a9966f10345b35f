"""Roofline: each operation of one layer placed by its arithmetic intensity under a device's two ceilings (memory
bandwidth and peak compute), for prefill and for decode.

Numbers: `calculators.sizing.roofline.roofline` (op table, totals, ridge point, chart points), `roofline_curve` (the roof),
`calculators.explain` (formulas).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.claims import roofline_side_claim
from calculators.explain import (explain_arithmetic_intensity, explain_bandwidth_floor, explain_compute_time,
                                 explain_ridge_point)
from calculators.sizing.latency import decode_step_ms
from calculators.sizing.roofline import roofline, roofline_curve
from calculators.units import MB, WEIGHT_DTYPES, fmt_bytes, fmt_num
from specs.devices import Device
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, setup_page, show_error
from ui.multi_gpu import multi_gpu_sidebar, show_fit_verdict
from ui.model_source import choice_field, fmt_si, sizing_inputs, table_height
from ui.charts import style as chart_style
from ui.predict import BOUND_CHOICE, prediction_box
from ui.world import world_weight_dtype
from ui.metrics import metric_row

PHASE_SYMBOL = {"prefill": "circle", "decode": "diamond"}
KIND_COLORS = {"matmul": "#4C78A8", "attention": "#E45756", "elementwise": "#54A24B", "memory": "#B279A2",
               "gather": "#9D755D"}
TFLOP, GFLOP = 1e12, 1e9
PREDICT_CONTEXT = 2000            # the question: what binds a decode step at this context (batch 1)


def op_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame({
        "op": [r["name"] for r in rows],
        "kind": [r["kind"] for r in rows],
        "GFLOP": [r["flops"] / GFLOP for r in rows],
        "bytes read (MB)": [r["bytes_read"] / MB for r in rows],
        "bytes written (MB)": [r["bytes_written"] / MB for r in rows],
        "intensity (FLOP/byte)": [r["intensity_flop_per_byte"] for r in rows],
        "compute (µs)": [r["compute_us"] for r in rows],
        "memory (µs)": [r["memory_us"] for r in rows],
        "time (µs)": [r["time_us"] for r in rows],
        "bound": [r["bound"] for r in rows],
        "shape": [r["shape"] for r in rows],
    })


COLUMNS = {c: st.column_config.NumberColumn(format="%.4g") for c in
           ("GFLOP", "bytes read (MB)", "bytes written (MB)", "intensity (FLOP/byte)", "compute (µs)",
            "memory (µs)", "time (µs)")}
# What fits 1366 px, the verdict first: the shapes stay in the CSV (Model anatomy shows them).
SHOWN = {"op": None, "bound": None, "time (µs)": None, "intensity (FLOP/byte)": "FLOP/byte", "kind": None,
         "GFLOP": None, "bytes read (MB)": "read (MB)", "bytes written (MB)": "written (MB)",
         "compute (µs)": None, "memory (µs)": None}


def chart(device: Device, reports: dict[str, dict], group: str) -> go.Figure:
    """Log-log roofline with the ridge point and the ops of one layer of `group` for each phase."""
    any_report = next(iter(reports.values()))
    precision, ridge, peak = any_report["precision"], any_report["ridge_flop_per_byte"], any_report["peak_flop_s"]
    xs = [r["intensity_flop_per_byte"] for rep in reports.values() for r in rep["layers"].get(group, [])
          if r["flops"] > 0 and r["intensity_flop_per_byte"] > 0] + [ridge]
    curve = roofline_curve(device, precision, min_intensity=min(xs) / 3, max_intensity=max(xs) * 3, points=128)
    fig = go.Figure()
    fig.add_scatter(x=[p["intensity_flop_per_byte"] for p in curve], y=[p["attainable_flop_s"] / TFLOP for p in curve],
                    mode="lines", name=f"roof: {device.name} ({precision})", line=dict(color="black", width=2))
    fig.add_scatter(x=[ridge], y=[peak / TFLOP], mode="markers+text", name="ridge point",
                    text=[f"ridge {fmt_num(ridge, 3)} FLOP/B"], textposition="top left",
                    marker=dict(size=12, color="black", symbol="x"))
    for phase, rep in reports.items():
        rows = [r for r in rep["layers"].get(group, []) if r["flops"] > 0 and r["intensity_flop_per_byte"] > 0]
        for kind in KIND_COLORS:
            pts = [r for r in rows if r["kind"] == kind]
            if not pts:
                continue
            fig.add_scatter(
                x=[r["intensity_flop_per_byte"] for r in pts], y=[r["attainable_flop_s"] / TFLOP for r in pts],
                mode="markers", name=f"{phase}: {kind}", text=[r["name"] for r in pts],
                marker=dict(size=13 if phase == "prefill" else 11, symbol=PHASE_SYMBOL[phase],
                            color=KIND_COLORS[kind], line=dict(width=1, color="black")),
                customdata=[[r["bound"], fmt_si(r["flops"], "FLOP"), fmt_bytes(r["bytes_read"]),
                             fmt_bytes(r["bytes_written"])] for r in pts],
                hovertemplate="<b>%{text}</b><br>%{x:.3g} FLOP/byte<br>attainable %{y:.3g} TFLOP/s<br>"
                              "%{customdata[0]}-bound<br>%{customdata[1]}, %{customdata[2]} read, "
                              "%{customdata[3]} written<extra>" + phase +
                              "</extra>")
    fig.update_layout(xaxis=dict(type="log", dtick=1, tickformat=",~g",
                                 title="arithmetic intensity (FLOP per byte of memory traffic)"),
                      yaxis=dict(type="log", dtick=1, tickformat=",~g", title="attainable TFLOP/s"), height=560,
                      margin=dict(l=10, r=10, t=30, b=10), legend=dict(orientation="v", x=1.01, y=1))
    return fig


def phase_summary(name: str, rep: dict, where) -> None:
    t = rep["totals"]
    metric_row([("FLOPs (whole step)", fmt_si(t["flops"], "FLOP"), None),
                ("Bytes moved", fmt_bytes(t["bytes"]), None),
                ("Intensity (FLOP/B)", fmt_num(t["intensity_flop_per_byte"], 3), None),
                ("Step time, roofline (ms)", fmt_num(t["step_time_ms"], 3), f"{t['bound']}-bound: the larger of "
                 f"compute {fmt_num(t['compute_ms'], 3)} ms and memory {fmt_num(t['memory_ms'], 3)} ms")], where)
    ai = explain_arithmetic_intensity(t["flops"], t["bytes"])
    comp = explain_compute_time(t["flops"], rep["peak_flop_s"])
    mem = explain_bandwidth_floor(t["bytes"], rep["bandwidth_bytes_per_s"])
    formula_expander(f"Formula: {name} intensity and time",
                     f"**Intensity** `{ai.symbolic}` = {ai.formula}\n\n**Compute time** `{comp.symbolic}` = "
                     f"{comp.formula}\n\n**Memory time** `{mem.symbolic}` = {mem.formula}\n\n"
                     f"Step time = the larger of the two ({t['bound']}-bound). Source: {ai.source}", where=where)


def main() -> None:
    """The inputs in one row and the roofline under them (a projector's first screen at 1366×768); the intro, the
    prediction question, the world's notes, the fit and what the chart says below."""
    setup_page("Roofline", icon=":material/show_chart:")
    st.title("Roofline")
    top = st.container()
    st.markdown(
        "An operation is limited either by how fast the chip multiplies or by how fast memory feeds it; which "
        "one depends on how many FLOPs it does per byte it moves. The roofline draws both limits on one chart, "
        "and each operation of a layer lands under it as a point; below the chart, where this model's prefill and "
        "decode ops landed on this device.")
    slot = prediction_box("prefill.decode_bound_2000")
    chosen = sizing_inputs()
    if chosen is None:
        return
    config, device = chosen
    setup = multi_gpu_sidebar(config, device)
    cols = top.columns(3)
    wd_default, wd_key = world_weight_dtype("roof.wd", device)
    wd = choice_field("Weight precision", WEIGHT_DTYPES, wd_default, key=wd_key, where=cols[0],
                      help="Also sets the compute precision: fp8 weights use the fp8 peak, int8/int4 weight-only "
                           "formats are dequantised to bf16.")
    s = int_field("Tokens s (prompt / context)", min(1024, config.max_position_embeddings), 1,
                  config.max_position_embeddings, key="roof.tokens", where=cols[1],
                  help="Prefill runs s new tokens; decode runs 1 new token attending to s keys.")
    batch = int_field("Batch B", 1, 1, 1 << 16, key="roof.batch", where=cols[2])
    if s is None or batch is None or setup is None:
        return
    show_fit_verdict(config, device, setup, s, batch, wd, None)
    if slot.revealed:
        step = decode_step_ms(config, device, PREDICT_CONTEXT, 1, weight_dtype=wd)
        slot.compare(formula=(BOUND_CHOICE[step["bound"]],
                              f"{config.name} on {device.name}, {wd}: memory {step['memory_ms']:.3g} ms vs compute "
                              f"{step['compute_ms']:.3g} ms"))
    if setup.mesh.gpus_per_replica > 1:
        st.caption(f"The roofline above is one GPU's view of the whole model; on {setup.label()} each GPU runs "
                   f"1/{setup.mesh.tp} of every matmul of its stage (Beyond one GPU → Parallelism).")
    try:
        reports = {"prefill": roofline(config, device, s, s, batch, wd),
                   "decode": roofline(config, device, 1, s, batch, wd)}
    except SpecError as e:
        show_error(e)
        return
    groups = list(reports["prefill"]["layers"])
    group = groups[0]
    if len(groups) > 1:
        group = top.radio("Layer type shown", groups, horizontal=True, key="roof.group")
    top.plotly_chart(chart_style(chart(device, reports, group)))
    ridge = explain_ridge_point(device, reports["prefill"]["precision"])
    st.caption(f"Ridge point of {device.name} at {reports['prefill']['precision']}: {fmt_num(ridge.value, 4)} "
               f"FLOP/byte. Points left of it are memory-bound (their height is intensity × bandwidth); points "
               f"right of it reach the flat compute roof.")
    st.markdown("\n\n".join(roofline_side_claim(phase, [(f"`{r['name']}`", r["intensity_flop_per_byte"])
                                                       for r in rep["layers"].get(group, []) if r["flops"] > 0],
                                                 rep["ridge_flop_per_byte"]) for phase, rep in reports.items()))
    formula_expander("Formula: the ridge point", f"`{ridge.symbolic}`\n\n{ridge.formula}\n\n{ridge.description}"
                                                 f"\n\nSource: {ridge.source}")
    for phase, tab in zip(reports, st.tabs([f"Prefill: {s:,} tokens × batch {batch:,}",
                                            f"Decode: 1 token at {s:,} keys × batch {batch:,}"])):
        rep = reports[phase]
        with tab:
            phase_summary(phase, rep, st)
            st.markdown(f"**One `{group}` layer, op by op** (time = the larger of compute and memory time; "
                        f"FLOPs and bytes are for one layer).")
            df = op_frame(rep["layers"][group])
            df_with_download(df, f"roofline_{phase}", column_config=COLUMNS, height=table_height(len(df)),
                             show=SHOWN)
            with st.expander("Every op of the whole step (embedding, each layer type, LM head)"):
                df = op_frame(rep["step_rows"])
                df.insert(1, "layers", [r["count"] for r in rep["step_rows"]])
                df_with_download(df, f"roofline_{phase}_step", column_config=COLUMNS,
                                 show={"op": None, "layers": None, **SHOWN})


main()
