"""Paged KV cache: a request's cache in fixed-size blocks found through a block table; the engine's live block
tables step by step; and the same request stream under reserve-for-max, contiguous and paged allocation.

Numbers: `calculators.serving.paging` / `calculators.explain.explain_paging` (blocks, empty slots, logical block),
`calculators.serving.kv_allocation` (the allocation simulator); live: the engine's `Scheduler` (block tables, free list).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.explain import explain_paging
from calculators.serving.kv_allocation import POLICIES, compare_allocators
from calculators.serving.paging import logical_block, max_empty_slots
from calculators.units import fmt_bytes
from engine import Scheduler
from engine.errors import ModelError
from engine.serve.scheduler import DEFAULT_POOL_BYTES, pool_bytes
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, model_picker, setup_page, show_error
from ui.generation import prompt_ids
from ui.server import heavy_job
from ui.serving import (block_table_rows, pool_figure, pool_owners, remembered, step_model_inputs, style,
                        folded_workload_inputs, workload_key)
from ui.narration import allocator_words, scheduler_step_words

LIVE_KEY = "paged.live"                       # per session: (model source, Scheduler, [StepReport])
DEFAULT_PROMPTS = "Write a poem about the sea\nExplain gravity to a child\nHello"
POLICY_COLORS = {"reserve": "#e45756", "contiguous": "#f58518", "paged": "#4c78a8"}
POLICY_WIDTHS = {"reserve": 2, "contiguous": 7, "paged": 2}     # contiguous drawn wide: it shows under paged


def worked_example() -> None:
    st.subheader("One request, in blocks")
    c = st.columns(3)
    n = int_field("Tokens in the cache", 50, 0, 10_000_000, key="paged.n", where=c[0])
    b = int_field("Block size (tokens)", 16, 1, 4096, key="paged.b", where=c[1])
    i = int_field("Look up token number", 35, 0, 10_000_000, key="paged.i", where=c[2])
    if None in (n, b, i):
        return
    try:
        blocks, empty = explain_paging(n, b)
        blk, off = logical_block(i, b)
    except SpecError as e:
        show_error(e)
        return
    c = st.columns(3)
    c[0].metric("Blocks", f"{blocks.value:,.0f}")
    c[1].metric("Empty slots in the last block", f"{empty.value:,.0f}", help=f"never more than {max_empty_slots(b)}")
    c[2].metric(f"Token {i:,} lives in logical block, slot", f"{blk:,}, {off:,}")
    formula_expander("The arithmetic", f"**blocks** `{blocks.symbolic}`: {blocks.formula}\n\n"
                     f"**empty slots** `{empty.symbolic}`: {empty.formula}\n\n"
                     f"**token {i:,}**: logical block = ⌊{i:,} / {b:,}⌋ = {blk:,}, "
                     f"slot = {i:,} mod {b:,} = {off:,}; "
                     "the block table turns the logical block into a physical one (003 Detail 16).")


def live(model) -> None:
    st.subheader("Live: the engine's block tables")
    st.markdown("Submit a few prompts to a scheduler with a small pool, then step it. Each running request owns "
                "the blocks listed in its table, taken from the free list one at a time as it grows; a finished "
                "request gives them all back.")
    text = st.text_area("Prompts, one per line", DEFAULT_PROMPTS, key="paged.prompts", height=100)
    c = st.columns(4)
    block = int_field("Block size", 4, 1, 256, key="paged.block", where=c[0])
    blocks = int_field("Blocks in the pool", 48, 1, 4096, key="paged.blocks", where=c[1])
    new = int_field("New tokens each", 6, 1, 128, key="paged.new", where=c[2])
    slots = int_field("Max batch", 2, 1, 32, key="paged.slots", where=c[3])
    c = st.columns(3)
    start = c[0].button("Start", key="paged.start", type="primary", icon=":material/restart_alt:")
    step = c[1].button("Step", key="paged.step", icon=":material/skip_next:")
    finish = c[2].button("Run to the end", key="paged.finish", icon=":material/fast_forward:")
    if start:
        prompts = [p for p in text.splitlines() if p.strip()]
        if None in (block, blocks, new, slots) or not prompts:
            show_error("Give at least one prompt and valid sizes.")
            return
        need = pool_bytes(model.config, block, blocks)
        if need > DEFAULT_POOL_BYTES:
            show_error(f"A pool of {blocks:,} blocks of {block:,} tokens is {fmt_bytes(need)} of K/V on {model.name}; "
                       f"this lesson allows up to {fmt_bytes(DEFAULT_POOL_BYTES)} per visitor: use fewer or smaller "
                       "blocks.")
            return
        try:                                   # the pool is allocated in the heavy-job line (memory checked first)
            with heavy_job("the paged-cache pool", need):
                sched = Scheduler(model, block_size=block, num_blocks=blocks, max_batch=slots)
            for k, p in enumerate(prompts):
                sched.submit(prompt_ids(model, p, use_chat=True), max_new_tokens=new, stop_at_eos=False, request_id=f"R{k}")
        except (ModelError, SpecError) as e:
            show_error(e)
            return
        st.session_state[LIVE_KEY] = (model.source, sched, [], {})
        step = True                            # Start also runs step 1: the first prompts take their blocks at once
    state = st.session_state.get(LIVE_KEY)
    if state is None or state[0] != model.source:
        st.info("Press Start to submit the prompts.")
        return
    _, sched, reports, fullest = state
    try:
        if (step or finish) and sched.has_work:
            with heavy_job("the paged-cache run", pool_bytes(model.config, sched.block_size, sched.num_blocks)):
                with st.spinner("Running …"):
                    while sched.has_work:             # one step, or every step to the end
                        reports.append(sched.step())
                        owners = pool_owners(sched)
                        if sum(map(bool, owners)) > sum(map(bool, fullest.get("owners", []))):
                            fullest.update(step=reports[-1].step, owners=owners)   # the pool at its fullest
                        if step:
                            break
    except (ModelError, SpecError) as e:
        show_error(e)
    c = st.columns(3)
    c[0].metric("Steps run", f"{len(reports):,}")
    c[1].metric("Free blocks", f"{sched.free_blocks:,} of {sched.num_blocks:,}")
    c[2].metric("Requests running / waiting", f"{len(sched.running)} / {len(sched.waiting)}")
    rows = block_table_rows(sched)
    if rows or not fullest:
        st.plotly_chart(pool_figure(pool_owners(sched), "Physical blocks: owner of each"), key="paged.pool")
        st.caption("Light grey: a free block. Each colour: the request whose block table lists that block.")
    else:                                     # all finished: the pool is all free, so show it at its fullest
        st.success(f"Every request finished and gave its blocks back: all {sched.num_blocks:,} blocks are back on "
                   "the free list. Below, the pool at its fullest, for the record.")
        used = sum(map(bool, fullest["owners"]))
        st.plotly_chart(pool_figure(fullest["owners"], f"Physical blocks after step {fullest['step']:,}, the "
                                    f"fullest ({used:,} of {sched.num_blocks:,} in use)"), key="paged.pool")
        st.caption("Light grey: a block free at that step. Each colour: the request whose block table listed it.")
    if rows:
        df_with_download(pd.DataFrame(rows), "block_tables")
    if reports:
        st.caption(scheduler_step_words(reports[-1]))


def simulated(model) -> None:
    """The allocators' inputs and their memory over time first (the page's first screen at 1366×768), what they
    do and the rest under it."""
    st.subheader("Simulated: three allocators, one request stream")
    w = folded_workload_inputs("alloc", n=200, rate=20.0, prompt=200, output=150)
    c = st.columns(4)
    pool = int_field("KV pool (tokens)", 12_000, 1, 10_000_000, key="alloc.pool", where=c[0])
    bs = int_field("Block size", 16, 1, 4096, key="alloc.block", where=c[1])
    mt = int_field("Reservation per request (tokens)", 2048, 1, 10_000_000, key="alloc.max", where=c[2])
    grow = int_field("Contiguous growth step", 16, 1, 100_000, key="alloc.grow", where=c[3])
    if w is None or None in (pool, bs, mt, grow):
        return
    step_s = model.decode_step_ms(1, 0) / 1e3
    try:
        res = remembered("alloc", (workload_key(w), pool, bs, mt, grow, step_s),
                         lambda: compare_allocators(w, pool, step_s=step_s, block_size=bs, max_tokens=mt,
                                                    grow_tokens=grow))
    except SpecError as e:
        show_error(e)
        return
    rows = [res[p].summary(model.kv_bytes_per_token) for p in POLICIES]
    fig = go.Figure()
    for p in POLICIES:
        t = res[p].timeline
        fig.add_scatter(x=t["step"], y=t["allocated"], name=f"{p}: allocated",
                        line=dict(color=POLICY_COLORS[p], width=POLICY_WIDTHS[p]))
        fig.add_scatter(x=t["step"], y=t["used"], name=f"{p}: holding tokens",
                        line=dict(color=POLICY_COLORS[p], dash="dot"))
    fig.add_hline(y=pool, line_dash="dash", line_color="gray", annotation_text="pool", annotation_font_size=14)
    st.plotly_chart(style(fig, "KV memory over time: allocated (solid) vs actually holding tokens (dotted)",
                          "step", "token positions", height=460), key="alloc.memory")
    st.caption(f"Pool: {pool:,} positions = {fmt_bytes(rows[0]['capacity_bytes'])} at "
               f"{fmt_bytes(model.kv_bytes_per_token)} per token ({model.name}). One step = one decode step.")
    st.markdown("Reserve-for-max locks a full context per request. Contiguous growth packs requests tightly but "
                "leaves holes; a request that cannot grow in place is copied, or preempted when no hole fits. "
                "Paging hands out blocks from anywhere.")
    fig = go.Figure([go.Scatter(x=res[p].timeline["step"], y=res[p].timeline["running"], name=p,
                                line=dict(color=POLICY_COLORS[p], width=POLICY_WIDTHS[p])) for p in POLICIES])
    st.plotly_chart(style(fig, "Requests running at once", "step", "batch", height=360), key="alloc.batch")
    df_with_download(pd.DataFrame(rows), "kv_allocation_summary", column_config={
        k: st.column_config.NumberColumn(format="≈ %.0f" if k == "mean_batch" else "%.4g")     # a batch: whole
        for k in rows[0] if isinstance(rows[0][k], float)},
        show={"policy": None, "completed": "done", "mean_batch": "mean batch", "max_batch": "max batch",  # 1366 px
              "mean_waste_fraction": "waste", "mean_utilization": "utilisation", "preemptions": None,
              "relocations": None, "refused_by_fragmentation": "refused: holes", "mean_wait_steps": "wait (steps)"})
    st.markdown(allocator_words({r["policy"]: r for r in rows}))


def main() -> None:
    """The three allocators, simulated, under the title (a projector's first screen at 1366×768: their chart
    whether or not the live run was started); the intro, the worked example, the world's notes and the engine's
    live block tables under them."""
    setup_page("Paged KV cache", icon=":material/grid_view:")
    st.title("Paged KV cache")
    top = st.container()
    st.markdown(
        "Every running request needs room for its keys and values, and that room grows one token at a time by "
        "amounts nobody knows in advance. Giving each request one contiguous slab either wastes the unused tail "
        "or breaks free memory into holes. Paging splits the cache into small equal blocks and keeps, per "
        "request, a table of where its blocks are: waste shrinks to the unfilled end of one block.")
    model = step_model_inputs()           # the sidebar; its notes on the world go under the chart
    if model is not None:
        with top:
            simulated(model)
    worked_example()
    engine_model = model_picker()
    if engine_model is not None:
        live(engine_model)


main()
