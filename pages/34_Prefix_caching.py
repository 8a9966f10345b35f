"""Prefix caching: a shared system prompt's KV computed once and reused, in theory (tokens, bytes, blocks, prefill
time on the step model) and on the engine (the same questions with the cache off and on: tokens computed,
prefill time, identical replies).

Numbers: `calculators.serving.prefix_cache.prefix_cache_numbers` (prefix_kv_bytes, prefill_with_prefix_cache,
redundant_prefill, cacheable_blocks, prefix_prefill_ms), `calculators.explain.explain_prefix_saving`;
measured: `engine.serve.serving_runs.prefix_cache_run` (the Scheduler with prefix_caching=True/False).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.explain import explain_prefix_saving
from calculators.serving.prefix_cache import prefix_cache_numbers
from calculators.units import fmt_bytes, fmt_num
from engine.serve.serving_runs import prefix_cache_run
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, model_picker, setup_page, show_error
from ui.serving import measured_run, step_model_inputs, style


def theory(model) -> None:
    """The inputs, the prefill with and without the cache and its numbers (drawn where the page puts this
    section: its first screen); the arithmetic and the table after them."""
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
    fig = go.Figure(go.Bar(x=["no prefix cache", "prefix cached"], y=[times["full_ms"], times["cached_ms"]],
                           text=[f"{fmt_num(times['full_ms'], 3)} ms", f"{fmt_num(times['cached_ms'], 3)} ms"],
                           marker_color=["#e45756", "#4c78a8"]))
    st.plotly_chart(style(fig, f"Prefill of one {P:,}-token prompt on {model.name}", "", "ms", height=380),
                    key="prefix.bars")
    c = st.columns(4)
    c[0].metric("KV of the prefix, cached once", fmt_bytes(kv))
    c[1].metric("Tokens left to prefill", f"{saved['tokens_to_prefill']:,} of {P:,}",
                delta=f"{fmt_num(saved['percent_saved'], 3)}% less", delta_color="off", delta_arrow="off")
    c[2].metric(f"Redundant prefill over {reqs:,} requests", f"{fmt_num(100 * red['redundant_fraction'], 3)}%",
                help=f"{red['shared_tokens']:,.0f} shared vs {red['unique_tokens']:,.0f} unique prompt tokens")
    c[3].metric("Blocks the prefix fills", f"{blocks['full_blocks']:,} full",
                help=f"+ {blocks['partial_block_tokens']} tokens in a partial block, which is not shared as is "
                     "(a request writing into it copies it first)")
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
    st.subheader("On the engine: a shared system prompt, the cache off and on")
    st.markdown("Two requests share a system prompt and differ in their question; the second arrives after the first "
                "finished. With the prefix cache on, the second finds the shared full blocks already computed.")
    c = st.columns(2)
    system = int_field("System prompt (tokens)", 64, 1, 1024, key="prefix.system_len", where=c[0])
    question = int_field("Question (tokens)", 8, 1, 256, key="prefix.question_len", where=c[1])
    if None in (system, question):
        return
    runs = measured_run(
        "prefix-cache run", (model.source, system, question),
        lambda: [prefix_cache_run(model, system, question, prefix_caching=on) for on in (False, True)],
        model=model, tokens=system + question + 8, sequences=2, button="Run both", button_key="prefix.run",
        spinner="Serving the two requests twice …",
        hint="Press Run to serve the second request without and with the prefix cache.")
    if runs is None:
        return
    df = pd.DataFrame(runs)
    df.insert(0, "cache", ["off", "on"])
    fig = go.Figure([go.Bar(x=df["cache"], y=df["prefill_tokens"], name="prompt tokens computed",
                            text=df["prefill_tokens"]),
                     go.Bar(x=df["cache"], y=df["cached_tokens"], name="served from cached blocks",
                            text=df["cached_tokens"])])
    fig.update_layout(barmode="stack")
    st.plotly_chart(style(fig, "The second request's prompt", "prefix cache", "tokens", height=360),
                    key="prefix.engine_bars")
    df_with_download(df, "prefix_cache_engine", column_config={"ttft_ms": st.column_config.NumberColumn(
        format="%.1f")})
    st.caption("Only full blocks are shared (blocks are keyed by a hash of their tokens and of every token before "
               "them); the prompt's last token is always computed, since its logits give the first reply token. "
               "The engine's tests check that the cached run's logits equal the recomputed ones. Random token ids "
               "stand in for the text: the content does not change the timing. Measured on this machine.")


def main() -> None:
    """The arithmetic's chart under the title (a projector's first screen at 1366×768); the intro and the world's
    notes under it, then the engine's measurement."""
    setup_page("Prefix caching", icon=":material/cached:")
    st.title("Prefix caching")
    top = st.container()
    st.markdown(
        "Many requests start with the same words: a system prompt, a document, the start of a conversation. "
        "Because attention is causal, the keys and values of those words depend on nothing after them, so they "
        "come out identical every time. Keep them, and each new request only prefills what is new.")
    model = step_model_inputs()           # the sidebar; its notes on the world go under the chart
    if model is not None:
        with top:
            theory(model)
    engine_model = model_picker()
    if engine_model is not None:
        measured(engine_model)


main()
