"""The OpenAI fields real clients send (logprobs, top_logprobs, echo, n, stop lists, penalties, seed,
max_completion_tokens) and vLLM's /tokenize and /detokenize, over real HTTP (an in-process uvicorn over the
default model).

Expected values come from the model run directly in this process: log-probabilities are a float64 log-softmax of
`model.logits` (a full causal forward, no paged cache, no batch), penalties from a greedy loop written here from
OpenAI's formula; never from the server's code."""
import http.client
import json

import numpy as np
import pytest

from engine.serve.prompt_logprobs import prompt_logprobs
from helpers_http import InProcessServer
from server.worker import EngineWorker

TIMEOUT_S = 120
NAME = "smollm2"
TOL = 1e-4           # the paged, batched forward against the plain one: float32 rounding only


@pytest.fixture(scope="module")
def server(default_model):
    srv = InProcessServer(EngineWorker(default_model), NAME).start()
    yield srv
    srv.stop()


def post(srv, body, path="/v1/completions"):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=TIMEOUT_S)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
    finally:
        c.close()
    if body.get("stream"):
        return r.status, [json.loads(ln[6:]) for ln in raw.decode().splitlines()
                          if ln.startswith("data: {")]
    return r.status, json.loads(raw)


def ok(srv, body, path="/v1/completions"):
    status, out = post(srv, body, path)
    assert status == 200, out
    return out


