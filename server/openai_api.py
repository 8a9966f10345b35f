"""The engine as an OpenAI-compatible HTTP server: `python -m engine serve`.

    POST /v1/completions         prompt (text or token ids) -> text; `stream: true` sends server-sent events
    POST /v1/chat/completions    messages -> the model's chat template -> text (streaming too)
    POST /tokenize, /detokenize  text or messages <-> token ids (vLLM's routes and shapes)
    GET  /tokenizer_info         the tokenizer's config (special tokens, chat template): vLLM's route, which
                                 lm-eval's local-completions uses to tokenize through the server
    GET  /v1/models              the one model served
    GET  /health                 200 once the model is loaded
    GET  /metrics                Prometheus text, vLLM's metric names where the meaning is the same
    GET  /v1/batch               ours: the live batch (requests, lengths, block tables, free blocks, step times)

Every request goes into one `EngineWorker` (server/worker.py): a background thread stepping the continuous-batching
`Scheduler`, so concurrent HTTP requests are decoded in one batch. Starlette + uvicorn carry HTTP, prometheus_client
writes the metrics; nothing of either protocol is written by hand here.

A bad request gets OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, with a 4xx status and a
message that says what to change; a client that goes away mid-reply has its request cancelled and its KV blocks
freed. No client can stall the others: the body is read with a size limit (413 past it, refused from its
Content-Length before it is read), a prompt longer than the context window could hold is refused by its character
count before tokenising, and JSON decoding, tokenising and detokenising run in worker threads (the tokenizer
releases the GIL), never on the event loop that carries every stream and /health. Anything unforeseen is a JSON
500, logged. Keys, Host and Origin checks: server/api_guard.py.

Fields (server/api_requests.py; docs/engine_server_api.md): n and batches of prompts (one `TokenStream` per
choice, merged as they come when streamed), logprobs / top_logprobs (the scheduler records the log-softmax of the
model's logits for every sampled token), echo with the prompt's logprobs (engine/serve/prompt_logprobs.py, in a
worker thread), stop lists, presence / frequency penalties, seed, max_completion_tokens.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.errors import ModelError
from engine.load.hf_export import tokenizer_config_dict
from engine.serve.prompt_logprobs import prompt_logprobs
from server.api_guard import DEFAULT_MAX_BODY_BYTES, Access, AccessGuard
from server.api_requests import (ApiError, GenerationRequest, decode_body, parse_chat, parse_completion,
                                 parse_detokenize, parse_tokenize, prompt_char_limit)
from server.metrics import ServerMetrics
from server.process import SERVER_PID_HEADER     # which process answered /health: a launcher checks it is its own
from server.worker import Busy, EngineWorker

THREADS = 256                  # threads that wait for tokens (one per streaming request at most)
RETRY_AFTER_S = 1              # what a 429 asks the client to wait
log = logging.getLogger("inference_lab.server")
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


@dataclass
class Served:
    """What the app serves: one worker (one model) under one public name."""
    worker: EngineWorker
    model_name: str
    metrics: ServerMetrics
    created: int
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    char_limit: int | None = None          # prompts longer than this many characters cannot fit the context
    keyed: bool = False                    # every /v1 request carries the server's API key

    @property
    def model(self):
        return self.worker.model


class AsciiJSON(JSONResponse):
    """JSON with every non-ASCII character escaped: an error that repeats a client's bad string always encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(err: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if err.status == 429 else None
    return AsciiJSON({"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}},
                     status_code=err.status, headers=headers)


# ============================================================================================ token stream
class TokenStream:
    """One choice's tokens, read from the worker's handle in worker threads and handed to the event loop."""

    def __init__(self, served: Served, req: GenerationRequest, session_id: str, prompt_ids: list[int],
                 seed: int | None, index: int = 0) -> None:
        self.served, self.req, self.prompt_ids, self.index = served, req, prompt_ids, index
        self.arrived = time.perf_counter()
        self.handle = None
        if req.max_tokens > 0:                       # echo with max_tokens 0: the prompt is all the reply
            try:
                self.handle = served.worker.submit(
                    session_id, prompt_ids, max_new_tokens=req.max_tokens, temperature=req.temperature,
                    top_k=req.top_k, top_p=req.top_p, seed=seed, stop_at_eos=not req.ignore_eos,
                    logprobs=req.logprobs, presence_penalty=req.presence_penalty,
                    frequency_penalty=req.frequency_penalty)
            except Busy as e:
                raise ApiError(429, str(e), "rate_limit_exceeded") from None
            except ModelError as e:
                raise ApiError(400, str(e)) from None
            self._tokens = self.handle.tokens(poll_s=0.25)
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None if self.handle is not None else "length"
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._held = ""              # text held back while it could still be the start of a stop string
        served.metrics.request_started(len(prompt_ids), req.max_tokens)

    def stop(self) -> None:
        if self.handle is not None and not self.handle.done.is_set():
            self.handle.stop("cancelled")

    async def pieces(self, limiter: anyio.CapacityLimiter) -> AsyncIterator[tuple[str, int]]:
        """(new text, index of the new token) as they come, until the request ends; honours stop strings."""
        if self.handle is None:
            self._record_end()
            return
        try:
            while self.finish_reason is None:
                tok = await anyio.to_thread.run_sync(next, self._tokens, None, limiter=limiter,
                                                     abandon_on_cancel=True)
                if tok is None:                               # ended without a token (stopped, cancelled)
                    self.finish_reason = self.handle.finish_reason or "stop"
                    break
                self._count_token()
                self.token_ids.append(int(tok.token_id))
                text = self._cut_at_stop(tok.text, final=tok.finish_reason is not None)
                if tok.finish_reason is not None and self.finish_reason is None:
                    self.finish_reason = tok.finish_reason
                self.text += text                             # every token is sent, even one whose text
                yield text, len(self.token_ids) - 1           # waits (part of a character, a stop string)
        except ModelError as e:                               # the engine failed on this batch
            self.finish_reason = "error"
            raise ApiError(500, str(e), "server_error", kind="server_error") from None
        finally:
            if not self.handle.done.is_set():                 # client gone, or a stop string: free the blocks
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.handle.stop, "cancelled", limiter=limiter)
            self._record_end()

    def _count_token(self) -> None:
        now = time.perf_counter()
        m = self.served.metrics
        if self.first_token_at is None:
            self.first_token_at = now
            m.first_token(now - self.arrived)
        else:
            m.next_token(now - self.last_token_at)
        self.last_token_at = now

    def _cut_at_stop(self, piece: str, final: bool) -> str:
        stops = self.req.stop
        if not stops:
            return piece
        text = self._held + piece
        for s in stops:
            i = text.find(s)
            if i >= 0:
                self.finish_reason = "stop"
                self._held = ""
                return text[:i]
        keep = 0 if final else max(len(s) - 1 for s in stops)
        keep = min(keep, len(text))
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def _record_end(self) -> None:
        end = time.perf_counter()
        self.served.metrics.request_finished(
            reason=FINISH.get(self.finish_reason or "", "abort"), prompt_tokens=len(self.prompt_ids),
            generated=len(self.token_ids), e2e_s=end - self.arrived,
            queue_s=self._queue_s(end),
            prefix_hit_tokens=int(self.handle.request.prefix_cached_tokens) if self.handle is not None else 0)

    def _queue_s(self, end: float) -> float:
        """vLLM's queue time: from arrival to the moment the scheduler first admits the request (not its first
        token: the prefill after admission is not waiting). A request that never ran waited until it ended."""
        scheduled = self.handle.request.scheduled_at if self.handle is not None else self.arrived
        return max(0.0, (end if scheduled is None else scheduled) - self.arrived)

    def logprob(self, k: int) -> tuple[float, tuple]:
        """(log p, top alternatives) of generated token k (the worker recorded them before handing it out)."""
        r = self.handle.request
        return r.token_logprobs[k], r.top_logprobs[k]

    @property
    def openai_finish(self) -> str | None:
        return FINISH.get(self.finish_reason or "", None)


