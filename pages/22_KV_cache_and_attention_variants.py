"""KV cache and attention variants: how the cache grows with context for MHA, GQA, MQA, MLA, sliding windows and
hybrid linear attention; the three levers that shrink it; and what fits on a device.

Numbers: `calculators.sizing.kv_cache` (bytes per token and per sequence), `calculators.sizing.memory` (weights + KV +
activations, max batch and context), `calculators.explain` (formulas).
"""
from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from calculators.arch import LINEAR, SLIDING, kind_counts
from calculators.explain import explain_kv_bytes_per_token, explain_kv_cache_bytes, explain_weight_bytes
from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes, kv_reduction
from calculators.sizing.memory import RuntimeOverheads, activation_bytes
from calculators.multi_gpu.tensor_parallel import max_batch_per_replica, max_context_per_replica, per_gpu_memory
from calculators.units import GB, KV_DTYPES, MB, WEIGHT_DTYPES, default_kv_dtype, fmt_bytes
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError
from specs.presets import list_presets, load_preset
from ui import df_with_download, formula_expander, int_field, remember, setup_page, show_error
from ui.model_source import (attention_label, choice_field, device_picker, model_source, table_height,
                             units_note)
from ui.world import world_weight_dtype
from ui.multi_gpu import MultiGPU, multi_gpu_sidebar, show_fit_verdict
from ui.charts import style as chart_style

COMPARE_DEFAULT = ["Llama-2-7B", "Llama-3-8B", "Mistral-7B", "Gemma-3-27B", "DeepSeek-V2", "Qwen3-Next-80B-A3B"]
MHA, MQA, SWA = "MHA (every query head keeps its own K/V)", "MQA (one K/V head)", "Sliding window on every layer"
RATIO = "× smaller"


def what_if(c: ModelConfig, variant: str, window: int) -> ModelConfig:
    """The same model with one attention choice changed (a hypothetical: it was trained otherwise)."""
    if variant == MHA:
        return c.replace(name=f"{c.name} as MHA", num_kv_heads=c.num_heads, attention="mha")
    if variant == MQA:
        return c.replace(name=f"{c.name} as MQA", num_kv_heads=1, attention="mqa")
    return c.replace(name=f"{c.name} with a {window:,}-token window", sliding_window=window, layer_types=None)


def context_grid(longest: int, points: int = 80) -> list[int]:
    """Token counts from 1 to `longest`, evenly spaced on a log axis."""
    return sorted({int(t) for t in np.geomspace(1, longest, points).round()} | {longest})


def attention_guide() -> None:
    with st.expander("The variants in one paragraph each"):
        st.markdown(
            "- **MHA**: every query head has its own key and value head, so the cache stores h_q K/V pairs per "
            "layer and token.\n"
            "- **GQA-k / MQA**: query heads are split into k groups that share one K/V head each (MQA: a single "
            "group). The cache shrinks by h_q / k.\n"
            "- **Sliding window (SWA)**: a windowed layer keeps only the last W positions, so its cache stops "
            "growing at W tokens. Gemma alternates windowed and global layers.\n"
            "- **MLA** (DeepSeek): each layer caches one compressed latent plus a small shared RoPE key instead "
            "of per-head K and V.\n"
            "- **Hybrid linear attention** (Qwen3-Next): most layers keep a fixed-size recurrent state whatever "
            "the context; only the few full-attention layers grow.")


