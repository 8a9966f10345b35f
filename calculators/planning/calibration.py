"""Calibration: fit the efficiency knobs (decode MBU, prefill MFU, per-call communication latency) to measured
serving results, and show predicted vs measured with the error.

Inputs: vLLM's `benchmarks/benchmark_serving.py --save-result` JSON (keys `mean_ttft_ms`, `mean_itl_ms` or
`mean_tpot_ms`, `total_input_tokens`, `total_output_tokens`, `completed`, `max_concurrency`,
`output_throughput`), or a CSV with one measured setting per row:
    prompt_tokens, output_tokens, batch, ttft_ms, itl_ms[, tp][, throughput_tok_s]
The model and device are stated by the caller (neither file records the hardware).

The fit is linear least squares on the ideal components `calculators.multi_gpu.tensor_parallel` computes at 100% efficiency:
    ITL_measured  ≈ memory_ms_ideal / MBU + calls_per_token × alpha_ms       (alpha only when some row has TP > 1)
    TTFT_measured ≈ compute_ms_ideal / MFU
so 1/MBU, alpha and 1/MFU are the coefficients (Numpy `lstsq`; through the origin). With three or more
single-GPU rows of different step sizes the ITL fit also takes an intercept, the fixed per-step cost
(ITL ≈ memory_ms_ideal / MBU + step_overhead_ms; kept only when both come out positive).
`fit_overhead=True` adds a fixed cost per step (launches, scheduling, HTTP: `batching.StepModel.overhead_ms`),
shared by both lines, and fits all of them at once on relative errors (each row divided by its measurement):
    ITL ≈ memory_ms_ideal / MBU + calls × alpha + overhead,     TTFT ≈ compute_ms_ideal / MFU + overhead
with MBU, MFU ≤ 1 and alpha, overhead ≥ 0 (the best of the bounded least-squares solutions on each set of active
bounds).
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

import numpy as np

from calculators.sizing.latency import IDEAL, Efficiency
from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel, prefill_parallel, stage_layers
from calculators.units import check_int, check_positive
from specs.devices import Device, Link
from specs.model_config import ModelConfig, SpecError

CSV_COLUMNS = ("prompt_tokens", "output_tokens", "batch", "ttft_ms", "itl_ms")


@dataclass(frozen=True)
class Measurement:
    """One measured setting: shapes and the measured mean TTFT and ITL."""
    prompt_tokens: int
    output_tokens: int
    batch: int
    ttft_ms: float
    itl_ms: float
    tp: int = 1
    throughput_tok_s: float | None = None


def _num(row: dict, key: str, cast=float):
    try:
        return cast(float(row[key]))
    except (KeyError, TypeError, ValueError):
        raise SpecError(f"missing or non-numeric {key!r} (got {row.get(key)!r})") from None


def read_vllm_json(text: str, tp: int = 1) -> list[Measurement]:
    """One measurement from a vLLM benchmark_serving result: mean prompt and output lengths from the token totals
    over completed requests; batch = max_concurrency (or 1); ITL = mean_itl_ms (else mean_tpot_ms)."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON: {e.msg} at line {e.lineno}") from None
    docs = d if isinstance(d, list) else [d]
    out = []
    for doc in docs:
        if not isinstance(doc, dict):
            raise SpecError("expected vLLM benchmark result objects")
        n = _num(doc, "completed", int)
        if n <= 0:
            raise SpecError("the benchmark completed no requests")
        itl_key = "mean_itl_ms" if "mean_itl_ms" in doc else "mean_tpot_ms"
        out.append(Measurement(
            prompt_tokens=max(1, round(_num(doc, "total_input_tokens") / n)),
            output_tokens=max(1, round(_num(doc, "total_output_tokens") / n)),
            batch=int(doc.get("max_concurrency") or 1), ttft_ms=_num(doc, "mean_ttft_ms"), itl_ms=_num(doc, itl_key),
            tp=tp, throughput_tok_s=doc.get("output_throughput")))
    return out


