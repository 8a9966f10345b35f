"""Model anatomy: where a model's parameters live, and every operation of one forward pass with its shapes.

Numbers: `calculators.sizing.params` (counts by component), `calculators.explain` (their formulas),
`calculators.sizing.roofline.step_ops` / `op_row` (the op-by-op table, prefill and decode).
"""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from calculators.explain import explain_forward_flops, explain_params, explain_weight_bytes
from calculators.sizing.params import param_breakdown, weight_bytes
from calculators.sizing.roofline import op_row, step_ops
from calculators.units import MB, WEIGHT_DTYPES, fmt_bytes, fmt_count
from specs.model_config import ModelConfig, SpecError
from ui import df_with_download, formula_expander, int_field, setup_page, show_error
from calculators.multi_gpu.tensor_parallel import per_gpu_weight_bytes
from ui.multi_gpu import multi_gpu_sidebar
from ui.model_source import choice_field, fmt_si, model_source, table_height, units_note
from ui.charts import style as chart_style

LABELS = {"embedding_params": "Embedding", "attention_params": "Attention", "ffn_params": "FFN (dense)",
          "experts_params": "Experts + router", "norm_params": "Norms", "lm_head_params": "LM head",
          "total_params": "Total", "active_params": "Active per token"}
COUNT = {"format": "compact"}
GFLOP = 1e9


def parameters_section(c: ModelConfig, dtype: str, first=None) -> None:
    """The heading, the chart by component and the totals in `first` (the page's first screen); the formulas and
    the table here."""
    first = first if first is not None else st.container()
    first.subheader("Where the parameters live")
    parts = explain_params(c)
    pb = param_breakdown(c)
    total = next(p for p in parts if p.name == "total_params")
    wb = explain_weight_bytes(c, dtype)
    components = [p for p in parts if p.name not in ("total_params", "active_params") and p.value > 0]
    fig = px.bar(x=[p.value for p in components], y=[LABELS.get(p.name, p.name) for p in components],
                 orientation="h", text=[fmt_count(p.value) for p in components],
                 labels={"x": "parameters", "y": ""}, title=f"{c.name}: parameters by component")
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=50, b=10), yaxis=dict(autorange="reversed"))
    first.plotly_chart(chart_style(fig))
    cols = first.columns(3)
    cols[0].metric("Parameters", fmt_count(total.value), help=f"{total.value:,.0f} parameters")
    cols[1].metric(f"Weights in {dtype}", fmt_bytes(wb.value), help=f"{wb.value:,.0f} bytes")
    if pb.active != pb.total:
        cols[2].metric("Active per token (MoE)", fmt_count(pb.active),
                       help="Routed experts a token is not sent to do no work for it.")
    else:
        cols[2].metric("Embeddings tied to the LM head", "yes" if pb.tied else "no")
    formula_expander("Formula: total parameters", f"`{total.symbolic}`\n\n{total.formula}\n\nSource: {total.source}")
    formula_expander(f"Formula: weight bytes in {dtype}", f"`{wb.symbolic}`\n\n{wb.formula}\n\nSource: {wb.source}")
    df = pd.DataFrame({
        "component": [LABELS.get(p.name, p.name) for p in parts],
        "parameters": [p.value for p in parts],
        f"{dtype} (MB)": [weight_bytes(p.value, dtype) / MB if p.value > 0 else 0.0 for p in parts],
        "formula": [p.symbolic for p in parts],
        "with numbers": [p.formula for p in parts],
        "note": [p.description for p in parts],
    })
    df_with_download(df, "parameters_by_component", column_config={"parameters": st.column_config.NumberColumn(
        **COUNT), f"{dtype} (MB)": st.column_config.NumberColumn(format="%,.1f")},
        show=["component", "parameters", f"{dtype} (MB)", "formula", "with numbers"])     # 1366 px wide
    with st.expander("Attention weights by tensor (all layers)"):
        ap = pb.attention_parts
        df_with_download(pd.DataFrame({"tensor": list(ap), "parameters": list(ap.values())}), "attention_tensors",
                         column_config={"parameters": st.column_config.NumberColumn(**COUNT)})


