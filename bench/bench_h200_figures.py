"""The planner's measured kernels (aiconfigurator-core's H200 vLLM profile) beside figures measured on one H200
(issue 36's text; bench/h200_issue36_figures.csv, `calculators.planning.chip_figures`). Needs the optional extra:
pip install -r requirements-profiles.txt

    python bench/bench_h200_figures.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.planning.chip_figures import compare, load_figures  # noqa: E402
from specs.devices import load_device  # noqa: E402
from specs.profiles import profile_for  # noqa: E402


def main() -> int:
    device = load_device("h200")
    profile = profile_for(device.name, "vllm")
    if profile is None:
        print("no H200 vLLM profile installed: pip install -r requirements-profiles.txt")
        return 0
    print(f"priced from {profile.name}; chip figures: issue 36 (one H200, PyTorch + cuBLAS + cuDNN, CUDA graphs)\n")
    print("| kind | work | chip | predicted | ratio | band | in band | whole vLLM step |")
    print("|---|---|---:|---:|---:|---|---|---:|")
    for r in load_figures():
        x = compare(r, profile, device)
        chip = r["chip_low"] if r["chip_low"] == r["chip_high"] else f"{r['chip_low']}-{r['chip_high']}"
        band = f"{r['band_low']}-{r['band_high']}x" if r["band_low"] and r["band_low"] != r["band_high"] else \
            ("inside the spread" if r["kind"] == "step" else "chip range ± 0.05")
        whole = f"{x['whole_step_ms']:.2f} ms" if x["whole_step_ms"] is not None else ""
        print(f"| {r['kind']} | {r['note']} | {chip} {r['unit']} | {x['predicted']:.3g} | {x['ratio']:.2f} | {band} "
              f"| {'yes' if x['ok'] else 'NO'} | {whole} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
