"""Parallelism: tensor, pipeline, context and expert parallelism, each with the numbers that say what it buys and
what it costs, and a sharding view of one layer on any device mesh.

Numbers: `calculators.planning.parallel_step` (tp_step_scaling, pp_step_scaling: the step `python -m calculators
latency --tp/--pp` prices), `calculators.multi_gpu.tensor_parallel` (per-GPU memory, fit verdict),
`calculators.multi_gpu.pipeline` (bubble_table), `calculators.multi_gpu.parallel` (context_parallel_kv, ring_attention, expert_parallel),
`calculators.multi_gpu.sharding` (layer_sharding), `calculators.multi_gpu.mesh2d` (the Galaxy: 001's 8 × 4 mesh).
"""
from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators import arch
from calculators.claims import tp_gain_claim
from calculators.explain import explain_context_parallel_kv
from calculators.multi_gpu.parallel import context_parallel_kv, expert_parallel, ring_allreduce_ms, ring_attention
from calculators.multi_gpu.pipeline import bubble_table
from calculators.multi_gpu.mesh2d import (check_layout, galaxy_plan, layer_collectives, per_axis_summary,
                                          reference_001_check, weight_shards)
from calculators.multi_gpu.sharding import layer_sharding
from calculators.planning import step as one_step
from calculators.planning.measured_step import default_profile_choice
from calculators.planning.rank_wait import busiest_rank_claim, busiest_rank_prompts
from calculators.planning.parallel_step import (decode_step_segments, latency_flags, pp_step_scaling,
                                                segment_labels, tp_step_scaling)
from calculators.planning.request_latency import default_pricing
from calculators.planning.step import pricing_words
from calculators.units import (GB, KV_DTYPES, WEIGHT_DTYPES, bytes_per_element, default_kv_dtype, fmt_bytes,
                               fmt_num)
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError
from specs.presets import load_preset
from specs.topologies import list_topologies, load_topology
from ui import df_with_download, formula_expander, int_field, setup_page, show_error
from ui.model_source import choice_field
from ui.model_source import sizing_with_gpus
from ui.world import DATACENTRE
from ui.multi_gpu import MultiGPU, fitting_weight_dtype, show_fit_verdict
from ui.charts import style as chart_style
from ui.metrics import metric_row

TPS = (1, 2, 4, 8, 16)
PPS = (1, 2, 4, 8)
PART_COLORS = dict(memory_ms="#4C78A8", compute_ms="#54A24B", gemm_ms="#4C78A8", attention_ms="#72B7B2",
                   other_kernels_ms="#54A24B", allreduce_ms="#E45756", host_ms="#9D755D", p2p_ms="#B279A2")


