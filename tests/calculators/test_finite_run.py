"""A finite online run of N requests at a rate (calculators/serving/finite_run.py), worked by hand on a step of
constant cost, and the published online rows it prices."""
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
