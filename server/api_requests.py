"""OpenAI request bodies -> one checked `GenerationRequest`, or an `ApiError` that says what to change.

The fields follow OpenAI's API reference for /v1/completions and /v1/chat/completions (n, logprobs, top_logprobs,
echo, stop lists, presence/frequency penalties, seed, max_completion_tokens, a batch of prompts), plus vLLM's
extensions that load generators and evaluation harnesses send (`top_k`, `ignore_eos`, `return_token_ids`,
`add_special_tokens` for /tokenize). Fields this engine cannot honour (tools, logit_bias, suffix, a JSON
`response_format`, vLLM's guided decoding ...) are refused by name with a 400, never silently ignored.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ModelError

DEFAULT_COMPLETION_TOKENS = 16      # OpenAI's default max_tokens for /v1/completions
DEFAULT_CHAT_TOKENS = 256           # chat has no published default; a bound keeps a CPU server responsive
MAX_STOP_STRINGS = 32               # OpenAI allows 4, vLLM any number
MAX_STOP_CHARS = 1000               # the longest stop string (its text is held back while it may still match)
MAX_LOGPROBS = 20                   # as vLLM's default max_logprobs (OpenAI: 5 for completions, 20 for chat)
MAX_CHOICES = 64                    # prompts × n in one request
MAX_DEPTH = 64                      # JSON nesting a request may have (OpenAI's bodies need < 10)
SHOWN_CHARS = 60                    # how much of a bad value an error message repeats


class ApiError(Exception):
    """An HTTP error in OpenAI's shape: status, message, type, code."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    user: str | None = None
    n: int = 1                                    # choices per prompt
    logprobs: int | None = None                   # alternatives per token (0: only the chosen one); None: off
    echo: bool = False                            # completions: the prompt (and its logprobs) before the reply
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    prompts: list[list[int]] = field(default_factory=list)     # every prompt of a batch (prompt_ids: the first)
    prompt_texts: list[str | None] = field(default_factory=list)   # their text when sent as text (for echo)

    def choices(self) -> list[tuple[int, list[int], int | None]]:
        """(index, prompt ids, seed) of every choice: prompt by prompt, n each; seed + index keeps n samples
        of one seeded request different from each other and reproducible."""
        prompts = self.prompts or [self.prompt_ids]
        return [(i * self.n + j, ids, None if self.seed is None else (self.seed + i * self.n + j) % 2**32)
                for i, ids in enumerate(prompts) for j in range(self.n)]


def _show(v: Any) -> str:
    """A bad value as an error message repeats it: its repr (ASCII-safe for any string), cut short."""
    r = repr(v) if not isinstance(v, (list, dict)) or len(v) < 20 else f"<{type(v).__name__} of {len(v)} items>"
    return r if len(r) <= SHOWN_CHARS else r[:SHOWN_CHARS] + f"… ({len(r)} characters)"


