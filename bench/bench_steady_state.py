"""The steady state of a loaded server (calculators/serving/steady_state.py) against its referee, the discrete-event
simulator, over the whole grid of issue 26: prompt/output 1000/100, 500/500, 100/1000; batch caps 16, 256, 1024;
whole prompts and chunks of 512; loads 10-95% of capacity. Each point is simulated past the queue's relaxation
time (up to 60,000 requests). Prints TPOT and TTFT p50/p99, the model's error against the simulator, and how many
points fall within 10% (TPOT, TTFT p50) and 20% (TTFT p99).

    python bench/bench_steady_state.py            # the full grid, a few minutes
    python bench/bench_steady_state.py --quick    # loads 0.1 and 0.5 only
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "calculators"))

from test_steady_state import _sim_vs_model  # noqa: E402  (the test's own referee run, one definition)

RATIOS = ((1000, 100), (500, 500), (100, 1000))
CAPS = (16, 256, 1024)
CHUNKS = (None, 512)


def main() -> None:
    loads = (0.1, 0.5) if "--quick" in sys.argv else (0.1, 0.5, 0.8, 0.95)
    print("| prompt / output | cap | chunk | load | TPOT sim / model | TTFT p50 sim / model | TTFT p99 sim / model | "
          "requests | within |")
    print("|---|---:|---|---:|---|---|---|---:|---|")
    ok = total = 0
    t0 = time.perf_counter()
    for (I, O), B, chunk, u in itertools.product(RATIOS, CAPS, CHUNKS, loads):
        op, r, sim = _sim_vs_model(I, O, B, chunk, u)
        e = {k: float(op[m]) / sim[k] - 1 for k, m in (("tpot", "tpot_ms"), ("ttft_p50", "ttft_p50_ms"),
                                                       ("ttft_p99", "ttft_p99_ms"))}
        good = abs(e["tpot"]) <= 0.10 and abs(e["ttft_p50"]) <= 0.10 and abs(e["ttft_p99"]) <= 0.20
        ok, total = ok + good, total + 1
        print(f"| {I} / {O} | {B} | {chunk or 'whole'} | {u:.0%} | {sim['tpot']:.1f} / {float(op['tpot_ms']):.1f} "
              f"({100 * e['tpot']:+.0f}%) | {sim['ttft_p50']:.1f} / {float(op['ttft_p50_ms']):.1f} "
              f"({100 * e['ttft_p50']:+.0f}%) | {sim['ttft_p99']:.0f} / {float(op['ttft_p99_ms']):.0f} "
              f"({100 * e['ttft_p99']:+.0f}%) | {len(r.arrival):,} | {'yes' if good else 'no'} |", flush=True)
    print(f"\n{ok} of {total} points within the tolerances (TPOT and TTFT p50 10%, TTFT p99 20%), "
          f"{time.perf_counter() - t0:.0f} s.")


if __name__ == "__main__":
    main()
