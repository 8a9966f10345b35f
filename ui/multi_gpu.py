"""The multi-GPU sidebar every sizing page shares: how many GPUs, split how (TP/PP/EP), over which interconnect,
and the memory budget (vLLM's gpu_memory_utilization, the runtime overheads, 16-bit embeddings). Plus the custom
device form (every precision's peak, memory, bandwidth, interconnect, price) and the fit verdict box.

    from ui.multi_gpu import multi_gpu_sidebar, show_fit_verdict
    setup = multi_gpu_sidebar(config, device)     # MultiGPU or None (the reason is on screen)
    show_fit_verdict(config, device, setup, tokens, batch, wd, kd)

Nothing here computes: the numbers come from `calculators.multi_gpu.tensor_parallel` and `specs.devices`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from calculators.sizing.memory import DEFAULT_GPU_MEMORY_UTILIZATION, RuntimeOverheads
from calculators.multi_gpu.tensor_parallel import Mesh, fit_verdict, mesh_problem, per_gpu_memory
from calculators.units import GiB, fmt_num
from specs.devices import Device, Link, all_links, custom_device, device_link, load_link
from specs.model_config import ModelConfig, SpecError
from ui.widgets import _SHADOW, float_field, int_field, remember, show_error

OWN_LINK = "The device's own interconnect"
NODES = {                          # label -> (GPUs, TP, PP, link key or None for the device's own)
    "1 GPU": (1, 1, 1, None),
    "2 GPUs, one node": (2, 2, 1, None),
    "4 GPUs, one node": (4, 4, 1, None),
    "8-GPU node (HGX/DGX)": (8, 8, 1, None),
    "2 × 8-GPU nodes (TP 8 in a node, PP 2 over InfiniBand)": (16, 8, 2, "ib_ndr"),
    "4 × 8-GPU nodes (TP 8 in a node, PP 4 over InfiniBand)": (32, 8, 4, "ib_ndr"),
}
CUSTOM_LAYOUT = "Custom layout"
K = "mg."                          # session-state key prefix


@dataclass(frozen=True)
class MultiGPU:
    """What the sidebar chose: the layout, the link its collectives use, and the memory budget terms."""
    mesh: Mesh
    link: Link | None
    usable_fraction: float
    overheads: RuntimeOverheads
    embeddings_16bit: bool
    ignored: str | None = None         # a layout problem the page set aside (the planner chooses its own layouts)

    def memory_kw(self) -> dict:
        """Keyword arguments of `calculators.multi_gpu.tensor_parallel.per_gpu_memory` / `fit_verdict`."""
        return dict(usable_fraction=self.usable_fraction, overheads=self.overheads,
                    embeddings_16bit=self.embeddings_16bit)

    def label(self) -> str:
        m = self.mesh
        return f"{m.total_gpus} GPU{'s' if m.total_gpus > 1 else ''} (TP {m.tp}, PP {m.pp}" + \
            (f", EP {m.ep}" if m.ep > 1 else "") + ")"


def link_label(link: Link) -> str:
    bw = "device-specific" if link.bytes_per_s is None else f"{fmt_num(link.bytes_per_s / 1e9, 4)} GB/s per direction"
    return f"{link.name}: {bw}, alpha {fmt_num(link.alpha_base_s * 1e6, 3)} µs + {fmt_num(link.alpha_per_hop_s * 1e6, 2)} µs/hop"


def _apply_node() -> None:
    """on_change of the node preset: fill GPUs, TP, PP and the interconnect from it."""
    ss = st.session_state
    choice = ss.get(K + "node")
    if choice in NODES:
        g, tp, pp, link = NODES[choice]
        for key, v in (("gpus", g), ("tp", tp), ("pp", pp), ("ep", 1)):
            ss[K + key] = v
            ss[_SHADOW + K + key] = v
        lk = OWN_LINK if link is None else load_link(link).name
        ss[K + "link"] = lk
        ss[_SHADOW + K + "link"] = lk
    ss[_SHADOW + K + "node"] = choice


def multi_gpu_sidebar(config: ModelConfig | None, device: Device | None, where: Any = None,
                      layout_used: bool = True) -> MultiGPU | None:
    """Sidebar section 'GPUs and interconnect'. Returns the choice, or None after an error the user can fix.
    `layout_used=False` (a page that chooses its own GPUs, TP and PP): a layout the model cannot take is no error;
    the result says what was set aside in `ignored`."""
    box = where if where is not None else st.sidebar
    ss = st.session_state
    box.header("GPUs and interconnect")
    remember(K + "node", "1 GPU")
    if ss.get(K + "node") not in (*NODES, CUSTOM_LAYOUT):
        ss[K + "node"] = "1 GPU"
    box.selectbox("Node", (*NODES, CUSTOM_LAYOUT), key=K + "node", on_change=_apply_node,
                  help="A multi-GPU node fills the fields below; edit them for any other layout.")
    cols = box.columns(2)
    gpus = int_field("GPUs", 1, 1, 4096, key=K + "gpus", where=cols[0],
                     help="All GPUs; those beyond TP × PP hold data-parallel replicas.")
    tp = int_field("TP", 1, 1, 512, key=K + "tp", where=cols[1], help="Tensor-parallel degree: splits every "
                   "layer's matrices by heads and FFN columns.")
    cols = box.columns(2)
    pp = int_field("PP", 1, 1, 512, key=K + "pp", where=cols[0], help="Pipeline stages: split the layers.")
    ep = int_field("EP", 1, 1, 512, key=K + "ep", where=cols[1], help="Expert parallelism (MoE only): whole "
                   "experts per GPU within the TP group.")
    links = [lk for lk in all_links() if lk.bytes_per_s is not None]
    names = [OWN_LINK, *(lk.name for lk in links)]
    store = remember(K + "link", OWN_LINK)
    if ss.get(K + "link") not in names:
        ss[K + "link"] = OWN_LINK
    chosen = box.selectbox("Interconnect", names, key=K + "link", on_change=store,
                           help="Bandwidth per direction and per-call latency (alpha) from specs/devices.json.")
    link = (device_link(device) if device is not None else None) if chosen == OWN_LINK else \
        next(lk for lk in links if lk.name == chosen)
    if link is not None:
        box.caption(link_label(link))
    elif device is not None:
        box.caption(f"{device.name} lists no peer interconnect: pick one above to use more than one GPU.")
    with box.expander("Memory budget"):
        usable = float_field("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION, 0.05, 1.0,
                             key=K + "util", step=0.05, help="vLLM's meaning: the fraction of each GPU's memory "
                             "the server may use for everything; the KV cache gets what is left.")
        d = RuntimeOverheads()
        ctx = float_field("CUDA context + framework (GiB)", d.cuda_context_bytes / GiB, 0.0, 64.0, key=K + "ctx")
        comm = float_field("Communication buffers, 2+ GPUs (GiB)", d.comm_buffer_bytes / GiB, 0.0, 64.0,
                           key=K + "comm")
        graphs = float_field("CUDA graphs (GiB)", d.cuda_graph_bytes / GiB, 0.0, 64.0, key=K + "graphs")
        store = remember(K + "emb16", True)
        emb16 = st.checkbox("Quantized checkpoints keep embeddings and LM head in 16-bit", key=K + "emb16",
                            on_change=store, help="FP8 (llm-compressor, ModelOpt) and "
                            "GPTQ/AWQ checkpoints do; untick to quantize them too.")
    if None in (gpus, tp, pp, ep, usable, ctx, comm, graphs):
        bad = [name for name, v in (("GPUs", gpus), ("TP", tp), ("PP", pp), ("EP", ep), ("the memory budget", usable),
                                    ("the CUDA context", ctx), ("the communication buffers", comm),
                                    ("the CUDA graphs", graphs)) if v is None]
        show_error(f"This page needs a layout it can size: {' and '.join(bad)} in the sidebar's “GPUs and "
                   "interconnect” section cannot be used as typed (GPUs, TP, PP and EP are whole numbers from 1; "
                   "the red message there says what is allowed). Fix it there and the page comes back.")
        return None
    mesh = Mesh(tp=tp, pp=pp, ep=ep, gpus=gpus)
    problem = mesh_problem(config, mesh) if config is not None else None
    if not layout_used:
        ignored = f"the sidebar's layout ({gpus} GPUs, TP {tp}, PP {pp}{f', EP {ep}' if ep > 1 else ''})"
        return MultiGPU(mesh=Mesh(), link=link, usable_fraction=usable, overheads=RuntimeOverheads(
            ctx * GiB, comm * GiB, graphs * GiB), embeddings_16bit=bool(emb16),
            ignored=ignored + (f", which {config.name} cannot take: {problem}" if problem else ""))
    if problem:
        show_error(problem, box)
        show_error(f"The sidebar's layout cannot be sized: {problem}")
        return None
    if mesh.gpus_per_replica > 1 and link is None:
        show_error("Choose an interconnect: this device has none listed.", box)
        show_error("The sidebar's layout spans several GPUs, but this device lists no interconnect: choose one "
                   "under “GPUs and interconnect”.")
        return None
    return MultiGPU(mesh=mesh, link=link, usable_fraction=usable, overheads=RuntimeOverheads(
        ctx * GiB, comm * GiB, graphs * GiB), embeddings_16bit=bool(emb16))


def fitting_weight_dtype(config: ModelConfig, device: Device, setup: MultiGPU, tokens: int, batch: int,
                         options: tuple[str, ...] = ("fp16", "fp8", "int4")) -> str:
    """The widest weight precision of `options` with which `tokens` × `batch` fit this layout (the first option
    when none fits): a page's default, so that it opens on a setup that can run."""
    for wd in options:
        try:
            if per_gpu_memory(config, device, setup.mesh, tokens, batch, wd, None, **setup.memory_kw())["fits"]:
                return wd
        except SpecError:
            continue
    return options[0]