# ============================================================================================ sections
def growth_section(config: ModelConfig, first=None) -> int | None:
    """The heading, the chart's inputs, the line chart and its caption in `first` (the page's first screen); the
    formula and the chart's data here. Returns the what-if window W (None when its field is invalid)."""
    first = first if first is not None else st.container()
    first.subheader("How the cache grows with context")
    cols = first.columns([3, 2, 1])
    names = list_presets()
    store = remember("kv.compare", [n for n in COMPARE_DEFAULT if n in names])
    st.session_state["kv.compare"] = [n for n in st.session_state.get("kv.compare", []) if n in names]
    compare = cols[0].multiselect("Compare with presets", names, key="kv.compare", on_change=store)
    store = remember("kv.dtypes", ["fp16"])
    dtypes = cols[1].multiselect("KV cache precision", KV_DTYPES, key="kv.dtypes", on_change=store,
                                 help="fp8 / int8 halve the cache, int4 quarters it (scales not counted).")
    store = remember("kv.log", True)
    log = cols[2].toggle("Log axes", key="kv.log", on_change=store)
    plain = not config.kv_lora_rank
    vcols = first.columns([3, 1])
    store = remember("kv.variants", [])
    variants = vcols[0].multiselect(f"What-if variants of {config.name}", [MHA, MQA, SWA], key="kv.variants",
                                    on_change=store, disabled=not plain,
                                    help="The same model with one attention choice changed."
                                    if plain else "MLA models cache a latent: these what-ifs do not apply.")
    window = int_field("Window W (tokens)", 1024, 1, 1 << 24, key="kv.window", where=vcols[1],
                       help="Keys a windowed layer keeps (Gemma 3: 1,024; Mistral 7B: 4,096).")
    if not dtypes:
        first.info("Pick at least one KV cache precision.")
        return window
    models = [config] + [what_if(config, v, window) for v in (variants if plain else [])
                         if v != SWA or window is not None]
    for n in compare:
        if n != config.name:
            models.append(load_preset(n))
    rows = []
    for m in models:
        for d in dtypes:
            for t in context_grid(m.max_position_embeddings):
                rows.append({"model": f"{m.name} ({attention_label(m)})", "KV precision": d, "context tokens": t,
                             "KV per sequence (GB)": kv_cache_bytes(m, t, 1, d) / GB})
    df = pd.DataFrame(rows)
    fig = px.line(df, x="context tokens", y="KV per sequence (GB)", color="model",
                  line_dash="KV precision" if len(dtypes) > 1 else None, log_x=log, log_y=log,
                  title="KV cache of ONE sequence by context (a line ends at its context window)")
    fig.update_layout(height=520, legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, title_text=""),
                      margin=dict(l=10, r=10, t=50, b=10))
    if log:
        fig.update_xaxes(dtick=1, tickformat=",~g")
        fig.update_yaxes(dtick=1, tickformat=",~g")
    first.plotly_chart(chart_style(fig))
    first.caption("A full-attention line rises in proportion to the context. A sliding-window layer goes flat once "
                  "the window is full, and a linear-attention layer keeps the same state at any length, so hybrid "
                  "models bend toward flat.")
    kd = dtypes[0]
    per = explain_kv_bytes_per_token(config, kd)
    formula_expander(f"Formula: KV bytes per token of {config.name} ({kd})",
                     f"`{per.symbolic}`\n\n{per.formula}\n\nSource: {per.source}")
    attention_guide()
    with st.expander("Chart data"):
        df_with_download(df, "kv_vs_context")
    return window


def levers_section(config: ModelConfig, tokens: int, window: int | None) -> None:
    st.subheader(f"The three levers, for {config.name} at {tokens:,} tokens")
    st.markdown(
        "The cache is layers × cached tokens × K/V heads × head size × bytes per number. Three independent "
        "levers shrink it: share K/V heads among query heads, store each number in fewer bytes, or keep fewer "
        "(or compressed) entries. The ratio column compares each row with the model as published, in fp16.")
    base = kv_cache_bytes(config, tokens, 1, "fp16")
    rows = []

    def add(lever: str, variant: str, c: ModelConfig, dtype: str) -> None:
        seq = kv_cache_bytes(c, tokens, 1, dtype)
        rows.append({"lever": lever, "variant": variant, "KV precision": dtype,
                     "bytes/token": kv_bytes_per_token(c, dtype),
                     "MB/sequence": seq / MB,
                     RATIO: kv_reduction(base, seq)["ratio"] if seq > 0 else float("nan")})

    add("as published", attention_label(config), config, "fp16")
    if not config.kv_lora_rank:
        h = config.num_heads
        for k in sorted({d for d in range(1, h + 1) if h % d == 0}, reverse=True)[:8]:
            c = config.replace(num_kv_heads=k)
            add("1. fewer K/V heads", attention_label(c, short=True), c, "fp16")
    for d in ("fp16", "fp8", "int8", "int4"):
        add("2. smaller numbers", f"{d} K and V", config, d)
    kinds = kind_counts(config)
    if config.kv_lora_rank:
        add("3. compressed entries", "MLA latent (as published)", config, "fp16")
    elif kinds[SLIDING] or kinds[LINEAR]:
        full = config.replace(name=f"{config.name}, all full attention", layer_types=None, sliding_window=None)
        add("3. fewer cached tokens", "what-if: every layer full attention", full, "fp16")
        add("3. fewer cached tokens", "as published (windowed / linear layers)", config, "fp16")
    elif window:
        c = what_if(config, SWA, window)
        add("3. fewer cached tokens", f"window of {window:,} on every layer", c, "fp16")
    df = pd.DataFrame(rows)
    df_with_download(df, "kv_levers", height=table_height(len(df)), column_config={
        "variant": st.column_config.TextColumn(width="medium"),
        "bytes/token": st.column_config.NumberColumn(help="K and V bytes per cached token, all layers"),
        "MB/sequence": st.column_config.NumberColumn(format="%.2f", help=f"one sequence of {tokens:,} tokens"),
        RATIO: st.column_config.NumberColumn(format="%.3g", help="than published fp16: that size ÷ this row's; "
                                             "below 1 means larger"),
        "bytes per token (all layers)": st.column_config.NumberColumn(format="localized")})
    if config.kv_lora_rank:
        st.caption("MLA has no K/V heads to share, so lever 1 does not apply: its cache is already a compressed "
                   "latent (lever 3).")
    if kinds[LINEAR]:
        st.caption("Linear-attention layers keep a fixed float32 state, whatever the KV precision and context: "
                   "it is counted in every per-sequence figure.")
    seq = explain_kv_cache_bytes(config, tokens, 1, "fp16")
    formula_expander(f"Formula: KV cache of one sequence at {tokens:,} tokens (fp16)",
                     f"`{seq.symbolic}`\n\n{seq.formula}\n\n{seq.description}\n\nSource: {seq.source}")


