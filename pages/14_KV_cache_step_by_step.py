"""KV cache, step by step: the teacher's run replayed one token at a time. At each step, the K and V rows appended
in every layer, the cache's shape and bytes from the run's record next to the calculators' prediction, what Q, K
and V each do, and the same model as MHA or MQA.

Numbers: `engine.record_generation` (per step: cache_tokens, kv_bytes_per_layer, k_new/v_new, attention rows),
`calculators.sizing.kv_cache.kv_cache_bytes` (the prediction), `calculators.sizing.kv_counterfactual` (MHA/MQA),
`engine.instruments.readout.kv_cache_shape`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes
from calculators.sizing.kv_counterfactual import kv_variant_rows
from calculators.units import MB, fmt_bytes
from engine import Model
from engine.instruments.readout import kv_cache_shape, kv_rows_read
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, model_picker, setup_page, show_error
from ui.kv_layers import show_kv_by_layer_kind
from ui.charts import DIVERGING, figure, style
from ui.inside import (index_field, kv_bytes_after, run_settings, step_texts, stepper, teacher_prompt,
                       teacher_run)
from ui.predict import prediction_box

ENGINE_KV_DTYPE = "fp32"          # the engine keeps K and V in float32
PREDICT_TOKENS = 100              # the question: KV cache after this many tokens


def growth_chart(model: Model, rec, step: int) -> None:
    tokens = [s.cache_tokens for s in rec.steps]
    x = list(range(len(tokens)))
    measured = [s.kv_bytes for s in rec.steps]
    predicted = [kv_cache_bytes(model.config, t, kv_dtype=ENGINE_KV_DTYPE) for t in tokens]
    fig = figure(dict(type="scatter", x=x, y=predicted, name="calculators' prediction", mode="lines",
                      line=dict(width=8, color="#cbd5e1")),
                 dict(type="scatter", x=x, y=measured, name="engine's record", mode="lines+markers",
                      line=dict(color="#2563eb")),
                 shapes=[dict(type="line", x0=step, x1=step, y0=0, y1=1, yref="paper",
                              line=dict(dash="dot", color="#f59e0b"))],
                 xaxis=dict(title="step (0 = the prefill)"), yaxis=dict(title="KV cache (bytes)"))
    st.plotly_chart(style(fig, height=380), width="stretch")


def every_layer_chart(model: Model, step_rec) -> None:
    """The new K row of every layer at this step, one line of the map per layer: each layer appends its own."""
    if len(step_rec.k_new) < model.config.num_layers:
        return
    z = np.stack([step_rec.k_new[li][:, -1, :].reshape(-1) for li in range(model.config.num_layers)])  # [L, h_kv·d]
    fig = figure(dict(type="heatmap", z=z, colorscale=DIVERGING, zmid=0, showscale=False),
                 title="New K row, every layer",
                 xaxis=dict(title=f"K/V head × dimension ({z.shape[1]} numbers)"),
                 yaxis=dict(title="layer", autorange="reversed"))
    st.plotly_chart(style(fig, height=160 + 12 * z.shape[0], legend_top=False), width="stretch")
    st.caption("One line per layer: at this step every layer appended its own K row (and V row) for the token.")


def new_rows_chart(model: Model, step_rec, layer: int) -> None:
    """The K and V rows this step appended to one layer: [h_kv, T_new, d], shown for the last new token."""
    k, v = step_rec.k_new.get(layer), step_rec.v_new.get(layer)
    if k is None or v is None:
        st.info("This run did not keep the new K/V rows (the prompt is long); shorten it to see them.")
        return
    z = np.concatenate([k[:, -1, :], v[:, -1, :]], axis=0)                   # [2·h_kv, d]
    h_kv = k.shape[0]
    names = [f"K head {i}" for i in range(h_kv)] + [f"V head {i}" for i in range(h_kv)]
    fig = figure(dict(type="heatmap", z=z, y=names, colorscale=DIVERGING, zmid=0, colorbar=dict(title=dict(text="value"))),
                 title=f"Layer {layer}: new K and V rows",
                 xaxis=dict(title="dimension"), yaxis=dict(autorange="reversed"), height=120 + 40 * len(names))
    st.plotly_chart(style(fig, legend_top=False), width="stretch")
    if k.shape[1] > 1:
        st.caption(f"Step 0 is the prefill: it appended {k.shape[1]} rows at once (one per prompt token) to every "
                   "layer; the map shows the last of them.")


def qkv_section(model: Model, rec, step: int, layer: int, texts: list[str]) -> None:
    st.subheader("What Q, K and V each do")
    s = rec.steps[step]
    st.markdown(
        f"- **Q** (query): made from the newest token only, used once in this step to score the cached keys, then "
        f"thrown away. Nothing to cache.\n"
        f"- **K** (key) and **V** (value): one new row per layer is appended, and every later step reads the whole "
        f"cache again: at this step {s.cache_tokens:,} rows of K and of V in each of {model.config.num_layers} "
        f"layers.")
    row = s.attention.get((layer, 0)) if s.attention else None
    if row is not None:
        fig = figure(dict(type="bar", x=[str(i) for i in range(len(row))], y=row, marker=dict(color="#6366f1")),
                     title=f"Layer {layer}, head 0: weights over the cache",
                     xaxis=dict(title="cached position", type="category", nticks=30),
                     yaxis=dict(title="attention weight"))
        st.plotly_chart(style(fig, height=330, legend_top=False), width="stretch")
        st.caption(f"The query of the token that produced `{texts[step]}` scoring every cached key: used once, "
                   "then discarded.")
    reads = kv_rows_read(rec)
    x = list(range(len(reads["written"])))
    fig = figure(dict(type="bar", x=x, y=reads["written"], name="K/V rows written (per layer)",
                      marker=dict(color="#10b981")),
                 dict(type="bar", x=x, y=reads["read"], name="K/V rows read (per layer)", marker=dict(color="#94a3b8")),
                 barmode="group", xaxis=dict(title="step"), yaxis=dict(title="rows of K and of V, per layer"))
    st.plotly_chart(style(fig, height=340), width="stretch")
    st.caption("Written once, read at every later step: that re-reading is what makes long contexts expensive.")


def counterfactual_section(model: Model, tokens: int) -> None:
    st.subheader("The same model as MHA or MQA")
    rows = kv_variant_rows(model.config, tokens, ENGINE_KV_DTYPE)
    df = pd.DataFrame(rows)
    fig = figure(dict(type="bar", x=list(df["variant"]), y=list(df["cache_bytes"]),
                      text=[fmt_bytes(b) for b in df["cache_bytes"]], textposition="outside",
                      marker=dict(color=["#f87171", "#2563eb", "#10b981"][:len(df)])),
                 xaxis=dict(title="attention variant"), yaxis=dict(title=f"KV cache at {tokens:,} tokens (bytes)"))
    st.plotly_chart(style(fig, height=360, legend_top=False), width="stretch")
    df_with_download(df, "kv_variants")
    c = model.config
    formula_expander("MHA, GQA, MQA", f"bytes per token = 2 × L × h_kv × d × 4 (float32) with L = {c.num_layers}, "
                     f"d = {c.head_dim}; MHA: h_kv = h_q = {c.num_heads}; this model: h_kv = {c.num_kv_heads}; "
                     "MQA: h_kv = 1 (`calculators.sizing.kv_counterfactual`). Only the cache changes; the weights of the "
                     "K and V projections shrink too, but much less.\n\nSource: 003 Details 6 and 10")


def main() -> None:
    """Back / Next, the step's numbers and the cache's growth first (a projector's first screen at 1366×768); the
    intro, the prediction question, the prompt and the run settings under them."""
    setup_page("KV cache, step by step", icon=":material/stacks:")
    st.title("KV cache, step by step")
    top = st.container()
    st.markdown("Each new token needs the keys and values of every token before it. Rather than recompute them, "
                "the model keeps them: one new row per layer per token, appended and never changed. Step through "
                "your run and watch that store grow, then compare it with what the formula predicts.")
    slot = prediction_box("kv.mb_100")
    model = model_picker()
    prompt = teacher_prompt(model)
    if model is None or prompt is None:
        return
    if slot.revealed:
        slot.compare(formula=(kv_cache_bytes(model.config, PREDICT_TOKENS, kv_dtype=ENGINE_KV_DTYPE) / MB,
                              f"kv_cache_bytes({model.config.name}, {PREDICT_TOKENS} tokens, float32)"),
                     measured=(kv_bytes_after(model, prompt, PREDICT_TOKENS) / MB,
                               f"the engine's cache after a forward pass over {PREDICT_TOKENS} tokens"))
    settings = run_settings(model)
    if settings is None:
        return
    try:
        with top, st.spinner("Generating and recording every step …"):
            rec = teacher_run(model, prompt, *settings)
    except SpecError as e:
        show_error(e, top)
        return
    texts = step_texts(model, rec)
    c = model.config
    with top:
        step = stepper("Step", len(rec.steps), key="kv.step")
        if step is None:
            return
        s = rec.steps[step]
        predicted = kv_cache_bytes(c, s.cache_tokens, kv_dtype=ENGINE_KV_DTYPE)
        cols = st.columns(4)
        cols[0].metric("Token", texts[step], help=f"id {s.token_id}, p = {s.prob:.1%}")
        cols[1].metric("Tokens in the cache", f"{s.cache_tokens:,}")
        cols[2].metric("KV cache, recorded", fmt_bytes(s.kv_bytes), help=f"{s.kv_bytes:,} bytes")
        cols[3].metric("Prediction", fmt_bytes(predicted), help=f"{predicted:,.0f} bytes",
                       delta="equal to the byte" if predicted == s.kv_bytes else f"{s.kv_bytes - predicted:+,.0f} B",
                       delta_color="off", delta_arrow="off")
        growth_chart(model, rec, step)
    st.markdown("**The reply, token by token:** " + " ".join(f"`{t}`" for t in texts))
    shape = kv_cache_shape(c, s.cache_tokens)
    layers, kv, heads, tokens, dim = shape
    st.markdown(f"Cache shape: **{layers} layers × {kv} (K and V) × {heads} KV heads × {tokens:,} tokens × {dim} "
                "dimensions**; "
                f"{kv_bytes_per_token(c, ENGINE_KV_DTYPE):,.0f} bytes per token (all layers); " +
                (f"{s.kv_bytes_per_layer[0]:,} bytes in each layer now." if len(set(s.kv_bytes_per_layer)) == 1 else
                 f"{min(s.kv_bytes_per_layer):,} bytes in each sliding-window layer and {max(s.kv_bytes_per_layer):,} "
                 "in each full layer now (table below)."))
    hybrid = bool(c.sliding_window and c.layer_types and "sliding_attention" in c.layer_types)
    if hybrid:
        n_local = c.layer_types.count("sliding_attention")
        formula_expander("KV cache bytes", f"bytes = 2 × h_kv × d × 4 × (L_full × tokens + L_local × min(tokens, W)) "
                         f"= 2 × {c.num_kv_heads} × {c.head_dim} × 4 × ({c.num_layers - n_local} × "
                         f"{s.cache_tokens:,} + {n_local} × min({s.cache_tokens:,}, {c.sliding_window})) = "
                         f"{predicted:,.0f} (`calculators.sizing.kv_cache.kv_cache_bytes`, float32 as the engine "
                         f"holds it). Recorded: the engine's own count after this step's forward pass, "
                         f"{s.kv_bytes:,} bytes.\n\nSource: 003 Detail 10; sliding windows: Gemma Team 2025")
    else:
        formula_expander("KV cache bytes", f"bytes = 2 × L × h_kv × tokens × d × 4 = 2 × {c.num_layers} × "
                         f"{c.num_kv_heads} × {s.cache_tokens:,} × {c.head_dim} × 4 = {predicted:,.0f} "
                         "(`calculators.sizing.kv_cache.kv_cache_bytes`, float32 as the engine holds it). Recorded: "
                         f"the engine's own count after this step's forward pass, {s.kv_bytes:,} bytes.\n\n"
                         "Source: 003 Detail 10")
    if hybrid:
        show_kv_by_layer_kind(c, s.kv_bytes_per_layer, s.cache_tokens, "kv_cache_layer_kinds")
        st.caption(f"{c.name} mixes layer kinds: its sliding-window layers drop positions older than "
                   f"{c.sliding_window} tokens, so past that length only its full-attention layers keep growing. "
                   "The prediction line above uses the same per-kind formula.")
    layer = index_field("Layer to look at", c.num_layers, key="kv.layer", help=f"0 to {c.num_layers - 1}")
    if layer is None:
        return
    every_layer_chart(model, s)
    new_rows_chart(model, s, layer)
    qkv_section(model, rec, step, layer, texts)
    counterfactual_section(model, rec.steps[-1].cache_tokens)
    df = pd.DataFrame({"step": [x.step for x in rec.steps], "token": texts,
                       "token_id": [x.token_id for x in rec.steps], "cache_tokens": [x.cache_tokens for x in rec.steps],
                       "kv_bytes": [x.kv_bytes for x in rec.steps],
                       "predicted_bytes": [kv_cache_bytes(c, x.cache_tokens, kv_dtype=ENGINE_KV_DTYPE)
                                           for x in rec.steps]})
    df_with_download(df, "kv_cache_steps")


main()