def tp_section(config: ModelConfig, device: Device, setup: MultiGPU, ctx: int, batch: int, wd: str, kd: str,
               priced: tuple, first=None) -> None:
    """The heading and the decode step by TP degree in `first` (the page's first screen); why, the table and the
    formulas here. `priced`: (profile or None, what priced it), the sidebar's measured-kernels switch."""
    first = first if first is not None else st.container()
    first.subheader("Tensor parallelism: every GPU reads a slice of every layer")
    st.markdown("Splitting each weight matrix over several GPUs lets them stream their slices at the same time, so "
                "the memory time of a decode step falls with the TP degree. The price is two all-reduces per "
                "layer, and each one costs a fixed few microseconds however small the message; the host's work per "
                "step does not shrink at all.")
    profile, pricing = priced
    rows = tp_step_scaling(config, device, TPS, ctx, batch, wd, kd, setup.link, profile=profile,
                           **setup.memory_kw())
    ok = [r for r in rows if r["problem"] is None]
    for r in rows:
        if r["problem"]:
            st.caption(f"TP {r['tp']}: {r['problem']}")
    if not ok:
        return
    fig = go.Figure()
    for key, name in segment_labels(ok[0]["segments"]):
        if any(r["segments"][key] > 0 for r in ok):
            fig.add_bar(x=[f"TP {r['tp']}" for r in ok], y=[r["segments"][key] for r in ok], name=name,
                        marker_color=PART_COLORS[key], text=[fmt_num(r["segments"][key], 3) for r in ok],
                        textposition="inside")
    fig.update_layout(barmode="stack", height=400, yaxis_title="ms per decode step (the ITL)",
                      title=f"Decode step of {config.name} by TP degree ({setup.link.name if setup.link else 'no link'})",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.2))
    first.plotly_chart(chart_style(fig))
    first.markdown(tp_gain_claim(ok))
    st.caption(f"Each bar is the ITL `python -m calculators latency {latency_flags(ctx, batch, wd, kd, 'tp')}` "
               f"reports (the step after a {ctx:,}-token context, {ok[0]['stack']}), cut into the "
               "parts it adds up: where compute outlasts the reads, only the excess is drawn. Priced from "
               f"{pricing if profile is not None else pricing_words(None)}.")
    df = pd.DataFrame({"TP": [r["tp"] for r in ok],
                       "weights per GPU (GB)": [r["per_gpu_weight_bytes"] / GB for r in ok],
                       "KV per GPU (GB)": [r["per_gpu_kv_bytes"] / GB for r in ok],
                       "every weight read once (ms)": [r["weights_floor_ms"] for r in ok],
                       "all-reduce (ms)": [r["allreduce_ms"] for r in ok], "host (ms)": [r["host_ms"] for r in ok],
                       "ITL (ms)": [r["itl_ms"] for r in ok], "speed-up vs TP 1": [r["speedup"] for r in ok],
                       "fits": [r["fits"] for r in ok]})
    df_with_download(df, "tp_scaling", column_config={c: st.column_config.NumberColumn(format="%.3f")
                                                      for c in df.columns if c not in ("TP", "fits")},
                     show=["TP", "ITL (ms)", "speed-up vs TP 1", "fits", "weights per GPU (GB)", "KV per GPU (GB)",
                           "every weight read once (ms)", "all-reduce (ms)", "host (ms)"])  # the verdict first
    if arch.is_moe(config):
        st.caption(f"{config.name} is a mixture of experts: a decode step reads only the experts its tokens are "
                   "routed to, so its ITL sits well below the time to read every resident weight once (the "
                   "column beside it, which is what memory holds, not what a step reads).")
    formula_expander("Formulas: the decode step by TP degree, its parts, ring all-reduce",
                     "\n\n".join(inspect.getdoc(f) for f in (tp_step_scaling, decode_step_segments, one_step,
                                                              ring_allreduce_ms)))


def pp_section(config: ModelConfig, device: Device, setup: MultiGPU, ctx: int, batch: int, wd: str, kd: str,
               priced: tuple) -> None:
    st.subheader("Pipeline parallelism: more memory, more throughput, no faster reply")
    st.markdown("A pipeline hands each GPU a run of consecutive layers. One request still walks through every "
                "stage in turn, so it is no quicker; the gain is room for a bigger model and, with one sequence per "
                "stage in flight, more tokens per second. Stages wait for each other at the start and end of a "
                "pass: that idle time is the bubble.")
    cols = st.columns(2)
    rows = bubble_table(4)
    df = pd.DataFrame({"microbatches m": [r["microbatches"] for r in rows],
                       "bubble (%)": [r["bubble_percent"] for r in rows]})
    fig = go.Figure(go.Bar(x=[str(m) for m in df["microbatches m"]], y=df["bubble (%)"], marker_color="#F58518",
                           text=[f"{v:.0f}%" for v in df["bubble (%)"]], textposition="outside"))
    fig.update_layout(height=330, xaxis_title="microbatches in flight (4 stages)", xaxis_type="category",
                      yaxis_title="idle share (%)", title="Bubble (p − 1)/(m + p − 1)", margin=dict(l=10, r=10, t=60, b=10))
    cols[0].plotly_chart(chart_style(fig, span=1 / 2))
    profile, pricing = priced
    pr = [r for r in pp_step_scaling(config, device, PPS, ctx, batch, wd, kd, setup.link, profile=profile)
          if r["problem"] is None]
    dfp = pd.DataFrame({"PP": [r["pp"] for r in pr], "layers on busiest stage": [r["stage_layers"] for r in pr],
                        "weights per GPU (GB)": [r["per_gpu_weight_bytes"] / GB for r in pr],
                        "ITL of one request (ms)": [r["single_request_itl_ms"] for r in pr],
                        f"ITL at batch {batch} (ms)": [r["itl_ms"] for r in pr],
                        "tokens/s, one request": [r["tok_s_batch_1"] for r in pr],
                        "tokens/s, one per stage in flight": [r["tok_s_pp_in_flight"] for r in pr],
                        "bubble, one request (%)": [100 * r["bubble_batch_1"] for r in pr]})
    with cols[1]:                                  # the small table beside the chart; the wide one below it
        df_with_download(df, "pipeline_bubble")
    df_with_download(dfp, "pp_scaling", column_config={c: st.column_config.NumberColumn(format="%.3f")
                                                       for c in dfp.columns[2:]}, show=list(dfp.columns))
    st.caption(f"ITLs as `python -m calculators latency {latency_flags(ctx, 1, wd, kd, 'pp')}` reports them "
               f"(--batch 1, then {batch}, and one sequence per stage for the last tokens/s); priced from "
               f"{pricing if profile is not None else pricing_words(None)}.")
    formula_expander("Formulas: bubble and pipelined decode", inspect.getdoc(pp_step_scaling))


