"""Numbers and charts that read from the back row of a classroom (issue 28's projector list), checked on the
shared helpers every page draws through (`ui.widgets.df_with_download`, `ui.charts.style`):

- table numbers carry thousands separators, with three significant digits for a column's smallest value
  (1520640 -> "1,520,640", 64935.998 -> "64,936"): expected formats worked by hand from each example's digits;
- a table too wide for 1366 px draws the columns a page names, under short headings (with Large text, the
  leading ones that fit), and says which ones only its CSV has; the CSV keeps every column under its own name;
- bar labels are never rotated (a rotated "8" reads as "∞") nor shrunk below 4/5 of the chart's font;
- an axis of quantities that cannot be negative stops at zero (an empty step-time chart showed −1 ms), and one
  that carries negative values, its own range, a heatmap or a log scale is left alone.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest

from ui.charts import bar_label_min_px, figure, font_px, style
from ui.widgets import number_format, readable_numbers


@pytest.mark.parametrize("values, fmt", [
    ([1520640, 3], "%,d"),                   # integers: separators, no decimals
    ([64935.998, 70000.5], "%,.0f"),         # smallest 6.5e4: 3 significant digits need no decimals
    ([250.5, 120.25], "%,.0f"),              # smallest 120: 3 digits before the point
    ([64935.998, 12.5], "%,.1f"),            # smallest 12.5: one decimal, for every row
    ([2.345, 1.2], "%,.2f"),                 # smallest 1.2: two decimals
    ([0.0456, 0.03], "%,.4f"),               # smallest 0.03: 0.0300
    ([3.0, 4.0], "%,.0f"),                   # whole numbers stored as floats
    ([0.0, 0.0], "%,.0f"),
    ([0.007874, 3.0, 0.0019], None),         # 0.0019 would need 5 decimals: Streamlit's own format
    ([1e-5, 2e-5], None),
    (["a", "b"], None),
    ([True, False], None),
])
def test_table_numbers_get_separators_and_a_few_digits(values, fmt):
    assert number_format(pd.Series(values)) == fmt


def test_a_page_format_wins_and_every_other_numeric_column_gets_one():
    df = pd.DataFrame({"name": ["a"], "bytes": [1520640], "ms": [64935.998], "ratio": [1.05]})
    own = {"ratio": {"type_config": {"type": "number", "format": "%.3f"}}}
    cfg = readable_numbers(df, own)
    assert cfg["ratio"] is own["ratio"] and "name" not in cfg
    assert cfg["bytes"]["type_config"]["format"] == "%,d"
    assert cfg["ms"]["type_config"]["format"] == "%,.0f"
    assert cfg["ratio"]["type_config"]["format"] == "%.3f"


def test_a_wide_table_shows_the_named_columns_and_the_csv_keeps_all(monkeypatch):
    import streamlit as st

    from ui import widgets
    drawn, captions, files = {}, [], []
    monkeypatch.setattr(st, "dataframe", lambda df, **kw: drawn.update(kw))
    monkeypatch.setattr(st, "caption", captions.append)
    monkeypatch.setattr(st, "download_button",        # the CSV is made when the button is clicked (a callable)
                        lambda label, data, **kw: files.append((data() if callable(data) else data).decode()))
    df = pd.DataFrame({"op": ["q_proj"], "shape": ["[1, 2] @ [2, 3]"], "intensity (FLOP/byte)": [512.0],
                       "bound": ["compute"]})
    widgets.df_with_download(df, "ops", show={"op": None, "bound": None, "intensity (FLOP/byte)": "FLOP/byte",
                                              "not a column": "x"})
    assert drawn["column_order"] == ["op", "bound", "intensity (FLOP/byte)"]
    assert drawn["column_config"]["intensity (FLOP/byte)"]["label"] == "FLOP/byte"
    assert drawn["column_config"]["intensity (FLOP/byte)"]["type_config"]["format"] == "%,.0f"
    assert captions == ["Also in the CSV: shape."]
    assert files[0].splitlines()[0] == "op,shape,intensity (FLOP/byte),bound"
    drawn.clear(), captions.clear()
    widgets.df_with_download(df, "ops2")
    assert drawn["column_order"] is None and captions == []


@pytest.mark.parametrize("large, shown", [(True, 8), (False, 10)])
def test_only_the_leading_columns_that_fit_are_drawn(monkeypatch, large, shown):
    """12 columns of 10-character values. Large text: (20 + 10.5 × 10) = 125 px each, 8 fit 1,000 px (1,000) and
    a 9th does not (1,125). Normal text: (18 + 7.5 × 10) = 93 px each, 10 fit 950 px (930) and an 11th does not
    (1,023). A table whose page ranked no columns is drawn whole."""
    import streamlit as st

    from ui import widgets
    drawn, captions = {}, []
    monkeypatch.setattr(st, "dataframe", lambda df, **kw: drawn.update(kw))
    monkeypatch.setattr(st, "caption", captions.append)
    monkeypatch.setattr(st, "download_button", lambda *a, **kw: None)
    monkeypatch.setattr(widgets, "large_text", lambda: large)
    df = pd.DataFrame({f"c{i}": ["x" * 10] for i in range(12)})
    widgets.df_with_download(df, "wide", show=list(df.columns))
    assert drawn["column_order"] == [f"c{i}" for i in range(shown)]
    assert captions == ["Also in the CSV: " + ", ".join(f"c{i}" for i in range(shown, 12)) + "."]
    drawn.clear(), captions.clear()
    widgets.df_with_download(df, "unranked")                       # no ranking: nothing hidden, it scrolls
    assert drawn["column_order"] is None and captions == []


def _trace(fig, i=0) -> dict:
    return fig.to_plotly_json()["data"][i]


def test_bar_labels_stay_level_and_no_smaller_than_the_chart_font():
    fig = style(go.Figure([go.Bar(x=["off", "on"], y=[72, 8], text=[72, 8]),
                           go.Bar(x=["off", "on"], y=[1, 2])]), height=300)
    assert _trace(fig, 0)["textangle"] == 0
    assert "textangle" not in _trace(fig, 1)                   # no label, nothing to turn
    assert fig.layout.uniformtext.minsize == bar_label_min_px(font_px()) == 12      # 4/5 of the 15 px font
    assert fig.layout.uniformtext.mode == "hide"
    own = style(go.Figure(go.Bar(x=["a"], y=[1], text=["a"], textangle=-90)), height=300)
    assert _trace(own, 0)["textangle"] == -90                  # a page that asks for it keeps it
    plain = style(go.Figure(go.Scatter(x=[1, 2], y=[1, 2], text=["a", "b"])), height=300)
    assert plain.layout.uniformtext.minsize is None


def test_axes_of_non_negative_quantities_stop_at_zero():
    empty = style(figure(dict(type="scatter", x=[], y=[], mode="markers+lines"),
                         xaxis=dict(title="seconds ago"), yaxis=dict(title="step time (ms)")), height=300)
    assert empty.layout.yaxis.rangemode == "nonnegative"
    steps = style(figure(dict(type="scatter", x=[-3.0, -1.0], y=[0.2, 0.4]),
                         xaxis=dict(title="seconds ago"), yaxis=dict(title="step time (ms)")), height=300)
    assert steps.layout.yaxis.rangemode == "nonnegative"
    assert steps.layout.xaxis.rangemode is None                 # negative values: left as plotly draws it


def test_the_axis_bars_stand_on_keeps_the_bar_at_zero_whole():
    """KV cache, step by step: step 0's 'rows written' bar sat left of x = 0 and an axis cut at zero hid it."""
    steps = style(figure(dict(type="bar", x=[0, 1, 2], y=[33, 1, 1]), dict(type="bar", x=[0, 1, 2], y=[33, 34, 35]),
                         barmode="group", xaxis=dict(title="step"), yaxis=dict(title="rows")), height=300)
    assert steps.layout.xaxis.rangemode is None
    assert steps.layout.yaxis.rangemode == "nonnegative"
    across = style(figure(dict(type="bar", orientation="h", y=[0, 1], x=[3, 4]), xaxis=dict(title="rows")), height=300)
    assert across.layout.yaxis.rangemode is None and across.layout.xaxis.rangemode == "nonnegative"


