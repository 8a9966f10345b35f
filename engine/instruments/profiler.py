"""The profiler: measure the machine it runs on, op by op, within a time budget, as a device profile.

    from engine.instruments.profiler import run_profile, numpy_backend
    doc = run_profile(numpy_backend(), budget_s=60, quick=True)      # a dict in the profile-1 format
    write_profile(doc, default_path(doc["name"]))                     # specs/profiles/<name>.json.gz

Order of work: the device's peaks first (bandwidth and FLOP/s, what the roofline of each op is drawn from), then
the tables, each given a share of the time left (TABLE_WEIGHTS). Within a table the shapes go cheapest first, as
the roofline predicts them from the measured peaks, so a run cut short loses the largest shapes, the ones the
roofline itself predicts best; a shape whose warm-up and three samples would overrun its table's time is not
started. What was not measured is counted in the profile's provenance (`partial`, `not_measured`).
"""
from __future__ import annotations

import time
from functools import partial
from typing import Callable

from engine.instruments.profile_file import cores, host, profile_document, slug, utc_now
from engine.instruments.profile_grid import cpu_grid, gpu_grid
from engine.instruments.profile_timer import Budget, Clock, fits, median_seconds, shape_budget
from specs.devices import load_device
from specs.model_config import SpecError

TABLE_WEIGHTS = {"launch": 0.02, "gemm": 0.5, "generation_attention": 0.26, "context_attention": 0.22}
PEAKS_SHARE = 0.08          # of the budget, for the bandwidth and FLOP/s probe (at most PEAKS_MAX_S)
PEAKS_MAX_S = 4.0
SHAPE_CAP_S = 1.0           # no one shape is timed for longer than this
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
GPU_ATTENTION_MEMORY = 0.25         # of the free device memory, what one attention shape's K/V copies may take

Progress = Callable[[int, int, float, str, tuple, float | None], None]


# ============================================================================================ what each shape costs
def gemm_flops(m: int, n: int, k: int) -> float:
    """2·M·N·K: one multiply and one add per term of each output."""
    return 2.0 * m * n * k


def gemm_bytes(m: int, n: int, k: int, element_bytes: float) -> float:
    """W [n, k] and x [m, k] read, y [m, n] written."""
    return element_bytes * (n * k + m * k + m * n)


def attention_flops(batch: int, tokens: int, prefix: int, heads: int, head_dim: int) -> float:
    """QKᵀ and P·V over the full tokens × (prefix + tokens) rectangle, 2·d FLOPs per score each: the engine's
    convention (engine/model/trace.py, calculators/sizing/roofline.py), causal half included."""
    return 2 * 2.0 * batch * heads * head_dim * tokens * (prefix + tokens)


def attention_bytes(batch: int, tokens: int, prefix: int, heads: int, kv_heads: int, head_dim: int,
                    element_bytes: float) -> float:
    """K and V of every key read once, the queries read and the outputs written."""
    return element_bytes * batch * head_dim * (2 * kv_heads * (prefix + tokens) + 2 * heads * tokens)


def shape_cost(table: str, key: tuple) -> tuple[float, float]:
    """(FLOPs, bytes) of one row's op, from its key."""
    eb = ELEMENT_BYTES.get(key[0], 4)
    if table == "gemm":
        _, m, n, k = key
        return gemm_flops(m, n, k), gemm_bytes(m, n, k, eb)
    if table == "generation_attention":
        _, _, b, s, h, kv, d, _ = key
        return attention_flops(b, 1, s - 1, h, d), attention_bytes(b, 1, s - 1, h, kv, d, eb)
    if table == "context_attention":
        _, _, b, t, p, h, kv, d, _ = key
        return attention_flops(b, t, p, h, d), attention_bytes(b, t, p, h, kv, d, eb)
    return 0.0, 0.0


def predicted_seconds(flops: float, n_bytes: float, bandwidth: float, peak_flops: float) -> float:
    """The roofline: the slower of moving the bytes and doing the FLOPs."""
    return max(flops / peak_flops, n_bytes / bandwidth)