def cp_section(config: ModelConfig, setup: MultiGPU, kd: str) -> None:
    st.subheader("Context parallelism: one very long sequence over several GPUs")
    st.markdown("A million-token context holds more KV cache than any GPU. Context parallelism gives each GPU a "
                "block of the sequence and passes the KV blocks around a ring while attention runs. Causal masking "
                "makes late blocks busier than early ones unless the blocks are dealt out in a zig-zag.")
    if arch.is_mla(config) or config.num_kv_heads < 1:
        st.caption("This model caches an MLA latent, not K/V heads; the per-GPU split below uses its K/V heads "
                   "count only for GQA models.")
        return
    cols = st.columns(2)
    tokens = int_field("Context (tokens)", 1_000_000, 1, 1 << 30, key="par.cp.tokens", where=cols[0])
    cp = int_field("CP degree", 8, 1, 1024, key="par.cp.n", where=cols[1])
    if tokens is None or cp is None:
        return
    kv = context_parallel_kv(config.num_layers, config.num_kv_heads, config.head_dim, tokens, kd, cp, setup.mesh.tp)
    metric_row([("KV per layer", fmt_bytes(kv["bytes_per_layer"]), None),
                ("KV, all layers", fmt_bytes(kv["bytes_total"]), None),
                (f"Per GPU (CP {cp} × TP {setup.mesh.tp})", fmt_bytes(kv["bytes_per_device"]),
                 f"KV heads kept {kv['kv_head_copies']:g}× (replicated once TP exceeds the KV heads)"),
                ("Tokens per GPU", f"{kv['tokens_per_device']:,.0f}", None)])
    if setup.link is not None and cp > 1:
        plain = ring_attention(tokens, cp, kv["bytes_per_token_per_device"], setup.link, load_balanced=False)
        st.caption(f"Ring attention: {plain['passes']} passes of {fmt_bytes(plain['block_bytes'])} each "
                   f"({fmt_num(plain['transfer_ms'], 3)} ms on {setup.link.name}, hidden behind compute when it is "
                   f"shorter); a contiguous split leaves the busiest GPU {fmt_num(plain['causal_imbalance'], 3)}× "
                   f"the mean work, a zig-zag split 1×.")
    f = explain_context_parallel_kv(config.num_layers, config.num_kv_heads, config.head_dim, tokens,
                                    bytes_per_element(kd), cp, setup.mesh.tp)
    formula_expander("Formula: context-parallel KV per GPU", f"`{f.symbolic}`\n\n{f.formula}\n\n"
                     f"{inspect.getdoc(context_parallel_kv)}\n\nSource: {f.source}")


