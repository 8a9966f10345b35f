"""Continuous batching: many requests share one model, one paged KV pool and one forward pass per step.

003 Details 14-18 (Orca's iteration-level scheduling, vLLM); nano-vllm's scheduler.py. Every `step()`:
  1. admit waiting requests, oldest first, while the batch has room and the pool has blocks for their prompt
     (full blocks already in the prefix cache are shared instead of recomputed);
  2. give every running request one row of ONE `Model.forward` call: a prefill request feeds its next prompt chunk
     (at most `chunk_size` tokens), a decoding request feeds the one token it sampled last step;
  3. a request whose tokens are all cached samples its next token with its own settings and its own random
     stream, so its output equals the request run alone;
  4. finished requests give their blocks back at once. When a decode needs a block and none is free, the newest
     request is preempted: its blocks are freed and it waits to recompute later (nothing it generated is lost).
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from engine.serve.block_manager import BlockManager, OutOfBlocks, check_block_size, check_count
from engine.errors import ModelError
from engine.model.stopping import FinishReason, Status, check_max_new_tokens, eos_ids, finish_reason
from engine.serve.paged_cache import PagedKVCache, grow_table
from engine.model.sampling import (apply_penalties, check_penalties, check_sampling, log_softmax, sample,
                                   top_logprobs)
from engine.serve.sequence import Request
from engine.model.trace import Trace

DEFAULT_MAX_BATCH = 32
DEFAULT_POOL_BYTES = 512 * 2 ** 20    # num_blocks=None: at most this much K/V, but always one full context


@dataclass
class StepReport:
    """What one scheduler iteration did."""
    step: int
    admitted: list[str] = field(default_factory=list)
    prefilled: dict[str, int] = field(default_factory=dict)    # request id -> prompt tokens computed (the chunk)
    decoded: list[str] = field(default_factory=list)           # request ids that fed one decode token
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    tokens_produced: int = 0     # new tokens sampled this step
    forward_tokens: int = 0      # Σ n_valid: tokens the forward pass computed usefully
    padded_tokens: int = 0       # R · T: token slots it computed, padding included
    forward_rows: int = 0        # R: rows of the [R, T] batch (a long chunk may take several)
    seconds: float = 0.0
    started_at: float = 0.0     # time.perf_counter() when the step began
    blocks_used: int = 0
    blocks_free: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.prefilled) + len(self.decoded)


ROW_TOKENS = 16            # width of the rows a long chunk is cut into when that saves padding
MAX_ROWS_PER_CHUNK = 64   # ... but no more rows than this per request (each row gathers the whole context)


def split_rows(chunks: Sequence[int], row_tokens: int = ROW_TOKENS) -> list[tuple[int, int, int]]:
    """Rows of the step's [R, T] token batch: (request index, offset in its chunk, tokens).

    `Model.forward` takes a rectangle, so every row is padded to the longest. One decode token next to a
    400-token prompt chunk would cost 400 rows; cutting the chunk into rows of `row_tokens` (rows of the same
    request share its block table and start where the previous row ends) leaves little padding. Cut only when
    that computes at least a quarter fewer rows than one row per request."""
    longest = max(chunks)
    width = max(row_tokens, -(-longest // MAX_ROWS_PER_CHUNK))
    cut = width * sum(-(-n // width) for n in chunks)
    if len(chunks) > 1 and cut < 0.75 * len(chunks) * longest:
        return [(i, off, min(width, n - off)) for i, n in enumerate(chunks) for off in range(0, n, width)]
    return [(i, 0, n) for i, n in enumerate(chunks)]


def step_timeline(reports: Sequence[StepReport]) -> list[dict]:
    """One row per (step, request) for a Gantt chart: request_id, phase ("prefill" | "decode"), tokens fed,
    start_s and end_s measured from the first step's start."""
    if not reports:
        return []
    t0 = reports[0].started_at
    rows = []
    for r in reports:
        start, end = r.started_at - t0, r.started_at - t0 + r.seconds
        rows += [dict(step=r.step, request_id=rid, phase="prefill", tokens=n, start_s=start, end_s=end)
                 for rid, n in r.prefilled.items()]
        rows += [dict(step=r.step, request_id=rid, phase="decode", tokens=1, start_s=start, end_s=end)
                 for rid in r.decoded]
    return rows


