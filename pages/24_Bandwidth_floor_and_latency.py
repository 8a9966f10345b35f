"""Bandwidth floor and latency: the fastest a token can come out (weights and KV streamed once per step), prefill
time and TTFT, ITL, total latency, throughput and cost, ideal (datasheet peaks) and realistic (MBU/MFU knobs),
the batching table, and a comparison across devices.

Numbers: `calculators.sizing.latency` (generation_latency, batch_table_for, Efficiency), `calculators.explain` (formulas);
on several GPUs `calculators.planning.request_latency.latency_with_floor` (the step `python -m calculators latency`
prices).
"""
from __future__ import annotations

import inspect

import pandas as pd
import plotly.express as px
import streamlit as st

from calculators.explain import (explain_cost_per_million, explain_decode_floor, explain_itl, explain_prefill,
                                 explain_throughput, explain_total_latency)
from calculators.sizing.latency import Efficiency, batch_table_for, generation_latency
from calculators.units import GB, KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype, fmt_num
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError
from ui import df_with_download, float_field, formula_expander, int_field, setup_page, show_error
from ui.model_source import choice_field, device_multiselect
from ui.model_source import sizing_with_gpus
from ui.multi_gpu import MultiGPU, show_fit_verdict
from ui.charts import style as chart_style
from ui.world import world_weight_dtype
from calculators.planning import request_latency as one_request, step as one_step
from calculators.planning.cost import cost_if_priced, cost_per_request
from calculators.planning.measured_step import default_profile_choice
from calculators.planning.request_latency import default_pricing, latency_with_floor
from calculators.planning.step import pricing_words
from calculators.multi_gpu.tensor_parallel import Mesh, per_gpu_memory

COMPARE_DEFAULT = ["RTX 4090", "A100 SXM 40GB", "H100 SXM", "H200", "MI300X", "L4"]
BATCHES = (1, 8, 32, 128)
# the Compare switch's words: one line with Large text ("$ per 1M output tokens" wrapped onto a second line)
COMPARE_WORDS = {"ITL (ms)": "ITL (ms)", "TTFT (ms)": "TTFT (ms)", "total latency (ms)": "total (ms)",
                 "tokens/s all streams": "tokens/s", "$ per 1M output tokens": "$ per 1M output tokens"}
KNOBS = (("decode_mbu", "Decode MBU", "Fraction of peak memory bandwidth a decode step reaches (model bandwidth "
          "utilisation). Databricks/MosaicML (2023) report about 50-70% at small batch on A100/H100."),
         ("prefill_mfu", "Prefill MFU", "Fraction of peak FLOP/s a prefill reaches (model FLOP/s utilisation). "
          "Large cuBLAS GEMMs reach 70-80% of the dense peak on A100/H100 and Pope et al. 2022 reach 76% on large "
          "prefills; the default 0.7 leaves room for attention and launch gaps (was 0.5, which ran 1.4-1.6× slow)."),
         ("prefill_mbu", "Prefill MBU", "Bandwidth fraction while a prefill streams the weights in large GEMM "
          "tiles (only matters for very short prompts)."),
         ("decode_mfu", "Decode MFU", "Compute fraction in decode (only matters at very large batch)."))


def ms(x: float | None) -> str:
    return "–" if x is None else f"{fmt_num(x, 3)} ms"


def usd(x: float | None) -> str:
    return "no price" if x is None else f"${fmt_num(x, 3)}"


def efficiency_knobs() -> Efficiency | None:
    defaults = Efficiency()
    with st.expander("Realistic efficiency (MBU / MFU knobs)", expanded=False):
        st.caption("Datasheet peaks are never reached. These fractions turn the ideal floor into a realistic "
                   "estimate; defaults are published typical values (see each field's help and "
                   "`calculators.sizing.latency.Efficiency`).")
        cols = st.columns(4)
        values = {name: float_field(label, getattr(defaults, name), 0.01, 1.0, key=f"lat.{name}", step=0.05,
                                    where=cols[i], help=help_text)
                  for i, (name, label, help_text) in enumerate(KNOBS)}
    if None in values.values():
        return None
    return Efficiency(**values)


