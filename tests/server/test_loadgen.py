"""The load generator against a fake OpenAI server whose delays the test scripts (tests/helpers_fake_openai.py): measured
TTFT, ITL and end-to-end must match the scripted delays (never below them; above by at most scheduling slack),
token counts come from `usage`, concurrency and rates are honoured, and every bad target gets one clear message."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from helpers_fake_openai import FakeOpenAIServer, Script
from server.loadgen import LoadError, SweepPlan, Target, base_url, measure, parse_levels

# the tests here time scripted delays: under pytest-xdist they run on one worker, one at a time (not beside
# test_measure_cli's timed sweeps)
pytestmark = pytest.mark.xdist_group("scripted_timing")
SLACK_S = 0.5           # scheduling slack on a loaded 2-core machine: medians may exceed the script by this much
# Never below the script: a chunk is read after it is written. Single gaps are not bounded below: a client the
# machine delays reads two chunks at once (a long gap, then a near-zero one); the sum is.


def ok_records(result):
    return [r for lv in result.levels for r in lv.records if r.ok]


def test_measured_ttft_itl_and_e2e_match_the_scripted_delays():
    """TTFT 0.1 s, then 19 gaps of 0.05 s: a TTFT taken late (at the stream's end, or from the level's start) or an
    ITL summed over gaps is off by far more than the slack; no TTFT or end-to-end is measured below the script."""
    ttft, itl, out = 0.1, 0.05, 20
    with FakeOpenAIServer(Script(ttft_s=ttft, itl_s=itl)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((1, 2), requests=2, prompt_tokens=40,
                                                                output_tokens=out))
    recs = ok_records(res)
    assert len(recs) == 4 and res.error is None and not res.stopped
    for r in recs:
        assert r.ttft_s >= ttft                                        # the first chunk waited ttft_s
        assert len(r.itl_s) == out - 1
        assert r.e2e_s >= ttft + (out - 1) * itl - 0.005
        assert (r.prompt_tokens, r.output_tokens, r.tokens_from) == (40, out, "usage")   # fake: 3 + one per word
    assert np.median([r.ttft_s for r in recs]) < ttft + SLACK_S
    assert np.median([g for r in recs for g in r.itl_s]) < 2 * itl
    row = res.rows()[0]
    assert row["ttft_p50_ms"] >= 1e3 * ttft and row["itl_p50_ms"] > 0
    assert row["output_tok_s"] == pytest.approx(2 * out / res.levels[0].duration_s)


def test_concurrency_is_the_number_in_flight_and_rate_sends_at_poisson_times():
    """Three users never have more than three requests in flight, and reach three: each request lasts 0.8 s, longer
    than a loaded machine takes to start the three (at 0.2 s a slow start once let the first finish before the
    third was sent). At 10 requests/s the sends follow the seed's exponential gaps."""
    held = Script(ttft_s=0.8, itl_s=0.01)
    with FakeOpenAIServer(held) as srv:
        measure(Target(srv.url, "fake-model"), SweepPlan((3,), requests=6, prompt_tokens=8, output_tokens=3))
    assert held.max_in_flight == 3
    script = Script(ttft_s=0.2, itl_s=0.01)
    with FakeOpenAIServer(script) as srv:
        res = measure(Target(srv.url, "fake-model"),
                      SweepPlan((10.0,), mode="rate", requests=8, prompt_tokens=8, output_tokens=3, seed=1))
    sent = np.array([r.sent_s for r in res.levels[0].records])
    gaps = np.random.default_rng(1 * 1_000_003).exponential(0.1, size=8)        # level 0 of seed 1
    expected = np.cumsum(gaps) - gaps[0]
    assert np.all(sent - sent[0] >= expected - 1e-3)
    assert np.all(sent - sent[0] < expected + 2 * SLACK_S)         # not one after another (8 × 0.23 s)


