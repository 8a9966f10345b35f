"""Published measurements next to the calculators' predictions (README table): decode tokens/s at batch 1 from
the bandwidth floor (ideal) and with the default decode MBU (realistic), prefill tokens/s from the default MFU.
Data: bench/published_measurements.csv (source and settings per row).

    python bench/bench_published.py            # prints a Markdown table
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.kv_cache import kv_cache_bytes  # noqa: E402
from calculators.latency import Efficiency, bandwidth_floor_ms, prefill_ms, step_weight_bytes  # noqa: E402
from specs.devices import load_device  # noqa: E402
from specs.presets import load_preset  # noqa: E402

DATA = Path(__file__).with_name("published_measurements.csv")


def predict(row: dict) -> tuple[float, float]:
    """(ideal, realistic) tokens/s for one published row."""
    c, dev, eff = load_preset(row["model"]), load_device(row["device"]), Efficiency()
    n = int(row["tokens"])
    if row["phase"] == "decode":
        g = int(row["group_size"]) if row["group_size"] else None
        step = step_weight_bytes(c, row["weights"], 1, g) + kv_cache_bytes(c, n // 2, 1, "fp16")   # mean context
        floor = bandwidth_floor_ms(step, dev.memory_bandwidth_bytes_per_s)
        return 1e3 / floor, 1e3 / (floor / eff.decode_mbu)
    ideal = prefill_ms(c, dev, n, 1, row["weights"])["prefill_ms"]
    real = prefill_ms(c, dev, n, 1, row["weights"], efficiency=eff)["prefill_ms"]
    return n / ideal * 1e3, n / real * 1e3


def main() -> None:
    rows = list(csv.DictReader(DATA.open()))
    print("| device | model, settings | phase | measured tok/s | predicted ideal | predicted realistic | error |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        ideal, real = predict(r)
        meas = float(r["measured_tok_s"])
        print(f"| {load_device(r['device']).name} | {r['settings']} | {r['phase']} | {meas:,.1f} | {ideal:,.1f} | "
              f"{real:,.1f} | {100 * (real - meas) / meas:+.0f}% |")
    print(f"\nSource: {rows[0]['source']}. Realistic = default Efficiency {Efficiency()}.")


if __name__ == "__main__":
    main()
