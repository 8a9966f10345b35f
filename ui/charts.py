"""Charts a class can read from the back of the room: one plotly look for every page (axis titles, fonts of at
least 14 px, 22 px and up with the large-text option), and the large-text switch itself (sidebar, every page).

    from ui.charts import style
    st.plotly_chart(style(fig), use_container_width=True)
"""
from __future__ import annotations

from typing import Any

import streamlit as st

LARGE_TEXT_KEY = "ui.large_text"
NORMAL_FONT_PX, LARGE_FONT_PX = 15, 22
_LARGE_CSS = """
<style>
  html, body, [data-testid="stAppViewContainer"] { font-size: 21px; }
  [data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li,
  [data-testid="stCaptionContainer"], label, .stTextInput input, .stTextArea textarea { font-size: 1.15rem !important; }
  [data-testid="stMetricValue"] { font-size: 2.6rem !important; }
  [data-testid="stMetricLabel"] p { font-size: 1.2rem !important; }
  h1 { font-size: 3rem !important; } h2 { font-size: 2.2rem !important; } h3 { font-size: 1.7rem !important; }
</style>
"""


def large_text() -> bool:
    """Whether this session asked for projector-sized text."""
    return bool(st.session_state.get(LARGE_TEXT_KEY, False))


def font_px() -> int:
    return LARGE_FONT_PX if large_text() else NORMAL_FONT_PX


def large_text_toggle() -> None:
    """Sidebar switch (remembered across pages); when on, bigger page text (CSS) and bigger chart fonts."""
    from ui.widgets import remember
    store = remember(LARGE_TEXT_KEY, False)
    st.sidebar.toggle("Large text (projector)", key=LARGE_TEXT_KEY, on_change=store,
                      help="Bigger text and chart labels for a classroom screen.")
    if large_text():
        st.markdown(_LARGE_CSS, unsafe_allow_html=True)


def style(fig: Any, *, height: int | None = None, legend_top: bool = True) -> Any:
    """The app's chart look applied to a plotly figure: readable fonts (bigger with large text), titled axes kept,
    margins that leave room for tick labels, a legend above the plot so it never covers data."""
    px = font_px()
    fig.update_layout(
        template="plotly_white",
        font=dict(size=px),
        title_font=dict(size=px + 4),
        hoverlabel=dict(font_size=px),
        margin=dict(l=10, r=10, t=60 if fig.layout.title.text else 30, b=10),
    )
    fig.update_xaxes(title_font=dict(size=px + 1), tickfont=dict(size=px), automargin=True)
    fig.update_yaxes(title_font=dict(size=px + 1), tickfont=dict(size=px), automargin=True)
    if legend_top:
        fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0,
                                      font=dict(size=px)))
    fig.update_annotations(font_size=px)
    if height is not None:
        fig.update_layout(height=int(height * (1.3 if large_text() else 1.0)))
    return fig
