"""Chunked prefill: a long prompt arriving among decoding streams stalls them for its whole prefill, unless it is
split into chunks that ride along with ordinary decode steps. Theory (the stall and the chunked worst gap),
the simulator's token gaps with and without chunks, and the engine's measured ITL.

Numbers: `calculators.serving.queueing` (prefill_stall, chunked_prefill) on `calculators.serving.batching.StepModel`,
`calculators.serving.serving_sim.simulate_continuous` (chunk_tokens); measured: `engine.serve.serving_runs.chunked_prefill_run`.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.serving.queueing import chunked_prefill, prefill_stall
from calculators.serving.batching import batch_row
from calculators.serving.serving_sim import prefill_stall_runs
from calculators.units import fmt_num
from engine.serve.serving_runs import chunked_prefill_repeats
from engine.threads import measured_under_load
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, model_picker, setup_page, show_error
from ui.serving import measured_run, remembered, step_model_inputs, style
from ui.narration import busy_notice, chunk_measured_words, chunk_words

REPEATS = 3                          # each engine case is run this many times, interleaved; medians shown


def theory(model) -> None:
    st.subheader("The stall, and what chunks do to it")
    c = st.columns(4)
    streams = int_field("Streams decoding", 32, 1, 100_000, key="chunked.streams", where=c[0])
    ctx = int_field("Their context (tokens)", 300, 1, 10_000_000, key="chunked.ctx", where=c[1])
    prompt = int_field("Long prompt (tokens)", 2000, 1, 10_000_000, key="chunked.prompt", where=c[2])
    chunk = int_field("Chunk (tokens)", 512, 1, 10_000_000, key="chunked.chunk", where=c[3])
    if None in (streams, ctx, prompt, chunk):
        return
    try:
        step = batch_row(model, streams, ctx)["step_ms"]
        pre = model.prefill_ms(prompt)
        stall = prefill_stall(pre, step, streams)
        ch = chunked_prefill(pre, prompt, chunk, step)
    except SpecError as e:
        show_error(e)
        return
    try:
        cases = remembered("chunked.sim", (model, streams, ctx, prompt, chunk),
                           lambda: prefill_stall_runs(model, streams, ctx, prompt, chunk))
    except SpecError as e:
        show_error(e)
        return
    whole, chunked = (case["row"] for case in cases.values())
    step_chart(cases, streams, prompt)
    c = st.columns(3)
    c[0].metric("Normal decode step", f"{fmt_num(step, 3)} ms")
    c[1].metric("Worst token gap, whole prefill", f"{fmt_num(whole['itl_max_ms'], 3)} ms",
                delta=f"{fmt_num(whole['itl_max_ms'] / step, 3)}× the normal step", delta_color="off",
                delta_arrow="off", help=f"Simulated (the table below). Linear estimate: {fmt_num(stall['stalled_itl_ms'], 3)} ms.")
    c[2].metric(f"Worst token gap, {chunk:,}-token chunks", f"{fmt_num(chunked['itl_max_ms'], 3)} ms",
                delta=f"{fmt_num(chunked['itl_max_ms'] / step, 3)}×, over {ch['chunks']:,} steps", delta_color="off",
                delta_arrow="off", help=f"Simulated (the table below). Linear bound: {fmt_num(ch['worst_itl_ms'], 3)} ms.")
    st.markdown(chunk_words(step, whole["itl_max_ms"], chunked["itl_max_ms"], ch["worst_itl_ms"], chunk))
    formula_expander("The arithmetic", (
        f"Decode step ({streams:,} streams at {ctx:,} tokens) = {fmt_num(step, 4)} ms and a {prompt:,}-token "
        f"prefill = {fmt_num(pre, 4)} ms, both from the step model (`batching.StepModel`).\n\n"
        f"**Whole prefill** (`queueing.prefill_stall`): every stream waits the prefill, spike = prefill ÷ step = "
        f"{fmt_num(stall['spike_ratio'], 4)}×.\n\n"
        f"**Chunked** (`queueing.chunked_prefill`): ⌈{prompt:,} ÷ {chunk:,}⌉ = {ch['chunks']:,} chunks of "
        f"{fmt_num(ch['chunk_ms'], 4)} ms, each added to one decode step: worst gap = step + chunk = "
        f"{fmt_num(ch['worst_itl_ms'], 4)} ms. In this linear model TTFT = {fmt_num(ch['ttft_ms'], 4)} ms "
        "(the chunks' steps plus the prefill). 003 Detail 21: a ≈ 50 ms prefill among 32 streams at 1.55 ms is "
        "a ≈ 30× spike."))
    simulated(cases, streams, prompt)



def step_chart(cases: dict, streams: int, prompt: int) -> None:
    """The simulated step times, whole prefill against chunks: the lesson's chart, right under its inputs."""
    fig = go.Figure()
    for label, case in cases.items():
        fig.add_scatter(y=case["result"].itl_ms, mode="lines+markers", name=label)
    st.plotly_chart(style(fig, f"Step times while {streams:,} streams decode and a {prompt:,}-token prompt "
                          "arrives", "step", "ms until the next token", height=420), key="chunked.sim_fig")