def headline(config: ModelConfig, device: Device, setup: MultiGPU, P: int, N: int, B: int, wd: str, kd: str,
             eff: Efficiency) -> None:
    st.subheader(f"{config.name} on {setup.label()} × {device.name}")
    show_fit_verdict(config, device, setup, P + N, B, wd, kd)
    if setup.mesh.gpus_per_replica > 1:
        return multi_gpu_headline(config, device, setup, P, N, B, wd, kd)
    g = generation_latency(config, device, P, N, B, wd, kd, eff)
    ideal, real = g["ideal"], g["realistic"]
    floor = explain_decode_floor(config, device, P, B, wd, kd)
    c = st.columns(3)
    c[0].metric("Bandwidth floor per token", ms(floor.value), help="Weights + KV cache streamed once at peak "
                "bandwidth: no decode step can be faster.")
    c[1].metric("Time to first token (TTFT)", ms(real["ttft_ms"]),
                help=f"ideal {ms(ideal['ttft_ms'])}; realistic prefill is {real['prefill_bound']}-bound")
    c[2].metric("Inter-token latency (ITL)", ms(real["itl_ms"]),
                help=f"ideal {ms(ideal['itl_ms'])}; realistic decode is {real['decode_bound']}-bound")
    c = st.columns(3)
    c[0].metric(f"Total for {N:,} tokens", ms(real["total_ms"]), help=f"ideal {ms(ideal['total_ms'])}")
    c[1].metric("Tokens/s, all streams", fmt_num(real["total_tok_s"], 4),
                help=f"per stream {fmt_num(real['per_stream_tok_s'], 4)}; ideal {fmt_num(ideal['total_tok_s'], 4)}")
    c[2].metric("$ per 1M output tokens (decode time)", usd(real["usd_per_million_tokens"]),
                help=f"ideal {usd(ideal['usd_per_million_tokens'])}; price: {device.price_note or 'unknown'}")
    st.caption("The floor is the ideal limit; the other metrics are the realistic estimate (efficiency knobs "
               "above; hover a metric for its ideal value). The ITL is taken at the mean context of the reply "
               f"({g['mean_context_tokens']:,} tokens).")
    pre = explain_prefill(config, device, P, B, wd, kd, eff)
    itl = explain_itl(config, device, g["mean_context_tokens"], B, wd, kd, eff)
    tot = explain_total_latency(real["ttft_ms"], real["itl_ms"], N)
    thr = explain_throughput(B, real["itl_ms"])
    text = (f"**Bandwidth floor** `{floor.symbolic}`\n\n{floor.formula}\n\n"
            f"**Prefill (= TTFT, no queue)** `{pre.symbolic}`\n\n{pre.formula}\n\n"
            f"**ITL** `{itl.symbolic}`\n\n{itl.formula}\n\n"
            f"**Total latency** `{tot.symbolic}`\n\n{tot.formula}\n\n"
            f"**Throughput** `{thr.symbolic}`\n\n{thr.formula}")
    if device.price_usd_per_hour and real["total_tok_s"] > 0:
        cost = explain_cost_per_million(device.price_usd_per_hour, real["total_tok_s"])
        text += f"\n\n**Cost** `{cost.symbolic}`\n\n{cost.formula} ({cost.source})"
    text += f"\n\nSources: {floor.source}; {pre.source}; {itl.source}."
    formula_expander("Formulas behind these numbers (realistic case)", text)
    rows = [("Prefill (ms)", "prefill_ms"), ("TTFT (ms)", "ttft_ms"), ("ITL (ms)", "itl_ms"),
            ("Total latency (ms)", "total_ms"), ("Tokens/s per stream", "per_stream_tok_s"),
            ("Tokens/s all streams", "total_tok_s"), ("$ per 1M output tokens", "usd_per_million_tokens")]
    df = pd.DataFrame({"quantity": [r[0] for r in rows], "ideal": [ideal[r[1]] for r in rows],
                       "realistic": [real[r[1]] for r in rows]})
    df_with_download(df, "latency_ideal_vs_realistic", column_config={
        "ideal": st.column_config.NumberColumn(format="%.4g"),
        "realistic": st.column_config.NumberColumn(format="%.4g")})
    st.caption(f"Realistic prefill is {real['prefill_bound']}-bound and decode {real['decode_bound']}-bound.")
    cost_split(device, cost_if_priced(device.price_usd_per_hour, 1, real["ttft_ms"], real["itl_ms"], B, P, N))


