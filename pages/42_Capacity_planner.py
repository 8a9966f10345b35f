"""Capacity planner: model + precision choices + devices + workload and targets -> every plan searched, the feasible
ones ranked by $ per 1M tokens with the constraint that binds each, and why the others fail.

Numbers: `calculators.planning.planner` (plan, plan_rows, rejected_rows; vectorised over the whole search space).
"""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import streamlit as st

from calculators.planning.plan_workload import dataset_length_fields
from calculators.planning.planner import SearchSpace, Workload, layout_words, plan_rows, rejected_rows
from calculators.sizing.quantization import quality_caveat
from calculators.units import GB
from specs.devices import device_documents, list_devices, load_device
from specs.model_config import SpecError
from specs.workloads import mlperf_length_datasets
from ui import df_with_download, float_field, int_field, remember, setup_page, show_error
from ui.widgets import set_remembered
from ui.fitted_efficiency import planner_efficiency
from ui.model_source import model_source, units_note
from ui.world import DATACENTRE
from ui.multi_gpu import multi_gpu_sidebar
from ui.planner_cache import cached_plan
from ui.frontier import frontier_chart, stack_inputs, throughput_section, what_if_table
from ui.plan_deploy import chosen_plan_section, disaggregated_section, evaluate_at_rate, headline, pricing_input

DEFAULT_DEVICES = ["H100 SXM", "A100 SXM 80GB", "H200", "L40S"]
PLANNER_WHY = "a capacity plan rents data-centre GPUs, and this computer is not one of them"


TYPED = "(lengths as typed below)"
LENGTH_KEYS = {"prompt_tokens": "plan.prompt", "prompt_tokens_p99": "plan.p99", "output_tokens": "plan.output",
               "output_tokens_p99": "plan.out99"}


def fill_lengths_from_dataset() -> None:
    """The dataset picker's callback: its means and p99s into the four length fields, here and on every page."""
    key = st.session_state.get("plan.dataset")
    if key and key != TYPED:
        f = dataset_length_fields(key)
        for field, widget in LENGTH_KEYS.items():
            set_remembered(widget, str(f[field]))


