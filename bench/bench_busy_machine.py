"""Decode on a quiet machine and with one core kept busy by another process: one BLAS thread, one per core, and
`engine.threads`' automatic choice, measured in one run (issue 29, "the engine collapses on a busy machine").

    python bench/bench_busy_machine.py                     # SmolLM2 (the default model), 32 decode steps, 4 rounds
    python bench/bench_busy_machine.py --steps 16 --rounds 2 --json out.json

Each condition (quiet, then busy: a busy-loop child process this bench starts and always stops) runs the settings
(one thread, one thread again as the noise yardstick, one thread per core, automatic) in rounds, the order rotated
and reversed every other round. Each run prefills a short prompt, decodes for WARM_S (so that the automatic choice
has measured the load, as in a server that has been running), then times `--steps` decode steps (or those done in
`--max-run-s`). Ratios are taken within a round (same minute, same load), median over rounds.
Targets: busy auto / busy one thread >= 0.9 (never slower than one thread); quiet auto / best fixed >= 1.0 within
noise (keeps the multi-thread gain). On a shared machine "quiet" is only as quiet as the other work lets it be:
the bench prints the load it measured before each condition (cores' worth of CPU other processes took).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import load_model  # noqa: E402
from engine import threads as blas_threads  # noqa: E402

WARM_S = 1.5                 # warm-up decode before timing: more than a re-check window (engine.threads.RECHECK_S)
PROMPT = "Write a story about a robot who learns to paint."
# the busy loop ends by itself when this bench is gone (its parent changes), even if the bench is killed
BUSY_LOOP = ("import os\nparent = os.getppid()\nn = 0\nwhile True:\n    n += 1\n"
             "    if n % 200000 == 0 and os.getppid() != parent:\n        break\n")


class BusyCore:
    """A child process spinning on one core while the `with` block runs; always stopped (also at exit)."""

    def __enter__(self) -> "BusyCore":
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        atexit.register(self.stop)
        time.sleep(0.5)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __exit__(self, *exc) -> None:
        self.stop()


def other_load(seconds: float = 1.0) -> float:
    """Cores' worth of CPU that processes other than this one took over `seconds` (this one sleeps)."""
    before = blas_threads.sample_cpu()
    time.sleep(seconds)
    return blas_threads.others_busy(before, blas_threads.sample_cpu(), ()) or 0.0


def decode_rate(model, prompt: list[int], steps: int, max_s: float) -> float:
    """Prefill, warm-up decode for WARM_S, then tokens/s over `steps` timed decode steps (batch 1), or over those
    done in `max_s` seconds (a setting 13x slower than another needs no more to show it)."""
    cache = model.new_cache(1, min(model.config.max_position_embeddings, len(prompt) + steps + 256))
    model.prefill(prompt, cache)
    t0, warm = time.perf_counter(), 0
    while time.perf_counter() - t0 < WARM_S and warm < 200:
        model.decode_step(5, cache)
        warm += 1
    t = time.perf_counter()
    done = 0
    while done < steps and (done == 0 or time.perf_counter() - t < max_s):
        model.decode_step(5, cache)
        done += 1
    return done / (time.perf_counter() - t)


def use(setting: str) -> None:
    blas_threads.fix(None if setting == "auto" else int(setting.split()[0]), "bench_busy_machine")


def condition(model, prompt, settings: list[str], steps: int, rounds: int, max_s: float) -> dict:
    rates: dict[str, list[float]] = {s: [] for s in settings}
    chosen = []
    for r in range(rounds):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        if r % 2:                          # reversed every other round: each setting follows different ones
            order.reverse()
        for s in order:
            use(s)
            rates[s].append(decode_rate(model, prompt, steps, max_s))
            if s == "auto":
                st = blas_threads.status()
                chosen.append(f"{st.threads} ({st.reason}, others {st.others_busy or 0:.2f})")
        print("    round %d: " % (r + 1) + ", ".join(f"{s} {rates[s][-1]:5.1f}" for s in settings) + " tokens/s",
              flush=True)
    return dict(rates=rates, auto_chose=chosen)


