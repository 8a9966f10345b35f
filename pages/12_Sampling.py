"""Sampling: the model's next-token distribution for your prompt, then the engine's sampler applied one step at a
time (temperature, top-k, top-p) with the probabilities after each step, and a seeded draw from the result.

Numbers: the last position's logits from one forward pass (`ui.inside.prompt_readout`); every distribution is
`engine.model.sampling.sampling_probs` with the filters switched on one by one, the draws are
`engine.model.sampling.sample` (the function the engine's generation loop calls). The code shown under each step is
read from those functions (`ui.code`): this page holds no formula.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import streamlit as st

from engine import Model
from engine.instruments.readout import support_size, top_k
from engine.model.sampling import sample, sample_with_prob, sampling_probs
from ui import df_with_download, float_field, int_field, model_picker, setup_page, show_error
from ui.charts import figure, style
from ui.code import code_expander
from ui.inside import prompt_readout, teacher_prompt

SHOW_TOP = 10           # bars per chart: the model's 10 most likely next tokens
DRAWS = 100             # default number of seeded draws
BEFORE, AFTER = "#94a3b8", "#2563eb"


def piece(model: Model, token_id: int) -> str:
    tok = model.tokenizer
    return tok.token_strings([int(token_id)])[0] if tok is not None else f"#{int(token_id)}"


def settings(vocab: int) -> tuple[float, int, float, int, int] | None:
    """Temperature, top-k, top-p, seed and draws, each checked; None (with one clear message each) if any is bad."""
    cols = st.columns(5)          # defaults where every step changes something: sharper, tail cut, cut again
    t = float_field("Temperature", 0.7, 0.0, 100.0, key="samp.temperature", where=cols[0],
                    help="Divides every logit before softmax: below 1 sharpens, above 1 flattens.")
    k = int_field("Top-k", 5, 0, vocab, key="samp.top_k", where=cols[1], help="Keep the k most likely tokens; 0 = off.")
    p = float_field("Top-p", 0.8, 0.0, 1.0, key="samp.top_p", where=cols[2],
                    help="Keep the most likely tokens until their probabilities add up to p; 1 = off.")
    seed = int_field("Seed", 0, 0, 2**32 - 1, key="samp.seed", where=cols[3])
    n = int_field("Draws", DRAWS, 1, 10_000, key="samp.draws", where=cols[4])
    if None in (t, k, p, seed, n):
        return None
    if t == 0:
        show_error("Temperature 0 would divide every logit by zero. It means greedy decoding (always the single "
                   "most likely token, no sampling); type a temperature above 0, e.g. 0.7, to see the distribution "
                   "the sampler draws from.")
        return None
    if p == 0:
        show_error("Top-p must be above 0 (allowed: more than 0, up to 1): it keeps the most likely tokens until "
                   "their probabilities reach p, and p = 0 would keep none. 1 = off.")
        return None
    return t, k, p, seed, n


def step_chart(labels: list[str], before: np.ndarray | None, after: np.ndarray, before_name: str,
               after_name: str) -> None:
    """Horizontal bars (token names read left to right), the step's input in grey (none for the first step), its
    output in blue."""
    top = float(max(after.max(), 0 if before is None else before.max())) * 1.25   # room for the labels
    ticks = dict(tickvals=[0, 0.25, 0.5, 0.75, 1]) if top > 1 else {}   # no tick past 100%
    traces = [] if before is None else [dict(type="bar", orientation="h", name=before_name, y=labels, x=before,
                                             marker=dict(color=BEFORE))]
    fig = figure(*traces,
                 dict(type="bar", orientation="h", name=after_name, y=labels, x=after, marker=dict(color=AFTER),
                      text=[f"{x:.1%}" for x in after], textposition="outside", cliponaxis=False),
                 barmode="group",
                 xaxis=dict(title="probability", tickformat=".0%", range=[0, top], **ticks),
                 yaxis=dict(title=None, type="category", autorange="reversed"))
    height = 120 + (34 if before is None else 48) * len(labels)       # two bars a token: room for each label
    st.plotly_chart(style(fig, height=height, legend_top=before is not None), width="stretch")


def main() -> None:
    """The sampler's settings in one row and the model's distribution under them (a projector's first screen at
    1366×768); the intro and the prompt box after it, then temperature, top-k, top-p and the draws."""
    setup_page("Sampling", icon=":material/casino:")
    st.title("Sampling")
    top = st.container()
    st.markdown("The model gives every token of its vocabulary a probability of coming next. The **sampler** then "
                "reshapes that distribution (temperature, top-k, top-p) and draws one token from it. Here are the "
                "three steps on your prompt, in the order the engine applies them.")
    model = model_picker()
    prompt = teacher_prompt(model)
    if model is None or prompt is None:
        return
    with top:
        chosen = settings(model.config.vocab_size)
    if chosen is None:
        return
    t, k, p, seed, n = chosen
    logits = prompt_readout(model, prompt).last_logits                       # [V] the last position's scores
    model_p = sampling_probs(logits)                                          # T = 1, no filter: plain softmax
    after_t = sampling_probs(logits, t)
    after_k = sampling_probs(logits, t, k)
    final = sampling_probs(logits, t, k, p)                                   # what the sampler draws from
    ids, _ = top_k(model_p, SHOW_TOP)
    labels = [piece(model, i) for i in ids]
    V = logits.size

    with top:
        st.subheader("1 · The model's distribution")
        st.markdown(f"One score (logit) per token, {V:,} of them, turned into probabilities by softmax. The model's "
                    f"{len(ids)} favourites:")
        step_chart(labels, None, model_p[ids], "", "model (softmax)")
        code_expander("Softmax, as the engine computes it", sampling_probs, "p = np.exp", "p /= p.sum()")

    st.subheader(f"2 · Temperature {t:g}")
    st.markdown("Every logit is divided by the temperature before softmax. "
                + ("Below 1 the favourites gain." if t < 1 else "Above 1 the long tail gains." if t > 1 else
                   "At exactly 1 nothing changes."))
    step_chart(labels, model_p[ids], after_t[ids], "model", f"after temperature {t:g}")
    code_expander("Temperature, in the engine", sampling_probs, "z = logits / temperature", "z = logits / temperature")

    st.subheader("3 · Top-k" + (f" = {k:,}" if k else " (off)"))
    st.markdown(f"Only the {k:,} most likely tokens stay; the others get probability 0 and the rest is renormalised."
                if k else "Top-k is 0: every token stays. Type a top-k (e.g. 3) to cut the tail.")
    step_chart(labels, after_t[ids], after_k[ids], "after temperature", "after top-k")
    code_expander("Top-k, in the engine", sampling_probs, "if top_k", "z = np.where")

    st.subheader("4 · Top-p" + (f" = {p:g}" if p < 1 else " (off)"))
    st.markdown("The most likely tokens stay, in order, until their probabilities add up to p; the rest get 0 and "
                "the kept ones are renormalised." if p < 1 else
                "Top-p is 1: every token stays. Type a top-p (e.g. 0.9) to keep only the smallest set that covers it.")
    step_chart(labels, after_k[ids], final[ids], "after top-k", "after top-p: what is drawn from")
    code_expander("Top-p, in the engine", sampling_probs, "if top_p", "p /= p.sum()")

    st.markdown(f"**{support_size(final):,} of {V:,} tokens** can still be drawn with these settings.")
    df = pd.DataFrame({"token": labels, "token_id": ids, "logit": np.round(logits[ids], 4),
                       "p model": np.round(model_p[ids], 6), "p after temperature": np.round(after_t[ids], 6),
                       "p after top-k": np.round(after_k[ids], 6), "p after top-p": np.round(final[ids], 6)})
    df_with_download(df, "sampling_steps")

    st.subheader(f"5 · {n:,} draws with seed {seed}")
    rng = np.random.default_rng(seed)
    draws = [sample(logits, t, k, p, rng) for _ in range(n)]
    counts = Counter(draws)
    st.markdown("The same seed gives the same draws every time; another seed, other draws. First 20: "
                + " ".join(f"`{piece(model, d)}`" for d in draws[:20]))
    drawn = sorted(counts, key=lambda i: (-counts[i], i))
    df_with_download(pd.DataFrame({"token": [piece(model, i) for i in drawn], "token_id": drawn,
                                   "drawn": [counts[i] for i in drawn],
                                   "share of draws": np.round([counts[i] / n for i in drawn], 4),
                                   "p after top-p": np.round(final[drawn], 4)}), "sampling_draws")
    code_expander("One draw, in the engine", sample_with_prob)
    st.caption("More draws bring each token's share closer to its probability. Greedy decoding (temperature 0) "
               "skips all of this and takes the most likely token.")


main()
