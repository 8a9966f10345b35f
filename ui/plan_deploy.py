"""The chosen plan on the Capacity planner page: the headline that names the deployment, the same layout at the
requested rate (`serve_at`: capacity and the verdict), how far each prediction can be trusted (the held-out error
of its regime in the published table), the command lines that launch it (`calculators.planning.launch`), one
GPU's memory, the cost, and the plan's formulas with its numbers (`calculators.planning.plan_explain`). Pages only
call `headline` and `chosen_plan_section`."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from calculators.claims import cheaper_claim, itl_target_claim, plan_claim, plural
from calculators.planning.planner import layout_words as plan_layout_words, server_instances
from calculators.planning.accuracy import band
from calculators.planning.launch import launch_commands, plan_from_row
from calculators.planning.rank_wait import rank_wait_words
from calculators.planning.plan_explain import (formula_markdown, max_batched_tokens, memory_and_cost, plan_formulas,
                                               plan_mesh)
from calculators.planning.serve_at import serve_at
from calculators.units import fmt_bytes
from specs.devices import load_device
from specs.model_config import SpecError
from ui.metrics import metric_row
from ui.widgets import formula_expander

FORMULA_LABELS = {"lambda_per_replica": "λ per replica", "decode_rows": "n, decode rows per step",
                  "prompt_tokens_per_step": "p, prompt tokens per step", "weights_memory_ms": "weights read, step(n, p)",
                  "gemm_compute_ms": "weight GEMMs, step(n, p)", "kv_memory_ms": "KV cache read, step(n, p)",
                  "attention_compute_ms": "attention, step(n, p)", "step_ms": "step(n, p)",
                  "rank_wait_ms": "waiting for the busiest attention rank",
                  "itl_at_load_ms": "ITL at the load = τ", "ttft_p99_ms": "TTFT p99",
                  "usd_per_million_tokens": "$ per 1M tokens (blended)", "prefill_share": "prefill's share of GPU time",
                  "usd_per_million_input_tokens": "$ per 1M input tokens",
                  "usd_per_million_output_tokens": "$ per 1M output tokens",
                  "output_tok_s": "output tokens/s", "total_tok_s": "total tokens/s"}


def plan_device(best: dict, devices=()):
    """The plan's device as the planner priced it (the page's edited prices), else from specs/devices.json."""
    return next((d for d in devices if d.name == best["device"]), None) or load_device(best["device"])


PRICING_KEY = "planner.pricing"         # this session's choice: None (closed form) or "auto" (measured kernels)


def pricing_input() -> str | None:
    """The sidebar's choice of what prices each op of a step: kernels measured on the GPU and the stack where a
    device profile is installed (aiconfigurator-core's databases; the nearest profiled GPU for one nothing
    measured), or the closed form. Offered only when some profile of a data-centre GPU is installed."""
    from specs.aiconfigurator_source import package_dir, readers_installed
    if package_dir() is None or not readers_installed():
        st.session_state[PRICING_KEY] = None
        return None
    import os
    default = os.environ.get("INFERENCE_LAB_PROFILE", "auto") != "none"      # the commands' default, the same
    on = st.sidebar.toggle("Price each op from measured kernels", value=default, key="planner.measured",
                           help="aiconfigurator-core's kernels measured on each GPU and serving stack, interpolated "
                                "op by op, the datasheet roofline beside them (docs/measured-kernels.md); off: "
                                "the closed form at the stack's fitted efficiencies")
    st.session_state[PRICING_KEY] = "auto" if on else None
    return st.session_state[PRICING_KEY]


def device_profile(device, config, stack, pricing: str | None):
    """The profile that prices `device` under `pricing` ("auto": measured kernels; None: the closed form)."""
    if pricing is None:
        return None
    from calculators.planning.measured_step import resolve_profile
    from specs.stacks import load_stack
    return resolve_profile(pricing, device, load_stack(stack).full_key, config)[0]


def plan_profile(best: dict, config, stack, devices=()):
    """The profile that priced the plan's device in this session (None: the closed form)."""
    return device_profile(plan_device(best, devices), config, stack, st.session_state.get(PRICING_KEY))


