"""vllm:request_queue_time_seconds counts the wait before the scheduler admits a request, not the time to its
first token (vLLM's definition: time in the WAITING phase). A scripted busy server: one slot (max_batch 1), a
prefill that takes PREFILL_S, a worker the test steps by hand, so each request's wait is set by the test."""
import json
import re
import threading
import time
import urllib.request

import pytest

from engine import Model
from helpers_http import InProcessServer
from helpers_models import tiny
from server.worker import EngineWorker

PREFILL_S = 0.5             # every forward pass sleeps this long first: prefill time a dashboard must not see
WAIT_S = (0.3, 0.4)         # the test holds each request this long before the step that admits it


def _metric_sum(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}_sum\{{[^}}]*\}} (\S+)$", text, re.M))


def _post(url: str, out: list) -> None:
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out.append(json.loads(r.read()))


def test_queue_time_is_the_wait_before_scheduling_not_the_ttft():
    w = EngineWorker(Model.random(tiny(), seed=3), start=False, max_batch=1, block_size=4, num_blocks=40,
                     abandon_after_s=1e9)
    forward = w.scheduler.runner.forward

    def slow_forward(*a, **k):
        time.sleep(PREFILL_S)
        return forward(*a, **k)

    w.scheduler.runner.forward = slow_forward
    srv = InProcessServer(w, "tiny").start()
    replies, threads, sent, admitted = [], [], [], []
    try:
        for n in (1, 2):                                     # A, then B behind it (one slot: B waits for A)
            sent.append(time.perf_counter())
            threads.append(threading.Thread(target=_post, args=(srv.url, replies), daemon=True))
            threads[-1].start()
            deadline = time.monotonic() + 30
            while len(w.snapshot().requests) < n and time.monotonic() < deadline:
                time.sleep(0.005)
        for hold in WAIT_S:
            time.sleep(hold)
            admitted.append(time.perf_counter())             # this step admits the next request, then prefills
            w.step_once()                                    # 3 prompt tokens, max_tokens 1: one step ends it
            deadline = time.monotonic() + 30
            while len(replies) < len(admitted) and time.monotonic() < deadline:
                time.sleep(0.005)
        for t in threads:
            t.join(60)
        queue_sum = _metric_sum(srv.url, "vllm:request_queue_time_seconds")
        ttft_sum = _metric_sum(srv.url, "vllm:time_to_first_token_seconds")
    finally:
        srv.stop()
    assert len(replies) == 2
    known_wait = (admitted[0] - sent[0]) + (admitted[1] - sent[1])  # A: held 0.3 s; B: A's hold + step + 0.4 s
    assert queue_sum == pytest.approx(known_wait, abs=0.2)
    assert ttft_sum - queue_sum == pytest.approx(2 * PREFILL_S, abs=0.2)     # each prefill is not queueing