# ============================================================================================ the body
def decode_body(raw: bytes) -> dict:
    """The request body as a JSON object whose every string is valid Unicode, nested at most MAX_DEPTH deep."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except ValueError as e:                       # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise ApiError(400, f"the request body is not valid JSON ({str(e)[:200]}); send a JSON object such as "
                            f'{{"model": "...", "prompt": "Hello", "max_tokens": 16}}') from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    _check_values(body)
    return body


def _check_values(body: dict) -> None:
    """Depth at most MAX_DEPTH, and no lone surrogate ("\\ud800" is valid JSON but not Unicode) in any string."""
    todo: list[tuple[Any, int, str | None]] = [(body, 1, None)]
    while todo:
        v, depth, top = todo.pop()
        if depth > MAX_DEPTH:
            raise ApiError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)", param=top)
        if isinstance(v, dict):
            for k, x in v.items():
                _check_text(k, top or k)
                todo.append((x, depth + 1, top or k))
        elif isinstance(v, list):
            todo.extend((x, depth + 1, top) for x in v)
        elif isinstance(v, str):
            _check_text(v, top)


def _check_text(s: str, param: str | None) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"'{param}'" if param and param.isascii() and param.isprintable() else "the request"
        raise ApiError(400, f"{where} holds a lone surrogate (U+{ord(s[e.start]):04X}), which is not valid "
                            f"Unicode; send UTF-8 text", param=param if where != "the request" else None) from None


def prompt_char_limit(model) -> int | None:
    """The most characters a prompt that fits the context window can have: no token covers more characters than
    the longest entry of the vocabulary spells (byte-level and SentencePiece pieces spell at least their text).
    Longer text is refused before it is tokenised. None when the model has no tokenizer."""
    tok = model.tokenizer
    if tok is None:
        return None
    longest = max((len(p) for p in tok.backend.get_vocab(with_added_tokens=True)), default=1)
    return model.config.max_position_embeddings * max(longest, 1)


def _check_chars(n_chars: int, limit: int | None, model, param: str) -> None:
    if limit is not None and n_chars > limit:
        ctx = model.config.max_position_embeddings
        raise ApiError(400, f"This model's maximum context length is {ctx} tokens; the {param} is {n_chars:,} "
                            f"characters, more than {ctx} tokens can hold (at most {limit:,}). Please reduce the "
                            f"{param}.", code="context_length_exceeded", param=param)


# ============================================================================================ fields
def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or not math.isfinite(v):
        raise ApiError(400, f"'{key}' must be a number between {lo:g} and {hi:g}, got {_show(v)}", param=key)
    return float(v)


def _integer(body: dict, key: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{key}' must be a whole number, got {_show(v)}", param=key)
    if v < lo or (hi is not None and v > hi):
        bound = f"≥ {lo}" if hi is None else f"between {lo} and {hi}"
        raise ApiError(400, f"'{key}' must be {bound}, got {_show(v)}", param=key)
    return v


def _flag(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {_show(v)}", param=key)
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    stops = [] if v is None else [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops) \
            or len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} strings, each of 1 to "
                            f"{MAX_STOP_CHARS} characters, got {_show(v)}", param="stop")
    return list(dict.fromkeys(stops))


# fields this server does not honour: refused by name when they ask for something (their "off" values pass)
UNSUPPORTED = {"suffix": "inserting text after the completion", "tools": "tool calls", "functions": "function calls",
               "logit_bias": "logit biases", "stop_token_ids": "stop token ids", "min_tokens": "a minimum length",
               "guided_json": "guided decoding", "guided_regex": "guided decoding", "guided_choice": "guided decoding",
               "guided_grammar": "guided decoding", "structured_outputs": "structured outputs",
               "prompt_logprobs": "vLLM's prompt_logprobs (use echo with logprobs)", "audio": "audio",
               "modalities": "modalities other than text", "prediction": "predicted outputs",
               "web_search_options": "web search"}
OFF = (None, False, 0, "", [], {}, "none", ["text"])


def _refuse_unsupported(body: dict) -> None:
    for key, what in UNSUPPORTED.items():
        if body.get(key) not in OFF:
            raise ApiError(400, f"'{key}' is not supported by this server ({what}); leave it out", param=key)
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise ApiError(400, "'tool_choice' is not supported by this server (no tool calls); leave it out",
                       param="tool_choice")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise ApiError(400, f"'response_format' {_show(fmt)} is not supported by this server (only "
                            f"{{\"type\": \"text\"}}: no JSON mode or schema)", param="response_format")
    if _number(body, "repetition_penalty", 1.0, 0.0, 100.0) != 1.0:
        raise ApiError(400, "'repetition_penalty' is not supported by this server (use presence_penalty or "
                            "frequency_penalty)", param="repetition_penalty")


def check_model(body: dict, model_name: str) -> None:
    """'model' may be left out (the one model served) or must name it."""
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise ApiError(400, f"'model' must be a string (the served model's name), got {_show(name)}", param="model")
    if name != model_name:
        raise ApiError(404, f"The model {_show(name)} does not exist. This server serves one model: `{model_name}` "
                            f"(GET /v1/models lists it)", code="model_not_found", param="model",
                       kind="not_found_error")


# ============================================================================================ prompts
def _prompt_ids(prompt: Any, model, char_limit: int | None) -> list[int]:
    """One prompt as token ids: a string is tokenized; a list of ints is taken as ids (checked against the
    vocabulary)."""
    ctx = model.config.max_position_embeddings
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ApiError(400, f"{model.name} has no tokenizer: send the prompt as a list of token ids",
                           param="prompt")
        _check_chars(len(prompt), char_limit, model, "prompt")
        ids = _encode(model, prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if len(prompt) >= ctx:
            raise ApiError(400, f"This model's maximum context length is {ctx} tokens; the prompt has "
                                f"{len(prompt)} tokens. Please reduce the prompt.",
                           code="context_length_exceeded", param="prompt")
        bad = [t for t in prompt if not 0 <= t < model.config.vocab_size]
        if bad:
            raise ApiError(400, f"token id {_show(bad[0])} is outside the vocabulary (0 to "
                                f"{model.config.vocab_size - 1})", param="prompt")
        ids = list(prompt)
    else:
        raise ApiError(400, "'prompt' must be a string, a list of token ids, or a list of several of either",
                       param="prompt")
    if not ids:
        raise ApiError(400, "the prompt is empty: send at least one token", param="prompt")
    return ids


def _encode(model, text: str, param: str) -> list[int]:
    try:
        return model.encode_prompt(text)
    except ModelError as e:
        raise ApiError(400, str(e), param=param) from None


def _check_length(ids: list[int], max_tokens: int, model) -> None:
    ctx = model.config.max_position_embeddings
    if len(ids) + max_tokens > ctx:
        raise ApiError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} in the "
                            f"completion). Please reduce the prompt or max_tokens.",
                       code="context_length_exceeded", param="max_tokens")


def _logprobs(body: dict, chat: bool) -> int | None:
    """Completions: logprobs = k alternatives (0..20). Chat: logprobs = true, top_logprobs = k alternatives."""
    if not chat:
        return _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    wanted = _flag(body, "logprobs")
    top = _integer(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def _fields(body: dict, chat: bool = False) -> GenerationRequest:
    """Every field but the prompt, checked before any tokenising (a bad field costs nothing)."""
    _refuse_unsupported(body)
    echo = _flag(body, "echo")
    if echo and chat:
        raise ApiError(400, "'echo' is supported on /v1/completions only", param="echo")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, None, 0 if echo else 1)      # echo with 0 tokens: score the prompt only
    n = _integer(body, "n", 1, 1, MAX_CHOICES)
    best_of = _integer(body, "best_of", None, 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise ApiError(400, "'best_of' is not supported by this server (only equal to n)", param="best_of")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object such as {\"include_usage\": true}",
                       param="stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")
    return GenerationRequest(
        prompt_ids=[], max_tokens=-1 if max_tokens is None else max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0), top_k=max(0, _integer(body, "top_k", 0, -1) or 0),
        seed=_integer(body, "seed", None, 0, 2**32 - 1), stop=_stop(body), stream=_flag(body, "stream"),
        include_usage=_flag(opts, "include_usage"), ignore_eos=_flag(body, "ignore_eos"),
        return_token_ids=_flag(body, "return_token_ids"), user=user or None, n=n,
        logprobs=_logprobs(body, chat), echo=echo,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0))


def _with_prompts(req: GenerationRequest, prompts: list[list[int]], model, default_tokens: int
                  ) -> GenerationRequest:
    ctx = model.config.max_position_embeddings
    req.prompts, req.prompt_ids = prompts, prompts[0]
    if req.max_tokens < 0:
        req.max_tokens = max(1, min(default_tokens, ctx - max(len(p) for p in prompts)))
    for ids in prompts:
        _check_length(ids, req.max_tokens, model)
    if len(prompts) * req.n > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts × n = {req.n} is {len(prompts) * req.n} choices; this server "
                            f"returns at most {MAX_CHOICES} per request", param="n")
    return req


def _batch(prompt: Any) -> list:
    """OpenAI's prompt: a string, a list of token ids, or a list of several of either (a batch)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_CHOICES:
            raise ApiError(400, f"at most {MAX_CHOICES} prompts per request, got {len(prompt)}", param="prompt")
        return prompt
    return [prompt]