def workload_inputs(max_ctx: int) -> Workload | None:
    st.subheader("Workload and targets")
    names = [TYPED, *mlperf_length_datasets()]
    st.session_state.setdefault("plan.dataset", TYPED)
    key = st.selectbox("Lengths from a dataset", names, key="plan.dataset", on_change=fill_lengths_from_dataset,
                       help="Fills the four lengths with an MLPerf Inference dataset's measured means and p99s "
                            "(its prompts, and its reference answers: a model generates its own). Edit them after.")
    if key != TYPED:
        f = dataset_length_fields(key)
        same = all(str(st.session_state.get(w, "")).replace(",", "") == str(f[k]) for k, w in LENGTH_KEYS.items())
        st.caption((f"MLPerf's {key}: {f['samples']:,} samples (per-sample token counts, {f['source']}). The planner "
                    "draws a lognormal through each mean and p99; `serve-at --workload mlperf-" + key + "` prices "
                    "the dataset's own histogram.") if same else
                   f"The lengths below are no longer {key}'s (edited, or filled before): pick it again to refill "
                   "them.")
    c = st.columns(3)
    rate = float_field("Requests per second", 1.0, 0.0, 1e6, key="plan.rate", where=c[0], step=0.5)
    prompt = int_field("Mean prompt (tokens)", min(2000, max_ctx // 2), 1, max_ctx, key="plan.prompt", where=c[1])
    p99 = int_field("p99 prompt (tokens)", min(8000, max_ctx // 2), 1, max_ctx, key="plan.p99", where=c[2],
                    help="The long prompts set the TTFT tail.")
    c = st.columns(4)
    out = int_field("Mean output (tokens)", 300, 1, max_ctx, key="plan.output", where=c[0])
    out99 = int_field("p99 output (tokens)", 300, 1, max_ctx, key="plan.out99", where=c[1],
                      help="Above the mean: a lognormal through both (reasoning models have long tails). Equal to "
                           "the mean: every reply that long.")
    ttft = float_field("TTFT p99 target (ms)", 2000.0, 0.0, 1e7, key="plan.ttft", where=c[2], step=100.0)
    itl = float_field("ITL target (ms)", 50.0, 0.0, 1e5, key="plan.itl", where=c[3], step=5.0,
                      help="Checked at the load: the mean token gap with the prefills' share of every step.")
    if None in (rate, prompt, p99, out, out99, ttft, itl):
        return None
    if p99 < prompt or out99 < out:
        show_error("A p99 length cannot be below its mean (99% of requests are at most the p99 long): raise the "
                   "p99 or lower the mean.")
        return None
    return Workload(rate, prompt, out, ttft, itl, p99, output_tokens_p99=out99 if out99 > out else None)


def search_inputs() -> tuple[list, SearchSpace] | None:
    st.subheader("What the planner may choose")
    names = list_devices()
    store = remember("plan.devices", [d for d in DEFAULT_DEVICES if d in names])
    st.session_state["plan.devices"] = [d for d in st.session_state.get("plan.devices", []) if d in names]
    chosen = st.multiselect("Devices", names, key="plan.devices", on_change=store,
                            help="Prices and link numbers from specs/devices.json (editable there or as a custom "
                                 "device on the sizing pages).")
    c = st.columns(2)
    store = remember("plan.wds", ["bf16", "fp8", "int4"])
    wds = c[0].multiselect("Weight precisions", ["bf16", "fp8", "int8", "int4", "fp4"], key="plan.wds",
                           on_change=store, help="FP4 is tried only on devices with FP4 tensor cores.")
    store = remember("plan.kds", ["bf16", "fp8"])
    kds = c[1].multiselect("KV precisions", ["bf16", "fp8", "int8"], key="plan.kds", on_change=store)
    if not chosen or not wds or not kds:
        show_error("Choose at least one device, one weight precision and one KV precision.")
        return None
    devices = priced_devices([load_device(n) for n in chosen])
    if devices is None:
        return None
    return devices, SearchSpace(weight_dtypes=tuple(wds), kv_dtypes=tuple(kds))


def priced_devices(devices: list) -> list | None:
    """Each device's hourly price, editable (defaults: specs/devices.json with the year they were read)."""
    docs = {d["name"]: d for d in device_documents()}
    df = pd.DataFrame({"device": [d.name for d in devices],
                       "$ per GPU-hour": [d.price_usd_per_hour for d in devices],
                       "price read in": [docs.get(d.name, {}).get("price_date", "") for d in devices],
                       "price source": [d.price_note for d in devices]})
    edited = st.data_editor(df, key="plan.prices", hide_index=True, disabled=["device", "price read in",
                                                                             "price source"],
                            column_config={"$ per GPU-hour": st.column_config.NumberColumn(min_value=0.0,
                                                                                           format="%.3f")})
    out = []
    for d, p in zip(devices, edited["$ per GPU-hour"]):
        if p is not None and not pd.isna(p) and not 0 < float(p) < 1e4:
            show_error(f"{d.name}: the price must be between 0 and 10,000 $ per hour (leave it empty if unknown).")
            return None
        price = None if p is None or pd.isna(p) else float(p)
        out.append(replace(d, price_usd_per_hour=price, price_note=d.price_note if price == d.price_usd_per_hour
                           else "edited on the planner page"))
    st.caption("Prices are typical on-demand rates and assumptions; edit them to your own. A device without a "
               "price is searched but never ranked.")
    return out


def precision_caveats(rows: list[dict]) -> None:
    """A quality note for each weight precision below 16 bits among the plans shown."""
    for wd in dict.fromkeys(r["weight_dtype"] for r in rows):
        note = quality_caveat(wd)
        if note:
            st.info(f"**{wd} weights** in plans below: the cost assumes the quantized model answers as well as "
                    f"bf16. {note} Untick {wd} under Weight precisions to rank without it.",
                    icon=":material/info:")


def ep_words(r: dict) -> str:
    return (f", EP {r['ep']}" if r.get("ep", 1) > 1 else "") + (f", DP {r['dp']}" if r.get("dp", 1) > 1 else "")


def named_layout(res, devices: list, space: SearchSpace) -> None:
    """'Why not this one?': any layout of the search space, with the planner's verdict on it."""
    st.subheader("Why not this layout?")
    c = st.columns([2.2, 1, 1, 1, 1.2, 1, 1])          # device names are the longest choice
    dev = c[0].selectbox("Device", [d.name for d in devices], key="plan.ask.device")
    g = c[1].selectbox("GPUs", SearchSpace().gpu_counts, index=1, key="plan.ask.gpus")
    tp = c[2].selectbox("TP", space.tp, index=1, key="plan.ask.tp")
    pp = c[3].selectbox("PP", space.pp, key="plan.ask.pp")
    b = c[4].selectbox("Batch cap", space.batch_caps, index=6, key="plan.ask.cap")
    wd = c[5].selectbox("Weights", space.weight_dtypes, key="plan.ask.wd")
    kd = c[6].selectbox("KV", space.kv_dtypes, key="plan.ask.kd")
    found = res.find(dev, g, tp, pp, b, wd, kd)
    if not found:
        st.warning("This layout is outside what the planner may choose (see the choices above).")
    for r in found:
        name = f"{g} × {dev}, {layout_words(r)}, batch cap {b}, {wd}/{kd}"
        if r["rank"]:
            st.success(f"{name}: feasible, number {r['rank']:,} by cost (${r['usd_per_million_tokens']:.3f} per 1M "
                       f"tokens); {r['why']}.")
        else:
            st.warning(f"{name}: rejected. {r['why'][0].upper() + r['why'][1:]}.")


def results(res, wl: Workload, config=None, stack=None, setup=None, devices=(), top=None) -> dict | None:
    """The search's outcome: in `top` (the page's first screen) the cheapest plan named, at the rate, launched;
    below, the frontier with that plan marked, every plan as a table, the disaggregated alternative and why the
    others fail. Returns the chosen plan (None when none is feasible)."""
    reason = res.no_plan_reason()
    best = None
    with top if top is not None else st.container():
        if reason:
            st.warning(reason.replace("no feasible plan", "**No feasible plan**", 1))
        elif config is not None:
            best = plan_rows(res, 1)[0]
            at, unchecked = evaluate_at_rate(config, best, wl, stack, devices)      # one evaluation for both
            headline(best, wl, config, stack, devices, at, unchecked,
                     chart=lambda: frontier_chart(res, chosen=best))            # the key chart: first screen
            chosen_plan_section(config, best, wl, stack, wl.longest_request(config.max_position_embeddings),
                                setup.usable_fraction, devices, at, unchecked)
    st.subheader("Every feasible plan")
    priced = [n for n in res.notes if "priced from" in n]
    st.caption(f"{res.n_candidates:,} candidate plans searched (device × GPUs × TP × PP × batch cap × precisions). "
               + (" ".join(f"{n}." for n in priced) if priced else "Each step priced by the closed form (the "
                  "stack's fitted efficiencies at the datasheet rooflines)."))
    if not reason:
        rows = plan_rows(res, 30)
        precision_caveats(rows[:15])
        if best is None:                                  # else drawn in the headline, on the first screen
            frontier_chart(res, chosen=rows[0])
        df = pd.DataFrame(rows)
        show = df.assign(**{"per-GPU need (GB)": df["per_gpu_needed_bytes"] / GB}).drop(
            columns=["per_gpu_weight_bytes", "per_gpu_kv_bytes", "per_gpu_needed_bytes", "usable_bytes"])
        df_with_download(show, "feasible_plans", column_config={
            c: st.column_config.NumberColumn(format="%.4g") for c in show.columns if show[c].dtype.kind == "f"},
            show={"device": None, "gpus": "GPUs", "tp": "TP", "pp": "PP", "batch_cap": "cap",
                  "weight_dtype": "weights", "kv_dtype": "KV", "ttft_p99_ms": "TTFT p99 ms",
                  "itl_at_load_ms": "ITL ms", "usd_per_million_tokens": "$/1M", "binding": None, "ep": "EP",
                  "dp": "DP"})
        st.download_button("Download plans (JSON)", json.dumps(rows, indent=2, default=float), "plans.json",
                           "application/json", key="plan.json", on_click="ignore")
        if config is not None:
            disaggregated_section(config, rows[0], wl, devices, stack)
    st.subheader("Why the others fail")
    counts = pd.DataFrame({"reason": list(res.reasons), "rejected plans": list(res.reasons.values())})
    df_with_download(counts, "rejections_by_reason")
    df_with_download(pd.DataFrame(rejected_rows(res, 40)), "nearest_rejected_plans",
                     show={"device": None, "gpus": "GPUs", "tp": "TP", "pp": "PP", "batch_cap": "cap",
                           "weight_dtype": "weights", "reason": None, "ep": "EP", "dp": "DP", "why": None},
                     column_config={"why": st.column_config.TextColumn(width="large")})   # long: cut, whole on hover
    st.caption("Nearest misses first (the smallest over-limit ratio). 'mesh' rows are layouts the model or the GPU "
               "count cannot take (TP not dividing the heads, TP × PP not dividing the GPUs).")
    return best


def main() -> None:
    setup_page("Capacity planner", icon=":material/price_check:")
    st.title("Capacity planner")
    top = st.container()               # the answer first: filled once the search below has run
    st.markdown("Say what you serve and how fast it must answer; the planner tries every device, GPU count, "
                "split, batch cap and precision, keeps the plans that meet the targets, and ranks them by what a "
                "million tokens costs at your load. Each plan names the wall it is closest to. The cheapest plan comes "
                "first; the workload and the choices it was searched under follow it.")
    config = model_source(world=DATACENTRE, why=PLANNER_WHY)
    setup = multi_gpu_sidebar(config, None, layout_used=False)
    units_note()
    st.sidebar.caption("The planner searches GPU counts, TP and PP itself; from the section above it takes the "
                       "memory budget only.")
    if config is None:
        st.info("Choose a model in the sidebar.")
        return
    if setup is None:
        st.info("Fix the memory budget in the sidebar (its message says what is wrong).")
        return
    st.caption(f"Set aside here: {setup.ignored}. The planner tries GPU counts, TP and PP itself; from the "
               "sidebar it takes the model and the memory budget only.")
    wl = workload_inputs(config.max_position_embeddings)
    stack = stack_inputs()
    pricing = pricing_input()
    space = search_inputs()
    if wl is None or space is None or stack is None:
        return
    devices, sp = space
    try:
        wl = replace(wl, prefix_hit_rate=stack[1]).check()
        res = cached_plan(config, devices, wl, sp, planner_efficiency(), usable_fraction=setup.usable_fraction,
                   overheads=setup.overheads, embeddings_16bit=setup.embeddings_16bit, stack=stack[0],
                   profile=pricing)
    except SpecError as e:
        st.warning(f"**No feasible plan**: {e}")
        return
    best = results(res, wl, config, stack[0], setup, devices, top)
    named_layout(res, devices, sp)
    what_if_table(config, devices, wl, sp, stack[0], pricing, usable_fraction=setup.usable_fraction,
                  overheads=setup.overheads, embeddings_16bit=setup.embeddings_16bit)
    throughput_section(config, devices, wl, stack[0], best, pricing)


main()
