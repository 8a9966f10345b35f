"""Attention: the real attention pattern of the teacher's prompt, head by head, layer by layer; which query heads
share a K/V head; what each head mostly looks at; one row rebuilt from q and k (dot product, 1/√d, softmax); and
RoPE, with its relative-position property checked on the model's own q and k.

Numbers: `engine.run_with_cache` (hook_pattern, hook_scores, hook_q, hook_k of one layer), `engine.instruments.readout`
(head_summary, gqa_groups, attention_row_steps, rope_angles, rope_relative_check).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine import Model
from engine.instruments.readout import (attention_row_steps, causal_check, gqa_groups, head_summary, max_abs_difference,
                            rope_angles, rope_relative_check, window_check)
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, model_picker, setup_page, show_error
from ui.charts import WEIGHTS, figure, font_px, heatmap_size, style
from ui.attention_overview import overview_section
from ui.inside import (Prompt, all_attention, band_attention, index_field, layer_attention, piece_label, pooled,
                       session_cached, teacher_prompt)
from ui.serving import measured_run

MAX_TOKENS = 96          # tokens drawn in a heatmap (more rows cannot be read on a screen)
RELATIVE_SHIFTS = (0, 7, 50, 300)


def labels(model: Model, ids) -> list[str]:
    tok = model.tokenizer
    pieces = tok.token_strings(list(ids)) if tok is not None else [f"#{i}" for i in ids]
    return [piece_label(i, p) for i, p in enumerate(pieces)]


def heatmap(z: np.ndarray, names: list[str], title: str) -> dict:
    """Weights with token labels on both axes: as many labels as fit at the current font size, rows tall enough
    to read."""
    step, height = heatmap_size(len(names))
    return figure(
        dict(type="heatmap", z=z, x=names, y=names, colorscale=WEIGHTS, zmin=0, zmax=float(max(z.max(), 1e-9)),
             colorbar=dict(title=dict(text="weight")), hovertemplate="query %{y}<br>key %{x}<br>%{z:.3f}<extra></extra>"),
        title=title, height=height,
        xaxis=dict(title="key (the token looked at)", tickangle=-90, type="category", dtick=step),
        yaxis=dict(title="query (the token looking)", autorange="reversed", type="category", dtick=step))


def pattern_section(model: Model, names: list[str], pattern: np.ndarray, layer: int, head: int) -> None:
    T = pattern.shape[1]
    p = pattern[head][:, :T]
    st.subheader(f"1 · Layer {layer}, head {head}: who looks at whom")
    fig = heatmap(p, names, f"Attention weights, layer {layer}, head {head}")
    st.plotly_chart(style(fig, legend_top=False), width="stretch")
    chk = causal_check(p)
    st.caption(f"Each row adds up to 1 (largest deviation here: {chk['max_row_error']:.1e}). Everything above the "
               f"diagonal is exactly 0 ({chk['zeros_above']:,} of {chk['entries_above']:,} entries): a token may "
               "only look back, never at tokens that come after it. A dark first column is common in trained "
               "models: a head with nothing useful to look at parks its weight on the first token, an \"attention "
               "sink\" (Xiao et al., \"Efficient Streaming Language Models with Attention Sinks\", 2023, "
               "arXiv:2309.17453).")
    formula_expander("Attention weights", "weights = softmax(q·Kᵀ / √d + mask), one row per query token; the mask "
                     "is −∞ above the diagonal, so those weights are exactly 0 (causal attention). Captured at "
                     "`blocks.{l}.attn.hook_pattern`.\n\nSource: 003 Detail 4")


def head_grid_figure(pattern: np.ndarray, layer: int, config) -> go.Figure:
    """Every head of the layer as one mosaic heatmap (one trace draws much faster than a grid of subplots)."""
    h, T = pattern.shape[0], pattern.shape[1]
    cols = min(h, 6)
    rows = math.ceil(h / cols)
    gap = max(4, T // 4)                                                  # room for each square's title
    z = np.full((rows * (T + gap), cols * (T + gap)), np.nan, np.float32)
    kv_of = {q: kv for kv, qs in enumerate(gqa_groups(config)) for q in qs}
    notes = []
    for i in range(h):
        r, c = divmod(i, cols)
        z[r * (T + gap):r * (T + gap) + T, c * (T + gap):c * (T + gap) + T] = pattern[i][:, :T]
        notes.append(dict(x=c * (T + gap) + T / 2, y=r * (T + gap) - 0.5, text=f"head {i} · KV {kv_of[i]}",
                          showarrow=False, yanchor="bottom"))
    fig = go.Figure(go.Heatmap(z=z, colorscale=WEIGHTS, zmin=0, zmax=1, showscale=False, hoverongaps=False))
    fig.update_layout(title=f"Every head of layer {layer}",
                      annotations=notes, xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"),
                      height=int(300 * rows + 60))
    return style(fig, legend_top=False)


def gqa_section(model: Model) -> None:
    c = model.config
    groups = gqa_groups(c)
    st.markdown(f"**Grouped-query attention:** {c.num_heads} query heads share {c.num_kv_heads} K/V heads, "
                f"{c.group_size} query heads per K/V head. Heads that share a K/V head read the same keys and "
                "values but ask with their own queries, so their patterns can still differ.")
    df_with_download(pd.DataFrame({"K/V head": range(len(groups)),
                                   "query heads reading it": [", ".join(map(str, g)) for g in groups]}),
                     "gqa_groups")
    formula_expander("Which K/V head", f"query head h reads K/V head ⌊h ÷ G⌋, G = h_q ÷ h_kv = {c.num_heads} ÷ "
                     f"{c.num_kv_heads} = {c.group_size}.\n\nSource: 003 Detail 6")


def summary_figure(s: dict, layer: int) -> dict:
    heads = [f"head {i}" for i in range(len(next(iter(s.values()))))]
    bars = [dict(type="bar", name=name, x=heads, y=s[name], marker=dict(color=color))
            for name, color in zip(s, ("#f59e0b", "#10b981", "#6366f1"))]
    return style(figure(*bars, barmode="group", xaxis=dict(title=f"head of layer {layer}"),
                        yaxis=dict(title="mean attention weight", tickformat=".0%")), height=400)


def summary_section(model: Model, prompt: Prompt, pattern: np.ndarray, layer: int) -> None:
    s = head_summary(pattern)
    heads = [f"head {i}" for i in range(pattern.shape[0])]
    fig = session_cached("head_summary", (model.source, prompt.ids, layer, font_px()),
                         lambda: summary_figure(s, layer))
    st.plotly_chart(fig, width="stretch")
    df_with_download(pd.DataFrame({"head": range(len(heads)), **{k: np.round(v, 4) for k, v in s.items()}}),
                     f"head_summary_layer_{layer}")
    formula_expander("Per-head summary", "For each head, the mean over query rows t of: the weight on position 0 "
                     "(the first token), on position t − 1 (the previous token, rows t ≥ 1) and on position t "
                     "(itself) (`engine.instruments.readout.head_summary`). Many heads park most of their weight on the first "
                     "token when nothing else matters.")


def row_section(model: Model, names: list[str], acts: dict, layer: int, head: int) -> None:
    T = acts["hook_pattern"].shape[1]
    st.subheader("3 · One row, step by step")
    t = index_field("Query position", T, key="attn.query", default=T - 1,
                    help="Which token's row to rebuild from its query and the keys before it.")
    if t is None:
        return
    r = attention_row_steps(acts["hook_q"], acts["hook_k"], t, head, model.config.group_size)
    captured = acts["hook_pattern"][head, t, :t + 1]
    x = names[:t + 1]
    cols = st.columns(3)
    titles = ("q·k (dot product)", f"÷ √d (× {r['scale']:.4f})", "softmax (adds up to 1)")
    for j, key in enumerate(("dot", "scaled", "softmax")):
        fig = figure(dict(type="bar", x=x, y=r[key], marker=dict(color=("#94a3b8", "#64748b", "#2563eb")[j])),
                     title=titles[j], xaxis=dict(type="category", tickangle=-60))
        cols[j].plotly_chart(style(fig, height=400, legend_top=False, span=1 / 3), width="stretch")
    diff = max_abs_difference(r["softmax"], captured)
    st.caption(f"Rebuilt from the model's own q (head {head}) and k (K/V head {head // model.config.group_size}); "
               f"the largest difference from the weights the model used is {diff:.1e}.")
    formula_expander("Scores before and after softmax",
                     f"score_j = q_t · k_j ÷ √d, d = {model.config.head_dim} → ÷ {math.sqrt(model.config.head_dim):.2f}"
                     "; weight_j = exp(score_j) ÷ Σ exp(score). Dividing by √d keeps the scores' spread about the "
                     "same whatever the head size, so softmax does not saturate on one key.\n\nSource: 003 Detail 4")


def rope_circle_figure(c) -> go.Figure:
    d = c.head_dim
    positions = np.arange(0, 64)
    pairs = sorted({0, d // 8, d // 4, d // 2 - 1})
    ang = rope_angles(c, positions, pairs)                                  # [P, pairs]
    fig = go.Figure()
    for j, pr in enumerate(pairs):
        fig.add_scatter(x=np.cos(ang[:, j]) * (1 + 0.25 * j), y=np.sin(ang[:, j]) * (1 + 0.25 * j),
                        mode="lines+markers", name=f"pair {pr}", marker_size=5)
    fig.update_layout(title="Positions 0 to 63, one ring per pair",
                      xaxis=dict(title="cos(angle)", scaleanchor="y"), yaxis_title="sin(angle)", height=480)
    return style(fig, height=480)


def rope_section(model: Model, acts: dict, head: int) -> None:
    st.subheader("4 · RoPE: position as a rotation")
    c = model.config
    d = c.head_dim
    st.markdown(f"Before q and k meet, each of their {d // 2} pairs of numbers is turned by an angle proportional "
                "to the token's position. Fast pairs spin quickly, slow pairs barely move; the score of two tokens "
                "then depends on how far apart they are, not on where they are.")
    circle = session_cached("rope_circle", (model.source, font_px()), lambda: rope_circle_figure(c))
    st.plotly_chart(circle, width="stretch")
    st.caption(f"How to read it: each ring is one pair of numbers of q (or k), one dot per position 0 to 63 at the "
               "angle that position turns it by. Pair 0 (the inner ring) turns a full radian per position, so 64 "
               f"positions go round the circle many times; pair {d // 2 - 1} (the outer ring) turns so slowly that "
               "its dots hardly leave the start. The rings have different sizes only to keep them apart: a rotation "
               "never changes a vector's length.")
    T = acts["hook_q"].shape[0]
    m, n = T - 1, max(T - 4, 0)
    q = acts["hook_q"][m, head]
    k = acts["hook_k"][n, head // c.group_size]
    rows = rope_relative_check(model, q, k, m, n, RELATIVE_SHIFTS)
    df = pd.DataFrame(rows)
    spread = max_abs_difference(df["q·k"].to_numpy(), df["q·k"].iloc[0])
    st.markdown(f"**Checked on this model:** the query of token {m} and the key of token {n} (head {head}), moved "
                f"together to other positions. The score changes by at most {spread:.1e} (float32 rounding):")
    df_with_download(df.round(6), "rope_relative_check")
    formula_expander("RoPE", "pair i of a vector at position p is turned by the angle p · θ^(−2i/d) "
                     f"(θ = {c.rope_theta:g}, d = {d}). Turning q by angle a and k by b gives a dot product that "
                     "depends only on a − b, hence only on the distance between the tokens "
                     "(`engine.instruments.readout.rope_relative_check`).\n\nSource: 003 Detail 7")


def band_section(model: Model, prompt: Prompt, pattern: np.ndarray, layer: int, head: int) -> None:
    """A sliding-window layer: each query sees itself and the W - 1 keys before it, a band along the diagonal."""
    W = model.config.layer_window(layer)
    st.subheader(f"Layer {layer} is a sliding-window layer: W = {W}")
    kinds = model.config.layer_types
    st.markdown(f"In {model.config.name}, {kinds.count('sliding_attention')} of the {len(kinds)} layers, this one "
                f"included, let a token look back at most {W - 1} tokens: keys further back get exactly 0 weight, "
                f"and the layer's KV cache keeps only the last {W} positions. The other "
                f"{kinds.count('full_attention')} (global) layers see everything.")
    length = W + W // 2
    r = measured_run("attention band", (model.source, tuple(prompt.ids), layer, head, length),
                     lambda: band_attention(model, prompt, layer, head, length), model=model, tokens=length,
                     sequences=1, button=f"Show the band on {length:,} tokens", button_key="attn.band",
                     spinner=f"Running {length:,} tokens …",
                     hint=f"Press the button to run your prompt repeated to {length:,} tokens (past the window) "
                          "and see the band.")
    if r is None:
        return
    chk = window_check(r, W)
    z = pooled(r, 96)
    step = -(-length // 96)
    fig = figure(dict(type="heatmap", z=z, x0=0, dx=step, y0=0, dy=step, colorscale=WEIGHTS, zmin=0,
                      zmax=float(max(z.max(), 1e-9)), colorbar=dict(title=dict(text="weight"))),
                 title=f"Layer {layer}, head {head}: {length:,} tokens (largest weight in each {step}×{step} cell)",
                 height=640, xaxis=dict(title="key position"), yaxis=dict(title="query position", autorange="reversed"),
                 shapes=[dict(type="line", x0=0, y0=W, x1=length - W, y1=length, line=dict(dash="dot", width=3)),
                         dict(type="line", x0=0, y0=0, x1=length, y1=length, line=dict(dash="dot", width=3))])
    st.plotly_chart(style(fig, legend_top=False), width="stretch")
    st.caption(f"Between the two dotted lines: the band of the last {W} positions. Outside it (further back than "
               f"{W - 1} tokens): {chk['zeros_outside']:,} of {chk['entries_outside']:,} weights are exactly 0.")


def main() -> None:
    """The whole model's attention at once under the title (a projector's first screen at 1366×768); the intro,
    the prompt box and the layer / head fields under it, then each view of the chosen head."""
    setup_page("Attention", icon=":material/visibility:")
    st.title("Attention")
    top = st.container()
    st.markdown("In every layer, each token builds a query and compares it with the keys of all tokens up to "
                "itself. The comparison becomes a set of weights that add up to 1, and the token takes that mix of "
                "the others' values. Below are those weights as the model computed them on your prompt.")
    model = model_picker()
    prompt = teacher_prompt(model)
    if model is None or prompt is None:
        return
    c = model.config
    cols = st.columns(2)
    layer = index_field("Layer", c.num_layers, key="attn.layer", where=cols[0],
                        help=f"0 to {c.num_layers - 1}")
    head = index_field("Head", c.num_heads, key="attn.head", where=cols[1], help=f"0 to {c.num_heads - 1}")
    if layer is None or head is None:
        return
    if len(prompt.ids) > MAX_TOKENS:
        st.info(f"The prompt has {len(prompt.ids):,} tokens; the maps show its first {MAX_TOKENS}.")
    try:
        every = all_attention(model, prompt, MAX_TOKENS)                    # [L, h, T, T]: one run, every view
        acts = layer_attention(model, prompt, layer, MAX_TOKENS)            # q, k, scores of the chosen layer
    except SpecError as e:
        show_error(e)
        return
    names = labels(model, prompt.ids[:MAX_TOKENS])
    with top:
        overview_section(every, names, layer_key="attn.layer", head_key="attn.head")
    pattern = every[layer]                                                  # [h, T, T]
    pattern_section(model, names, pattern, layer, head)
    if c.layer_window(layer) is not None:
        band_section(model, prompt, pattern, layer, head)
    st.subheader("2 · Every head of the layer")
    grid = session_cached("head_grid", (model.source, prompt.ids, layer, font_px()),
                          lambda: head_grid_figure(pattern, layer, c))
    st.plotly_chart(grid, width="stretch")
    st.caption("In each square, as above: rows = the token looking, columns = the token looked at. "
               "\"KV k\" = the K/V head that query head reads.")
    gqa_section(model)
    summary_section(model, prompt, pattern, layer)
    row_section(model, names, acts, layer, head)
    rope_section(model, acts, head)


main()