# ============================================================================================ logprobs
class LogprobWriter:
    """OpenAI's logprobs objects for a run of tokens: completions' {tokens, token_logprobs, top_logprobs,
    text_offset} or chat's {content: [{token, logprob, bytes, top_logprobs}]}. Token text: the token's own bytes
    (a piece of a character shows as U+FFFD), as vLLM shows it."""

    def __init__(self, model) -> None:
        self.tok = model.tokenizer

    def raw(self, token_id: int) -> bytes:
        return self.tok.token_bytes(token_id) if self.tok is not None else str(token_id).encode()

    def text(self, token_id: int) -> str:
        return self.raw(token_id).decode("utf-8", errors="replace")

    def completion(self, ids: list[int], lps: list, offset: int) -> tuple[dict, int]:
        """-> (logprobs object, text offset after these tokens). lps[i]: (log p, top) or None (a prompt's first)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, lp in zip(ids, lps):
            t = self.text(tid)
            out["tokens"].append(t)
            out["text_offset"].append(offset)
            offset += len(t)
            if lp is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            top = {self.text(i): v for i, v in lp[1]}
            top.setdefault(t, lp[0])                 # the chosen token is always there (vLLM: logprobs=0 too)
            out["token_logprobs"].append(lp[0])
            out["top_logprobs"].append(top)
        return out, offset

    def chat(self, ids: list[int], lps: list) -> dict:
        def entry(tid: int, v: float) -> dict:
            b = self.raw(tid)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": v, "bytes": list(b)}
        return {"content": [{**entry(tid, lp[0]), "top_logprobs": [entry(i, v) for i, v in lp[1]]}
                            for tid, lp in zip(ids, lps)]}


# ============================================================================================ responses
def _completion_choice(index: int, text: str, finish: str | None, ids: list[int] | None,
                       logprobs: dict | None) -> dict:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return choice


def _chat_choice(index: int, delta_or_message: dict, finish: str | None, ids: list[int] | None, stream: bool,
                 logprobs: dict | None = None) -> dict:
    choice = {"index": index, ("delta" if stream else "message"): delta_or_message, "logprobs": logprobs,
              "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return choice


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


@dataclass
class Echo:
    """What a completion with echo puts before its reply: the prompt's text, and its tokens' logprobs."""
    text: str
    ids: list[int]
    logprobs: list | None


async def _echo(served: Served, req: GenerationRequest, limiter) -> list[Echo | None]:
    """Per prompt: its echo (computed in a worker thread: detokenising, the prompt's own forward pass)."""
    if not req.echo:
        return [None] * len(req.prompts)
    model = served.model

    def one(i: int) -> Echo:
        ids = req.prompts[i]
        text = req.prompt_texts[i] if req.prompt_texts and req.prompt_texts[i] is not None else (
            model.tokenizer.decode(ids) if model.tokenizer is not None else "")
        lps = prompt_logprobs(model, ids, req.logprobs) if req.logprobs is not None else None
        return Echo(text, ids, lps)

    return [await anyio.to_thread.run_sync(one, i, limiter=limiter) for i in range(len(req.prompts))]


def _usage(req: GenerationRequest, streams: list[TokenStream]) -> dict:
    p = sum(len(ids) for ids in req.prompts)
    c = sum(len(s.token_ids) for s in streams)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def _stop_all(streams: list[TokenStream]) -> None:
    """Stop every choice still running (in a thread: stopping waits for the worker's step), even when cancelled."""
    if any(s.handle is not None and not s.handle.done.is_set() for s in streams):
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: [s.stop() for s in streams])


