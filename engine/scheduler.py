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
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from engine.block_manager import BlockManager, OutOfBlocks, check_block_size
from engine.errors import ModelError
from engine.generate import _check_max_new
from engine.paged_cache import PagedKVCache, grow_table
from engine.sampling import check_sampling, sample
from engine.sequence import Request

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
    padded_tokens: int = 0       # B · T: rows it computed, padding included
    seconds: float = 0.0
    blocks_used: int = 0
    blocks_free: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.prefilled) + len(self.decoded)


def default_num_blocks(model, block_size: int, max_batch: int) -> int:
    """Enough blocks for max_batch full contexts, capped at DEFAULT_POOL_BYTES but never below one full context."""
    c = model.config
    per_context = -(-c.max_position_embeddings // block_size)
    block_bytes = 2 * c.num_layers * c.num_kv_heads * block_size * c.head_dim * 4
    return max(per_context, min(max_batch * per_context, DEFAULT_POOL_BYTES // block_bytes))


def _check_optional_int(name: str, value, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ModelError(f"{name} must be a whole number ≥ {minimum} (or None), got {value!r}")
    return int(value)


class Scheduler:
    """Serve many requests on one shared, read-only `Model`. The scheduler (its pool, its requests) belongs to one
    caller: a session or a server, never the model."""

    def __init__(self, model, block_size: int = 16, num_blocks: int | None = None, max_batch: int | None = None,
                 chunk_size: int | None = None, prefix_caching: bool = False,
                 prefix_cache_blocks: int | None = None) -> None:
        self.model = model
        block_size = check_block_size(block_size)
        self.max_batch = _check_optional_int("max_batch", max_batch) or DEFAULT_MAX_BATCH
        self.chunk_size = _check_optional_int("chunk_size", chunk_size)
        nb = _check_optional_int("num_blocks", num_blocks)
        nb = default_num_blocks(model, block_size, self.max_batch) if nb is None else nb
        self.blocks = BlockManager(nb, block_size, prefix_caching, prefix_cache_blocks)
        c = model.config
        self.cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, self.blocks, c.max_position_embeddings)
        tok = model.tokenizer
        self.eos = set(tok.eos_token_ids) if tok is not None else set(c.eos_token_ids)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.steps = 0
        self.prefill_tokens_computed = 0      # prompt tokens run through the model (prefix-cache hits excluded)
        self.prefix_hit_tokens = 0            # prompt tokens served from cached blocks
        self._ids = itertools.count()

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
               request_id: str | None = None) -> Request:
        """Queue a request. Every check happens here: a request that could never run raises ModelError now and
        takes no block."""
        max_new = _check_max_new(max_new_tokens)
        check_sampling(temperature, top_k, top_p)
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
        req = Request(rid, list(ids), max_new, temperature, top_k, top_p, seed, stop_at_eos)
        self.waiting.append(req)
        return req

    def cancel(self, req: Request) -> None:
        """Stop a request now and give its blocks back (no effect on a finished one)."""
        if req.done:
            return
        self._remove(req)
        req.finish("cancelled")

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
        return reports

    def step(self) -> StepReport:
        t0 = time.perf_counter()
        self.steps += 1
        report = StepReport(step=self.steps)
        report.admitted = self._admit()
        rows, chunks = self._reserve_rows(report)
        if rows:
            self._forward(rows, chunks, report)
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
            req.status = "prefill"
            self.running.append(req)
            admitted.append(req.request_id)
        return admitted

    def _allocate_prompt(self, req: Request) -> bool:
        """Blocks for every token the request has (prompt, plus what it generated before a preemption). Full
        blocks found in the prefix cache are shared; if they cover everything, the last token is recomputed in a
        private copy of the last block (copy on write). False, with nothing taken, when the pool is short."""
        ids, bs = req.all_ids, self.block_size
        hits = self.blocks.lookup(ids, max_tokens=len(ids))
        whole = len(hits) * bs >= len(ids)
        need = -(-len(ids) // bs) - len(hits) + whole
        reusable_idle = sum(1 for b in hits if self.blocks.ref_count[b] == 0)   # counted as free until shared
        if need > self.blocks.num_free - reusable_idle:
            return False
        for b in hits:
            self.blocks.share(b)
        req.block_table[:] = hits
        grow_table(self.blocks, req.block_table, len(ids))
        cached = min(len(hits) * bs, len(ids) - 1)
        if whole:
            req.block_table[-1] = self.cache.copy_on_write(req.block_table[-1])
        req.num_cached = cached
        req.hashed_blocks = cached // bs
        req.last_hash = self.blocks.hash_of(hits[req.hashed_blocks - 1]) if req.hashed_blocks else None
        if not req.token_ids:
            req.prefix_cached_tokens = cached
            self.prefix_hit_tokens += cached
        return True

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
        req.status = "waiting"
        req.preemptions += 1
        self.waiting.insert(0, req)

    def _forward(self, rows: list[Request], chunks: list[int], report: StepReport) -> None:
        """ONE forward pass over every row (ragged: row b feeds chunks[b] tokens), then sample where due."""
        B, T = len(rows), max(chunks)
        tokens = np.zeros((B, T), np.int64)
        for b, (req, n) in enumerate(zip(rows, chunks)):
            tokens[b, :n] = req.all_ids[req.num_cached:req.num_cached + n]
            if req.status == "prefill":
                report.prefilled[req.request_id] = n
            else:
                report.decoded.append(req.request_id)
        self.cache.bind([r.block_table for r in rows], [r.num_cached for r in rows])
        try:
            logits = self.model.forward(tokens, self.cache, n_valid=np.asarray(chunks, np.int64))   # [B, V]
        except BaseException:
            for req in rows:                                   # never leave blocks behind a failed pass
                self._remove(req)
                req.finish("error")
            raise
        report.forward_tokens, report.padded_tokens = int(sum(chunks)), B * T
        now = time.perf_counter()
        for b, (req, n) in enumerate(zip(rows, chunks)):
            req.num_cached += n
            if req.status == "prefill":
                self.prefill_tokens_computed += n
            self._register_full_blocks(req)
            if req.num_pending == 0:
                self._sample(req, logits[b], now, report)

    def _register_full_blocks(self, req: Request) -> None:
        if not self.blocks.prefix_caching:
            return
        bs, ids = self.block_size, req.all_ids
        for i in range(req.hashed_blocks, req.num_cached // bs):
            req.last_hash = self.blocks.register(req.block_table[i], req.last_hash, ids[i * bs:(i + 1) * bs])
            req.hashed_blocks = i + 1

    def _sample(self, req: Request, logits: np.ndarray, now: float, report: StepReport) -> None:
        """The same draw and the same stop rules as `engine.generate` for this request alone."""
        tok = sample(logits, req.temperature, req.top_k, req.top_p, req.rng)
        req.record_token(tok, now)
        req.status = "running"
        report.tokens_produced += 1
        reason = None
        if req.stop_at_eos and tok in self.eos:
            reason = "eos"
        elif len(req.token_ids) >= req.max_new_tokens:
            reason = "length"
        elif req.num_cached >= self.model.config.max_position_embeddings:
            reason = "context"
        if reason:
            self._remove(req)
            req.finish(reason, now)
            report.finished.append(req.request_id)
