"""engine.threads: the BLAS thread count sized to the cores other work leaves free.

The chooser's table follows the rule as the module states it in words (free cores = cores - other work, rounded
down unless the last core is at least 3/4 free; more than one thread only when timed at least 1.1x faster), with
each expected count worked out by hand. The load arithmetic is checked on samples whose busy times are written out
by hand, /proc/stat parsing on a fixed text; the governor with a fake library, clock, sampler and timing; and,
against the real machine, that the engine's own busy thread is not counted as other work and that the count
reaches OpenBLAS (threadpoolctl reads it back)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from engine import threads as T
from engine.threads import BlasThreads, CpuSample, choose_threads, fixed_from_env, others_busy, parse_proc_stat


# ============================================================================================ the chooser
@pytest.mark.parametrize("cores, others, gains, threads, reason, calibrate", [
    (1, 0.0, {2: 3.0}, 1, "one_core", None),           # one core: nothing to split over
    (2, None, {2: 1.5}, 1, "measuring", None),         # not measured yet: the safe count
    (2, 0.0, {2: 1.5}, 2, "free", None),               # quiet and faster
    (2, 0.2, {2: 1.5}, 2, "free", None),               # 1.8 free: the last core 80% free counts
    (2, 0.3, {2: 1.5}, 1, "busy", None),               # 1.7 free: the last core is only 70% free
    (2, 1.0, {2: 1.5}, 1, "busy", None),               # the case: one busy process on one of two cores
    (2, 5.0, {2: 1.5}, 1, "busy", None),               # more than the cores (clamped)
    (2, -0.4, {2: 1.5}, 2, "free", None),              # a negative reading (clock jitter) is no load
    (2, 0.0, {}, 1, "untimed", 2),                     # quiet but never timed: time 2 threads first
    (2, 0.0, {2: 1.05}, 1, "no_gain", None),           # timed, but not worth the risk
    (2, 0.0, {2: 1.10}, 2, "free", None),              # exactly the threshold
    (2, 0.0, {2: 0.7}, 1, "no_gain", None),            # slower with two (threads fighting over memory)
    (8, 2.5, {5: 1.8, 4: 2.0}, 4, "free", None),       # 5.5 free -> up to 5; 4 measured faster than 5
    (8, 2.5, {4: 2.0}, 1, "untimed", 5),               # 5 would be used and was never timed
    (8, 2.2, {6: 1.9, 5: 1.7}, 6, "free", None),       # 5.8 free: the 6th core is 80% free, so up to 6
])
def test_choose_threads_follows_the_stated_rule(cores, others, gains, threads, reason, calibrate):
    c = choose_threads(cores, others, gains)
    assert (c.threads, c.reason, c.calibrate) == (threads, reason, calibrate)
    assert c.reason in T.REASONS and c.text


def test_the_reason_names_the_load_measured():
    assert "1.0 of 2 cores" in choose_threads(2, 1.0, {}).text


# ============================================================================================ the measurement
def sample(wall, busy, process, **threads):
    return CpuSample(wall, busy, process, {int(k[1:]): v for k, v in threads.items()})


def test_others_busy_is_all_busy_time_less_the_engines():
    # 2 s; all processes 3.0 CPU-s on our cores; this process 1.6 CPU-s: the engine thread (t1) 1.0, a page
    # rendering (t2) 0.4, and 0.2 in threads Python does not know (OpenBLAS's helper): others = 3.0 - 1.6 + 0.4
    prev = sample(10.0, 100.0, 5.0, t1=2.0, t2=1.0)
    cur = sample(12.0, 103.0, 6.6, t1=3.0, t2=1.4)
    assert others_busy(prev, cur, {1}) == pytest.approx((3.0 - 1.6 + 0.4) / 2)


def test_of_two_threads_running_forward_passes_the_busiest_is_the_engine():
    prev = sample(0.0, 0.0, 0.0, t1=0.0, t2=0.0)
    cur = sample(1.0, 1.8, 1.2, t1=0.7, t2=0.5)         # both ran forward passes; 0.5 would want the cores too
    assert others_busy(prev, cur, {1, 2}) == pytest.approx(1.8 - 1.2 + 0.5)


def test_a_thread_born_in_the_window_or_a_reused_ident_counts_from_zero():
    prev = sample(0.0, 0.0, 0.0, t1=0.0, t2=5.0)          # t2 ended; a new thread got its ident
    cur = sample(1.0, 1.0, 0.9, t1=0.5, t2=0.3, t3=0.1)   # t3 born in the window
    assert others_busy(prev, cur, {1}) == pytest.approx(1.0 - 0.9 + 0.3 + 0.1)


def test_others_busy_is_unknown_without_proc_stat_or_time():
    assert others_busy(sample(0.0, None, 0.0), sample(1.0, None, 0.5), ()) is None
    assert others_busy(sample(1.0, 5.0, 0.0), sample(1.0, 6.0, 0.5), ()) is None


PROC_STAT = """cpu  60 6 30 900 50 3 3 9 0 0
cpu0 10 1 5 400 20 1 1 2 0 0
cpu1 50 5 25 500 30 2 2 7 0 0
intr 12345 0 0
ctxt 999
"""


def test_parse_proc_stat_sums_busy_fields_of_our_cpus_only():
    hz = os.sysconf("SC_CLK_TCK")
    # busy = user + nice + system + irq + softirq + steal (idle and iowait are not busy)
    assert parse_proc_stat(PROC_STAT, {1}) == pytest.approx((50 + 5 + 25 + 2 + 2 + 7) / hz)
    assert parse_proc_stat(PROC_STAT, {0, 1}) == pytest.approx((10 + 1 + 5 + 1 + 1 + 2 + 91) / hz)
    assert parse_proc_stat(PROC_STAT, {7}) is None                       # none of ours listed


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat")
def test_the_engines_own_busy_thread_is_not_other_work():
    """This thread spins for 1 s as the engine: the other work measured plus this thread's share cannot exceed the
    cores (it would, by up to a core, if the engine's own time were counted as other work)."""
    cpus = T.usable_cpus()
    before = T.sample_cpu(cpus)
    me = threading.get_ident()
    t0 = time.monotonic()
    x = np.float64(0.0)
    while time.monotonic() - t0 < 1.0:
        x += 1.0
    after = T.sample_cpu(cpus)
    others = others_busy(before, after, {me})
    mine = (after.threads[me] - before.threads[me]) / (after.wall - before.wall)
    assert mine > 0.05                                   # it did run
    assert others + mine <= len(cpus) + 0.15


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat")
def test_a_busy_process_is_other_work():
    cpus = T.usable_cpus()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.monotonic()\n"
                             "while time.monotonic() - t < 10: pass"])
    try:
        time.sleep(0.2)
        before = T.sample_cpu(cpus)
        time.sleep(1.0)
        after = T.sample_cpu(cpus)
    finally:
        busy.kill()
        busy.wait(10)
    assert others_busy(before, after, {threading.get_ident()}) >= 0.5     # it alone takes up to a core


