"""Serving-simulator speed: 10,000 requests through continuous and static batching (target: under 2 s each),
plus the KV-allocation simulator, measured in one run.

    python bench/bench_simulator.py            # 10,000 requests, TinyLlama on an A100 (ideal step model)
    python bench/bench_simulator.py --requests 50000

Each case is timed three times and the median printed, with the simulated load (mean batch) beside it, because
the loop's cost grows with the number of events (arrivals, finishes, prefills), not with tokens.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.serving.batching import step_model_for  # noqa: E402
from calculators.serving.kv_allocation import compare_allocators  # noqa: E402
from calculators.serving.serving_sim import simulate  # noqa: E402
from calculators.serving.workload import synthetic_workload  # noqa: E402
from specs.devices import load_device  # noqa: E402
from specs.presets import load_preset  # noqa: E402

TARGET_S = 2.0


def median_s(fn, reps: int = 3) -> tuple[float, object]:
    out, ts = None, []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    a = ap.parse_args()
    model = step_model_for(load_preset("tinyllama"), load_device("a100"), "fp16")
    n = a.requests
    print(f"serving simulator, {n:,} requests, {model.name}")
    print(f"{'case':<44} {'median s':>9} {'mean batch':>11} {'steps':>9}  verdict")
    worst = 0.0
    for rate, cap, label in ((20, 32, "light load"), (200, 32, "busy"), (2000, 64, "overloaded")):
        w = synthetic_workload(n, rate, 200, 128, prompt_kind="uniform", output_kind="exponential", seed=1)
        for policy in ("continuous", "static"):
            s, r = median_s(lambda: simulate(model, w, policy, cap))
            worst = max(worst, s)
            summ = r.summary()
            print(f"{policy + ', ' + label + f' ({rate} req/s, cap {cap})':<44} {s:>9.3f} "
                  f"{summ['mean_batch']:>11.1f} {summ['steps']:>9,}  {'ok' if s < TARGET_S else 'SLOW'}")
    w = synthetic_workload(min(n, 1000), 25, 200, 150, prompt_kind="uniform", output_kind="exponential",
                           max_tokens=2048, seed=2)
    s, _ = median_s(lambda: compare_allocators(w, 12_000, step_s=0.02, max_tokens=2048), reps=1)
    print(f"{'KV allocation, 3 allocators, ' + f'{len(w):,} requests':<44} {s:>9.3f}")
    print(f"slowest simulator case: {worst:.3f} s for {n:,} requests (target < {TARGET_S} s): "
          f"{'PASS' if worst < TARGET_S else 'FAIL'}")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