def ep_section(config: ModelConfig, setup: MultiGPU) -> None:
    if not arch.is_moe(config):
        return
    st.subheader("Expert parallelism: whole experts per GPU")
    st.markdown("A mixture-of-experts layer sends each token to a few experts. Expert parallelism puts whole "
                "experts on different GPUs and moves the tokens instead, one of two ways. DeepEP-style: one "
                "all-to-all sends each token only to the GPUs holding its experts, one brings the results back. "
                "The default of vLLM, SGLang and TensorRT-LLM on one node: every GPU gathers every token (an "
                "all-gather), runs its own experts on them, and the partial outputs are reduce-scattered back, "
                "more bytes through plain NCCL collectives.")
    ep = int_field("EP degree", min(8, config.num_experts), 1, config.num_experts, key="par.ep")
    tokens = int_field("Tokens on each GPU", 1, 1, 1 << 20, key="par.ep.tokens")
    if ep is None or tokens is None or setup.link is None:
        return
    try:
        e = expert_parallel(config.num_experts, config.num_experts_per_tok, config.hidden_size, tokens, ep, setup.link)
    except SpecError as err:
        show_error(err)
        return
    metric_row([("Experts per GPU", f"{e['experts_per_device']:,}", None),
                ("All-to-all message", fmt_bytes(e["all_to_all_bytes"]), None),
                ("Dispatch + combine per layer (ms)", fmt_num(e["ms_per_layer"], 3), None),
                ("All-gather + reduce-scatter per layer (ms)", fmt_num(e["gather_scatter_ms_per_layer"], 3),
                 None)])
    formula_expander("Formula: expert parallelism", inspect.getdoc(expert_parallel))
    attention_dp_part(ep)


def attention_dp_part(ep: int) -> None:
    """Attention data-parallel beside wide EP: each rank prefills its own new prompts, and the MoE layers make
    every rank wait for the busiest (`rank_wait`)."""
    if ep < 2:
        return
    st.markdown(f"**Attention data-parallel: the busiest rank sets the step.** With the experts over {ep} GPUs, "
                "attention often runs data-parallel: each GPU holds its own requests and their KV cache. A new "
                "request's prompt is prefilled on one rank only, but every MoE layer needs every rank's tokens, "
                "so the whole group waits for the rank with a prompt.")
    mu = np.geomspace(0.01, 1.0, 60)
    fig = go.Figure()
    colors = ["#4C78A8", "#72B7B2", "#F58518", "#E45756", "#54A24B", "#B279A2"]
    for i, d in enumerate(sorted({1, 2, 4, ep} | ({8} if ep >= 8 else set()))):
        fig.add_scatter(x=mu, y=busiest_rank_prompts(mu, d), mode="lines", name="1 rank (the mean)" if d == 1
                        else f"busiest of {d} ranks", line=dict(color=colors[i % len(colors)], width=3,
                                                                dash="dash" if d == 1 else "solid"))
    fig.update_layout(height=380, xaxis=dict(type="log", title="new prompts per rank per step"),
                      yaxis=dict(title="prompts the busiest rank prefills per step"),
                      title="Prompts the slowest rank prefills while the others wait",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.25))
    st.plotly_chart(chart_style(fig))
    st.caption(busiest_rank_claim(0.1, ep) + " The planner and `serve-at` add this wait to a step under a "
               "request rate (`rank_wait_ms`); TensorRT-LLM's attention_dp_config.enable_balance and disaggregated "
               "prefill exist to avoid it (docs/planner-under-load.md).")


def sharding_section(config: ModelConfig, setup: MultiGPU) -> None:
    st.subheader("One layer on a device mesh")
    st.markdown("Lay the GPUs out as a grid. Columns split the heads and the FFN; rows split the hidden dimension, "
                "so each product is a partial sum its column must add up. The table is what ONE device holds and "
                "which collective follows each matmul (Tenstorrent's \"Llama3-70B Galaxy: Prefill Operations "
                "Detailed Report\" runs Llama 3 70B on a 4 × 8 grid).")
    if arch.is_mla(config):
        st.info(f"{config.name} uses multi-head latent attention (MLA): its K and V come out of one compressed "
                "latent shared by every head, so the head-by-head split this view draws does not apply. Pick a "
                "model with ordinary (MHA/GQA) attention to see the mesh.", icon=":material/info:")
        return
    cols = st.columns(3)
    r = int_field("Mesh rows (split D)", 4, 1, 64, key="par.mesh.rows", where=cols[0])
    c = int_field("Mesh columns (split heads, FFN)", 8, 1, 128, key="par.mesh.cols", where=cols[1])
    t = int_field("Tokens (prefill prompt or decode batch)", 2048, 1, 1 << 20, key="par.mesh.tokens", where=cols[2])
    if None in (r, c, t) or setup.link is None:
        return
    try:
        rows = layer_sharding(config, r, c, t, setup.link)
    except SpecError as e:
        show_error(e)
        return
    df = pd.DataFrame({"step": [x["step"] for x in rows], "op": [x["op"] for x in rows],
                       "weight shard": [str(x["weight_shard"]) for x in rows],
                       "input shard": [str(x["input_shard"]) for x in rows],
                       "output shard": [str(x["output_shard"]) for x in rows],
                       "collective": [x["collective"] for x in rows],
                       "message (MB)": [x["message_bytes"] / 1e6 for x in rows], "time (ms)": [x["ms"] for x in rows]})
    df_with_download(df, "layer_sharding", column_config={"message (MB)": st.column_config.NumberColumn(format="%.3f"),
                                                          "time (ms)": st.column_config.NumberColumn(format="%.4f")},
                     show=["step", "op", "collective", "time (ms)", "message (MB)", "weight shard", "input shard",
                           "output shard"])
    st.caption(f"{r * c} devices; times on {setup.link.name}, alpha-beta ring model.")
    formula_expander("The sharding rule", inspect.getdoc(layer_sharding))


