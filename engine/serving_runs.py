"""Small, bounded, measured runs of the serving techniques on a loaded model, for the "Serving many users" pages:
streams per step, a batch of prompts through the Scheduler, chunked prefill's effect on the decoding streams,
a repeated system prompt with and without the prefix cache, speculative versus plain greedy decoding.

Every run builds its own Scheduler (or caches) for the call: the shared model is only read.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from engine.errors import ModelError
from engine.model import Model
from engine.scheduler import Scheduler, StepReport
from engine.sequence import Request
from engine.speculative import early_exit_draft, speculative_generate

MAX_STREAMS = 64
MAX_NEW = 256


def _check(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ModelError(f"{name} must be a whole number from {lo} to {hi}, got {v!r}")
    return int(v)


def run_requests(model: Model, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], *,
                 block_size: int = 16, num_blocks: int | None = None, max_batch: int | None = None,
                 chunk_size: int | None = None, prefix_caching: bool = False,
                 stop_at_eos: bool = False) -> tuple[Scheduler, list[Request], list[StepReport]]:
    """Submit every prompt (greedy) to one Scheduler and run it to the end."""
    if not prompts or len(prompts) != len(max_new_tokens):
        raise ModelError("give one max_new_tokens per prompt, and at least one prompt")
    sched = Scheduler(model, block_size=block_size, num_blocks=num_blocks, max_batch=max_batch,
                      chunk_size=chunk_size, prefix_caching=prefix_caching)
    reqs = [sched.submit(list(p), max_new_tokens=_check("max new tokens", n, 1, MAX_NEW), stop_at_eos=stop_at_eos,
                         request_id=f"R{i}") for i, (p, n) in enumerate(zip(prompts, max_new_tokens))]
    return sched, reqs, sched.run()


def stream_throughput(model: Model, streams: int, new_tokens: int, prompt_ids: Sequence[int],
                      block_size: int = 16) -> dict:
    """`streams` identical greedy requests decoded together: decode tokens/s (prefill steps excluded) and the
    mean decode step. One weight read per step serves every stream."""
    b = _check("streams", streams, 1, MAX_STREAMS)
    _, _, reports = run_requests(model, [prompt_ids] * b, [new_tokens] * b, block_size=block_size, max_batch=b)
    dec = [r for r in reports if r.decoded and not r.prefilled]
    secs = sum(r.seconds for r in dec)
    toks = sum(r.tokens_produced for r in dec)
    return dict(streams=b, decode_steps=len(dec), decode_seconds=secs, decode_tokens=toks,
                decode_tok_s=toks / secs if secs else float("nan"),
                mean_step_ms=1e3 * secs / len(dec) if dec else float("nan"))


def chunked_prefill_run(model: Model, decode_prompts: Sequence[Sequence[int]], long_prompt: Sequence[int],
                        new_tokens: int, chunk_size: int | None, warmup_steps: int = 2) -> dict:
    """Requests decoding; after `warmup_steps` a long prompt arrives. The decoding requests' token gaps (ITL)
    while it is prefilled, whole (chunk_size None) or in chunks, and the long request's TTFT."""
    sched = Scheduler(model, block_size=16, max_batch=len(decode_prompts) + 1, chunk_size=chunk_size)
    decoders = [sched.submit(list(p), max_new_tokens=new_tokens, stop_at_eos=False, request_id=f"D{i}")
                for i, p in enumerate(decode_prompts)]
    reports = [sched.step() for _ in range(warmup_steps)]
    long_req = sched.submit(list(long_prompt), max_new_tokens=2, stop_at_eos=False, request_id="LONG")
    reports += sched.run()
    gaps = [g for r in decoders for g in r.itl_s]
    return dict(chunk_size=chunk_size, prefill_steps=sum(1 for r in reports if "LONG" in r.prefilled),
                itl_max_ms=1e3 * max(gaps), itl_median_ms=1e3 * float(np.median(gaps)),
                long_ttft_ms=1e3 * long_req.ttft_s, step_ms=[1e3 * r.seconds for r in reports],
                step_has_prefill=["LONG" in r.prefilled for r in reports],
                decoder_tokens=[list(r.token_ids) for r in decoders])


def prefix_cache_run(model: Model, system_ids: Sequence[int], questions: Sequence[Sequence[int]], new_tokens: int,
                     prefix_caching: bool, block_size: int = 16) -> dict:
    """The same system prompt before each question, served one after another by one Scheduler: prompt tokens
    computed versus served from cached blocks, and the prefill time of each request."""
    sched = Scheduler(model, block_size=block_size, max_batch=1, prefix_caching=prefix_caching)
    rows = []
    for i, q in enumerate(questions):
        req = sched.submit([*system_ids, *q], max_new_tokens=new_tokens, stop_at_eos=False, request_id=f"Q{i}")
        reports = sched.run()
        rows.append(dict(request=req.request_id, prompt_tokens=len(req.prompt_ids),
                         cached_tokens=req.prefix_cached_tokens,
                         computed_tokens=len(req.prompt_ids) - req.prefix_cached_tokens,
                         prefill_ms=1e3 * sum(r.seconds for r in reports if req.request_id in r.prefilled),
                         ttft_ms=1e3 * req.ttft_s, token_ids=list(req.token_ids)))
    return dict(prefix_caching=prefix_caching, rows=rows, free_blocks=sched.free_blocks,
                num_blocks=sched.num_blocks)


def speculative_vs_plain(model: Model, prompt_ids: Sequence[int], new_tokens: int, draft_layers: int,
                         draft_tokens: int) -> dict:
    """Greedy decoding twice: plain, and with an early-exit draft of `draft_layers` layers proposing
    `draft_tokens` per verification pass. Same tokens (checked), measured acceptance and wall-time speedup."""
    n = _check("new tokens", new_tokens, 1, MAX_NEW)
    t0 = time.perf_counter()
    plain = [g.token_id for g in model.generate(list(prompt_ids), max_new_tokens=n, stop_at_eos=False)]
    plain_s = time.perf_counter() - t0
    spec = speculative_generate(model, early_exit_draft(model, draft_layers), list(prompt_ids), n, draft_tokens,
                                stop_at_eos=False)
    return dict(plain_seconds=plain_s, speculative_seconds=spec.seconds, speedup=plain_s / spec.seconds,
                same_tokens=plain == spec.token_ids, alpha=spec.alpha, acceptance_rate=spec.acceptance_rate,
                tokens_per_pass=spec.tokens_per_pass, rounds=spec.rounds, draft_seconds=spec.draft_seconds,
                verify_seconds=spec.verify_seconds, token_ids=spec.token_ids,
                draft_cost_ratio=draft_layers / model.config.num_layers)