def cost_split(device: Device, cost: dict) -> None:
    """$ per request and per 1M input and output tokens (`cost`: `calculators.planning.cost.cost_if_priced`)."""
    if "usd_per_request" not in cost:
        st.caption("No hourly price for this device: enter one (custom device) to see the cost split.")
        return
    c = st.columns(3)
    c[0].metric("$ per 1M input tokens", usd(cost["usd_per_million_input_tokens"]),
                help="The prompt's share: prefill time × GPUs × price.")
    c[1].metric("$ per 1M output tokens", usd(cost["usd_per_million_output_tokens"]),
                help="The reply's share: output tokens × ITL / batch × GPUs × price.")
    c[2].metric("$ per request", usd(cost["usd_per_request"]), help=f"price: {device.price_note or 'unknown'}")
    formula_expander("Formula: cost per request (calculators.planning.cost)", inspect.getdoc(cost_per_request))


def multi_gpu_headline(config: ModelConfig, device: Device, setup: MultiGPU, P: int, N: int, B: int, wd: str,
                       kd: str) -> None:
    """The layout's request on the deployment's step, as `python -m calculators latency --tp --pp` prices it."""
    measured = st.toggle("Price each op from measured kernels", value=default_profile_choice() != "none",
                         key="lat.measured", help="As the latency command does by default: kernels measured on "
                         "this GPU and serving stack where a profile is installed (docs/measured-kernels.md); off: "
                         "the closed form at the stack's fitted efficiencies.")
    profile, pricing = default_pricing(device, config, measured)
    g = latency_with_floor(config, device, setup.mesh, P, N, B, wd, kd, link=setup.link, profile=profile)
    floor, real = g["floor"], g["realistic"]
    c = st.columns(4)
    c[0].metric("TTFT", ms(real["ttft_ms"]), help=f"floor {ms(floor['ttft_ms'])}")
    c[1].metric("ITL", ms(real["itl_ms"]), help=f"floor {ms(floor['itl_ms'])}")
    c[2].metric("All-reduce per token", ms(real["allreduce_ms_per_token"]),
                help=f"{real['decode_comm_fraction']:.1%} of the ITL")
    c[3].metric("All-reduce in the prefill", ms(real["allreduce_ms_prefill"]))
    c = st.columns(3)
    c[0].metric(f"Total for {N:,} tokens", ms(real["total_ms"]), help=f"floor {ms(floor['total_ms'])}")
    c[1].metric("Tokens/s, all replicas", fmt_num(real["total_tok_s"], 4))
    c[2].metric("$ per 1M tokens (in + out)", usd(real.get("usd_per_million_tokens")))
    st.caption(f"Priced as `python -m calculators latency` prices this layout, on the deployment's step with "
               f"{g['stack']}'s all-reduce and host costs; priced from "
               f"{pricing if profile is not None else pricing_words(None)}. The efficiency knobs "
               "above price the one-GPU numbers only. The floor is the same step at the datasheet peaks, no host "
               f"cost. The ITL is taken at the mean context of the reply ({g['mean_context_tokens']:,} tokens).")
    rows = [("TTFT (ms)", "ttft_ms"), ("ITL (ms)", "itl_ms"), ("Total latency (ms)", "total_ms"),
            ("All-reduce per token (ms)", "allreduce_ms_per_token"), ("All-reduce in prefill (ms)",
                                                                      "allreduce_ms_prefill"),
            ("Tokens/s all replicas", "total_tok_s"), ("$ per 1M tokens (in + out)", "usd_per_million_tokens")]
    df = pd.DataFrame({"quantity": [r[0] for r in rows], "floor (datasheet peaks)": [floor.get(r[1]) for r in rows],
                       "realistic": [real.get(r[1]) for r in rows]})
    df_with_download(df, "multi_gpu_latency", column_config={
        "floor (datasheet peaks)": st.column_config.NumberColumn(format="%.4g"),
        "realistic": st.column_config.NumberColumn(format="%.4g")})
    formula_expander("How the multi-GPU numbers are computed (calculators.planning.request_latency, .step)",
                     inspect.getdoc(one_request) + "\n\n" + inspect.getdoc(one_step))
    cost_split(device, real)


