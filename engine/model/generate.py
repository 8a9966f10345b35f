"""Generation loops built on `Model.forward`: one streamed sequence, or a batch of sequences together."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from engine.errors import ModelError
from engine.model.hooks import Hooks
from engine.model.kv_cache import KVCache
from engine.model.sampling import check_sampling, sample
from engine.model.stopping import check_max_new_tokens, eos_ids, finish_reason
from engine.model.token_loop import LoopModel, check_controls, run_tokens
from engine.model.trace import Trace



@dataclass
class Generated:
    """One generated token, as the generator yields it."""
    token_id: int
    text: str                 # new text this token adds (streaming detokenization; "" without a tokenizer)
    step: int                 # 0 for the token sampled from the prefill, then 1, 2, ...
    seconds: float            # forward pass that produced its logits + sampling it (TTFT for step 0, ITL after)
    kv_cache_bytes: int       # bytes of K/V filled after this step
    finish_reason: str | None = None   # "eos" | "length" | "context" on the last token


def generate(model: LoopModel, prompt: str | Sequence[int], max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop_at_eos: bool = True,
             chunk_size: int | None = None, hooks: Hooks | None = None, trace: Trace | None = None,
             stop=None, on_progress=None) -> Iterator[Generated]:
    """Prefill the prompt, then decode one token per step, yielding each token as soon as it exists.

    Stops at an end-of-sequence token, after `max_new_tokens`, when the context window is full, or when `stop`
    (a threading.Event) is set: the run then ends after the current forward pass (finish_reason "stopped"; set
    during a chunked prefill, it ends after the current chunk and yields nothing). `on_progress(done, total,
    phase)` is called after each prefill chunk ("prefill") and each token ("decode"). `hooks` and `trace` are
    this call's instruments, given to every forward pass. A token's `seconds` is the forward pass that produced
    its logits plus sampling it: TTFT for the first token (prefill + sampling), the inter-token latency after.
    All argument checks happen before the first token, so a bad option fails fast with a ModelError.
    """
    max_new = check_max_new_tokens(max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    check_controls(stop, on_progress, chunk_size)
    ids = model.encode_prompt(prompt)
    model.check_prompt(ids)
    if ids and (min(ids) < 0 or max(ids) >= model.config.vocab_size):
        raise ModelError(f"token ids must be in [0, {model.config.vocab_size})")
    if hooks:
        hooks.check(model.config, None)                                   # bad layer/head index: fail now
    hooks_for = (lambda phase, last: hooks) if hooks else None
    steps = run_tokens(model, ids, max_new, temperature, top_k, top_p, seed, stop_at_eos, chunk_size,
                       trace=trace, hooks_for=hooks_for, stop=stop, on_progress=on_progress)
    return (Generated(token_id=s.token_id, text=s.text, step=s.step, seconds=s.seconds,
                      kv_cache_bytes=s.cache.bytes_used(), finish_reason=s.finish_reason) for s in steps)


def generate_batch(model: LoopModel, prompts: Sequence[Sequence[int]], max_new_tokens: int = 16,
                   temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                   seed: int | Sequence[int] | None = None, stop_at_eos: bool = True,
                   with_finish_reasons: bool = False):
    """Several sequences of different lengths in one batch: one padded prefill, then batched decode steps.

    Each sequence keeps its own positions, cache length and random stream (row b draws from
    `np.random.default_rng(seed + b)`, or `seed[b]` when a list is given, so row b samples exactly what
    `generate(model, prompts[b], seed=that seed)` samples). Each row stops on its own: "eos", "length" (max_new_tokens)
    or "context" (its cache reached the context window); a finished row leaves the batch, so later decode steps
    run only the rows still going.

    returns the new token ids of each sequence; with `with_finish_reasons=True`, (ids, finish reasons).
    """
    max_new = check_max_new_tokens(max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    prompts = [model.encode_prompt(p) for p in prompts]
    if not prompts:
        raise ModelError("generate_batch needs at least one prompt")
    for p in prompts:
        model.check_prompt(p)
    B, lens = len(prompts), np.array([len(p) for p in prompts])
    seeds = _row_seeds(seed, B)
    ctx = model.config.max_position_embeddings
    cache = model.new_cache(B, int(min(lens.max() + max_new - 1, ctx)))   # the last token is never fed back
    tokens = np.zeros((B, lens.max()), np.int64)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    rngs = [np.random.default_rng(s) for s in seeds]
    eos = eos_ids(model)
    logits = model.forward(tokens, cache, n_valid=lens)               # [B, V]
    out: list[list[int]] = [[] for _ in range(B)]
    reasons: list[str | None] = [None] * B
    rows = list(range(B))                                             # original index of each cache row
    while rows:
        nxt = np.array([sample(logits[i], temperature, top_k, top_p, rngs[b]) for i, b in enumerate(rows)])
        keep = []
        for i, b in enumerate(rows):
            out[b].append(int(nxt[i]))
            reason = finish_reason(int(nxt[i]), eos, stop_at_eos, len(out[b]), max_new, int(cache.lengths[i]), ctx)
            if reason is None:
                keep.append(i)
            else:
                reasons[b] = reason
        if not keep:
            break
        if len(keep) < len(rows):                                     # finished rows leave the batch
            cache, nxt, rows = _keep_rows(cache, keep), nxt[keep], [rows[i] for i in keep]
        logits = model.forward(nxt[:, None], cache, n_valid=np.ones(len(rows), np.int64))
    return (out, reasons) if with_finish_reasons else out


def _row_seeds(seed: int | Sequence[int] | None, batch: int) -> list:
    if seed is None or isinstance(seed, (int, np.integer)):
        return [None if seed is None else int(seed) + b for b in range(batch)]
    seeds = list(seed)
    if len(seeds) != batch:
        raise ModelError(f"seed: give one seed per prompt ({batch}), got {len(seeds)}")
    return seeds


def _keep_rows(cache: KVCache, rows: list[int]) -> KVCache:
    """A cache holding only `rows` of `cache` (one copy when rows finish, instead of decoding them for nothing)."""
    return cache.keep_rows(rows)


def generation_summary(tokens: Sequence["Generated"]) -> dict[str, float]:
    """What a streamed reply cost, from the engine's per-token timings: TTFT (the prefill pass that produced the
    first token's logits + sampling it), mean inter-token latency (each later decode step + its sampling),
    decode rate = 1 / mean ITL, KV bytes."""
    seconds = np.array([t.seconds for t in tokens], dtype=float)
    itl = float(seconds[1:].mean()) if seconds.size > 1 else float("nan")
    return {
        "ttft_ms": float(seconds[0] * 1e3) if seconds.size else float("nan"),
        "mean_itl_ms": itl * 1e3,
        "decode_tokens_per_s": 1.0 / itl if itl > 0 else float("nan"),
        "kv_cache_bytes": float(tokens[-1].kv_cache_bytes) if tokens else 0.0,
    }
