"""One step of a deployment as the planner prices it from measured kernels, GPU time only: what
bench/bench_anchor_steps.py sets beside aiconfigurator's own composition of the same kernels (bench/anchor_steps.csv),
and what the Measured kernels page shows for the selected profile.

    decode   `size` decode rows per attention rank at isl + osl / 2 cached positions
    prefill  one prompt of `size` tokens per attention rank
GPU time = the measured ops (`measured_gpu_ms`) + the collectives (`comm_ms`), without the stack's host work, which
aiconfigurator's step leaves out. A deployment with attention data parallel (`adp` > 1) is `Mesh(tp, ep, tp·adp
GPUs)`: each rank's own rows and prompt, the experts seeing every rank's tokens (`step.step_cost`).
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from calculators import arch
from calculators.multi_gpu.tensor_parallel import Mesh, _link_for
from calculators.planning.measured_step import resolve_profile
from calculators.planning.step import step_cost
from calculators.sizing.latency import Efficiency
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack

ANCHOR_CSV = Path(__file__).resolve().parents[2] / "bench" / "anchor_steps.csv"
NUMBERS = ("tp", "adp", "ep", "size", "isl", "osl")
SAME_WAY_GAP = 0.05       # a median gap up to this reads as "assembled the same way"


def step_gpu_ms(model: str, device: str, tp: int, adp: int, ep: int, weights: str, kv: str, kind: str, size: int,
                isl: int, osl: int, stack: str = "trtllm", profile="auto") -> float:
    """The GPU time of one decode or prefill step (see the module docstring), in ms. A SpecError where no profile
    prices the deployment (the closed form is not what this compares)."""
    c, dev, s = load_preset(model), load_device(device), load_stack(stack)
    mesh = Mesh(tp=tp, ep=ep, gpus=tp * adp)
    prof, words = resolve_profile(profile, dev, s.full_key, c, weights)
    if prof is None:
        raise SpecError(f"no measured kernels price {model} on {dev.name} with {s.name}: {words}")
    link = _link_for(dev, None) if mesh.gpus > 1 else None
    eff = Efficiency.for_stack(s, dev, weights, c)
    if kind == "decode":
        parts = step_cost(c, dev, mesh, weights, kv, eff, link, s, isl + osl / 2, isl, None, prof).parts(size, 0)
    elif kind == "prefill":
        parts = step_cost(c, dev, mesh, weights, kv, eff, link, s, size, size, None, prof).parts(0, size)
    else:
        raise SpecError(f"a step is decode or prefill, not {kind!r}")
    return float(parts["measured_gpu_ms"]) + float(parts["comm_ms"])


def load_anchor(path: Path = ANCHOR_CSV) -> list[dict]:
    """The committed steps with aiconfigurator's time (`aic_ms`) and where it came from (`source`)."""
    with Path(path).open() as f:
        rows = list(csv.DictReader(f))
    return [{**r, **{k: int(r[k]) for k in NUMBERS}, "aic_ms": float(r["aic_ms"])} for r in rows]


def is_moe(step: dict) -> bool:
    """Whether the step's model routes tokens to experts (Qwen3-30B-A3B runs them on one GPU, EP 1)."""
    return arch.is_moe(load_preset(step["model"]))


def step_group(step: dict) -> str:
    """dense or MoE, decode or prefill, and "(batch 1)" for decode of at most 8 rows a rank."""
    small = step["kind"] == "decode" and step["size"] <= 8
    return ("MoE " if is_moe(step) else "dense ") + step["kind"] + (" (batch 1)" if small else "")


def anchor_ratio(step: dict, profile="auto") -> dict:
    """The step with the planner's GPU time (`here_ms`) and here / aiconfigurator (`ratio`)."""
    ours = step_gpu_ms(step["model"], step["device"], step["tp"], step["adp"], step["ep"], step["weights"],
                       step["kv"], step["kind"], step["size"], step["isl"], step["osl"], stack=step["stack"],
                       profile=profile)
    return {**step, "group": step_group(step), "here_ms": ours, "ratio": ours / step["aic_ms"]}


def anchor_summary(compared: list[dict]) -> list[dict]:
    """Per group: how many steps, the range of here / aiconfigurator, and the median and worst |1 - ratio|."""
    out = []
    for group in sorted({c["group"] for c in compared}):
        rs = [c["ratio"] for c in compared if c["group"] == group]
        dev = [abs(r - 1) for r in rs]
        out.append(dict(group=group, steps=len(rs), lowest=min(rs), highest=max(rs),
                        median_abs_gap=statistics.median(dev), worst_abs_gap=max(dev)))
    return out


def steps_of_profile(steps: list[dict], device_name: str, stack: str) -> list[dict]:
    """The committed steps priced on one device (its datasheet name, e.g. "H200") and stack."""
    return [s for s in steps if s["stack"] == stack and load_device(s["device"]).name == device_name]


def anchor_sentence(compared: list[dict]) -> str:
    """What the comparison says, from its numbers: the range past the MoE steps at batch 1, the median gap (the same
    assembly up to SAME_WAY_GAP), the widest gap past 10%, and the batch-1 MoE steps apart (on B200 and GB200
    aiconfigurator prices TensorRT-LLM's opt-in min-latency MoE kernel there)."""
    if not compared:
        return ""
    small = [c for c in compared if c["group"] == "MoE decode (batch 1)"]
    main = [c for c in compared if c not in small]
    text = ""
    if main:
        rs = [c["ratio"] for c in main]
        gap = statistics.median(abs(r - 1) for r in rs)
        how = ("the same kernels, assembled into a step the same way" if gap <= SAME_WAY_GAP else
               "the same kernels, assembled into a step differently")
        text = (f"On these {len(main)} steps the planner's GPU time is {min(rs):.2f}-{max(rs):.2f}× aiconfigurator's "
                f"(median gap {gap:.1%}): {how}.")
        worst = max(main, key=lambda c: abs(c["ratio"] - 1))
        if abs(worst["ratio"] - 1) > 0.10:
            unit = "rows" if worst["kind"] == "decode" else "tokens"
            text += (f" The widest gap is {worst['model']}'s {worst['kind']} of {worst['size']:,} {unit} "
                     f"({worst['ratio']:.2f}×).")
    if small:
        text += (f" MoE decode at batch 1 reads {min(c['ratio'] for c in small):.2f}-"
                 f"{max(c['ratio'] for c in small):.2f}×")
        if any(c["stack"] == "trtllm" and c["device"] in ("b200", "gb200") for c in small):
            text += (": on B200 and GB200 aiconfigurator prices TensorRT-LLM's min-latency MoE kernel there, an "
                     "opt-in mode the planner leaves off")
        text += "."
    return text.strip()