def batching(config: ModelConfig, device: Device, setup: MultiGPU, wd: str, kd: str) -> None:
    st.subheader("Batching: one weight read, many tokens")
    st.markdown(
        "A decode step reads the weights once whatever the batch, plus every sequence's own KV cache. Adding "
        "sequences therefore multiplies the tokens per step while the step grows only by their cache: total "
        "throughput climbs steeply, each stream slows a little.")
    ctx = int_field("Context per sequence (tokens)", min(300, config.max_position_embeddings), 1,
                    config.max_position_embeddings, key="lat.batch_ctx")
    if ctx is None:
        return
    rows = batch_table_for(config, device, ctx, BATCHES, wd, kd)
    df = pd.DataFrame({
        "batch": [r["batch"] for r in rows],
        "weights (GB)": [r["weight_bytes"] / GB for r in rows],
        "KV read (GB)": [r["kv_read_bytes"] / GB for r in rows],
        "total read (GB)": [r["total_bytes"] / GB for r in rows],
        "step (ms)": [r["step_ms"] for r in rows],
        "tokens/s all streams": [r["total_tok_s"] for r in rows],
        "tokens/s per stream": [r["per_stream_tok_s"] for r in rows],
        "$ per 1M output tokens": [r["usd_per_million_tokens"] for r in rows],
        "fits on 1 GPU": [per_gpu_memory(config, device, Mesh(), ctx, r["batch"], wd, kd,
                                         **setup.memory_kw())["fits"] for r in rows],
    })
    f3 = st.column_config.NumberColumn(format="%.3f")
    df_with_download(df, "batching_table", column_config={
        "weights (GB)": f3, "KV read (GB)": f3, "total read (GB)": f3, "step (ms)": f3,
        "tokens/s all streams": st.column_config.NumberColumn(format="%,.0f"),
        "tokens/s per stream": st.column_config.NumberColumn(format="%.0f"),
        "$ per 1M output tokens": st.column_config.NumberColumn(format="%.4f")},
        show=["batch", "step (ms)", "tokens/s all streams", "tokens/s per stream", "$ per 1M output tokens",  # 1366 px
              "fits on 1 GPU", "weights (GB)", "KV read (GB)", "total read (GB)"])
    st.caption("One GPU, ideal numbers (peak bandwidth, `calculators.sizing.latency.batch_table`); a row that does not "
               "fit on one GPU cannot run there. Step = (weights + batch × "
               "KV per sequence) / bandwidth; tokens/s = batch / step. Weights count every parameter once per "
               "step (an MoE step counts the experts its tokens touch).")


