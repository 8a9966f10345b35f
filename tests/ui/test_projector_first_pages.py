"""Projector-first (issue 35): on the lesson plans' sizing and serving pages the key chart comes right after the
page's title and the inputs the lesson needs, before the long prose, the metrics, the formulas and the tables, so
at 1366×768 it starts on the first screen (tools/walkthrough.py measures the pixels in a browser; this holds the
order, headless)."""
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
}


@pytest.mark.parametrize("stem", list(AFTER_THE_CHART))
def test_the_key_chart_comes_before_the_prose_and_the_numbers(stem):
    at = run_script(str(ROOT / "pages" / f"{stem}.py"), TIMEOUT)
    assert not at.exception and not errors(at), (at.exception, errors(at))
    since, later = AFTER_THE_CHART[stem]
    chart_comes_first(at, *later, since=since)