def log_softmax_rows(logits):
    """Brute force: log(exp(z) / Σ exp(z)) in float64, per row."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def next_logprobs(model, ids):
    return log_softmax_rows(model.logits(ids))[-1]


def piece(model, token_id):
    return model.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def top(lp, k):
    order = np.lexsort((np.arange(lp.size), -lp))
    return [int(i) for i in order[:k]]


# ============================================================================================ logprobs
def test_completion_logprobs_are_the_log_softmax_of_the_models_logits(server, default_model):
    prompt = "The capital of France is"
    ids = default_model.tokenizer.encode(prompt)
    out = ok(server, {"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3,
                      "return_token_ids": True, "ignore_eos": True})
    ch = out["choices"][0]
    gen, lp = ch["token_ids"], ch["logprobs"]
    assert len(gen) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    offset = 0
    for k, tok in enumerate(gen):
        ref = next_logprobs(default_model, ids + gen[:k])
        assert lp["token_logprobs"][k] == pytest.approx(ref[tok], abs=TOL)
        assert lp["tokens"][k] == piece(default_model, tok)
        want = {piece(default_model, i): ref[i] for i in top(ref, 3)}
        assert set(lp["top_logprobs"][k]) == set(want)
        for t, v in want.items():
            assert lp["top_logprobs"][k][t] == pytest.approx(v, abs=TOL)
        assert lp["text_offset"][k] == offset
        offset += len(lp["tokens"][k])
    assert "".join(lp["tokens"]) == ch["text"]


def test_logprobs_are_the_models_whatever_the_sampler_does(server, default_model):
    """At temperature 1.5 with top_k 5, the sampled token's logprob is still the model's own (temperature 1,
    no filter), as vLLM reports it."""
    ids = default_model.tokenizer.encode("Once upon a time")
    out = ok(server, {"prompt": ids, "max_tokens": 3, "temperature": 1.5, "top_k": 5, "seed": 11, "logprobs": 0,
                      "return_token_ids": True, "ignore_eos": True})
    ch = out["choices"][0]
    for k, tok in enumerate(ch["token_ids"]):
        ref = next_logprobs(default_model, ids + ch["token_ids"][:k])
        assert ch["logprobs"]["token_logprobs"][k] == pytest.approx(ref[tok], abs=TOL)
        assert ch["logprobs"]["top_logprobs"][k] == {piece(default_model, tok): pytest.approx(ref[tok], abs=TOL)}


def test_chat_logprobs_in_openai_shape(server, default_model):
    messages = [{"role": "user", "content": "Name a colour."}]
    ids = default_model.tokenizer.encode(default_model.tokenizer.apply_chat_template(messages))
    out = ok(server, {"messages": messages, "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 2,
                      "return_token_ids": True, "ignore_eos": True}, "/v1/chat/completions")
    ch = out["choices"][0]
    content = ch["logprobs"]["content"]
    assert len(content) == 3
    for k, (entry, tok) in enumerate(zip(content, ch["token_ids"])):
        ref = next_logprobs(default_model, ids + ch["token_ids"][:k])
        raw = default_model.tokenizer.token_bytes(tok)
        assert entry["token"] == piece(default_model, tok) and entry["bytes"] == list(raw)
        assert entry["logprob"] == pytest.approx(ref[tok], abs=TOL)
        assert [e["bytes"] for e in entry["top_logprobs"]] == [list(default_model.tokenizer.token_bytes(i))
                                                             for i in top(ref, 2)]
        assert [e["logprob"] for e in entry["top_logprobs"]] == pytest.approx([ref[i] for i in top(ref, 2)],
                                                                             abs=TOL)
    plain = ok(server, {"messages": messages, "max_tokens": 3, "temperature": 0}, "/v1/chat/completions")
    assert plain["choices"][0]["logprobs"] is None


def test_streamed_logprobs_match_the_whole_reply(server):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    whole = ok(server, body)["choices"][0]["logprobs"]
    chunks = ok(server, {**body, "stream": True})
    got = [c["choices"][0]["logprobs"] for c in chunks if c.get("choices")]
    assert sum((g["tokens"] for g in got), []) == whole["tokens"]
    assert sum((g["text_offset"] for g in got), []) == whole["text_offset"]
    assert sum((g["token_logprobs"] for g in got), []) == pytest.approx(whole["token_logprobs"], abs=TOL)


# ============================================================================================ echo
def test_echo_scores_the_prompt_as_lm_eval_asks(server, default_model):
    """lm-evaluation-harness's loglikelihood: prompt = token ids (a batch), echo, logprobs 1, max_tokens 1; it
    reads token_logprobs[ctxlen:-1]. Each prompt token's log p given the tokens before it, the first none."""
    tok = default_model.tokenizer
    prompts = [tok.encode("Paris is the capital of France"), tok.encode("The sky is green and the grass")]
    out = ok(server, {"prompt": prompts, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True})
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for ids, ch in zip(prompts, out["choices"]):
        lp = ch["logprobs"]
        ref = log_softmax_rows(default_model.logits(ids))              # [T, V]: row i predicts token i + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["token_logprobs"]) == len(ids) + 1              # the prompt, then the one generated token
        for i in range(1, len(ids)):
            assert lp["token_logprobs"][i] == pytest.approx(ref[i - 1, ids[i]], abs=TOL)
            best = top(ref[i - 1], 1)[0]
            assert piece(default_model, best) in lp["top_logprobs"][i]
        assert lp["tokens"][:len(ids)] == [piece(default_model, t) for t in ids]
        assert lp["token_logprobs"][-1] == pytest.approx(ref[-1].max(), abs=TOL)    # greedy: the top token
        assert ch["text"].startswith(tok.decode(ids))
    assert out["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)


def test_echo_with_no_new_tokens_returns_the_prompt_alone(server, default_model):
    ids = default_model.tokenizer.encode("A quick brown fox")
    for stream in (False, True):
        out = ok(server, {"prompt": "A quick brown fox", "max_tokens": 0, "echo": True, "logprobs": 0,
                          "stream": stream})
        ch = out["choices"][0] if not stream else out[0]["choices"][0]
        assert ch["text"] == "A quick brown fox" and ch["finish_reason"] == "length"
        assert len(ch["logprobs"]["token_logprobs"]) == len(ids)
    status, err = post(server, {"prompt": "Hi", "max_tokens": 0})          # 0 tokens without echo: nothing to do
    assert status == 400 and err["error"]["param"] == "max_tokens"


def test_prompt_logprobs_do_not_depend_on_the_chunk(default_model):
    ids = default_model.tokenizer.encode("One two three four five six seven eight nine ten")
    ref = log_softmax_rows(default_model.logits(ids))
    for chunk in (1, 3, 128):
        got = prompt_logprobs(default_model, ids, top=2, chunk=chunk)
        assert got[0] is None and len(got) == len(ids)
        assert [g[0] for g in got[1:]] == pytest.approx([ref[i - 1, ids[i]] for i in range(1, len(ids))], abs=TOL)
        assert [g[1][0][0] for g in got[1:]] == [top(ref[i - 1], 1)[0] for i in range(1, len(ids))]


# ============================================================================================ n, seed, lengths
def greedy_text(model, prompt, n):
    return "".join(t.text for t in model.generate(prompt, max_new_tokens=n, temperature=0.0, stop_at_eos=False))


def test_n_choices(server, default_model):
    out = ok(server, {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "n": 3, "ignore_eos": True})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert {c["text"] for c in out["choices"]} == {greedy_text(default_model, "Once upon a time", 5)}
    assert out["usage"]["completion_tokens"] == 15
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "n": 2, "seed": 5,
            "ignore_eos": True}
    a, b = ok(server, body), ok(server, body)
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]         # seeded: reproducible
    assert a["choices"][0]["text"] != a["choices"][1]["text"]                             # two different samples
    chunks = ok(server, {**body, "stream": True})
    streamed = {0: "", 1: ""}
    for c in chunks:
        for ch in c["choices"]:
            streamed[ch["index"]] += ch["text"]
    assert [streamed[0], streamed[1]] == [c["text"] for c in a["choices"]]