def test_chat_api_and_a_server_without_usage_count_text_chunks():
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.01, usage=False)) as srv:
        res = measure(Target(srv.url, "fake-model", api="chat"), SweepPlan((1,), requests=2, prompt_tokens=10,
                                                                           output_tokens=4))
    recs = ok_records(res)
    assert [r.output_tokens for r in recs] == [4, 4] and {r.tokens_from for r in recs} == {"chunks"}
    assert res.rows()[0]["tokens_from"] == "chunks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("script, model, words", [
    (None, "fake-model", "cannot reach"),                                     # nothing listens there
    (Script(models_body="<html>a web page</html>"), "x", "not an OpenAI-compatible server"),
    (Script(models_status=404, models_body="not found"), "x", "not an OpenAI-compatible server"),
    (Script(models_status=401, models_body="{}"), "x", "API key"),
    (Script(), "no-such-model", "does not serve a model named 'no-such-model'; it serves: fake-model"),
])
def test_bad_targets_get_one_clear_message(script, model, words):
    plan = SweepPlan((1,), requests=1, output_tokens=2)
    if script is None:
        with pytest.raises(LoadError, match=words):
            measure(Target(f"http://127.0.0.1:{free_port()}", model), plan)
        return
    with FakeOpenAIServer(script) as srv, pytest.raises(LoadError) as e:
        measure(Target(srv.url, model), plan)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_server_that_dies_mid_sweep_ends_it_with_the_levels_before_kept():
    with FakeOpenAIServer(Script(ttft_s=0.02, itl_s=0.01, die_after=4)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((1, 2, 4), requests=4, output_tokens=3))
    assert "stopped answering during concurrency 2" in res.error and "levels before it are kept" in res.error
    assert res.rows()[0]["completed"] == 4 and len(res.levels) == 2


def test_one_broken_connection_is_that_requests_error_and_the_sweep_goes_on():
    with FakeOpenAIServer(Script(ttft_s=0.02, itl_s=0.01, drop_nth=2)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((1, 2), requests=3, output_tokens=4))
    assert res.error is None and [r["completed"] for r in res.rows()] == [2, 3]
    assert res.rows()[0]["failed"] == 1 and "connection lost" in res.rows()[0]["first_error"]


def test_a_server_that_does_not_stream_events_is_named_per_request():
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.0, sse=False)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((1,), requests=2, output_tokens=3))
    row = res.rows()[0]
    assert res.error is None and row["completed"] == 0 and row["failed"] == 2
    assert "not a server-sent-event stream" in row["first_error"]


def test_stop_ends_the_sweep_at_once_and_keeps_what_was_measured():
    stop = threading.Event()

    def progress(done, total, label):
        if done >= 2:
            stop.set()

    with FakeOpenAIServer(Script(ttft_s=0.02, itl_s=0.01)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((1, 2), requests=20, output_tokens=3),
                      on_progress=progress, stop=stop)
    assert res.stopped and len(res.levels) == 1 and 2 <= len(ok_records(res)) <= 3


def test_progress_beats_while_a_long_request_runs_so_stop_need_not_wait_for_it():
    stop, calls = threading.Event(), []

    def progress(done, total, label):
        calls.append(done)
        if len(calls) >= 2:                 # the start, then a heartbeat: no request has ended yet
            stop.set()

    with FakeOpenAIServer(Script(ttft_s=3.0, itl_s=0.01)) as srv:
        res = measure(Target(srv.url, "fake-model"), SweepPlan((1,), requests=2, output_tokens=2),
                      on_progress=progress, stop=stop)
    assert calls[:2] == [0, 0] and res.stopped and not ok_records(res)


@pytest.mark.parametrize("kw, words", [
    (dict(levels=(0,)), "positive"), (dict(levels=(2.5,)), "whole number"), (dict(levels=()), "at least one"),
    (dict(levels=(1,), requests=0), "requests"), (dict(levels=(1,), mode="burst"), "mode"),
    (dict(levels=(1,), output_tokens=-1), "output tokens"),
])
def test_bad_plans_are_refused(kw, words):
    with pytest.raises(LoadError, match=words):
        SweepPlan(**kw)


def test_urls_and_levels_are_read_leniently_and_refused_clearly():
    assert base_url("localhost:8000") == "http://localhost:8000/v1"
    assert base_url("http://h:1/v1/") == base_url("http://h:1/v1/completions") == "http://h:1/v1"
    for bad in ("", "ftp://h", "http://"):
        with pytest.raises(LoadError):
            base_url(bad)
    assert parse_levels("1, 4 8") == (1.0, 4.0, 8.0)
    with pytest.raises(LoadError, match="numbers separated by commas"):
        parse_levels("1,x")
    with pytest.raises(LoadError, match="model name"):
        Target("http://h:1", " ")
