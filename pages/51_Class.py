"""Class: the live batch of the class's engine server, i.e. the class itself as the serving lesson's workload.

Numbers: the engine server's live batch over HTTP (`/v1/batch` of `python -m engine serve`, read back as a
`server.worker.WorkerSnapshot`: requests, block tables, free blocks, each step's time, aggregate and single-stream
tokens/s) or, for any other OpenAI-compatible server, its Prometheus `/metrics` (`server.backend.read_state`);
`server.worker.decode_step_point` (the last decode step's FLOPs, bytes and intensity by
`calculators.sizing.roofline`'s convention), `calculators.sizing.roofline.roofline_curve` on this machine as
measured (`ui.machine`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.sizing.latency import decode_step_ms, throughput_tok_s
from calculators.sizing.roofline import roofline_curve
from calculators.units import fmt_num
from engine.errors import ModelError
from server.backend import BackendConfig, BackendError, read_live_batch
from server.worker import WorkerSnapshot, decode_step_point
from ui import df_with_download, formula_expander, setup_page
from ui.class_join import backend_settings, is_teacher, join_box, other_server_view, simulated_students, teacher_box
from ui.machine import machine_controls, measured_machine
from ui.model_source import fmt_si
from ui.predict import class_predictions
from ui.server import class_backend, embedded_servers, start_engine_server
from ui.charts import style as chart_style
from ui.class_view import last_step_words, measured_cells, served_model_label
from ui.metrics import metric_row
from ui.narration import speedup_words

REFRESH_S = 2.0                            # the live view's redraw (charts, tables) was half of the app's own CPU
#                                            time during a 30-student class at one refresh a second (py-spy --gil)
STEP_WINDOW_S = 60.0                       # the step-time chart shows this much recent history
BLOCK_COLUMNS = 32                         # blocks per row of the pool picture
WORKER_KEY = "class.worker"
LIVE_KEY = "class.live"


def requests_frame(snap: WorkerSnapshot) -> pd.DataFrame:
    return pd.DataFrame({
        "request": [r.label for r in snap.requests],
        "status": [r.status if r.position is None else f"waiting (#{r.position} in line)" for r in snap.requests],
        "prompt tokens": [r.prompt_tokens for r in snap.requests],
        "generated tokens": [r.generated_tokens for r in snap.requests],
        "max new tokens": [r.max_new_tokens for r in snap.requests],
        "blocks": [len(r.block_table) for r in snap.requests],
        "block table": [" ".join(map(str, r.block_table)) for r in snap.requests],
    }, columns=["request", "status", "prompt tokens", "generated tokens", "max new tokens", "blocks",
                "block table"])


def block_map(snap: WorkerSnapshot) -> go.Figure:
    """The KV pool as a grid: one cell per physical block, coloured by the request holding it (grey = free)."""
    owners = snap.block_owners()
    labels = sorted({o for o in owners if o is not None})
    code = {label: i + 1 for i, label in enumerate(labels)}
    rows = -(-len(owners) // BLOCK_COLUMNS)
    z = np.full(rows * BLOCK_COLUMNS, np.nan)
    z[:len(owners)] = [code.get(o, 0) if o is not None else 0 for o in owners]
    text = np.full(rows * BLOCK_COLUMNS, "", dtype=object)
    text[:len(owners)] = [f"block {i}: {o or 'free'}" for i, o in enumerate(owners)]
    fig = go.Figure(go.Heatmap(z=z.reshape(rows, BLOCK_COLUMNS), text=text.reshape(rows, BLOCK_COLUMNS),
                               hoverinfo="text", colorscale="Turbo", zmin=0, zmax=max(len(labels), 1),
                               showscale=False, xgap=1, ygap=1))
    fig.update_layout(title=f"KV pool: {snap.free_blocks} of {snap.num_blocks} blocks free "
                            f"({snap.block_size} tokens each; dark = free, colours = requests)",
                      height=max(160, 28 * rows + 80), margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"))
    return fig


def recent_steps(snap: WorkerSnapshot) -> list:
    """The steps of the last STEP_WINDOW_S seconds (none when the server has been idle that long)."""
    return [s for s in snap.steps if s.ended_at >= snap.taken_at - STEP_WINDOW_S]


def steps_chart(snap: WorkerSnapshot) -> go.Figure:
    t0 = snap.taken_at
    steps = recent_steps(snap)
    fig = go.Figure()
    fig.add_scatter(x=[s.ended_at - t0 for s in steps], y=[s.seconds * 1e3 for s in steps],
                    mode="markers+lines", name="step time (ms)",
                    marker=dict(size=[6 + s.decode_requests for s in steps]),
                    text=[f"{s.decode_requests} decoding, {s.prefill_tokens} prompt tokens" for s in steps])
    fig.update_layout(title=f"Each step's time, last {STEP_WINDOW_S:g} s",
                      height=360, xaxis_title="seconds ago (0 = now)", yaxis_title="step time (ms)",
                      xaxis_range=[-STEP_WINDOW_S, 0], margin=dict(l=10, r=10, t=50, b=10))
    return fig


def roofline_chart(model, snap: WorkerSnapshot, device) -> tuple[go.Figure, dict | None]:
    """This machine's roof (FP32, as the engine computes) and the last decode step: where the theory puts it
    (intensity) and the FLOP/s it reached."""
    step = snap.last_decode_step()
    point = decode_step_point(model, step) if step is not None else None
    curve = roofline_curve(device, "fp32", min_intensity=0.05, max_intensity=1e4, points=96)
    fig = go.Figure()
    fig.add_scatter(x=[p["intensity_flop_per_byte"] for p in curve], y=[p["attainable_flop_s"] / 1e9 for p in curve],
                    mode="lines", name="roof: this machine (FP32)", line=dict(color="black", width=2))
    if point is not None:
        fig.add_scatter(x=[point["intensity_flop_per_byte"]], y=[point["achieved_flop_s"] / 1e9],
                        mode="markers+text", marker=dict(size=16, color="#E45756"),
                        text=[f"batch of {point['batch']}"], textposition="top center",
                        name="last decode step (achieved)")
    fig.update_layout(title="Where the current batch sits on this machine's roofline", height=420,
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte)"),
                      yaxis=dict(type="log", title="GFLOP/s"), margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.25))
    return fig, point



def theory_frame(model, snap: WorkerSnapshot, device, point: dict | None) -> pd.DataFrame:
    """Tokens/s the roofline predicts on this machine (float32, ideal efficiency) for one stream and for the
    current batch, next to what the worker measured."""
    batch = point["batch"] if point is not None else 1
    ctx = point["context_tokens"] if point is not None else 1
    one = decode_step_ms(model.config, device, ctx, 1, weight_dtype="fp32")
    many = decode_step_ms(model.config, device, ctx, batch, weight_dtype="fp32")
    cells = measured_cells(batch, snap.single_stream_tokens_per_s(), snap.aggregate_tokens_per_s())
    steps = [one] if batch <= 1 else [one, many]                 # a batch of one is the lone stream: one row
    return pd.DataFrame({
        "streams": [row for row, _ in cells],
        "predicted step (ms)": [p["step_ms"] for p in steps],
        "predicted tokens/s": [throughput_tok_s(b, p["step_ms"]) for b, p in zip((1, batch), steps)],
        "bound": [p["bound"] for p in steps],
        "measured tokens/s": [v for _, v in cells],
    })


def pick_server(select: Any, notes: Any) -> tuple[BackendConfig, object] | None:
    """The embedded engine server to watch (one per model in use; its picker drawn in `select`, a note in `notes`
    when there is none yet) and the app's model it serves."""
    from ui.model_picker import shared_models
    live = embedded_servers().running()
    if not live:
        notes.info("Nobody has generated yet: the engine server starts with the first Generate on the home page. "
                   "Ask the class to press Generate, then watch here.")
        if is_teacher() and notes.button("Start the engine server now (default model)", key="class.start",
                                         help="To add simulated students before the class arrives."):
            from engine.load.default_model import default_model_path
            try:
                with notes, st.spinner("Starting the engine server (loading the model) …"):
                    start_engine_server(str(default_model_path()))
            except ModelError as e:
                notes.error(str(e), icon=":material/error:")
                return None
            st.rerun()
        return None
    names = [source for source, _ in live]
    if st.session_state.get(WORKER_KEY) not in names:
        st.session_state[WORKER_KEY] = names[0]
    models = {n: _model_for(shared_models(), n) for n in names}
    name = select.selectbox("Model being served", names, key=WORKER_KEY,
                            format_func=lambda n: served_model_label(n, models[n].name if models[n] else None))
    srv = live[names.index(name)][1]
    return BackendConfig(srv.url), models[name]


