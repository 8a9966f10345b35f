"""The chosen plan on the Capacity planner page: the same layout at the requested rate (`serve_at`: capacity and
the verdict), how far such a prediction can be trusted (the held-out error of its regime in the published table),
and the command lines that launch it (`calculators.planning.launch`). Pages only call `chosen_plan_section`."""
from __future__ import annotations

import streamlit as st

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.launch import launch_commands, plan_from_row
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
