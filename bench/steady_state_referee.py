"""The simulator's own answer at every point of issue 26's grid, with its spread: several seeded runs per point,
each long enough for the queue to relax many times over, written to bench/steady_state_referee.json. The bench
(bench/bench_steady_state.py) compares the steady state with the mean over seeds; the test
(tests/calculators/test_steady_state.py) reads this file and re-simulates a seeded random subset of it live, so
the stored answers are checked against the simulator on every run.

    python bench/steady_state_referee.py            # writes bench/steady_state_referee.json (~30 min on 2 cores)
    python bench/steady_state_referee.py --extend   # keeps the stored seeds, adds those the rule below asks for
    python bench/steady_state_referee.py --check 3  # re-simulates 3 random (point, seed) pairs and compares

Per point and seed: TPOT (mean over requests), TTFT p50 and p99, the slot wait's P(wait > 0), p50 and p99, over the
requests after the first fifth (the warm-up from an empty replica). P(wait) counts any wait before admission,
the rest of the step in progress included (a request is admitted between steps).

How many seeds: a rule on the referee's own spread, never on the model it referees. Every point gets seeds 0-3;
while the standard error of the mean over its seeds (sample sd / √seeds, relative to the mean) of a compared
quantity is above a quarter of the tolerance that quantity is judged by (TPOT and TTFT p50: 2.5% of 10%, TTFT p99:
5% of 20%), the point gets the next seed (4, 5, ...), up to 64 in all. A quarter keeps the referee's noise small
beside the tolerance: two of its standard errors are half of it, so a verdict is seldom the luck of the seeds. 64
seeds are 16 times the first 4, so the standard error at the cap is a quarter of theirs; a run costs at most ~3 s
(150,000 requests), so the cap bounds a point at ~3 minutes. Where one run's TTFT p99 spreads by 40-110% (P(wait)
near 1% at 50% of a cap of 16, the slot wait at 95% of a cap of 256, the prefill budget at 95% of a cap of 1024
with chunks) the cap is reached above the target (4 of the 72 points, 5-14%): the bench prints every point's
standard error and its seeds. Seed k is always the same stream, so the rule gives the same file from scratch as by
extending a stored one.
"""
from __future__ import annotations

import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.serving.batching import step_model_for  # noqa: E402
from calculators.serving.lengths import Lengths  # noqa: E402
from calculators.serving.serving_sim import simulate_continuous  # noqa: E402
from calculators.serving.steady_state import Load, capacity, step_fn_for_model  # noqa: E402
from calculators.serving.workload import Workload  # noqa: E402
from calculators.sizing.latency import Efficiency  # noqa: E402
from specs.devices import load_device  # noqa: E402
from specs.presets import load_preset  # noqa: E402

MODEL = step_model_for(load_preset("llama-3-8b"), load_device("h100"), "bf16", efficiency=Efficiency(),
                       overhead_ms=2.0)
RATIOS = ((1000, 100), (500, 500), (100, 1000))
CAPS = (16, 256, 1024)
CHUNKS = (None, 512)
LOADS = (0.1, 0.5, 0.8, 0.95)
GRID = list(itertools.product(RATIOS, CAPS, CHUNKS, LOADS))
SEEDS, MAX_SEEDS = 4, 64                       # the first seeds of every point, and the cap (docstring)
TOL = dict(tpot=0.10, ttft_p50=0.10, ttft_p99=0.20)   # the tolerances the referee judges by (TPOT, TTFT p50 and p99)
TARGET = {f: t / 4 for f, t in TOL.items()}           # its standard error at most a quarter of each
PATH = Path(__file__).with_name("steady_state_referee.json")


def key(I, O, B, chunk, u) -> str:
    return f"{I}/{O} B{B} {chunk or 'whole'} {u:.2f}"


def load_for(I, O, B, chunk) -> Load:
    return Load(Lengths.fixed(I), Lengths("geometric", float(O), maximum=8192 - I), chunk=chunk or math.inf,
                slots=B)


def rate_for(I, O, B, chunk, u) -> float:
    """u × the steady state's capacity (the rate at which its fixed point stops existing: the step, the slots or
    the chunk budget run out). Capacity is a deterministic bisection, not a latency, so the referee's rate and the
    model's agree by construction; what is compared is the latency at that rate."""
    load = load_for(I, O, B, chunk)
    return u * float(capacity(step_fn_for_model(MODEL, load), load))


def requests_for(I, O, B, chunk, u, lam, tpot_ms) -> int:
    """Enough requests for ~200 relaxation times of the queue after the warm-up: a request stays R = O·TPOT; the
    queue forgets its state in about R/(1 − u) (one server) or R/(B(1 − √u)²) (B servers, heavy traffic)."""
    R = O * tpot_ms / 1e3
    relax = max(R / (1 - u), R / (B * (1 - math.sqrt(u)) ** 2))
    return int(min(150_000, max(20_000, 200 * lam * relax)))


