"""Widgets the "Serving many users" pages share: the step model in the sidebar, a request stream (Poisson, bursts
or an uploaded trace file), slot timelines (Gantt charts) for the simulator and for a real engine run, and the
engine's live block tables.

No formula lives here: timings come from `calculators.serving.serving_sim` / `calculators.serving.batching` or from the engine's
`Scheduler` step reports; this module only arranges them for a chart or a table.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable

import plotly.graph_objects as go
import streamlit as st

from calculators.serving.batching import StepModel, step_model_for
from calculators.units import WEIGHT_DTYPES, fmt_bytes, fmt_num
from calculators.serving.workload import LENGTH_KINDS, Workload, parse_trace, synthetic_workload, trace_csv
from specs.model_config import SpecError
from ui.charts import style as chart_style
from ui.model_source import choice_field, sizing_inputs
from ui.widgets import float_field, int_field, remember, show_error
from ui.world import world_weight_dtype

PHASE_COLORS = {"prefill": "#f58518", "decode": "#4c78a8", "padding": "#e45756"}
POISSON, BURSTS, TRACE = "Poisson", "Bursts", "Trace file (CSV / JSONL)"
SAMPLE_TRACE = Workload([0.0, 0.0, 0.0, 0.01, 0.05], [10, 10, 10, 40, 200], [50, 120, 20, 30, 60],
                        source="sample")
MAX_REQUESTS = 50_000
RESULTS_KEY = "serving.results"          # per session: {(what, inputs...): result}, the last few only
RESULTS_KEPT = 12


# ============================================================================================ theory inputs
def step_model_inputs() -> StepModel | None:
    """Sidebar: model + device (shared with the sizing pages) and the weight precision -> the step model."""
    chosen = sizing_inputs()
    if chosen is None:
        return None
    config, device = chosen
    wd_default, wd_key = world_weight_dtype("serving.wd", device, "fp16")     # fp32 for the engine's machine
    wd = choice_field("Weight precision", WEIGHT_DTYPES, wd_default, key=wd_key, where=st.sidebar)
    try:
        m = step_model_for(config, device, wd)
    except SpecError as e:
        show_error(e, st.sidebar)
        return None
    st.sidebar.caption(f"Step model: weights {fmt_bytes(m.weight_bytes)} read once per step, "
                       f"{fmt_bytes(m.kv_bytes_per_token)} of KV per token, {fmt_num(device.memory_bandwidth_gb_s, 4)}"
                       f" GB/s, ideal ({'as measured' if device.kind == 'measured' else 'datasheet peaks'}).")
    return m


def workload_inputs(key: str, n: int = 2000, rate: float = 50.0, prompt: float = 200, output: float = 128,
                    output_kind: str = "exponential", scale: str = "") -> Workload | None:
    """The request stream: Poisson or bursty arrivals with length distributions, or an uploaded trace. `scale`
    (the step model's name) keys the rate, so another model or machine starts from its own suggested rate."""
    store = remember(f"{key}.arrivals", POISSON)
    source = st.radio("Arrivals", [POISSON, BURSTS, TRACE], key=f"{key}.arrivals", on_change=store, horizontal=True,
                      help="A trace is a CSV with the header arrival_s,prompt_tokens,output_tokens (or JSON Lines "
                           "with those keys), one request per row.")
    if source == TRACE:
        return _trace_upload(key)
    cols = st.columns(4)
    count = int_field("Requests", n, 1, MAX_REQUESTS, key=f"{key}.n", where=cols[0])
    r = float_field("Arrival rate (requests/s)", rate, 0.001, 1e6, key=f"{key}.rate{'.' + scale if scale else ''}",
                    where=cols[1])
    burst = int_field("Burst size", 8, 1, MAX_REQUESTS, key=f"{key}.burst", where=cols[2]) if source == BURSTS else 1
    seed = int_field("Seed", 0, 0, 2 ** 31 - 1, key=f"{key}.seed", where=cols[3])
    cols = st.columns(4)
    p = float_field("Prompt tokens (mean)", prompt, 1, 1e6, key=f"{key}.prompt", where=cols[0], step=10.0)
    pk = choice_field("Prompt lengths", LENGTH_KINDS, "fixed", key=f"{key}.prompt_kind", where=cols[1])
    o = float_field("Output tokens (mean)", output, 1, 1e6, key=f"{key}.output", where=cols[2], step=10.0)
    ok = choice_field("Output lengths", LENGTH_KINDS, output_kind, key=f"{key}.output_kind", where=cols[3])
    if None in (count, r, burst, seed, p, o):
        return None
    try:
        return synthetic_workload(count, r, p, o, arrivals="bursts" if source == BURSTS else "poisson",
                                  burst_size=burst, prompt_kind=pk, output_kind=ok, seed=seed)
    except SpecError as e:
        show_error(e)
        return None


STREAM_LABEL = "Request stream (arrivals, lengths, seed)"


def folded_workload_inputs(key: str, **kw: Any) -> Workload | None:
    """`workload_inputs` in a closed expander: a lesson's chart stays on a projector's first screen (the stream's
    radio and two rows of fields put it at 865 px with Large text). Without a stream (a field to fix, a trace
    still to upload) a line outside the expander says where to look."""
    with st.expander(STREAM_LABEL):
        w = workload_inputs(key, **kw)
    if w is None:
        st.warning(f"No request stream to simulate yet: open “{STREAM_LABEL}” above (a field to fix, or a trace "
                   "file to upload).", icon=":material/info:")
    return w


def _trace_upload(key: str) -> Workload | None:
    up = st.file_uploader("Trace file", type=["csv", "jsonl", "json", "txt"], key=f"{key}.trace")
    st.download_button("Download a sample trace", trace_csv(SAMPLE_TRACE).encode(), "sample_trace.csv", "text/csv",
                       key=f"{key}.sample", on_click="ignore", icon=":material/download:")
    if up is None:
        st.info("Upload a trace to simulate it, or choose Poisson / Bursts.")
        return None
    try:
        return parse_trace(up.getvalue(), up.name)
    except SpecError as e:
        show_error(e)
        return None


def remembered(what: str, inputs: tuple, compute: Callable[[], Any]) -> Any:
    """`compute()` once per session for these inputs (a small per-session store: never shared between users)."""
    store, k = _results(), (what, *inputs)
    if k not in store:
        _keep(store, k, compute())
    return store[k]


def measured_run(what: str, inputs: tuple, run: Callable[[], Any], *, model, tokens: int, sequences: int,
                 button: str, button_key: str, spinner: str, hint: str, icon: str = ":material/play_arrow:") -> Any:
    """A serving page's engine run: the button runs `run()` through the server's heavy-job line (`engine_job`:
    one at a time, memory checked first) and keeps the result in this session's small store, per `inputs`.
    Returns the result for these inputs, or None after showing `hint` (not run yet) or the error."""
    store, k = _results(), (what, *inputs)
    if st.button(button, key=button_key, type="primary", icon=icon):
        try:
            with engine_job(f"the {what}", model, tokens, sequences), st.spinner(spinner):
                _keep(store, k, run())
        except SpecError as e:                  # bad input, a refused job (engine errors are SpecErrors too)
            show_error(e)
            return None
    if k not in store:
        st.info(hint)
        return None
    return store[k]


def _results() -> dict:
    return st.session_state.setdefault(RESULTS_KEY, {})


def _keep(store: dict, k: tuple, value: Any) -> None:
    """Store `value`, dropping the oldest results beyond RESULTS_KEPT."""
    store.pop(k, None)
    while len(store) >= RESULTS_KEPT:
        store.pop(next(iter(store)))
    store[k] = value


def workload_key(w: Workload) -> tuple:
    return (w.source, len(w), float(w.arrival_s.sum()), int(w.prompt_tokens.sum()), int(w.output_tokens.sum()),
            w.arrival_s.tobytes()[:64])


# ============================================================================================ charts
def style(fig: go.Figure, title: str, x: str, y: str, height: int = 420) -> go.Figure:
    """Title and axis titles, then the app's chart look (`ui.charts.style`: bigger with the large-text switch)."""
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y)
    return chart_style(fig, height=height)