def error_band(regime: str, device, weight_dtype: str, config, profile=None, wide_ep: bool = False) -> str:
    """The held-out error of predictions in `regime` for this vendor, precision and dense/MoE model
    (`calculators.planning.accuracy.band`), with its 'outside what was validated' note when there is one, of the
    pricing that made them (`measured`: from measured kernels). The weights' own format is asked for (int4 weights
    compute in bf16 but no held-out row ran int4 weights). `profile`: the device profile that priced them (None:
    the closed form); one measured on another GPU adds the held-out error of this vendor's rows priced so;
    `wide_ep` (a layout with attention DP) adds the held-out error of such rows."""
    from calculators.planning.step import borrowed
    return band(regime, device.vendor or None, weight_dtype, bool(config.num_experts), measured=profile is not None,
                borrowed=borrowed(profile, device), wide_ep=wide_ep)["text"]


def layout_words(r: dict) -> str:
    """"2/1/1/1": no spaces, so the headline's value fits its column on one line with Large text ("2 / 1 / 1 /" and
    "1" on a second line at 1366×768)."""
    return f"{r['tp']}/{r['pp']}/{r.get('ep', 1)}/{r.get('dp', 1)}"


def evaluate_at_rate(config, best: dict, wl, stack, devices=()) -> tuple[dict | None, str | None]:
    """The plan at the requested rate (`serve_at`), once: the headline and the section under it both read this
    result. (None, why) when it cannot be evaluated (a p99 request past the context window)."""
    try:
        dev = plan_device(best, devices)
        return serve_at(config, dev, plan_mesh(best), wl.requests_per_s, wl.prompt_lengths(), wl.output_lengths(),
                        best["weight_dtype"], best["kv_dtype"], stack, max_num_seqs=best["batch_cap"],
                        profile=plan_profile(best, config, stack, devices)), None
    except SpecError as e:
        return None, str(e)