def parse_completion(body: dict, model, model_name: str, char_limit: int | None = None) -> GenerationRequest:
    check_model(body, model_name)
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required (a string or a list of token ids)", param="prompt")
    req = _fields(body)
    batch = _batch(body["prompt"])
    if char_limit is not None:
        _check_chars(sum(len(p) for p in batch if isinstance(p, str)), char_limit * len(batch), model, "prompt")
    req.prompt_texts = [p if isinstance(p, str) else None for p in batch]
    return _with_prompts(req, [_prompt_ids(p, model, char_limit) for p in batch], model, DEFAULT_COMPLETION_TOKENS)


def _content(m: Any) -> str | None:
    """A message's text: a string, or OpenAI's list of parts [{"type": "text", "text": "..."}] joined."""
    c = m.get("content") if isinstance(m, dict) else None
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return "".join(p["text"] for p in c)
    return None


def chat_messages(body: dict) -> list[dict]:
    """'messages' as [{"role", "content"}] with text content, or an ApiError saying what is wrong."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' is required: a list such as [{\"role\": \"user\", \"content\": \"Hi\"}]",
                       param="messages")
    out = []
    for m in messages:
        text = _content(m)
        if text is None or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message needs a 'role' (a string) and a text 'content' (a string or a list "
                                "of {\"type\": \"text\", \"text\": ...} parts)", param="messages")
        out.append({"role": m["role"], "content": text})
    return out


def chat_prompt(model, messages: list[dict], char_limit: int | None) -> list[int]:
    """The messages through the model's chat template, tokenised (the template's own text is small)."""
    if model.tokenizer is None or not model.tokenizer.has_chat_template:
        raise ApiError(400, f"{model.name} has no chat template; use /v1/completions", param="messages")
    _check_chars(sum(len(m["content"]) for m in messages), char_limit, model, "messages")
    try:
        text = model.tokenizer.apply_chat_template(messages)
    except ModelError as e:
        raise ApiError(400, str(e), param="messages") from None
    return _encode(model, text, "messages")


def parse_chat(body: dict, model, model_name: str, char_limit: int | None = None) -> GenerationRequest:
    check_model(body, model_name)
    messages = chat_messages(body)
    req = _fields(body, chat=True)
    return _with_prompts(req, [chat_prompt(model, messages, char_limit)], model, DEFAULT_CHAT_TOKENS)


# ============================================================================================ tokenize
def parse_tokenize(body: dict, model, model_name: str, char_limit: int | None = None) -> dict:
    """vLLM's POST /tokenize: {"prompt": text, "add_special_tokens": true} or {"messages": [...],
    "add_generation_prompt": true} -> {"count", "max_model_len", "tokens", "token_strs"}."""
    check_model(body, model_name)
    tok = model.tokenizer
    if tok is None:
        raise ApiError(400, f"{model.name} has no tokenizer", param="prompt")
    special = _flag_default(body, "add_special_tokens", "messages" not in body)
    if "messages" in body:
        messages = chat_messages(body)
        if not tok.has_chat_template:
            raise ApiError(400, f"{model.name} has no chat template; send 'prompt'", param="messages")
        _check_chars(sum(len(m["content"]) for m in messages), char_limit, model, "messages")
        try:
            text = tok.apply_chat_template(messages,
                                           add_generation_prompt=_flag_default(body, "add_generation_prompt", True))
        except ModelError as e:
            raise ApiError(400, str(e), param="messages") from None
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise ApiError(400, "'prompt' (a string) or 'messages' is required", param="prompt")
        _check_chars(len(text), char_limit, model, "prompt")
    try:
        ids = tok.encode(text, add_bos=None if special else False)
    except ModelError as e:
        raise ApiError(400, str(e), param="prompt") from None
    strs = [tok.token_bytes(i).decode("utf-8", errors="replace") for i in ids] \
        if _flag(body, "return_token_strs") else None
    return {"count": len(ids), "max_model_len": model.config.max_position_embeddings, "tokens": ids,
            "token_strs": strs}


def parse_detokenize(body: dict, model, model_name: str, char_limit: int | None = None) -> dict:
    """vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
    check_model(body, model_name)
    ids = body.get("tokens")
    V = model.config.vocab_size
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, "'tokens' must be a list of token ids", param="tokens")
    if len(ids) > model.config.max_position_embeddings * 4:
        raise ApiError(400, f"at most {model.config.max_position_embeddings * 4} tokens per request", param="tokens")
    bad = [t for t in ids if not 0 <= t < V]
    if bad:
        raise ApiError(400, f"token id {_show(bad[0])} is outside the vocabulary (0 to {V - 1})", param="tokens")
    if model.tokenizer is None:
        raise ApiError(400, f"{model.name} has no tokenizer", param="tokens")
    return {"prompt": model.tokenizer.decode(ids)}


def _flag_default(body: dict, key: str, default: bool) -> bool:
    return _flag(body, key) if body.get(key) is not None else default
