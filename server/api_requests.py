"""OpenAI request bodies -> one checked `GenerationRequest`, or an `ApiError` that says what to change.

The fields follow OpenAI's API reference for /v1/completions and /v1/chat/completions, plus vLLM's extensions that
load generators send (`top_k`, `ignore_eos`, `return_token_ids`). Fields this engine cannot honour (n > 1, logprobs,
echo, tools, penalties other than 0) are refused by name rather than silently ignored.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ModelError

DEFAULT_COMPLETION_TOKENS = 16      # OpenAI's default max_tokens for /v1/completions
DEFAULT_CHAT_TOKENS = 256           # chat has no published default; a bound keeps a CPU server responsive
MAX_STOP_STRINGS = 4                # as OpenAI
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
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them, "
                            f"got {_show(v)}", param="stop")
    return stops


def _refuse_unsupported(body: dict) -> None:
    if _integer(body, "n", 1, 1) != 1:
        raise ApiError(400, "'n' must be 1: this server returns one choice per request (send n requests instead)",
                       param="n")
    for key in ("logprobs", "top_logprobs", "echo", "suffix", "tools", "functions", "logit_bias", "best_of"):
        v = body.get(key)
        if v not in (None, False, 0, 1 if key == "best_of" else None, [], {}):
            raise ApiError(400, f"'{key}' is not supported by this server; leave it out", param=key)
    for key in ("presence_penalty", "frequency_penalty"):
        if _number(body, key, 0.0, -2.0, 2.0) != 0.0:
            raise ApiError(400, f"'{key}' is not supported by this server (only 0)", param=key)


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
    """The prompt as token ids: a string is tokenized; a list of ints is taken as ids (checked against the
    vocabulary); a one-element list of either is unwrapped (OpenAI allows batches; this server takes one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
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
        raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)",
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


def _fields(body: dict) -> GenerationRequest:
    """Every field but the prompt, checked before any tokenising (a bad field costs nothing)."""
    _refuse_unsupported(body)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, None, 1)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object such as {\"include_usage\": true}",
                       param="stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")
    return GenerationRequest(
        prompt_ids=[], max_tokens=max_tokens or 0, temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0), top_k=max(0, _integer(body, "top_k", 0, -1) or 0),
        seed=_integer(body, "seed", None, 0, 2**32 - 1), stop=_stop(body), stream=_flag(body, "stream"),
        include_usage=_flag(opts, "include_usage"), ignore_eos=_flag(body, "ignore_eos"),
        return_token_ids=_flag(body, "return_token_ids"), user=user or None)


def _with_prompt(req: GenerationRequest, ids: list[int], model, default_tokens: int) -> GenerationRequest:
    ctx = model.config.max_position_embeddings
    req.prompt_ids = ids
    if not req.max_tokens:
        req.max_tokens = max(1, min(default_tokens, ctx - len(ids)))
    _check_length(ids, req.max_tokens, model)
    return req


def parse_completion(body: dict, model, model_name: str, char_limit: int | None = None) -> GenerationRequest:
    check_model(body, model_name)
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required (a string or a list of token ids)", param="prompt")
    req = _fields(body)
    return _with_prompt(req, _prompt_ids(body["prompt"], model, char_limit), model, DEFAULT_COMPLETION_TOKENS)


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
    req = _fields(body)
    return _with_prompt(req, chat_prompt(model, messages, char_limit), model, DEFAULT_CHAT_TOKENS)