def fit_section(config: ModelConfig, device: Device, setup: MultiGPU, tokens: int, batch: int) -> None:
    st.subheader(f"What fits on {setup.label()} × {device.name}")
    cols = st.columns(2)
    wd_default, wd_key = world_weight_dtype("kv.fit.wd", device)     # fp32 on this machine: the engine's own
    wd = choice_field("Weight precision", WEIGHT_DTYPES, wd_default, key=wd_key, where=cols[0])
    kd = choice_field("KV precision", KV_DTYPES, default_kv_dtype(wd), key="kv.fit.kd", where=cols[1])
    mesh, kw = setup.mesh, setup.memory_kw()
    m = per_gpu_memory(config, device, mesh, tokens, batch, wd, kd, **kw)
    mb = max_batch_per_replica(config, device, mesh, tokens, wd, kd, **kw)
    mc = max_context_per_replica(config, device, mesh, batch, wd, kd, **kw)
    c = st.columns(4)
    c[0].metric("Needed per GPU", fmt_bytes(m["per_gpu_needed_bytes"]), help=f"{m['per_gpu_needed_bytes']:,.0f} bytes")
    c[1].metric("Usable per GPU", fmt_bytes(m["usable_bytes"]),
                help=f"gpu_memory_utilization {setup.usable_fraction:g} × {fmt_bytes(m['device_bytes'])}")
    c[2].metric(f"Max batch at {tokens:,} tokens", f"{mb:,}", help="per replica")
    c[3].metric(f"Max context at batch {batch:,}", f"{mc:,}",
                help=f"capped at the model's context window ({config.max_position_embeddings:,})")
    show_fit_verdict(config, device, setup, tokens, batch, wd, kd, numbers_follow=False)
    fig = go.Figure()
    for label, key, color in (("weights", "per_gpu_weight_bytes", "#4C78A8"), ("KV cache", "per_gpu_kv_bytes", "#F58518"),
                              ("activations", "per_gpu_activation_bytes", "#54A24B"),
                              ("runtime overheads", "overhead_bytes", "#B279A2"),
                              ("DeepEP all-to-all buffers", "a2a_buffer_bytes", "#E45756")):
        if key == "a2a_buffer_bytes" and not m[key]:
            continue                               # only a wide-EP layout has them: no empty legend entry
        fig.add_bar(y=["per GPU"], x=[m[key] / GB], name=f"{label} ({fmt_bytes(m[key])})", orientation="h",
                    marker_color=color)
    fig.add_vline(x=m["usable_bytes"] / GB, line_dash="dash", line_color="red",
                  annotation_text=f"usable {fmt_bytes(m['usable_bytes'])}", annotation_position="bottom left")
    fig.add_vline(x=m["device_bytes"] / GB, line_color="gray",
                  annotation_text=f"device {fmt_bytes(m['device_bytes'])}", annotation_position="top left")
    fig.update_layout(barmode="stack", height=280, xaxis_title="GB", yaxis_visible=False, font=dict(size=14),
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.4, traceorder="normal"),
                      title=dict(text="Memory needed vs available, busiest GPU", font=dict(size=16)))
    st.plotly_chart(chart_style(fig))
    w = explain_weight_bytes(config, wd)
    kv = explain_kv_cache_bytes(config, tokens, batch, kd)
    formula_expander("Formula: weights + KV cache + activations + overheads, per GPU",
                     f"**Weights (one GPU, all parameters)**: `{w.symbolic}` = {w.formula}\n\n**KV cache (one GPU)**: "
                     f"`{kv.symbolic}` = {kv.formula}\n\n**Per GPU** (`calculators.multi_gpu.tensor_parallel`): "
                     f"{inspect.getdoc(per_gpu_memory)}\n\n**Activations** (`calculators.sizing.memory.activation_bytes`): "
                     f"{inspect.getdoc(activation_bytes)}\n\n**Overheads**: {inspect.getdoc(RuntimeOverheads)}"
                     f"\n\n**Max batch / context**: the largest value for which the sum stays within the usable "
                     f"memory (a binary search).")
    contexts = sorted({t for t in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, tokens)
                       if t <= config.max_position_embeddings})
    df = pd.DataFrame({
        "context tokens": contexts,
        "max batch": [max_batch_per_replica(config, device, mesh, t, wd, kd, **kw) for t in contexts],
        "KV per sequence (MB)": [kv_cache_bytes(config, t, 1, kd) / MB for t in contexts],
    })
    fig = px.line(df, x="context tokens", y="max batch", markers=True, log_x=True, log_y=True,
                  title=f"Most sequences that fit per replica on {setup.label()} × {device.name}, by context length")
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=50, b=10), font=dict(size=14))
    fig.update_xaxes(tickvals=contexts, tickformat="~s")
    fig.update_yaxes(tickformat="~s")
    st.plotly_chart(chart_style(fig))
    df_with_download(df, "max_batch_by_context",
                     column_config={"KV per sequence (MB)": st.column_config.NumberColumn(format="%.2f")})


