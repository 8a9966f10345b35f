"""Continuous batching: static and continuous batching simulated on the same arrivals (slot timelines, padding,
throughput, TTFT/ITL percentiles), then a real run of several prompts through the engine's Scheduler.

Numbers: `calculators.serving.serving_sim` (simulate, SimResult.summary/gantt, explain_summary), `calculators.serving.workload`;
measured: the engine's `Scheduler` (`ui.serving.serve_prompts`, `engine.serve.scheduler.step_timeline`).
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from calculators.serving.serving_sim import explain_summary, simulate
from calculators.serving.slo import suggested_rate_for
from calculators.units import fmt_num
from specs.model_config import SpecError
from ui import df_with_download, float_field, formula_expander, int_field, model_picker, setup_page, show_error
from ui.generation import prompt_ids
from ui.serving import (engine_gantt, gantt_figure, measured_run, remembered, serve_prompts,
                        step_model_inputs, folded_workload_inputs, workload_key)

POLICIES = ("static", "continuous")
SUMMARY_ROWS = (("throughput_tok_s", "throughput (tokens/s)"), ("throughput_req_s", "requests/s"),
                ("utilization", "busy fraction"), ("mean_batch", "mean batch"),
                ("padding_waste", "padding waste (slot-steps)"), ("ttft_p50_ms", "TTFT p50 (ms)"),
                ("ttft_p99_ms", "TTFT p99 (ms)"), ("itl_p50_ms", "ITL p50 (ms)"), ("itl_p99_ms", "ITL p99 (ms)"),
                ("latency_p50_ms", "latency p50 (ms)"), ("latency_p99_ms", "latency p99 (ms)"))
DEFAULT_PROMPTS = "Write a poem\nExplain gravity\nHello\nName three colours"
PROMPT, OUTPUT, SLOTS = 200, 128, 16          # the simulated stream's defaults (its rate is suggested from them)


def summary_text(key: str, value: float) -> str:
    """One cell of the summary as the page writes it: a mean batch as the whole batch it is close to ("≈ 39"),
    every other number to 3 significant digits with thousands separators ("1,700")."""
    return f"≈ {round(value):,}" if key == "mean_batch" else fmt_num(value, 3)


def simulated(model, first) -> None:
    """The inputs, both timelines and the three numbers in `first` (the page's first screen); the table and the
    arithmetic where the page is."""
    with first:
        st.subheader("Simulated: the same arrivals, two schedulers")
        hint = remembered("cb.rate_hint", (model,), lambda: suggested_rate_for(model, PROMPT, OUTPUT, SLOTS))  # ~0.4 s
        w = folded_workload_inputs("cb", n=400, rate=hint, prompt=PROMPT, output=OUTPUT, scale=model.name)
        c = st.columns(3)
        cap = int_field("Batch slots", SLOTS, 1, 4096, key="cb.slots", where=c[0])
        timeout = float_field("Static: wait to fill a batch (s)", 0.0, 0.0, 3600.0, key="cb.timeout", where=c[1],
                              help="0 = start with whatever is waiting when the accelerator frees up.")
        shown = int_field("Requests in the timeline", 30, 1, 300, key="cb.shown", where=c[2])
        if w is None or None in (cap, timeout, shown):
            return
        try:
            runs = {p: remembered("cb.sim", (model, workload_key(w), p, cap, timeout),
                                  lambda p=p: simulate(model, w, p, cap, batch_timeout_s=timeout)) for p in POLICIES}
        except SpecError as e:
            show_error(e)
            return
        sums = {p: r.summary() for p, r in runs.items()}
        for p in POLICIES:
            st.plotly_chart(gantt_figure(runs[p].gantt(shown), f"{p.capitalize()} batching: first {shown} requests "
                                         f"({cap} slots)"), key=f"cb.gantt.{p}")
        c = st.columns(3)
        c[0].metric("Throughput, continuous", f"{fmt_num(sums['continuous']['throughput_tok_s'], 3)} tok/s",
                    delta=f"static {fmt_num(sums['static']['throughput_tok_s'], 3)} tok/s", delta_color="off",
                    delta_arrow="off")
        c[1].metric("TTFT p99, continuous", f"{fmt_num(sums['continuous']['ttft_p99_ms'], 4)} ms",
                    delta=f"static {fmt_num(sums['static']['ttft_p99_ms'], 4)} ms", delta_color="off",
                    delta_arrow="off")
        c[2].metric("Padding in static batches", f"{fmt_num(100 * sums['static']['padding_waste'], 3)}%",
                    help="Slot-steps spent on requests that had already finished, waiting for the longest one.")
    st.caption(f"{w.source}. Orange = prefill, blue = decode, red = padding (a finished request still holding its "
               "slot in a static batch). Step times from the ideal step model in the sidebar.")
    table = pd.DataFrame({"metric": [label for _, label in SUMMARY_ROWS],
                          **{p: [sums[p][k] for k, _ in SUMMARY_ROWS] for p in POLICIES}})
    df_with_download(table, "static_vs_continuous", drawn=table.assign(**{
        p: [summary_text(k, sums[p][k]) for k, _ in SUMMARY_ROWS] for p in POLICIES}))
    formula_expander("The arithmetic", "\n\n".join(
        f"**{p}, {e.name}** `{e.symbolic}`: {e.formula}" for p in POLICIES for e in explain_summary(runs[p])) +
        "\n\nPercentiles are taken over requests (TTFT, latency) or over every token gap, weighted by the streams "
        "that waited it (ITL).")
    with st.expander("Every request (CSV)"):
        df_with_download(pd.DataFrame(runs["continuous"].requests_table()), "continuous_requests")
        df_with_download(pd.DataFrame(runs["static"].requests_table()), "static_requests")


def measured(model) -> None:
    st.subheader("On the engine: several prompts through the scheduler")
    st.markdown("The engine's scheduler runs the prompts below with only a few slots. Each step is ONE forward pass "
                "over every running request: a prompt for a newcomer, one token for the others. A finished request "
                "leaves at once and the next waiting one takes its slot.")
    text = st.text_area("Prompts, one per line", DEFAULT_PROMPTS, key="cb.prompts", height=120)
    c = st.columns(3)
    lengths = c[0].text_input("New tokens per prompt (comma-separated)", "6, 12, 3, 8", key="cb.lengths")
    slots = int_field("Slots (max batch)", 2, 1, 16, key="cb.engine_slots", where=c[1])
    block = int_field("Block size", 16, 1, 256, key="cb.block", where=c[2])
    prompts = [p for p in text.splitlines() if p.strip()]
    try:
        news = [int(x) for x in lengths.replace(" ", "").split(",") if x]
    except ValueError:
        show_error(f"New tokens per prompt: expected whole numbers separated by commas, got {lengths!r}.")
        return
    if not prompts:
        show_error("Type at least one prompt.")
        return
    if len(news) != len(prompts):
        show_error(f"Give one token count per prompt: {len(prompts)} prompts, {len(news)} counts.")
        return
    if None in (slots, block):
        return
    try:
        ids = [prompt_ids(model, p, use_chat=True) for p in prompts]      # the chat format, as on the home page
    except SpecError as e:
        show_error(e)
        return
    run = measured_run(
        "scheduler run", (model.source, tuple(prompts), tuple(news), block, slots),
        lambda: serve_prompts(model, ids, news, block_size=block, max_batch=slots),
        model=model, tokens=max(len(i) + n for i, n in zip(ids, news)), sequences=len(ids),
        button="Run on the engine", button_key="cb.run", spinner="Running the scheduler …",
        hint="Press Run to serve these prompts on the loaded model.")
    if run is None:
        return
    reqs, reports = run
    rows = engine_gantt(reports)
    st.plotly_chart(gantt_figure(rows, f"Engine: {len(reqs)} requests, {slots} slots (measured seconds)"),
                    key="cb.engine_gantt")
    st.plotly_chart(gantt_figure(rows, "The same run by step", x_title="step", start="start_step",
                                 length="steps"), key="cb.engine_steps")
    tok = model.tokenizer
    df_with_download(pd.DataFrame([dict(request=r.request_id, prompt_tokens=len(r.prompt_ids),
                                        generated=len(r.token_ids), finish=r.finish_reason,
                                        ttft_ms=None if r.ttft_s is None else 1e3 * r.ttft_s,
                                        reply=tok.decode(r.token_ids) if tok else " ".join(map(str, r.token_ids)))
                                   for r in reqs]), "engine_requests")
    df_with_download(pd.DataFrame([dict(step=r.step, admitted=" ".join(r.admitted),
                                        prefilled=" ".join(f"{k}:{v}" for k, v in r.prefilled.items()),
                                        decoded=" ".join(r.decoded), finished=" ".join(r.finished),
                                        seconds=r.seconds, blocks_used=r.blocks_used) for r in reports]),
                     "engine_steps")
    st.caption("Each request's tokens equal the same request run alone (greedy): the engine's tests check it.")


def main() -> None:
    """The simulation's inputs, its two timelines and numbers first (a projector's first screen at 1366×768); the
    intro and the world's notes under them, then the engine's run."""
    setup_page("Continuous batching", icon=":material/view_timeline:")
    st.title("Continuous batching")
    top = st.container()
    st.markdown(
        "A static batch starts together and ends together: short replies sit in their slot as padding until the "
        "longest is done, and a request arriving meanwhile waits for the whole batch. Continuous (in-flight) "
        "batching re-forms the batch at every step: a finished request leaves at once and a waiting one takes "
        "its slot after its prefill. Above, both serve the very same arrivals.")
    model = step_model_inputs()
    if model is not None:
        simulated(model, top)
    engine_model = model_picker()
    if engine_model is not None:
        measured(engine_model)


main()
