"""The engine as an OpenAI-compatible server, driven by the real `openai` client over HTTP (loopback).

Expected texts come from `Model.generate` run in this process (greedy), not from the server's code."""
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from server.serve_cli import DEFAULT_SERVED_NAME as MODEL

openai = pytest.importorskip("openai")
PROMPT = "Once upon a time"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def greedy(model, prompt, n):
    return "".join(t.text for t in model.generate(prompt, max_new_tokens=n, temperature=0.0))


def chat_prompt(model):
    return model.tokenizer.apply_chat_template(QUESTION)


def get_json(server, path):
    with urllib.request.urlopen(server.url + path, timeout=60) as r:
        return json.loads(r.read())


def metric(server, name):
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{"))


# ============================================================================================ the four calls
def test_completion_is_the_engines_greedy_text(client, default_model):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.choices[0].text == greedy(default_model, PROMPT, 6)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(default_model.tokenizer.encode(PROMPT)), 6)


def test_streamed_completion_adds_up_to_the_same_text(client, default_model):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == greedy(default_model, PROMPT, 6)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_uses_the_models_chat_template(client, default_model):
    expected = greedy(default_model, chat_prompt(default_model), 5)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == 5


def test_models_health_and_vllm_metric_names(client, engine_server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)   # alone, it counts its own
    with urllib.request.urlopen(engine_server.url + "/health", timeout=30) as r:
        assert r.status == 200
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:generation_tokens_total"):
        metric(engine_server, name)             # present (sum over no lines would still be 0: check below)
    assert metric(engine_server, "vllm:generation_tokens_total") > 0


# ============================================================================================ batching
def test_concurrent_requests_share_a_batch(client, engine_server):
    most = [0.0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            most[0] = max(most[0], metric(engine_server, "vllm:num_requests_running"))
            time.sleep(0.05)

    def one(i):
        list(client.completions.create(model=MODEL, prompt=f"Story number {i}:", max_tokens=12, temperature=0,
                                       stream=True))

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert most[0] > 1                                      # the metrics saw several requests in one batch


def _pool_is_free(server, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        b = get_json(server, "/v1/batch")
        if not b["requests"] and b["free_blocks"] == b["num_blocks"]:
            return b
        time.sleep(0.2)
    raise AssertionError(f"blocks still held after {timeout_s} s: {b}")


def test_a_client_that_hangs_up_frees_its_blocks(client, engine_server):
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4000, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    held = get_json(engine_server, "/v1/batch")
    assert held["requests"] and held["free_blocks"] < held["num_blocks"]     # it was holding blocks
    stream.close()                                                           # the client goes away
    b = _pool_is_free(engine_server)
    assert b["free_blocks"] == b["num_blocks"]


# ============================================================================================ bad requests
def _raw_post(server, body: bytes):
    req = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    raise AssertionError("the malformed request was accepted")


def test_bad_requests_get_4xx_with_a_message_and_the_server_keeps_serving(client, engine_server, default_model):
    code, body = _raw_post(engine_server, b'{"model": "smollm2", "prompt": ')
    assert code == 400 and "not valid JSON" in body["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-17", prompt=PROMPT, max_tokens=2)
    ctx = default_model.config.max_position_embeddings
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=[1] * ctx, max_tokens=8)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-1)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)   # still serving
    assert r.choices[0].text == greedy(default_model, PROMPT, 3)
