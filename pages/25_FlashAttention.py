"""FlashAttention: the memory traffic of attention when the score matrix S and its softmax P go through HBM
(three kernels) versus tiled in on-chip memory (one kernel), the resulting intensity and time, vs sequence length.

Numbers: `calculators.sizing.flash_attention` (flash_attention_report, attention_tensor_bytes, tile_bytes),
`calculators.explain` (formulas).
"""
from __future__ import annotations

import inspect

import pandas as pd
import plotly.express as px
import streamlit as st

from calculators.explain import explain_arithmetic_intensity, explain_bandwidth_floor, explain_unfused_attention
from calculators.sizing.flash_attention import flash_attention_report, tiled_attention_hbm_bytes
from calculators.units import GB, MB, bytes_per_element, fmt_bytes, fmt_num
from specs.model_config import SpecError
from ui import df_with_download, formula_expander, int_field, setup_page, show_error
from ui.multi_gpu import multi_gpu_sidebar
from ui.model_source import choice_field, fmt_si, sizing_inputs, table_height
from ui.world import world_weight_dtype
from ui.charts import style as chart_style
from ui.metrics import metric_row

DTYPES = ("fp32", "bf16", "fp16", "fp8")
SEQ_GRID = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
MEASURES = {"HBM traffic per prefill (GB)": ("bytes_per_prefill", GB), "time at peak bandwidth (ms)": ("time_ms", 1),
            "intensity (FLOP/byte)": ("intensity_flop_per_byte", 1)}


def chart(where, reports: dict, N: int, d: int, h: int, L: int, dtype: str) -> None:
    """The unfused and tiled kernels' traffic, time or intensity against N (its switch above it), in `where`."""
    measure = where.radio("Chart", list(MEASURES), horizontal=True, key="fa.measure")
    key, scale = MEASURES[measure]
    rows = [{"N": n, "kernel": k, measure: r[k][key] / scale} for n, r in reports.items() for k in ("unfused", "tiled")]
    fig = px.line(pd.DataFrame(rows), x="N", y=measure, color="kernel", markers=True, log_x=True, log_y=True,
                  title=f"{measure} vs sequence length ({h} heads × {L} layers, d = {d}, {dtype})")
    fig.add_vline(x=N, line_dash="dot", line_color="gray", annotation_text=f"N = {N:,}",
                  annotation_position="bottom right")
    fig.update_layout(height=440, margin=dict(l=10, r=10, t=50, b=10))
    fig.update_xaxes(dtick=1, tickformat=",~g")
    fig.update_yaxes(dtick=1, tickformat=",~g")
    where.plotly_chart(chart_style(fig))
    where.caption("Unfused traffic grows with N² (the score matrices); tiled traffic grows with N²·d / B_q (K and V "
                  "re-read per query block), a factor of about 2·B_q / d smaller for long sequences.")


