"""The planner's TTFT p99 against the discrete-event simulator on the same load (issue 18): a continuous-batching
replica, Poisson arrivals, fixed prompts, exponential outputs, the planner's own step times. The old M/M/1 tail at
the full batch cap read 2-6x the simulator's p99 here; the batching model agrees within 25% at three loads."""
from __future__ import annotations

import math

import numpy as np
import pytest

from calculators.serving.batching import step_model_for
from calculators.sizing.latency import Efficiency
from calculators.planning.planner import SearchSpace, Workload, plan
from calculators.serving.queueing import batching_concurrency, prefill_wait_p99_s, slot_wait_p99_s, token_time_s
from calculators.serving.serving_sim import simulate_continuous
from calculators.serving.workload import synthetic_workload
from specs.devices import load_device
from specs.presets import load_preset

EVEN = Efficiency(decode_mbu=0.6, prefill_mfu=0.6, prefill_mbu=0.6, decode_mfu=0.6)   # one rate for both models
PROMPT, OUTPUT, CAP = 2000, 300, 64


def _planner_row(config, device, rate: float, dtype: str) -> dict:
    space = SearchSpace(gpu_counts=(1,), tp=(1,), pp=(1,), batch_caps=(CAP,), weight_dtypes=(dtype,),
                        kv_dtypes=(dtype,))
    res = plan(config, [device], Workload(rate, PROMPT, OUTPUT, 1e7, 1e5, PROMPT), space, EVEN)
    return res.plan(0)


@pytest.mark.parametrize("rate", [0.5, 1.0, 1.5])
def test_planner_ttft_p99_within_25_percent_of_the_simulator(rate):
    config, device = load_preset("Llama-3-70B"), load_device("H200")
    row = _planner_row(config, device, rate, "fp8")
    sim = simulate_continuous(step_model_for(config, device, "fp8", "fp8", EVEN),
                              synthetic_workload(20_000, rate, PROMPT, OUTPUT, seed=1), CAP).summary()
    assert row["ttft_p99_ms"] == pytest.approx(sim["ttft_p99_ms"], rel=0.25)
    assert row["concurrency_per_replica"] == pytest.approx(sim["mean_batch"], rel=0.15)   # Little's law


def test_raising_an_unreached_cap_leaves_ttft_alone():
    """With ~15 requests in flight a cap of 64 or 128 is never reached: the TTFT must not move (it fell 1,809 ->
    793 ms between 64 and 512 under an older model; 512 sequences no longer fit the memory check, and a plan
    that does not fit gets no load figures)."""
    config, device = load_preset("Llama-3-70B"), load_device("H200")
    space = dict(gpu_counts=(1,), tp=(1,), pp=(1,), weight_dtypes=("fp8",), kv_dtypes=("fp8",))
    wl = Workload(1.0, PROMPT, OUTPUT, 1e7, 1e5, PROMPT)
    t = [plan(config, [device], wl, SearchSpace(batch_caps=(b,), **space), EVEN).plan(0)["ttft_p99_ms"]
         for b in (64, 128)]
    assert t[1] == pytest.approx(t[0], rel=0.05)


def test_concurrency_solves_littles_law_by_a_plain_fixed_point():
    """The closed-form root against iterating L <- λ·(prefill + output·t(L)) from 0 (a second formula)."""
    lam, pre, out, i1, slope = 2.0, 0.24, 300, 0.025, 0.0002
    L = 0.0
    for _ in range(10_000):
        it = i1 + slope * (L - 1)
        L = lam * (pre + out * it / (1 - lam * pre + lam * it))
    assert float(batching_concurrency(lam, pre, out, i1, slope)) == pytest.approx(L, rel=1e-9)
    assert float(token_time_s(lam, pre, i1)) == pytest.approx(i1 / (1 - lam * pre + lam * i1))
    assert math.isinf(float(batching_concurrency(5.0, 0.24, out, i1, slope)))       # prefills alone exceed 100%


def test_waits_reduce_to_mm1_for_one_slot_and_exponential_prefills():
    """c = 1 and c² = 1: both p99 waits are M/M/1's, ln(100ρ)·S/(1 − ρ)."""
    lam, s = 2.0, 0.3
    rho = lam * s
    mm1 = math.log(100 * rho) * s / (1 - rho)
    assert float(slot_wait_p99_s(lam, s, 1)) == pytest.approx(mm1)
    assert float(prefill_wait_p99_s(lam, s, 1.0)) == pytest.approx(mm1)
    assert float(prefill_wait_p99_s(0.01, s)) == 0.0                                  # ρ ≤ 1%: no wait at p99
    assert np.isinf(slot_wait_p99_s(4.0, s, 1))
