"""Your machine: the theory's prediction for the loaded model on this computer (measured NumPy bandwidth and GEMM
speed) next to the engine's own timings and counters, op by op.

Predicted: `calculators.sizing.engine_floor` (the engine's decode bytes and ITL floor), `calculators.sizing.roofline`
(forward_flops) and `calculators.explain`, on `specs.devices.measure_this_machine` (bandwidth of a matvec over a
weight-sized matrix, the operation a decode step repeats). Measured: `engine.Trace(timing=True)`
around `Model.prefill` and `Model.decode_step`. The BLAS threads the engine runs with, and why: `engine.threads`.
"""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from calculators.sizing.engine_floor import engine_decode_bytes
from calculators.explain import explain_compute_time, explain_engine_itl_floor
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.roofline import forward_flops
from calculators.units import MB, fmt_bytes, fmt_num
from engine import Model, Trace
from engine import threads as blas_threads
from engine.instruments.profile import ProfileRun, profile_run
from specs.devices import Device
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, model_picker, setup_page, show_error
from ui.machine import machine_controls, measured_machine
from ui.model_source import device_caption, fmt_si
from ui.server import heavy_job
from ui.charts import style as chart_style
from ui.metrics import metric_row

ENGINE_DTYPE = "fp32"                       # the engine holds and multiplies float32
GFLOP = 1e9
RESULTS_KEY = "machine.results"             # {(model source, prompt tokens, decode steps): Run}


