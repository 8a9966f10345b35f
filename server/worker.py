"""One engine worker per loaded model: the shared server every browser session talks to.

A background thread owns a `Scheduler` (paged KV cache, continuous batching) over the shared, read-only model.
A session `submit`s a request (prompt ids + sampling settings) and gets a `GenerationHandle`: an iterator over
its own tokens that it can `stop()`. Everyone's requests go into the same batch, so thirty students cost about
one weight read per step instead of thirty.

Admission control, all checked before any work:
- a request that can never fit (prompt + reply longer than the context window, or more KV blocks than the pool
  holds) is refused with the reason (the scheduler's own check, `ModelError`);
- one active request per session (`Busy`: "you already have a request running");
- a bounded line of waiting requests (`Busy`: "the line is full");
- while a request waits, its handle says where it stands: "busy: you are #k in line".

A session that disappears (browser closed, script stopped) is noticed two ways: its `alive()` check turns False,
or it stops reading its handle for `abandon_after_s`; either way the request is cancelled and its blocks freed.

    worker = EngineWorker(model)
    handle = worker.submit("session-1", ids, max_new_tokens=64)
    for tok in handle:                      # engine.Generated, as Model.generate yields them
        print(tok.text, end="")
    worker.snapshot()                       # the live batch, for the Class page
    worker.close()
"""
from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from calculators.sizing.kv_cache import kv_bytes_per_token
from calculators.sizing.roofline import arithmetic_intensity, forward_flops, kv_bytes_step, weight_bytes_read
from engine.errors import ModelError
from engine.model.generate import Generated
from engine.model.model import Model
from engine.serve.scheduler import Scheduler, StepReport
from engine.serve.sequence import Request

DEFAULT_MAX_BATCH = 32            # requests decoded together in one step
DEFAULT_MAX_WAITING = 64          # requests allowed to wait in line beyond the batch
DEFAULT_KV_BUDGET_BYTES = 256e6   # KV pool of the worker (float32); the block count follows from the model
DEFAULT_BLOCK_SIZE = 16
DEFAULT_CHUNK_SIZE = 64           # prefill chunk: bounds one step's time so decodes keep flowing
ABANDON_AFTER_S = 20.0            # a handle nobody read for this long belongs to a session that is gone
STEP_HISTORY = 240                # steps kept for the live view
ENGINE_KV_DTYPE = "fp32"          # the engine holds K and V in float32


class Busy(ModelError):
    """A request refused for now (not for ever): the line is full, or the session already has one running."""


