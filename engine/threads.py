"""How many threads the engine's BLAS (OpenBLAS, under NumPy) uses: as many as the cores other work leaves free.

OpenBLAS starts one thread per core. A product split over two threads waits for the slower of the two, and when
another program holds one of the cores, that wait lasts a scheduler time slice: on the 2-core development machine
one busy-loop process took SmolLM2's decode from 24 tokens/s (one thread) to 1.7-1.9 (two). On a quiet machine
two threads win. So the engine decides, process-wide, and keeps deciding while it runs:

1. Measure what the other work takes: the CPU time all processes spent on this process's cores (/proc/stat)
   minus what the engine itself spent (this process's CPU time, less its other Python threads, which compete
   like any other program), over the last second of engine work (`others_busy`).
2. Choose (`choose_threads`, a pure function): as many threads as cores are free, rounding down (a core that
   other work holds a quarter of the time is not free); more than one only where a timing on this machine showed
   them faster than one thread by at least MIN_GAIN (`calibrate`: the model's own matrices, 1 thread against n,
   alternated; a decode-sized product and a batch-sized one, since the gain differs).
3. Apply it between forward passes (`BlasThreads.tick`, called by `Model.forward`): threadpoolctl's call into
   OpenBLAS, made only when the count changes (about 1.5 µs). After an idle spell the engine starts again at one
   thread and measures a fresh quarter second before it spreads out.

`INFERENCE_LAB_BLAS_THREADS=N` (or OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set before start) fixes the count;
`fix(n)` does the same from code (the benches' --threads), `fix(None)` goes back to automatic. `status()` is what
the engine server's /metrics and the Your machine page show.
"""
from __future__ import annotations

import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

ENV = "INFERENCE_LAB_BLAS_THREADS"          # "auto" (default) or a whole number
LIBRARY_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
RECHECK_S = 1.0           # how often a running engine measures the load again
STALE_S = 3.0             # a measurement older than this (the engine was idle) is thrown away
FIRST_WINDOW_S = 0.25     # the first window after start or idle: one thread meanwhile
SLACK = 0.25              # free cores are rounded down unless others leave at most this much of the last one
MIN_GAIN = 1.1            # more threads only when measured at least this much faster than one
CALIBRATION_TTL_S = 600.0  # a measured gain is measured again after this long (when the machine looks quiet)
CALIBRATION_ROUNDS = 5
DECODE_ROWS = 4           # a pass of up to this many token rows multiplies by matvecs (decode); more: GEMM
KINDS = {"decode": (1, 48 << 20), "batch": (32, 16 << 20)}   # kind: (rows, bytes of weights) its timing uses

REASONS = {                 # reason code -> what it means (the /metrics label and the page's sentence)
    "fixed": "fixed by a setting",
    "one_core": "this process may use one core only",
    "measuring": "measuring the load (one thread meanwhile)",
    "busy": "other work holds the cores",
    "untimed": "more threads not yet timed on this machine",
    "no_gain": "more threads measured no faster",
    "free": "cores free and more threads measured faster",
    "unavailable": "no BLAS thread control (threadpoolctl missing)",
}


# ============================================================================================ the choice
@dataclass(frozen=True)
class Choice:
    threads: int
    reason: str                   # a key of REASONS
    text: str                     # one sentence for people
    calibrate: int | None = None  # time this many threads against one, then choose again


def choose_threads(cores: int, others_busy: float | None, gains: Mapping[int, float] | None = None, *,
                   slack: float = SLACK, min_gain: float = MIN_GAIN) -> Choice:
    """Threads for the next passes, from the cores this process may use, the cores' worth of CPU other work took
    lately (None: not measured) and the measured gains {n threads: speed at n / speed at 1} (quiet machine).

    Free cores = cores - others_busy, rounded down unless the last one is at least (1 - slack) free; with one free
    core, or no gain measured to be worth it, one thread: a split product waits for its slowest thread."""
    cores = max(1, int(cores))
    if cores == 1:
        return Choice(1, "one_core", "this process may use one core only")
    if others_busy is None:
        return Choice(1, "measuring", "the load is being measured (one thread meanwhile)")
    others = min(max(float(others_busy), 0.0), float(cores))
    n = max(1, min(cores, math.floor(cores - others + slack)))
    load = f"other work keeps {others:.1f} of {cores} cores busy"
    if n == 1:
        return Choice(1, "busy", load)
    gains = gains or {}
    if n not in gains:
        return Choice(1, "untimed", f"{load}; {n} threads are not yet timed against one", calibrate=n)
    worth = {k: g for k, g in gains.items() if 2 <= k <= n and g >= min_gain}
    if not worth:
        return Choice(1, "no_gain", f"{load}, but {n} threads measured {gains[n]:.2f}x one thread's speed, under "
                                    f"the {min_gain:.2f}x worth the risk")
    best = max(worth, key=worth.get)
    return Choice(best, "free", f"{load}, and {best} threads measured {worth[best]:.2f}x one thread's speed")