def simulated(cases: dict, streams: int, prompt: int) -> None:
    st.subheader("Simulated")
    rows = [case["row"] for case in cases.values()]
    df_with_download(pd.DataFrame(rows), "chunked_prefill_simulated", column_config={
        k: st.column_config.NumberColumn(format="%.4g") for k in rows[0] if k.endswith("_ms")})
    st.caption("The streams' own prompts are prefilled first (in chunks too, in the chunked run); the long prompt "
               "arrives ten steps after the last of them decodes. Its TTFT is measured from its arrival. The simulator "
               "takes each step as the larger of its memory and compute time, so a chunk small enough to fit in "
               "the compute a decode step leaves idle costs the streams nothing: the linear estimate above, which "
               "adds the chunk's share of the prefill to the step, is the pessimistic bound.")


def measured(model) -> None:
    st.subheader("On the engine")
    c = st.columns(4)
    n_dec = int_field("Decoding requests", 2, 1, 8, key="chunked.n_dec", where=c[0])
    long = int_field("Long prompt (tokens)", 64, 2, 2048, key="chunked.long", where=c[1])
    chunk = int_field("Chunk (tokens)", 16, 1, 2048, key="chunked.engine_chunk", where=c[2])
    new = int_field("Tokens per decoding request", 8, 4, 64, key="chunked.new", where=c[3])
    if None in (n_dec, long, chunk, new):
        return
    out = measured_run(
        "chunked-prefill run", (model.source, n_dec, long, chunk, new),
        lambda: measured_under_load(lambda: chunked_prefill_repeats(model, long, chunk, decoders=n_dec,
                                                                    new_tokens=new, repeats=REPEATS),
                                    matrices=model.weight_matrices),
        model=model, tokens=long + new, sequences=n_dec + 1, button="Run both", button_key="chunked.run",
        spinner="Running with and without chunks …",
        hint="Press Run: the decoding requests start, then the long prompt arrives.")
    if out is None:
        return
    runs, load = out
    notice = busy_notice(load.others, load.cores, max(r["itl_max_spread"] for r in runs))
    if notice:
        st.warning(notice, icon=":material/warning:")
    df = pd.DataFrame(runs)
    df.insert(0, "prefill", ["whole", f"chunks of {chunk}"])
    fig = go.Figure([go.Bar(x=df["prefill"], y=df[col], name=label) for col, label in (
        ("itl_max_ms", "decoders' worst gap"), ("itl_p50_ms", "decoders' median gap"),
        ("long_prompt_ttft_ms", "long prompt's TTFT"))])
    fig.update_layout(barmode="group")
    st.plotly_chart(style(fig, f"Measured on the engine (median of {REPEATS} runs each)", "long prompt prefilled",
                          "ms", height=380), key="chunked.engine_fig")
    st.markdown(chunk_measured_words(runs[0], runs[1], chunk, notice is not None))
    df_with_download(df.drop(columns=["chunk_size"]), "chunked_prefill_engine", column_config={
        k: st.column_config.NumberColumn(format="%.4g") for k in df.columns if k.endswith("_ms")}, show={
        "prefill": None, "itl_max_ms": "worst gap (ms)", "itl_p50_ms": "median gap (ms)",
        "long_prompt_ttft_ms": "long TTFT (ms)", "itl_max_spread": "worst-gap spread", "itl_p99_ms": "p99 gap (ms)",
        "forward_tokens": "forward tokens", "padded_tokens": "padded tokens", "long_prompt_len": "long prompt"})
    st.caption(f"Measured on this machine (NumPy), each case {REPEATS} times, interleaved; the table shows the "
               "medians and, as the worst-gap spread (`itl_max_spread` in the CSV), how far the worst gap moved "
               "between repeats. The engine's tests "
               "check that chunking leaves every request's tokens unchanged.")


def main() -> None:
    """The stall's inputs and the simulated step times under the title (a projector's first screen at 1366×768);
    the intro and the world's notes after that section, then the engine's measurement."""
    setup_page("Chunked prefill", icon=":material/splitscreen:")
    st.title("Chunked prefill")
    top = st.container()
    st.markdown(
        "Prefill is a big, compute-heavy step; decode steps are small and bandwidth-bound. When a long prompt "
        "joins a running batch in one piece, every stream waits for it and its users see the reply stutter. "
        "Splitting the prompt into chunks, one per step alongside the normal decode tokens, turns one long "
        "freeze into several small bumps, at the price of a slightly later first token for the newcomer.")
    model = step_model_inputs()           # the sidebar; its notes on the world go under the chart
    if model is not None:
        with top:
            theory(model)
    engine_model = model_picker()
    if engine_model is not None:
        measured(engine_model)


main()
