"""The words and chart settings behind issue 18's fixes, without Streamlit running a page: sentences true of the
numbers they are given, log axes labelled with whole values, legends that add height, heatmaps that fit a
1280×720 screen, numbers too long for a float, request names as in their tables."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from ui.charts import (CHAR_EM, HEATMAP_MAX_PX, LARGE_TEXT_KEY, PAGE_PX, heatmap_size, legend_height_px,
                       log_ticks, style, wrap)
from ui.narration import (acceptance_words, allocator_words, best_cap_words, chunk_words, gap_words, goodput_words,
                          measured_text, plural, speedup_words)
from ui.serving import request_label
from ui.widgets import parse_number


# ------------------------------------------------------------------------------------------ charts
@pytest.mark.parametrize("lo, hi", [(0.003, 40.0), (1.0, 9.0), (2e3, 8e9), (0.5, 0.6)])
def test_log_axis_labels_are_whole_values_never_bare_minor_digits(lo, hi):
    """Plotly's "D2" ticks print 20 and 50 as a small "2" and "5", which a class reads as the values 2 and 5."""
    t = log_ticks([lo, hi])
    assert t["tickvals"] and len(t["tickvals"]) == len(t["ticktext"])
    for v, label in zip(t["tickvals"], t["ticktext"]):
        assert float(label.replace(",", "")) == pytest.approx(v)
        assert lo / 1.5 <= v <= hi * 1.5 or len(t["tickvals"]) == 1
    assert len(t["tickvals"]) <= 16


def test_style_gives_a_log_axis_its_labelled_ticks():
    fig = style({"data": [dict(type="scatter", x=[1, 10, 100], y=[0.01, 0.2, 3.0])],
                 "layout": dict(xaxis=dict(type="log"), yaxis=dict(type="log"))})
    assert "20" in fig.layout.yaxis.ticktext or "0.2" in fig.layout.yaxis.ticktext
    assert fig.layout.xaxis.ticktext[-1] == "100"


def test_a_legend_above_the_plot_adds_height_instead_of_squashing_it():
    """The KV variants chart kept 420 px for plot and a three-row legend together."""
    traces = [dict(type="scatter", x=[1, 2], y=[1, 2], name=f"a fairly long model name number {i}") for i in range(7)]
    fig = style({"data": traces, "layout": dict(height=420)})
    assert fig.layout.height == 420 + legend_height_px(traces, 15)
    assert legend_height_px(traces, 15) > 0


LONG_TITLE = ("Step times while 32 streams decode and a 2,000-token prompt is prefilled, whole or in chunks of "
              "256 tokens")


def test_wrap_breaks_at_spaces_into_lines_that_fit_and_keeps_every_word():
    text = wrap(LONG_TITLE, 300, 20)                            # 30 characters of 10 px a line
    lines = text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= 30 for line in lines)
    assert " ".join(lines) == LONG_TITLE
    assert wrap(" the", 300, 20) == " the"                   # a label that fits is left as it is


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("span", [1.0, 1 / 3])
def test_chart_titles_fit_the_chart_and_the_margin_makes_room_for_their_lines(large, span):
    """Issue 18, truncated titles: "Step times while 32 streams decode and a 2,000-token prompt …" ran past the chart's
    edge in large text; a title in a third of the page ("softmax (adds up to 1)") too. Every line must fit the
    chart's width, and the top margin grow by one line height per added line (else the lines run into the plot)."""
    import streamlit as st
    st.session_state[LARGE_TEXT_KEY] = large
    try:
        px = 22 if large else 15
        short = style({"data": [dict(type="bar", x=[1], y=[1])], "layout": dict(title="Step times")}, span=span)
        fig = style({"data": [dict(type="bar", x=[1], y=[1])],
                     "layout": dict(title=LONG_TITLE, xaxis=dict(title=LONG_TITLE))}, span=span, height=400)
        lines = fig.layout.title.text.split("<br>")
        assert " ".join(lines) == LONG_TITLE and len(lines) >= 2
        assert max(len(line) for line in lines) * CHAR_EM * (px + 4) <= span * PAGE_PX
        assert fig.layout.margin.t - short.layout.margin.t >= (len(lines) - 1) * 1.3 * (px + 4)
        assert fig.layout.title.pad.t > short.layout.title.pad.t       # plotly lifts a multi-line title into the
                                                                      # tool icons (by 0.7 of its size, measured)
        assert max(len(x) for x in fig.layout.xaxis.title.text.split("<br>")) * CHAR_EM * (px + 1) <= span * PAGE_PX
    finally:
        st.session_state[LARGE_TEXT_KEY] = False


