"""Walkthrough: a guided lesson for a class, one idea per step (Next / Back), on the teacher's own prompt and run:
tokens, embeddings, attention, the next-token distribution, one token at a time, the KV cache growing, prefill
versus decode. Each step links to the page that goes deeper.

Numbers: the same functions as the "Inside the model" pages (`engine.instruments.readout`, the run's record, `ui.inside`).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.units import fmt_bytes
from engine import Model
from engine.instruments.readout import record_timeline, token_end_times_ms, token_table
from specs.model_config import SpecError
from ui import model_picker, setup_page, show_error
from ui.charts import DIVERGING, WEIGHTS, heatmap_size, style
from ui.inside import (Prompt, deeper_link, layer_attention, piece_label, pieces_html, run_settings, step_texts,
                       stepper, teacher_prompt, teacher_run)

STEP_KEY = "walk.step"
HEATMAP_TOKENS = 40


def step_prompt(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    st.markdown("We typed a request. The model will answer it one small piece at a time. Here is what it wrote; "
                "the next steps open it up to see how.")
    reply = model.tokenizer.decode([s.token_id for s in rec.steps]) if model.tokenizer else " ".join(texts)
    cut = rec.finish_reason in ("length", "context")
    st.markdown(f"> **Prompt:** {prompt.text}\n>\n> **Reply:** {reply}{' …' if cut else ''}")
    if cut:
        why = (f"the {len(rec.steps)} new tokens set in Run settings" if rec.finish_reason == "length"
               else "the model's context window")
        st.caption(f"The reply stops at {why}, not at the end of a thought: the model writes one token at a time "
                   "and was still going. Raise “New tokens to generate” under Run settings to read more.")


def step_tokens(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    st.markdown(f"The model cannot read letters. The text is cut into **{len(prompt.ids)} tokens**, each a number "
                "in a fixed vocabulary. Dark pieces are markers the chat format adds.")
    if model.tokenizer is not None:
        st.markdown(pieces_html(token_table(model.tokenizer, list(prompt.ids))), unsafe_allow_html=True)
    else:
        st.code(" ".join(map(str, prompt.ids)))
    deeper_link("pages/11_Tokens.py", "Go deeper: Tokens")


def step_embeddings(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    c = model.config
    tid = prompt.ids[prompt.last_word_position(model)]
    word = model.tokenizer.token_strings([tid])[0] if model.tokenizer else f"#{tid}"
    st.markdown(f"Each token number picks one row of a table of {c.vocab_size:,} rows. A row is a list of "
                f"{c.hidden_size} numbers: the token's starting meaning. Here is the row of `{word}` (id {tid}):")
    vec = model.weights.embed[tid]
    fig = go.Figure(go.Heatmap(z=vec[None, :], colorscale=DIVERGING, zmid=0, showscale=True,
                               colorbar=dict(title="value", thickness=14, len=1.0)))
    fig.update_layout(xaxis_title=f"{c.hidden_size} numbers", yaxis=dict(showticklabels=False), height=200)
    st.plotly_chart(style(fig, height=200, legend_top=False), width="stretch")
    st.caption("Colour = the number's value: blue below zero, white near zero, red above (scale on the right). "
               "No single number means anything on its own; the pattern across all of them is the meaning.")
    deeper_link("pages/12_Embeddings_and_the_next_token.py", "Go deeper: Embeddings and the next token")


def step_attention(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    layer = model.config.num_layers // 2
    st.markdown(f"In every layer, each token looks back at the tokens before it and decides how much of each to "
                f"take in. Dark squares = strong attention (layer {layer}, head 0). Nothing above the diagonal: a "
                "token never looks ahead. A dark first column is normal: a head with nothing useful to look at "
                "parks its attention on the first token (an \"attention sink\").")
    acts = layer_attention(model, prompt, layer, HEATMAP_TOKENS)
    ids = list(prompt.ids)[:HEATMAP_TOKENS]
    pieces = model.tokenizer.token_strings(ids) if model.tokenizer else [f"#{i}" for i in ids]
    names = [piece_label(i, p) for i, p in enumerate(pieces)]
    fig = go.Figure(go.Heatmap(z=acts["hook_pattern"][0], x=names, y=names, colorscale=WEIGHTS, showscale=False))
    step, height = heatmap_size(len(ids))
    fig.update_layout(xaxis_title="looked at", yaxis_title="looking", yaxis_autorange="reversed", height=height)
    fig.update_xaxes(type="category", tickangle=-90, dtick=step)
    fig.update_yaxes(type="category", dtick=step)
    st.plotly_chart(style(fig, legend_top=False), width="stretch")
    deeper_link("pages/13_Attention.py", "Go deeper: Attention")


def step_next_token(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    first = rec.steps[0]
    tok = model.tokenizer
    names = tok.token_strings(list(first.top_ids)) if tok else [f"#{i}" for i in first.top_ids]
    st.markdown("After the last layer, the model gives every word of its vocabulary a score and turns the scores "
                "into probabilities. Its favourites for the first word of the reply:")
    fig = go.Figure(go.Bar(x=names, y=first.top_probs, text=[f"{p:.0%}" for p in first.top_probs],
                           textposition="outside", marker_color="#2563eb"))
    fig.update_layout(xaxis_title="candidate next token", yaxis_title="probability", yaxis_tickformat=".0%",
                      yaxis_range=[0, 1.1], yaxis_tickvals=[0, 0.25, 0.5, 0.75, 1], height=360)
    fig.update_xaxes(type="category")
    st.plotly_chart(style(fig, height=360, legend_top=False), width="stretch")
    st.markdown(f"It picked **`{texts[0]}`**.")
    deeper_link("pages/12_Embeddings_and_the_next_token.py", "Go deeper: the next token")


def step_one_at_a_time(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    st.markdown("The chosen token is added to the text and the model runs again, once per token. The height of "
                "each bar is how sure the model was of the token it chose: the same probability as in the step "
                "before (for the first bar, the one the first word got there).")
    fig = go.Figure(go.Bar(x=[f"{i} {t}" for i, t in enumerate(texts)], y=[s.model_prob for s in rec.steps],
                           text=[f"{s.model_prob:.0%}" for s in rec.steps], textposition="outside",
                           marker_color="#10b981"))
    fig.update_layout(xaxis_title="generated token (in order)", yaxis_title="model's probability of it",
                      yaxis_tickformat=".0%", yaxis_range=[0, 1.1], yaxis_tickvals=[0, 0.25, 0.5, 0.75, 1], height=380)
    fig.update_xaxes(type="category", tickangle=-60)
    st.plotly_chart(style(fig, height=380, legend_top=False), width="stretch")
    greedy = all(s.prob >= 1.0 - 1e-9 for s in rec.steps)          # the sampler's odds: 1 for every greedy pick
    st.caption("With temperature 0 the run always takes the most likely token, so a tall bar is a confident model "
               "and a short one a close call it still took." if greedy else
               "This run samples (temperature above 0): it sometimes takes a less likely token, so a short bar can "
               "be the sampler's choice rather than the model's favourite.")


def step_kv_cache(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    c = model.config
    last = rec.steps[-1]
    st.markdown("To avoid redoing work, the model keeps each token's keys and values (its KV cache): one new row "
                f"per layer for every token. After this reply it holds **{fmt_bytes(last.kv_bytes)}** "
                f"for {last.cache_tokens:,} tokens.")
    x = list(range(len(rec.steps)))
    fig = go.Figure()
    fig.add_scatter(x=x, y=[kv_cache_bytes(c, s.cache_tokens, kv_dtype="fp32") for s in rec.steps],
                    name="formula", line=dict(width=8, color="#cbd5e1"))
    fig.add_scatter(x=x, y=[s.kv_bytes for s in rec.steps], name="measured", mode="lines+markers",
                    line=dict(color="#2563eb"))
    fig.update_layout(xaxis_title="step", yaxis_title="KV cache (bytes)", height=360)
    st.plotly_chart(style(fig, height=360), width="stretch")
    deeper_link("pages/14_KV_cache_step_by_step.py", "Go deeper: KV cache, step by step")


def step_two_speeds(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    tl = record_timeline(rec)
    st.markdown(f"Reading the prompt (prefill) took **{tl['ttft_ms']:.0f} ms**: that is the pause before the first "
                f"word. Each next word then took about **{tl['median_itl_ms']:.0f} ms** (decode), at a steady beat.")
    ends = token_end_times_ms(rec)
    fig = go.Figure()
    fig.add_bar(y=["run"], x=[tl["ttft_ms"]], orientation="h", name="prefill", marker_color="#f59e0b")
    if len(ends) > 1:
        fig.add_bar(y=["run"] * (len(ends) - 1), x=np.diff(ends), base=ends[:-1], orientation="h", name="decode",
                    marker_color="#2563eb", marker_line=dict(color="white", width=2))
    fig.update_layout(barmode="overlay", xaxis_title="time (ms)", height=230)
    st.plotly_chart(style(fig, height=230), width="stretch")
    deeper_link("pages/15_Prefill_and_decode_measured.py", "Go deeper: Prefill and decode, measured")


STEPS = [("Your prompt and its reply", step_prompt), ("Text becomes tokens", step_tokens),
         ("Tokens become vectors", step_embeddings), ("Tokens look at each other", step_attention),
         ("A score for every word", step_next_token), ("One token at a time", step_one_at_a_time),
         ("The memory that grows", step_kv_cache), ("Two speeds: prefill and decode", step_two_speeds)]


def main() -> None:
    setup_page("Walkthrough", icon=":material/school:")
    st.title("Walkthrough")
    st.markdown("A tour of one real request through a real model, in eight steps. Type the prompt you want the "
                "class to see; every step uses that prompt and the reply the model gives to it.")
    model = model_picker()
    prompt = teacher_prompt(model, height=70)
    if model is None or prompt is None:
        return
    with st.expander("Run settings"):
        settings = run_settings(model)
    if settings is None:
        return
    try:
        with st.spinner("Running the model on your prompt …"):
            rec = teacher_run(model, prompt, *settings)
    except SpecError as e:
        show_error(e)
        return
    texts = step_texts(model, rec)
    st.divider()
    i = stepper("Step", len(STEPS), key=STEP_KEY, first=1)
    if i is None:
        return
    title, draw = STEPS[i]
    st.header(f"{i + 1}. {title}")
    st.progress((i + 1) / len(STEPS), text=f"Step {i + 1} of {len(STEPS)}")
    draw(model, prompt, rec, texts)


main()
