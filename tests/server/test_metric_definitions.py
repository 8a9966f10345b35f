"""The measuring side checked like the predicting side: on a scripted server with known per-token timing
(tests/helpers_fake_openai.py), the load generator's TTFT/TPOT/ITL/E2E means and p50/p90/p99, requests/s, tokens/s
and the mean batch by Little's law equal (1) a hand computation over the requests it recorded (sorted lists and
linear interpolation written out here, no NumPy percentile), (2) the shared definitions the importers use
(calculators.serving.metric_definitions.summarise_requests), and (3) the script's own timing within the slack of
a busy machine; the measured sweep's level reads the same figures."""
from __future__ import annotations

import math

import pytest

from calculators.planning.measured_sweep import level_from_summary
from calculators.serving.metric_definitions import summarise_requests
from helpers_fake_openai import FakeOpenAIServer, Script
from server.loadgen import SweepPlan, Target, measure

TTFT_S, GAP_S, OUT, N = 0.3, 0.05, 8, 6
SLACK_S = 0.5


def _pct(values, q):
    """Linear interpolation between the two order statistics around rank (n − 1)·q/100, by hand."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _hand(records):
    """Our definitions written out over the raw records (seconds -> ms)."""
    ttft = [r.first_token_s - r.sent_s for r in records]
    tpot = [(r.chunk_s[-1] - r.first_token_s) / (r.output_tokens - 1) for r in records]
    itl = [b - a for r in records for a, b in zip(r.chunk_s, r.chunk_s[1:])]
    e2e = [r.chunk_s[-1] - r.sent_s for r in records]
    span = max(r.end_s for r in records) - min(r.sent_s for r in records)
    out = {}
    for name, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_mean_ms"] = sum(v) / len(v) * 1e3
        for q in (50, 90, 99):
            out[f"{name}_p{q}_ms"] = _pct(v, q) * 1e3
    out["requests_per_s"] = len(records) / span
    out["output_tok_s"] = sum(r.output_tokens for r in records) / span
    out["total_tok_s"] = sum(r.output_tokens + r.prompt_tokens for r in records) / span
    out["mean_batch"] = out["requests_per_s"] * out["e2e_mean_ms"] / 1e3
    return out


@pytest.fixture(scope="module")
def sweep():
    with FakeOpenAIServer(Script(ttft_s=TTFT_S, itl_s=GAP_S)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((2,), requests=N, prompt_tokens=20, output_tokens=OUT,
                                                                level_timeout_s=60, request_timeout_s=30))
        res_rate = measure(Target(srv.url, "fake-model"), SweepPlan((4.0,), mode="rate", requests=N,
                                                                     prompt_tokens=20, output_tokens=OUT,
                                                                     level_timeout_s=60, request_timeout_s=30))
    return res, res_rate


def test_generator_figures_equal_the_hand_computation(sweep):
    """Catches TPOT with the first token in, ITL averaged per request instead of per gap, a percentile method
    other than linear interpolation, a span from the level's start instead of the first send."""
    for res in sweep:
        lv = res.levels[0]
        recs = [r for r in lv.records if r.ok]
        assert len(recs) == N
        row, hand = lv.summary(), _hand(recs)
        for k, v in hand.items():
            if k != "mean_batch":
                assert row[k] == pytest.approx(v, rel=1e-9), k


def test_generator_and_importers_share_one_definition(sweep):
    """The importers' summary (metric_definitions.summarise_requests) over the same requests gives the same
    figures as the load generator."""
    lv = sweep[0].levels[0]
    recs = [r for r in lv.records if r.ok]
    shared = summarise_requests([r.sent_s for r in recs], [r.first_token_s for r in recs],
                                [r.chunk_s[-1] for r in recs], [r.output_tokens for r in recs],
                                [r.prompt_tokens for r in recs], [r.itl_s for r in recs])
    row = lv.summary()
    for k, v in shared.items():
        if k in row:
            # the generator's span ends at the request's end (after [DONE]), the shared one at its last chunk
            tol = 2e-2 if k in ("requests_per_s", "output_tok_s", "total_tok_s") else 1e-9
            assert row[k] == pytest.approx(v, rel=tol), k
    assert shared["mean_batch"] == pytest.approx(_hand(recs)["mean_batch"], rel=2e-2)


def test_figures_equal_the_scripts_timing(sweep):
    """TTFT 300 ms, TPOT = ITL = 50 ms, E2E = 300 + 7 × 50 = 650 ms per request; at concurrency 2 the client keeps
    2 in flight, so requests/s ≈ 2 / 0.65 s and the mean batch by Little's law ≈ 2; at 4 requests/s offered the
    mean batch is the measured rate × 0.65 s."""
    row = sweep[0].levels[0].summary()
    e2e = TTFT_S + (OUT - 1) * GAP_S
    for k in ("ttft_mean_ms", "ttft_p50_ms"):
        assert 1e3 * TTFT_S <= row[k] < 1e3 * (TTFT_S + SLACK_S)
    # the gaps of a request add up to at least 7 scripted gaps; a busy machine only adds to them
    for k in ("tpot_mean_ms", "tpot_p50_ms", "itl_mean_ms"):
        assert 1e3 * GAP_S - 1 <= row[k] < 1e3 * (GAP_S + SLACK_S / (OUT - 1)), k
    assert row["e2e_mean_ms"] >= 1e3 * e2e - 5
    assert row["requests_per_s"] <= 2 / e2e * 1.01                      # never faster than the script allows
    assert row["requests_per_s"] * row["e2e_mean_ms"] / 1e3 == pytest.approx(2, rel=0.2)   # 2 in flight

def test_measured_sweep_reads_the_same_level(sweep):
    """The sweep's level carries the generator's means; its mean batch is c for a concurrency and
    round(requests/s × mean E2E) for a rate (Little's law), requests/s = output tokens/s ÷ output tokens."""
    for res in sweep:
        row = res.rows_with_arrivals()[0]
        lv = level_from_summary(row)
        hand = _hand([r for r in res.levels[0].records if r.ok])
        assert lv.ttft_ms == pytest.approx(hand["ttft_mean_ms"]) and lv.itl_ms == pytest.approx(hand["itl_mean_ms"])
        assert lv.e2e_ms == pytest.approx(hand["e2e_mean_ms"])
        assert lv.output_tok_s == pytest.approx(hand["output_tok_s"])
        if lv.mode == "concurrency":
            assert lv.mean_batch == 2
        else:
            assert lv.mean_batch == max(1, round(hand["output_tok_s"] / OUT * hand["e2e_mean_ms"] / 1e3))
            assert len(lv.arrival_s) == N
