"""Charts a class can read from the back of the room: one plotly look for every page (axis titles, fonts of at
least 14 px, 22 px and up with the large-text option), and the large-text switch itself (sidebar, every page).

    from ui.charts import style
    st.plotly_chart(style(fig), use_container_width=True)
"""
from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import streamlit as st

from ui.widgets import LARGE_TEXT_KEY, large_text  # noqa: F401  (the switch lives with the tables that read it)
# Explicit colour scales (a named one in a plain-dict figure is read by plotly.js, whose "Blues" runs dark to light):
WEIGHTS = [[0.0, "#f7fbff"], [0.25, "#c6dbef"], [0.5, "#6baed6"], [0.75, "#2171b5"], [1.0, "#08306b"]]  # 0 = white
DIVERGING = [[0.0, "#2166ac"], [0.5, "#f7f7f7"], [1.0, "#b2182b"]]                                  # −, 0, +
NORMAL_FONT_PX, LARGE_FONT_PX = 15, 22
# A metric's value wraps instead of ending in "…": a cut number is a wrong number (both text sizes).
_METRIC_CSS = """
<style>
  [data-testid="stMetricValue"], [data-testid="stMetricValue"] * {
    white-space: normal !important; overflow: visible !important; text-overflow: clip !important;
    overflow-wrap: anywhere; }
  [data-testid="stMetricLabel"] p, [data-testid="stPageLink"] p, [data-testid="stPageLink"] span,
  [data-testid="stSidebarNavLink"], [data-testid="stSidebarNavLink"] *, [data-testid="stNavSectionHeader"] {
    white-space: normal !important; overflow: visible !important; text-overflow: clip !important; }
  [data-testid="stSidebarNavLink"] { height: auto !important; min-height: 2rem; }
  /* a projector's 1366x768: less empty margin above and beside the lesson, more room for its tables and charts */
  [data-testid="stMainBlockContainer"] { padding-top: 4rem !important; padding-left: 3rem !important;
    padding-right: 3rem !important; }
</style>
"""
_LARGE_CSS = """
<style>
  html, body, [data-testid="stAppViewContainer"] { font-size: 21px; }
  [data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li,
  [data-testid="stCaptionContainer"], label, .stTextInput input, .stTextArea textarea { font-size: 1.15rem !important; }
  [data-testid="stMetricValue"], [data-testid="stMetricValue"] div,
  [data-testid="stMetricValue"] p { font-size: 2.6rem !important; }
  [data-testid="stMetricLabel"] p { font-size: 1.05rem !important; }
  h1 { font-size: 3rem !important; } h2 { font-size: 2.2rem !important; } h3 { font-size: 1.7rem !important; }
  [data-testid="stMainBlockContainer"] { padding-top: 3.5rem !important; padding-left: 1rem !important;
    padding-right: 1rem !important; }
</style>
"""


def font_px() -> int:
    return LARGE_FONT_PX if large_text() else NORMAL_FONT_PX


