"""Embeddings and the next token: the embedding table (its size, one token's row, its nearest neighbours), then the
other end of the model: a pointer to the Sampling lesson (the next-token distribution and the sampler), and a logit
lens through every layer.

Numbers: `engine.instruments.readout` (nearest_tokens, logit_lens), `calculators.sizing.params.embedding_bytes`; the run is one forward pass (`ui.inside`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from calculators.claims import logit_lens_claim
from calculators.sizing.params import embedding_bytes
from calculators.units import fmt_bytes
from engine import Model
from engine.instruments.readout import embedding_row, logit_lens, nearest_tokens
from ui import df_with_download, formula_expander, model_picker, setup_page
from ui.charts import DIVERGING, figure, font_px, style
from ui.inside import Prompt, deeper_link, index_field, prompt_readout, session_cached, teacher_prompt

NEIGHBOURS = 10


def piece(model: Model, token_id: int) -> str:
    tok = model.tokenizer
    return tok.token_strings([int(token_id)])[0] if tok is not None else f"#{int(token_id)}"


def embedding_section(model: Model, prompt: Prompt) -> None:
    st.subheader("1 · The embedding table")
    c = model.config
    held = model.weights.embed.nbytes
    predicted = embedding_bytes(c, "fp32")
    pos = index_field("Token position in the prompt", len(prompt.ids), key="emb.position",
                      default=prompt.last_word_position(model),
                      help="Which of the prompt's tokens to look up (at first: the last word you typed).")
    if pos is None:
        return
    tid = prompt.ids[pos]
    vec = embedding_row(model.weights.embed, tid)
    st.markdown(f"Token at position {pos}: **`{piece(model, tid)}`** (id {tid}). Its row of the table, "
                f"{c.hidden_size} numbers, one colour each:")
    fig = figure(dict(type="heatmap", z=vec[None, :], colorscale=DIVERGING, zmid=0, showscale=False),
                 xaxis=dict(title="dimension (0 … D−1)"), yaxis=dict(showticklabels=False))
    st.plotly_chart(style(fig, height=170, legend_top=False), width="stretch")
    st.caption(f"Blue = negative, white = 0, red = positive (from {vec.min():.3f} to {vec.max():.3f}).")
    cols = st.columns(3)
    cols[0].metric("Table shape", f"{c.vocab_size:,} × {c.hidden_size:,}", help="[vocabulary, model width D]")
    cols[1].metric("In this engine (float32)", fmt_bytes(held), help=f"{held:,} bytes held in memory")
    cols[2].metric("In bf16 (as shipped)", fmt_bytes(embedding_bytes(c, "bf16")))
    formula_expander("Embedding table size",
                     f"bytes = V × D × bytes per number = {c.vocab_size:,} × {c.hidden_size:,} × 4 "
                     f"= {predicted:,.0f} (calculators.sizing.params.embedding_bytes, float32); the engine's array "
                     f"holds {held:,} bytes.\n\nIn bf16 (2 bytes): {embedding_bytes(c, 'bf16'):,.0f} bytes.\n\n"
                     "Source: 003 Detail 2a")
    ids, cos = session_cached("neighbours", (model.source, tid),
                              lambda: nearest_tokens(model.weights.embed, tid, NEIGHBOURS))
    df = pd.DataFrame({"token": [piece(model, i) for i in ids], "token_id": ids, "cosine": np.round(cos, 4)})
    left, right = st.columns([3, 2])
    fig = figure(dict(type="bar", x=cos, y=list(df["token"]), orientation="h", text=[f"{x:.2f}" for x in cos],
                      textposition="auto"),
                 xaxis=dict(title="cosine similarity"), yaxis=dict(autorange="reversed", title="nearest tokens"))
    left.plotly_chart(style(fig, height=380, legend_top=False, span=3 / 5), width="stretch")
    with right:
        df_with_download(df, "nearest_tokens")
        formula_expander("Cosine similarity", "cos(a, b) = a·b ÷ (‖a‖ ‖b‖): 1 = same direction, 0 = unrelated. "
                         "Computed against all rows of the table (`engine.instruments.readout.nearest_tokens`).")
    if model.random_weights:
        st.caption("Random weights: neighbours are random too (a trained model puts related words together).")


def next_token_section() -> None:
    st.subheader("2 · From the last position to the next token")
    deeper_link("pages/12_Sampling.py", "The next-token distribution and how the sampler picks from it (temperature, "
                "top-k, top-p) have their own lesson: Sampling")


def logit_lens_section(model: Model, prompt: Prompt, resid: np.ndarray) -> None:
    st.subheader("3 · Logit lens: what each layer would say")
    st.markdown("Stop the model after any layer and send that layer's vector straight to the final norm and the "
                "output table: each bar is the token that layer would pick, and how sure it would be.")
    ids, probs = session_cached("lens", (model.source, prompt.ids),
                                lambda: logit_lens(model.weights, model.config, resid))
    layers = np.arange(len(ids))
    labels = [piece(model, i) for i in ids]
    fig = session_cached("lens_chart", (model.source, prompt.ids, font_px()),
                         lambda: style(figure(dict(type="bar", orientation="h", y=[f"layer {i}" for i in layers],
                                                   x=probs, text=[f"{t}  {p:.0%}" for t, p in zip(labels, probs)],
                                                   textposition="outside", cliponaxis=False,
                                                   marker=dict(color="#2563eb")),
                                              xaxis=dict(title="probability of that layer's top token",
                                                         tickformat=".0%", range=[0, 1.25],  # room for labels
                                                         tickvals=[0, 0.25, 0.5, 0.75, 1]),   # no tick past 100%
                                              yaxis=dict(autorange="reversed", type="category", dtick=1)),
                                       height=120 + 24 * len(layers), legend_top=False))
    st.plotly_chart(fig, width="stretch")
    st.markdown(logit_lens_claim(labels, [float(p) for p in probs]))
    df_with_download(pd.DataFrame({"layer": layers, "top token": labels, "token_id": ids,
                                   "probability": np.round(probs, 6)}), "logit_lens")
    formula_expander("Logit lens", "top token after layer l = argmax softmax(RMSNorm(x_l) · W_outᵀ): the model's "
                     "own final norm and LM head applied to the residual stream x_l at the last position "
                     "(`engine.instruments.readout.logit_lens`). The last row equals the model's real prediction.")


def main() -> None:
    """The embedding table's first chart (one token's row) under the title (a projector's first screen at
    1366×768), the table's size under it; the intro and the prompt box after that section, then the next token
    and the logit lens."""
    setup_page("Embeddings and the next token", icon=":material/scatter_plot:")
    st.title("Embeddings and the next token")
    top = st.container()
    st.markdown("Each token id picks one row of a big table: a list of numbers the rest of the model works on. At "
                "the far end, the model turns its last vector back into one score per vocabulary entry, and a "
                "sampler picks the next token from them. This page shows both ends on your prompt.")
    model = model_picker()
    prompt = teacher_prompt(model)
    if model is None or prompt is None:
        return
    readout = prompt_readout(model, prompt)
    with top:
        embedding_section(model, prompt)
    next_token_section()
    logit_lens_section(model, prompt, readout.last_resid)


main()
