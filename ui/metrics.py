"""Metrics a projector shows on one line each: a row of st.metric cut into as many rows as it takes for every value
to fit its column at the current text size, units in the labels (a value "32.5 tokens/s" wrapped to "32.5 /
tokens/s", and to three lines at 125% zoom).

    metric_row([("One stream alone (tokens/s)", "32.5", "1 / median step time"), ...])
"""
from __future__ import annotations

import math
from typing import Any

import streamlit as st

from ui.widgets import large_text

MAIN_PX = {False: 970, True: 1020}       # the lesson's column at 1366×768, sidebar open (ui.charts' margins)
VALUE_PX = {False: 36, True: 55}          # a metric value's font: Streamlit's 2.25rem; 2.6rem of 21 px (Large text)
CHAR_EM = 0.6                             # a digit or letter of the value, in font sizes (digits 0.55, some wider)
GAP_PX = 24                               # between two columns, and the metric's own padding


def metrics_per_row(values: list[str], large: bool, width_px: float | None = None) -> int:
    """How many metrics go in one row so that the longest value fits its column on one line; rows kept even
    (5 that fit 4 to a row go 3 + 2, not 4 + 1)."""
    if not values:
        return 1
    width = MAIN_PX[large] if width_px is None else width_px
    need = max(len(v) for v in values) * CHAR_EM * VALUE_PX[large] + GAP_PX
    fit = max(1, min(len(values), int(width // need)))
    rows = math.ceil(len(values) / fit)
    return math.ceil(len(values) / rows)


def metric_row(items: list[tuple], where: Any = None) -> None:
    """(label, value, help) metrics side by side, in as many rows as their values need at this text size; a fourth
    item, when given, is a grey note under the value (the other case: "tiled 1.2 GB", "1.3× the floor")."""
    box = where if where is not None else st
    n = metrics_per_row([item[1] for item in items], large_text())
    for start in range(0, len(items), n):
        cols = box.columns(n)
        for col, (label, value, help_, *note) in zip(cols, items[start:start + n]):
            if note and note[0]:
                col.metric(label, value, help=help_, delta=note[0], delta_color="off", delta_arrow="off")
            else:
                col.metric(label, value, help=help_)
