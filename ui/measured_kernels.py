"""What the Measured kernels page shares with its tests: the installed device profiles (each loaded once per
process, on demand), the chart traces of a `measured_curves.Curve` (points past the measured table hollow and
dashed), log-axis ticks that read "1k" and "16 MiB", and the sentence that says where a profile's numbers come
from. No formula lives here: the numbers are `calculators.planning.measured_curves`' and `measured_step`'s."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from calculators.units import fmt_num
from specs.devices import Device
from specs.model_config import SpecError
from specs.profiles import available_profiles, load_profile, profiled_devices
from ui.model_source import fmt_si

PROFILES_DIRECTORY: Path | None = None      # None: specs/profiles/ (a test points it at a folder of its own)
PREFERRED = "h200-vllm-"                    # the default profile: an H200 on vLLM, when one is installed
NONE_INSTALLED = (
    "No device profile is installed, so there is nothing measured to draw. Two sources write them: NVIDIA's "
    "aiconfigurator-core databases (H100, H200, B200, GB200, A100, L40S on vLLM, TensorRT-LLM and SGLang): "
    "`pip install -r requirements-profiles.txt`; and this project's profiler, which measures the machine it runs "
    "on and writes a file to `specs/profiles/`: `python -m engine profile`. Until then the planner prices every "
    "op by the closed form (the datasheet roofline and fitted efficiencies).")
EXTRAPOLATED_NOTE = ("Hollow markers on a dashed line lie past what was measured (a size beyond the table's edge): "
                     "there the efficiency of the table's nearest edge is held and the op is priced at that "
                     "fraction of its own roofline, an extrapolation, not a measurement.")


def profile_names() -> list[str]:
    """Every installed profile: the project's files, then aiconfigurator-core's (none when it is not installed)."""
    return available_profiles(PROFILES_DIRECTORY)


def profiled_here(stack: str) -> list[str]:
    """The devices some installed profile measured on `stack`."""
    return profiled_devices(stack, PROFILES_DIRECTORY)


def default_profile(names: list[str]) -> str:
    """The H200 vLLM profile when there is one (the newest version listed last wins), else the first."""
    preferred = [n for n in names if n.startswith(PREFERRED)]
    return preferred[0] if preferred else names[0]


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached(name: str, directory: str | None):
    return load_profile(name, Path(directory) if directory else None)


def cached_profile(name: str):
    """One profile, loaded once per server process (aiconfigurator-core's take seconds: their parquet tables)."""
    return _cached(name, None if PROFILES_DIRECTORY is None else str(PROFILES_DIRECTORY))


def stack_label(profile) -> str:
    """ "vLLM 0.24.0": the stack's own spelling where specs/stacks.json knows it (a CPU profile's "numpy" stays)."""
    from specs.stacks import load_stack
    try:
        name = load_stack(profile.stack).name
    except SpecError:
        name = profile.stack
    return f"{name} {profile.stack_version}"


def stack_exchange(profile) -> tuple[str, str]:
    """(the stack's name, how it exchanges a wide-EP MoE layer's tokens: `Stack.moe_dp_comm`); a stack
    specs/stacks.json does not know (a CPU profile) gathers, as the stacks do by default."""
    from specs.stacks import load_stack
    try:
        s = load_stack(profile.stack)
    except SpecError:
        return str(profile.stack), "allgather_reducescatter"
    return s.name, s.moe_dp_comm


WEIGHT_CHOICES = ("bf16", "fp16", "fp32", "fp8", "fp8_block", "fp4", "int8")   # in the order offered
KV_CHOICES = ("bf16", "fp16", "fp32", "fp8")


def measured_formats(profile, table: str, column: str, choices: tuple) -> list[str]:
    """The formats of `choices` the profile measured in `table` (a CPU profile: fp32 only), in their order; all
    of `choices` where the table is missing (the lookups then say what is not measured)."""
    t = (getattr(profile, "tables", None) or {}).get(table) or {}
    have = set(np.asarray(t.get(column, [])).astype(str).tolist())
    return [c for c in choices if c in have] or list(choices)


def device_word(device: Device) -> str:
    """ "GPU" for a GPU, "device" for a CPU, an SoC, a TPU."""
    return "GPU" if device.kind == "gpu" else "device"


def profile_caption(profile, device: Device) -> str:
    """Which measurements the page draws and against which datasheet: the profile, its stack, its source and
    version, where it was measured, and the bandwidth and peak its efficiencies divide by."""
    src = profile.source or {}
    where = (profile.provenance or {}).get("device") or profile.device
    peak, precision = device.flops_for("bf16")
    link = f", {device.interconnect_name} at {fmt_num(device.interconnect_bytes_per_s / 1e9, 3)} GB/s a direction" \
        if device.interconnect_bytes_per_s else ""
    return (f"Profile **{profile.name}**: {stack_label(profile)} on {where}, measured by "
            f"{src.get('kind', 'unknown')} {src.get('version', '')}".rstrip() + ". "
            f"Efficiency = datasheet roofline ÷ measured time, against the {device.name} datasheet: "
            f"{fmt_num(device.memory_bandwidth_bytes_per_s / 1e9, 3)} GB/s memory bandwidth, "
            f"{fmt_si(peak, 'FLOP/s')} dense {precision}{link}"
            + (f" ({device.source})" if device.source.startswith("http") else "") + ".")


# ------------------------------------------------------------------------------------------------ charts
COLORS = ["#4C78A8", "#E45756", "#54A24B", "#B279A2", "#F58518", "#72B7B2", "#9D755D"]


def curve_traces(curve, color: str, x_label: str, x_text: list[str]) -> list[dict]:
    """Two scatter traces of one curve in % of the datasheet: the measured range (solid, filled markers) and
    the points past the table (dashed, hollow markers; joined to the last measured point so the line is
    unbroken). Hover: the size, the %, and both times."""
    eff = 100 * np.asarray(curve.efficiency, dtype=float)
    past = np.asarray(curve.extrapolated, dtype=bool)
    custom = [[t, fmt_num(i, 3), fmt_num(m, 3)] for t, i, m in zip(x_text, curve.ideal_ms, curve.ms)]
    hover = (f"<b>{curve.label}</b><br>{x_label} %{{customdata[0]}}<br>%{{y:.0f}}% of the datasheet<br>"
             "roofline %{customdata[1]} ms, measured %{customdata[2]} ms<extra>%{meta}</extra>")
    join = past.copy()
    edge = np.flatnonzero(~past)
    for i in np.flatnonzero(past):               # the measured neighbour of each extrapolated run
        for j in (i - 1, i + 1):
            if 0 <= j < len(past) and not past[j]:
                join[j] = True
    out = []
    if edge.size:
        out.append(dict(type="scatter", mode="lines+markers", name=curve.label, legendgroup=curve.label,
                        x=curve.x.tolist(), y=np.where(past, None, eff).tolist(), customdata=custom,
                        line=dict(color=color, width=3), marker=dict(size=8, color=color), meta="measured",
                        hovertemplate=hover))
    if past.any():
        out.append(dict(type="scatter", mode="lines+markers", name=curve.label + " (extrapolated)"
                        if not edge.size else curve.label, legendgroup=curve.label, showlegend=not edge.size,
                        x=curve.x.tolist(), y=np.where(join, eff, None).tolist(), customdata=custom,
                        line=dict(color=color, width=2, dash="dash"),
                        marker=dict(size=9, color=color, line=dict(width=2),
                                    symbol=np.where(past, "circle-open", "circle").tolist()),
                        meta="extrapolated", hovertemplate=hover))
    return out


def count_text(v: float) -> str:
    """1 -> "1", 1024 -> "1k", 16384 -> "16k", 131072 -> "128k" (sizes in powers of two, as profiles measure)."""
    v = int(round(v))
    return f"{v // 1024:,}k" if v >= 1024 and v % 1024 == 0 else f"{v:,}"


def bytes_text(v: float) -> str:
    """1024 -> "1 KiB", 16 MiB, 1 GiB: binary units, since the messages are powers of two."""
    v = int(round(v))
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size and v % size == 0:
            return f"{v // size:,} {unit}"
    return f"{v:,} B"


def log_axis(values, text, every: int = 2) -> dict:
    """A log axis whose ticks are every `every`-th of `values`, labelled by `text` (never plotly's 10000)."""
    vals = list(values)[::every]
    return dict(type="log", tickvals=vals, ticktext=[text(v) for v in vals])


OPS_COLUMNS = {"op": "op", "shape": "shape", "layers": "layers", "ideal_ms": "roofline (ms)",
               "measured_ms": "measured (ms)", "efficiency": "% of datasheet", "extrapolated": "extrapolated",
               "note": "note"}


def ops_frame(rows: list[dict]) -> pd.DataFrame:
    """`measured_step.step_ops_table`'s rows as a table with human headings, efficiency in %, and a total row."""
    df = pd.DataFrame(rows, columns=list(OPS_COLUMNS)).rename(columns=OPS_COLUMNS)
    df["% of datasheet"] = 100 * df["% of datasheet"]
    total = {"op": "all ops", "shape": "", "layers": None, "roofline (ms)": df["roofline (ms)"].sum(),
             "measured (ms)": df["measured (ms)"].sum(), "extrapolated": bool(df["extrapolated"].any()), "note": ""}
    total["% of datasheet"] = 100 * total["roofline (ms)"] / total["measured (ms)"]
    return pd.concat([df, pd.DataFrame([total])], ignore_index=True)


def ridge_marks(curve) -> dict:
    """A dotted vertical line where `curve`'s roofline turns from its bytes term to its FLOP term (between the
    last bandwidth-bound and the first compute-bound point drawn, halfway in log), labelled on both sides; {}
    where it does not turn in the range drawn. Layout keys for a log x axis (a shape there is placed by the size
    itself, an annotation by its log10)."""
    cb = np.asarray(curve.compute_bound, dtype=bool)
    if cb.all() or not cb.any():
        return {}
    i = int(np.argmax(cb))
    at = (np.log10(curve.x[i - 1]) + np.log10(curve.x[i])) / 2
    line = dict(type="line", xref="x", yref="paper", x0=10 ** at, x1=10 ** at, y0=0, y1=1,
                line=dict(color="#555", width=2, dash="dot"))
    notes = [dict(xref="x", yref="paper", x=at, y=0.04, text=t, showarrow=False, xanchor=a, xshift=s)
             for t, a, s in (("← % of bandwidth", "right", -6), ("% of peak FLOP/s →", "left", 6))]
    return dict(shapes=[line], annotations=notes)


def roof_marks(extra: dict | None = None, label: str = "datasheet roofline = 100%") -> dict:
    """The datasheet's own line, 100%, across the chart (what every efficiency is a fraction of), with `extra`'s
    shapes and annotations (`ridge_marks`) added."""
    extra = extra or {}
    line = dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=100, y1=100,
                line=dict(color="#222", width=2, dash="dot"))
    note = dict(xref="paper", yref="y", x=0.0, y=100, text=label, showarrow=False,
                xanchor="left", yanchor="bottom")
    return dict(shapes=[line, *extra.get("shapes", [])], annotations=[note, *extra.get("annotations", [])])