def headline(best: dict, wl, config, stack, devices=(), at: dict | None = None, unchecked: str | None = None,
             chart: Callable[[], None] | None = None) -> None:
    """The cheapest plan named in three rows of short metrics (each value fits its column in both text sizes), the
    sentence (`calculators.claims.plan_claim` of the evaluation at the rate, `at`), and how far its predicted
    numbers can be trusted. `chart` (drawn after the two rows that name the plan and what binds it): the page's
    key chart, on a projector's first screen at 1366×768 in both text sizes."""
    dev = plan_device(best, devices)
    err = error_band("under_rate", dev, best["weight_dtype"], config,
                     profile=plan_profile(best, config, stack, devices), wide_ep=best.get("dp", 1) > 1)
    mbt = max_batched_tokens(config, dev, best, wl, stack)
    cost = memory_and_cost(best, dev.price_usd_per_hour)
    c = st.columns([1.6, 1.1, 1, 1])
    c[0].metric("Cheapest plan", f"{best['gpus']} × {best['device']}",
                help=f"{plural(best['gpus'], 'GPU')} of {best['device']} in {plural(best['replicas'], 'replica')}")
    c[1].metric("TP / PP / EP / DP", layout_words(best), help="tensor, pipeline, expert and data parallel degrees "
                "inside one replica")
    c[2].metric("Weights / KV", f"{best['weight_dtype']} / {best['kv_dtype']}", help="weight and KV-cache precision")
    c[3].metric("Replicas", f"{server_instances(best):,}", help="copies of the model (server instances), each serving its share of "
                "the rate" + (f"; each runs attention in {best['dp']} data-parallel ranks" if best.get("dp", 1) > 1
                              else ""))
    c = st.columns([1.6, 1.1, 1, 1])
    c[0].metric("Binding constraint", best["binding"], help=best["why"])
    c[1].metric("Batch cap", f"{best['batch_cap']:,}", help="max sequences in flight per replica (max_num_seqs)")
    c[2].metric("Max batched tokens", f"{mbt:,}", help="tokens one step may carry (the stack's default for this "
                "GPU, max_num_batched_tokens): the prefill budget the plan assumed")
    c[3].metric("$ per hour", "—" if cost["usd_per_hour"] is None else f"${cost['usd_per_hour']:,.2f}",
                help=f"{best['gpus']} × the {best['device']} price per GPU-hour")
    if chart is not None:
        chart()
    replicas = f"{plural(best['replicas'], 'replica')}, " if best.get("dp", 1) == 1 else ""   # layout_words names groups
    st.markdown(f"**{best['gpus']} × {best['device']}**: {plan_layout_words(best)}, {replicas}batch cap "
                f"{best['batch_cap']:,}, weights {best['weight_dtype']}, KV {best['kv_dtype']}. "
                + plan_claim(best, wl.itl_ms, wl.ttft_p99_ms, at, unchecked))
    itl = at["tpot_ms"] if at is not None else best["itl_at_load_ms"]
    ttft = at["ttft_p99_ms"] if at is not None else best["ttft_p99_ms"]
    c = st.columns(4)
    c[0].metric("$ per 1M output tokens", f"${best['usd_per_million_output_tokens']:.3f}",
                help=f"The GPU time spent decoding, per output token. Error: {err}.")
    c[1].metric("$ per 1M input tokens", f"${best['usd_per_million_input_tokens']:.3f}",
                help=f"The GPU time spent on prefill, per prompt token. Error: {err}.")
    c[2].metric("Mean ITL at the load", f"{itl:.1f} ms", help=f"target {wl.itl_ms:g} ms (the mean gap), with "
                f"{best['concurrency_per_replica']:.1f} requests in flight per replica and the prefills' share of "
                f"every step; decode alone at the batch cap: {best['itl_ms']:.1f} ms. Error: {err}.")
    c[3].metric("TTFT p99", f"{ttft:,.0f} ms", help=f"target {wl.ttft_p99_ms:g} ms. Error: {err}.")
    st.caption(f"Error bars of these predictions (measured on held-out published runs), {err}. Input and output "
               f"tokens priced by the GPU time each takes (prefill vs decode); blended over the workload's "
               f"{wl.prompt_tokens:,} + {wl.output_tokens:,} tokens per request, "
               f"${best['usd_per_million_tokens']:.3f} per 1M tokens (the ranking uses the blend).")


