"""The planner's search, cached once per server: identical inputs are searched once, whoever asks. The thirty
students who open the Capacity planner on its defaults share one search; the page's "what if" table reuses the
page's own search for its "as entered" row; a rerun that changed none of the search's inputs searches nothing.

A result is a copy (`st.cache_data` returns it unpickled), so no session can change another's. At most 8 are kept
(a default search's result is about 9 MB pickled); an input that fails (a SpecError) is raised again and never
stored."""
from __future__ import annotations

import streamlit as st

from calculators.planning.planner import plan


@st.cache_data(max_entries=8, show_spinner=False)
def _cached(config, devices, wl, space, efficiency, **kw):
    return plan(config, devices, wl, space, efficiency, **kw)


def cached_plan(config, devices, wl, space, efficiency=None, **kw):
    """`planner.plan` with the same arguments, cached. The keyword arguments are passed on in name order: the cache
    keys them in the order given, and the page and its what-if table name them in different orders."""
    return _cached(config, devices, wl, space, efficiency, **dict(sorted(kw.items())))