def predictions(model: Model, device: Device, n: int, steps: int) -> dict:
    """Floors for a prompt of n tokens then `steps` decode steps; the ITL floor at the median step's context."""
    c = model.config
    first = engine_decode_bytes(c, n + 1)
    itl = explain_engine_itl_floor(c, device.memory_bandwidth_bytes_per_s, n + 1 + (steps - 1) // 2)
    fl = forward_flops(c, n, n)
    pre = explain_compute_time(fl, device.peak(ENGINE_DTYPE))
    return dict(weight_bytes=first["weights"], itl=itl, prefill_flops=fl, prefill=pre,
                decode_flops=forward_flops(c, 1, n + 1), kv_read=first["kv_read"])


def op_frame(trace: Trace, phase: str) -> pd.DataFrame:
    ops = trace.by_op()
    return pd.DataFrame({"phase": phase, "op": list(ops), "calls": [o["calls"] for o in ops.values()],
                         "time (ms)": [o["seconds"] * 1e3 for o in ops.values()],
                         "GFLOP": [o["flops"] / GFLOP for o in ops.values()],
                         "weights read (MB)": [o["weight_bytes"] / MB for o in ops.values()],
                         "KV read (MB)": [o["kv_read_bytes"] / MB for o in ops.values()]})


def time_by_op(run: ProfileRun, n: int, steps: int) -> pd.DataFrame:
    """The run's op-by-op rows: the prefill's, then the decode steps' summed."""
    return pd.concat([op_frame(run.prefill, f"prefill ({n:,} tokens)"),
                      op_frame(run.decode_all, f"decode ({steps} steps)")])


def op_chart(ops: pd.DataFrame, where) -> None:
    """Where the time goes, op by op, in `where` (the page's first screen)."""
    fig = px.bar(ops, x="time (ms)", y="op", color="phase", orientation="h", barmode="group",
                 title="Where the time goes, op by op (summed over layers; decode summed over its steps)")
    fig.update_layout(height=460, margin=dict(l=10, r=10, t=50, b=10), yaxis=dict(autorange="reversed"),
                      legend=dict(orientation="h", y=-0.15))
    where.plotly_chart(chart_style(fig))


def show_run(model: Model, pred: dict, run: ProfileRun, n: int, steps: int, ops: pd.DataFrame) -> None:
    pre, decodes = run.prefill, run.decodes
    itl_ms, prefill_ms = run.itl_ms, run.prefill_ms
    metric_row([("Measured ITL, median (ms)", fmt_num(itl_ms, 3), None,
                 f"{fmt_num(itl_ms / pred['itl'].value, 3)}× the floor"),
                ("ITL floor (ms)", fmt_num(pred["itl"].value, 3), None),
                (f"Measured prefill, {n:,} tokens (ms)", fmt_num(prefill_ms, 3), None,
                 f"{fmt_num(prefill_ms / pred['prefill'].value, 3)}× the prediction"),
                ("Predicted prefill (ms)", fmt_num(pred["prefill"].value, 3), None)])
    first = decodes[0]
    rows = [
        ("decode step time (ms)", pred["itl"].value, itl_ms, "ITL floor vs median of the steps (≥ 1)"),
        ("prefill time (ms)", pred["prefill"].value, prefill_ms, "FLOPs / GEMM FLOP/s vs the prefill pass"),
        ("decode weights read (MB)", pred["weight_bytes"] / MB, first.weight_bytes / MB,
         "engine_floor.engine_decode_bytes vs Trace"),
        ("decode KV read, first step (MB)", pred["kv_read"] / MB, first.kv_read_bytes / MB,
         "engine_floor.engine_decode_bytes vs Trace"),
        ("decode GFLOP, first step", pred["decode_flops"] / GFLOP, first.flops / GFLOP,
         "roofline.forward_flops vs Trace"),
        ("prefill GFLOP", pred["prefill_flops"] / GFLOP, pre.flops / GFLOP, "roofline.forward_flops vs Trace"),
    ]
    df = pd.DataFrame({"quantity": [r[0] for r in rows], "predicted": [r[1] for r in rows],
                       "measured": [r[2] for r in rows],
                       "measured / predicted": [r[2] / r[1] if r[1] else float("nan") for r in rows],
                       "compared": [r[3] for r in rows]})
    st.markdown("**Predicted vs measured.** Counters (bytes, FLOPs) agree exactly: theory and engine count the "
                "same whole FLOPs and bytes by one convention. A time ratio is measured ÷ floor, so it is at "
                "least 1: the floor is the step's bytes at the speed of one large matvec, and the engine also pays "
                "Python and NumPy overhead for about ten operations per layer, smaller matvecs that reach less "
                "bandwidth, and the norms, RoPE and softmax that the floor leaves out.")
    if itl_ms < pred["itl"].value:
        st.warning("This run's decode steps came in under the floor: the bandwidth was measured at another moment "
                   "(other programs, CPU clock changes). Press **Measure again** in the sidebar, then run again.")
    f = st.column_config.NumberColumn(format="%.4g")
    df_with_download(df, "predicted_vs_measured", column_config={"predicted": f, "measured": f,
                                                                 "measured / predicted": f})
    st.markdown("**Where the time goes, op by op** (the chart at the top of the page)")
    df_with_download(ops, "time_by_op", column_config={"time (ms)": st.column_config.NumberColumn(format="%.3f"),
                                                       "GFLOP": st.column_config.NumberColumn(format="%.4g"),
                                                       "weights read (MB)": st.column_config.NumberColumn(
                                                           format="%.2f"),
                                                       "KV read (MB)": st.column_config.NumberColumn(format="%.3f")})
    with st.expander(f"Each decode step ({steps})"):
        df_with_download(pd.DataFrame({"step": list(range(1, steps + 1)),
                                       "time (ms)": run.step_ms,
                                       "KV read (MB)": [tr.kv_read_bytes / MB for tr in decodes]}),
                         "decode_steps")
    st.caption("Timings are the engine's own (`engine.Trace(timing=True)`: a clock read after each op). The "
               "first steps can be slower while memory pages are touched; the median ignores them.")


def main() -> None:
    """The run's inputs and its button in one row, and once run, where the time went under them (a projector's
    first screen at 1366×768); the intro, the prediction and the measured numbers below."""
    setup_page("Your machine", icon=":material/computer:")
    st.title("Your machine")
    top = st.container()
    st.markdown(
        "The other pages predict costs from datasheets; this one checks the predictions where you can watch: the "
        "NumPy engine on this computer. We measure the machine's memory bandwidth and matrix-multiply speed, "
        "predict the loaded model's token time from them, then run the model and compare.")
    model = model_picker()
    with st.sidebar:
        st.header("This machine")
        device = measured_machine()
        st.caption(device_caption(device))
        st.caption(device.source)
        machine_controls(st.sidebar, "machine")
    if model is None:
        st.info("Load a model in the sidebar to compare the prediction with a real run.")
        return
    c = model.config
    cols = top.columns(3, vertical_alignment="bottom")
    n = int_field("Prompt tokens", 64, 1, c.max_position_embeddings - 1, key="machine.prompt", where=cols[0])
    steps = int_field("Decode steps", 16, 1, 1024, key="machine.steps", where=cols[1])
    if n is None or steps is None:
        return
    if n + steps > c.max_position_embeddings:
        show_error(f"{n:,} prompt tokens + {steps:,} decode steps exceed {c.name}'s context window "
                   f"({c.max_position_embeddings:,} tokens); lower one of them.")
        return
    try:
        pred = predictions(model, device, n, steps)
    except SpecError as e:
        show_error(e)
        return
    key = (model.source, n, steps)
    results = st.session_state.setdefault(RESULTS_KEY, {})
    if cols[2].button("Run the engine", key="machine.run", type="primary", icon=":material/play_arrow:"):
        try:                                       # a heavy job: one at a time on the server, memory checked
            with heavy_job("the profiling run", kv_cache_bytes(c, n + steps, kv_dtype=ENGINE_DTYPE)):
                with st.spinner(f"Prefilling {n:,} tokens, then {steps} decode steps …"):
                    results[key] = profile_run(model, n, steps)
        except SpecError as e:
            show_error(e)
            return
    run = results.get(key)
    ops = None if run is None else time_by_op(run, n, steps)
    if ops is not None:
        op_chart(ops, top)                    # right under the button that made it
    st.subheader(f"Predicted for {model.name} on this machine")
    metric_row([("Weights read per token (fp32)", fmt_bytes(pred["weight_bytes"]), None),
                ("ITL floor (ms)", fmt_num(pred["itl"].value, 3), f"weights + KV at the measured matvec bandwidth, "
                 f"{fmt_num(device.memory_bandwidth_gb_s, 4)} GB/s"),
                (f"Predicted prefill, {n:,} tokens (ms)", fmt_num(pred["prefill"].value, 3),
                 f"{fmt_si(pred['prefill_flops'], 'FLOP')} at the measured "
                 f"{fmt_si(device.peak(ENGINE_DTYPE), 'FLOP/s')}")])
    itl, pre = pred["itl"], pred["prefill"]
    formula_expander("Formulas: ITL floor and predicted prefill",
                     f"**ITL floor** = bytes a decode step reads and writes (float32 weights as the engine "
                     f"holds them, KV cache at the median step) / measured matvec bandwidth: `{itl.symbolic}` = "
                     f"{itl.formula}\n\n**Prefill** = matmul FLOPs / measured FP32 "
                     f"GEMM FLOP/s: `{pre.symbolic}` = {pre.formula}\n\nSources: {itl.source}; {pre.source}. "
                     f"Bytes: `calculators.sizing.engine_floor.engine_decode_bytes`; FLOPs: `forward_flops`.")
    df_with_download(pd.DataFrame({
        "quantity": ["measured bandwidth (GB/s)", "measured FP32 GEMM (GFLOP/s)", "weights read per token (MB)",
                     "ITL floor (ms)", f"prefill of {n:,} tokens (GFLOP)", "predicted prefill (ms)"],
        "value": [device.memory_bandwidth_gb_s, device.peak(ENGINE_DTYPE) / GFLOP, pred["weight_bytes"] / MB,
                  itl.value, pred["prefill_flops"] / GFLOP, pre.value],
        "from": ["specs.devices.measure_this_machine", "specs.devices.measure_this_machine",
                 "calculators.sizing.engine_floor.engine_decode_bytes", "calculators.sizing.engine_floor (engine_itl_floor)",
                 "calculators.sizing.roofline.forward_flops", "calculators.explain.explain_compute_time"]}),
        "prediction", column_config={"value": st.column_config.NumberColumn(format="%.4g")})
    st.caption("GB = 10⁹ bytes, MB = 10⁶ bytes.")
    st.caption(f"**BLAS threads.** {blas_threads.status().describe()}")
    if run is None:
        st.caption("Press **Run the engine** to measure (a prefill and the decode steps, timed op by op).")
        return
    st.subheader("Measured")
    show_run(model, pred, run, n, steps, ops)


main()
