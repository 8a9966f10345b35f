"""Walkthrough: a guided lesson for a class, one idea per step (Next / Back), on the teacher's own prompt and run:
tokens, embeddings, attention, the next-token distribution, one token at a time, the KV cache growing, prefill
versus decode; then the same model serving many people: batching, the paged KV cache and the capacity planner.
Each step links to the page that goes deeper.

Numbers: the same functions as the "Inside the model" pages (`engine.instruments.readout`, the run's record,
`ui.inside`); the serving steps size this run's model with the calculators the serving and planning pages use
(`calculators.serving.batching`, `calculators.explain.explain_paging`, `calculators.planning.planner`).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from calculators.explain import explain_paging
from calculators.planning.planner import Workload, plan, plan_rows
from calculators.serving.batching import batch_curve, step_model_for
from calculators.serving.paging import reserve_for_max
from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes
from calculators.units import fmt_bytes, fmt_num
from engine import Model
from engine.instruments.readout import record_timeline, token_end_times_ms, token_table
from specs.devices import load_device
from specs.model_config import SpecError
from ui import model_picker, setup_page, show_error
from ui.charts import DIVERGING, WEIGHTS, heatmap_size, style
from ui.inside import (Prompt, deeper_link, layer_attention, piece_label, pieces_html, run_settings, step_texts,
                       session_cached, stepper, teacher_prompt, teacher_run)
from ui.model_source import REFERENCE_DEVICE
from ui.walk_claims import binding_sentence, decode_beat_sentence

STEP_KEY = "walk.step"
HEATMAP_TOKENS = 40
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCK = 16                                   # tokens per KV block, as in vLLM and the Paged KV cache page
CLASS_SIZE, SECONDS_BETWEEN_REQUESTS = 30, 10
PLAN_DEVICES = ("H100 SXM", "A100 SXM 80GB", "L40S", "L4")


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
    deeper_link("pages/12_Sampling.py", "Go deeper: Sampling")


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
    ends = token_end_times_ms(rec)
    st.markdown(decode_beat_sentence(tl["ttft_ms"], tl["itl_ms"]))       # the bars below, one per decode step
    fig = go.Figure()
    fig.add_bar(y=["run"], x=[tl["ttft_ms"]], orientation="h", name="prefill", marker_color="#f59e0b")
    if len(ends) > 1:
        fig.add_bar(y=["run"] * (len(ends) - 1), x=np.diff(ends), base=ends[:-1], orientation="h", name="decode",
                    marker_color="#2563eb", marker_line=dict(color="white", width=2))
    fig.update_layout(barmode="overlay", xaxis_title="time (ms)", height=230)
    st.plotly_chart(style(fig, height=230), width="stretch")
    deeper_link("pages/15_Prefill_and_decode_measured.py", "Go deeper: Prefill and decode, measured")


def step_batching(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    c = model.config
    context = rec.steps[-1].cache_tokens
    try:
        rows = batch_curve(step_model_for(c, load_device(REFERENCE_DEVICE), "bf16"), context, BATCHES)
    except SpecError as e:
        show_error(e)
        return
    one, many = rows[0], next(r for r in rows if r["batch"] == 64)
    st.markdown(f"One reply at a time wastes the machine: every decode step reads **all the weights** to make one "
                f"token. Serve many people together and one read of the weights makes a token for each of them. "
                f"For this model on an {REFERENCE_DEVICE} (datasheet speed, {context:,} tokens of context each): "
                f"**{fmt_num(one['total_tok_s'], 3)} tokens/s** for one reply, "
                f"**{fmt_num(many['total_tok_s'], 3)} tokens/s** in total for 64 replies at once, each still "
                f"getting {fmt_num(many['per_stream_tok_s'], 3)} tokens/s.")
    fig = go.Figure()
    fig.add_scatter(x=[r["batch"] for r in rows], y=[r["total_tok_s"] for r in rows], name="all replies together",
                    mode="lines+markers", line=dict(color="#2563eb", width=3))
    fig.add_scatter(x=[r["batch"] for r in rows], y=[r["per_stream_tok_s"] for r in rows], name="one reply",
                    mode="lines+markers", line=dict(color="#f59e0b", width=3))
    fig.update_layout(xaxis_title="replies decoded together (batch)", yaxis_title="tokens per second", height=360)
    fig.update_xaxes(type="log", tickvals=list(BATCHES))
    fig.update_yaxes(type="log")
    st.plotly_chart(style(fig, height=360), width="stretch")
    st.caption("Computed from the step-time model (weights once per step, plus every reply's KV cache), not "
               "measured: the Batching page measures it on this machine.")
    deeper_link("pages/31_Batching.py", "Go deeper: Batching")


def step_paging(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    c = model.config
    n = rec.steps[-1].cache_tokens
    blocks, empty = explain_paging(n, BLOCK)
    per_token = kv_bytes_per_token(c, "fp32")
    reserved = reserve_for_max(n, c.max_position_embeddings, per_token)
    st.markdown(f"Many replies share one memory, and nobody knows in advance how long a reply will be. Reserving "
                f"the whole context window ({c.max_position_embeddings:,} tokens) for this reply would hold "
                f"**{fmt_bytes(reserved['reserved_bytes'])}** for {fmt_bytes(reserved['used_bytes'])} used. A paged "
                f"cache hands out small blocks of {BLOCK} tokens as the reply grows: this reply's {n:,} tokens take "
                f"**{blocks.value:,.0f} blocks**, with {empty.value:,.0f} empty slots in the last one.")
    rows = int(blocks.value)
    z = [[1 if b * BLOCK + s < n else 0 for s in range(BLOCK)] for b in range(rows)]
    text = [[str(b * BLOCK + s) if b * BLOCK + s < n else "" for s in range(BLOCK)] for b in range(rows)]
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", showscale=False, xgap=3, ygap=3, zmin=0,
                               zmax=1, colorscale=[[0, "#e2e8f0"], [1, "#2563eb"]], hoverinfo="skip"))
    fig.update_layout(xaxis_title=f"slot in the block (0 … {BLOCK - 1}); number = token position, grey = empty",
                      yaxis_title="block", height=min(520, 130 + 40 * rows))
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(autorange="reversed", tickvals=list(range(rows)), ticktext=[f"block {b}" for b in range(rows)])
    st.plotly_chart(style(fig, height=min(520, 130 + 40 * rows), legend_top=False), width="stretch")
    st.caption(f"Blocks: {blocks.formula}. Empty slots: {empty.formula}. A request never wastes more than "
               f"{BLOCK - 1} slots, whatever its length.")
    deeper_link("pages/33_Paged_KV_cache.py", "Go deeper: Paged KV cache")


def step_planner(model: Model, prompt: Prompt, rec, texts: list[str]) -> None:
    c = model.config
    rate = CLASS_SIZE / SECONDS_BETWEEN_REQUESTS
    wl = Workload(requests_per_s=rate, prompt_tokens=len(prompt.ids), output_tokens=max(1, len(rec.steps)),
                  ttft_p99_ms=2000.0, itl_ms=50.0)
    try:                                                  # one search per GPU: its cheapest plan, or none
        best = session_cached("walk.plan", (model.source, wl), lambda: {
            d: rows[0] for d in PLAN_DEVICES for rows in [plan_rows(plan(c, [load_device(d)], wl), top=1)] if rows})
    except SpecError as e:
        show_error(e)
        return
    st.markdown(f"Last question: what to buy. Say a class of {CLASS_SIZE} each sends a prompt like this one every "
                f"{SECONDS_BETWEEN_REQUESTS} s ({rate:g} requests/s, {len(prompt.ids):,} tokens in, "
                f"{len(rec.steps):,} out), and wants the first token within 2 s and then one every 50 ms. The "
                "planner tries every GPU, count, split and precision and keeps the cheapest that meets the targets.")
    if not best:
        st.warning("No plan meets these targets on these GPUs; the Capacity planner says why for each.")
    else:
        top = best[min(best, key=lambda d: best[d]["usd_per_million_output_tokens"])]
        st.markdown(f"Cheapest: **{top['gpus']} × {top['device']}** ({top['weight_dtype']} weights), "
                    f"**${top['usd_per_million_output_tokens']:,.3f} per million output tokens**; "
                    f"{binding_sentence(top['binding'], top['worst_ratio'], top['gpus'])}.")
        names = sorted(best, key=lambda d: best[d]["usd_per_million_output_tokens"])
        cost = [best[d]["usd_per_million_output_tokens"] for d in names]
        fig = go.Figure(go.Bar(y=names, x=cost, orientation="h", marker_color="#10b981",
                               text=[f"${v:,.3f}: {best[d]['gpus']} GPU, {best[d]['weight_dtype']}"
                                     for d, v in zip(names, cost)], textposition="outside", cliponaxis=False))
        fig.update_layout(xaxis_title="$ per 1M output tokens (cheapest plan on that GPU)",
                          yaxis=dict(type="category", autorange="reversed"), height=140 + 50 * len(names))
        fig.update_xaxes(range=[0, max(cost) * 1.6])
        st.plotly_chart(style(fig, height=140 + 50 * len(names), legend_top=False), width="stretch")
    deeper_link("pages/42_Capacity_planner.py", "Go deeper: Capacity planner")


STEPS = [("Your prompt and its reply", step_prompt), ("Text becomes tokens", step_tokens),
         ("Tokens become vectors", step_embeddings), ("Tokens look at each other", step_attention),
         ("A score for every word", step_next_token), ("One token at a time", step_one_at_a_time),
         ("The memory that grows", step_kv_cache), ("Two speeds: prefill and decode", step_two_speeds),
         ("Many people at once: batching", step_batching), ("Memory in pages", step_paging),
         ("What to buy: the planner", step_planner)]


def main() -> None:
    """The step first (Back / Next, its heading, its chart), the prompt and run settings under it: at 1366×768 a
    step's heading, chart and Next button share the first screen, so the class never waits while the teacher
    scrolls. Step 1 shows the prompt box inside the step, where the teacher types it."""
    setup_page("Walkthrough", icon=":material/school:")
    step_area = st.container()
    model = model_picker()
    with step_area:
        name, controls = st.columns([2, 3], vertical_alignment="bottom")      # the title and Back / Next: one row
        name.title("Walkthrough")
        i = stepper("Step", len(STEPS), key=STEP_KEY, first=1, where=controls, widths=(1.3, 1.3, 1))
        if i is None:
            return
        title, draw = STEPS[i]
        st.header(f"{i + 1}. {title}")
    st.divider()
    st.caption(f"The Walkthrough: one real request through a real model, then serving it to a whole class, in "
               f"{len(STEPS)} steps, on the prompt typed in step 1 (and below).")
    prompt_area = step_area if i == 0 else st.container()
    prompt = teacher_prompt(model, height=70, where=prompt_area)
    if model is None or prompt is None:
        if i > 0:                                         # the reason is under the step: point at it
            step_area.info("This step draws the model's run on the prompt: see the note under it.")
        return
    with prompt_area.expander("Run settings"):
        settings = run_settings(model)
    if settings is None:
        return
    try:
        with step_area, st.spinner("Running the model on your prompt …"):
            rec = teacher_run(model, prompt, *settings)
    except SpecError as e:
        show_error(e, step_area)
        return
    with step_area:
        draw(model, prompt, rec, step_texts(model, rec))


main()
