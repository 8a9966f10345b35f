"""Capacity-planner speed: how many candidate plans the vectorised search evaluates per second, against a scalar
loop over the same candidates (the tensor_parallel functions one by one), measured in one run.

    python bench/bench_planner.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.sizing.latency import Efficiency  # noqa: E402
from calculators.planning.planner import Workload, plan  # noqa: E402
from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel, mesh_problem, per_gpu_memory  # noqa: E402
from specs.devices import load_device  # noqa: E402
from specs.presets import load_preset  # noqa: E402


def main() -> None:
    model = load_preset("llama-3-70b")
    devices = [load_device(n) for n in ("h100", "a100-80gb", "h200", "l40s", "mi300x")]
    wl = Workload(requests_per_s=2.0, prompt_tokens=2000, output_tokens=300, ttft_p99_ms=2000, itl_ms=50,
                  prompt_tokens_p99=8000)
    plan(model, devices, wl)                                               # warm-up (imports, caches)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        res = plan(model, devices, wl)
        times.append(time.perf_counter() - t)
    best = min(times)
    valid = int(np.sum(res.columns["reason"] != "mesh"))
    print(f"vectorised planner: {res.n_candidates:,} candidates ({valid:,} valid layouts, "
          f"{len(res.feasible_order):,} feasible) in {best * 1e3:.1f} ms (best of 5; median "
          f"{np.median(times) * 1e3:.1f} ms) -> {res.n_candidates / best:,.0f} candidates/s")
    # scalar reference: per-GPU memory + decode for a sample of valid candidates, one call at a time
    idx = np.flatnonzero(~np.isin(res.columns["reason"], ("mesh", "precision")))[:300]
    t = time.perf_counter()
    for i in idx:
        r = res.plan(int(i))
        dev = next(d for d in devices if d.name == r["device"])
        mesh = Mesh(tp=r["tp"], pp=r["pp"], gpus=r["gpus"])
        if mesh_problem(model, mesh) is None:
            per_gpu_memory(model, dev, mesh, 2300, r["batch_cap"], r["weight_dtype"], r["kv_dtype"])
            decode_step_parallel(model, dev, mesh, 2150, r["batch_cap"], r["weight_dtype"], r["kv_dtype"],
                                 Efficiency())
    per_scalar = (time.perf_counter() - t) / len(idx)
    print(f"scalar loop: {per_scalar * 1e6:.0f} us per candidate (memory + decode only) -> "
          f"{res.n_candidates * per_scalar:.1f} s for the same search; vectorised speed-up "
          f"{res.n_candidates * per_scalar / best:.0f}x")
    print(f"cheapest: {res.ranked(1)[0]['gpus']} x {res.ranked(1)[0]['device']} TP {res.ranked(1)[0]['tp']} "
          f"(${res.ranked(1)[0]['usd_per_million_tokens']:.3f} per 1M tokens)" if len(res.feasible_order) else
          res.no_plan_reason())

    measured(model, devices, wl, min(times))


def measured(model, devices, wl, closed_best: float) -> None:
    """The same search with every candidate on a profiled GPU priced from measured kernels (aiconfigurator-core,
    when installed): the first call loads the profiles (once per process), the next are timed like the above."""
    from specs.aiconfigurator_source import package_dir, readers_installed
    if package_dir() is None or not readers_installed():
        print("measured kernels: aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
        return
    t = time.perf_counter()
    plan(model, devices, wl, profile="auto")
    first = time.perf_counter() - t
    times = []
    for _ in range(5):
        t = time.perf_counter()
        res = plan(model, devices, wl, profile="auto")
        times.append(time.perf_counter() - t)
    print(f"measured kernels: first call {first:.1f} s (loads {len(devices)} profiles), then {min(times) * 1e3:.1f} ms "
          f"(best of 5) = {min(times) / closed_best:.2f}x the closed form; {len(res.feasible_order):,} feasible")


if __name__ == "__main__":
    main()
