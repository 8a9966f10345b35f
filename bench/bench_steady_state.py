"""The steady state of a loaded server (calculators/serving/steady_state.py) against its referee, the discrete-event
simulator, over the whole grid of issue 26: prompt/output 1000/100, 500/500, 100/1000; batch caps 16, 256, 1024;
whole prompts and chunks of 512; loads 10-95% of capacity (72 points). The referee is pooled over the seeded runs
stored by bench/steady_state_referee.py (regenerate it after a change to the simulator or to the capacity, which
sets its rates): 8 to 64 per point, as many as its standard error asks for. Prints TPOT and TTFT p50/p99 of both,
the model's error, the referee's standard error (a bootstrap over the point's seeds) and how many points fall
within 10% (TPOT, TTFT p50) and 20% (TTFT p99), per load.

    python bench/bench_steady_state.py            # a second: the model against the stored referee
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.steady_state_referee import GRID, MODEL, PATH, TOL, key, load_for  # noqa: E402
from calculators.serving.steady_state import operating_point, step_fn_for_model  # noqa: E402

FIELDS = dict(tpot="tpot_ms", ttft_p50="ttft_p50_ms", ttft_p99="ttft_p99_ms")


def compare() -> list[dict]:
    stored = json.loads(PATH.read_text())
    rows = []
    for (I, O), B, chunk, u in GRID:
        runs, ref = stored["points"][key(I, O, B, chunk, u)], stored["referee"][key(I, O, B, chunk, u)]
        load = load_for(I, O, B, chunk)
        op = operating_point(step_fn_for_model(MODEL, load), runs[0]["rate"], load)
        row = dict(I=I, O=O, B=B, chunk=chunk, u=u, n=runs[0]["n"], seeds=len(runs))
        for f, m in FIELDS.items():
            row[f] = (ref[f], float(op[m]), float(op[m]) / ref[f] - 1, ref["se"][f])
        row["good"] = all(abs(row[f][2]) <= TOL[f] for f in TOL)
        # the miss is inside the referee's own uncertainty: within tolerance + 2 standard errors
        row["noise"] = all(abs(row[f][2]) <= TOL[f] + 2 * row[f][3] for f in TOL)
        rows.append(row)
    return rows


def main() -> None:
    rows = compare()
    print("| prompt / output | cap | chunk | load | TPOT sim / model | TTFT p50 sim / model | "
          "TTFT p99 sim (± s.e.) / model | requests × seeds | within |")
    print("|---|---:|---|---:|---|---|---|---:|---|")
    for r in rows:
        t, a, b = r["tpot"], r["ttft_p50"], r["ttft_p99"]
        print(f"| {r['I']} / {r['O']} | {r['B']} | {r['chunk'] or 'whole'} | {r['u']:.0%} | {t[0]:.1f} / {t[1]:.1f} "
              f"({100 * t[2]:+.0f}%) | {a[0]:.1f} / {a[1]:.1f} ({100 * a[2]:+.0f}%) | {b[0]:.0f} (±{100 * b[3]:.0f}%) / "
              f"{b[1]:.0f} ({100 * b[2]:+.0f}%) | {r['n']:,} × {r['seeds']} | "
              f"{'yes' if r['good'] else 'within noise' if r['noise'] else 'no'} |")
    print()
    for u in sorted({r["u"] for r in rows}):
        at = [r for r in rows if r["u"] == u]
        print(f"load {u:.0%}: {sum(r['good'] for r in at)} of {len(at)} within; "
              f"{sum(r['noise'] and not r['good'] for r in at)} more within the referee's noise")
    print(f"all: {sum(r['good'] for r in rows)} of {len(rows)} within the tolerances (TPOT and TTFT p50 10%, "
          f"TTFT p99 20%); TPOT within 10% at {sum(abs(r['tpot'][2]) <= 0.1 for r in rows)}")


if __name__ == "__main__":
    main()
