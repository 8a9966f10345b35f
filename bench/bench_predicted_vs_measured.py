"""Theory vs experiment on this machine: the floors of the engine's decode (ITL) and prefill time (fp32 weights,
this machine's matvec bandwidth and GEMM rate measured in the same run) against the engine's measured time.
Prints measured / floor ratios (≥ 1). The ITL floor is `calculators.sizing.engine_floor.engine_itl_floor_ms`, the same
function and byte convention as the Your-machine page; prefill is FLOPs / measured GEMM FLOP/s, as there.

    python bench/bench_predicted_vs_measured.py [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.sizing.engine_floor import engine_itl_floor_ms  # noqa: E402
from calculators.explain import explain_compute_time  # noqa: E402
from calculators.sizing.roofline import forward_flops  # noqa: E402
from engine import Model, ModelError, load_model  # noqa: E402
from specs.devices import measure_this_machine  # noqa: E402
from specs.presets import load_preset  # noqa: E402


def measure(model: Model, prompt_tokens: int, decode_steps: int) -> tuple[float, float]:
    ids = [int(t) for t in np.random.default_rng(0).integers(3, model.config.vocab_size, prompt_tokens)]
    model.prefill(ids[:8], model.new_cache(1, 16))                        # warm up
    pre = []
    for _ in range(3):
        cache = model.new_cache(1, prompt_tokens + decode_steps + 1)
        t = time.perf_counter()
        model.prefill(ids, cache)
        pre.append(time.perf_counter() - t)
    steps = []
    for _ in range(decode_steps):
        t = time.perf_counter()
        model.decode_step(5, cache)
        steps.append(time.perf_counter() - t)
    return float(np.median(pre)) * 1e3, float(np.median(steps)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    machine = measure_this_machine(seconds_budget=2.0 if args.quick else 4.0)
    print(f"this machine: {machine.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s (NumPy matvec), "
          f"{machine.peak_flops['fp32'] / 1e9:.0f} GFLOP/s (NumPy fp32 GEMM)")
    models = []
    try:
        models.append(load_model())
    except ModelError as e:
        print(f"default model unavailable: {e}")
    cfg = load_preset("tinyllama")
    models.append(Model.random(cfg.replace(num_layers=6, name="TinyLlama-1.1B (6 of 22 layers)") if args.quick
                               else cfg, seed=0))
    prompt, steps = 128, 12
    print(f"\n{'model':<40} {'phase':<22} {'floor ms':>12} {'measured ms':>12} {'measured/floor':>15}")
    for m in models:
        pre_meas, itl_meas = measure(m, prompt, steps)
        pre_floor = explain_compute_time(forward_flops(m.config, prompt, prompt), machine.peak("fp32")).value
        itl_floor = engine_itl_floor_ms(m.config, machine.memory_bandwidth_bytes_per_s, prompt + 1 + steps // 2)
        for phase, floor, meas, bound in [
            (f"prefill {prompt} tokens", pre_floor, pre_meas, "compute"),
            ("decode (ITL)", itl_floor, itl_meas, "memory"),
        ]:
            print(f"{m.name:<40} {phase:<22} {floor:>12.1f} {meas:>12.1f} {meas / floor:>15.2f}   ({bound} floor)")


if __name__ == "__main__":
    main()
