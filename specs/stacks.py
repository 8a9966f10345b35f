"""Serving stacks (`specs/stacks.json`): the all-reduce algorithms each runs, its scheduler limits, KV reservation
policy, fixed per-step cost per device class and default efficiencies, each with its source.

A `Stack` is plain data; the formulas that use it live in `calculators.multi_gpu.collectives` (all-reduce time)
and `calculators.planning.throughput` (maximum throughput).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specs.model_config import SpecError

STACKS_FILE = Path(__file__).parent / "stacks.json"
DEVICE_CLASSES = ("datacenter-gpu", "consumer-gpu", "apple", "tpu", "cpu", "other")
MOE_DP_COMM = ("allgather_reducescatter", "all_to_all")   # `Stack.moe_dp_comm`
_ALIASES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "tensorrtllm": "trtllm", "trt": "trtllm",
            "llamacpp": "llamacpp", "llama.cpp": "llamacpp", "nccl": "nccl", "plainnccl": "nccl"}


@dataclass(frozen=True)
class CustomAllReduce:
    """A stack's own all-reduce kernels: which world sizes, up to what message, one-shot below which size."""
    world_sizes: tuple[int, ...]
    max_bytes: float
    one_shot_below_bytes: dict            # world size -> bytes
    alpha_s: float
    needs: str
    source: str