# ============================================================================================ the measurement
@dataclass(frozen=True)
class CpuSample:
    wall: float                          # monotonic seconds
    busy: float | None                   # CPU seconds every process spent on this process's cores (None: unknown)
    process: float                       # this process's CPU seconds, all its threads
    threads: Mapping[int, float] = field(default_factory=dict)   # Python thread ident -> its CPU seconds


def others_busy(prev: CpuSample, cur: CpuSample, engine_threads: Collection[int] = ()) -> float | None:
    """Cores' worth of CPU that work other than the engine used between two samples: all busy time on our cores,
    less this process's, plus back this process's Python threads that ran no forward pass (a page rendering
    competes for the cores like another program). Of several threads that ran forward passes, the busiest is the
    engine and the others count as other work (each would want the same free cores)."""
    dt = cur.wall - prev.wall
    if dt <= 0 or cur.busy is None or prev.busy is None:
        return None

    def used(ident: int) -> float:
        before, now = prev.threads.get(ident, 0.0), cur.threads[ident]
        return now - before if now >= before else now          # an ident reused by a new thread: all of it
    per_thread = {i: used(i) for i in cur.threads}
    engine = [per_thread[i] for i in engine_threads if i in per_thread]
    not_engine = sum(v for i, v in per_thread.items() if i not in engine_threads) + sum(engine) - max(engine,
                                                                                                      default=0.0)
    others = (cur.busy - prev.busy) - (cur.process - prev.process) + not_engine
    return max(0.0, others / dt)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (taskset, cpusets), else all."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def parse_proc_stat(text: str, cpus: Collection[int]) -> float | None:
    """Busy CPU seconds (user, nice, system, irq, softirq, steal; guest is inside user) summed over `cpus`, from
    /proc/stat's per-CPU lines "cpuN user nice system idle iowait irq softirq steal ..." in clock ticks."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    wanted, total, seen = set(cpus), 0, False
    for line in text.splitlines():
        if not line.startswith("cpu"):
            break
        name, *fields = line.split()
        if name == "cpu" or int(name[3:]) not in wanted:
            continue
        v = [int(f) for f in fields] + [0] * 8
        total += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
        seen = True
    return total / tick if seen else None


def _thread_cpu() -> dict[int, float]:
    out = {}
    for t in threading.enumerate():
        try:
            out[t.ident] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (AttributeError, OSError, TypeError, OverflowError):
            pass                                                  # gone meanwhile, or no per-thread clock here
    return out


def sample_cpu(cpus: Collection[int] | None = None) -> CpuSample:
    """Now: /proc/stat's busy time on our CPUs, this process's CPU time, each Python thread's."""
    cpus = usable_cpus() if cpus is None else cpus
    try:
        with open("/proc/stat") as f:
            busy = parse_proc_stat(f.read(), cpus)
    except OSError:
        busy = None
    return CpuSample(time.monotonic(), busy, time.process_time(), _thread_cpu())


def others_from_loadavg(load1: float, own_threads: int) -> float:
    """Where /proc/stat is missing (macOS): the 1-minute load average less the engine's own threads (crude)."""
    return max(0.0, load1 - own_threads)


# ============================================================================================ the timing
def weight_sample(matrices: Iterable[np.ndarray], budget_bytes: int) -> list[np.ndarray]:
    """The first matrices, in order, until they hold `budget_bytes` (more than the last-level cache, so that each
    comes from memory as in a real step)."""
    out, total = [], 0
    for W in matrices:
        out.append(W)
        total += W.nbytes
        if total >= budget_bytes:
            break
    return out