def test_a_legend_title_takes_a_row_above_the_entries():
    """Plotly writes a legend's title (plotly express's colour column, "case") on a row of its own above the
    entries: counted as one entry row, the legend rose into the chart's title (Bandwidth floor, FlashAttention,
    Capacity planner)."""
    traces = [dict(type="bar", x=[1], y=[1], name=n) for n in ("ideal", "realistic")]
    one_row = legend_height_px(traces, 15)
    assert legend_height_px(traces, 15, titled=True) >= one_row + 15 * 1.3       # one more line of text
    fig = style({"data": traces, "layout": dict(title="ITL", legend=dict(title=dict(text="case")))})
    plain = style({"data": traces, "layout": dict(title="ITL")})
    assert fig.layout.margin.t == plain.layout.margin.t + legend_height_px(traces, 15, True) - one_row


def test_long_category_names_beside_a_plot_are_broken_to_leave_it_room():
    """Calibration's and the planner's horizontal bars had names so long that the plot kept 71 px and its x title
    ran past the chart's edge."""
    names = [f"Llama-3.1-70B fp8 · 4× H100 SXM TP4 · 1,000/{n} · TTFT p50" for n in (100, 200)]   # 54 characters
    import streamlit as st
    st.session_state[LARGE_TEXT_KEY] = True
    try:
        fig = style({"data": [dict(type="bar", x=[1, 2], y=names, orientation="h")], "layout": dict(height=200)})
    finally:
        st.session_state[LARGE_TEXT_KEY] = False
    assert list(fig.layout.yaxis.tickvals) == names
    lines = [t.split("<br>") for t in fig.layout.yaxis.ticktext]
    assert max(len(line) for t in lines for line in t) * CHAR_EM * 22 <= 0.6 * PAGE_PX
    assert [" ".join(t) for t in lines] == names
    assert fig.layout.height >= 200 * 1.3 + 2 * (len(lines[0]) - 1) * 1.3 * 22      # each row grows by its lines
    assert style({"data": [dict(type="bar", x=[1, 2], y=names, orientation="h")], "layout": {}}).layout.yaxis \
        .ticktext is None                                    # normal text: the names fit beside the plot as they are


@pytest.mark.parametrize("large", [False, True])
def test_token_heatmaps_fit_a_1280_by_720_screen(large):
    import streamlit as st
    st.session_state[LARGE_TEXT_KEY] = large
    try:
        for n in (5, 40, 96):
            step, height = heatmap_size(n)
            assert height <= HEATMAP_MAX_PX <= 720 - 60
            assert math.ceil(n / step) * 0.9 * (22 if large else 15) <= HEATMAP_MAX_PX - 260 + 22  # labels fit
    finally:
        st.session_state[LARGE_TEXT_KEY] = False


def test_request_names_on_a_gantt_match_the_table():
    """The engine's ids are already "R0"; the chart printed "RR0"."""
    assert request_label("R0") == "R0" and request_label(3) == "R3"


# ------------------------------------------------------------------------------------------ numbers
def test_a_twenty_digit_number_is_whole_and_then_out_of_range():
    """12345678901234567890 was refused as "must be a whole number" (float(v) != int(v) past 2**53)."""
    from ui.widgets import check_number
    v, problem = parse_number("Requests", "12345678901234567890", integer=True)
    assert problem is None and v == 12345678901234567890
    shown = []
    import ui.widgets as w
    keep = w.show_error
    w.show_error = lambda msg, where=None: shown.append(str(msg))
    try:
        assert check_number("Requests", v, 1, 1_000_000, integer=True) is None
    finally:
        w.show_error = keep
    assert shown and "between" in shown[0] and "whole" not in shown[0]


def test_a_huge_typed_number_is_named_in_three_figures_not_a_hundred_digits():
    """1e99 typed into the planner's prompt field printed "got 999,999,999,...,727" (100 digits); the message now
    reads 1e+99, and bounds and ordinary values keep their thousands separators."""
    import ui.widgets as w
    shown = []
    keep = w.show_error
    w.show_error = lambda msg, where=None: shown.append(str(msg))
    try:
        assert w.check_number("Mean prompt (tokens)", 1e99, 1, 131_072, integer=True) is None
        assert w.check_number("Mean prompt (tokens)", 200_000, 1, 131_072, integer=True) is None
    finally:
        w.show_error = keep
    assert shown[0] == "Mean prompt (tokens) must be between 1 and 131,072, got 1e+99."
    assert shown[1] == "Mean prompt (tokens) must be between 1 and 131,072, got 200,000."