@dataclass(frozen=True)
class Stack:
    key: str
    name: str
    custom_allreduce: CustomAllReduce | None
    max_num_seqs: int
    max_num_batched_tokens: int
    small_gpu_limits: dict | None
    scheduler_source: str
    gpu_memory_utilization: float
    kv_reservation: str                   # "on_demand" (paged, grows) | "full" (prompt + max output up front)
    step_overhead_ms: dict                # device class -> ms
    efficiency: dict                      # decode_mbu, prefill_mfu, prefill_mbu, decode_mfu
    fit_rows: str
    doc: dict
    build: str = ""                       # a named build of the stack (specs/stacks.json `builds`), "" the stack
    build_doc: dict | None = None         # that build's entry: its own `measured_host` fields over the stack's

    @property
    def full_key(self) -> str:
        """`key`, or `key@build` for a build: what `load_stack` reads back."""
        return f"{self.key}@{self.build}" if self.build else self.key

    @property
    def overlap_host(self) -> bool:
        """Whether the stack prepares step k + 1 on the host while the GPU runs step k (an overlap scheduler), so
        its per-step host work hides behind the GPU's (specs/stacks.json `overlap_scheduler`, with its source)."""
        return bool(self.doc.get("overlap_scheduler", False))

    @property
    def moe_dp_comm(self) -> str:
        """How the stack moves tokens between attention data-parallel ranks and the experts spread over them
        (specs/stacks.json `moe_dp_comm`, with its source): "allgather_reducescatter" (every rank gathers the EP
        group's tokens, runs its experts on all of them, and the partial outputs are reduce-scattered: the default
        of TensorRT-LLM on one node, vLLM and SGLang) or "all_to_all" (DeepEP-style dispatch and combine, opt-in)."""
        method = self.doc.get("moe_dp_comm", "allgather_reducescatter")
        if method not in MOE_DP_COMM:
            raise SpecError(f"stack {self.key}: moe_dp_comm {method!r} is not one of {', '.join(MOE_DP_COMM)}")
        return method

    @property
    def kv_fraction_of_free(self) -> bool:
        """Whether the stack's memory fraction is the KV cache's share of the memory the weights and activations
        leave free (TensorRT-LLM's free_gpu_memory_fraction) rather than a bound on all its memory (vLLM's
        gpu_memory_utilization); specs/stacks.json `memory_fraction_of`, with its source."""
        return self.doc.get("memory_fraction_of", "total") == "free"

    def measured_host(self, vendor: str = "") -> dict | None:
        """The host's work per step when the GPU's is priced from measured kernels (specs/stacks.json
        `measured_host`, fitted on declared fit rows with the kernels measured on each row's GPU): step_overhead_ms,
        sequence_overhead_us and `borrowed_compute_scale`: when the kernels were measured on another device (the
        nearest profiled one), how many times longer `vendor`'s devices take on compute-bound work than that
        device's efficiency at their datasheet says (`step.derated`), and `borrowed_memory_scale` the same for
        memory-bound work (bytes streamed at a smaller share of the datasheet's bandwidth). A vendor whose devices
        borrow a profile may have its own fixed step cost (`step_overhead_ms_by_vendor`: the stack's build for that
        platform, ROCm against CUDA). None when the stack has no such fit."""
        m = self.doc.get("measured_host")
        if not m:
            return None
        if self.build_doc and self.build_doc.get("measured_host"):    # the build's own fields over the stack's
            m = dict(m, **self.build_doc["measured_host"])

        def per_vendor(field: str) -> float:
            scale = m.get(field) or {}
            return float(scale.get(vendor, scale.get("other", 1.0)))
        step = (m.get("step_overhead_ms_by_vendor") or {}).get(vendor, m["step_overhead_ms"])
        return dict(step_overhead_ms=float(step), sequence_overhead_us=float(m["sequence_overhead_us"]),
                    borrowed_compute_scale=per_vendor("borrowed_compute_scale"),
                    borrowed_memory_scale=per_vendor("borrowed_memory_scale"))

    def overhead_ms(self, device_class: str) -> float:
        """Fixed cost of one forward step (launches, scheduling, sampling) on a device class; 'other' if absent."""
        table = self.step_overhead_ms
        return float(table.get(device_class, table.get("other", 0.0)))

    def efficiency_for(self, vendor: str = "", precision: str | None = None, moe: bool = False) -> dict:
        """The stack's efficiencies on a vendor's hardware at a weight precision, for a dense or a mixture-of-experts
        model: the base values, then every entry of `efficiency_by` whose conditions match (in order; each names its
        source or fit). A stack runs its kernels differently per vendor (ROCm vs CUDA), per precision (an FP4 GEMM
        reaches a smaller share of its peak than an FP8 one) and for experts (grouped GEMMs over many small
        per-expert matrices instead of a few large dense ones)."""
        out = dict(self.efficiency)
        for e in self.doc.get("efficiency_by", []):
            when = e["when"]
            if "vendor" in when and when["vendor"].lower() != (vendor or "").lower():
                continue
            if "precision" in when and when["precision"] != precision:
                continue
            if "moe" in when and bool(when["moe"]) != bool(moe):
                continue
            out.update({k: float(v) for k, v in e["set"].items()})
        return out

    def scheduler_limits(self, memory_gib: float, device_name: str = "") -> tuple[int, int]:
        """(max sequences, max batched tokens per step) the stack defaults to on a GPU of this size."""
        s = self.small_gpu_limits
        if s and self._small(memory_gib, device_name):
            return int(s["max_num_seqs"]), int(s["max_num_batched_tokens"])
        return self.max_num_seqs, self.max_num_batched_tokens

    def _small(self, memory_gib: float, device_name: str) -> bool:
        s = self.small_gpu_limits or {}
        return memory_gib < s.get("below_gib", 0) or s.get("or_name_contains", "\0") in device_name.lower()

    def offline_limits(self, memory_gib: float, device_name: str = "") -> tuple[int, int] | None:
        """(max sequences, max batched tokens) of the stack's own offline benchmark where they differ from the
        server's (specs/stacks.json scheduler `offline`: vLLM's LLM class behind `vllm bench throughput`), on a
        GPU of this size; None where the stack states none."""
        off = self.doc.get("scheduler", {}).get("offline")
        if not off:
            return None
        s = off["small_gpu"] if "small_gpu" in off and self._small(memory_gib, device_name) else off
        return int(s["max_num_seqs"]), int(s["max_num_batched_tokens"])

    @property
    def offline_tool(self) -> str | None:
        """The offline benchmark whose defaults `offline_limits` gives (e.g. "vllm-bench")."""
        return self.doc.get("scheduler", {}).get("offline", {}).get("tool")


def _key(name: str) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum() or ch == ".")


@lru_cache(maxsize=None)
def _doc() -> dict:
    return json.loads(STACKS_FILE.read_text(encoding="utf-8"))


def _custom(d: dict | None) -> CustomAllReduce | None:
    if not d:
        return None
    return CustomAllReduce(world_sizes=tuple(int(n) for n in d["world_sizes"]), max_bytes=float(d["max_bytes"]),
                           one_shot_below_bytes={int(k): float(v) for k, v in d["one_shot_below_bytes"].items()},
                           alpha_s=float(d["alpha_us"]) * 1e-6, needs=d["needs"], source=d["source"])