async def _watch_disconnect(request: Request, streams: list[TokenStream]) -> None:
    """A non-streaming client that hangs up: stop its requests so their blocks are freed at once."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            await _stop_all(streams)
            return


def _open_streams(served: Served, req: GenerationRequest) -> list[TokenStream]:
    """One TokenStream per choice (in a worker thread: submitting takes the worker's lock). A refusal of any
    choice cancels the ones already queued."""
    # The worker allows one request per session. Without an API key anyone can call, so `user` is only a label and
    # every request is its own session (keyed on `user`, anyone who knew a user's string could get them refused).
    # With a key only its holders call (the app, for its sessions): `user` is then the session, one request each.
    streams: list[TokenStream] = []
    try:
        for index, ids, seed in req.choices():
            session = f"user:{req.user}" if served.keyed and req.user else f"http-{uuid.uuid4().hex}"
            if served.keyed and req.user and req.n * len(req.prompts) > 1:
                session += f"#{index}"
            streams.append(TokenStream(served, req, session, ids, seed, index))
    except ApiError:
        for s in streams:
            s.stop()
        raise
    return streams


async def _respond(request: Request, served: Served, req: GenerationRequest, chat: bool) -> Response:
    limiter = request.app.state.limiter
    echoes = await _echo(served, req, limiter)
    streams = await anyio.to_thread.run_sync(_open_streams, served, req, limiter=limiter)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": served.model_name}
    writer = LogprobWriter(served.model)
    if req.stream:
        return StreamingResponse(_events(streams, echoes, req, limiter, head, chat, writer),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    watcher = asyncio.ensure_future(_watch_disconnect(request, streams))

    async def drain(s: TokenStream) -> None:
        async for _ in s.pieces(limiter):
            pass

    try:
        await asyncio.gather(*(drain(s) for s in streams))
    except ApiError as e:
        return error_response(e)
    finally:
        watcher.cancel()
        await _stop_all(streams)
    ids_wanted = req.return_token_ids
    choices = []
    for s in streams:
        ids = s.token_ids if ids_wanted else None
        lps = [s.logprob(k) for k in range(len(s.token_ids))] if req.logprobs is not None else None
        if chat:
            choices.append(_chat_choice(s.index, {"role": "assistant", "content": s.text}, s.openai_finish, ids,
                                        False, writer.chat(s.token_ids, lps) if lps is not None else None))
            continue
        echo = echoes[s.index // req.n]
        text, lp_obj, offset = s.text, None, 0
        if echo is not None:
            text = echo.text + s.text
            if lps is not None:
                lp_obj, offset = writer.completion(echo.ids, echo.logprobs, 0)
        if lps is not None:
            more, _ = writer.completion(s.token_ids, lps, offset)
            lp_obj = more if lp_obj is None else {k: lp_obj[k] + more[k] for k in lp_obj}
        choices.append(_completion_choice(s.index, text, s.openai_finish, ids, lp_obj))
    body = {**head, "object": "chat.completion" if chat else "text_completion", "choices": choices}
    if ids_wanted:
        body["prompt_token_ids"] = req.prompt_ids
    body["usage"] = _usage(req, streams)
    return JSONResponse(body)


_DONE = object()


async def _merged(streams: list[TokenStream], limiter) -> AsyncIterator[tuple[TokenStream, str, int]]:
    """(stream, text, token index) from every choice's stream, as they come."""
    if len(streams) == 1:
        async for text, k in streams[0].pieces(limiter):
            yield streams[0], text, k
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(s: TokenStream) -> None:
        try:
            async for text, k in s.pieces(limiter):
                await queue.put((s, text, k))
        except ApiError as e:
            await queue.put(e)
        finally:
            await queue.put(_DONE)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        left = len(streams)
        while left:
            item = await queue.get()
            if item is _DONE:
                left -= 1
            elif isinstance(item, ApiError):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await _stop_all(streams)                     # a client gone: every choice's blocks freed


async def _events(streams: list[TokenStream], echoes: list, req: GenerationRequest, limiter, head: dict,
                  chat: bool, writer: LogprobWriter) -> AsyncIterator[bytes]:
    ids_wanted, lp_wanted = req.return_token_ids, req.logprobs is not None
    offsets = {s.index: 0 for s in streams}
    if chat:
        for s in streams:
            yield _sse({**head, "choices": [_chat_choice(s.index, {"role": "assistant", "content": ""}, None, None,
                                                         True)]})
    else:
        for s in streams:                            # echo: the prompt first, as its own chunk
            echo = echoes[s.index // req.n]
            if echo is not None:
                lp = None
                if lp_wanted:
                    lp, offsets[s.index] = writer.completion(echo.ids, echo.logprobs, 0)
                finish = s.openai_finish if s.handle is None else None
                yield _sse({**head, "choices": [_completion_choice(s.index, echo.text, finish, None, lp)]})
    try:
        async for s, text, k in _merged(streams, limiter):
            finish = s.openai_finish
            tids = [s.token_ids[k]] if ids_wanted else None
            lps = [s.logprob(k)] if lp_wanted else None
            if chat:
                choice = _chat_choice(s.index, {"content": text} if text else {}, finish, tids, True,
                                      writer.chat([s.token_ids[k]], lps) if lps else None)
            else:
                lp = None
                if lps:
                    lp, offsets[s.index] = writer.completion([s.token_ids[k]], lps, offsets[s.index])
                choice = _completion_choice(s.index, text, finish, tids, lp)
            yield _sse({**head, "choices": [choice]})
    except ApiError as e:
        yield _sse({"error": {"message": e.message, "type": e.kind, "param": None, "code": e.code}})
    except Exception:                       # a bug: the stream ends with an error event, never a cut connection
        log.exception("streaming a reply failed")
        yield _sse({"error": {"message": "internal error while streaming the reply (logged on the server)",
                              "type": "server_error", "param": None, "code": "internal_error"}})
    if req.include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(req, streams)})
    yield b"data: [DONE]\n\n"


