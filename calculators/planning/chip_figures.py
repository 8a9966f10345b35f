"""Figures measured on one H200 (issue 36's text: PyTorch + cuBLAS + cuDNN under CUDA graphs, random weights, TP 1)
beside what the planner's measured kernels say for the same work (`bench/h200_issue36_figures.csv`):
    step       the step's GPU work (`step.step_cost` with the device's vLLM profile: its ops and collectives, no host
               work, which a CUDA graph replayed alone does not have) ÷ the chip's step, against the issue's band
               (0.95-1.35x for dense decode, 0.75-1.30x for prefill; MoE: inside the spread of measured kernels)
    gemm       a weight GEMM's fraction of the datasheet roofline in the profile (`measured_ops.gemm_ms`)
    attention  decode attention's fraction of the datasheet (`measured_ops.decode_attention_ms`)
A kernel row passes when the profile's fraction lies within 0.05 of the chip's range.
"""
from __future__ import annotations

import csv
from pathlib import Path

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.step import step_cost
from calculators.planning.throughput import deployment_defaults
from calculators.sizing.measured_ops import decode_attention_ms, gemm_ms
from specs.devices import Device
from specs.presets import load_preset
from specs.stacks import load_stack

FIGURES = Path(__file__).resolve().parents[2] / "bench" / "h200_issue36_figures.csv"
KERNEL_SLACK = 0.05


def load_figures(path: Path = FIGURES) -> list[dict]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def step_gpu_ms(profile, device: Device, model: str, weights: str, rows: int, context: int,
                prompt_tokens: int) -> dict:
    """One step on one GPU priced from `profile` with vLLM's settings: its GPU work and the whole step."""
    c, s, mesh = load_preset(model), load_stack("vllm"), Mesh()
    kd, _, eff, link = deployment_defaults(device, mesh, weights, None, s, None, None, None, c)
    step = step_cost(c, device, mesh, weights, kd, eff, link, s, max(context, 1), max(prompt_tokens, 1),
                     profile=profile)
    d = step.parts(rows, prompt_tokens)
    return dict(gpu_ms=float(d["measured_gpu_ms"] + d["comm_ms"]), step_ms=float(d["step_ms"]))


def compare(row: dict, profile, device: Device) -> dict:
    """The profile's figure for one row, its ratio to the chip's and whether it lies in the row's band."""
    lo, hi = float(row["chip_low"]), float(row["chip_high"])
    if row["kind"] == "step":
        got = step_gpu_ms(profile, device, row["model"], row["weights"], int(row["rows"]), int(row["context"]),
                          int(row["prompt_tokens"]))
        value, whole = got["gpu_ms"], got["step_ms"]
        if lo == hi:
            ratio = value / lo
            ok = float(row["band_low"]) <= ratio <= float(row["band_high"])
        else:                                    # a spread of measured kernels: inside it
            ratio, ok = value / lo, lo <= value <= hi
        return dict(row, predicted=value, whole_step_ms=whole, ratio=ratio, ok=ok)
    if row["kind"] == "gemm":
        value = gemm_ms(profile, device, int(row["m"]), int(row["n"]), int(row["k"]), row["weights"]).efficiency
    else:
        c = load_preset(row["model"])
        value = decode_attention_ms(profile, device, int(row["rows"]), float(row["context"]), c.num_heads,
                                    c.num_kv_heads, c.head_dim, row["weights"]).efficiency
    return dict(row, predicted=value, whole_step_ms=None, ratio=value / lo,
                ok=lo - KERNEL_SLACK <= value <= hi + KERNEL_SLACK)