def chosen_plan_section(config, best: dict, wl, stack, max_model_len: int, usable_fraction: float,
                        devices=(), r: dict | None = None, unchecked: str | None = None) -> None:
    """The plan at the rate (`r`, the headline's own evaluation), its launch commands, memory and formulas."""
    st.subheader("The chosen plan at your rate, and how to launch it")
    dev = plan_device(best, devices)
    if r is None:
        st.warning(f"Not checked at your rate: {unchecked}. The commands below launch the plan as the search sized "
                   "it.")
        launch_tabs(config, best, max_model_len, usable_fraction)
        memory_and_cost_rows(best, dev)
        return
    err = error_band("under_rate", dev, best["weight_dtype"], config,
                     profile=plan_profile(best, config, stack, devices), wide_ep=best.get("dp", 1) > 1)
    metric_row([("Capacity (req/s)", f"{r['capacity_requests_per_s']:,.3g}", f"{r['verdict']}. Error: {err}."),
                ("TTFT p50 / p99 (ms)", f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p99_ms']:,.0f}", f"Error: {err}."),
                ("ITL mean / p99 (ms)", f"{r['tpot_ms']:,.0f} / {r['itl_p99_ms']:,.0f}", f"Error: {err}."),
                ("In flight per replica", f"{r['in_flight_per_replica']:,.1f}", f"Error: {err}.")])
    st.caption(f"{r['verdict'][0].upper()}{r['verdict'][1:]}. {itl_target_claim(r['tpot_ms'], r['itl_p99_ms'], wl.itl_ms)}"
               f"{rank_wait_words(r.get('rank_wait_ms') or 0.0, r['step_ms'], int(best.get('dp', 1)))}"
               f" How far to trust these: {err}.")
    launch_tabs(config, best, max_model_len, usable_fraction)
    memory_and_cost_rows(best, dev)
    try:
        lines = plan_formulas(config, dev, best, wl, stack, r)
    except SpecError as e:
        st.caption(f"The plan's formulas could not be filled in: {e}")
        return
    formula_expander("This plan's formulas, with its numbers", formula_markdown(lines, FORMULA_LABELS) +
                     "\n\nThe step, the steady state and the cost: calculators.planning.planner, "
                     "calculators.serving.steady_state, calculators.planning.serve_at.")


def launch_tabs(config, best: dict, max_model_len: int, usable_fraction: float) -> None:
    """One tab per serving stack with its command, one flag a line (a narrow page breaks between flags)."""
    cmds = launch_commands(plan_from_row(best, config.name, max_model_len, usable_fraction))
    for tab, (name, cmd) in zip(st.tabs(list(cmds)), cmds.items()):
        with tab:
            st.code(cmd.shell_lines, language="bash")
            for note in cmd.notes:
                st.caption(f"• {note}")


def memory_and_cost_rows(best: dict, dev) -> None:
    """One GPU's memory as the plan sized it, against what is usable, and what the deployment costs."""
    m = memory_and_cost(best, dev.price_usd_per_hour)
    st.markdown("**Memory of one GPU, and the cost**")
    c = st.columns(4)
    c[0].metric("Weights per GPU", fmt_bytes(m["weights_bytes"]), help="this GPU's share of the weights")
    c[1].metric("KV cache per GPU", fmt_bytes(m["kv_bytes"]), help=f"{best['batch_cap']} sequences of the mean "
                "prompt + output (the batch cap)")
    c[2].metric("Other per GPU", fmt_bytes(m["other_bytes"]), help="activations, CUDA context and graphs, "
                "communication buffers")
    c[3].metric("Usable per GPU", fmt_bytes(m["usable_bytes"]), help=f"needed {fmt_bytes(m['needed_bytes'])}, "
                f"{fmt_bytes(m['free_bytes'])} left (more KV room at run time)")
    hour = "no price" if m["usd_per_hour"] is None else f"${m['usd_per_hour']:,.2f} per hour"
    st.caption(f"Needed {fmt_bytes(m['needed_bytes'])} of {fmt_bytes(m['usable_bytes'])} usable per GPU. Cost: "
               f"{hour} for {plural(best['gpus'], 'GPU')}; ${m['usd_per_million_input_tokens']:.3f} per 1M input and "
               f"${m['usd_per_million_output_tokens']:.3f} per 1M output tokens at this load.")


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
                 layout=(f"{best['replicas']} × " if best["dp"] == 1 else "") + f"{plan_layout_words(best)} on {best['device']}",
                 usd_per_million_tokens=best["usd_per_million_tokens"], ttft_p99_ms=best["ttft_p99_ms"],
                 itl_ms=best["itl_at_load_ms"])]
    df_with_download(pd.DataFrame(rows), "disaggregated_vs_colocated", column_config={
        **{k: st.column_config.NumberColumn(format="%.4g") for k in ("usd_per_million_tokens", "ttft_p99_ms", "itl_ms")},
        "layout": st.column_config.TextColumn(width="large")},
        show={"design": None, "GPUs": None, "usd_per_million_tokens": "$/1M tokens", "ttft_p99_ms": "TTFT p99 ms",
              "itl_ms": "ITL ms", "layout": None})
    d, co = rows
    if d["usd_per_million_tokens"] is None or co["usd_per_million_tokens"] is None:
        return
    ttft_ok = d["ttft_p99_ms"] <= wl.ttft_p99_ms
    st.markdown(cheaper_claim("disaggregated", d["usd_per_million_tokens"], "co-located",
                              co["usd_per_million_tokens"]) + " "
                f"Disaggregated, every decode step is free of prefills, so its ITL is decode alone "
                f"({d['itl_ms']:.1f} ms); its TTFT p99 is {d['ttft_p99_ms']:,.0f} ms"
                f"{'' if ttft_ok else ', above the target'}, including {r['kv_handoff_ms']:.1f} ms of KV handoff.")