# ------------------------------------------------------------------------------------------ words
def test_chunk_words_say_no_bump_when_the_chunk_fits_in_idle_compute():
    assert "no bump at all" in chunk_words(1.55, 7.1, 1.551, 2.44, 128)
    said = chunk_words(1.55, 14.6, 3.99, 5.25, 512)
    assert "3.99 ms" in said and "14.6 ms" in said and "no bump" not in said


def test_allocator_words_explain_coinciding_lines_by_the_copies():
    row = dict(max_batch=11, steps=8262, mean_waste_fraction=0.02, relocations=738, copied_tokens=248080)
    s = {"reserve": dict(row, max_batch=5, steps=8395, mean_waste_fraction=0.82), "contiguous": row,
         "paged": dict(row, relocations=0, copied_tokens=0)}
    said = allocator_words(s)
    assert "738 relocations copying 248,080 token positions" in said
    s["contiguous"] = dict(row, steps=9000)
    assert "relocations" not in allocator_words(s)


def test_goodput_words_name_the_load_where_goodput_leaves_throughput():
    rows = [dict(load=x, throughput_tok_s=100.0 * x, goodput_tok_s=100.0 * x * f)
            for x, f in ((0.5, 1.0), (0.8, 0.97), (0.95, 0.83))]
    said = goodput_words(rows)
    assert "from load **0.8**" in said and "**83%**" in said
    assert "every request meets both targets" in goodput_words([dict(r, goodput_tok_s=r["throughput_tok_s"])
                                                               for r in rows])


def test_best_cap_words_explain_a_tie():
    rows = [dict(max_batch=b, goodput_tok_s=g, fraction_meeting_slo=0.99)
            for b, g in ((4, 1467.0), (8, 2467.0), (16, 2467.0), (64, 2467.0))]
    said = best_cap_words(rows)
    assert "**8**" in said and "Caps 8 to 64 do equally well" in said
    assert "equally" not in best_cap_words(rows[:2])


def test_speculative_words_are_true_of_trained_and_random_models():
    """The page blamed "random weights" while the trained SmolLM2 was loaded."""
    trained = SimpleNamespace(name="SmolLM2-135M-Instruct", random_weights=False, config=SimpleNamespace(num_layers=30))
    random = SimpleNamespace(name="random SmolLM2", random_weights=True, config=SimpleNamespace(num_layers=30))
    said = acceptance_words(trained, 7, 0.42)
    assert "random" not in said and "42%" in said and "7 of 30 layers" in said
    assert "random weights" in acceptance_words(random, 7, 0.01)


def test_class_words_explain_a_batch_worth_less_than_one_stream():
    """"The batch is worth 0.236 lone streams" on a loaded server, while the lesson says the opposite."""
    steps = [SimpleNamespace(ended_at=99.0, seconds=0.5, prefill_tokens=400),
             SimpleNamespace(ended_at=99.5, seconds=0.1, prefill_tokens=0)]
    snap = SimpleNamespace(steps=steps, taken_at=100.0, running=3)
    said = speedup_words(snap, 0.236)
    assert "fewer, not more" in said and "400 prompt tokens" in said and "83%" in said
    assert "worth **2.50** lone streams" in speedup_words(snap, 2.5)
    assert speedup_words(SimpleNamespace(steps=steps, taken_at=100.0, running=0), 1.0) == ""   # nobody running now
    assert plural(1, "sequence") == "1 sequence" and plural(3, "sequence") == "3 sequences"
    assert measured_text(float("nan")) == "not measured yet" and measured_text(12.34) == "12.3"


def test_prefill_decode_words_give_the_measured_over_predicted_gap():
    df = pd.DataFrame({"ITL measured (ms)": [42.0, 44.0], "ITL predicted (ms)": [25.0, 25.0],
                       "TTFT measured (ms)": [100.0, 300.0], "TTFT predicted (ms)": [50.0, 150.0]})
    said = gap_words(df)
    assert "**1.7×**" in said and "**2.0×**" in said and "floor" in said


def test_log_ticks_read_plotly_express_numpy_data():
    """plotly 6 packs NumPy columns as base64; unread, the max-batch chart fell back to plotly's 700-800-900 labels."""
    import plotly.express as px
    df = pd.DataFrame({"context": [128, 256, 512, 1024, 2048], "batch": [11505, 5937, 3017, 1521, 761]})
    fig = style(px.line(df, x="context", y="batch", log_x=True, log_y=True))
    assert fig.layout.yaxis.ticktext == ("1,000", "2,000", "5,000", "10,000")