def _model_for(store, source: str):
    """The app's loaded model that this server serves (for the roofline and the theory); None if evicted."""
    for key in store.sources():
        m = store.cached(key)
        if m is not None and (m.source or m.name) == source:
            return m
    return None


def live_view(cfg: BackendConfig, model, device) -> None:
    try:
        snap = read_live_batch(cfg)
    except BackendError as e:
        st.warning(f"The live batch cannot be read right now: {e}")
        return
    agg, single = snap.aggregate_tokens_per_s(), snap.single_stream_tokens_per_s()
    last = snap.steps[-1] if snap.steps else None
    metric_row([
        ("Requests running now", f"{snap.running:,}", f"at this moment; at most {snap.max_batch} decoded together"),
        ("Waiting in line now", f"{snap.waiting:,}", f"at most {snap.max_waiting} may wait"),
        (f"Free KV blocks (of {snap.num_blocks:,})", f"{snap.free_blocks:,}", f"{snap.block_size} tokens each"),
        ("All streams (tokens/s)", "–" if not np.isfinite(agg) else f"{agg:,.1f}",
         "every request's tokens over the last 10 s of steps"),
        ("One stream alone (tokens/s)", "–" if not np.isfinite(single) else f"{single:,.1f}",
         "1 / median time of steps that decoded a single request"),
    ])
    speedup = snap.batching_speedup()
    said = speedup_words(snap, speedup) if np.isfinite(speedup) else ""
    if said:
        st.markdown(said)
    if last is not None:
        st.caption(last_step_words(last.seconds, last.decode_requests, last.prefill_tokens, last.tokens_out,
                                   max(snap.taken_at - last.ended_at, 0.0), snap.running))
    st.plotly_chart(chart_style(block_map(snap)), key="class.blocks")
    df_with_download(requests_frame(snap), "class_requests")
    left, right = st.columns(2)
    with left:
        if recent_steps(snap):
            st.plotly_chart(chart_style(steps_chart(snap), span=1 / 2), key="class.steps")
            st.caption("A bigger dot = more sequences decoded together in that step.")
        else:                                  # an empty chart says nothing a sentence does not say better
            st.info(f"No step in the last {STEP_WINDOW_S:g} s: the server is idle. Step times appear here as soon "
                    "as someone presses Generate.", icon=":material/hourglass_empty:")
    if model is None:
        return
    with right:
        fig, point = roofline_chart(model, snap, device)
        st.plotly_chart(chart_style(fig, span=1 / 2), key="class.roofline")
        if point is not None:
            st.caption(f"Last decode step: {fmt_si(point['flops'], 'FLOP')} over {fmt_si(point['bytes'], 'B')} "
                       f"moved = {fmt_num(point['intensity_flop_per_byte'], 3)} FLOP/byte at a context of "
                       f"{point['context_tokens']:,} tokens; reached {fmt_si(point['achieved_flop_s'], 'FLOP/s')}.")
    st.markdown("**Theory next to the measurement.** The roofline of this machine (as measured) predicts a decode "
                "step's time from its bytes and FLOPs; batching divides the weight bytes among more tokens.")
    f = st.column_config.NumberColumn(format="%.4g")
    df_with_download(theory_frame(model, snap, device, point), "class_theory",
                     column_config={c: f for c in ("predicted step (ms)", "predicted tokens/s")})