def compare(config: ModelConfig, primary: Device, setup: MultiGPU, P: int, N: int, B: int, wd: str, kd: str,
            eff: Efficiency, top) -> None:
    """The devices side by side: the chart (and its metric switch) in `top`, the page's first screen; the device
    list and the table here."""
    st.subheader("Compare devices")
    devices = device_multiselect("lat.compare", COMPARE_DEFAULT)
    if primary.name not in [d.name for d in devices]:
        devices = [primary, *devices]
    rows, errors = [], []
    for d in devices:
        try:
            g = generation_latency(config, d, P, N, B, wd, kd, eff)
            fits = per_gpu_memory(config, d, Mesh(), P + N, B, wd, kd, **setup.memory_kw())["fits"]
        except SpecError as e:
            errors.append(f"{d.name}: {e}")
            continue
        for case in ("ideal", "realistic"):
            r = g[case]
            rows.append({"device": d.name if fits else f"{d.name} (does NOT fit)", "fits on 1 GPU": fits,
                         "case": case, "TTFT (ms)": r["ttft_ms"], "ITL (ms)": r["itl_ms"],
                         "total latency (ms)": r["total_ms"], "tokens/s all streams": r["total_tok_s"],
                         "$ per 1M output tokens": r["usd_per_million_tokens"]})
    for e in errors:
        show_error(e)
    if not rows:
        return
    df = pd.DataFrame(rows)
    metric = top.radio("Compare", list(COMPARE_WORDS), horizontal=True, key="lat.compare_metric",
                       format_func=COMPARE_WORDS.get)
    fig = px.bar(df, x="device", y=metric, color="case", barmode="group", text_auto=",.3~r",
                 color_discrete_map={"ideal": "#9ecae9", "realistic": "#4C78A8"},
                 title=f"{metric}: {config.name}, prompt {P:,}, reply {N:,}, batch {B:,}")
    fig.update_layout(height=440, margin=dict(l=10, r=10, t=50, b=10))
    top.plotly_chart(chart_style(fig))
    if metric == "$ per 1M output tokens":
        top.caption("Devices without an hourly price (Apple, some accelerators) have no cost bar. Prices are "
                    "typical on-demand rates and assumptions (specs/devices.json).")
    df_with_download(df, "device_comparison", column_config={
        c: st.column_config.NumberColumn(format="%.4g") for c in df.columns
        if c not in ("device", "case", "fits on 1 GPU")}, show=list(df.columns))      # the leading ones that fit
    st.caption("Each device alone (one GPU); a bar marked 'does NOT fit' is for a setup that cannot run.")


def main() -> None:
    """The inputs in one row and the devices' chart under them (a projector's first screen at 1366×768); the
    notes on what is sized, the intro, the efficiency knobs, this device's numbers, batching and the comparison's
    table below."""
    setup_page("Bandwidth floor and latency", icon=":material/speed:")
    st.title("Bandwidth floor and latency")
    top = st.container()                  # the inputs and the chart; the sidebar's notes on the world come after
    chosen = sizing_with_gpus()
    if chosen is None:
        return
    config, device, setup = chosen
    cols = top.columns(5)
    wd_default, wd_key = world_weight_dtype("lat.wd", device)
    wd = choice_field("Weight precision", WEIGHT_DTYPES, wd_default, key=wd_key, where=cols[0])
    kd = choice_field("KV precision", KV_DTYPES, default_kv_dtype(wd), key="lat.kd", where=cols[1])
    P = int_field("Prompt tokens", min(100, config.max_position_embeddings - 1), 1, config.max_position_embeddings,
                  key="lat.prompt", where=cols[2])
    N = int_field("Output tokens", 200, 1, config.max_position_embeddings, key="lat.output", where=cols[3])
    B = int_field("Batch", 1, 1, 1 << 16, key="lat.batch", where=cols[4])
    st.markdown(
        "Generating one token means streaming every weight (and the conversation's KV cache) from memory, so "
        "memory bandwidth sets a hard lower limit on the time between tokens. The first token is different: "
        "the prompt's tokens share each weight read, so a long prompt makes prefill limited by compute instead; "
        "a short one (fewer tokens than the device's FLOP-per-byte ridge) still waits on memory. The caption under "
        "the numbers says which holds for yours.")
    eff = efficiency_knobs()
    if None in (P, N, B) or eff is None:
        return
    for section in (lambda: headline(config, device, setup, P, N, B, wd, kd, eff),
                    lambda: batching(config, device, setup, wd, kd),
                    lambda: compare(config, device, setup, P, N, B, wd, kd, eff, top)):
        try:
            section()
        except SpecError as e:
            show_error(e)


main()