ANCHOR_COLUMNS = {"model": "model", "layout": "layout", "weights": "weights", "kind": "step",
                  "size": "rows or tokens", "aic_ms": "aiconfigurator (ms)", "here_ms": "here (ms)",
                  "ratio": "here / aiconfigurator"}


def _layout(c: dict) -> str:
    return f"TP {c['tp']}" + (f" × ADP {c['adp']}" if c["adp"] > 1 else "") + (f", EP {c['ep']}" if c["ep"] > 1 else "")


def anchor_frame(compared: list[dict]) -> pd.DataFrame:
    """The compared steps as a table, in the page's words."""
    return pd.DataFrame([{**c, "layout": _layout(c)} for c in compared])[list(ANCHOR_COLUMNS)].rename(
        columns=ANCHOR_COLUMNS)


def anchor_chart(compared: list[dict]) -> dict:
    """here / aiconfigurator for each step, one colour per model, decode and prefill apart, 1.0 marked."""
    from ui.charts import figure, style
    models = sorted({c["model"] for c in compared})
    traces = []
    for i, m in enumerate(models):
        mine = [c for c in compared if c["model"] == m]
        traces.append(dict(type="scatter", mode="markers", name=m, marker=dict(size=11, color=COLORS[i % len(COLORS)]),
                           x=[f"{c['kind']} {c['size']:,}" for c in mine], y=[c["ratio"] for c in mine],
                           hovertext=[f"{m}, {_layout(c)}, {c['weights']}" for c in mine]))
    lo = min(0.8, min(c["ratio"] for c in compared) - 0.05)
    hi = max(1.2, max(c["ratio"] for c in compared) + 0.05)
    return style(figure(*traces, title="The planner's step ÷ aiconfigurator's, same kernels, same work", height=420,
                        xaxis=dict(title="step (decode rows a rank, or prompt tokens)", type="category"),
                        yaxis=dict(title="here ÷ aiconfigurator", range=[lo, hi]),
                        shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                                     line=dict(dash="dot", color="#444"))]))