def test_seed_and_max_completion_tokens(server):
    body = {"prompt": "Tell me about cats", "max_completion_tokens": 7, "temperature": 2.0, "ignore_eos": True}
    a = ok(server, {**body, "seed": 7})
    assert a["usage"]["completion_tokens"] == 7
    assert ok(server, {**body, "seed": 7})["choices"][0]["text"] == a["choices"][0]["text"]
    assert ok(server, {**body, "seed": 8})["choices"][0]["text"] != a["choices"][0]["text"]
    chat = ok(server, {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 4,
                       "ignore_eos": True}, "/v1/chat/completions")
    assert chat["usage"]["completion_tokens"] == 4


# ============================================================================================ stop lists
def test_a_list_of_stop_strings_ends_the_text_before_the_first_match(server, default_model):
    prompt = "The history of the Roman empire"
    full = greedy_text(default_model, prompt, 24)
    stop = full[len(full) // 2:len(full) // 2 + 4]
    cut = full[:full.find(stop)]
    stops = ["zq#1", "zq#2", "\u2603\u2603", "QQQQQ", "xx-yy", stop]           # six: more than OpenAI's four
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": stops, "ignore_eos": True}
    ch = ok(server, body)["choices"][0]
    assert ch["text"] == cut and ch["finish_reason"] == "stop"
    text = ""
    for c in ok(server, {**body, "stream": True}):
        for choice in c["choices"]:
            text += choice["text"]
            assert stop not in text
    assert text == cut


# ============================================================================================ penalties
def penalised_greedy(model, ids, n, presence, frequency):
    """OpenAI's formula by hand: logit[j] − c[j]·frequency − [c[j] > 0]·presence over generated tokens."""
    gen = []
    for _ in range(n):
        z = np.asarray(model.logits(ids + gen)[-1], np.float64)
        for t in set(gen):
            z[t] -= gen.count(t) * frequency + presence
        gen.append(int(np.argmax(z)))
    return gen


def test_presence_and_frequency_penalties(server, default_model):
    ids = default_model.tokenizer.encode("one two one two one two one two one")
    plain = penalised_greedy(default_model, ids, 10, 0.0, 0.0)
    for presence, frequency in ((1.5, 0.0), (0.0, 1.2), (0.8, 0.6)):
        want = penalised_greedy(default_model, ids, 10, presence, frequency)
        assert want != plain                                          # the penalties change this reply
        out = ok(server, {"prompt": ids, "max_tokens": 10, "temperature": 0, "presence_penalty": presence,
                          "frequency_penalty": frequency, "ignore_eos": True, "return_token_ids": True})
        assert out["choices"][0]["token_ids"] == want, (presence, frequency)


# ============================================================================================ tokenize
def test_tokenize_and_detokenize_as_vllm(server, default_model):
    tok = default_model.tokenizer
    text = "Héllo wörld, 日本語 🙂"
    out = ok(server, {"model": NAME, "prompt": text}, "/tokenize")
    assert out["tokens"] == tok.encode(text) and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == default_model.config.max_position_embeddings and out["token_strs"] is None
    assert ok(server, {"prompt": text, "return_token_strs": True}, "/tokenize")["token_strs"] == \
        [tok.token_bytes(i).decode("utf-8", errors="replace") for i in out["tokens"]]
    assert ok(server, {"tokens": out["tokens"]}, "/detokenize") == {"prompt": tok.decode(out["tokens"])}
    messages = [{"role": "user", "content": "Hi"}]
    chat = ok(server, {"messages": messages}, "/tokenize")
    assert chat["tokens"] == tok.encode(tok.apply_chat_template(messages))
    for path, body in (("/tokenize", {}), ("/tokenize", {"prompt": "a\ud800"}), ("/detokenize", {"tokens": [-1]}),
                       ("/detokenize", {"tokens": "12"})):
        status, err = post(server, body, path)
        assert status == 400 and err["error"]["message"], (path, body)


def test_tokenizer_info_as_vllm_gives_what_lm_eval_reads(server, default_model):
    """lm-eval's local-completions tokenizes through the server when GET /tokenizer_info and POST /tokenize
    answer; it takes eos/bos ids as the first token of their strings. Expected: SmolLM2-135M-Instruct's published
    tokenizer_config.json (bos <|im_start|>, eos and pad <|im_end|>, unk <|endoftext|>; ids 1 and 2)."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT_S)
    try:
        c.request("GET", "/tokenizer_info")
        r = c.getresponse()
        status, info = r.status, json.loads(r.read())
    finally:
        c.close()
    assert status == 200, info
    assert (info["bos_token"], info["eos_token"], info["pad_token"], info["unk_token"]) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert info["chat_template"] == default_model.tokenizer.chat_template and info["add_bos_token"] is False
    assert info["model_max_length"] == 8192
    first = [ok(server, {"prompt": info[k], "add_special_tokens": False}, "/tokenize")["tokens"][0]
             for k in ("bos_token", "eos_token")]
    assert first == [1, 2]


# ============================================================================================ refused by name
@pytest.mark.parametrize("path,extra,param", [
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
    ("/v1/completions", {"logit_bias": {"50": 10}}, "logit_bias"),
    ("/v1/completions", {"suffix": "The end."}, "suffix"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"n": 65}, "n"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"repetition_penalty": 1.3}, "repetition_penalty"),
    ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/completions", {"stop": ["x"] * 33}, "stop"),
    ("/v1/completions", {"stop": "y" * 1001}, "stop"),
    ("/v1/completions", {"guided_json": {"type": "object"}}, "guided_json"),
])
def test_what_is_not_supported_is_a_400_naming_the_field(server, path, extra, param):
    base = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    status, err = post(server, {**base, "max_tokens": 2, **extra}, path)
    assert status == 400 and err["error"]["param"] == param, err
    assert param in err["error"]["message"]


def test_a_text_response_format_and_off_values_are_accepted(server):
    for extra in ({"response_format": {"type": "text"}}, {"logit_bias": {}}, {"tools": []}, {"tool_choice": "none"},
                  {"best_of": 1}, {"repetition_penalty": 1.0}):
        assert post(server, {"prompt": "Hi", "max_tokens": 1, **extra})[0] == 200, extra