# ============================================================================================ measuring the tables
def make_op(backend, table: str, key: tuple) -> Callable[[], object]:
    if table == "gemm":
        return backend.gemm(*key)
    if table == "generation_attention":
        dtype, _, b, s, h, kv, d, _ = key
        return backend.generation_attention(dtype, b, s, h, kv, d)
    dtype, _, b, t, p, h, kv, d, _ = key
    return backend.context_attention(dtype, b, t, p, h, kv, d)


def plan(backend, grid: dict[str, list[tuple]], bandwidth: float, peaks: dict[str, float]) -> dict[str, list]:
    """Per table, the keys this backend runs, cheapest first: [(key, predicted seconds)]."""
    peak = max(peaks.values())
    out = {}
    for table, keys in grid.items():
        rows = [(k, predicted_seconds(*shape_cost(table, k), bandwidth, peak)) for k in keys if backend.supports(k[0])]
        out[table] = sorted(rows, key=lambda r: r[1])
    return out


def time_shape(backend, make: Callable[[], Callable[[], object]], budget_s: float, clock: Clock) -> float:
    """ms per op of the callable `make()` builds (a callable may run several ops: its `ops_per_call`); its operands
    are given back afterwards, measured or not."""
    fn = None
    try:
        fn = make()
        seconds = median_seconds(fn, budget_s, clock=clock, sync=backend.sync).seconds
        return seconds * 1e3 / getattr(fn, "ops_per_call", 1)
    finally:
        del fn
        backend.release()


def measure_tables(backend, planned: dict[str, list], budget: Budget, *, clock: Clock = time.perf_counter,
                   progress: Progress | None = None, cap_s: float = SHAPE_CAP_S) -> dict:
    """Time every planned shape the budget allows. Returns {"rows": {table: [(*key, ms)]}, "not_measured",
    "failed": {table: count}, "errors": [first messages], "stopped": None | "budget" | "interrupted"}."""
    launch = backend.launch()
    planned = {"launch": [((kind,), 0.0) for kind in launch], **planned}
    total = sum(len(v) for v in planned.values())
    rows: dict[str, list] = {t: [] for t in planned}
    not_measured = {t: 0 for t in planned}
    failed = {t: 0 for t in planned}
    errors: list[str] = []
    stopped, done = None, 0
    tables = list(planned)
    for ti, table in enumerate(tables):
        weights_to_come = sum(TABLE_WEIGHTS.get(t, 0.1) for t in tables[ti:])
        t_end = clock() + budget.share(TABLE_WEIGHTS.get(table, 0.1), weights_to_come)
        shapes = planned[table]
        for i, (key, predicted) in enumerate(shapes):
            left = t_end - clock()
            if stopped or budget.left() <= 0 or not fits(predicted, left):
                stopped = stopped or ("budget" if budget.left() <= 0 else None)
                not_measured[table] += 1
                continue
            ms = None
            try:
                make = (lambda: launch[key[0]]) if table == "launch" else partial(make_op, backend, table, key)
                ms = time_shape(backend, make, shape_budget(left, len(shapes) - i, cap_s), clock)
                rows[table].append((*key, ms))
            except KeyboardInterrupt:
                stopped = "interrupted"
                not_measured[table] += 1
            except (RuntimeError, MemoryError, ValueError) as e:     # out of memory, a shape a kernel refuses
                failed[table] += 1
                if len(errors) < 10:
                    errors.append(f"{table} {key}: {type(e).__name__}: {str(e)[:200]}")
            done += 1
            if progress is not None:
                progress(done, total, budget.elapsed(), table, key, ms)
    return {"rows": rows, "not_measured": not_measured, "failed": failed, "errors": errors, "stopped": stopped}