def calibrate(matrices: Sequence[np.ndarray], threads: int, rows: int, set_threads: Callable[[int], None],
              rounds: int = CALIBRATION_ROUNDS, clock: Callable[[], float] = time.perf_counter) -> float:
    """Speed at `threads` over speed at one thread: `rows` rows times each matrix (the engine's own product,
    `ops.matmul_t`), 1 and `threads` alternated `rounds` times after one warm-up each; median times."""
    from engine.model.ops import matmul_t
    xs = {n: np.full((rows, n), 0.5, np.float32) for n in {W.shape[1] for W in matrices}}

    def sweep() -> None:
        for W in matrices:
            matmul_t(xs[W.shape[1]], W)
    times: dict[int, list[float]] = {1: [], threads: []}
    for r in range(rounds + 1):
        for k in ((1, threads) if r % 2 else (threads, 1)):
            set_threads(k)
            t = clock()
            sweep()
            if r:
                times[k].append(clock() - t)
    return statistics.median(times[1]) / max(statistics.median(times[threads]), 1e-12)


# ============================================================================================ the library
class _Library:
    """OpenBLAS's thread count through threadpoolctl (None where it is missing)."""

    def __init__(self) -> None:
        try:
            from threadpoolctl import ThreadpoolController
            libs = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:                                           # not installed, or no BLAS found
            libs = []
        self.libs = libs

    @property
    def available(self) -> bool:
        return bool(self.libs)

    def get(self) -> int | None:
        return self.libs[0].get_num_threads() if self.libs else None

    def set(self, n: int) -> None:
        for lib in self.libs:
            lib.set_num_threads(int(n))


def fixed_from_env(env: Mapping[str, str]) -> tuple[int | None, str]:
    """(threads, where the setting came from) when the environment fixes the count, else (None, "")."""
    v = env.get(ENV, "").strip().lower()
    if v and v != "auto":
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"{ENV} must be 'auto' or a whole number of threads, got {v!r}") from None
        if n < 1:
            raise ValueError(f"{ENV} must be at least 1, got {n}")
        return n, f"{ENV}={n}"
    if v == "auto":
        return None, ""
    for name in LIBRARY_ENV:
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) >= 1:
            return int(raw), f"{name}={raw}"
    return None, ""


# ============================================================================================ the governor
@dataclass(frozen=True)
class ThreadStatus:
    threads: int | None           # what the library uses now (None: unknown)
    mode: str                     # auto | fixed | unavailable
    reason: str                   # a key of REASONS
    text: str
    cores: int
    others_busy: float | None     # cores' worth, last window
    gains: Mapping[str, Mapping[int, float]]   # kind -> {threads: gain}
    measured_s_ago: float | None

    def describe(self) -> str:
        """One line for the Your machine page."""
        n = "?" if self.threads is None else str(self.threads)
        plural = "" if self.threads == 1 else "s"
        ago = "" if self.measured_s_ago is None else f" (measured {self.measured_s_ago:.0f} s ago)"
        if self.mode == "unavailable":
            return f"The engine cannot set its BLAS threads here ({REASONS['unavailable']}); it uses {n}."
        how = "" if self.mode == "fixed" else ", chosen automatically"
        return f"The engine uses {n} BLAS thread{plural} of {self.cores} cores{how}: {self.text}{ago}."