def request_label(request) -> str:
    """How a request is named on a chart, the same as in its table: the engine's ids ("R0") as they are, the
    simulator's numbers (0) as "R0"."""
    return str(request) if isinstance(request, str) else f"R{request}"


def gantt_figure(rows: list[dict], title: str, x_title: str = "time (s)", start: str = "start_s",
                 length: str = "duration_s") -> go.Figure:
    """Horizontal bars: one row per slot, one bar per (request, phase), labelled with the request."""
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        sel = [r for r in rows if r["phase"] == phase]
        if not sel:
            continue
        fig.add_bar(base=[r[start] for r in sel], x=[r[length] for r in sel],
                    y=[f"slot {r['slot']}" for r in sel], orientation="h", name=phase, marker_color=color,
                    text=[request_label(r["request"]) for r in sel], textposition="inside", insidetextanchor="middle",
                    hovertext=[f"request {r['request']}, {phase}" for r in sel])
    fig.update_layout(barmode="overlay", yaxis=dict(autorange="reversed"))
    slots = len({r["slot"] for r in rows})
    return style(fig, title, x_title, "slot", height=max(260, 60 + 34 * slots))


# ============================================================================================ the engine
def engine_job(label: str, model, tokens: int, sequences: int = 1):
    """`with engine_job("the batching measurement", model, 16, 8):` a measured engine run through the server's
    heavy-job line (one at a time, memory checked first): it needs about the K/V of `sequences` sequences of
    `tokens` positions in the engine's float32. Refusals are ModelErrors (shown like any bad input)."""
    from calculators.sizing.kv_cache import kv_cache_bytes
    from ui.server import heavy_job
    return heavy_job(label, kv_cache_bytes(model.config, tokens, sequences, kv_dtype="fp32"))


