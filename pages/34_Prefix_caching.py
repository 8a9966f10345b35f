"""Prefix caching: a shared system prompt's KV computed once and reused, in theory (tokens, bytes, blocks, prefill
time on the step model) and on the engine (the same questions with the cache off and on: tokens computed,
prefill time, identical replies).

Numbers: `calculators.prefix_cache.prefix_cache_numbers` (prefix_kv_bytes, prefill_with_prefix_cache,
redundant_prefill, cacheable_blocks, prefix_prefill_ms), `calculators.explain.explain_prefix_saving`;
measured: `engine.serving_runs.prefix_cache_run` (the Scheduler with prefix_caching=True/False).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.explain import explain_prefix_saving
from calculators.prefix_cache import prefix_cache_numbers
from calculators.units import fmt_bytes, fmt_num
from engine.errors import ModelError
from engine.serving_runs import prefix_cache_run
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, model_picker, setup_page, show_error
from ui.serving import step_model_inputs, style

RUN_KEY = "prefix.runs"                       # per session: {inputs: (off, on)}
SYSTEM = ("You are a careful assistant for a school. Answer in plain words, in at most three sentences, and say "
          "when you are not sure.")
QUESTIONS = "Why is the sky blue?\nWhat is a prime number?\nHow do plants drink?"


def theory(model) -> None:
    st.subheader("The arithmetic")
    c = st.columns(4)
    prefix = int_field("Shared prefix (tokens)", 500, 0, 10_000_000, key="prefix.prefix", where=c[0])
    unique = int_field("Unique tokens per request", 8, 1, 10_000_000, key="prefix.unique", where=c[1])
    reqs = int_field("Requests", 100, 1, 10_000_000, key="prefix.reqs", where=c[2])
    block = int_field("Block size", 16, 1, 4096, key="prefix.block", where=c[3])
    if None in (prefix, unique, reqs, block):
        return
    try:
        nums = prefix_cache_numbers(model, prefix, unique, reqs, block)
        ex = explain_prefix_saving(nums["prompt_tokens"], prefix)
    except SpecError as e:
        show_error(e)
        return
    P, kv, saved, red = nums["prompt_tokens"], nums["prefix_kv_bytes"], nums["saved"], nums["redundant"]
    blocks, times = nums["blocks"], nums["times"]
    c = st.columns(4)
    c[0].metric("KV of the prefix, cached once", fmt_bytes(kv))
    c[1].metric("Tokens left to prefill", f"{saved['tokens_to_prefill']:,} of {P:,}",
                delta=f"{fmt_num(saved['percent_saved'], 3)}% less", delta_color="off")
    c[2].metric(f"Redundant prefill over {reqs:,} requests", f"{fmt_num(100 * red['redundant_fraction'], 3)}%",
                help=f"{red['shared_tokens']:,.0f} shared vs {red['unique_tokens']:,.0f} unique prompt tokens")
    c[3].metric("Blocks the prefix fills", f"{blocks['full_blocks']:,} full",
                help=f"+ {blocks['partial_block_tokens']} tokens in a partial block, which is not shared as is "
                     "(a request writing into it copies it first)")
    fig = go.Figure(go.Bar(x=["no prefix cache", "prefix cached"], y=[times["full_ms"], times["cached_ms"]],
                           text=[f"{fmt_num(times['full_ms'], 3)} ms", f"{fmt_num(times['cached_ms'], 3)} ms"],
                           marker_color=["#e45756", "#4c78a8"]))
    st.plotly_chart(style(fig, f"Prefill of one {P:,}-token prompt on {model.name}", "", "ms", height=380),
                    key="prefix.bars")
    formula_expander("The arithmetic", f"**{ex.name}** `{ex.symbolic}`: {ex.formula}  \n_{ex.source}_\n\n"
                     f"KV of the prefix: {prefix:,} tokens × {fmt_bytes(model.kv_bytes_per_token)} = {fmt_bytes(kv)}."
                     f"\n\nPrefill time (step model): the whole prompt takes {fmt_num(times['full_ms'], 4)} ms; with "
                     f"the prefix cached only {saved['tokens_to_prefill']:,} tokens run, attending to the "
                     f"{prefix:,} cached ones: {fmt_num(times['cached_ms'], 4)} ms "
                     f"({fmt_num(times['saved_percent'], 3)}% saved). Time falls less than tokens when the short "
                     "rest is bound by the weight read, which every step pays.")
    df_with_download(pd.DataFrame([dict(quantity="prompt tokens", value=P),
                                   dict(quantity="tokens to prefill with the cache", value=saved["tokens_to_prefill"]),
                                   dict(quantity="prefix KV (bytes)", value=kv),
                                   dict(quantity="redundant fraction without a cache", value=red["redundant_fraction"]),
                                   dict(quantity="full blocks cached", value=blocks["full_blocks"]),
                                   dict(quantity="prefill without cache (ms)", value=times["full_ms"]),
                                   dict(quantity="prefill with cache (ms)", value=times["cached_ms"])]),
                     "prefix_cache_numbers")


def measured(model) -> None:
    st.subheader("On the engine: the same system prompt, the cache off and on")
    system = st.text_area("System prompt (shared)", SYSTEM, key="prefix.system", height=90)
    questions = st.text_area("Questions, one per line", QUESTIONS, key="prefix.questions", height=90)
    c = st.columns(2)
    new = int_field("New tokens each", 6, 1, 64, key="prefix.new", where=c[0])
    block = int_field("Block size", 16, 1, 256, key="prefix.engine_block", where=c[1])
    qs = [q for q in questions.splitlines() if q.strip()]
    if None in (new, block):
        return
    if not system.strip() or not qs:
        show_error("Type a system prompt and at least one question.")
        return
    key = (model.source, system, tuple(qs), new, block)
    store = st.session_state.setdefault(RUN_KEY, {})
    if st.button("Run both", key="prefix.run", type="primary", icon=":material/play_arrow:"):
        try:
            sys_ids = model.encode_prompt(system)
            q_ids = [model.encode_prompt(" " + q) for q in qs]
            with st.spinner("Serving the questions twice …"):
                store[key] = tuple(prefix_cache_run(model, sys_ids, q_ids, new, on, block) for on in (False, True))
        except (ModelError, SpecError) as e:
            show_error(e)
            return
    if key not in store:
        st.info("Press Run to serve the questions without and with the prefix cache.")
        return
    off, on = store[key]
    rows = [dict(cache="on" if run["prefix_caching"] else "off", **{k: v for k, v in r.items() if k != "token_ids"})
            for run in (off, on) for r in run["rows"]]
    same = [a["token_ids"] == b["token_ids"] for a, b in zip(off["rows"], on["rows"])]
    (st.success if all(same) else st.error)(
        "Replies identical with and without the cache." if all(same) else "Replies differ!")
    df = pd.DataFrame(rows)
    fig = go.Figure([go.Bar(x=df[df.cache == c]["request"], y=df[df.cache == c]["computed_tokens"],
                            name=f"cache {c}") for c in ("off", "on")])
    fig.update_layout(barmode="group")
    st.plotly_chart(style(fig, "Prompt tokens the model had to compute", "request", "tokens", height=360),
                    key="prefix.engine_bars")
    df_with_download(df, "prefix_cache_engine", column_config={
        "prefill_ms": st.column_config.NumberColumn(format="%.1f"), "ttft_ms": st.column_config.NumberColumn(
            format="%.1f")})
    st.caption("The first request fills the cache; later ones reuse every full block of the shared prefix "
               "(blocks are keyed by a hash of their tokens and all tokens before them). Measured on this machine.")


def main() -> None:
    setup_page("Prefix caching", icon=":material/cached:")
    st.title("Prefix caching")
    st.markdown(
        "Many requests start with the same words: a system prompt, a document, the start of a conversation. "
        "Because attention is causal, the keys and values of those words depend on nothing after them, so they "
        "come out identical every time. Keep them, and each new request only prefills what is new.")
    model = step_model_inputs()
    if model is not None:
        theory(model)
    engine_model = model_picker()
    if engine_model is not None:
        measured(engine_model)


main()
