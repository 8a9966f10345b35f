"""The chosen plan on the Capacity planner page: the same layout at the requested rate (`serve_at`: capacity and
the verdict), how far such a prediction can be trusted (the held-out error of its regime in the published table),
and the command lines that launch it (`calculators.planning.launch`). Pages only call `chosen_plan_section`."""
from __future__ import annotations

import streamlit as st

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.launch import launch_commands, plan_from_row
from calculators.planning.planner import layout_words
from calculators.planning.accuracy import band
from calculators.sizing.roofline import compute_precision_for
from calculators.planning.serve_at import serve_at
from specs.devices import load_device
from specs.model_config import SpecError


def regime_band(vendor: str | None = None, precision: str | None = None, moe: bool | None = None) -> str:
    """The held-out error of predictions under a rate (`calculators.planning.accuracy`)."""
    return band("under_rate", vendor, precision, moe)["text"]


def chosen_plan_section(config, best: dict, wl, stack, max_model_len: int, usable_fraction: float) -> None:
    st.subheader("The chosen plan at your rate, and how to launch it")
    try:
        dev = load_device(best["device"])
        r = serve_at(config, dev, Mesh(tp=best["tp"], pp=best["pp"], ep=best["ep"], gpus=best["gpus"]),
                     wl.requests_per_s, wl.prompt_lengths(), wl.output_lengths(), best["weight_dtype"],
                     best["kv_dtype"], stack, max_num_seqs=best["batch_cap"])
    except SpecError as e:
        st.warning(f"The plan could not be re-evaluated: {e}")
        return
    c = st.columns(4)
    c[0].metric("Capacity", f"{r['capacity_requests_per_s']:,.3g} req/s", help=r["verdict"])
    c[1].metric("TTFT p50 / p99", f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p99_ms']:,.0f} ms")
    c[2].metric("ITL mean / p99", f"{r['tpot_ms']:,.0f} / {r['itl_p99_ms']:,.0f} ms")
    c[3].metric("In flight per replica", f"{r['in_flight_per_replica']:,.1f}")
    st.caption(f"{r['verdict'][0].upper()}{r['verdict'][1:]}. How far to trust these: "
               f"{regime_band(dev.vendor, compute_precision_for(best['weight_dtype']), bool(config.num_experts))}.")
    cmds = launch_commands(plan_from_row(best, config.name, max_model_len, usable_fraction))
    tabs = st.tabs([f"{name}" for name in cmds])
    for tab, (name, cmd) in zip(tabs, cmds.items()):
        with tab:
            st.code(cmd.shell, language="bash", wrap_lines=True)
            for note in cmd.notes:
                st.caption(f"• {note}")


def disaggregated_section(config, best: dict, wl, devices: list, stack) -> None:
    """Disaggregated prefill and decode pools (`calculators.planning.disaggregated`) beside the cheapest co-located
    plan at the same targets: GPUs, $ per 1M tokens, TTFT p99 and ITL of each, and which wins."""
    import pandas as pd
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.disaggregated import size_disaggregated
    from ui.widgets import df_with_download
    st.subheader("Disaggregated prefill and decode, beside the co-located plan")
    st.caption("Prefill instances (one prompt at a time) and decode instances (a batch as large as the ITL target "
               "allows) sized apart, the prompt's KV cache handed from one to the other over InfiniBand NDR.")
    names = [d.name for d in devices]
    c = st.columns(4)
    pdev = c[0].selectbox("Prefill device", names, index=names.index(best["device"]), key="plan.pd.pdev")
    ptp = c[1].selectbox("Prefill TP", (1, 2, 4, 8), index=2, key="plan.pd.ptp")
    ddev = c[2].selectbox("Decode device", names, index=names.index(best["device"]), key="plan.pd.ddev")
    dtp = c[3].selectbox("Decode TP", (1, 2, 4, 8), index=1, key="plan.pd.dtp")
    dev = {d.name: d for d in devices}
    try:
        r = size_disaggregated(config, dev[pdev], Mesh(tp=ptp), dev[ddev], Mesh(tp=dtp), wl.requests_per_s,
                               wl.prompt_tokens, wl.output_tokens, wl.itl_ms, best["weight_dtype"], best["kv_dtype"],
                               stack=stack)
    except SpecError as e:
        st.warning(f"Disaggregated serving does not work here: {e}")
        return
    rows = [dict(design="disaggregated", GPUs=r["total_gpus"],
                 layout=f"{r['prefill_instances']} × prefill TP {ptp} on {pdev} + {r['decode_instances']} × decode "
                        f"TP {dtp} on {ddev} (batch {r['decode_batch']})",
                 usd_per_million_tokens=r["usd_per_million_tokens"], ttft_p99_ms=r["ttft_p99_ms"],
                 itl_ms=r["itl_ms"]),
            dict(design="co-located (the cheapest plan)", GPUs=best["gpus"],
                 layout=(f"{best['replicas']} × " if best["dp"] == 1 else "") + f"{layout_words(best)} on {best['device']}",
                 usd_per_million_tokens=best["usd_per_million_tokens"], ttft_p99_ms=best["ttft_p99_ms"],
                 itl_ms=best["itl_at_load_ms"])]
    df_with_download(pd.DataFrame(rows), "disaggregated_vs_colocated", column_config={
        k: st.column_config.NumberColumn(format="%.4g") for k in ("usd_per_million_tokens", "ttft_p99_ms", "itl_ms")})
    d, co = rows
    if d["usd_per_million_tokens"] is None or co["usd_per_million_tokens"] is None:
        return
    cheaper = d if d["usd_per_million_tokens"] < co["usd_per_million_tokens"] else co
    ttft_ok = d["ttft_p99_ms"] <= wl.ttft_p99_ms
    st.markdown(f"**{cheaper['design'].split(' (')[0].capitalize()} is cheaper here** "
                f"(${d['usd_per_million_tokens']:.3f} against ${co['usd_per_million_tokens']:.3f} per 1M tokens). "
                f"Disaggregated, every decode step is free of prefills, so its ITL is decode alone "
                f"({d['itl_ms']:.1f} ms); its TTFT p99 is {d['ttft_p99_ms']:,.0f} ms"
                f"{'' if ttft_ok else ', above the target'}, including {r['kv_handoff_ms']:.1f} ms of KV handoff.")
