"""Planner page pieces for issue 17: the serving stack and prefix-cache inputs, the cost-latency frontier of every
feasible plan, and the maximum throughput of a chosen deployment. The page only wires them."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calculators.planning.frontier import collapse_near_duplicates, pareto_front
from calculators.planning.plan_explain import formula_markdown, throughput_formulas
from calculators.planning.planner import layout_words
from calculators.planning.throughput import max_throughput
from specs.model_config import SpecError
from specs.stacks import list_stacks, load_stack
from ui.charts import style as chart_style
from ui.widgets import df_with_download, float_field, formula_expander, int_field, show_error

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]


def stack_inputs() -> tuple[str, float] | None:
    """The serving stack (default vLLM) and the prefix-cache hit rate (%)."""
    c = st.columns(2)
    keys = list_stacks()
    key = c[0].selectbox("Serving stack", keys, index=0, key="plan.stack", format_func=lambda k: load_stack(k).name,
                         help="Sets the all-reduce algorithm, the scheduler limits, the efficiencies and the fixed "
                              "step cost (specs/stacks.json, each number with its source). vLLM is what most "
                              "deployments run.")
    hit = float_field("Prefix-cache hit rate (%)", 0.0, 0.0, 99.0, key="plan.prefix_hit", where=c[1], step=5.0,
                      help="Share of each prompt already in the prefix cache (a shared system prompt): those "
                           "tokens are not prefilled again.")
    return None if hit is None else (key, hit / 100)


def frontier_chart(res, metric: str = "ttft_p99_ms", chosen: dict | None = None) -> None:
    """Every feasible plan as cost per 1M tokens against latency, coloured by device, near-duplicates collapsed,
    the Pareto front drawn, the chosen plan marked."""
    cols = res.columns
    idx = [int(i) for i in res.feasible_order]
    if not idx:
        return
    pts = [dict(device=cols["device"][i], gpus=int(cols["gpus"][i]), batch_cap=int(cols["batch_cap"][i]),
                tp=int(cols["tp"][i]), pp=int(cols["pp"][i]), ep=int(cols["ep"][i]), dp=int(cols["dp"][i]),
                wd=cols["weight_dtype"][i],
                cost=float(cols["usd_per_million_tokens"][i]), lat=float(cols[metric][i])) for i in idx]
    pts = collapse_near_duplicates(pts, "lat", "cost")
    front = pareto_front(pts, "lat", "cost")
    label = "TTFT p99 (ms)" if metric == "ttft_p99_ms" else "ITL (ms)"
    fig = go.Figure()
    for k, dev in enumerate(sorted({p["device"] for p in pts})):
        mine = [p for p in pts if p["device"] == dev]
        fig.add_scatter(x=[p["lat"] for p in mine], y=[p["cost"] for p in mine], mode="markers", name=dev,
                        marker=dict(size=10, color=PALETTE[k % len(PALETTE)], opacity=0.75),
                        text=[f"{p['gpus']}× {layout_words(p)} b≤{p['batch_cap']} {p['wd']} "
                              f"({p['represents']} plan{'s' if p['represents'] > 1 else ''})" for p in mine],
                        hovertemplate="%{text}<br>%{x:.3g} ms, $%{y:.3g}<extra></extra>")
    fig.add_scatter(x=[p["lat"] for p in front], y=[p["cost"] for p in front], mode="lines+markers",
                    name="Pareto front", line=dict(color="black", width=2, shape="hv"),
                    marker=dict(size=12, symbol="diamond-open", color="black"))
    if chosen is not None:
        fig.add_scatter(x=[chosen[metric]], y=[chosen["usd_per_million_tokens"]], mode="markers+text",
                        name="chosen plan", text=[f"chosen: {chosen['gpus']}× {chosen['device']}"],
                        textposition="top right", textfont=dict(size=15),
                        marker=dict(size=22, symbol="star", color="#d62728", line=dict(color="black", width=1.5)),
                        hovertemplate="the chosen plan<br>%{x:.3g} ms, $%{y:.3g}<extra></extra>")
    fig.update_layout(height=480, font=dict(size=15), title=f"Every feasible plan: cost against {label}",
                      xaxis_title=label, yaxis_title="$ per 1M tokens at this load", xaxis_type="log",
                      yaxis_type="log", margin=dict(l=10, r=10, t=60, b=10), legend_title_text="device")
    st.plotly_chart(chart_style(fig))
    knee = front[len(front) // 2] if front else None
    st.caption(f"{len(idx):,} feasible plans drawn as {len(pts):,} points (plans within 2% in cost and latency on "
               f"the same device are one point)"
               + (". The red star is the chosen plan" if chosen is not None else "")
               + f". The black line is the Pareto front: {len(front)} plan{'s' if len(front) != 1 else ''} no other "
               "plan beats on both axes; everything above it pays more for no speed."
               + (f" A middle point of the front: {knee['gpus']}× {knee['device']} {layout_words(knee)} at "
                  f"{knee['lat']:.3g} ms for ${knee['cost']:.3g}." if knee else ""))


def what_if_table(config, devices: list, wl, space, stack_key: str, pricing: str | None = None, **plan_kw) -> None:
    """The cheapest plan now, at twice the request rate, and with prompts twice as long, priced as the page's
    search is (`pricing`: "auto" for measured kernels, None for the closed form)."""
    from dataclasses import replace

    from ui.planner_cache import cached_plan
    cases = [("as entered", wl), ("rate × 2", replace(wl, requests_per_s=2 * wl.requests_per_s)),
             ("prompts × 2", replace(wl, prompt_tokens=2 * wl.prompt_tokens,
                                     prompt_tokens_p99=2 * wl.p99_prompt))]
    rows = []
    for name, w in cases:
        try:
            res = cached_plan(config, devices, w, space, None, stack=stack_key, profile=pricing, **plan_kw)
        except SpecError as e:
            rows.append({"what if": name, "cheapest plan": str(e)})
            continue
        if not len(res.feasible_order):
            rows.append({"what if": name, "cheapest plan": res.no_plan_reason()})
            continue
        b = res.plan(int(res.feasible_order[0]))
        rows.append({"what if": name, "cheapest plan": f"{b['gpus']}× {b['device']} {layout_words(b)} "
                     f"b≤{b['batch_cap']} {b['weight_dtype']}", "$ per 1M tokens": b["usd_per_million_tokens"],
                     "TTFT p99 (ms)": b["ttft_p99_ms"], "ITL (ms)": b["itl_ms"], "binding": b["binding"]})
    st.markdown("**What if**: the same search at twice the load and with prompts twice as long.")
    df_with_download(pd.DataFrame(rows), "what_if", column_config={
        c: st.column_config.NumberColumn(format="%.4g") for c in ("$ per 1M tokens", "TTFT p99 (ms)", "ITL (ms)")})


def throughput_section(config, devices: list, wl, stack_key: str, chosen: dict | None = None,
                       pricing: str | None = None) -> None:
    """Maximum throughput of one deployment (all requests queued): `python -m calculators throughput`, priced as
    the page's search is (`pricing`). Opens on the chosen plan's layout (device, GPUs, TP, PP, EP, precisions);
    the widgets are keyed on the plan, so a new plan brings its own defaults back, and a button returns to them
    after edits."""
    from calculators.planning.plan_explain import plan_mesh
    from ui.plan_deploy import FORMULA_LABELS, device_profile, error_band
    st.subheader("Maximum throughput of one deployment")
    names = [d.name for d in devices]
    base = chosen if chosen is not None and chosen["device"] in names else \
        dict(device=names[0], gpus=8, tp=8, pp=1, ep=1, weight_dtype="fp8", kv_dtype="fp8")
    ss = st.session_state
    sig = "{device}.{gpus}.{tp}.{pp}.{ep}.{weight_dtype}.{kv_dtype}".format(**{"ep": 1, **base})
    sig += f".{config.name}.{ss.get('plan.tput.reset', 0)}"
    st.caption(f"Opens on the chosen plan ({base['gpus']} × {base['device']}, TP {base['tp']}, PP {base['pp']}, "
               f"EP {base.get('ep', 1)}, {base['weight_dtype']}/{base['kv_dtype']}); change any field to try another "
               "layout." if chosen is not None else "No plan chosen: a default layout.")
    c = st.columns([2.2, 1, 1, 1, 1, 1.2, 1.2])
    wds, kds = ["bf16", "fp8", "int8", "int4", "fp4"], ["bf16", "fp8", "int8"]
    dev_name = c[0].selectbox("Device", names, index=names.index(base["device"]), key=f"plan.tput.dev.{sig}")
    gpus = int_field("GPUs", int(base["gpus"]), 1, 4096, key=f"plan.tput.gpus.{sig}", where=c[1])
    tp = int_field("TP", int(base["tp"]), 1, 64, key=f"plan.tput.tp.{sig}", where=c[2])
    pp = int_field("PP", int(base["pp"]), 1, 64, key=f"plan.tput.pp.{sig}", where=c[3])
    ep = int_field("EP", int(base.get("ep", 1)), 1, 1024, key=f"plan.tput.ep.{sig}", where=c[4])
    wd = c[5].selectbox("Weights", wds, index=wds.index(base["weight_dtype"]) if base["weight_dtype"] in wds else 1,
                        key=f"plan.tput.wd.{sig}")
    kd = c[6].selectbox("KV", kds, index=kds.index(base["kv_dtype"]) if base["kv_dtype"] in kds else 0,
                        key=f"plan.tput.kd.{sig}")
    if chosen is not None:
        st.button("Back to the chosen plan", key="plan.tput.back", icon=":material/undo:",
                  on_click=lambda: ss.__setitem__("plan.tput.reset", ss.get("plan.tput.reset", 0) + 1))
    if None in (gpus, tp, pp, ep):
        return
    dev = next(d for d in devices if d.name == dev_name)
    mesh = None
    try:
        mesh = plan_mesh(dict(tp=tp, pp=pp, ep=ep, gpus=gpus))
        profile = device_profile(dev, config, stack_key, pricing)
        r = max_throughput(config, dev, mesh, wl.prompt_tokens, wl.output_tokens, wd, kd, stack_key,
                           profile=profile)
    except (SpecError, ValueError) as e:
        show_error(e)
        return
    err = error_band("max_throughput", dev, wd, config, profile=profile, wide_ep=mesh.ep > mesh.tp)
    m = st.columns(4)
    m[0].metric("Output tokens/s", f"{r['output_tok_s']:,.0f}", help=f"total (in + out) {r['total_tok_s']:,.0f}. "
                f"Error: {err}.")
    m[1].metric("Sequences per replica", f"{r['max_batch']:,}", help=f"{r['batch_binding']}. Error: {err}.")
    m[2].metric("Step", f"{r['step_ms']:.1f} ms", help=f"{r['step_bound']}. Error: {err}.")
    m[3].metric("Per GPU", f"{r['output_tok_s_per_gpu']:,.0f} tok/s", help=f"Error: {err}.")
    st.caption(f"{r['stack']} defaults, every request queued at once, {wl.prompt_tokens:,} in / "
               f"{wl.output_tokens:,} out: {r['binds']}. Batch caps: "
               + ", ".join(f"{k} {v:,}" for k, v in r["batch_caps"].items()) + f". Priced from {r['priced_from']}. "
               f"How far to trust these: {err}.")
    df_with_download(pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, dict)}]), "max_throughput",
                     show={"output_tok_s": "output tok/s", "total_tok_s": "total tok/s", "requests_per_s": "req/s",
                           "output_tok_s_per_gpu": "tok/s per GPU", "max_batch": "batch", "step_ms": "step ms",
                           "step_bound": "step bound", "batch_binding": "batch bound"})
    formula_expander("How this maximum throughput is computed, with its numbers",
                     formula_markdown(throughput_formulas(r, mesh, wl.prompt_tokens, wl.output_tokens),
                                      FORMULA_LABELS) +
                     "\n\nB = min(sequences whose KV fits, the scheduler's max sequences, max batched tokens × O / "
                     "(I + O)); memory = bytes / (bandwidth·MBU), compute = FLOPs / (peak·MFU): "
                     "calculators.planning.throughput.")
