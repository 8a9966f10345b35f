"""The whole model at once (like bertviz's model view): every layer × every head of one engine run, each cell a
heat-strip of one query token's attention row, so 30 layers × 9 heads fit a 1366×768 screen; choosing a cell opens
that layer and head in the Attention page's single-head view.

    patterns = all_attention(model, prompt, MAX_TOKENS)          # ui.inside: [L, h, T, T], one run, this session
    overview_section(patterns, names, layer_key="attn.layer", head_key="attn.head")
"""
from __future__ import annotations

import numpy as np
import streamlit as st

from ui.charts import WEIGHTS, figure, font_px, style
from ui.inside import index_field
from ui.widgets import set_remembered

QUERY_KEY = "attn.overview.query"
CELL_KEY = "attn.overview.cell"
GAP = 1                                  # empty columns between two heads' strips


def overview_strips(patterns: np.ndarray, query: int) -> np.ndarray:
    """[L, h, T, T] weights -> an [L, h · (query + 1 + GAP)] picture: row l holds, head after head, the weights
    of token `query` on tokens 0..query in layer l (NaN in the gaps)."""
    L, h = patterns.shape[:2]
    width = query + 1
    z = np.full((L, h, width + GAP), np.nan, np.float32)
    z[:, :, :width] = patterns[:, :, query, :width]
    return z.reshape(L, h * (width + GAP))


def cell_columns(head: int, query: int) -> slice:
    """The columns of head `head`'s strip in `overview_strips`."""
    return slice(head * (query + 1 + GAP), head * (query + 1 + GAP) + query + 1)


def overview_figure(patterns: np.ndarray, names: list[str], query: int) -> dict:
    L, h = patterns.shape[:2]
    z = overview_strips(patterns, query)
    width = query + 1
    hover = np.full(z.shape, "", dtype=object)
    for hd in range(h):
        for j in range(width):
            col = cell_columns(hd, query).start + j
            hover[:, col] = [f"layer {li}, head {hd}<br>{names[query]} → {names[j]}<br>weight "
                             f"{patterns[li, hd, query, j]:.3f}" for li in range(L)]
    ticks = [cell_columns(hd, query).start + query / 2 for hd in range(h)]
    row_px = max(14, font_px() + 2)
    return style(figure(
        dict(type="heatmap", z=z, text=hover, hoverinfo="text", colorscale=WEIGHTS, zmin=0, zmax=1, xgap=0, ygap=2,
             hoverongaps=False, colorbar=dict(title=dict(text="weight"))),
        title=f"Every layer × head: where {names[query]} looks (each strip: tokens 0 to {query}, left to right)",
        xaxis=dict(title="head (each strip: the tokens looked at)", tickvals=ticks,
                   ticktext=[str(hd) for hd in range(h)], showgrid=False, zeroline=False),
        yaxis=dict(title="layer", autorange="reversed", dtick=max(1, -(-L * row_px // 560)), showgrid=False)),
        height=min(760, 180 + row_px * L), legend_top=False)


def _open_cell(layer_key: str, head_key: str) -> None:
    """The cell chosen: its layer and head into the single-head view's fields (here and on every page)."""
    picked = st.session_state.get(CELL_KEY)
    if picked:
        layer, head = picked
        set_remembered(layer_key, str(layer))
        set_remembered(head_key, str(head))


def overview_section(patterns: np.ndarray, names: list[str], *, layer_key: str, head_key: str) -> None:
    L, h, T = patterns.shape[:3]
    st.subheader("0 · The whole model at once")
    st.markdown(f"All {L} layers × {h} heads of the same run as the views below. Each small strip is one head's "
                "attention row for the token you pick: dark = much weight on that token. Pick a cell to open it "
                "below.")
    cols = st.columns([1, 2])
    query = index_field("Token looking (its row in every head)", T, key=QUERY_KEY, default=T - 1, where=cols[0],
                        help=f"0 to {T - 1}: position of the token whose weights each strip shows")
    cells = [(li, hd) for li in range(L) for hd in range(h)]
    cols[1].selectbox("Open a cell in the single-head view", cells, index=None, key=CELL_KEY,
                      format_func=lambda c: f"layer {c[0]}, head {c[1]}", placeholder="layer …, head …",
                      on_change=_open_cell, args=(layer_key, head_key))
    if query is None:
        return
    st.plotly_chart(overview_figure(patterns, names, query), width="stretch")
    st.caption("Hover a strip for its token → token weight. Strips of one row come from one layer; the same "
               "column of every row is the same head number in each layer.")
