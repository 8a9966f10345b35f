"""Projector-first (issue 35): on the sizing, serving and beyond-one-GPU pages (the lesson plans' ones, then the
others) the key chart comes right after the page's title and the inputs the lesson needs, before the long prose, the
metrics, the formulas and the tables, so at 1366×768 it starts on the first screen (tools/walkthrough.py measures
the pixels in a browser; this holds the order, headless); a switch above a chart keeps to one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers_apptest import chart_comes_first, errors, run_script

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120

# page file stem -> (the element kind the order is counted from, what must come after the key chart); in the
# comments the chart's top at 1366×768 before the change (normal / Large text, px)
SIZING = ("markdown", "caption", "metric", "dataframe", "subheader")   # the world's notes and the intro: prose
AFTER_THE_CHART = {
    "24_Bandwidth_floor_and_latency": ("title", SIZING),                             # 2,275 / 3,523
    "31_Batching": ("title", ("caption", "expander", "dataframe", "subheader")),    # 817 / 1,411
    "23_Roofline": ("title", ("markdown", "caption", "success", "dataframe")),     # 800 / 1,351
    "26_Quantization": ("title", ("markdown", "caption", "dataframe", "expander")), # 1,007 with Large text
    "32_Continuous_batching": ("title", ("markdown", "caption", "dataframe", "expander")),  # 967 / 1,624
    "33_Paged_KV_cache": ("title", ("markdown", "caption", "dataframe", "text_area")),  # 1,765 / 1,606
    "34_Prefix_caching": ("title", ("markdown", "caption", "metric", "dataframe")),  # 1,195 with Large text
    "35_Chunked_prefill": ("title", ("markdown", "caption", "metric", "dataframe")),  # 900 / 1,511
    "36_Speculative_decoding": ("title", ("markdown", "metric", "dataframe")),       # 780 with Large text
    # the planner names its plan first (two rows of metrics), then the frontier with that plan marked
    "42_Capacity_planner": ("title", ("markdown", "caption", "dataframe", "subheader")),   # 2,536 / 4,106
    # the pages outside the lesson plans
    "25_FlashAttention": ("title", SIZING),                                          # 916 / 1,677
    "37_Queueing_and_SLOs": ("title", ("markdown", "caption", "metric", "dataframe")),  # 828 / 1,382
    "43_Calibration": ("title", ("dataframe", "text_area")),   # the error chart under its numbers: 994 / 1,484
    "41_Parallelism": ("title", ("markdown", "caption", "metric", "dataframe", "success", "warning")),  # 738 / 1,255
    "21_Model_anatomy": ("title", ("markdown", "caption", "dataframe", "expander", "tabs")),  # 688 / 1,152
    "22_KV_cache_and_attention_variants": ("title", ("markdown", "dataframe", "expander")),  # 654 / 1,100
}
STATE = {"37_Queueing_and_SLOs": {"queue.n": 200}}                  # a short simulated run: the order is the same


@pytest.mark.parametrize("stem", list(AFTER_THE_CHART))
def test_the_key_chart_comes_before_the_prose_and_the_numbers(stem):
    at = run_script(str(ROOT / "pages" / f"{stem}.py"), TIMEOUT, **STATE.get(stem, {}))
    assert not at.exception and not errors(at), (at.exception, errors(at))
    since, later = AFTER_THE_CHART[stem]
    chart_comes_first(at, *later, since=since)


def test_your_machine_shows_where_the_time_went_right_under_its_run_button():
    """Your machine's chart exists once the engine has run: then it comes right after the inputs and the button,
    before the intro, the prediction and the measured numbers (2,283 px with Large text before)."""
    at = run_script(str(ROOT / "pages" / "27_Your_machine.py"), TIMEOUT, **{"machine.prompt": 8, "machine.steps": 3})
    at = at.button(key="machine.run").click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    chart_comes_first(at, "markdown", "caption", "metric", "dataframe", "subheader")


# A horizontal radio with Large text, as measured on the Bandwidth floor page (29 Nov 2026, 1366×768): about 10 px
# a character and 57 px an option (its circle and the gap to the next); the lesson's column is MAIN_PX wide.
RADIO_CHAR_PX, RADIO_OPTION_PX = 10, 57


def test_the_bandwidth_floor_compare_switch_keeps_its_options_on_one_line_with_large_text():
    """"$ per 1M output tokens" went onto a second line of the Compare switch above the chart (about 1,055 px of
    options for 1,020), pushing the chart down."""
    from ui.metrics import MAIN_PX
    at = run_script(str(ROOT / "pages" / "24_Bandwidth_floor_and_latency.py"), TIMEOUT)
    assert not at.exception and not errors(at), (at.exception, errors(at))
    options = at.radio(key="lat.compare_metric").options
    width = sum(RADIO_CHAR_PX * len(o) + RADIO_OPTION_PX for o in options)
    assert width <= MAIN_PX[True], (width, options)
