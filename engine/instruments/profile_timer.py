"""Timing one operation within a time budget, and sharing an overall budget between many.

`median_seconds` warms the operation up (first calls allocate, start threads, compile, fill caches), then times
samples until it has `min_samples` of them and its own budget is spent (or `max_samples`), and returns the median:
a busy machine adds outliers on one side only. An operation much faster than the clock's useful resolution is run
`calls` times per sample, so each sample lasts about `sample_s`. `sync` waits for a device to finish (a GPU's
queue; nothing for NumPy); the clock is injectable, so the budget logic is tested without timing anything.

`Budget` is the overall deadline: tables get shares of what is left, and an operation whose warm-up and three
samples are predicted (by the roofline, from the measured peaks) to overrun what its table has left is not started.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

Clock = Callable[[], float]


@dataclass(frozen=True)
class Timing:
    seconds: float          # median of the samples, per call
    samples: int
    calls: int              # calls per sample


def median_seconds(fn: Callable[[], object], budget_s: float, *, clock: Clock = time.perf_counter,
                   sync: Callable[[], None] = lambda: None, warmup: int = 1, min_samples: int = 3,
                   max_samples: int = 50, sample_s: float = 1e-3) -> Timing:
    """Median seconds per call of `fn`: `warmup` calls, then samples of `calls` calls each until `budget_s` (from
    the start, warm-up included) is spent and at least `min_samples` are taken, or `max_samples` are."""
    t_end = clock() + budget_s
    t0 = clock()
    for _ in range(warmup):
        fn()
    sync()
    first = (clock() - t0) / max(warmup, 1)                     # per call, as warm-up saw it
    calls = 1 if first >= sample_s else min(1000, max(1, math.ceil(sample_s / max(first, 1e-9))))
    samples: list[float] = []
    while len(samples) < max_samples:
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        t1 = clock()
        samples.append((t1 - t0) / calls)
        if len(samples) >= min_samples and t1 >= t_end:
            break
    return Timing(statistics.median(samples), len(samples), calls)


@dataclass
class Budget:
    """The whole run's time: `total_s` from the first `clock()` reading; `share(weight)` is what a table of
    that weight may spend of what is left, given the weights of the tables still to come."""
    total_s: float
    clock: Clock = time.perf_counter
    start: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return max(0.0, self.total_s - self.elapsed())

    def share(self, weight: float, weights_to_come: float) -> float:
        """Seconds for a table of `weight` now, when tables of `weights_to_come` (its own included) remain."""
        return self.left() * weight / max(weights_to_come, 1e-12)


def shape_budget(table_left_s: float, shapes_left: int, cap_s: float) -> float:
    """One shape's timing budget: an even split of what its table has left, at most cap_s."""
    return min(cap_s, table_left_s / max(shapes_left, 1))


def fits(predicted_s: float, table_left_s: float, min_calls: int = 4) -> bool:
    """Whether a shape whose one call is predicted to take predicted_s can be measured (warm-up plus three
    samples) in what its table has left."""
    return predicted_s * min_calls <= table_left_s


def copies_for(bytes_each: float, cold_bytes: float, most: int = 64) -> int:
    """How many copies of an operation's operands make a working set of at least cold_bytes, so that cycling
    through them each call finds its operands in memory, not cache, as each layer of a real step does."""
    return max(1, min(most, math.ceil(cold_bytes / max(bytes_each, 1.0))))


def cycling(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One callable that runs the next of `calls` each time (round robin)."""
    state = {"i": 0}

    def run() -> object:
        i = state["i"]
        state["i"] = (i + 1) % len(calls)
        return calls[i]()
    return run