def mesh_figure(topology, plan: dict) -> go.Figure:
    """The mesh: one marker per chip, axis-1 links along each row, axis-0 links down each column."""
    R, C = topology.mesh_shape
    fig = go.Figure()
    for axis, color, dash in ((1, "#4C78A8", "solid"), (0, "#E45756", "solid")):
        link = topology.axis_link(axis)
        xs, ys = [], []
        if axis == 1:
            for r in range(R):
                xs += [0, C - 1, None]
                ys += [r, r, None]
        else:
            for c in range(C):
                xs += [c, c, None]
                ys += [0, R - 1, None]
        fig.add_scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=3, dash=dash),
                        name=f"axis {axis} ({topology.mesh_shape[axis]} chips): {fmt_num(link.bytes_per_s / 1e9, 3)} "
                             f"GB/s a direction" + (", wraps around" if topology.wraparound[axis] else ", a line"))
    fig.add_scatter(x=[c for r in range(R) for c in range(C)], y=[r for r in range(R) for c in range(C)],
                    mode="markers+text", marker=dict(size=34, color="#F2CF5B", line=dict(color="#333", width=1)),
                    text=[f"{r},{c}" for r in range(R) for c in range(C)], textposition="middle center",
                    name="a Wormhole chip (row, column)",
                    hovertext=[f"row {r}: KV head {r} and its query heads; column {c}: a slice of D"
                               for r in range(R) for c in range(C)], hoverinfo="text")
    fig.update_layout(height=520, xaxis=dict(title="column (axis 1): splits D", tickvals=list(range(C))),
                      yaxis=dict(title="row (axis 0): splits heads and F", tickvals=list(range(R)),
                                 autorange="reversed"),
                      title=f"{plan['chips']} × {plan['device']} on a {R} × {C} mesh",
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.15))
    return fig


def collectives_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame({"collective": [r["key"] for r in rows], "operation": [r["op"].replace("_", "-") for r in rows],
                         "mesh axis": [r["axis"] for r in rows], "chips": [r["devices"] for r in rows],
                         "per-chip in": [str(r["shape_in"]) for r in rows],
                         "per-chip out": [str(r["shape_out"]) for r in rows],
                         "message (MB)": [r["message_bytes"] / 1e6 for r in rows],
                         "sent per chip (MB)": [r["bytes_sent_per_chip"] / 1e6 for r in rows],
                         "time (µs)": [r["ms"] * 1e3 for r in rows], "named in 001": [r["in_001"] for r in rows]})