def best_rates(rows: list[tuple]) -> dict[str, float]:
    """Per dtype, the highest FLOP/s any GEMM row reached."""
    out: dict[str, float] = {}
    for dtype, m, n, k, ms in rows:
        out[dtype] = max(out.get(dtype, 0.0), gemm_flops(m, n, k) / (ms / 1e3))
    return out


def best_bandwidth(rows: list[tuple]) -> float:
    """The highest bytes/s any GEMM row moved (its operands come from memory: see COLD_BYTES), 0 without rows."""
    return max((gemm_bytes(m, n, k, ELEMENT_BYTES[d]) / (ms / 1e3) for d, m, n, k, ms in rows), default=0.0)


# ============================================================================================ the whole run
def numpy_backend():
    from engine.instruments.profile_numpy import NumpyBackend
    return NumpyBackend()


def torch_backend(device: str = "cuda"):
    from engine.instruments.profile_torch import TorchBackend
    return TorchBackend(device)


def default_name(backend) -> str:
    """'cpu-amd-epyc-2c' for NumPy on a 2-core AMD EPYC; 'h200-torch-2.11' for torch on an H200."""
    device = backend.device_name()
    if device.startswith("CPU: "):
        model = device[5:].rsplit(" (", 1)[0].replace("(R)", "").replace("(TM)", "")
        base = f"cpu-{slug(model)}-{cores()}c"
    else:
        base = slug(device.removeprefix("GPU: "))
    if backend.stack == "torch":
        base += "-torch-" + ".".join(backend.stack_version.split("+")[0].split(".")[:2])
    return base


def has_datasheet(device: str) -> bool:
    try:
        load_device(device)
        return True
    except SpecError:
        return False


def run_profile(backend, *, budget_s: float = 60.0, quick: bool = True, grid: dict | None = None,
                name: str | None = None, detail: str = "", clock: Clock = time.perf_counter,
                progress: Progress | None = None) -> dict:
    """Measure `backend`'s device for about budget_s seconds; the profile as a dict (see profile_file)."""
    budget = Budget(budget_s, clock)
    date = utc_now()
    bandwidth, peaks = backend.peaks(min(PEAKS_MAX_S, PEAKS_SHARE * budget_s))
    grid_label = "custom" if grid is not None else ("quick" if quick else "full")
    if grid is None:
        if backend.stack == "numpy":
            grid = cpu_grid(quick)
        else:
            dtypes = ("bf16", "fp8") if quick else ("bf16", "fp16", "fp8")
            grid = gpu_grid(quick, GPU_ATTENTION_MEMORY * backend.memory_bytes(), dtypes)
    result = measure_tables(backend, plan(backend, grid, bandwidth, peaks), budget, clock=clock, progress=progress)
    for dtype, rate in best_rates(result["rows"]["gemm"]).items():     # the peaks: the best seen anywhere
        peaks[dtype] = max(peaks.get(dtype, 0.0), rate)
    bandwidth = max(bandwidth, best_bandwidth(result["rows"]["gemm"]))
    measured = {"memory_bandwidth_bytes_per_s": round(bandwidth), "peak_flops": {k: round(v) for k, v in peaks.items()}}
    device = backend.device_name()
    partial = result["stopped"] is not None or any(result["not_measured"].values())
    provenance = {**backend.provenance(), "date": date, "host": host(), "duration_s": round(budget.elapsed(), 1),
                  "budget_s": budget_s, "grid": grid_label, "partial": partial, "stopped": result["stopped"],
                  "not_measured": {t: n for t, n in result["not_measured"].items() if n},
                  "failed": {t: n for t, n in result["failed"].items() if n}, "errors": result["errors"],
                  "measured": measured,
                  "timing": "median of >= 3 samples after one warm-up call, operands cycled through copies "
                            "larger than the last-level cache"}
    return profile_document(name=name or default_name(backend), device=device, stack=backend.stack,
                            stack_version=backend.stack_version, detail=detail, provenance=provenance,
                            tables=result["rows"], datasheet=None if has_datasheet(device) else measured)
