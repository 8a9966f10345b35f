"""Shared page helpers: the sidebar model picker, tables with CSV download, errors, formula expanders, validated
number inputs. Pages and ui/ only wire widgets to `engine/` (the experiment) and `calculators/` (the theory).

    import streamlit as st
    from ui import setup_page, model_picker, df_with_download, formula_expander, int_field, show_error

    setup_page("KV cache")
    model = model_picker()                  # sidebar; engine.Model or None
"""
from __future__ import annotations

import streamlit as st

from ui.model_picker import current_model, model_card, model_picker, random_choice
from ui.widgets import (catch_spec_errors, check_number, df_with_download, float_field, formula_expander, int_field,
                        number_field, remember, show_error)

APP_TITLE = "Inference Lab"
# The browser tab's icon. A ":material/...:" page icon would make the browser fetch an SVG from fonts.gstatic.com
# for every page (Streamlit draws favicons from Google's font host; icons inside the page use its bundled font), and
# a classroom without internet would log a failed request per page. None keeps Streamlit's own favicon, served by
# the app itself (an emoji would be drawn by the browser, but shows as a box where no emoji font is installed).
FAVICON = None


def favicon(icon: str | None) -> str | None:
    """The tab icon for a page asking for `icon`: an image or emoji as given, a Material icon replaced by FAVICON."""
    return FAVICON if icon is None or icon.startswith(":material") else icon


def setup_page(title: str, icon: str | None = FAVICON) -> None:
    """First call of every page: browser-tab title and icon (nothing fetched from another host), a wide layout, and
    the sidebar's large-text switch."""
    from ui.charts import large_text_toggle
    from ui.nav import leave_pages_folder_mode
    leave_pages_folder_mode()
    st.set_page_config(page_title=f"{title} · {APP_TITLE}", page_icon=favicon(icon), layout="wide")
    large_text_toggle()


__all__ = ["APP_TITLE", "setup_page", "model_picker", "model_card", "current_model", "random_choice",
           "df_with_download", "show_error", "formula_expander", "number_field", "int_field", "float_field",
           "check_number", "remember", "catch_spec_errors"]
