"""A finite online run of N requests at a rate (calculators/serving/finite_run.py), worked by hand on a step of
constant cost, and the published online rows it prices."""
import math

import pytest

from calculators.serving.finite_run import finite_run


def flat(ms):
    return lambda n, p: ms


def test_one_slot_past_capacity_by_hand():
    # one slot, a 10 ms step, 5 output tokens: a request holds the slot for 5 steps (its prefill step gives token 1,
    # 4 decode steps), so 3 requests sent at once finish at 50, 100 and 150 ms. Capacity 1 / 50 ms = 20 requests/s,
    # whatever the rate sent: throughput = 3 / 0.150 s = 20/s. First tokens at 10, 60, 110 ms (all three sent at
    # ≈ 0): mean TTFT 60 ms. Every token gap is one 10 ms step.
    r = finite_run(flat(10.0), rate=1e6, requests=3, prompt_tokens=100, output_tokens=5, slots=1)
    assert r["makespan_s"] == pytest.approx(0.150, abs=1e-9)
    assert r["achieved_rps"] == pytest.approx(20.0, rel=1e-6)
    assert r["ttft_ms"] == pytest.approx(60.0, abs=0.01)
    assert r["itl_ms"] == pytest.approx(10.0, rel=1e-12)


def test_below_capacity_throughput_is_requests_over_span_plus_drain():
    # 20 requests at 2/s on a server that keeps up: arrivals span 19 / 2 = 9.5 s, and the last request takes its
    # 5 steps of 10 ms: makespan 9.55 s, throughput 20 / 9.55 = 2.094/s (N / makespan, not the rate sent)
    r = finite_run(flat(10.0), rate=2.0, requests=20, prompt_tokens=100, output_tokens=5)
    assert 9.55 - 1e-9 <= r["makespan_s"] <= 9.56 + 1e-9
    assert r["achieved_rps"] == pytest.approx(20 / 9.55, rel=2e-3)
    # every request finds the server idle (the previous one left 450 ms earlier): its prefill step is its TTFT
    assert r["ttft_ms"] == pytest.approx(10.0, rel=1e-9)


def test_past_capacity_throughput_is_work_over_capacity():
    # 1,000 requests sent at 100/s to 4 slots of 5 × 10 ms: capacity 4 / 0.05 s = 80/s < 100/s, so the run lasts
    # about N / capacity = 12.5 s (not the 10 s span), and the requests wait in line: the last is sent at 10 s and
    # served at ≈ 12.45 s; the mean wait ≈ (12.5 − 10) / 2 s
    r = finite_run(flat(10.0), rate=100.0, requests=1000, prompt_tokens=100, output_tokens=5, slots=4)
    assert r["achieved_rps"] == pytest.approx(80.0, rel=0.01)
    assert r["ttft_ms"] == pytest.approx(1250.0, rel=0.05)


def _step_by_step(step, rate, N, I, O, slots, per_step):
    """The run as the module docstring states it, one step per loop, nothing skipped (a brute force)."""
    t, admitted, left, gaps, count, ttft, steps = 0.0, 0, [], 0.0, 0, 0.0, 0
    while admitted < N or left:
        arrived = min(N, math.floor(rate * t / 1e3 + 1e-9) + 1)
        if arrived == admitted and not left:
            t = max(t, admitted / rate * 1e3)
            continue
        n = len(left)
        a = max(0, min(arrived - admitted, slots - n, per_step))
        tau = step(n, a * I)
        for i in range(admitted, admitted + a):
            ttft += t + tau - min(i / rate * 1e3, t)
        gaps, count, steps = gaps + n * tau, count + n, steps + 1
        left = [k - 1 for k in left if k > 1] + [O - 1] * a * (O > 1)
        admitted += a
        t += tau
    return dict(makespan_s=t / 1e3, itl_ms=gaps / count, ttft_ms=ttft / N, steps=steps)


@pytest.mark.parametrize("rate,N,I,O,slots,chunk", [
    (1e9, 300, 1000, 50, 40, 8192),       # offline: everything queued at once, a slot cap binding
    (3.0, 200, 500, 40, 16, 2048),        # online, past capacity
    (0.7, 60, 200, 30, 64, 4096),         # online, the server keeps up (idle gaps between arrivals)
    (1e9, 90, 3000, 7, 1000, 8192),       # offline, the budget binding (two whole prompts a step)
])
def test_taking_quiet_steps_together_equals_the_step_by_step_run(rate, N, I, O, slots, chunk):
    def step(n, p):                        # a step that grows with the batch and with the prompt tokens it carries
        return 8.0 + 0.05 * n + 0.004 * p
    fast = finite_run(step, rate=rate, requests=N, prompt_tokens=I, output_tokens=O, slots=slots, chunk=chunk)
    slow = _step_by_step(step, rate, N, I, O, slots, max(chunk // I, 1))
    for k in ("makespan_s", "itl_ms", "ttft_ms", "steps"):
        assert fast[k] == pytest.approx(slow[k], rel=1e-9), k


def test_an_offline_run_is_ramp_waves_and_drain_by_hand():
    # every request queued at t = 0 (rate = inf), a flat 10 ms step, 5 output tokens (a prefill step + 4 decode
    # steps = 50 ms a request). 4 requests, 8 slots: one wave, 50 ms, 80 requests/s. 2 slots: two waves, 100 ms,
    # 40/s. 4 slots, two whole 100-token prompts a step (a 200-token budget): requests 1-2 in steps 1-5, requests
    # 3-4 in steps 2-6 (60 ms, 66.7/s); their first tokens at 10, 10, 20, 20 ms: mean TTFT 15 ms.
    one = finite_run(flat(10.0), rate=math.inf, requests=4, prompt_tokens=100, output_tokens=5, slots=8)
    assert one["makespan_s"] == pytest.approx(0.050) and one["achieved_rps"] == pytest.approx(80.0)
    two = finite_run(flat(10.0), rate=math.inf, requests=4, prompt_tokens=100, output_tokens=5, slots=2)
    assert two["makespan_s"] == pytest.approx(0.100) and two["steps"] == 10
    ramp = finite_run(flat(10.0), rate=math.inf, requests=4, prompt_tokens=100, output_tokens=5, slots=4, chunk=200)
    assert ramp["makespan_s"] == pytest.approx(0.060) and ramp["ttft_ms"] == pytest.approx(15.0)
    assert ramp["arrival_span_s"] == 0.0