def read_csv(text: str) -> list[Measurement]:
    """Rows of measured settings; the header must name prompt_tokens, output_tokens, batch, ttft_ms, itl_ms."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise SpecError("the CSV has no data rows")
    missing = [c for c in CSV_COLUMNS if c not in rows[0]]
    if missing:
        raise SpecError(f"the CSV lacks column(s) {', '.join(missing)}; expected {', '.join(CSV_COLUMNS)}")
    out = []
    for i, r in enumerate(rows, 2):
        try:
            m = Measurement(prompt_tokens=_num(r, "prompt_tokens", int), output_tokens=_num(r, "output_tokens", int),
                            batch=_num(r, "batch", int), ttft_ms=_num(r, "ttft_ms"), itl_ms=_num(r, "itl_ms"),
                            tp=_num(r, "tp", int) if r.get("tp") not in (None, "") else 1,
                            throughput_tok_s=float(r["throughput_tok_s"]) if r.get("throughput_tok_s") else None)
            for k in ("prompt_tokens", "output_tokens", "batch", "tp"):
                check_int(k, getattr(m, k))
            check_positive("ttft_ms", m.ttft_ms)
            check_positive("itl_ms", m.itl_ms)
        except SpecError as e:
            raise SpecError(f"CSV line {i}: {e}") from None
        out.append(m)
    return out


def _ideal_parts(config: ModelConfig, device: Device, m: Measurement, weight_dtype: str, kv_dtype: str | None,
                 link: Link | None) -> dict:
    mesh = Mesh(tp=m.tp)
    mean_ctx = m.prompt_tokens + max(m.output_tokens - 1, 0) // 2 + 1
    dec = decode_step_parallel(config, device, mesh, mean_ctx, m.batch, weight_dtype, kv_dtype, IDEAL, link)
    pre = prefill_parallel(config, device, mesh, m.prompt_tokens, 1, weight_dtype, kv_dtype, IDEAL, link)
    calls = 2 * stage_layers(config, 1) if m.tp > 1 else 0
    return dict(mem_ms=dec["memory_ms"], comp_ms=pre["compute_ms"], calls=calls,
                decode_comm_ms=dec["comm_ms_per_stage"], prefill_comm_ms=pre["allreduce_ms_prefill"])


EXAMPLE_SHAPES = ((128, 128, 1), (512, 128, 1), (1024, 128, 8))     # (prompt, output, batch) of the example rows
EXAMPLE_MBU, EXAMPLE_MFU = 0.5, 0.4


def example_csv(config: ModelConfig, device: Device, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                decode_mbu: float = EXAMPLE_MBU, prefill_mfu: float = EXAMPLE_MFU) -> str:
    """Example rows in the CSV format, consistent with this model on this device: the TTFT and ITL a server would
    measure at `decode_mbu` and `prefill_mfu` (3 significant digits), so that fitting them gives those knobs back
    and never an efficiency above 1. Prompts are cut to fit the context window."""
    out = ["prompt_tokens,output_tokens,batch,ttft_ms,itl_ms,tp"]
    for prompt, output, batch in EXAMPLE_SHAPES:
        prompt = max(1, min(prompt, config.max_position_embeddings - output))
        p = _ideal_parts(config, device, Measurement(prompt, output, batch, 1.0, 1.0), weight_dtype, kv_dtype, None)
        ttft, itl = (float(f"{x:.3g}") for x in (p["comp_ms"] / prefill_mfu, p["mem_ms"] / decode_mbu))
        out.append(f"{prompt},{output},{batch},{ttft:g},{itl:g},1")
    return "\n".join(out) + "\n"


def _bounded_lstsq(a: np.ndarray, y: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """min |a·x − y|² subject to x ≥ lower: each set of coefficients held at its bound, the rest solved freely;
    the feasible solution with the smallest residual (exact for a handful of unknowns)."""
    n = a.shape[1]
    best, best_res = lower.copy(), np.inf
    for mask in range(1 << n):
        fixed = np.array([(mask >> j) & 1 == 1 for j in range(n)])
        x = lower.copy()
        if (~fixed).any():
            free = a[:, ~fixed]
            x[~fixed] = np.linalg.lstsq(free, y - a[:, fixed] @ lower[fixed], rcond=None)[0]
        if np.all(x >= lower - 1e-12):
            res = float(np.sum((a @ x - y) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best


def _fit_with_overhead(mem, calls, comp, itl, ttft) -> tuple[float, float, float, float]:
    """(1/MBU, alpha, 1/MFU, overhead) from the joint relative-error fit (see the module docstring)."""
    n = len(mem)
    a = np.zeros((2 * n, 4))
    a[:n, 0], a[:n, 1], a[n:, 2], a[:, 3] = mem, calls, comp, 1.0
    y = np.concatenate([itl, ttft])
    a, y = a / y[:, None], np.ones_like(y)
    keep = a.any(axis=0)
    x = np.zeros(4)
    x[keep] = _bounded_lstsq(a[:, keep], y, np.array([1.0, 0.0, 1.0, 0.0])[keep])
    return tuple(float(v) for v in x)


def calibrate(config: ModelConfig, device: Device, measurements: list[Measurement], weight_dtype: str = "bf16",
              kv_dtype: str | None = None, link: Link | None = None, fit_overhead: bool = False) -> dict:
    """Fit MBU, MFU, (with TP rows) the per-call latency and (`fit_overhead`) a fixed per-step cost; return them
    with each row's predicted vs measured."""
    if not measurements:
        raise SpecError("no measurements to calibrate against")
    parts = [_ideal_parts(config, device, m, weight_dtype, kv_dtype, link) for m in measurements]
    itl = np.array([m.itl_ms for m in measurements])
    ttft = np.array([m.ttft_ms for m in measurements])
    mem = np.array([p["mem_ms"] for p in parts])
    calls = np.array([p["calls"] for p in parts], dtype=float)
    comp = np.array([p["comp_ms"] for p in parts])
    overhead_ms, step_ms = 0.0, 0.0
    if fit_overhead:
        inv_mbu, alpha_ms, inv_mfu, overhead_ms = _fit_with_overhead(mem, calls, comp, itl, ttft)
    elif calls.any():
        (inv_mbu, alpha_ms), *_ = np.linalg.lstsq(np.stack([mem, calls], axis=1), itl, rcond=None)
    else:
        inv_mbu, alpha_ms = float(mem @ itl / (mem @ mem)), 0.0
    if not fit_overhead:
        if len(set(np.round(mem, 9))) >= 3 and not calls.any():   # enough distinct steps: fit the fixed cost too
            (inv_b, step_b), *_ = np.linalg.lstsq(np.stack([mem, np.ones_like(mem)], axis=1), itl, rcond=None)
            if step_b > 0 and inv_b > 0:
                inv_mbu, step_ms = float(inv_b), float(step_b)
        inv_mfu = float(comp @ ttft / (comp @ comp))
    raw_mbu, raw_mfu = 1 / max(inv_mbu, 1e-9), 1 / max(inv_mfu, 1e-9)
    mbu, mfu = min(1.0, raw_mbu), min(1.0, raw_mfu)
    held = [f"the measured {what} imply {name} = {raw:.2f}, above 1: faster than {device.name}'s datasheet floor "
            f"for {weight_dtype} weights allows. Check the device, the weight precision (a quantized model reads "
            f"fewer bytes) and the TP; {name} is held at 1.00, so the predictions below stay slower than measured."
            for what, name, raw in (("ITLs", "decode MBU", raw_mbu), ("TTFTs", "prefill MFU", raw_mfu)) if raw > 1]
    alpha_ms = max(0.0, float(alpha_ms))
    rows = []
    for m, p in zip(measurements, parts):
        pi = p["mem_ms"] / mbu + p["calls"] * alpha_ms + step_ms + overhead_ms
        pt = p["comp_ms"] / mfu + overhead_ms
        rows.append(dict(prompt_tokens=m.prompt_tokens, output_tokens=m.output_tokens, batch=m.batch, tp=m.tp,
                         measured_itl_ms=m.itl_ms, predicted_itl_ms=pi, itl_error_percent=100 * (pi - m.itl_ms) / m.itl_ms,
                         measured_ttft_ms=m.ttft_ms, predicted_ttft_ms=pt,
                         ttft_error_percent=100 * (pt - m.ttft_ms) / m.ttft_ms))
    return dict(decode_mbu=mbu, prefill_mfu=mfu, alpha_ms_per_call=alpha_ms, step_overhead_ms=step_ms + overhead_ms,
                overhead_ms=overhead_ms, raw_decode_mbu=raw_mbu, raw_prefill_mfu=raw_mfu, held_at_one=held,
                efficiency=Efficiency(decode_mbu=max(mbu, 1e-3), prefill_mfu=max(mfu, 1e-3),
                                      step_overhead_ms=step_ms + overhead_ms), rows=rows,
                itl_mean_abs_error_percent=float(np.mean([abs(r["itl_error_percent"]) for r in rows])),
                ttft_mean_abs_error_percent=float(np.mean([abs(r["ttft_error_percent"]) for r in rows])))