@pytest.mark.parametrize("fig", [
    figure(dict(type="scatter", x=[1, 2], y=[0.2, 0.4]), yaxis=dict(title="ms", range=[0.1, 0.5])),
    figure(dict(type="scatter", x=[1, 2], y=[0.2, 0.4]), yaxis=dict(title="ms", type="log")),
    figure(dict(type="heatmap", z=[[1, 2]], x=[0, 1], y=[0]), yaxis=dict(title="row")),
    figure(dict(type="bar", x=["a", "b"], y=[1, -2]), yaxis=dict(title="change")),
    figure(dict(type="bar", x=["a"], y=[1], base=[-1]), yaxis=dict(title="span")),
])
def test_axes_with_their_own_range_scale_or_negatives_are_left_alone(fig):
    assert style(fig, height=300).layout.yaxis.rangemode is None


@pytest.mark.parametrize("name, heading", [
    ("itl_p99_at_load_ms", "ITL p99 at load (ms)"), ("arrival_rate_rps", "arrival rate (requests/s)"),
    ("peak_allocated_tokens", "peak allocated tokens"), ("kv_heads", "KV heads"), ("output_tok_s", "output tokens/s"),
    ("usd_per_million_tokens", "$ per 1M tokens"), ("step_ms_at_load", "step at load (ms)"),
    ("offline · output_tok_s", "offline · output tokens/s"), ("TTFT (ms)", "TTFT (ms)"), ("step", "step")])
def test_table_headings_read_as_words_while_the_csv_keeps_its_names(name, heading):
    from ui.headings import human_heading
    assert human_heading(name) == heading
