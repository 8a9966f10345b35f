"""The engine server against inputs no client should be able to break it with, and its access checks (API key,
Host, Origin), over real HTTP on loopback (an in-process uvicorn over the default model).

Every refusal must be a 4xx whose body is OpenAI's error shape; every test has a deadline (socket timeouts)."""
import http.client
import json
import threading
import time
import urllib.request

import pytest

from helpers_http import InProcessServer
from server.api_guard import API_KEY_ENV, Access, api_key_from
from server.api_requests import MAX_DEPTH, prompt_char_limit
from server.worker import EngineWorker

TIMEOUT_S = 60
NAME = "smollm2"


@pytest.fixture(scope="module")
def server(default_model):
    srv = InProcessServer(EngineWorker(default_model), NAME, max_body_bytes=256 * 1024).start()
    yield srv
    srv.stop()


def request(srv, method, path, body=b"", headers=None, chunked=False):
    """(status, headers, parsed JSON or raw bytes) of one request on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=TIMEOUT_S)
    try:
        h = {"Content-Type": "application/json", **(headers or {})}
        if chunked:
            c.request(method, path, body=iter([body[i:i + 65536] for i in range(0, len(body), 65536)]), headers=h,
                      encode_chunked=True)
        else:
            c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        raw = r.read()
    finally:
        c.close()
    try:
        return r.status, dict(r.getheaders()), json.loads(raw)
    except ValueError:
        return r.status, dict(r.getheaders()), raw


def post(srv, body, path="/v1/completions", **kw):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(srv, "POST", path, raw, **kw)


def assert_openai_error(status, body, want_status, param=None):
    assert status == want_status, body
    assert isinstance(body, dict) and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param


def still_serving(srv):
    status, _, body = post(srv, {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 2


# ============================================================================================ findings of issue 29
def test_a_lone_surrogate_anywhere_is_a_400_not_a_500(server):
    # json.dumps writes "\ud800" as the escape "\\ud800": valid JSON, not valid Unicode (the tokenizer raised
    # TypeError -> plain-text 500; the 404 naming the model failed to encode)
    s, _, b = post(server, {"prompt": "Hello \ud800", "max_tokens": 2})
    assert_openai_error(s, b, 400, "prompt")
    s, _, b = post(server, {"messages": [{"role": "user", "content": "Hi \udfff"}], "max_tokens": 2},
                   path="/v1/chat/completions")
    assert_openai_error(s, b, 400, "messages")
    s, _, b = post(server, {"model": "gpt\ud800", "prompt": "Hi", "max_tokens": 2})
    assert_openai_error(s, b, 400, "model")
    still_serving(server)


def test_a_model_name_the_server_does_not_have_is_a_404_whatever_its_characters(server):
    s, _, b = post(server, {"model": "mod\u00e8le-\U0001F600", "prompt": "Hi", "max_tokens": 2})
    assert_openai_error(s, b, 404, "model")
    assert "\\u00e8" in b["error"]["message"] or "è" in b["error"]["message"]


def test_json_nested_100000_deep_is_a_400(server):
    s, _, b = post(server, b"[" * 100_000 + b"]" * 100_000)        # RecursionError in json.loads -> 500
    assert_openai_error(s, b, 400)
    deep = {"prompt": "Hi", "max_tokens": 1, "metadata": None}
    inner = "x"
    for _ in range(MAX_DEPTH):
        inner = [inner]
    deep["metadata"] = inner                                           # one level past the limit, inside
    s, _, b = post(server, deep)
    assert_openai_error(s, b, 400, "metadata")
    still_serving(server)


@pytest.mark.parametrize("body", [
    b"", b"{", b"\xff\xfe{}", b"[1, 2]", b'"text"', b"null", b'{"prompt": 1' + b"0" * 5000 + b"}",
    json.dumps({"prompt": "Hi", "temperature": 10 ** 400}).encode(),       # OverflowError in isfinite -> 500
    json.dumps({"prompt": "Hi", "max_tokens": 10 ** 30}).encode(),
    json.dumps({"prompt": "Hi", "top_p": "high"}).encode(),
    json.dumps({"prompt": [[1, 2], [True]]}).encode(), json.dumps({"prompt": [True]}).encode(),
    json.dumps({"prompt": [10 ** 20]}).encode(), json.dumps({"prompt": {"a": 1}}).encode(),
    json.dumps({"prompt": "Hi", "stop": [1]}).encode(), json.dumps({"prompt": "Hi", "model": ["x"]}).encode(),
    json.dumps({"prompt": "Hi", "stream_options": "yes"}).encode(), b'{"prompt": NaN}',
    json.dumps({"prompt": "Hi", "user": 7}).encode()])
def test_malformed_bodies_are_4xx_in_openai_shape(server, body):
    s, _, b = post(server, body)
    assert 400 <= s < 500, (s, b)
    assert_openai_error(s, b, s)


def test_malformed_chat_bodies_are_4xx_in_openai_shape(server):
    for body in ({"messages": "hi"}, {"messages": []}, {"messages": [{"role": "user"}]},
                 {"messages": [{"role": 1, "content": "x"}]}, {"messages": [{"role": "user", "content": [{"x": 1}]}]}):
        s, _, b = post(server, body, path="/v1/chat/completions")
        assert_openai_error(s, b, 400, "messages")


def test_chat_content_as_a_list_of_text_parts_is_the_same_as_a_string(server):
    one = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "temperature": 0}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say "},
                                                       {"type": "text", "text": "hi"}]}],
             "max_tokens": 3, "temperature": 0}
    a, b = post(server, one, path="/v1/chat/completions"), post(server, parts, path="/v1/chat/completions")
    assert a[0] == b[0] == 200
    assert a[2]["choices"][0]["message"]["content"] == b[2]["choices"][0]["message"]["content"]


# ============================================================================================ size limits
def test_a_body_over_the_limit_is_413_before_it_is_read(server):
    t0 = time.perf_counter()
    s, _, b = post(server, b"x" * 20_000_000)           # 20 MB against a 256 KiB limit: refused by Content-Length
    assert_openai_error(s, b, 413)
    assert time.perf_counter() - t0 < 5


def test_a_chunked_body_over_the_limit_is_413_while_it_streams(server):
    body = json.dumps({"prompt": "x" * 2_000_000}).encode()        # no Content-Length: counted as it comes
    s, _, b = post(server, body, chunked=True)
    assert_openai_error(s, b, 413)
    s, _, b = post(server, {"prompt": "Once upon a time", "max_tokens": 2}, chunked=True)   # a small one passes
    assert s == 200


def test_the_character_bound_never_refuses_a_prompt_that_fits(default_model):
    """The bound's premise, by brute force over the vocabulary: no token's text is longer than the bound per token
    (so a prompt of more characters than ctx · bound cannot fit the context window)."""
    tok = default_model.tokenizer
    per_token = prompt_char_limit(default_model) // default_model.config.max_position_embeddings
    longest_text = max(len(tok.decode([i])) for i in range(tok.vocab_size))
    assert longest_text <= per_token


def test_a_prompt_too_long_to_fit_is_refused_before_tokenising(default_model):
    limit = prompt_char_limit(default_model)
    srv = InProcessServer(EngineWorker(default_model), NAME, max_body_bytes=64 * 2**20).start()
    try:
        text = "Once upon a time there was a fox. " * (limit // 34 + 1)          # > limit characters
        t0 = time.perf_counter()
        s, _, b = post(srv, {"prompt": text, "max_tokens": 1})
        took = time.perf_counter() - t0
        s2, _, b2 = post(srv, {"messages": [{"role": "user", "content": text[:limit // 2]},
                                            {"role": "user", "content": text[:limit // 2 + 1]}]},
                         path="/v1/chat/completions")
    finally:
        srv.stop()
    assert_openai_error(s, b, 400, "prompt")
    assert b["error"]["code"] == "context_length_exceeded"
    assert took < 0.6 * len(text) / 1e6          # tokenising runs at ~1 s per million characters here
    assert_openai_error(s2, b2, 400, "messages")


def test_health_answers_while_a_long_prompt_is_tokenised(server, default_model):
    """A prompt just under the character bound takes ~0.5 s to tokenise; meanwhile /health must answer at once
    (tokenising ran on the event loop: every client waited for it)."""
    limit = prompt_char_limit(default_model)
    srv = InProcessServer(EngineWorker(default_model), NAME, max_body_bytes=64 * 2**20).start()
    result = {}
    try:
        text = ("Once upon a time there was a fox. " * (limit // 34))[:limit - 1]

        def send():
            result["big"] = post(srv, {"prompt": text, "max_tokens": 1})

        t = threading.Thread(target=send, daemon=True)
        t0 = time.perf_counter()
        t.start()
        time.sleep(0.3)                                  # the body is sent and being tokenised
        h0 = time.perf_counter()
        with urllib.request.urlopen(srv.url + "/health", timeout=TIMEOUT_S) as r:
            assert r.status == 200
        health_s = time.perf_counter() - h0
        t.join(TIMEOUT_S)
        big_s = time.perf_counter() - t0
    finally:
        srv.stop()
    assert result["big"][0] == 400                       # the prompt is too long in tokens (after tokenising)
    assert health_s < max(0.25, big_s / 4), (health_s, big_s)


# ============================================================================================ fairness, limits
def test_a_429_carries_retry_after(default_model):
    srv = InProcessServer(EngineWorker(default_model, max_waiting=0), NAME).start()     # every request: line full
    try:
        s, h, b = post(srv, {"prompt": "Hi", "max_tokens": 2})
    finally:
        srv.stop()
    assert_openai_error(s, b, 429)
    assert int(h["retry-after"]) >= 1


def _second_request_while_the_first_runs(srv, headers=None):
    """Alice's long streamed request is running; -> (status, headers, body) of a second request naming alice."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=TIMEOUT_S)
    try:
        c.request("POST", "/v1/completions", json.dumps({"prompt": "Tell a long story", "max_tokens": 2000,
                                                         "user": "alice", "stream": True, "ignore_eos": True}),
                  {"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")     # alice's first request is running
        return post(srv, {"prompt": "Hi", "max_tokens": 2, "user": "alice"}, headers=headers)
    finally:
        c.close()                                                          # hang up: the long one is cancelled


def test_without_a_key_the_same_user_string_does_not_block_another_request(server):
    """Without a key anyone can call: 'user' is only a label, two requests naming the same user are both served
    (it was the session key, so anyone who knew a user's string could get them refused with 429)."""
    s, _, b = _second_request_while_the_first_runs(server)
    assert s == 200, b


def test_with_a_key_user_is_the_session_one_request_each(keyed):
    """With a key only its holders call (the app, for its sessions): 'user' is the session again, one request
    at a time, the second refused with 429 and Retry-After."""
    s, h, b = _second_request_while_the_first_runs(keyed, {"Authorization": f"Bearer {KEY}"})
    assert_openai_error(s, b, 429)
    assert int(h["retry-after"]) >= 1


def test_models_shows_no_file_path(server, default_model):
    s, _, b = request(server, "GET", "/v1/models")
    assert s == 200 and b["data"][0]["id"] == NAME
    source = default_model.source
    assert source and "/" in source                      # the default model is a file on disk...
    assert source not in json.dumps(b) and "/" not in b["data"][0]["root"]      # ...that the API never shows


class _BrokenWorker(EngineWorker):
    def submit(self, *a, **k):
        raise RuntimeError("a bug in the worker")


def test_a_real_bug_is_a_json_500_in_openai_shape(default_model):
    srv = InProcessServer(_BrokenWorker(default_model), NAME).start()
    try:
        s, _, b = post(srv, {"prompt": "Hi", "max_tokens": 2})
        s2, _, b2 = post(srv, {"prompt": "Hi", "max_tokens": 2, "stream": True})
    finally:
        srv.stop()
    assert_openai_error(s, b, 500)
    assert_openai_error(s2, b2, 500)
    assert b["error"]["type"] == "server_error"


# ============================================================================================ key, host, origin
KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def keyed(default_model):
    srv = InProcessServer(EngineWorker(default_model), NAME,
                          access=Access(api_key=KEY, allowed_hosts=("lab.school.example",),
                                        allowed_origins=("https://lab.school.example",))).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/v1/batch"),
                                         ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                         ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/tokenizer_info")])
def test_with_a_key_every_v1_route_needs_it(keyed, method, path):
    body = b'{"prompt": "Hi", "max_tokens": 1}' if method == "POST" else b""
    s, h, b = request(keyed, method, path, body)
    assert_openai_error(s, b, 401)
    assert b["error"]["code"] == "invalid_api_key" and h.get("www-authenticate") == "Bearer"
    s, _, b = request(keyed, method, path, body, {"Authorization": "Bearer wrong-key"})
    assert_openai_error(s, b, 401)
    s, _, b = request(keyed, method, path, body, {"Authorization": KEY})       # no "Bearer "
    assert_openai_error(s, b, 401)


def test_with_the_right_key_the_openai_client_is_served(keyed):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, timeout=TIMEOUT_S, max_retries=0)
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", timeout=TIMEOUT_S, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_health_and_metrics_stay_open_unless_metrics_are_protected(keyed, default_model):
    assert request(keyed, "GET", "/health")[0] == 200
    assert request(keyed, "GET", "/metrics")[0] == 200
    srv = InProcessServer(EngineWorker(default_model), NAME, access=Access(api_key=KEY, protect_metrics=True)).start()
    try:
        assert request(srv, "GET", "/health")[0] == 200
        s, _, b = request(srv, "GET", "/metrics")
        assert_openai_error(s, b, 401)
        assert request(srv, "GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    finally:
        srv.stop()


def test_without_a_key_every_route_is_open(server):
    assert request(server, "GET", "/v1/models")[0] == 200
    assert request(server, "GET", "/v1/batch")[0] == 200
    assert request(server, "GET", "/v1/models", headers={"Authorization": "Bearer anything"})[0] == 200


def test_a_foreign_host_name_is_refused(server, keyed):
    """DNS rebinding: a page on evil.example re-pointed at this machine sends Host: evil.example."""
    for srv, auth in ((server, {}), (keyed, {"Authorization": f"Bearer {KEY}"})):
        s, _, b = request(srv, "GET", "/v1/models", headers={"Host": "evil.example:8000", **auth})
        assert_openai_error(s, b, 403)
        assert b["error"]["code"] == "host_not_allowed"
        for ok in ("127.0.0.1", f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", "[::1]:8000", "10.1.2.3:8000"):
            assert request(srv, "GET", "/v1/models", headers={"Host": ok, **auth})[0] == 200, ok
    auth = {"Authorization": f"Bearer {KEY}"}
    assert request(keyed, "GET", "/v1/models", headers={"Host": "lab.school.example", **auth})[0] == 200
    assert request(server, "GET", "/health", headers={"Host": "evil.example"})[0] == 403


def test_a_cross_site_post_is_refused(server, keyed):
    """A web page elsewhere can POST text/plain to any address without a preflight: the browser adds Origin."""
    body = b'{"prompt": "Hi", "max_tokens": 1}'
    s, _, b = request(server, "POST", "/v1/completions", body,
                      {"Content-Type": "text/plain", "Origin": "https://evil.example"})
    assert_openai_error(s, b, 403)
    assert b["error"]["code"] == "origin_not_allowed"
    assert request(server, "POST", "/v1/completions", body, {"Origin": "null"})[0] == 403
    same = f"http://127.0.0.1:{server.port}"
    assert request(server, "POST", "/v1/completions", body, {"Origin": same})[0] == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    assert request(keyed, "POST", "/v1/completions", body, {"Origin": "https://lab.school.example", **auth})[0] == 200
    assert request(keyed, "POST", "/v1/completions", body, {"Origin": "https://evil.example", **auth})[0] == 403


def test_the_key_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert api_key_from(None) is None and api_key_from("") is None and api_key_from("k1") == "k1"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert api_key_from(None) == "from-env" and api_key_from("flag") == "flag"
    monkeypatch.setenv(API_KEY_ENV, "")
    assert api_key_from(None) is None


def test_engine_serve_takes_its_key_from_the_environment(default_gguf_path, monkeypatch):
    """`python -m engine serve` with INFERENCE_LAB_API_KEY set (as the app starts its own server) and
    --protect-metrics: /health open, /v1/models and /metrics keyed."""
    from server.process import EngineServerProcess
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with EngineServerProcess(extra_args=("--protect-metrics",)) as srv:
        def get(path, key=None):
            req = urllib.request.Request(srv.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
            try:
                with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
        assert get("/health") == 200
        assert get("/v1/models") == 401 and get("/v1/models", KEY) == 200
        assert get("/metrics") == 401 and get("/metrics", KEY) == 200
