"""The engine's own code as the formula: a page that teaches an algorithm shows the lines that run, read from the
function itself (`inspect.getsource`), so the text on screen can never drift from what the engine does."""
from __future__ import annotations

import inspect
import textwrap
from typing import Any, Callable

import streamlit as st


def source_lines(fn: Callable[..., Any], first: str | None = None, last: str | None = None) -> str:
    """The source of `fn`, or the part from the first line containing `first` through the next line containing
    `last` (both included), dedented. A marker that is not in the source raises ValueError: the page's excerpt
    went stale when the function changed, and a test should say so."""
    lines = inspect.getsource(fn).splitlines()
    start = 0 if first is None else next((i for i, s in enumerate(lines) if first in s), None)
    if start is None:
        raise ValueError(f"{fn.__qualname__} has no line containing {first!r}")
    end = len(lines) - 1 if last is None else next((i for i in range(start, len(lines)) if last in lines[i]), None)
    if end is None:
        raise ValueError(f"{fn.__qualname__} has no line containing {last!r} after {first!r}")
    return textwrap.dedent("\n".join(lines[start:end + 1]))


def code_expander(title: str, fn: Callable[..., Any], first: str | None = None, last: str | None = None,
                  note: str = "", where: Any = None) -> None:
    """A closed expander holding `source_lines(fn, first, last)` as Python, named by the function's module."""
    target = where if where is not None else st
    with target.expander(title, icon=":material/code:"):
        st.code(source_lines(fn, first, last), language="python")
        st.caption(f"From `{fn.__module__}.{fn.__qualname__}`, the function the engine samples with. {note}".strip())