def main() -> None:
    """The inputs in one row and the traffic chart under them (a projector's first screen at 1366×768); the
    intro, the numbers at this N, the formulas and the tables below."""
    setup_page("FlashAttention", icon=":material/bolt:")
    st.title("FlashAttention")
    top = st.container()                  # the inputs and the chart; the sidebar's notes on the world come after
    chosen = sizing_inputs()
    if chosen is None:
        return
    config, device = chosen
    multi_gpu_sidebar(config, device)         # attention traffic per head does not depend on the layout
    cols = top.columns(6)
    N = int_field("Sequence length N", min(2048, config.max_position_embeddings), 1, 1 << 20, key="fa.seq",
                  where=cols[0], help="Tokens in the prompt (prefill): S and P are N × N per head.")
    d = int_field("Head dim d", config.head_dim, 1, 1 << 14, key=f"fa.d.{config.name}", where=cols[1])
    h = int_field("Heads", config.num_heads, 1, 1 << 14, key=f"fa.h.{config.name}", where=cols[2])
    L = int_field("Layers", config.num_layers, 1, 10_000, key=f"fa.L.{config.name}", where=cols[3],
                  help="Attention layers (a hybrid model has fewer than its layer count).")
    dtype_default, dtype_key = world_weight_dtype("fa.dtype", device, "fp16")     # fp32: the engine's own
    dtype = choice_field("Precision", DTYPES, dtype_default, key=dtype_key, where=cols[4])
    bq = int_field("Query block B_q", 128, 1, 1 << 16, key="fa.block", where=cols[5],
                   help="Rows of Q a tile holds on chip; K and V are streamed once per block.")
    if None in (N, d, h, L, bq):
        return
    bw = device.memory_bandwidth_bytes_per_s
    try:
        device.ridge_flop_per_byte(dtype)                       # a device without this precision says so here
        rep = flash_attention_report(N, d, h, L, bw, dtype, bq)
        grid = [n for n in SEQ_GRID if n != N] + [N]
        reports = {n: flash_attention_report(n, d, h, L, bw, dtype, bq) for n in sorted(grid)}
    except SpecError as e:
        show_error(e)
        return
    un, ti = rep["unfused"], rep["tiled"]
    chart(top, reports, N, d, h, L, dtype)
    st.markdown(
        "Plain attention writes the N × N score matrix to GPU memory, reads it back for the softmax, writes the "
        "probabilities, and reads them again for the weighted sum of values: for long prompts that traffic "
        "dwarfs Q, K and V themselves. A tiled kernel keeps each block of scores in on-chip memory, so the same "
        "FLOPs move far fewer bytes.")
    st.subheader(f"N = {N:,}, d = {d}, {h} heads × {L} layers, {dtype}, on {device.name}")
    metric_row([("Traffic per head, unfused", fmt_bytes(un["bytes_per_head"]),
                 f"tiled: {fmt_bytes(ti['bytes_per_head'])}"),
                ("Traffic per prefill, unfused", fmt_bytes(un["bytes_per_prefill"]), None,
                 f"tiled {fmt_bytes(ti['bytes_per_prefill'])}"),
                ("Time at peak bandwidth, unfused (ms)", fmt_num(un["time_ms"], 3), None,
                 f"tiled {fmt_num(ti['time_ms'], 3)}"),
                ("Intensity, unfused (FLOP/B)", fmt_num(un["intensity_flop_per_byte"], 3), None,
                 f"tiled {fmt_num(ti['intensity_flop_per_byte'], 3)}")])
    ridge = device.ridge_flop_per_byte(dtype)
    where = "below" if un["intensity_flop_per_byte"] < ridge else "above"
    st.caption(f"Tiling moves {fmt_num(rep['traffic_ratio'], 3)}× fewer bytes for the same "
               f"{fmt_si(rep['flops_per_head'], 'FLOP')} per head (QKᵀ and P·V over the full N × N square). "
               f"Unfused, attention does {fmt_num(un['intensity_flop_per_byte'], 3)} FLOP per byte, {where} "
               f"{device.name}'s ridge point of {fmt_num(ridge, 3)} FLOP/byte ({dtype}); tiled, "
               f"{fmt_num(ti['intensity_flop_per_byte'], 3)}.")
    uf = explain_unfused_attention(N, d, bytes_per_element(dtype))
    ai_u = explain_arithmetic_intensity(rep["flops_per_head"], un["bytes_per_head"])
    ai_t = explain_arithmetic_intensity(rep["flops_per_head"], ti["bytes_per_head"])
    t_u = explain_bandwidth_floor(un["bytes_per_prefill"], bw)
    formula_expander(
        "Formulas: traffic, intensity, time",
        f"**Unfused, one head** `{uf.symbolic}`\n\n{uf.formula}\n\n{uf.description} (Source: {uf.source})\n\n"
        f"**Tiled, one head** (`calculators.sizing.flash_attention.tiled_attention_hbm_bytes`): "
        f"{inspect.getdoc(tiled_attention_hbm_bytes)}\n\n"
        f"**Intensity unfused** `{ai_u.symbolic}` = {ai_u.formula}\n\n**Intensity tiled** = {ai_t.formula}\n\n"
        f"**Time unfused** = traffic per head × heads × layers / bandwidth: {t_u.formula}")
    t = rep["tensors"]
    sizes = pd.DataFrame({
        "tensor (one head)": ["Q", "K", "V", "O", "S = QKᵀ", "P = softmax(S)", "score tile (on chip)",
                              "Q block (on chip)"],
        "shape": [f"[{N}, {d}]"] * 4 + [f"[{N}, {N}]"] * 2 + [f"[{bq}, {bq}]", f"[{bq}, {d}]"],
        "size (MB)": [v / MB for v in (t["q"], t["k"], t["v"], t["o"], t["s"], t["p"], rep["tile"]["score_tile"],
                                       rep["tile"]["q_block"])],
    })
    table = pd.DataFrame({
        "N": list(reports),
        "unfused per head (MB)": [r["unfused"]["bytes_per_head"] / MB for r in reports.values()],
        "tiled per head (MB)": [r["tiled"]["bytes_per_head"] / MB for r in reports.values()],
        "unfused per prefill (GB)": [r["unfused"]["bytes_per_prefill"] / GB for r in reports.values()],
        "tiled per prefill (GB)": [r["tiled"]["bytes_per_prefill"] / GB for r in reports.values()],
        "unfused time (ms)": [r["unfused"]["time_ms"] for r in reports.values()],
        "tiled time (ms)": [r["tiled"]["time_ms"] for r in reports.values()],
        "unfused FLOP/byte": [r["unfused"]["intensity_flop_per_byte"] for r in reports.values()],
        "tiled FLOP/byte": [r["tiled"]["intensity_flop_per_byte"] for r in reports.values()],
        "traffic ratio": [r["traffic_ratio"] for r in reports.values()],
    })
    df_with_download(table, "flash_attention_vs_seq_len", height=table_height(len(table)),
                     column_config={c: st.column_config.NumberColumn(format="%.4g") for c in table.columns[1:]},
                     show={"N": None, "unfused per head (MB)": "unfused/head (MB)",     # short headings: 1366 px
                           "tiled per head (MB)": "tiled/head (MB)", "unfused per prefill (GB)": "unfused (GB)",
                           "tiled per prefill (GB)": "tiled (GB)", "unfused time (ms)": "unfused (ms)",
                           "tiled time (ms)": "tiled (ms)", "unfused FLOP/byte": "unfused FLOP/B",
                           "tiled FLOP/byte": "tiled FLOP/B", "traffic ratio": "ratio"})
    st.markdown("**Tensor sizes at this N** (what the unfused kernels write out; the tiled kernel only ever holds "
                "the two on-chip blocks)")
    df_with_download(sizes, "attention_tensor_sizes",
                     column_config={"size (MB)": st.column_config.NumberColumn(format="%.4g")})


main()
