"""Small Streamlit helpers every page uses: tables with a CSV download, errors without tracebacks, the formula
behind a number, number inputs that validate instead of raising, and widget values that survive page switches.

No formula or physics lives here: these only wire widgets to functions in `engine/` and `calculators/`.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np
import pandas as pd
import streamlit as st

from specs.model_config import SpecError
from ui.headings import human_heading
from specs.sources import readable_source


# ============================================================================================ tables
def df_with_download(df: pd.DataFrame, name: str, *, hide_index: bool = True, height: int | str = "auto",
                     column_config: dict | None = None, show: dict[str, str | None] | list[str] | None = None,
                     drawn: pd.DataFrame | None = None) -> None:
    """Show `df` as a table with a "Download CSV" button under it. Every table in the app goes through here.

    `name` names the file (`<name>.csv`) and keys the button, so it must be unique on a page.
    `show`: the columns drawn, in order, for a table too wide for a projector's 1366 px; a dict also gives each a
    short heading (None keeps the name), most important first: only the leading ones that fit 1366 px are drawn
    (`fitting_columns`). Without `show` every column is drawn (a table wider than the page scrolls: the browser
    walk reports it, since only its page knows which columns matter). The CSV keeps every column under its own name, and a caption under the table names the
    ones only the CSV has. Names `df` lacks are skipped. `drawn`: the same table as the page writes it (a table whose
    rows are different quantities, each written its own way), shown instead of `df`; the CSV keeps `df`.
    """
    config = readable_numbers(df, column_config)
    shown = df if drawn is None else drawn
    given = (show if isinstance(show, dict) else {}) or {}
    labels = {c: given.get(c) or (config.get(c) or {}).get("label") or human_heading(c) for c in df.columns}
    for c, label in labels.items():                      # identifiers read as words; the CSV keeps them
        if label != str(c):
            config[c] = {**(config.get(c) or {}), "label": label}
    order = None
    if show is not None:                  # the page ranked its columns: the leading ones that fit are drawn
        order = fitting_columns(df, [c for c in show if c in df.columns], labels)
    st.dataframe(shown, hide_index=hide_index, height=height, column_config=config, column_order=order,
                 placeholder=MISSING)                  # a missing value (a device without a price): "—", not "None"
    if order is not None and (rest := [c for c in df.columns if c not in order]):
        st.caption("Also in the CSV: " + ", ".join(given.get(c) or human_heading(c) for c in rest) + ".")
    slug = _slug(name)
    # deferred: the CSV is written when someone clicks, not on every run (the Class page's live tables were
    # written out every refresh: 14% of the app's own CPU time during a 30-student class, py-spy --gil)
    st.download_button("Download CSV", lambda: df.to_csv(index=False).encode("utf-8"), file_name=f"{slug}.csv",
                       mime="text/csv", key=f"download.{slug}", on_click="ignore", icon=":material/download:")


def number_format(values: pd.Series) -> str | None:
    """A display format for one numeric column that reads from the back row: thousands separators ("1,520,640",
    not "1520640") and the decimals that give its smallest nonzero value three significant digits ("64,936", not
    "64935.998"; "2.35"; "0.0456"). None (Streamlit's own) where that takes more than 4 decimals (a value below
    0.001: fixed decimals would round it away) and for columns that are not numbers. The CSV keeps every digit."""
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        return None
    if pd.api.types.is_integer_dtype(values):
        return "%,d"
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    if np.all(v == np.round(v)) and np.max(np.abs(v)) < 2 ** 53:
        return "%,.0f"
    if not np.any(v != 0):
        return "%,.0f"
    decimals = max(0, 2 - math.floor(math.log10(float(np.min(np.abs(v[v != 0]))))))
    return None if decimals > 4 else f"%,.{decimals}f"


LARGE_TEXT_KEY = "ui.large_text"


def large_text() -> bool:
    """Whether this session asked for projector-sized text (the sidebar's switch, `ui.charts.large_text_toggle`)."""
    return bool(st.session_state.get(LARGE_TEXT_KEY, False))


# (page px, px per character, cell padding px) at 1366×768: the lesson column is ~970 px wide, ~1,020 with Large
# text (ui.charts' margins); table text is ~7.5 px a character, ~10.5 with Large text.
TABLE_FIT = {False: (950, 7.5, 18), True: (1000, 10.5, 20)}
CELL_MAX_CHARS = 40


def fitting_columns(df: pd.DataFrame, order: list, labels: dict) -> list:
    """The leading columns of `order` whose estimated widths fit a projector's page (`TABLE_FIT`, normal or Large
    text): a column's width is taken as its longest heading or value (up to 40 characters) in characters, times
    the text size, plus the cell's padding. At least two columns."""
    page_px, char_px, pad_px = TABLE_FIT[large_text()]
    out, used = [], 0.0
    for c in order:
        head = df[c].head(50)
        texts = [f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
                 for v in head.tolist()]
        w = pad_px + char_px * min(CELL_MAX_CHARS, max([len(str(labels.get(c) or c)), *map(len, texts)]))
        if len(out) >= 2 and used + w > page_px:
            break
        out.append(c)
        used += w
    return out


MISSING = "—"                   # what a table shows for a missing value


def readable_numbers(df: pd.DataFrame, column_config: dict | None = None) -> dict:
    """`column_config` with a `number_format` for every numeric column it does not configure itself."""
    out = dict(column_config or {})
    for col in df.columns:
        given = out.get(col)
        number = given.get("type_config", {}) if isinstance(given, dict) else {}
        if given is not None and not re.fullmatch(r"%\.\d+g", str(number.get("format") or "")):
            continue
        fmt = number_format(df[col])           # also for "%.4g", which writes 4005 and 1699 without separators
        if fmt is not None:
            out[col] = {**given, "type_config": {**number, "format": fmt}} if given else \
                st.column_config.NumberColumn(format=fmt)
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name.strip()).strip("_") or "table"


