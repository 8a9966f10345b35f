"""OpenAI request bodies -> one checked `GenerationRequest`, or an `ApiError` that says what to change.

The fields follow OpenAI's API reference for /v1/completions and /v1/chat/completions, plus vLLM's extensions that
load generators send (`top_k`, `ignore_eos`, `return_token_ids`). Fields this engine cannot honour (n > 1, logprobs,
echo, tools, penalties other than 0) are refused by name rather than silently ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ModelError

DEFAULT_COMPLETION_TOKENS = 16      # OpenAI's default max_tokens for /v1/completions
DEFAULT_CHAT_TOKENS = 256           # chat has no published default; a bound keeps a CPU server responsive
MAX_STOP_STRINGS = 4                # as OpenAI


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


# ============================================================================================ fields
def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ApiError(400, f"'{key}' must be a number between {lo:g} and {hi:g}, got {v!r}", param=key)
    return float(v)


def _integer(body: dict, key: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{key}' must be a whole number, got {v!r}", param=key)
    if v < lo or (hi is not None and v > hi):
        bound = f"≥ {lo}" if hi is None else f"between {lo} and {hi}"
        raise ApiError(400, f"'{key}' must be {bound}, got {v}", param=key)
    return v


def _flag(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {v!r}", param=key)
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    stops = [] if v is None else [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them, "
                            f"got {v!r}", param="stop")
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
    if not isinstance(name, str) or name != model_name:
        raise ApiError(404, f"The model `{name}` does not exist. This server serves one model: `{model_name}` "
                            f"(GET /v1/models lists it)", code="model_not_found", param="model",
                       kind="not_found_error")


# ============================================================================================ prompts
def _prompt_ids(prompt: Any, model) -> list[int]:
    """The prompt as token ids: a string is tokenized; a list of ints is taken as ids (checked against the
    vocabulary); a one-element list of either is unwrapped (OpenAI allows batches; this server takes one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ApiError(400, f"{model.name} has no tokenizer: send the prompt as a list of token ids",
                           param="prompt")
        ids = model.encode_prompt(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < model.config.vocab_size]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0 to {model.config.vocab_size - 1})",
                           param="prompt")
        ids = list(prompt)
    else:
        raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)",
                       param="prompt")
    if not ids:
        raise ApiError(400, "the prompt is empty: send at least one token", param="prompt")
    return ids


def _check_length(ids: list[int], max_tokens: int, model) -> None:
    ctx = model.config.max_position_embeddings
    if len(ids) + max_tokens > ctx:
        raise ApiError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} in the "
                            f"completion). Please reduce the prompt or max_tokens.",
                       code="context_length_exceeded", param="max_tokens")


def _common(body: dict, ids: list[int], model, default_tokens: int) -> GenerationRequest:
    _refuse_unsupported(body)
    ctx = model.config.max_position_embeddings
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, None, 1)
    if max_tokens is None:
        max_tokens = max(1, min(default_tokens, ctx - len(ids)))
    _check_length(ids, max_tokens, model)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object such as {\"include_usage\": true}",
                       param="stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")
    return GenerationRequest(
        prompt_ids=ids, max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0), top_k=max(0, _integer(body, "top_k", 0, -1) or 0),
        seed=_integer(body, "seed", None, 0, 2**32 - 1), stop=_stop(body), stream=_flag(body, "stream"),
        include_usage=_flag(opts, "include_usage"), ignore_eos=_flag(body, "ignore_eos"),
        return_token_ids=_flag(body, "return_token_ids"), user=user or None)


def parse_completion(body: dict, model, model_name: str) -> GenerationRequest:
    check_model(body, model_name)
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required (a string or a list of token ids)", param="prompt")
    return _common(body, _prompt_ids(body["prompt"], model), model, DEFAULT_COMPLETION_TOKENS)


def parse_chat(body: dict, model, model_name: str) -> GenerationRequest:
    check_model(body, model_name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' is required: a list such as [{\"role\": \"user\", \"content\": \"Hi\"}]",
                       param="messages")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ApiError(400, "each message needs a 'role' and a text 'content' (strings)", param="messages")
    if model.tokenizer is None or not model.tokenizer.has_chat_template:
        raise ApiError(400, f"{model.name} has no chat template; use /v1/completions", param="messages")
    try:
        text = model.tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages])
    except ModelError as e:
        raise ApiError(400, str(e), param="messages") from None
    return _common(body, model.encode_prompt(text), model, DEFAULT_CHAT_TOKENS)
