"""The app's client of OpenAI-compatible servers (`server.backend`): each way a server can be unusable gives one
clear message, and the app keeps generating on its own engine. Servers here run in this process (no model files)."""
import http.server
import threading

import pytest

from engine import Model
from helpers_http import InProcessServer
from helpers_models import prompt, tiny
from server.backend import BackendConfig, BackendError, ReplyStream, parse_metrics, probe, read_live_batch, read_state
from server.process import free_port
from server.worker import EngineWorker

pytest.importorskip("openai")


@pytest.fixture(scope="module")
def ours():
    srv = InProcessServer(EngineWorker(Model.random(tiny(), seed=3)), model_name="tiny").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def not_openai():
    """A web server that answers every path with 404 (a plain file server, not an OpenAI API)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/nowhere"
    httpd.shutdown()


def test_probe_finds_our_server_and_its_model(ours):
    info = probe(BackendConfig(ours.url + "/v1/"))
    assert (info.model, info.models, info.engine) == ("tiny", ("tiny",), "ours")


def test_a_stream_returns_the_engines_greedy_tokens(ours):
    model, ids = ours.worker.model, prompt(5, seed=1)
    expected = [t.token_id for t in model.generate(ids, max_new_tokens=6, stop_at_eos=False)]
    got = [p.token_id for p in ReplyStream(BackendConfig(ours.url), "tiny", prompt=ids, max_tokens=6)
           if p.token_id is not None]
    assert got[:len(expected)] == expected[:len(got)] and len(got) >= 1


def test_sessions_streaming_at_once_share_one_client_and_each_gets_its_own_reply(ours):
    """Thirty sessions share one connection pool per server (building a client per request cost the app's
    process a TLS context each): concurrent streams through it must still each get their own prompt's tokens."""
    from server.backend import _client
    model = ours.worker.model
    prompts = [prompt(4 + i, seed=10 + i) for i in range(4)]
    expected = [[t.token_id for t in model.generate(ids, max_new_tokens=5, stop_at_eos=False)] for ids in prompts]
    got: dict[int, list[int]] = {}

    def one(i: int) -> None:
        got[i] = [p.token_id for p in ReplyStream(BackendConfig(ours.url), "tiny", prompt=prompts[i], max_tokens=5)
                  if p.token_id is not None]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, want in enumerate(expected):
        assert got[i] and got[i] == want[:len(got[i])], i
    assert _client(BackendConfig(ours.url)) is _client(BackendConfig(ours.url + "/v1/"))


def test_metrics_and_live_batch_reads_share_one_client(ours, monkeypatch):
    """The Class page reads /metrics and /v1/batch every second or two for every teacher tab: the reads go through
    one shared client (a client per read built a TLS context each time: 2 s of the app's CPU in a 30-session
    class). Counted: the HTTP clients built while ten reads run."""
    import httpx2

    from server.backend import _http
    built = []
    init = httpx2.Client.__init__
    monkeypatch.setattr(httpx2.Client, "__init__", lambda self, *a, **k: (built.append(1), init(self, *a, **k))[1])
    _http.cache_clear()
    cfg = BackendConfig(ours.url)
    for _ in range(5):
        assert read_state(cfg).running is not None
        assert read_live_batch(cfg) is not None
    assert len(built) == 1


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:9", "cannot reach"),                     # the discard port: nothing answers
    ("ftp://example", "not a server address"),
])
def test_unreachable_or_malformed_address(url, says):
    with pytest.raises(BackendError, match=says):
        probe(BackendConfig(url))


def test_a_server_that_is_not_openai_compatible(not_openai):
    with pytest.raises(BackendError, match="not an OpenAI-compatible server"):
        probe(BackendConfig(not_openai))


def test_a_wrong_model_name_lists_what_the_server_serves(ours):
    with pytest.raises(BackendError, match=r"does not serve a model named 'gpt-17'; it serves: tiny"):
        probe(BackendConfig(ours.url, model="gpt-17"))


def test_metrics_missing_or_in_another_format(not_openai):
    with pytest.raises(BackendError, match="no /metrics endpoint"):
        read_state(BackendConfig(not_openai))
    with pytest.raises(BackendError, match="not this app's live-batch document|no /v1/batch"):
        read_live_batch(BackendConfig(not_openai))
    with pytest.raises(BackendError, match="Prometheus"):
        parse_metrics("<html><body>metrics</body></html>")