# ============================================================================================ the environment
@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({T.ENV: "auto", "OPENBLAS_NUM_THREADS": "1"}, None),        # ours says auto: the library's variable loses
    ({"OPENBLAS_NUM_THREADS": "2"}, 2),
    ({"OMP_NUM_THREADS": "3"}, 3),
    ({T.ENV: "4", "OPENBLAS_NUM_THREADS": "1"}, 4),
    ({"OPENBLAS_NUM_THREADS": ""}, None),
])
def test_the_environment_can_fix_the_count(env, expected):
    assert fixed_from_env(env)[0] == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_setting_is_a_clear_error(value):
    with pytest.raises(ValueError, match=T.ENV):
        fixed_from_env({T.ENV: value})


# ============================================================================================ the governor
class FakeLibrary:
    available = True

    def __init__(self):
        self.count, self.calls = 2, []

    def get(self):
        return self.count

    def set(self, n):
        self.count = n
        self.calls.append(n)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Machine:
    """A sampler whose other work is whatever `others` says, in cores, since the last sample."""

    def __init__(self, clock):
        self.clock, self.others, self.busy = clock, 0.0, 0.0
        self.last = clock()

    def __call__(self):
        self.busy += self.others * (self.clock() - self.last)
        self.last = self.clock()
        return CpuSample(self.clock(), self.busy, 0.0, {})


def governor(gain=1.5, cores=2):
    clock, lib = Clock(), FakeLibrary()
    machine, timed = Machine(clock), []

    def calibrator(matrices, threads, rows, set_threads):
        timed.append((threads, rows))
        set_threads(threads)                 # as the real timing does: it leaves its own count set
        return gain(rows) if callable(gain) else gain
    g = BlasThreads(library=lib, sampler=machine, cores=cores, clock=clock, env={}, loadavg=None,
                    calibrator=calibrator)
    return g, clock, lib, machine, timed


MATS = lambda: [np.zeros((8, 4), np.float32)]      # noqa: E731


def run(g, clock, seconds, rows=1, step=0.05):
    end = clock.t + seconds
    while clock.t < end:
        g.tick(rows, MATS)
        clock.t += step


def test_one_thread_first_then_two_on_a_quiet_machine_once_timed_faster():
    g, clock, lib, machine, timed = governor(gain=1.5)
    g.tick(1, MATS)
    assert lib.count == 1 and g.status().reason == "measuring"
    run(g, clock, 0.5)
    assert timed == [(2, 1)] and lib.count == 2 and g.status().reason == "free"
    run(g, clock, 5)
    assert timed == [(2, 1)]                          # timed once, not at every re-check