def main() -> None:
    """The growth chart and its inputs under the title (a projector's first screen at 1366×768); the intro, the
    levers, what fits and the measurement below."""
    setup_page("KV cache and attention variants", icon=":material/storage:")
    st.title("KV cache and attention variants")
    top = st.container()                  # the chart and its inputs; the sidebar's notes on the world come after
    st.markdown(
        "Every token a model has seen leaves its keys and values behind in each attention layer, so memory for "
        "a conversation grows with its length. Attention variants differ mostly in how much they leave behind, "
        "and that decides how many conversations fit next to the weights.")
    config = model_source()
    device = device_picker()
    setup = multi_gpu_sidebar(config, device)
    units_note()
    if config is None:
        st.info("Choose a model to size in the sidebar.")
        return
    window = None
    try:
        window = growth_section(config, top)
    except SpecError as e:
        show_error(e)
    cols = st.columns(2)
    tokens = int_field("Context per sequence (tokens)", min(2048, config.max_position_embeddings), 1,
                       config.max_position_embeddings, key="kv.tokens", where=cols[0])
    batch = int_field("Batch (sequences)", 1, 1, 1 << 20, key="kv.batch", where=cols[1])
    if tokens is None or batch is None:
        return
    try:
        levers_section(config, tokens, window)
        if device is None:
            st.info("Choose a device in the sidebar to see what fits.")
            return
        if setup is None:
            st.info("Fix the GPU layout in the sidebar to see what fits.")
            return
        fit_section(config, device, setup, tokens, batch)
    except SpecError as e:
        show_error(e)
    measured_section()


def measured_section() -> None:
    """A hybrid cache measured: Gemma 3 270M (5 sliding-window layers per global one) prefilled on the engine."""
    from engine.serve.serving_runs import kv_layers_run
    from ui.kv_layers import show_kv_by_layer_kind
    from ui.model_picker import GEMMA3_SOURCE, load_shared
    from ui.serving import measured_run

    st.subheader("Measured: a sliding-window cache on the engine")
    st.markdown("Gemma 3 270M keeps a window of 512 positions in 15 of its 18 layers and every position in the "
                "other 3. Prefill a prompt on the engine and compare what each kind of layer holds with the formula.")
    if not st.toggle("Measure on Gemma 3 270M (loads about 1 GB of float32 weights)", key="kv.measure_gemma"):
        return
    try:
        model = load_shared(GEMMA3_SOURCE, where=st)
    except SpecError as e:                     # not installed: the message says what to install
        show_error(e)
        return
    n = int_field("Prompt tokens to prefill", 1024, 1, 4096, key="kv.measure_tokens")
    if n is None:
        return
    r = measured_run("sliding-window cache", (model.source, n), lambda: kv_layers_run(model, n), model=model,
                     tokens=n, sequences=1, button="Prefill and measure", button_key="kv.measure_run",
                     spinner=f"Prefilling {n:,} tokens …", hint="Press the button to prefill and measure.")
    if r is None:
        return
    show_kv_by_layer_kind(model.config, r["bytes_per_layer"], r["tokens"], "kv_measured_layer_kinds")
    st.caption(f"Random token ids, prefilled in chunks of 512 in {r['seconds']:.1f} s. Bytes are the engine's "
               "own count of filled K/V positions per layer after the prefill (float32).")


main()
