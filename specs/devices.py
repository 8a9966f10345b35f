"""Hardware numbers: accelerator datasheets (`specs/devices.json`), custom devices, and "this machine" measured.

A `Device` holds SI units (bytes, bytes/s, FLOP/s). Peak compute is the DENSE rate per precision; 2:4-sparsity
rates are kept apart (`peak_flops_sparse`) and never used unless a caller asks for them by name.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from specs.model_config import SpecError

DEVICES_FILE = Path(__file__).parent / "devices.json"
GiB = 2 ** 30
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
# When a device has no rate for a precision, its matmuls run in the next wider format it does have
# (e.g. FP8 weights on an A100 are upcast and multiplied at the BF16 rate).
_WIDER = {"fp4": ("fp8", "bf16", "fp16"), "int4": ("int8", "bf16", "fp16"), "fp8": ("bf16", "fp16"),
          "int8": ("bf16", "fp16"), "bf16": ("fp16", "fp32"), "fp16": ("bf16", "fp32"), "tf32": ("fp32",),
          "fp32": ("tf32",)}
_ALIASES = {"float32": "fp32", "float": "fp32", "f32": "fp32", "bfloat16": "bf16", "float16": "fp16",
            "half": "fp16", "f16": "fp16", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "q8": "int8",
            "q4": "int4", "nvfp4": "fp4", "mxfp4": "fp4"}


def _key(name: str) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def precision_name(p: str) -> str:
    """Canonical precision name ('bfloat16' -> 'bf16'); SpecError for an unknown one."""
    k = str(p).strip().lower()
    k = _ALIASES.get(k, k)
    if k not in PRECISIONS:
        raise SpecError(f"unknown precision {p!r}; choose one of: {', '.join(PRECISIONS)}")
    return k


def _positive(what: str, v, limit: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SpecError(f"{what} must be a positive number, got {v!r}")
    if v > limit:
        raise SpecError(f"{what} = {v!r} is implausibly large (limit {limit:g})")
    return float(v)


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: float                       # capacity
    memory_bandwidth_bytes_per_s: float       # peak DRAM/HBM bandwidth
    peak_flops: dict                          # precision -> dense FLOP/s (OP/s for integers)
    peak_flops_sparse: dict = field(default_factory=dict)  # precision -> 2:4 sparse FLOP/s (vendor headline)
    interconnect_name: str = ""
    interconnect_bytes_per_s: float | None = None    # ONE direction of the peer links (what a ring runs at)
    interconnect_link: str | None = None             # key of a `links` entry in devices.json (its alpha)
    price_usd_per_hour: float | None = None   # typical on-demand price (an assumption)
    price_note: str = ""
    vendor: str = ""
    kind: str = "gpu"
    source: str = ""
    notes: str = ""
    aliases: tuple = ()

    @property
    def memory_gb(self) -> float:             # decimal GB (1e9), for display next to model sizes
        return self.memory_bytes / 1e9

    @property
    def memory_bandwidth_gb_s(self) -> float:
        return self.memory_bandwidth_bytes_per_s / 1e9

    def flops_for(self, precision: str = "bf16", sparse: bool = False) -> tuple[float, str]:
        """(FLOP/s, precision actually used): dense peak for `precision`, or for the next wider format the
        device has when it lacks that one (FP8 on an A100 runs at its BF16 rate). FP4 is the exception: a device
        without FP4 tensor cores is refused with one message instead of a silent fallback."""
        p = precision_name(precision)
        table = self.peak_flops_sparse if sparse else self.peak_flops
        if p == "fp4" and "fp4" not in self.peak_flops:
            raise SpecError(f"{self.name} has no FP4 tensor cores, so FP4 weights would run as a silent upcast: "
                            "choose FP8 or INT4 weights here, or a device with native FP4 (B200, B300, GB200, GB300, "
                            "MI355X, RTX 5090)")
        for q in (p, *_WIDER.get(p, ())):
            if q in table:
                return float(table[q]), q
        have = ", ".join(sorted(table)) or "none"
        raise SpecError(f"{self.name} has no {'sparse ' if sparse else ''}peak for {p} (it lists: {have})")

    def peak(self, precision: str = "bf16") -> float:
        """Dense peak FLOP/s at `precision` (see `flops_for` for the fallback rule)."""
        return self.flops_for(precision)[0]

    def ridge_flop_per_byte(self, precision: str = "bf16") -> float:
        """Roofline ridge point: the arithmetic intensity where compute time equals memory time,
        peak FLOP/s ÷ bandwidth bytes/s (Williams et al. 2009; reference 003 Detail 12)."""
        return self.peak(precision) / self.memory_bandwidth_bytes_per_s


def _from_doc(d: dict) -> Device:
    ic = d.get("interconnect") or {}
    ic_bw = ic.get("bandwidth_gb_s_per_direction")
    return Device(
        name=d["name"], memory_bytes=float(d["memory_gb"]) * GiB,
        memory_bandwidth_bytes_per_s=float(d["memory_bandwidth_gb_s"]) * 1e9,
        peak_flops={k: float(v) * 1e12 for k, v in d.get("peak_tflops_dense", {}).items()},
        peak_flops_sparse={k: float(v) * 1e12 for k, v in d.get("peak_tflops_sparse", {}).items()},
        interconnect_name=ic.get("name", ""), interconnect_bytes_per_s=None if ic_bw is None else float(ic_bw) * 1e9,
        interconnect_link=ic.get("link"),
        price_usd_per_hour=d.get("price_usd_per_hour"), price_note=d.get("price_source", ""),
        vendor=d.get("vendor", ""), kind=d.get("kind", "gpu"), source=d.get("source", ""),
        notes=d.get("notes", ""), aliases=tuple(d.get("aliases", ())))


@lru_cache(maxsize=None)
def _devices() -> tuple[Device, ...]:
    doc = json.loads(DEVICES_FILE.read_text(encoding="utf-8"))
    return tuple(_from_doc(d) for d in doc["devices"])


@dataclass(frozen=True)
class Link:
    """One interconnect type (devices.json `links`): bandwidth per direction and the alpha-beta latency terms.
    A ring collective over n devices costs alpha_base + steps x alpha_per_hop (NCCL's tuning model)."""
    key: str
    name: str
    kind: str                                  # NVLink, PCIe, InfiniBand, Ethernet, ...
    bytes_per_s: float | None                  # one direction; None where it depends on the device
    alpha_base_s: float
    alpha_per_hop_s: float
    source: str
    switched: bool = False                     # every GPU reaches every other in one hop (NVSwitch, full mesh)
    multicast: bool = False                    # the switch can reduce and multicast (NVLS: NVLink 4 and later)


@lru_cache(maxsize=None)
def _links() -> dict:
    doc = json.loads(DEVICES_FILE.read_text(encoding="utf-8"))
    return {k: Link(key=k, name=v["name"], kind=v["kind"],
                    bytes_per_s=None if v.get("per_direction_gb_s") is None else float(v["per_direction_gb_s"]) * 1e9,
                    alpha_base_s=float(v["alpha_base_us"]) * 1e-6, alpha_per_hop_s=float(v["alpha_per_hop_us"]) * 1e-6,
                    source=v["source"], switched=bool(v.get("switched", False)),
                    multicast=bool(v.get("multicast", False))) for k, v in doc.get("links", {}).items()}


def all_links() -> list[Link]:
    """Every interconnect type of devices.json, in file order."""
    return list(_links().values())


def load_link(key: str) -> Link:
    """A link type by key ('nvlink4', 'pcie5', 'ib_ndr', 'roce_400gbe', 'eth_100gbe', ...)."""
    links = _links()
    if key not in links:
        raise SpecError(f"unknown interconnect {key!r}; choose one of: {', '.join(links)}")
    return links[key]


def device_link(device: "Device") -> Link | None:
    """The device's own interconnect with its per-direction bandwidth (None if it has no peer links)."""
    if not device.interconnect_link or device.interconnect_bytes_per_s is None:
        return None
    base = load_link(device.interconnect_link)
    return Link(key=base.key, name=device.interconnect_name or base.name, kind=base.kind,
                bytes_per_s=device.interconnect_bytes_per_s, alpha_base_s=base.alpha_base_s,
                alpha_per_hop_s=base.alpha_per_hop_s, source=base.source, switched=base.switched,
                multicast=base.multicast)


def device_documents() -> list[dict]:
    """The raw datasheet entries (with their sources), as stored in devices.json."""
    return json.loads(DEVICES_FILE.read_text(encoding="utf-8"))["devices"]


def list_devices() -> list[str]:
    return [d.name for d in _devices()]


def all_devices() -> list[Device]:
    return list(_devices())


def load_device(name: str) -> Device:
    """A device by name or alias, case and punctuation ignored ('a100', 'H100 SXM', 'rtx4090')."""
    k = _key(name)
    for d in _devices():
        if k in {_key(d.name), *(_key(a) for a in d.aliases)}:
            return d
    raise SpecError(f"unknown device {name!r}; choose one of: {', '.join(list_devices())}")


def custom_device(name: str, memory_gb: float, bandwidth_gb_s: float, peak_tflops: float | dict,
                  interconnect_gb_s: float | None = None, price_usd_per_hour: float | None = None,
                  source: str = "user input", interconnect_link: str | None = None) -> Device:
    """A device from your own numbers. `peak_tflops` is a dense TFLOP/s figure (taken as BF16 and FP16) or a
    dict precision -> TFLOP/s (fp8/int8/int4 included). `memory_gb` is read as GiB, like the datasheet entries.
    `interconnect_gb_s` is per direction; `interconnect_link` a `links` key whose alpha applies (default: the
    PCIe Gen5 entry when a bandwidth is given). Validated: every number must be positive, finite and plausible."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError("a custom device needs a name")
    mem = _positive("memory_gb", memory_gb, 1e6)
    bw = _positive("bandwidth_gb_s", bandwidth_gb_s, 1e6)
    if isinstance(peak_tflops, dict):
        if not peak_tflops:
            raise SpecError("peak_tflops must list at least one precision")
        peaks = {precision_name(k): _positive(f"peak_tflops[{k}]", v, 1e6) * 1e12 for k, v in peak_tflops.items()}
    else:
        t = _positive("peak_tflops", peak_tflops, 1e6) * 1e12
        peaks = {"bf16": t, "fp16": t}
    ic = None if interconnect_gb_s is None else _positive("interconnect_gb_s", interconnect_gb_s, 1e6) * 1e9
    link = None if ic is None else load_link(interconnect_link or "pcie5").key
    price = None if price_usd_per_hour is None else _positive("price_usd_per_hour", price_usd_per_hour, 1e6)
    return Device(name=name.strip(), memory_bytes=mem * GiB, memory_bandwidth_bytes_per_s=bw * 1e9,
                  peak_flops=peaks, interconnect_bytes_per_s=ic, interconnect_link=link,
                  interconnect_name="" if link is None else load_link(link).name, price_usd_per_hour=price,
                  price_note="user input" if price is not None else "", kind="custom", source=source)


def _physical_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * GiB


def measure_this_machine(seconds_budget: float = 2.0, array_mb: float = 256.0) -> Device:
    """Measure this computer with NumPy: memory bandwidth as the engine uses it (best of a matrix-vector product
    x @ Wᵀ over an `array_mb` float32 weight matrix, larger than any CPU cache, counted as W's bytes read: the
    operation of every decode-step projection) and FP32 GEMM FLOP/s (2·n³ per n×n matmul, best run).
    Spends about `seconds_budget` seconds; the matrix shrinks for small budgets so one pass always fits.

    Why a matvec and not a copy: a floor must be reachable. The engine's decode step is a chain of matvecs, which
    BLAS spreads over every core; a single-threaded copy/sum probe reads slower than that, and the engine then
    "beat" its own floor."""
    import numpy as np

    budget = _positive("seconds_budget", seconds_budget, 3600)
    n_bytes = int(max(8, min(array_mb, 64 * budget + 8)) * 1e6)
    cols = 2048                                               # a hidden size: rows of [out, in] weights
    w = np.ones((max(1, n_bytes // (4 * cols)), cols), dtype=np.float32)
    x = np.ones((1, cols), dtype=np.float32)
    best_bw, t_end = 0.0, time.perf_counter() + budget / 2
    for run in itertools.count(1):                            # best of >= 3: the first run starts BLAS threads
        t0 = time.perf_counter()
        x @ w.T                                               # reads every byte of w once: [1, D] -> [1, rows]
        t1 = time.perf_counter()
        best_bw = max(best_bw, w.nbytes / max(t1 - t0, 1e-9))
        if run >= 3 and t1 >= t_end:
            break
    n_bytes = w.nbytes
    del w, x
    n = 256 if budget < 0.5 else (512 if budget < 2 else 1024)
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    best_flops, t_end = 0.0, time.perf_counter() + budget / 2
    for run in itertools.count(1):
        t0 = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t0
        best_flops = max(best_flops, 2.0 * n ** 3 / max(dt, 1e-9))
        if run >= 3 and time.perf_counter() >= t_end:
            break
    return Device(
        name="This machine (measured)", memory_bytes=_physical_memory_bytes(),
        memory_bandwidth_bytes_per_s=best_bw, peak_flops={"fp32": best_flops}, kind="measured",
        vendor=platform.processor() or platform.machine(),
        source=f"measured with NumPy {np.__version__} on {platform.platform()} "
               f"({time.strftime('%Y-%m-%d %H:%M')}): matvec over a {n_bytes / 1e6:.0f} MB FP32 matrix, "
               f"{n}x{n} FP32 GEMM",
        notes="memory is the machine's physical RAM; FLOP/s is what NumPy's BLAS reaches in FP32, not a peak")