def test_metrics_name_the_engine_and_read_vllms_names(ours):
    vllm_text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3.0\n'
                 '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
                 '# TYPE vllm:time_to_first_token_seconds histogram\n'
                 'vllm:time_to_first_token_seconds_sum{model_name="m"} 3.0\n'
                 'vllm:time_to_first_token_seconds_count{model_name="m"} 4.0\n')
    s = parse_metrics(vllm_text)
    assert (s.engine, s.running, s.kv_usage, s.mean_ttft_s) == ("vLLM", 3.0, 0.25, 0.75)
    assert parse_metrics("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n").engine == "SGLang"
    assert read_state(BackendConfig(ours.url), "ours").running == 0.0


def test_the_shared_metrics_client_keeps_no_cookie_one_session_received():
    """The client behind /metrics and /v1/batch serves every session: a cookie a server set in answer to one
    session's read must not go out with another's (expected: an empty jar after a Set-Cookie answer)."""
    import httpx2

    from server.backend import _http
    client = _http("http://127.0.0.1:9", "")
    answer = httpx2.Response(200, headers={"Set-Cookie": "session=alice; Path=/"},
                             request=httpx2.Request("GET", "http://127.0.0.1:9/metrics"))
    client.cookies.extract_cookies(answer)
    assert len(client.cookies.jar) == 0
    plain = httpx2.Client()                                  # a default client would have kept it
    plain.cookies.extract_cookies(answer)
    assert dict(plain.cookies) == {"session": "alice"}


@pytest.mark.parametrize("chat", [False, True])
def test_reply_stream_reads_completions_and_chat_events(chat):
    """The stream is read as server-sent events with json.loads (no SDK model built per token): every chunk's text,
    in order, and the finish reason on the last one, for both routes."""
    from helpers_fake_openai import FakeOpenAIServer, Script
    with FakeOpenAIServer(Script(ttft_s=0.0, itl_s=0.0)) as srv:
        cfg = BackendConfig(srv.url)
        kwargs = dict(messages=[{"role": "user", "content": "a b"}]) if chat else dict(prompt="a b")
        pieces = list(ReplyStream(cfg, "fake-model", max_tokens=3, **kwargs))
    assert [p.text for p in pieces] == [" t0", " t1", " t2"]
    assert [p.finish_reason for p in pieces] == [None, None, "length"] and all(p.token_id is None for p in pieces)


def test_an_error_event_mid_stream_is_one_clear_message():
    """Our server reports a failure after the stream began as `data: {"error": ...}`: a BackendError with its
    message, after the tokens that came before it."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"index": 0, "text": " a", "token_ids": [7]}]}\n\n'
                             b'data: {"error": {"message": "the engine failed on this batch"}}\n\n')

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        got = []
        with pytest.raises(BackendError, match="the engine failed on this batch"):
            for piece in ReplyStream(BackendConfig(f"http://127.0.0.1:{httpd.server_address[1]}"), "m", prompt="x"):
                got.append((piece.text, piece.token_id))
        assert got == [(" a", 7)]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_stream_outlives_its_client_leaving_the_cache(ours):
    """The shared clients live in a small cache: one evicted (a 17th server) or lost to a race is garbage, and the
    OpenAI SDK closes a collected client's connection pool, sockets in use included. A reply being read must keep
    its client: here the cache forgets every client mid-stream and the collector runs, and the reply still comes
    back whole (without the reference it failed with 'Bad file descriptor' or a closed stream)."""
    import gc
    from server.backend import _cached_client
    ids = prompt(6, seed=4)
    want = [t.token_id for t in ours.worker.model.generate(ids, max_new_tokens=6, stop_at_eos=False)]
    stream = ReplyStream(BackendConfig(ours.url), "tiny", prompt=ids, max_tokens=6)
    _cached_client.cache_clear()
    gc.collect()
    got = [p.token_id for p in stream if p.token_id is not None]
    assert got and got == want[:len(got)]


def test_sessions_asking_at_once_for_a_new_server_get_one_client(monkeypatch):
    """Thirty sessions pressing Generate at once against a server none has used yet: every one must get the same
    client (two built at once, the one the cache dropped would be collected and close its streams' sockets).
    The SDK's constructor is slowed so that all eight threads are inside it together."""
    import time
    import openai
    from server.backend import _cached_client, _client
    real = openai.OpenAI

    def slow(*a, **k):
        time.sleep(0.05)
        return real(*a, **k)

    monkeypatch.setattr(openai, "OpenAI", slow)
    _cached_client.cache_clear()
    cfg = BackendConfig("http://127.0.0.1:9/v1")
    barrier, got = threading.Barrier(8), []

    def one() -> None:
        barrier.wait()
        got.append(_client(cfg))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 8 and len({id(c) for c in got}) == 1