def blocks_for_budget(model: Model, budget_bytes: float, block_size: int) -> int:
    """KV blocks that fit in `budget_bytes`: budget / (block_size · kv_bytes_per_token in float32)."""
    per_block = block_size * kv_bytes_per_token(model.config, ENGINE_KV_DTYPE)
    return max(1, int(budget_bytes // per_block))


# ============================================================================================ one request
@dataclass
class _Event:
    token_id: int | None          # None: the request ended without a new token (stopped, cancelled), or progress
    seconds: float
    kv_cache_bytes: int
    finish_reason: str | None
    prefilled: int | None = None  # a prefill chunk ended: prompt tokens computed so far


class GenerationHandle:
    """What a session holds for one request: its tokens as they arrive, its place in line, a stop button.

    Iterating yields `engine.Generated` (text decoded here, in the session's thread); `seconds` of step 0 is the
    session's own time to first token (queue wait included), later ones its own inter-token latency, all
    measured under whatever load the server has.
    """

    def __init__(self, worker: "EngineWorker", session_id: str, request: Request, prompt_len: int,
                 max_new_tokens: int, alive: Callable[[], bool] | None) -> None:
        self.worker, self.session_id, self.request = worker, session_id, request
        self.prompt_len, self.max_new_tokens, self.alive = prompt_len, max_new_tokens, alive
        self.submitted_at = self.last_seen = time.perf_counter()
        self.position: int | None = None      # 1-based place in line while waiting; None once admitted
        self.finish_reason: str | None = None
        self.sent = 0                         # tokens handed to the events queue
        self.largest_batch = 0                # most sequences decoded together in a step while this one ran
        self.last_token_at = self.submitted_at
        self._events: queue.Queue[_Event] = queue.Queue()
        self.done = threading.Event()

    @property
    def waiting(self) -> bool:
        return self.position is not None

    def busy_message(self) -> str | None:
        """ "busy: you are #k in line" while the request waits for a place in the batch; None once it runs."""
        k = self.position
        if k is None:
            return None
        return (f"busy: you are #{k} in line ({self.worker.max_batch} requests are decoded together; yours "
                f"starts when one of them finishes)")

    def stop(self, reason: str = "stopped") -> None:
        """Stop generating: the request leaves the batch and its KV blocks are freed at once."""
        self.worker.cancel(self, reason)

    def touch(self) -> None:
        self.last_seen = time.perf_counter()

    def events(self, poll_s: float = 0.1, on_wait: Callable[[int], None] | None = None) -> Iterator[_Event]:
        """Raw events (token id, seconds, KV bytes, finish reason) until the request ends."""
        shown = None
        while True:
            self.touch()
            try:
                ev = self._events.get(timeout=poll_s)
            except queue.Empty:
                if on_wait is not None and self.position is not None and self.position != shown:
                    shown = self.position
                    on_wait(shown)
                continue
            yield ev
            if ev.finish_reason is not None:
                return

    def tokens(self, poll_s: float = 0.1, on_wait: Callable[[int], None] | None = None,
               on_progress: Callable[[int, int, str], None] | None = None) -> Iterator[Generated]:
        """The reply as `engine.Generated`, text decoded as it streams (as `Model.generate` does). A request that
        ends early (stopped, session closed) just ends; `self.finish_reason` says why.

        on_progress(done, total, phase), as `Model.generate` calls it: after each prefill chunk ("prefill", prompt
        tokens computed of the prompt) and each token ("decode", tokens of at most max_new_tokens)."""
        tok = self.worker.model.tokenizer
        decoder = None
        if tok is not None:
            from engine.load.tokenizer import StreamDecoder
            decoder = StreamDecoder(tok, continuation=True)
        step = 0
        for ev in self.events(poll_s, on_wait):
            if ev.prefilled is not None:
                if on_progress is not None:
                    on_progress(ev.prefilled, self.prompt_len, "prefill")
                continue
            if ev.token_id is None:                     # stopped, cancelled: `finish_reason` says why
                if ev.finish_reason.startswith("error"):
                    raise ModelError(f"the server's engine failed while running this request "
                                     f"({ev.finish_reason[len('error: '):]}); try again")
                return
            text = ""
            if decoder is not None:
                text = "" if ev.finish_reason == "eos" else decoder.push(ev.token_id)
                if ev.finish_reason:
                    text += decoder.flush()
            if on_progress is not None:
                on_progress(step + 1, self.max_new_tokens, "decode")
            yield Generated(token_id=ev.token_id, text=text, step=step, seconds=ev.seconds,
                            kv_cache_bytes=ev.kv_cache_bytes, finish_reason=ev.finish_reason)
            step += 1

    __iter__ = tokens


# ============================================================================================ live view
@dataclass(frozen=True)
class RequestView:
    """One request as the Class page shows it (no prompt text: that stays with its session)."""
    label: str                    # "student 3": numbered by arrival, not a session id
    status: str                   # waiting | prefill | running | finished
    prompt_tokens: int
    generated_tokens: int
    max_new_tokens: int
    block_table: tuple[int, ...]
    position: int | None


@dataclass(frozen=True)
class StepView:
    """One scheduler step: when it ended, how long it took, what it computed."""
    ended_at: float               # perf_counter seconds
    seconds: float
    decode_requests: int          # sequences that produced a token by decoding
    prefill_tokens: int           # prompt tokens processed (all chunks of the step)
    tokens_out: int               # new tokens produced
    mean_context: float           # mean KV length of the decoding sequences


@dataclass(frozen=True)
class WorkerSnapshot:
    model_name: str
    taken_at: float
    requests: tuple[RequestView, ...]
    free_blocks: int
    num_blocks: int
    block_size: int
    max_batch: int
    max_waiting: int
    steps: tuple[StepView, ...]

    @property
    def waiting(self) -> int:
        return sum(r.position is not None for r in self.requests)

    @property
    def running(self) -> int:
        return sum(r.position is None for r in self.requests)

    def aggregate_tokens_per_s(self, window_s: float = 10.0) -> float:
        """Tokens produced by every request together over the last `window_s` seconds of steps, divided by the
        wall time those steps span (idle gaps excluded: they are not the server's speed)."""
        recent = [s for s in self.steps if s.ended_at >= self.taken_at - window_s]
        busy = sum(s.seconds for s in recent)
        return sum(s.tokens_out for s in recent) / busy if busy > 0 else float("nan")

    def single_stream_tokens_per_s(self) -> float:
        """One request alone: 1 / median time of the steps that decoded exactly one sequence (no prefill)."""
        alone = [s.seconds for s in self.steps if s.decode_requests == 1 and s.prefill_tokens == 0]
        return 1.0 / statistics.median(alone) if alone else float("nan")

    def batching_speedup(self, window_s: float = 10.0) -> float:
        """Aggregate tokens/s over the single-stream rate: how many lone streams the batch is worth."""
        single = self.single_stream_tokens_per_s()
        return self.aggregate_tokens_per_s(window_s) / single if single > 0 else float("nan")

    def block_owners(self) -> list[str | None]:
        """For each physical KV block (id 0 … num_blocks−1): the label of the request holding it, None if free."""
        owners: list[str | None] = [None] * self.num_blocks
        for r in self.requests:
            for b in r.block_table:
                if 0 <= b < self.num_blocks:
                    owners[b] = r.label
        return owners

    def last_decode_step(self) -> StepView | None:
        """The most recent step that decoded (the batch whose roofline point the Class page plots)."""
        return next((s for s in reversed(self.steps) if s.decode_requests), None)


def decode_step_point(model: Model, step: StepView) -> dict:
    """Where a decode step sits on the roofline: its FLOPs and bytes by the calculators' convention (float32, as
    the engine holds weights and KV), the intensity FLOPs / bytes, and the FLOP/s it achieved (FLOPs / seconds).

    The batch is counted as `decode_requests` sequences at the step's mean context (the calculators take one
    length per batch)."""
    c, B = model.config, max(step.decode_requests, 1)
    ctx = max(int(round(step.mean_context)), 1)
    flops = forward_flops(c, 1, ctx, B)
    kv = kv_bytes_step(c, 1, ctx, ENGINE_KV_DTYPE, B)
    moved = weight_bytes_read(c, 1, ENGINE_KV_DTYPE, B) + kv["read"] + kv["written"]
    return dict(batch=B, context_tokens=ctx, flops=flops, bytes=moved,
                intensity_flop_per_byte=arithmetic_intensity(flops, moved),
                achieved_flop_s=flops / step.seconds if step.seconds > 0 else float("nan"))


# ============================================================================================ the worker
class EngineWorker:
    """A background thread stepping one Scheduler for every session that uses `model`."""

    def __init__(self, model: Model, *, max_batch: int = DEFAULT_MAX_BATCH, max_waiting: int = DEFAULT_MAX_WAITING,
                 block_size: int = DEFAULT_BLOCK_SIZE, num_blocks: int | None = None,
                 kv_budget_bytes: float = DEFAULT_KV_BUDGET_BYTES, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 abandon_after_s: float = ABANDON_AFTER_S, start: bool = True) -> None:
        self.model, self.max_batch, self.max_waiting = model, int(max_batch), int(max_waiting)
        self.block_size = int(block_size)
        blocks = int(num_blocks) if num_blocks is not None else blocks_for_budget(model, kv_budget_bytes,
                                                                                   self.block_size)
        self.scheduler = Scheduler(model, block_size=self.block_size, num_blocks=blocks, max_batch=self.max_batch,
                                   chunk_size=chunk_size)
        self.abandon_after_s = float(abandon_after_s)
        self._kv_per_token = int(kv_bytes_per_token(model.config, ENGINE_KV_DTYPE))
        self._cond = threading.Condition()
        self._handles: list[GenerationHandle] = []          # active (not finished), in arrival order
        self._labels: dict[str, int] = {}                   # session id -> "student k"
        self._steps: deque[StepView] = deque(maxlen=STEP_HISTORY)
        self._ids = itertools.count(1)
        self._closed = False
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # ------------------------------------------------------------------------------------ sessions' side
    def submit(self, session_id: str, prompt_ids: Sequence[int], max_new_tokens: int = 64,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
               stop_at_eos: bool = True, alive: Callable[[], bool] | None = None, *, logprobs: int | None = None,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> GenerationHandle:
        """Queue a request. Raises `Busy` (try again later) or `ModelError` (can never run, with the reason).
        logprobs / penalties: the scheduler's (`handle.request.token_logprobs[i]` is token i's log p)."""
        ids = [int(t) for t in prompt_ids]
        with self._cond:
            if self._closed:
                raise Busy(f"the engine worker of {self.model.name} has been shut down; reload the page")
            mine = next((h for h in self._handles if h.session_id == session_id), None)
            if mine is not None:
                raise Busy("you already have a request running; stop it or wait for it to finish "
                           "(one request per session)")
            waiting = sum(h.waiting for h in self._handles)
            if waiting >= self.max_waiting:
                raise Busy(f"busy: {waiting} requests are already waiting in line (the limit is "
                           f"{self.max_waiting}); try again in a moment")
            request = self.scheduler.submit(ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                            top_k=top_k, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos,
                                            request_id=f"r{next(self._ids)}", logprobs=logprobs,
                                            presence_penalty=presence_penalty,
                                            frequency_penalty=frequency_penalty)   # ModelError: can never fit
            handle = GenerationHandle(self, session_id, request, len(ids), int(max_new_tokens), alive)
            self._labels.setdefault(session_id, len(self._labels) + 1)
            self._handles.append(handle)
            self._update_positions()
            self._cond.notify_all()
        return handle

    def cancel(self, handle: GenerationHandle, reason: str = "stopped") -> None:
        """Take `handle`'s request out of the scheduler (its blocks return to the pool) and end its stream."""
        with self._cond:
            if handle in self._handles:
                self.scheduler.cancel(handle.request)
                self._finish(handle, reason)
                self._update_positions()

    def end_session(self, session_id: str) -> None:
        """The session is gone: cancel whatever it still has in the batch."""
        with self._cond:
            for h in [h for h in self._handles if h.session_id == session_id]:
                self.scheduler.cancel(h.request)
                self._finish(h, "session closed")
            self._update_positions()

    def active_requests(self, session_id: str | None = None) -> int:
        with self._cond:
            return sum(session_id is None or h.session_id == session_id for h in self._handles)

    @property
    def free_blocks(self) -> int:
        with self._cond:
            return int(self.scheduler.free_blocks)

    @property
    def num_blocks(self) -> int:
        return int(self.scheduler.num_blocks)

    # ------------------------------------------------------------------------------------ the thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"engine-worker[{self.model.name}]",
                                            daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel everything (blocks freed) and stop the thread."""
        with self._cond:
            self._closed = True
            for h in list(self._handles):
                self.scheduler.cancel(h.request)
                self._finish(h, "server shut down")
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._handles:
                    self._cond.wait(timeout=1.0)
                if self._closed:
                    return
                self.step_once()
            time.sleep(0.001)           # let sessions waiting to submit, stop or look take the lock between steps

    def step_once(self) -> StepView | None:
        """One scheduler step, then every handle gets its new tokens (called by the thread; tests call it too)."""
        with self._cond:
            self._reap()
            if not self._handles:
                return None
            t0 = time.perf_counter()
            try:
                report = self.scheduler.step()
            except Exception as e:                      # never let one bad step kill the class's server
                for h in list(self._handles):
                    self.scheduler.cancel(h.request)
                    self._finish(h, f"error: {type(e).__name__}: {e}")
                return None
            t1 = time.perf_counter()
            view = self._step_view(report, t1 - t0, t1)
            self._steps.append(view)
            in_batch = set(report.decoded) | set(report.prefilled)
            for h in self._handles:
                if h.request.request_id in in_batch:
                    h.largest_batch = max(h.largest_batch, len(in_batch))
                if h.request.request_id in report.prefilled:
                    h._events.put(_Event(None, 0.0, 0, None, prefilled=min(h.request.num_cached, h.prompt_len)))
            self._publish(t1)
            self._update_positions()
            return view

    def _step_view(self, report: StepReport, seconds: float, now: float) -> StepView:
        decoded = set(report.decoded)
        contexts = [h.request.num_cached for h in self._handles if h.request.request_id in decoded]
        return StepView(ended_at=now, seconds=seconds, decode_requests=len(decoded),
                        prefill_tokens=int(sum(report.prefilled.values())), tokens_out=int(report.tokens_produced),
                        mean_context=statistics.fmean(contexts) if contexts else 0.0)

    def _publish(self, now: float) -> None:
        for h in list(self._handles):
            req = h.request
            new = list(req.token_ids[h.sent:])
            finished = req.status == "finished"
            for i, tok in enumerate(new):
                last = finished and i == len(new) - 1
                h.sent += 1
                seconds = now - h.last_token_at
                h.last_token_at = now
                cached = h.prompt_len + h.sent - 1            # the newest token is not in the cache yet
                h._events.put(_Event(int(tok), seconds, cached * self._kv_per_token,
                                     (req.finish_reason or "length") if last else None))
            if finished:
                if not new:
                    h._events.put(_Event(None, 0.0, 0, req.finish_reason or "length"))
                h.finish_reason = req.finish_reason
                self._handles.remove(h)
                h.position = None
                h.done.set()

    def _finish(self, h: GenerationHandle, reason: str) -> None:
        if h in self._handles:
            self._handles.remove(h)
        h.finish_reason, h.position = reason, None
        h._events.put(_Event(None, 0.0, 0, reason))
        h.done.set()

    def _reap(self) -> None:
        """Cancel requests whose session is gone (alive() False) or stopped reading for `abandon_after_s`."""
        now = time.perf_counter()
        for h in list(self._handles):
            gone = h.alive is not None and not _safe_alive(h.alive)
            if gone or now - h.last_seen > self.abandon_after_s:
                self.scheduler.cancel(h.request)
                self._finish(h, "session closed")

    def _update_positions(self) -> None:
        k = 0
        for h in self._handles:
            if h.request.status == "waiting":
                k += 1
                h.position = k
            else:
                h.position = None

    # ------------------------------------------------------------------------------------ the live view
    def snapshot(self) -> WorkerSnapshot:
        with self._cond:
            reqs = tuple(RequestView(label=f"student {self._labels.get(h.session_id, 0)}",
                                     status=h.request.status, prompt_tokens=h.prompt_len,
                                     generated_tokens=len(h.request.token_ids), max_new_tokens=h.max_new_tokens,
                                     block_table=tuple(int(b) for b in self.scheduler.block_table(h.request)),
                                     position=h.position)
                         for h in self._handles)
            return WorkerSnapshot(model_name=self.model.name, taken_at=time.perf_counter(), requests=reqs,
                                  free_blocks=int(self.scheduler.free_blocks),
                                  num_blocks=int(self.scheduler.num_blocks), block_size=self.block_size,
                                  max_batch=self.max_batch, max_waiting=self.max_waiting, steps=tuple(self._steps))


def _safe_alive(alive: Callable[[], bool]) -> bool:
    try:
        return bool(alive())
    except Exception:                 # a liveness probe that fails says nothing: keep the request
        return True


# ============================================================================================ the registry
class WorkerRegistry:
    """The process-wide set of workers, one per model source (the shared server). Nothing per session here."""

    def __init__(self, **worker_options: Any) -> None:
        self._workers: dict[str, EngineWorker] = {}
        self._lock = threading.Lock()
        self.options = worker_options

    def worker(self, model: Model) -> EngineWorker:
        key = model.source or model.name
        with self._lock:
            w = self._workers.get(key)
            if w is None or w.model is not model:              # the model was reloaded: a new worker for it
                if w is not None:
                    w.close()
                w = self._workers[key] = EngineWorker(model, **self.options)
            return w

    def register(self, worker: EngineWorker) -> EngineWorker:
        """Serve `worker.model` with this worker (e.g. one built with other limits); replaces any other."""
        key = worker.model.source or worker.model.name
        with self._lock:
            old = self._workers.get(key)
            self._workers[key] = worker
        if old is not None and old is not worker:
            old.close()
        return worker

    def existing(self, source: str) -> EngineWorker | None:
        with self._lock:
            return self._workers.get(source)

    def workers(self) -> list[EngineWorker]:
        with self._lock:
            return list(self._workers.values())

    def end_session(self, session_id: str) -> None:
        for w in self.workers():
            w.end_session(session_id)

    def drop(self, source: str) -> None:
        """The model was evicted: stop its worker (its requests are cancelled)."""
        with self._lock:
            w = self._workers.pop(source, None)
        if w is not None:
            w.close()

    def close(self) -> None:
        for source in [w.model.source or w.model.name for w in self.workers()]:
            self.drop(source)