def label_step(n: int, span_px: int = 760) -> int:
    """Write every k-th of n category labels so that labels of the current font size never overlap on an axis
    about `span_px` long: k = 1 when they all fit."""
    return max(1, -(-n * (font_px() + 5) // span_px))


HEATMAP_MAX_PX = 640    # a token-by-token heatmap fits a 1280×720 screen whole, in both text sizes


def heatmap_size(n: int) -> tuple[int, int]:
    """(label step, height in px) of an n × n token heatmap: rows as tall as a label where they fit, the chart
    never taller than HEATMAP_MAX_PX (then every k-th label is written)."""
    room = HEATMAP_MAX_PX - 260                                  # title, axis titles and rotated labels
    step = label_step(n, span_px=room)
    return step, min(HEATMAP_MAX_PX, max(420, (font_px() + 6) * n // step + 260))


def large_text_toggle() -> None:
    """Sidebar switch (remembered across pages); when on, bigger page text (CSS) and bigger chart fonts."""
    from ui.widgets import remember
    store = remember(LARGE_TEXT_KEY, False)
    st.sidebar.toggle("Large text (projector)", key=LARGE_TEXT_KEY, on_change=store,
                      help="Bigger text and chart labels for a classroom screen.")
    st.markdown(_METRIC_CSS, unsafe_allow_html=True)
    if large_text():
        st.markdown(_LARGE_CSS, unsafe_allow_html=True)


def _merge(base: dict, extra: dict) -> dict:
    """`extra` written over `base`, nested dicts merged (base's own keys win nowhere they are both set)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def figure(*traces: dict, **layout: Any) -> dict:
    """A chart as a plain dict (traces like dict(type="bar", x=..., y=...)): no per-property validation, so
    charts redrawn at every interaction cost little. Pass it to `style` before drawing."""
    return {"data": list(traces), "layout": layout}


LEGEND_ROW_PX = 560   # width a horizontal legend row is assumed to get (less than a page column: plotly pads entries)
MODEBAR_PX = 34       # the chart's tool icons sit above the title, not on it
PAGE_PX = 760         # the page's main column at 1280×720, sidebar open (large text: its narrowest); a chart in
                      # st.columns gets its share (`style(..., span=1 / 3)`)
CHAR_EM = 0.5         # a character of plotly's font is at most about half its size wide, on average (measured 0.45)
LINE_EM = 1.4         # height of a line of plotly text (a title line broken with <br>, a legend row), in font sizes
LIFT_EM = 0.7        # plotly lifts a title of several lines (yanchor "top") by this many font sizes: pad it back
LABELS_SHARE = 0.6    # category labels beside a plot (a horizontal bar chart's names) take at most this share


def wrap(text: str, width_px: float, size_px: float) -> str:
    """`text` broken at spaces into lines (plotly's <br>) no wider than `width_px` at font size `size_px`, so a
    title is never cut by the chart's edge. A word longer than a line stays whole."""
    per_line = max(8, int(width_px / (CHAR_EM * size_px)))
    lines: list[str] = []
    for part in str(text).split("<br>"):
        if len(part) <= per_line:
            lines.append(part)
            continue
        line = ""
        for word in part.split(" "):
            if line and len(line) + 1 + len(word) > per_line:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "<br>".join(lines)


def _lines(text: str) -> int:
    return str(text).count("<br>") + 1


def legend_height_px(traces: list, px: int, titled: bool = False, row_px: float = LEGEND_ROW_PX) -> int:
    """Height a horizontal legend of these traces takes at font size px: entries of about 0.6·px per character
    plus the symbol, packed greedily into rows of `row_px`, plus a row for the legend's title (`titled`: plotly
    writes it above the entries, e.g. plotly express's colour column), LINE_EM·px a row and 10 px of padding
    (measured in Chromium: 52 px for two rows at 15 px, 102 px for three at 22 px). A lone trace has no legend
    (plotly's default)."""
    shown = [t for t in traces if t.get("showlegend", True) is not False and t.get("type") not in ("heatmap", "pie")]
    if len(shown) < 2 and not any(t.get("showlegend") is True for t in shown):
        return 0
    rows, used = int(titled), row_px
    for t in shown:
        w = 0.6 * px * len(str(t.get("name") or "trace")) + 50
        if used + w > row_px:
            rows, used = rows + 1, 0
        used += w
    return rows * round(LINE_EM * px) + 10


def _numbers(raw: Any) -> np.ndarray | None:
    """A trace's x or y as floats, or None where they are not numbers (text categories, dates) or absent."""
    if raw is None:
        return None
    try:
        if isinstance(raw, dict) and "bdata" in raw:               # plotly 6 packs NumPy arrays as base64
            return np.frombuffer(base64.b64decode(raw["bdata"]), dtype=raw["dtype"]).astype(float)
        return np.asarray(raw, dtype=float).ravel()
    except (TypeError, ValueError, KeyError):
        return None


def _axis_values(traces: list, axis_name: str) -> list[float]:
    """The positive finite values the traces put on one axis ("xaxis2" holds the traces with xaxis="x2")."""
    letter, ref = axis_name[0], axis_name[0] + axis_name[5:]
    out: list[float] = []
    for t in traces:
        if t.get(f"{letter}axis", letter) != ref or t.get(letter) is None:
            continue
        v = _numbers(t[letter])
        if v is None:
            continue
        out.extend(v[np.isfinite(v) & (v > 0)].tolist())
    return out


def _never_negative(traces: list, layout: dict, axis_name: str) -> bool:
    """True when an axis only carries quantities that cannot be negative (times, bytes, counts) from lines, markers
    and bars, so its range should stop at zero: plotly pads a short or empty series below it (a step-time axis
    from −1 ms). False for a log, category or date axis, the axis bars stand on (the bar at 0 spans −½ to ½), one with its own range, any other kind of trace on it
    (a heatmap's cells reach half a cell below 0), text categories, or any value below zero."""
    ax = layout.get(axis_name) or {}
    if ax.get("type") not in (None, "linear", "-") or "range" in ax or ax.get("autorange") not in (None, True):
        return False
    letter, ref = axis_name[0], axis_name[0] + axis_name[5:]
    on_axis = [t for t in traces if t.get(f"{letter}axis", letter) == ref]
    if not on_axis:
        return False
    for t in on_axis:
        if t.get("type", "scatter") not in ("scatter", "scattergl", "bar") or t.get("base") is not None:
            return False
        if t.get("type") == "bar" and letter == ("y" if t.get("orientation") == "h" else "x"):
            return False                     # a bar at position 0 spans half a slot below it (step 0's bar cut)
        v = _numbers(t.get(letter))
        if v is None or np.any(v[np.isfinite(v)] < 0):           # None: no values, text categories, dates
            return False
    return True


def log_ticks(values: list[float]) -> dict:
    """Tick marks for a log axis, each labelled with its whole value ("20", "500", "0.002"), never plotly's bare
    minor digits ("2", "5") that read as values: 1-2-5 per decade over up to three decades, powers of ten beyond.
    Powers of ten (dtick 1) when there is nothing to place them on."""
    if not values:
        return dict(dtick=1)                   # powers of ten only: fewer labels, none misread
    lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    steps = (1, 2, 5) if hi - lo <= 3 else (1,)
    vals = [m * 10.0 ** k for k in range(lo, hi + 1) for m in steps]
    vals = [v for v in vals if min(values) / 1.5 <= v <= max(values) * 1.5] or [10.0 ** lo]
    return dict(tickvals=vals, ticktext=[f"{v:,.10g}" for v in vals], minor=dict(showgrid=False))


def _title_text(layout: dict, name: str) -> str:
    title = (layout.get(name) or {}).get("title") if name != "title" else layout.get("title")
    return str((title or {}).get("text") or "") if isinstance(title, dict) else str(title or "")


def _category_labels(traces: list, axis_name: str) -> list[str]:
    """The text categories the traces put on one axis, in order ("yaxis": a horizontal bar chart's names)."""
    letter, ref = axis_name[0], axis_name[0] + axis_name[5:]
    out: list[str] = []
    for t in traces:
        v = t.get(letter) if t.get(f"{letter}axis", letter) == ref else None
        v = v.tolist() if isinstance(v, np.ndarray) else v             # plotly express hands NumPy arrays
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
            out += v
    return list(dict.fromkeys(out))


def _fit_titles(d: dict, layout: dict, px: int, width: float,
                height: float | None) -> tuple[dict, int, int, float]:
    """Chart, axis and colour-bar titles broken into lines that fit the chart (`width` px wide), and category labels
    beside the plot broken likewise where they would take more than LABELS_SHARE of the width. Returns the layout
    changes, the extra top margin the title's added lines need, the extra height the labels' added lines need
    (each row keeps its height per line) and the plot's width (what a legend row above it gets)."""
    out: dict[str, Any] = {}
    labels_px, extra_rows = 0.0, 0
    for name in [k for k in layout if k.startswith("yaxis")] or ["yaxis"]:
        cats = _category_labels(d.get("data", []), name)
        ax = layout.get(name, {})
        if cats and "tickvals" not in ax and "ticktext" not in ax:
            text = [wrap(c, LABELS_SHARE * width, px) for c in cats]
            labels_px = max(labels_px, max(max(len(x) for x in t.split("<br>")) for t in text) * CHAR_EM * px)
            if text != cats:
                out[name] = dict(tickmode="array", tickvals=cats, ticktext=text)
                extra_rows += len(cats) * (max(_lines(t) for t in text) - 1)
    plot_w = width - max(90.0, labels_px + 2 * px + 20)       # tick labels and the y title take the left side
    plot_h = (height or 450) - 4 * px - 120                  # title, legend, x tick labels and x title
    for name in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
        text = _title_text(layout, name)
        if text:
            wrapped = wrap(text, plot_w if name.startswith("x") else plot_h, px + 1)
            out[name] = {**out.get(name, {}), "title": dict(text=wrapped)}
    for i, t in enumerate(d.get("data", [])):
        title = (t.get("colorbar") or {}).get("title")
        text = title.get("text") if isinstance(title, dict) else title
        if text:
            d["data"][i] = _merge(t, dict(colorbar=dict(title=dict(text=wrap(text, 8 * px, px)))))
    title = _title_text(layout, "title")
    extra_top = 0
    if title:
        wrapped = wrap(title, width - 20, px + 4)
        out["title"] = dict(text=wrapped)
        lines = _lines(wrapped)
        extra_top = (lines - 1) * round(LINE_EM * (px + 4)) + (round(LIFT_EM * (px + 4)) if lines > 1 else 0)
    return out, extra_top, extra_rows * round(LINE_EM * px), plot_w


def bar_label_min_px(px: int) -> int:
    """The smallest a bar label may be drawn: 4/5 of the chart's font (12 px at normal size, 18 with large text).
    Plotly shrinks a label to fit its bar, down to 7 px; below this size the label is hidden instead."""
    return round(0.8 * px)


def _bar_labels(traces: list) -> bool:
    """Bar labels readable from the back row: never turned on their side (plotly rotates a label that is wider
    than its bar, and a rotated "8" reads as "∞"), and none shrunk below `bar_label_min_px` (`uniformtext` hides
    such a label; the value stays in the hover and the page's table). Changes the traces in place; True when any
    bar carries a label."""
    labelled = False
    for i, t in enumerate(traces):
        if t.get("type") == "bar" and (t.get("text") is not None or t.get("texttemplate")):
            traces[i] = {"textangle": 0, **t}
            labelled = True
    return labelled


def style(fig: Any, *, height: int | None = None, legend_top: bool = True, span: float = 1.0) -> Any:
    """The app's chart look applied to a plotly figure (or a `figure` dict): readable fonts (bigger with large text), titled axes kept,
    margins that leave room for tick labels, a legend above the plot so it never covers data, titles broken into
    lines that fit the chart (`span`: the share of the page's width it gets, 1/2 in one of st.columns(2)).

    Applied to the figure's plain dict and rebuilt without re-validation: plotly checks every property it sets
    one by one, which costs tens of ms per chart, and a rerun of a page with several charts must stay well under
    300 ms. No template object either (Streamlit's theme gives the colours)."""
    px = font_px()
    d = dict(fig) if isinstance(fig, dict) else fig.to_plotly_json()
    d["data"] = list(d.get("data", []))
    layout = dict(d.get("layout", {}))
    if isinstance(layout.get("title"), str):
        layout["title"] = dict(text=layout["title"])
    for name in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
        if isinstance(layout[name].get("title"), str):
            layout[name] = {**layout[name], "title": dict(text=layout[name]["title"])}
    height = height if height is not None else layout.get("height")
    scale = 1.3 if large_text() else 1.0
    width = span * PAGE_PX
    fitted, extra_top, extra_h, plot_w = _fit_titles(d, layout, px, width, None if height is None else height * scale)
    if extra_h and height is None:
        height = 450 / scale                                 # plotly's default height, grown below
    layout = _merge(layout, fitted)
    axis = dict(title=dict(font=dict(size=px + 1)), tickfont=dict(size=px), automargin=True)
    titled = bool(layout.get("title", {}).get("text"))
    lt = (layout.get("legend") or {}).get("title")                # plotly writes it above the entries
    legend_titled = bool(lt.get("text") if isinstance(lt, dict) else lt) and \
        not (isinstance(lt, dict) and lt.get("side") == "left")
    legend_px = legend_height_px(d.get("data", []), px, legend_titled, min(LEGEND_ROW_PX, plot_w)) \
        if legend_top and layout.get("showlegend", True) else 0
    # top margin = title lines + the legend's rows above the plot: the two never overlap, however many entries
    extra: dict[str, Any] = dict(
        font=dict(size=px), hoverlabel=dict(font=dict(size=px)),
        margin=dict(l=10, r=10, t=(px + 24 + MODEBAR_PX + extra_top if titled else 24) + legend_px, b=10),
    )
    if "title" in layout:
        lift = round(LIFT_EM * (px + 4)) if _lines(layout["title"].get("text") or "") > 1 else 0
        extra["title"] = dict(font=dict(size=px + 4), yref="container", y=1.0, yanchor="top",
                              pad=dict(t=MODEBAR_PX + lift))
    for name in [k for k in layout if k.startswith(("xaxis", "yaxis"))] or ["xaxis", "yaxis"]:
        log = layout.get(name, {}).get("type") == "log" and "dtick" not in layout.get(name, {}) \
            and "tickvals" not in layout.get(name, {})
        extra[name] = {**axis, **log_ticks(_axis_values(d.get("data", []), name))} if log else axis
        if _never_negative(d.get("data", []), layout, name):
            extra[name] = {**extra[name], "rangemode": "nonnegative"}
    if legend_top:
        extra["legend"] = dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0, font=dict(size=px),
                               title=dict(font=dict(size=px)))
    if height is not None:
        extra["height"] = int(height * scale) + legend_px + extra_top + extra_h  # these add, never squash
    if _bar_labels(d["data"]):
        layout.setdefault("uniformtext", dict(minsize=bar_label_min_px(px), mode="hide"))
    layout = _merge(layout, extra)
    if "annotations" in layout:
        layout["annotations"] = [_merge(a, dict(font=dict(size=px))) for a in layout["annotations"]]
    d["layout"] = layout
    import plotly.graph_objects as go
    return go.Figure(d, _validate=False)