def show_fit_verdict(config: ModelConfig, device: Device, setup: MultiGPU, tokens: int, batch: int,
                     weight_dtype: str, kv_dtype: str | None, where: Any = None,
                     numbers_follow: bool = True) -> dict | None:
    """The fit verdict for this exact setup (green, or an orange warning saying by how much and what would fit),
    shown next to every latency or cost. `numbers_follow`: say that the figures after it are for this setup."""
    box = where if where is not None else st
    try:
        v = fit_verdict(config, device, setup.mesh, tokens, batch, weight_dtype, kv_dtype, **setup.memory_kw())
    except SpecError as e:
        show_error(e, box)
        return None
    if v["fits"]:
        box.success(v["text"], icon=":material/check_circle:")
    else:
        box.warning(v["text"] + (" The latency and cost figures that follow are for a setup that cannot run."
                                 if numbers_follow else ""), icon=":material/warning:")
    return v


def custom_device_form(box: Any, key: str) -> Device | None:
    """Your own device: memory, bandwidth, a peak for every precision (0 = not supported), interconnect per
    direction and its link type, price. Every number validated."""
    store = remember(f"{key}.custom.name", "My accelerator")
    name = box.text_input("Name", key=f"{key}.custom.name", on_change=store)
    mem = float_field("Memory (GB, read as GiB)", 80.0, 0.001, 1e6, key=f"{key}.custom.memory_gb", where=box)
    bw = float_field("Memory bandwidth (GB/s)", 2000.0, 0.001, 1e6, key=f"{key}.custom.bandwidth_gb_s", where=box)
    peaks = {}
    for prec, default in (("bf16", 500.0), ("fp16", 500.0), ("fp8", 1000.0), ("int8", 1000.0), ("int4", 0.0),
                          ("fp32", 50.0)):
        v = float_field(f"Peak dense TFLOP/s, {prec} (0 = none)", default, 0.0, 1e6,
                        key=f"{key}.custom.tflops.{prec}", where=box)
        if v is None:
            return None
        if v > 0:
            peaks[prec] = v
    links = [lk for lk in all_links() if lk.bytes_per_s is not None]
    store = remember(f"{key}.custom.link", links[0].name)
    lname = box.selectbox("Interconnect type (its alpha)", [lk.name for lk in links], key=f"{key}.custom.link",
                          on_change=store)
    ic = float_field("Interconnect GB/s per direction (0 = none)", 450.0, 0.0, 1e6,
                     key=f"{key}.custom.ic_gb_s", where=box)
    price = float_field("Price ($ per GPU-hour, 0 = unknown)", 0.0, 0.0, 1e6, key=f"{key}.custom.price", where=box)
    if None in (mem, bw, ic, price):
        return None
    try:
        link_key = next(lk.key for lk in links if lk.name == lname)
        return custom_device(name, mem, bw, peaks, interconnect_gb_s=ic or None, price_usd_per_hour=price or None,
                             interconnect_link=link_key)
    except (SpecError, StopIteration) as e:
        show_error(e if str(e) else "choose an interconnect type", box)
        return None