def test_a_busy_core_drops_to_one_thread_within_a_recheck_and_back_when_it_ends():
    g, clock, lib, machine, timed = governor(gain=1.5)
    run(g, clock, 1.5)
    assert lib.count == 2
    machine.others = 1.0                              # another program takes a core
    run(g, clock, T.RECHECK_S + 0.1)
    assert lib.count == 1 and g.status().reason == "busy"
    assert g.status().others_busy == pytest.approx(1.0, abs=0.1)
    machine.others = 0.0
    run(g, clock, 2 * T.RECHECK_S + 0.1)
    assert lib.count == 2


def test_no_gain_keeps_one_thread_even_on_a_quiet_machine():
    g, clock, lib, machine, timed = governor(gain=1.02)
    run(g, clock, 3)
    assert lib.count == 1 and g.status().reason == "no_gain" and timed == [(2, 1)]


def test_a_timing_that_fails_leaves_one_thread_and_the_pass_runs():
    def broken(rows):
        raise MemoryError("no room for the timing")
    g, clock, lib, machine, timed = governor(gain=broken)
    run(g, clock, 2)                                  # no exception out of tick
    assert lib.count == 1 and g.status().reason == "no_gain"


def test_decode_and_batch_passes_are_timed_and_chosen_apart():
    g, clock, lib, machine, timed = governor(gain=lambda rows: 1.0 if rows == 1 else 1.8)
    run(g, clock, 1.5, rows=1)
    assert lib.count == 1
    run(g, clock, 0.2, rows=64)                       # a prefill pass: its own timing, its own count
    assert lib.count == 2 and (2, 32) in timed
    g.tick(1, MATS)
    assert lib.count == 1


def test_after_an_idle_spell_it_starts_again_from_one_thread():
    g, clock, lib, machine, timed = governor(gain=1.5)
    run(g, clock, 1.5)
    assert lib.count == 2
    clock.t += T.STALE_S + 10                         # idle and quiet meanwhile ...
    machine()
    machine.others = 1.0                              # ... busy from now on: the old window says nothing of now
    g.tick(1, MATS)
    assert lib.count == 1
    run(g, clock, 1.0)
    assert lib.count == 1 and g.status().reason == "busy"


def test_the_timing_is_redone_after_its_time_to_live():
    g, clock, lib, machine, timed = governor(gain=1.5)
    run(g, clock, 1.0)
    clock.t += T.CALIBRATION_TTL_S - 1
    run(g, clock, 3.0, step=0.5)
    assert len(timed) == 2


def test_fix_sets_the_library_and_stops_the_automatic_choice():
    g, clock, lib, machine, timed = governor(gain=1.5)
    g.fix(3, "a test")
    assert lib.count == 3 and g.status().mode == "fixed" and "a test" in g.status().describe()
    machine.others = 1.5
    run(g, clock, 3)
    assert lib.count == 3 and timed == []
    g.fix(None)
    run(g, clock, 1.5)
    assert lib.count == 1 and g.status().mode == "auto"
    with pytest.raises(ValueError):
        g.fix(0)


def test_prepare_measures_and_times_both_kinds_before_any_pass():
    g, clock, lib, machine, timed = governor(gain=1.5)

    def sleep(s):
        clock.t += s
    status = g.prepare(MATS, sleep=sleep)
    assert sorted(timed) == [(2, 1), (2, 32)] and status.threads == 2 and status.reason == "free"
    assert status.others_busy == pytest.approx(0.0)


def test_the_environment_fixes_the_governor():
    g = BlasThreads(library=FakeLibrary(), cores=2, env={T.ENV: "1"}, sampler=lambda: None)
    assert g.library.count == 1 and g.status().mode == "fixed" and T.ENV in g.status().text


def test_forward_passes_go_through_the_process_governor(monkeypatch):
    from engine import Model
    from specs.model_config import ModelConfig
    cfg = ModelConfig(name="t", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                      intermediate_size=24, vocab_size=32, max_position_embeddings=32)
    model = Model.random(cfg)
    seen = []

    class Spy:
        def tick(self, rows, matrices):
            seen.append((rows, len(list(matrices()))))
    monkeypatch.setattr(T, "_GOVERNOR", Spy())
    model.prefill([1, 2, 3, 4, 5], model.new_cache(1, 16))
    assert seen == [(5, 4)]                           # 5 token rows; one layer's 4 weight matrices to time on


# ============================================================================================ the real library
def test_the_count_reaches_openblas():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    g = BlasThreads(env={}, cores=2)
    if not g.library.available:
        pytest.skip("no BLAS that threadpoolctl controls")
    before = g.library.get()

    def reported():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"][0]
    try:
        for n in (1, 2, 1):
            g.fix(n)
            assert reported() == n and g.status().threads == n
    finally:
        g.library.set(before)


def test_calibrate_times_the_engines_product_and_restores_nothing_by_itself():
    mats = [np.ones((64, 32), np.float32), np.ones((48, 32), np.float32)]
    counts = []
    gain = T.calibrate(mats, 2, 1, counts.append, rounds=2)
    assert gain > 0 and counts.count(1) == counts.count(2) == 3     # a warm-up and two timed sweeps each