class BlasThreads:
    """The process-wide choice (OpenBLAS's thread count is one per process). `tick` is called at every forward
    pass, from whatever thread runs it; it costs a clock read unless a re-check is due."""

    def __init__(self, *, library=None, sampler: Callable[[], CpuSample] | None = None, cores: int | None = None,
                 clock: Callable[[], float] = time.monotonic, env: Mapping[str, str] | None = None,
                 loadavg: Callable[[], tuple[float, float, float]] | None = getattr(os, "getloadavg", None),
                 calibrator: Callable[..., float] | None = None) -> None:
        self.library = library if library is not None else _Library()
        self._calibrate = calibrator or calibrate
        self.cores = int(cores) if cores is not None else len(usable_cpus())
        self._sampler = sampler or sample_cpu
        self._clock, self._loadavg = clock, loadavg
        self._lock = threading.Lock()
        self._applied: int | None = None
        self._prev: CpuSample | None = None
        self._engine_threads: set[int] = set()
        self._next_check = 0.0
        self._others: float | None = None
        self._measured_at: float | None = None
        self._gains: dict[str, dict[int, tuple[float, float]]] = {k: {} for k in KINDS}   # n -> (gain, when)
        self._choices: dict[str, Choice] = {}
        self._kind = "decode"
        n, source = fixed_from_env(os.environ if env is None else env)
        self._fixed: tuple[int, str] | None = None
        if n is not None:
            self.fix(n, source)

    # ------------------------------------------------------------------------------------ settings
    def fix(self, n: int | None, source: str = "fixed in code") -> None:
        """Use `n` threads from now on (None: choose automatically again)."""
        with self._lock:
            if n is None:
                self._fixed = None
                self._prev, self._choices, self._next_check = None, {}, 0.0
                return
            if int(n) < 1:
                raise ValueError(f"BLAS threads must be at least 1, got {n}")
            self._fixed = (int(n), source)
            self._applied = None                                      # set it even if we think it is set
            self._set(int(n))

    @property
    def mode(self) -> str:
        if not self.library.available:
            return "unavailable"
        return "fixed" if self._fixed is not None else "auto"

    def _set(self, n: int) -> None:
        if n != self._applied and self.library.available:
            self.library.set(n)
        self._applied = n

    # ------------------------------------------------------------------------------------ every forward pass
    def tick(self, rows: int = 1, matrices: Callable[[], Iterable[np.ndarray]] | None = None) -> None:
        """Before a forward pass of `rows` token rows: re-measure if due, and set the threads for its kind.
        `matrices`: the model's weight matrices, for timing more threads against one when that is needed."""
        if self._fixed is not None or not self.library.available:
            return
        kind = "decode" if rows <= DECODE_ROWS else "batch"
        self._engine_threads.add(threading.get_ident())
        choice = self._choices.get(kind)
        if self._clock() >= self._next_check or choice is None or choice.calibrate is not None and matrices:
            if not self._lock.acquire(blocking=False):             # another thread is re-checking: keep going
                return
            try:
                self._recheck(kind, matrices)
                choice = self._choices[kind]
            finally:
                self._lock.release()
        self._kind = kind
        self._set(choice.threads)

    def prepare(self, matrices: Callable[[], Iterable[np.ndarray]] | None = None, window_s: float = FIRST_WINDOW_S,
                sleep: Callable[[float], None] = time.sleep) -> ThreadStatus:
        """Measure now (a `window_s` window) and time the gains that the choice needs, for both kinds: a server
        calls it once at start, so that its first request runs with the right threads and /metrics shows them."""
        if self._fixed is None and self.library.available:
            with self._lock:
                self._prev = self._sampler()
                self._engine_threads = {threading.get_ident()}
            sleep(window_s)
            with self._lock:
                self._measure(self._clock())
                for kind in KINDS:
                    self._decide(kind, matrices)
                self._set(self._choices[self._kind].threads)
        return self.status()

    def _recheck(self, kind: str, matrices) -> None:
        now = self._clock()
        if now >= self._next_check:
            self._measure(now)
        self._decide(kind, matrices)

    def _measure(self, now: float) -> None:
        """Close the window: how busy the other work kept our cores since the last sample. At start or after an
        idle spell (the last sample is stale) open a fresh window instead: one thread meanwhile."""
        cur, prev, engine = self._sampler(), self._prev, self._engine_threads
        self._prev, self._engine_threads, self._choices = cur, {threading.get_ident()}, {}
        if prev is None or cur.wall - prev.wall > STALE_S:
            self._others, self._measured_at = None, None
            self._next_check = now + FIRST_WINDOW_S
            return
        others = others_busy(prev, cur, engine)
        if others is None and self._loadavg is not None:
            try:
                others = others_from_loadavg(self._loadavg()[0], self._applied or 1)
            except OSError:
                others = None
        self._others, self._measured_at = others, now
        self._next_check = now + RECHECK_S

    def _decide(self, kind: str, matrices) -> None:
        """The choice for passes of `kind`, timing more threads against one first when the choice needs it."""
        now = self._clock()
        choice = self._choose(kind, now)
        if choice.calibrate is not None and matrices is not None:
            rows, budget = KINDS[kind]
            sample = weight_sample(matrices(), budget)
            if sample:
                try:
                    gain = self._calibrate(sample, choice.calibrate, rows, self.library.set)
                except Exception:                                      # never let a timing break a forward pass:
                    gain = 0.0                                         # no gain, one thread
                self._applied = None                                   # the timing left its own count set
                self._gains[kind][choice.calibrate] = (gain, self._clock())
                choice = self._choose(kind, now)
        self._choices[kind] = choice

    def _choose(self, kind: str, now: float) -> Choice:
        gains = {n: g for n, (g, when) in self._gains[kind].items() if now - when < CALIBRATION_TTL_S}
        return choose_threads(self.cores, self._others, gains)

    # ------------------------------------------------------------------------------------ what it shows
    def status(self) -> ThreadStatus:
        mode = self.mode
        if mode == "fixed":
            reason, text = "fixed", f"fixed by {self._fixed[1]}"
        elif mode == "unavailable":
            reason, text = "unavailable", REASONS["unavailable"]
        else:
            choice = self._choices.get(self._kind)
            if choice is None:
                reason, text = "measuring", "no forward pass has measured the load yet (one thread until then)"
            else:
                reason, text = choice.reason, choice.text
        gains = {k: {n: g for n, (g, _) in v.items()} for k, v in self._gains.items()}
        ago = None if self._measured_at is None else max(0.0, self._clock() - self._measured_at)
        return ThreadStatus(threads=self.library.get() if self.library.available else None, mode=mode,
                            reason=reason, text=text, cores=self.cores, others_busy=self._others, gains=gains,
                            measured_s_ago=ago)