def ops_table(c: ModelConfig, new_tokens: int, context: int, batch: int, dtype: str, name: str) -> None:
    rows = [op_row(o) for o in step_ops(c, new_tokens, context, batch, weight_dtype=dtype, kv_dtype=dtype)]
    fl = explain_forward_flops(c, new_tokens, context, batch)
    st.metric("Matmul FLOPs of the step", fmt_si(fl.value, "FLOP"), help=f"{fl.value:,.0f} FLOP")
    formula_expander("Formula: FLOPs of the step", f"`{fl.symbolic}`\n\n{fl.formula}\n\nSource: {fl.source}")
    df = pd.DataFrame({
        "op": [r["name"] for r in rows],
        "kind": [r["kind"] for r in rows],
        "runs (layers)": [r["count"] for r in rows],
        "GFLOP (one run)": [r["flops"] / GFLOP for r in rows],
        "weights read (MB)": [r["weight_bytes"] / MB for r in rows],
        "KV read (MB)": [r["kv_read_bytes"] / MB for r in rows],
        "KV written (MB)": [r["kv_write_bytes"] / MB for r in rows],
        "shape": [r["shape"] for r in rows],
        "layer group": [r["group"] or "" for r in rows],
    })
    num = st.column_config.NumberColumn(format="%.4g")
    df_with_download(df, name, height=table_height(len(df)), column_config={
        "GFLOP (one run)": num, "weights read (MB)": num, "KV read (MB)": num, "KV written (MB)": num},
        show={"op": None, "shape": None, "runs (layers)": "runs", "GFLOP (one run)": "GFLOP",        # 1366 px wide
              "weights read (MB)": "weights (MB)", "KV read (MB)": None, "KV written (MB)": None})


def main() -> None:
    """The inputs in one row and the parameters by component under them (a projector's first screen at 1366×768);
    the intro, the formulas and the op-by-op tables below."""
    setup_page("Model anatomy", icon=":material/account_tree:")
    st.title("Model anatomy")
    top = st.container()                  # the inputs and the chart; the sidebar's notes on the world come after
    st.markdown(
        "A transformer is a short list of matrix multiplications repeated layer after layer, so its size and its "
        "cost are both readable from a handful of architecture numbers. Pick a model in the sidebar to see where "
        "its parameters sit and which tensor shapes one forward pass multiplies, for a whole prompt and for one "
        "new token.")
    config = model_source()
    setup = multi_gpu_sidebar(config, None)
    if config is None:
        st.info("Choose a model to size in the sidebar.")
        return
    cols = top.columns(3)
    dtype = choice_field("Weight precision", WEIGHT_DTYPES, "bf16", key="anatomy.dtype", where=cols[0])
    s = int_field("Prompt tokens s", min(2048, config.max_position_embeddings), 1, config.max_position_embeddings,
                  key="anatomy.tokens", where=cols[1], help="Prefill processes s tokens; decode adds one token "
                                                            "whose attention reads s cached positions.")
    batch = int_field("Batch B (sequences)", 1, 1, 65536, key="anatomy.batch", where=cols[2])
    units_note()
    try:
        parameters_section(config, dtype, top)
        if setup is not None and setup.mesh.gpus_per_replica > 1:
            w = per_gpu_weight_bytes(config, setup.mesh, dtype, embeddings_16bit=setup.embeddings_16bit)
            st.info(f"Split over {setup.label()}: the busiest GPU holds {fmt_bytes(w)} of these weights "
                    "(calculators.multi_gpu.tensor_parallel.per_gpu_weight_bytes; see Beyond one GPU → Parallelism).")
    except SpecError as e:
        show_error(e)
        return
    if s is None or batch is None:
        return
    st.subheader("Op by op: the shapes of one forward pass")
    st.markdown(
        "Each row is one operation of ONE layer (the *runs* column says how many layers repeat it). In prefill "
        "the activations have s rows, so the same weights are reused s times; in decode they have one row, so "
        "every weight is read for a single multiply-add. Attention FLOPs count the full s × s rectangle (no "
        "causal saving), the convention the engine's counters follow.")
    prefill, decode = st.tabs([f"Prefill: {s:,} tokens", f"Decode: 1 token, {s:,} keys"])
    try:
        with prefill:
            ops_table(config, s, s, batch, dtype, "ops_prefill")
        with decode:
            ops_table(config, 1, s, batch, dtype, "ops_decode")
    except SpecError as e:
        show_error(e)


main()