# ============================================================================================ routes
async def read_body(request: Request, limit: int) -> bytes:
    """The body, at most `limit` bytes: refused from its Content-Length before reading, or as soon as the bytes
    received pass the limit (a chunked upload), so a huge body is never held in memory."""
    too_big = ApiError(413, f"the request body is larger than this server accepts ({limit:,} bytes; the "
                            f"server's --max-body-mb sets it)", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ApiError(400, f"Content-Length must be a number of bytes, got {declared[:40]!r}")
        if int(declared) > limit:
            raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _served(request: Request) -> Served:
    return request.app.state.served


async def json_body(request: Request) -> dict:
    """The body read with the size limit, decoded and checked in a worker thread."""
    raw = await read_body(request, _served(request).max_body_bytes)
    return await anyio.to_thread.run_sync(decode_body, raw, limiter=request.app.state.limiter)


async def _endpoint(request: Request, parse, chat: bool) -> Response:
    """Parse the body with `parse` (completions or chat) off the event loop, serve it; any ApiError as OpenAI's
    error shape."""
    served = _served(request)
    try:
        body = await json_body(request)
        req = await anyio.to_thread.run_sync(parse, body, served.model, served.model_name, served.char_limit,
                                             limiter=request.app.state.limiter)
        return await _respond(request, served, req, chat=chat)
    except ApiError as e:
        return error_response(e)


async def _json_endpoint(request: Request, handle) -> Response:
    """A route whose answer is `handle(body, model, model_name, char_limit)`, computed in a worker thread."""
    served = _served(request)
    try:
        body = await json_body(request)
        out = await anyio.to_thread.run_sync(handle, body, served.model, served.model_name, served.char_limit,
                                             limiter=request.app.state.limiter)
    except ApiError as e:
        return error_response(e)
    return JSONResponse(out)


async def tokenize(request: Request) -> Response:
    return await _json_endpoint(request, parse_tokenize)


async def detokenize(request: Request) -> Response:
    return await _json_endpoint(request, parse_detokenize)


async def tokenizer_info(request: Request) -> Response:
    """vLLM's GET /tokenizer_info: the tokenizer_config.json an exported Hugging Face folder holds (bos, eos, pad
    and unk tokens, add_bos_token, the chat template, model_max_length). lm-eval's local-completions looks for it
    (with /tokenize) and then tokenizes through this server, needing no local copy of the tokenizer."""
    model = _served(request).model
    if model.tokenizer is None:
        return error_response(ApiError(400, f"{model.name} has no tokenizer"))
    return JSONResponse(tokenizer_config_dict(model.tokenizer, model.config.max_position_embeddings))


async def completions(request: Request) -> Response:
    return await _endpoint(request, parse_completion, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _endpoint(request, parse_chat, chat=True)


async def models(request: Request) -> Response:
    s = _served(request)
    card = {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "inference-lab",
            "root": s.model_name, "parent": None,            # never the model file's path
            "max_model_len": s.model.config.max_position_embeddings}
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request) -> Response:
    return Response(status_code=200, headers={SERVER_PID_HEADER: str(os.getpid())})


async def metrics(request: Request) -> Response:
    text, content_type = await anyio.to_thread.run_sync(_served(request).metrics.exposition)
    return Response(text, media_type=content_type)


async def live_batch(request: Request) -> Response:
    from server.live_batch import snapshot_json
    s = _served(request)
    snap = await anyio.to_thread.run_sync(s.worker.snapshot)     # the worker's lock may be held for a step
    return JSONResponse(snapshot_json(snap, s.model_name, s.model.config))


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(ApiError(404, f"no route {request.method} {request.url.path[:100]}; this server offers "
                                        f"/v1/completions, /v1/chat/completions, /v1/models, /tokenize, "
                                        f"/detokenize, /tokenizer_info, /health, /metrics and /v1/batch", kind="not_found_error",
                                   code="not_found"))


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path[:100]}",
                                   kind="invalid_request_error", code="method_not_allowed"))


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug, not the client's fault: logged with its traceback, answered in OpenAI's shape (never plain text)."""
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(ApiError(500, f"internal error ({type(exc).__name__}); it was logged on the server",
                                   code="internal_error"))


def create_app(worker: EngineWorker, model_name: str, metrics_: ServerMetrics | None = None, *,
               access: Access | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The ASGI app serving `worker`'s model as `model_name`; `access` sets the API key and the Host and Origin
    checks (server/api_guard.py), `max_body_bytes` the largest request body."""
    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]), Route("/v1/batch", live_batch, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
              Route("/tokenizer_info", tokenizer_info, methods=["GET"])]
    app = Starlette(routes=routes, middleware=[Middleware(AccessGuard, access=access or Access())],
                    exception_handlers={404: not_found, 405: method_not_allowed, Exception: internal_error})
    m = metrics_ or ServerMetrics(model_name, worker)
    app.state.served = Served(worker, model_name, m, int(time.time()), int(max_body_bytes),
                              prompt_char_limit(worker.model), keyed=bool(access and access.api_key))
    app.state.limiter = anyio.CapacityLimiter(THREADS)
    return app
