"""`python -m engine serve` sizes its BLAS threads (engine.threads) and /metrics says how many and why.

The count in /metrics is read from OpenBLAS inside the server (threadpoolctl), not from the server's own
bookkeeping, so a server that decided but never applied its choice shows the library's default instead."""
import re
import urllib.request

import pytest

from engine import threads as T
from server.process import EngineServerProcess

pytestmark = pytest.mark.live_server
LINE = re.compile(r'^inference_lab_blas_threads\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)


def scrape(server) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
        return r.read().decode()


def blas_line(text: str) -> tuple[dict, float]:
    m = LINE.search(text)
    assert m, "no inference_lab_blas_threads line in /metrics"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
    return labels, float(m["value"])


def gauge(text: str, name: str) -> float:
    m = re.search(rf'^{name}\{{[^}}]*\}} (\S+)$', text, re.M)
    assert m, f"no {name} line"
    return float(m[1])


def complete(server, n=4):
    body = (b'{"model": "smollm2", "prompt": "Once upon a time", "max_tokens": %d, "temperature": 0}' % n)
    req = urllib.request.Request(server.base_url + "/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200


def test_the_automatic_choice_is_applied_and_explained(engine_server):
    complete(engine_server)
    text = scrape(engine_server)
    labels, threads = blas_line(text)
    assert labels["mode"] == "auto" and labels["reason"] in T.REASONS
    cores = len(T.usable_cpus())                     # the server is our child: the same CPUs
    assert gauge(text, "inference_lab_cpu_cores") == cores
    if labels["reason"] == "free":                   # the stated reason and the library's count agree
        assert 2 <= threads <= cores
    else:
        assert threads == 1
    if labels["reason"] in ("busy", "free", "no_gain", "untimed"):   # a window was measured
        assert gauge(text, "inference_lab_cpu_others_busy_cores") >= 0


def test_a_fixed_count_from_the_environment_reaches_the_servers_blas(monkeypatch, default_gguf_path):
    """One thread where OpenBLAS would start two (or more): the count /metrics reads from the library is ours."""
    monkeypatch.setenv(T.ENV, "1")
    with EngineServerProcess(served_model_name="smollm2") as srv:
        complete(srv, 2)
        labels, threads = blas_line(scrape(srv))
    assert (labels["mode"], labels["reason"], threads) == ("fixed", "fixed", 1.0)
