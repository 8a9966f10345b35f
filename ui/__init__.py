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

APP_TITLE = "LLM inference, by hand"


def setup_page(title: str, icon: str = ":material/memory:") -> None:
    """First call of every page: browser-tab title, a wide layout, and the sidebar's large-text switch."""
    from ui.charts import large_text_toggle
    from ui.nav import leave_pages_folder_mode
    leave_pages_folder_mode()
    st.set_page_config(page_title=f"{title} · {APP_TITLE}", page_icon=icon, layout="wide")
    large_text_toggle()


__all__ = ["APP_TITLE", "setup_page", "model_picker", "model_card", "current_model", "random_choice",
           "df_with_download", "show_error", "formula_expander", "number_field", "int_field", "float_field",
           "check_number", "remember", "catch_spec_errors"]