def galaxy_section(config: ModelConfig) -> None:
    st.subheader("A 2-D mesh: Llama 3 70B on a Tenstorrent Galaxy (8 × 4 Wormhole chips)")
    st.markdown("Reference 001 runs Llama 3 70B on 32 Wormhole chips joined by Ethernet into an 8 × 4 mesh. Every "
                "weight is cut both ways: the 8 rows split the heads and the FFN, the 4 columns split the hidden "
                "dimension. Each matmul then leaves a partial sum that a collective along ONE mesh axis completes: "
                "all-reduces, reduce-scatters and all-gathers of a few chips each instead of one ring of all 32.")
    try:
        check_layout(config)
        model = config
    except SpecError as e:
        model = load_preset("llama-3-70b")
        st.caption(f"{e} Showing {model.name}, the model of 001.")
    cols = st.columns(5)
    topo_key = choice_field("Mesh", list_topologies(), "galaxy-wormhole-4u", key="par.gx.topo", where=cols[0])
    prompt = int_field("Prompt (tokens)", 2048, 1, model.max_position_embeddings, key="par.gx.prompt", where=cols[1])
    out = int_field("Output (tokens)", 128, 1, model.max_position_embeddings, key="par.gx.out", where=cols[2])
    batch = int_field("Users decoded together", 32, 1, 32, key="par.gx.batch", where=cols[3])
    mlp = choice_field("w1/w3 storage", ("bfp4", "bfp8"), "bfp4", key="par.gx.mlp", where=cols[4])
    if None in (prompt, out, batch):
        return
    topo = load_topology(topo_key)
    plan = galaxy_plan(model, prompt, out, batch, topo, mlp == "bfp4")
    metric_row([("Weights per chip", fmt_bytes(plan["weight_bytes_per_chip"]),
                 "Two copies, as tt-metal keeps them: interleaved for prefill, ring-padded for decode"),
                ("KV per chip", fmt_bytes(plan["kv_bytes_per_chip"]), None),
                ("TTFT, one prompt (ms)", fmt_num(plan["ttft_ms"], 4), None),
                ("ITL (ms)", fmt_num(plan["itl_ms"], 4), f"{fmt_num(plan['tok_s_per_user'], 3)} tokens/s a user"),
                ("Output tokens/s", fmt_num(plan["output_tok_s"], 4), None)])
    if not plan["fits"]:
        st.error(f"Weights + KV need {fmt_bytes(plan['memory_bytes_per_chip'])} a chip, more than the usable "
                 f"{fmt_bytes(plan['usable_bytes_per_chip'])}: fewer users or a shorter context.")
    st.plotly_chart(chart_style(mesh_figure(topo, plan)))
    shards = weight_shards(model, topo, mlp == "bfp4")
    df_with_download(pd.DataFrame({"weight": [w["weight"] for w in shards],
                                   "full shape": [str(w["full_shape"]) for w in shards],
                                   "per chip (prefill copy)": [str(w["per_chip_shape"]) for w in shards],
                                   "ring-padded (decode copy)": [str(w["ring_padded_shape"]) for w in shards],
                                   "split": [w["split"] for w in shards], "format": [w["format"] for w in shards],
                                   "MB per chip": [w["bytes_per_chip"] / 1e6 for w in shards]}), "galaxy_weights",
                     show={"weight": None, "full shape": None, "per chip (prefill copy)": "per chip",
                           "MB per chip": None, "split": None, "format": None,
                           "ring-padded (decode copy)": "decode copy"})
    for phase, tokens, title in (("prefill", prompt, f"Prefill of {prompt:,} tokens"),
                                 ("decode", batch, f"Decode step of {batch} users")):
        rows = layer_collectives(model, tokens, phase, topo)
        st.markdown(f"**{title}: the collectives of one layer, as one chip sees them**")
        df_with_download(collectives_frame(rows), f"galaxy_{phase}_collectives",
                         column_config={k: st.column_config.NumberColumn(format="%.3f")
                                        for k in ("message (MB)", "sent per chip (MB)", "time (µs)")},
                         show={"collective": None, "operation": None, "mesh axis": "axis", "chips": None,
                               "time (µs)": None, "sent per chip (MB)": "sent (MB)", "message (MB)": None,
                               "per-chip in": None, "per-chip out": None, "named in 001": "in 001"})
        summary = per_axis_summary(rows)
        df_with_download(pd.DataFrame({"mesh axis": [a["axis"] for a in summary],
                                       "chips": [a["devices"] for a in summary],
                                       "collectives": [a["collectives"] for a in summary],
                                       "sent per chip per layer (MB)": [a["bytes_sent_per_chip"] / 1e6 for a in summary],
                                       "time per layer (µs)": [a["ms"] * 1e3 for a in summary]}),
                         f"galaxy_{phase}_per_axis")
    step = pd.DataFrame({"phase": ["prefill (one prompt)", "decode step"],
                         "weights read per chip (GB)": [plan["prefill"]["weight_bytes_read"] / GB,
                                                        plan["decode"]["weight_bytes_read"] / GB],
                         "memory (ms)": [plan["prefill"]["memory_ms"], plan["decode"]["memory_ms"]],
                         "compute (ms)": [plan["prefill"]["compute_ms"], plan["decode"]["compute_ms"]],
                         "collectives (ms)": [plan["prefill"]["comm_ms"], plan["decode"]["comm_ms"]],
                         "total (ms)": [plan["ttft_ms"], plan["itl_ms"]]})
    st.markdown("**Step estimate** (datasheet peaks: a lower bound on compute, collectives not overlapped)")
    df_with_download(step, "galaxy_step")
    check = reference_001_check(model, topo)
    df_with_download(pd.DataFrame({"what": [r["what"] for r in check], "001": [r["reference"] for r in check],
                                   "this layout": [r["layout"] for r in check], "agrees": [r["agrees"] for r in check],
                                   "why": [r["why"] for r in check]}), "galaxy_001_check",
                     show=["what", "001", "this layout", "agrees", "why"])
    formula_expander("Formulas: the Galaxy layout, its collectives, step times and plan",
                     "\n\n".join(inspect.getdoc(f) for f in (layer_collectives, galaxy_plan))
                     + "\n\n" + "\n\n".join(f"{k}: {v}" for k, v in plan["formulas"].items()))