def serve_prompts(model, prompts: list[list[int]], max_new_tokens: list[int], *, block_size: int = 16,
                  max_batch: int | None = None):
    """Submit every prompt (greedy, no early stop) to one new Scheduler and run it to the end:
    (requests, step reports)."""
    from engine import Scheduler
    sched = Scheduler(model, block_size=block_size, max_batch=max_batch)
    reqs = [sched.submit(p, max_new_tokens=n, stop_at_eos=False, request_id=f"R{i}")
            for i, (p, n) in enumerate(zip(prompts, max_new_tokens))]
    return reqs, sched.run()


def engine_gantt(reports) -> list[dict]:
    """Bars from `engine.serve.scheduler.step_timeline`: a display slot per request (taken at its first step, given
    back after its last), consecutive steps of one phase merged into one bar; x in steps and measured seconds."""
    from engine.serve.scheduler import step_timeline
    rows = step_timeline(reports)
    last = {}
    for r in rows:
        last[r["request_id"]] = r["step"]
    bars: list[dict] = []
    open_bar: dict[str, dict] = {}
    slot_of: dict[str, int] = {}
    free: list[int] = []
    leaving: list[int] = []
    step = None
    for r in rows:                                       # rows come step by step
        if r["step"] != step:
            for slot in leaving:                         # slots of requests whose last step has passed
                heapq.heappush(free, slot)
            leaving, step = [], r["step"]
        rid = r["request_id"]
        if rid not in slot_of:
            slot_of[rid] = heapq.heappop(free) if free else len(set(slot_of.values()))
        bar = open_bar.get(rid)
        if bar is None or bar["phase"] != r["phase"] or bar["end_step"] != r["step"] - 1:
            bar = open_bar[rid] = dict(request=rid, slot=slot_of[rid], phase=r["phase"], start_step=r["step"] - 1,
                                       end_step=r["step"], start_s=r["start_s"], end_s=r["end_s"])
            bars.append(bar)
        bar["end_step"], bar["end_s"] = r["step"], r["end_s"]
        if last[rid] == r["step"]:
            leaving.append(slot_of[rid])
    for b in bars:
        b["steps"], b["duration_s"] = b["end_step"] - b["start_step"], b["end_s"] - b["start_s"]
    return bars


def block_table_rows(sched) -> list[dict]:
    """The live state of every request a Scheduler holds: status, tokens cached, its block table."""
    out = []
    for req in [*sched.running, *sched.waiting]:
        table = sched.block_table(req)
        out.append(dict(request=req.request_id, status=req.status, prompt_tokens=len(req.prompt_ids),
                        generated=len(req.token_ids), tokens_cached=req.num_cached, blocks=len(table),
                        block_table=" ".join(str(b) for b in table)))
    return out


def pool_owners(sched) -> list[str]:
    """Who holds each physical block: a request id (several if shared), or "" when free."""
    owners = [""] * sched.num_blocks
    for req in sched.running:
        for b in sched.block_table(req):
            owners[b] = f"{owners[b]}+{req.request_id}" if owners[b] else req.request_id
    return owners


FREE_BLOCK_COLOR = "#eeeeee"
# soft qualitative colours (ColorBrewer Set2 and Pastel1, greys left out so that no request looks free); black
# block numbers read on every one of them
OWNER_COLORS = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494", "#fbb4ae", "#b3cde3",
                "#ccebc5", "#decbe4", "#fed9a6")


def owner_colorscale(n_owners: int) -> list[list]:
    """A stepped heatmap colour scale: z = 0 (a free block) light grey, z = k (the k-th owner) its own colour, for
    zmin = -0.5 and zmax = n_owners + 0.5."""
    colors = [FREE_BLOCK_COLOR, *(OWNER_COLORS[k % len(OWNER_COLORS)] for k in range(n_owners))]
    n = len(colors)
    return [pair for k, c in enumerate(colors) for pair in ([k / n, c], [(k + 1) / n, c])]


def pool_figure(owners: list[str], title: str, per_row: int = 32) -> go.Figure:
    """The block pool as a grid of squares: free blocks light grey, each owner its own colour, labelled with the
    block number and its owner."""
    ids = sorted({o for o in owners if o})
    code = {o: i + 1 for i, o in enumerate(ids)}
    rows = -(-len(owners) // per_row)
    z = [[None] * per_row for _ in range(rows)]
    text = [[""] * per_row for _ in range(rows)]
    for b, o in enumerate(owners):
        z[b // per_row][b % per_row] = code.get(o, 0)
        text[b // per_row][b % per_row] = f"{b}<br>{o}" if o else str(b)
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", showscale=False, xgap=2, ygap=2,
                               colorscale=owner_colorscale(len(ids)), zmin=-0.5, zmax=len(ids) + 0.5,
                               textfont=dict(color="black"), hoverinfo="text"))
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    return style(fig, title, "", "", height=max(200, 60 + 46 * rows))