# ============================================================================================ the process's one
_GOVERNOR: BlasThreads | None = None
_GOVERNOR_LOCK = threading.Lock()


def governor() -> BlasThreads:
    """This process's BlasThreads, made at first use (reads the environment then)."""
    global _GOVERNOR
    if _GOVERNOR is None:
        with _GOVERNOR_LOCK:
            if _GOVERNOR is None:
                _GOVERNOR = BlasThreads()
    return _GOVERNOR


def tick(rows: int = 1, matrices: Callable[[], Iterable[np.ndarray]] | None = None) -> None:
    governor().tick(rows, matrices)


def fix(n: int | None, source: str = "fixed in code") -> None:
    governor().fix(n, source)


def prepare(matrices: Callable[[], Iterable[np.ndarray]] | None = None) -> ThreadStatus:
    return governor().prepare(matrices)


def status() -> ThreadStatus:
    return governor().status()


# ============================================================================================ a lesson's reading
BUSY_CORES = SLACK        # other work holding at least this many cores' worth makes a measurement "on a busy machine"


@dataclass(frozen=True)
class LoadReading:
    """How much other work ran on this process's cores while a measurement ran (`measured_under_load`)."""
    others: float | None          # cores' worth of CPU other programs (and this process's other threads) used
    cores: int
    seconds: float

    @property
    def busy(self) -> bool:
        return self.others is not None and self.others >= BUSY_CORES


def measured_under_load(run: Callable[[], object], sampler: Callable[[], CpuSample] = sample_cpu,
                        matrices: Callable[[], Iterable[np.ndarray]] | None = None) -> tuple:
    """`run()` and the load other work put on our cores meanwhile: (its result, a LoadReading). The calling thread
    is the engine (its BLAS threads are this process's CPU, not other work). `matrices` (a model's
    `weight_matrices`): size the BLAS threads to the load first (`prepare`), so that neither the first window's
    single thread nor a timing of more threads lands inside the measurement."""
    if matrices is not None:
        prepare(matrices)
    prev = sampler()
    result = run()
    cur = sampler()
    return result, LoadReading(others_busy(prev, cur, {threading.get_ident()}), len(usable_cpus()),
                               cur.wall - prev.wall)