def pool_bytes(config, block_size: int, num_blocks: int = 1) -> int:
    """K and V pools of `num_blocks` blocks: 2 · L · h_kv · block_size · d · 4 bytes (float32) per block."""
    return 2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim * 4 * num_blocks


def default_num_blocks(model, block_size: int, max_batch: int) -> int:
    """Enough blocks for max_batch full contexts, capped at DEFAULT_POOL_BYTES but never below one full context."""
    c = model.config
    per_context = -(-c.max_position_embeddings // block_size)
    return max(per_context, min(max_batch * per_context, DEFAULT_POOL_BYTES // pool_bytes(c, block_size)))


def _check_optional_int(name: str, value) -> int | None:
    return None if value is None else check_count(name, value)


class Scheduler:
    """Serve many requests on one shared, read-only `Model`. The scheduler (its pool, its requests) belongs to one
    caller: a session or a server, never the model."""

    def __init__(self, model, block_size: int = 16, num_blocks: int | None = None, max_batch: int | None = None,
                 chunk_size: int | None = None, prefix_caching: bool = False,
                 prefix_cache_blocks: int | None = None) -> None:
        self.model = model
        self.runner = model          # what each step runs (tests swap in a recorder; the model is never patched)
        block_size = check_block_size(block_size)
        self.max_batch = _check_optional_int("max_batch", max_batch) or DEFAULT_MAX_BATCH
        self.chunk_size = _check_optional_int("chunk_size", chunk_size)
        nb = _check_optional_int("num_blocks", num_blocks)
        nb = default_num_blocks(model, block_size, self.max_batch) if nb is None else nb
        self.blocks = BlockManager(nb, block_size, prefix_caching, prefix_cache_blocks)
        c = model.config
        self.cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, self.blocks, c.max_position_embeddings)
        self.eos = eos_ids(model)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.steps = 0
        self.prefill_tokens_computed = 0      # prompt tokens run through the model (prefix-cache hits excluded)
        self.prefix_hit_tokens = 0            # prompt tokens served from cached blocks
        self.row_tokens = ROW_TOKENS          # see split_rows
        self._ids = itertools.count()
        self._lock = threading.RLock()        # submit/cancel from other threads wait for the current step

    # ------------------------------------------------------------------------------------ live state
    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def free_blocks(self) -> int:
        return self.blocks.num_free

    def block_table(self, req: Request) -> list[int]:
        """Physical block ids holding the request's K/V, logical block 0 first (a copy; empty unless running)."""
        return list(req.block_table)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------------------------ requests in and out
    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int | None = None, stop_at_eos: bool = True,
               request_id: str | None = None, *, logprobs: int | None = None, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0) -> Request:
        """Queue a request. Every check happens here: a request that could never run raises ModelError now and
        takes no block. logprobs=k keeps, for every sampled token, its log-probability and the k most likely
        alternatives (log-softmax of the model's logits, before temperature and penalties)."""
        with self._lock:
            return self._submit(prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos, request_id,
                                logprobs, presence_penalty, frequency_penalty)

    def _submit(self, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos, request_id,
                logprobs=None, presence_penalty=0.0, frequency_penalty=0.0):
        max_new = check_max_new_tokens(max_new_tokens)
        check_sampling(temperature, top_k, top_p)
        check_penalties(presence_penalty, frequency_penalty)
        if logprobs is not None and logprobs != 0:
            logprobs = check_count("logprobs", logprobs)
        ids = self.model.encode_prompt(prompt_ids)
        self.model.check_prompt(ids)
        V = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= V:
            raise ModelError(f"token ids must be in [0, {V})")
        most = min(len(ids) + max_new - 1, self.model.config.max_position_embeddings)   # K/V it may ever hold
        need = -(-most // self.block_size)
        if need > self.num_blocks:
            raise ModelError(f"this request may hold {most} tokens of K/V = {need} blocks of {self.block_size}, "
                             f"but the pool has only {self.num_blocks} blocks; raise num_blocks or lower "
                             "max_new_tokens / shorten the prompt")
        rid = str(next(self._ids)) if request_id is None else str(request_id)
        if any(r.request_id == rid for r in self.waiting + self.running):
            raise ModelError(f"request_id {rid!r} is already queued or running")
        req = Request(rid, list(ids), max_new, temperature, top_k, top_p, seed, stop_at_eos, logprobs,
                      float(presence_penalty), float(frequency_penalty))
        self.waiting.append(req)
        return req

    def cancel(self, req: Request) -> None:
        """Stop a request now and give its blocks back (no effect on a finished one)."""
        with self._lock:
            if req.done:
                return
            if req not in self.running and req not in self.waiting:
                raise ModelError(f"request {req.request_id!r} was not submitted to this scheduler")
            self._remove(req)
            req.finish(FinishReason.CANCELLED)

    def _remove(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.blocks.release_all(req.block_table)

    # ------------------------------------------------------------------------------------ the loop
    def run(self, max_steps: int | None = None) -> list[StepReport]:
        """Step until every request is finished (or `max_steps` steps)."""
        reports = []
        while self.has_work and (max_steps is None or len(reports) < max_steps):
            reports.append(self.step())
            if not (reports[-1].admitted or reports[-1].batch_size):     # a bug guard, never a silent hang
                raise ModelError("the scheduler made no progress: no request could be admitted or run")
        return reports

    def step(self, trace: Trace | None = None) -> StepReport:
        """One iteration. Pass a `Trace` to count the FLOPs and bytes of this step's forward pass."""
        with self._lock:
            return self._step(trace)

    def _step(self, trace: Trace | None) -> StepReport:
        t0 = time.perf_counter()
        self.steps += 1
        report = StepReport(step=self.steps, started_at=t0)
        report.admitted = self._admit()
        rows, chunks = self._reserve_rows(report)
        if rows:
            self._forward(rows, chunks, report, trace)
        report.seconds = time.perf_counter() - t0
        report.blocks_used, report.blocks_free = self.blocks.num_used, self.blocks.num_free
        return report

    def _admit(self) -> list[str]:
        """Move waiting requests (oldest first) into the batch while there is room and blocks for their tokens."""
        admitted = []
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            if not self._allocate_prompt(req):
                break
            self.waiting.pop(0)
            req.status = Status.PREFILL
            if req.scheduled_at is None:             # a preempted request re-admitted keeps its first wait
                req.scheduled_at = time.perf_counter()
            self.running.append(req)
            admitted.append(req.request_id)
        return admitted

    def _allocate_prompt(self, req: Request) -> bool:
        """Blocks for every token the request has (prompt, plus what it generated before a preemption). Full
        blocks found in the prefix cache are shared; if they cover everything, the last token is recomputed in a
        private copy of the last block (copy on write). False, with nothing taken, when the pool is short."""
        ids, bs = req.all_ids, self.block_size
        hits = self.blocks.lookup(ids, max_tokens=len(ids))
        if len(hits) * bs >= len(ids) and not self._affordable(ids, hits, copy_last=True):
            hits = hits[:-1]                        # no room for a copy: recompute the last block instead
        if not self._affordable(ids, hits, copy_last=len(hits) * bs >= len(ids)):
            return False
        for b in hits:
            self.blocks.share(b)
        req.block_table[:] = hits
        grow_table(self.blocks, req.block_table, len(ids))
        if len(hits) * bs >= len(ids):
            req.block_table[-1] = self.cache.copy_on_write(req.block_table[-1])
        cached = min(len(hits) * bs, len(ids) - 1)
        req.num_cached = cached
        req.hashed_blocks = cached // bs
        req.last_hash = self.blocks.hash_of(hits[req.hashed_blocks - 1]) if req.hashed_blocks else None
        if not req.token_ids:
            req.prefix_cached_tokens = cached
            self.prefix_hit_tokens += cached
        return True

    def _affordable(self, ids: list[int], hits: list[int], copy_last: bool) -> bool:
        """Enough free blocks for the tokens the hits do not cover (+1 for a copy on write)? A hit nobody holds
        counts as free until it is shared, so it is not counted twice."""
        need = -(-len(ids) // self.block_size) - len(hits) + copy_last
        idle_hits = sum(1 for b in hits if self.blocks.ref_count[b] == 0)
        return need <= self.blocks.num_free - idle_hits

    def _reserve_rows(self, report: StepReport) -> tuple[list[Request], list[int]]:
        """Every running request gets a row; a decode that needs a new block and finds none preempts the newest
        request (possibly itself)."""
        rows, chunks = [], []
        for req in list(self.running):
            if req not in self.running:                       # preempted by an earlier row this step
                continue
            n = req.num_pending if self.chunk_size is None else min(req.num_pending, self.chunk_size)
            while True:
                try:
                    grow_table(self.blocks, req.block_table, req.num_cached + n)
                    break
                except OutOfBlocks:
                    victim = self.running[-1]
                    self._preempt(victim)
                    report.preempted.append(victim.request_id)
                    if victim is req:
                        break
                    if victim in rows:
                        i = rows.index(victim)
                        del rows[i], chunks[i]
            if req in self.running:
                rows.append(req)
                chunks.append(n)
        return rows, chunks

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.blocks.release_all(req.block_table)
        req.num_cached, req.hashed_blocks, req.last_hash = 0, 0, None
        req.status = Status.WAITING
        req.preemptions += 1
        self.waiting.insert(0, req)

    def _forward(self, rows: list[Request], chunks: list[int], report: StepReport,
                 trace: Trace | None) -> None:
        """ONE forward pass over every request (request r feeds chunks[r] tokens), then sample where due."""
        pieces = split_rows(chunks, self.row_tokens)           # (request index, offset, tokens) per row
        R, T = len(pieces), max(n for _, _, n in pieces)
        tokens = np.zeros((R, T), np.int64)
        for row, (i, off, n) in enumerate(pieces):
            start = rows[i].num_cached + off
            tokens[row, :n] = rows[i].all_ids[start:start + n]
        for req, n in zip(rows, chunks):
            if req.status is Status.PREFILL:
                report.prefilled[req.request_id] = n
            else:
                report.decoded.append(req.request_id)
        # rows of one request share its block table: each layer writes every row's K/V before any row reads
        self.cache.bind([rows[i].block_table for i, _, _ in pieces], [rows[i].num_cached + off for i, off, _ in pieces])
        try:
            logits = self.runner.forward(tokens, self.cache, n_valid=np.array([n for _, _, n in pieces]), trace=trace)
        except BaseException:
            for req in rows:                                   # never leave blocks behind a failed pass
                self._remove(req)
                req.finish(FinishReason.ERROR)
            raise
        report.forward_tokens, report.padded_tokens, report.forward_rows = int(sum(chunks)), R * T, R
        last_row = {i: row for row, (i, _, _) in enumerate(pieces)}   # a request's last token is in its last row
        now = time.perf_counter()
        for i, (req, n) in enumerate(zip(rows, chunks)):
            req.num_cached += n
            if req.status is Status.PREFILL:
                self.prefill_tokens_computed += n
            self._register_full_blocks(req)
            if req.num_pending == 0:
                self._sample(req, logits[last_row[i]], now, report)

    def _register_full_blocks(self, req: Request) -> None:
        if not self.blocks.prefix_caching:
            return
        bs, ids = self.block_size, req.all_ids
        for i in range(req.hashed_blocks, req.num_cached // bs):
            req.last_hash = self.blocks.register(req.block_table[i], req.last_hash, ids[i * bs:(i + 1) * bs])
            req.hashed_blocks = i + 1

    def _sample(self, req: Request, logits: np.ndarray, now: float, report: StepReport) -> None:
        """The same draw and the same stop rules as `engine.model.generate` for this request alone."""
        raw = logits
        if req.presence_penalty or req.frequency_penalty:
            logits = apply_penalties(logits, req.token_ids, req.presence_penalty, req.frequency_penalty)
        tok = sample(logits, req.temperature, req.top_k, req.top_p, req.rng)
        if req.logprobs is not None:
            lp = log_softmax(raw)
            req.token_logprobs.append(float(lp[tok]))
            req.top_logprobs.append(top_logprobs(lp, req.logprobs))
        req.record_token(tok, now)
        req.status = Status.RUNNING
        report.tokens_produced += 1
        reason = finish_reason(tok, self.eos, req.stop_at_eos, len(req.token_ids), req.max_new_tokens, req.num_cached,
                               self.model.config.max_position_embeddings)
        if reason is not None:
            self._remove(req)
            req.finish(reason, now)
            report.finished.append(req.request_id)