# ============================================================================================ messages
def show_error(exc: BaseException | str, where: Any = None) -> None:
    """A problem the user can fix, as one red box: the message only, never a traceback.

    `where`: a container (e.g. `st.sidebar`); the main area by default.
    """
    target = where if where is not None else st
    target.error(str(exc) if str(exc) else type(exc).__name__, icon=":material/error:")


def formula_expander(title: str, formula_text: str, where: Any = None) -> None:
    """The formula behind a number, one click away: a closed expander whose body is markdown (LaTeX allowed).
    Short reference codes in the text ("003 Detail 18") are shown as titles and sections a reader can open."""
    target = where if where is not None else st
    with target.expander(title, icon=":material/functions:"):
        st.markdown(readable_source(formula_text))


# ============================================================================================ numbers
def number_field(label: str, value: float, min_value: float, max_value: float, *, key: str,
                 integer: bool = False, step: float | None = None, help: str | None = None,
                 where: Any = None, remember_value: bool = True) -> float | int | None:
    """A number typed as text, read strictly: returns the value, or shows st.error saying what was wrong and returns
    None ("abc" is not a number, "2.5" is not whole, "1e400" is not finite, 0 is out of range). Callers skip their
    work when any field returned None; the text the user typed stays in the box.

    A text box rather than `st.number_input`, which silently turns "abc" into 0, "1e9" into 1 and "2.5" into 2
    before the page sees it. `step` is accepted for compatibility (a text box has no arrows).
    """
    target = where if where is not None else st
    rng = f"Allowed: {_fmt(min_value, integer)} to {_fmt(max_value, integer)}."
    kwargs: dict[str, Any] = dict(key=key, help=f"{help} {rng}" if help else rng)
    default_text = number_text(value, integer)
    ss = st.session_state
    if remember_value:
        kwargs["on_change"] = remember(key, default_text)
    elif key not in ss:
        kwargs["value"] = default_text
    if key in ss and not isinstance(ss[key], str):       # a number preset by a test or older session state
        ss[key] = number_text(ss[key], integer)
    text = target.text_input(label, **kwargs)
    v, problem = parse_number(label, text, integer)
    if problem:
        show_error(problem, where)
        return None
    return check_number(label, v, min_value, max_value, integer=integer, where=where)


def int_field(label: str, value: int, min_value: int, max_value: int, *, key: str, **kw) -> int | None:
    """`number_field` for whole numbers (token counts, seeds, batch sizes)."""
    return number_field(label, value, min_value, max_value, key=key, integer=True, **kw)


def float_field(label: str, value: float, min_value: float, max_value: float, *, key: str, **kw) -> float | None:
    """`number_field` for real numbers (temperature, probabilities, bandwidths)."""
    return number_field(label, value, min_value, max_value, key=key, integer=False, **kw)


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}([,_ ]\d{3})+(\.\d*)?$")