def main() -> None:
    """The inputs in one row and the decode step by TP degree under them (a projector's first screen at 1366×768);
    the intro, the fit verdict, the rest of tensor parallelism and the other three ways below."""
    setup_page("Parallelism", icon=":material/hub:")
    st.title("Parallelism")
    top = st.container()                  # the inputs and the chart; the sidebar's notes on the world come after
    st.markdown("When a model or its traffic outgrows one GPU, there are four ways to cut the work: by matrix "
                "(tensor), by layer (pipeline), by sequence (context) and by expert. Each buys something different "
                "and pays for it in communication; the numbers below say how much.")
    chosen = sizing_with_gpus(DATACENTRE, "splitting a model over GPUs needs links between them, and this computer "
                                          "has none")
    if chosen is None:
        return
    config, device, setup = chosen
    cols = top.columns(4)
    opening = fitting_weight_dtype(config, device, setup, min(300, config.max_position_embeddings), 1)
    wd = choice_field("Weight precision", WEIGHT_DTYPES, opening, key="par.wd", where=cols[0],
                      help="Opens on the widest of fp16, fp8 and int4 that fits the sidebar's layout.")
    kd = choice_field("KV precision", KV_DTYPES, default_kv_dtype(wd), key="par.kd", where=cols[1])
    ctx = int_field("Context (tokens)", min(300, config.max_position_embeddings - 1), 1,
                    config.max_position_embeddings - 1, key="par.ctx", where=cols[2],
                    help="The tokens each sequence holds; the decode step priced is the next one's.")
    batch = int_field("Batch", 1, 1, 1 << 16, key="par.batch", where=cols[3])
    if ctx is None or batch is None:
        return
    if setup.link is None:
        st.info(f"{device.name} lists no interconnect: choose one in the sidebar to cost the communication.")
        return
    show_fit_verdict(config, device, setup, ctx, batch, wd, kd)
    measured = st.sidebar.toggle("Price each op from measured kernels", value=default_profile_choice() != "none",
                                 key="par.measured", help="As `python -m calculators latency` does by default: "
                                 "kernels measured on this GPU and serving stack where a profile is installed "
                                 "(docs/measured-kernels.md); off: the closed form at the stack's fitted "
                                 "efficiencies.")
    priced = default_pricing(device, config, measured)
    for section in (lambda: tp_section(config, device, setup, ctx, batch, wd, kd, priced, top),
                    lambda: pp_section(config, device, setup, ctx, batch, wd, kd, priced),
                    lambda: cp_section(config, setup, kd), lambda: ep_section(config, setup),
                    lambda: sharding_section(config, setup), lambda: galaxy_section(config)):
        try:
            section()
        except SpecError as e:
            show_error(e)


main()
