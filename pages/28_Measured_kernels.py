"""Measured kernels: a device profile's curves against the datasheet roofline. The efficiency (roofline ÷ measured
time) of a model's own weight GEMMs by tokens per step, of decode attention by context, of the all-reduce by message
size, and every op of one step with its roofline and measured time side by side.

Numbers: `calculators.planning.measured_curves` (the curves and their sentences), `measured_step.step_ops_table`
(the step), `calculators.sizing.measured_ops` (lookups and rooflines), `specs.profiles` (the profiles).
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from calculators.planning.measured_curves import (CONTEXT_GRID, MESSAGE_GRID, TOKEN_GRID, a2a_caption, a2a_curves,
                                                  allreduce_caption, allreduce_curves, attention_caption,
                                                  borrowed_profiles, decode_attention_curves, gather_scatter_caption,
                                                  gather_scatter_curves, gemm_caption, gemm_curves,
                                                  over_roofline_caption)
from calculators.planning.anchor_steps import anchor_ratio, anchor_sentence, load_anchor, steps_of_profile
from calculators.planning.measured_step import profile_support, step_ops_table
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.sizing.measured_ops import profile_device
from specs.model_config import SpecError
from specs.presets import list_presets, load_preset
from ui import df_with_download, int_field, setup_page, show_error
from ui.charts import figure, style
from ui.measured_kernels import (COLORS, EXTRAPOLATED_NOTE, KV_CHOICES, NONE_INSTALLED, WEIGHT_CHOICES, anchor_chart,
                                 anchor_frame, bytes_text, cached_profile, count_text, curve_traces, default_profile,
                                 device_word, log_axis, measured_formats, ops_frame, profile_caption, profile_names,
                                 profiled_here, ridge_marks, roof_marks, stack_exchange, stack_label)
from ui.model_source import choice_field, table_height

DEFAULT_MODEL = "Llama-3.1-8B"
TP_CHOICES = ("1", "2", "4", "8")
OPS_SHOWN = {"op": None, "% of datasheet": None, "roofline (ms)": None, "measured (ms)": None, "extrapolated": None,
             "shape": None, "note": None, "layers": None}


def chart(curves, x_label: str, text, every: int, title: str, y_title: str, marks: dict | None = None,
          roof: str = "datasheet roofline = 100%") -> dict:
    traces = [t for i, c in enumerate(curves)
              for t in curve_traces(c, COLORS[i % len(COLORS)], x_label, [text(v) for v in c.x])]
    top = max(112.0, 8 + max(100 * float(c.efficiency.max()) for c in curves))     # from zero: no zoomed noise
    return style(figure(*traces, title=title, height=420, xaxis=dict(title=x_label, **log_axis(curves[0].x, text,
                                                                                               every)),
                        yaxis=dict(title=y_title, range=[0, top]), **roof_marks(marks, roof)))


def sidebar(names: list[str]) -> tuple[str, str, int]:
    box = st.sidebar
    box.header("Measured kernels")
    name = choice_field("Device profile", names, default_profile(names), key="kernels.profile", where=box,
                        help="Measured latencies per op on one (device, serving stack, version).")
    presets = list_presets()
    model = choice_field("Model", presets, DEFAULT_MODEL if DEFAULT_MODEL in presets else presets[0],
                         key="kernels.model", where=box)
    tp = int(choice_field("Tensor parallel (TP)", TP_CHOICES, "1", key="kernels.tp", where=box,
                          help="Each GPU holds 1/TP of every weight matrix and of the attention heads."))
    return name, model, tp


def formats(profile) -> tuple[str, str]:
    """Weight and KV formats, among those the profile measured."""
    box = st.sidebar
    weights = measured_formats(profile, "gemm", "dtype", WEIGHT_CHOICES)
    kvs = measured_formats(profile, "generation_attention", "kv_dtype", KV_CHOICES)
    wd = choice_field("Weight precision", weights, "bf16" if "bf16" in weights else weights[0], key="kernels.wd",
                      where=box, help="The formats this profile measured GEMMs in.")
    kd = choice_field("KV cache precision", kvs, "bf16" if "bf16" in kvs else kvs[0], key="kernels.kd", where=box)
    return wd, kd


@st.cache_data(show_spinner=False)
def _anchor_compared(name: str, device_name: str, stack: str) -> tuple[list[dict], list[str]]:
    """This profile's committed steps priced here, and those it could not price (once per profile and server: under
    a second once the profile is loaded)."""
    profile = cached_profile(name)
    priced, unpriced = [], []
    for s in steps_of_profile(load_anchor(), device_name, stack):
        try:
            priced.append(anchor_ratio(s, profile=profile))
        except SpecError as e:
            unpriced.append(f"{s['model']} {s['kind']} {s['size']:,}: {e}")
    return priced, unpriced


def anchor(name: str, profile, device) -> None:
    """The planner's step beside aiconfigurator's own on the same work (bench/anchor_steps.csv)."""
    st.subheader("Against aiconfigurator's own step")
    if profile.source.get("kind") != "aiconfigurator-core":
        st.caption(f"{profile.name} was not measured by aiconfigurator-core, so aiconfigurator's own steps "
                   "(bench/anchor_steps.csv) price other kernels than these; pick an aiconfigurator-core profile to "
                   "see the planner's step beside them.")
        return
    st.markdown("NVIDIA's aiconfigurator prices a whole step from these same measured kernels. The planner's GPU "
                "time for a step (ops plus collectives, no host work) beside aiconfigurator's on the same work:")
    compared, unpriced = _anchor_compared(name, device.name, profile.stack)
    if not compared:
        st.caption(f"bench/anchor_steps.csv holds no steps on {device.name} with {stack_label(profile)} "
                   "(`python bench/bench_anchor_steps.py` prices TensorRT-LLM on H100, H200, B200 and GB200, vLLM and "
                   "SGLang on H100, H200 and B200).")
        return
    st.plotly_chart(anchor_chart(compared))
    st.markdown(anchor_sentence(compared))
    df_with_download(anchor_frame(compared), "measured_kernels_anchor", height=table_height(min(len(compared), 12)))
    st.caption(compared[0]["source"] + "; the planner's side is priced now, from the profile above."
               + (f" Not priced here: {'; '.join(unpriced)}." if unpriced else ""))


def main() -> None:
    setup_page("Measured kernels")
    st.title("Measured kernels")
    st.markdown(
        "The roofline says how fast an op could run; a profile says how fast it did, measured on one GPU with one "
        "serving stack. Their ratio is the op's **efficiency**: the fraction of the datasheet's bandwidth or "
        "FLOP/s it reaches. The capacity planner prices each op of a step this way.")
    names = profile_names()
    if not names:
        st.info(NONE_INSTALLED)
        return
    name, model, tp = sidebar(names)
    try:
        with st.spinner(f"Loading {name} (once per server)…"):
            profile = cached_profile(name)
        config = load_preset(model)
        device = profile_device(profile)
    except SpecError as e:
        show_error(e)
        return
    wd, kd = formats(profile)
    st.caption(profile_caption(profile, device))
    problem = profile_support(config, profile)
    if problem:
        st.info(f"{problem}: the planner prices it by the closed form. Pick another model in the sidebar.")
        return

    st.subheader(f"Weight GEMMs of {config.name} (TP {tp}) by tokens per step")
    try:
        gemms = gemm_curves(profile, device, config, tp, wd, TOKEN_GRID)
    except SpecError as e:
        show_error(e)
        return
    st.plotly_chart(chart(gemms, "tokens per step (m)", count_text, 2,
                          f"GEMM efficiency on {device.name}, {stack_label(profile)}",
                          "% of the datasheet", ridge_marks(gemms[0])))
    st.markdown(gemm_caption(gemms[0]))
    over = over_roofline_caption(gemms)
    if over:
        st.markdown(over)
    notes = sorted({f"{c.label}: {c.note}" for c in gemms if c.note})
    shapes = "; ".join(f"{c.label} {c.shape}" for c in gemms)
    st.caption(f"Each GEMM is [m × k] · [k × n] on one {device_word(device)}: {shapes}"
               + ". Below the ridge (few tokens) the roofline is the weights' bytes over the bandwidth; above it, "
                 "the FLOPs over peak." + (" " + "; ".join(notes) + "." if notes else "") + " " + EXTRAPOLATED_NOTE)

    st.subheader("Decode attention by context")
    try:
        attn = decode_attention_curves(profile, device, config, tp, kd, contexts=CONTEXT_GRID)
    except SpecError as e:
        show_error(e)
        attn = []
    if attn:
        st.plotly_chart(chart(attn, "cached positions per row (context)", count_text, 1,
                              f"Decode attention, one layer ({attn[0].shape})", "% of the datasheet"))
        st.markdown(attention_caption(attn))

    st.subheader("All-reduce by message size")
    reduce = allreduce_curves(profile, device, sizes=MESSAGE_GRID)
    if reduce:
        st.plotly_chart(chart(reduce, "message size", bytes_text, 3,
                              f"All-reduce on {device.interconnect_name}", "% of the link's ring bound",
                              roof="ring bound at the datasheet's link = 100%"))
        st.markdown(allreduce_caption(reduce, device.interconnect_name, device.interconnect_bytes_per_s))
        st.caption("The ring bound: 2(n − 1)/n × the message over one direction of the link, the least a ring "
                   "all-reduce moves. Above 100%, the stack's algorithm (one-shot, or in-switch reduction) moves "
                   "less than a ring does.")
    else:
        st.caption(f"{profile.name} has no all-reduce table" + ("" if device.interconnect_bytes_per_s else
                                                                 f", and {device.name} no peer link") + ".")

    method = stack_exchange(profile)
    ring = gather_scatter_curves(profile, device, sizes=MESSAGE_GRID) if config.num_experts else []
    if ring:
        st.subheader("All-gather and reduce-scatter (wide EP's token exchange) by buffer size")
        st.plotly_chart(chart(ring, "whole buffer", bytes_text, 3,
                              f"NCCL all-gather and reduce-scatter on {device.interconnect_name}",
                              "% of the ring's wire time", roof="(n − 1)/n of the buffer at the link's one-way "
                                                                "bandwidth = 100%"))
        st.markdown(gather_scatter_caption(ring, device.interconnect_name, method[0], method[1]))
    a2a = a2a_curves(profile, device, config, wd) if config.num_experts else []
    if a2a:
        st.subheader("Expert all-to-all (DeepEP) by tokens per GPU")
        st.plotly_chart(chart(a2a, "tokens per GPU", count_text, 3,
                              f"DeepEP dispatch and combine on {device.interconnect_name}", "% of the link",
                              roof="the link's one-way bandwidth = 100%"))
        st.markdown(a2a_caption(a2a, device.interconnect_name, method[1]))

    st.subheader("One step, op by op")
    cols = st.columns(3)
    rows = int_field("Decode rows", 64, 0, 1 << 14, key="kernels.rows", where=cols[0],
                     help="Sequences decoding one token this step.")
    context = int_field("Context (positions each row reads)", 4096, 1, 1 << 20, key="kernels.context",
                        where=cols[1])
    prompt = int_field("Prompt tokens (one prompt)", 0, 0, 1 << 17, key="kernels.prompt", where=cols[2],
                       help="Tokens of a prompt prefilled in the same step (0: a decode-only step).")
    if rows is None or context is None or prompt is None:
        return
    try:
        ops = step_ops_table(profile, config, device, Mesh(tp=tp), wd, kd, rows, context, prompt, prompt or None)
    except SpecError as e:
        show_error(e)
        return
    df = ops_frame(ops)
    df_with_download(df, "measured_kernels_step", height=table_height(len(df)), show=OPS_SHOWN,
                     column_config={"% of datasheet": st.column_config.NumberColumn(format="%.0f%%")})
    st.caption(f"On one {device_word(device)} of TP {tp}: each op's time summed over its layers. Communication and "
               "the stack's host work come on top (the Capacity planner adds them).")
    for o in ops:
        if o["slower_than_bf16"]:
            st.warning(f"{o['op']}: {o['slower_than_bf16']}.")

    anchor(name, profile, device)

    with st.expander("A device nothing measured"):
        profiled = profiled_here(profile.stack)
        st.markdown(f"AMD, Apple, TPU or a GPU newer than the profiles: the planner prices it with the efficiencies "
                    f"of the nearest profiled device of its kind on {profile.stack}, at its own datasheet roofline, "
                    "and says so. Profiled on this stack: " + (", ".join(profiled) or "none") + ".")
        df_with_download(pd.DataFrame(borrowed_profiles(profile.stack, profiled)), "measured_kernels_borrowed")


main()