def ratio(a: list[float], b: list[float]) -> dict:
    rs = [x / y for x, y in zip(a, b)]
    return dict(median=statistics.median(rs), low=min(rs), high=max(rs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per run")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-run-s", type=float, default=10.0, help="a run stops timing after this many seconds")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    if args.steps < 1 or args.rounds < 1 or not args.max_run_s > 0:
        ap.error("--steps and --rounds must be at least 1, --max-run-s above 0")
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))    # run the finally blocks: the busy child stops
    cores = len(blas_threads.usable_cpus())
    if cores < 2:
        print(f"this process may use {cores} core: nothing to compare (one thread is the only choice)")
        return
    settings = ["1", "1 again", str(cores), "auto"]     # "1 again": the noise between two identical runs
    model = load_model()
    prompt = model.tokenizer.encode(PROMPT)
    print(f"{model.name}; {cores} cores; {args.steps} timed decode steps (at most {args.max_run_s:.0f} s) after "
          f"{WARM_S:.1f} s of warm-up, {args.rounds} rounds; settings: fixed 1 (twice), fixed {cores}, auto (engine.threads)")
    out: dict = dict(model=model.name, cores=cores, steps=args.steps, rounds=args.rounds)
    for name in ("quiet", "busy"):
        busy = BusyCore() if name == "busy" else None
        try:
            if busy:
                busy.__enter__()
            load = other_load()
            print(f"\n[{name}] other processes took {load:.2f} cores' worth of CPU in the second before "
                  f"(load average {os.getloadavg()[0]:.1f})" + ("; a busy loop spins on one core" if busy else ""),
                  flush=True)
            res = condition(model, prompt, settings, args.steps, args.rounds, args.max_run_s)
        finally:
            if busy:
                busy.stop()
        res["other_load_cores"], res["load_average"] = load, os.getloadavg()[0]
        med = {s: statistics.median(v) for s, v in res["rates"].items()}
        res["median_tokens_per_s"] = med
        print("    median: " + ", ".join(f"{s} {v:5.1f}" for s, v in med.items()) + " tokens/s; auto chose "
              + "; ".join(res["auto_chose"]))
        out[name] = res
    gains = blas_threads.status().gains
    out["gains"] = {k: {str(n): g for n, g in v.items()} for k, v in gains.items()}
    blas_threads.fix(None)
    print("\nauto's timings, n threads over one (model's own matrices, when the machine looked quiet): "
          + ("; ".join(f"{k} {n} threads {g:.2f}x" for k, v in gains.items() for n, g in v.items()) or "none"))
    q, b = out["quiet"]["rates"], out["busy"]["rates"]
    best = [max(x, y) for x, y in zip(q["1"], q[str(cores)])]
    out["busy_auto_over_one"] = ratio(b["auto"], b["1"])
    out["busy_one_again_over_one"] = ratio(b["1 again"], b["1"])
    out["quiet_one_again_over_one"] = ratio(q["1 again"], q["1"])
    out["busy_many_over_one"] = ratio(b[str(cores)], b["1"])
    out["quiet_auto_over_best_fixed"] = ratio(q["auto"], best)
    out["quiet_many_over_one"] = ratio(q[str(cores)], q["1"])
    print("\nratios (median of the rounds, range):")
    for key, label, target in (
            ("busy_auto_over_one", "busy:  auto / 1 thread", 0.9),
            ("busy_one_again_over_one", "busy:  1 thread again / 1 thread (noise)", None),
            ("busy_many_over_one", f"busy:  {cores} threads / 1 thread", None),
            ("quiet_auto_over_best_fixed", "quiet: auto / best fixed", 1.0),
            ("quiet_one_again_over_one", "quiet: 1 thread again / 1 thread (noise)", None),
            ("quiet_many_over_one", f"quiet: {cores} threads / 1 thread", None)):
        r = out[key]
        verdict = "" if target is None else f"   (target >= {target}: {'PASS' if r['median'] >= target else 'FAIL'})"
        print(f"  {label:42s} {r['median']:5.2f} ({r['low']:.2f}-{r['high']:.2f}){verdict}")
    if out["quiet"]["other_load_cores"] > 0.25:
        print(f"  note: 'quiet' was not quiet: other processes took {out['quiet']['other_load_cores']:.2f} cores "
              "before it; the quiet ratio then measures a busy machine too")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