def live_view_and_predictions(cfg: BackendConfig, model, device) -> None:
    """The live batch (the page's key chart, first) and the teacher's predictions under it: one fragment, so one
    refresh timer redraws both."""
    live_view(cfg, model, device)
    class_predictions()


def other_server_and_predictions(info) -> None:
    other_server_view(info)
    class_predictions()


def main() -> None:
    """The live batch first (title, Live switch and the model served in one row above it), so its metrics and key
    chart are on a projector's first screen; joining, simulated students and the long explanation below it."""
    setup_page("Class", icon=":material/groups:")
    head, live_col, model_col = st.columns([1, 1.3, 2], vertical_alignment="bottom")
    head.title("Class")
    live = live_col.toggle(f"Live (every {REFRESH_S:g} s)", value=True, key=LIVE_KEY,
                           help=f"Redraw the batch every {REFRESH_S:g} s.")
    st.caption("Everyone in the room who presses Generate joins one batch on this server; here it is as it runs.")
    view, below = st.container(), st.container()
    with st.sidebar:
        st.header("This machine")
        device = measured_machine()
        machine_controls(st.sidebar, "class.machine")
        teacher_box()
        backend_settings(class_backend())
    with below:
        st.markdown("Who is being decoded, how many KV blocks each request holds, how long each step takes, and why "
                    "thirty streams cost little more than one: a decode step reads all the weights whatever the "
                    "batch size, so more requests per step means more tokens per byte read.")
        join_box()
    backend = class_backend().info
    every = REFRESH_S if live else None            # one live fragment: the batch, then the count of answers below it
    if backend is not None and backend.engine != "ours":
        with below:
            simulated_students(backend.config, backend.model, backend.engine)
        with view:
            st.fragment(run_every=every)(other_server_and_predictions)(backend)
        return
    picked = (backend.config, None) if backend is not None else pick_server(model_col, view)
    if picked is None:
        with view:
            st.fragment(run_every=every)(class_predictions)()
        return
    with below:
        simulated_students(picked[0], backend.model if backend is not None else "engine")
    with view:
        st.fragment(run_every=every)(live_view_and_predictions)(picked[0], picked[1], device)
    with below:
        formula_expander(
            "Where these numbers come from",
            "Measured by the engine server's worker (`server.worker`, read over HTTP from `/v1/batch`) around each "
            "scheduler step:\n\n"
            "- **All streams (tokens/s)** = tokens produced by all requests in the steps of the last 10 s ÷ the time "
            "those steps took (idle time left out).\n"
            "- **One stream alone** = 1 ÷ median time of the steps that decoded exactly one request.\n"
            "- **Batch worth** = aggregate ÷ one stream alone.\n"
            "- **Predicted** step = max(bytes ÷ bandwidth, FLOPs ÷ peak FP32) of this machine "
            "(`calculators.sizing.latency.decode_step_ms`, float32 weights and KV); tokens/s = batch ÷ step time "
            "(`throughput_tok_s`).\n"
            "- **Roofline point**: FLOPs and bytes of a decode step of B sequences at the mean context S, counted by "
            "`calculators.sizing.roofline` (`forward_flops`, `weight_bytes_read`, `kv_bytes_step`, all float32 as the engine holds "
            "them); intensity = FLOPs ÷ bytes; achieved FLOP/s = FLOPs ÷ measured step time. The roof is "
            "min(peak FP32 FLOP/s, intensity × bandwidth) of this machine as measured.\n"
            "- **Blocks**: each request's block table maps its tokens to physical blocks of the shared pool "
            "(paged KV cache); a stopped or finished request gives its blocks back at once.")


main()
