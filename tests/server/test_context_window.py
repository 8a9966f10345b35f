"""The engine server refuses a request whose prompt plus max_tokens passes the model's context window (as vLLM
does: 400, code context_length_exceeded), and serves one that just fits. A tiny model (a 48-token window) so the
boundary is cheap to reach."""
import json
import urllib.error
import urllib.request

import pytest

from engine import Model
from helpers_http import InProcessServer
from helpers_models import prompt, tiny
from server.worker import EngineWorker

CTX = 48


@pytest.fixture(scope="module")
def srv():
    s = InProcessServer(EngineWorker(Model.random(tiny(max_position_embeddings=CTX), seed=3)), "tiny").start()
    yield s
    s.stop()


def _post(srv, body):
    req = urllib.request.Request(srv.url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("prompt_tokens", [1, 20, CTX - 1])
def test_prompt_plus_max_tokens_over_the_window_is_refused(srv, prompt_tokens):
    """prompt alone fits (fewer than CTX tokens), prompt + max_tokens = CTX + 1 does not."""
    status, body = _post(srv, {"model": "tiny", "prompt": prompt(prompt_tokens), "max_tokens": CTX + 1 - prompt_tokens,
                               "ignore_eos": True})
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "max_tokens"


def test_prompt_plus_max_tokens_equal_to_the_window_is_served(srv):
    status, body = _post(srv, {"model": "tiny", "prompt": prompt(CTX - 4), "max_tokens": 4, "ignore_eos": True})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4