def simulate_point(I, O, B, chunk, u, seed: int, n: int | None = None) -> dict:
    lam = rate_for(I, O, B, chunk, u)
    load = load_for(I, O, B, chunk)
    stream = [seed, I, O, B, chunk or 0, int(round(u * 100))]
    if n is None:                                 # a short pilot (its own stream) sizes the run
        pilot = _run(load, lam, B, chunk, 4000, np.random.default_rng(stream + [1]))
        n = requests_for(I, O, B, chunk, u, lam, pilot["tpot"])
    return _run(load, lam, B, chunk, n, np.random.default_rng(stream))


def _run(load, lam, B, chunk, n, rng) -> dict:
    w = Workload(np.cumsum(rng.exponential(1 / lam, n)), load.prompt.sample(n, rng), load.output.sample(n, rng))
    r = simulate_continuous(MODEL, w, B, chunk_tokens=chunk)
    keep = slice(n // 5, None)
    tpot = r.tpot[keep][np.isfinite(r.tpot[keep])] * 1e3
    ttft, wait = r.ttft[keep] * 1e3, r.wait[keep] * 1e3
    return dict(n=n, rate=lam, tpot=float(tpot.mean()), ttft_p50=float(np.percentile(ttft, 50)),
                ttft_p99=float(np.percentile(ttft, 99)), p_wait=float(np.mean(wait > 1e-9)),
                wait_p50=float(np.percentile(wait, 50)), wait_p99=float(np.percentile(wait, 99)))


def standard_error(runs: list[dict], field: str) -> float:
    """The mean over seeds' standard error relative to it: sample sd / √seeds / mean."""
    x = np.array([r[field] for r in runs])
    return float(x.std(ddof=1) / math.sqrt(len(x)) / x.mean())


def precise(runs: list[dict]) -> bool:
    return len(runs) >= MAX_SEEDS or all(standard_error(runs, f) <= TARGET[f] for f in TARGET)


def seeds_for(I, O, B, chunk, u, runs: list[dict]) -> list[dict]:
    """`runs` (seeds 0, 1, ... in order) with seeds 0-3 and then the next seeds the rule asks for."""
    runs = list(runs)
    while len(runs) < SEEDS or not precise(runs):
        runs.append(simulate_point(I, O, B, chunk, u, len(runs)))
    return runs


def _write(points: dict) -> None:
    rule = dict(first=SEEDS, most=MAX_SEEDS, standard_error_at_most=TARGET)
    tmp = PATH.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(seeds=rule, model="llama-3-8b h100 bf16 overhead 2 ms", points=points),
                              indent=1) + "\n")
    tmp.replace(PATH)


def main() -> None:
    if "--check" in sys.argv:
        k = int(sys.argv[sys.argv.index("--check") + 1])
        stored = json.loads(PATH.read_text())["points"]
        rng = np.random.default_rng(int(time.time()))
        for i in rng.choice(len(GRID), k, replace=False):
            (I, O), B, chunk, u = GRID[i]
            seed = int(rng.integers(len(stored[key(I, O, B, chunk, u)])))
            s = stored[key(I, O, B, chunk, u)][seed]
            live = simulate_point(I, O, B, chunk, u, seed, s["n"])
            print(key(I, O, B, chunk, u), f"seed {seed}", "same" if live == s else f"DIFFERENT {s} {live}")
        return
    extend = "--extend" in sys.argv
    out = json.loads(PATH.read_text())["points"] if extend else {}
    t0, added = time.perf_counter(), 0
    for (I, O), B, chunk, u in GRID:
        k = key(I, O, B, chunk, u)
        before = out.get(k, [])
        out[k] = runs = seeds_for(I, O, B, chunk, u, before)
        added += len(runs) - len(before)
        print(f"{k:28s} n={runs[0]['n']:>7,} seeds {len(before):>2} -> {len(runs):>2}  TTFT p50 "
              f"{np.mean([r['ttft_p50'] for r in runs]):8.1f} ± {standard_error(runs, 'ttft_p50'):.1%}  p99 "
              f"{np.mean([r['ttft_p99'] for r in runs]):9.1f} ± {standard_error(runs, 'ttft_p99'):.1%} (s.e.)  "
              f"{added} runs added  {time.perf_counter() - t0:.0f} s", flush=True)
        if len(runs) > len(before):
            _write(out)                       # as it goes: an interrupted run is resumed by --extend
    _write(out)


if __name__ == "__main__":
    main()
