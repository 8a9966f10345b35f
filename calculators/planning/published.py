"""Published data-centre serving measurements next to the planner's prediction with the default settings of the
stack each source names (`bench/published_serving.csv`: every row read in its source, with the URL).

Row modes:
- offline (all requests queued, fixed lengths): `throughput.max_throughput`'s output tokens/s;
- concurrency C (a closed loop of C users, AIPerf/genai-perf): ITL = one steady-state step with C sequences,
  TTFT = the prompt's prefill, output tokens/s = C·O / (TTFT + (O − 1)·ITL), or the maximum throughput once C
  exceeds the batch the deployment can hold;
- static batch B (every sequence starts together): end-to-end = prefill of B prompts + (O − 1) decode steps at
  the mean context; output tokens/s = B·O / end-to-end.
Error = predicted speed / published speed − 1 (+ = the prediction is too optimistic), whatever the unit.
Rows this predictor does not price yet (mode `server`: a rate under MLPerf-style latency limits; rows whose lengths
the source does not state, such as MLPerf's dataset mean input length) load all the same and are listed apart as
`unpriced` by `compare_all`.
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from calculators.sizing.latency import Efficiency
from calculators.multi_gpu.tensor_parallel import Mesh, _link_for, decode_step_parallel, prefill_parallel
from calculators.planning.throughput import batch_limits, max_throughput, step_time
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack

SERVING_CSV = Path(__file__).resolve().parents[2] / "bench" / "published_serving.csv"
TIME_METRICS = ("itl_ms", "ttft_ms", "e2e_ms")
COLUMNS = ("source", "url", "stack", "model", "device", "gpus", "tp", "ep", "weights", "kv", "prompt_tokens",
           "output_tokens", "mode", "concurrency", "metric", "published", "settings")
PRICED_MODES = ("offline", "concurrency", "static")


def load_rows(path: Path = SERVING_CSV) -> list[dict]:
    """The published rows as read (strings), each checked to have every column."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, 2):
        missing = [c for c in COLUMNS if c not in r]
        if missing:
            raise SpecError(f"{path}: line {i} lacks {', '.join(missing)}")
    return rows


def _setup(row: dict):
    c, dev = load_preset(row["model"]), load_device(row["device"])
    mesh = Mesh(tp=int(row["tp"]), ep=int(row["ep"] or 1), gpus=int(row["gpus"]))
    stack = load_stack(row["stack"])
    return c, dev, mesh, stack, Efficiency.for_stack(stack, dev)


def _concurrency(row: dict, c, dev, mesh, stack, eff) -> float:
    I, O, C = int(row["prompt_tokens"]), int(row["output_tokens"]), int(row["concurrency"])
    w, kv = row["weights"], row["kv"]
    lim = batch_limits(c, dev, mesh, I, O, w, kv, stack, stack.gpu_memory_utilization)
    if row["metric"] == "ttft_ms":
        return prefill_parallel(c, dev, mesh, I, 1, w, kv, eff, stack=stack)["prefill_ms"]
    if C > lim["batch"] * mesh.replicas and row["metric"] == "output_tok_s":
        return max_throughput(c, dev, mesh, I, O, w, kv, stack)["output_tok_s"]
    per_replica = max(1, -(-C // mesh.replicas))
    itl = step_time(c, dev, mesh, min(per_replica, lim["batch"]), I, O, w, kv, eff, _link_for(dev, None),
                    stack)["step_ms"]
    if row["metric"] == "itl_ms":
        return itl
    ttft = prefill_parallel(c, dev, mesh, I, 1, w, kv, eff, stack=stack)["prefill_ms"]
    return C * O / (ttft + (O - 1) * itl) * 1e3


def _static(row: dict, c, dev, mesh, stack, eff) -> float:
    I, O, B = int(row["prompt_tokens"]), int(row["output_tokens"]), int(row["concurrency"])
    w, kv = row["weights"], row["kv"]
    pre = prefill_parallel(c, dev, mesh, I, B, w, kv, eff, stack=stack)["prefill_ms"]
    dec = decode_step_parallel(c, dev, mesh, I + O // 2, B, w, kv, eff, stack=stack)["itl_ms"]
    e2e = pre + (O - 1) * dec
    return e2e if row["metric"] == "e2e_ms" else B * O / e2e * 1e3


def predict(row: dict) -> float:
    """The planner's figure for one row, in the row's unit, with the row's stack's defaults."""
    c, dev, mesh, stack, eff = _setup(row)
    mode = row["mode"]
    if mode == "offline":
        return max_throughput(c, dev, mesh, int(row["prompt_tokens"]), int(row["output_tokens"]), row["weights"],
                              row["kv"], stack)["output_tok_s"]
    if mode == "concurrency":
        return _concurrency(row, c, dev, mesh, stack, eff)
    if mode == "static":
        return _static(row, c, dev, mesh, stack, eff)
    raise SpecError(f"unknown mode {mode!r}: offline, concurrency or static")


def speed_error(row: dict, predicted: float) -> float:
    """Predicted speed / published speed − 1 (times are inverted first)."""
    pub = float(row["published"])
    return (pub / predicted if row["metric"] in TIME_METRICS else predicted / pub) - 1


def priced(row: dict) -> bool:
    """Whether `predict` prices this row: a mode it models and both lengths stated."""
    return row["mode"] in PRICED_MODES and bool(row["prompt_tokens"]) and bool(row["output_tokens"])


def compare_all(rows: list[dict] | None = None) -> dict:
    """Every priced row with its prediction and error, the median and worst |error|, and the rows left unpriced."""
    out, unpriced = [], []
    for r in rows if rows is not None else load_rows():
        if not priced(r):
            unpriced.append(r)
            continue
        p = predict(r)
        out.append(dict(r, predicted=p, error=speed_error(r, p)))
    errs = [abs(r["error"]) for r in out]
    return dict(rows=out, unpriced=unpriced, median_abs_error=statistics.median(errs) if errs else None,
                worst_abs_error=max(errs) if errs else None)