def number_text(v: Any, integer: bool = False) -> str:
    """How a number is written in a field: 64, 0.7, 2048, 1e-05."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if integer or (isinstance(v, int)) or (math.isfinite(v) and float(v).is_integer() and abs(v) < 1e15):
        return str(int(v)) if math.isfinite(v) else repr(v)
    return repr(float(v))


def parse_number(label: str, text: Any, integer: bool = False) -> tuple[float | int | None, str | None]:
    """(value, None) for text that is a number, else (None, what is wrong). Thousands separators ("2,048") are
    allowed; a whole-number field rejects fractions ("2.5") instead of rounding them."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = number_text(text, integer)
    raw = "" if text is None else str(text).strip()
    if not raw:
        return None, f"{label}: the box is empty; type a number."
    clean = re.sub(r"[,_ ]", "", raw) if _THOUSANDS.match(raw) else raw
    try:
        v = float(clean)
    except ValueError:
        return None, f"{label}: {raw!r} is not a number."
    if math.isnan(v):
        return None, f"{label}: {raw!r} is not a number."
    if not math.isfinite(v):
        return None, f"{label}: {raw!r} is too large to be a finite number."
    if integer:
        if not v.is_integer():
            return None, f"{label} must be a whole number; {raw!r} has a fractional part."
        if re.fullmatch(r"[+-]?\d+", clean):
            return int(clean), None                          # exact, even beyond 2**53
        return int(v), None
    return v, None


def check_number(label: str, v: Any, min_value: float, max_value: float, *, integer: bool = False,
                 where: Any = None) -> float | int | None:
    """`v` if it is a finite number in range (and whole when `integer`), else an st.error and None."""
    problem = None
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        problem = f"{label}: enter a number."
    elif not math.isfinite(v):
        problem = f"{label} must be a finite number, got {v}."
    elif integer and not isinstance(v, int) and not float(v).is_integer():
        problem = f"{label} must be a whole number, got {v}."
    elif not min_value <= v <= max_value:
        problem = (f"{label} must be between {_fmt(min_value, integer)} and {_fmt(max_value, integer)}, "
                   f"got {_fmt(v, integer)}.")
    if problem:
        show_error(problem, where)
        return None
    return int(v) if integer else float(v)


def _fmt(x: float, integer: bool) -> str:
    """A bound or a typed value for a message: whole numbers with thousands separators up to 10¹⁵, anything larger
    in three significant figures (1e99 typed into a token count reads "1e+99", not 100 digits)."""
    if not math.isfinite(x) or abs(x) >= 1e15:
        return f"{x:.3g}"
    return f"{int(x):,}" if integer else f"{x:g}"


# ============================================================================================ state
_SHADOW = "_remember."


def remember(key: str, default: Any = None) -> Callable[[], None]:
    """Keep widget `key`'s value across page switches (Streamlit drops the state of widgets a page does not draw).

    Call it just before creating the widget with `key=key` and pass the returned function as `on_change`; do not
    also pass `value=`/`index=` (the default comes from here). Tests may preset `st.session_state[key]` before the
    first run.
    """
    ss = st.session_state
    shadow = _SHADOW + key
    if shadow in ss:
        ss[key] = ss[shadow]
    elif key in ss and ss[key] is not None:                  # preset before the first run (tests, links)
        ss[shadow] = ss[key]
    elif default is not None:                                # first sight: this default now holds on every page,
        ss[key] = ss[shadow] = default                       # so pages with other defaults do not flip it

    def store() -> None:
        ss[shadow] = ss[key]

    return store


def remembered_value(key: str, default: Any = None) -> Any:
    """A remembered widget's value without touching the widget (safe after it is drawn, and on a page that does not
    draw it): the value kept across pages, else the widget's own, else `default`."""
    ss = st.session_state
    return ss.get(_SHADOW + key, ss.get(key, default))


def set_remembered(key: str, value: Any) -> None:
    """Change a remembered widget's value from code (e.g. a Next button's callback), here and on every page."""
    st.session_state[key] = value
    st.session_state[_SHADOW + key] = value


def once_per_input(state_key: str, inputs: Any, compute: Callable[[], Any], message: str) -> Any:
    """`compute()` (a fit that takes seconds) once per `inputs`, kept in the session under `state_key`, with a
    spinner saying `message`; a `SpecError` becomes an st.error and the call returns None."""
    cached = st.session_state.get(state_key)
    if cached is None or cached[0] != inputs:
        try:
            with st.spinner(message):
                cached = (inputs, compute())
        except SpecError as e:
            show_error(e)
            return None
        st.session_state[state_key] = cached
    return cached[1]


def catch_spec_errors(fn: Callable[..., Any], *args: Any, where: Any = None, **kwargs: Any) -> Any:
    """Call `fn`; a `SpecError` (ModelError included) becomes an st.error and the call returns None."""
    try:
        return fn(*args, **kwargs)
    except SpecError as e:
        show_error(e, where)
        return None