def list_stacks() -> list[str]:
    """Stack keys in file order: vllm, sglang, trtllm, llamacpp, nccl."""
    return list(_doc()["stacks"])


def default_stack_key() -> str:
    return _doc()["default"]


def algorithm_doc(name: str) -> dict:
    """The source entry of an all-reduce algorithm (ring, tree, nvls, one_shot, two_shot)."""
    algos = _doc()["algorithms"]
    if name not in algos:
        raise SpecError(f"unknown all-reduce algorithm {name!r}; choose one of: {', '.join(algos)}")
    return algos[name]


@lru_cache(maxsize=None)
def load_stack(name: str | None = None) -> Stack:
    """A stack by key or common name ('vllm', 'SGLang', 'TensorRT-LLM', 'llama.cpp', 'nccl'); None: the default
    (vLLM, what most users run). 'vllm@amd-mlperf-5.1': a named build of the stack (its `builds` entry in
    specs/stacks.json): the stack's scheduler, memory policy and efficiencies, with the build's own fitted host and
    vendor factors for measured kernels (`Stack.measured_host`)."""
    base, _, build = ("" if name is None else str(name)).partition("@")
    key = default_stack_key() if name is None else _ALIASES.get(_key(base).replace(".", ""), _key(base))
    stacks = _doc()["stacks"]
    if key not in stacks:
        raise SpecError(f"unknown serving stack {name!r}; choose one of: {', '.join(stacks)}")
    d = stacks[key]
    builds = d.get("builds") or {}
    if build and build not in builds:
        raise SpecError(f"serving stack {key} has no build {build!r}"
                        + (f"; its builds: {', '.join(builds)}" if builds else " (it lists none)"))
    sch = d["scheduler"]
    return Stack(key=key, name=d["name"] + (f" ({builds[build].get('name', build)})" if build else ""),
                 build=build, build_doc=builds.get(build) if build else None,
                 custom_allreduce=_custom(d.get("custom_allreduce")),
                 max_num_seqs=int(sch["max_num_seqs"]), max_num_batched_tokens=int(sch["max_num_batched_tokens"]),
                 small_gpu_limits=sch.get("small_gpu"), scheduler_source=sch["source"],
                 gpu_memory_utilization=float(d["gpu_memory_utilization"]), kv_reservation=d["kv_reservation"],
                 step_overhead_ms=dict(d["step_overhead_ms"]), efficiency=dict(d["efficiency"]),
                 fit_rows=d.get("fit_rows", ""), doc=d)


def check_stack_device(stack: "Stack", device) -> None:
    """SpecError when `stack` does not run on `device`'s vendor (TensorRT-LLM on an AMD GPU, ...), naming the
    stacks that do."""
    vendors = stack.doc.get("runs_on_vendors")
    vendor = "measured" if (device.kind or "") == "measured" else (device.vendor or "")
    if vendors and vendor and vendor not in vendors and (device.kind or "") != "custom":
        ok = [load_stack(k).name for k in list_stacks() if vendor in _doc()["stacks"][k].get("runs_on_vendors", [])]
        raise SpecError(f"{stack.name} does not run on {device.name} ({vendor}): it runs on "
                        f"{', '.join(vendors)} hardware; for {device.name} choose {', '.join(ok) or 'another device'}")


def device_class(device) -> str:
    """Which overhead class a `specs.devices.Device` belongs to: datacenter-gpu (NVIDIA/AMD/Intel accelerators
    with 40 GiB or more), consumer-gpu (other GPUs), apple, tpu, cpu (a measured machine), other."""
    name, vendor, kind = device.name.lower(), (device.vendor or "").lower(), (device.kind or "").lower()
    if "apple" in name or vendor == "apple":
        return "apple"
    if name.startswith("tpu") or vendor == "google":
        return "tpu"
    if kind in ("measured", "cpu"):
        return "cpu"
    if kind == "gpu" and device.memory_bytes >= 40 * 2 ** 30:
        return "datacenter-gpu"
    if kind == "gpu":
        return "consumer-gpu"
    return "other"
