"""The loop under `generate` and `record_generation`: prefill the prompt chunk by chunk, then one decode step per
token, with per-call instruments, a stop event and progress callbacks.

Timing convention (TTFT and ITL as a user feels them): a token's `seconds` is the forward pass that produced its
logits PLUS sampling it from them. For step 0 that is the whole prefill (all chunks) + sampling = TTFT.
Callbacks, hooks' own bookkeeping outside the forward pass, and the consumer's work between tokens are not counted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from engine.errors import ModelError
from engine.model.hooks import Hooks
from engine.model.kv_cache import KVCache
from engine.model.sampling import sample_with_prob
from engine.model.stopping import FinishReason, eos_ids, finish_reason
from engine.model.trace import Trace
from specs.model_config import ModelConfig


class LoopModel(Protocol):
    """What the generation loops use of a model (`engine.model.model.Model` is one): its config, tokenizer (or
    None), a forward pass over a cache, and prompt checks. A protocol, so that the loops need not import the Model
    class, whose `generate` method calls them."""
    config: ModelConfig
    tokenizer: Any

    def forward(self, tokens: np.ndarray, cache: KVCache, n_valid: Sequence[int] | None = None,
                all_logits: bool = False, trace: Trace | None = None, hooks: Hooks | None = None) -> np.ndarray: ...

    def new_cache(self, batch: int = 1, capacity: int | None = None, window_extra: int = 0) -> KVCache: ...

    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]: ...

    def check_prompt(self, ids: Sequence[int]) -> None: ...

Progress = Callable[[int, int, str], None]          # on_progress(done_tokens, total_tokens, phase)
HooksFor = Callable[[str, bool], "Hooks | None"]    # hooks_for(phase, last_prefill_chunk) -> hooks of one pass


@dataclass
class LoopStep:
    step: int                        # 0 = sampled from the prefill logits
    token_id: int
    prob: float                      # probability of token_id under the sampling distribution
    logits: np.ndarray               # [V] the logits it was sampled from
    seconds: float                   # forward pass (prefill: all chunks) + sampling
    text: str                        # streamed piece ("" without a tokenizer, or for an EOS token)
    cache: KVCache                   # the run's cache after this step's forward pass
    finish_reason: str | None        # "eos" | "length" | "context" | "stopped" on the last step


def check_controls(stop, on_progress, chunk_size) -> None:
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise ModelError(f"stop must be a threading.Event (or None), got {stop!r}")
    if on_progress is not None and not callable(on_progress):
        raise ModelError("on_progress must be a function (done_tokens, total_tokens, phase)")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer))
                                   or chunk_size < 1):
        raise ModelError(f"chunk_size must be a whole number ≥ 1 (or None for one chunk), got {chunk_size!r}")


def run_tokens(model: LoopModel, ids: Sequence[int], max_new: int, temperature: float, top_k: int, top_p: float,
               seed: int | None, stop_at_eos: bool = True, chunk_size: int | None = None,
               trace: Trace | None = None, hooks_for: HooksFor | None = None, stop=None,
               on_progress: Progress | None = None,
               prefill_chunks: list[tuple[int, float]] | None = None) -> Iterator[LoopStep]:
    """Yield one `LoopStep` per generated token. Arguments are assumed checked (see `engine.model.generate`).

    Stops at EOS, after max_new tokens, when the context window is full, or when `stop` is set (checked after
    every forward pass; set during prefill, the run ends after the current chunk without a token). Each prefill
    chunk's (tokens, seconds) is appended to `prefill_chunks` when given.
    """
    ctx = model.config.max_position_embeddings
    capacity = min(len(ids) + max_new, ctx)
    cache = model.new_cache(1, capacity)
    rng = np.random.default_rng(seed)
    eos = eos_ids(model)
    decoder = None
    if model.tokenizer is not None:
        from engine.load.tokenizer import StreamDecoder
        decoder = StreamDecoder(model.tokenizer, continuation=True)   # keep the space before the first word
    ids = np.asarray(list(ids), np.int64)
    n, size = ids.size, int(chunk_size or ids.size)
    chunks = [] if prefill_chunks is None else prefill_chunks
    for s in range(0, n, size):
        hooks = hooks_for("prefill", s + size >= n) if hooks_for else None
        t0 = time.perf_counter()
        logits = model.forward(ids[None, s:s + size], cache, trace=trace, hooks=hooks)[0]
        chunks.append((min(size, n - s), time.perf_counter() - t0))
        if on_progress:
            on_progress(min(s + size, n), n, "prefill")
        if stop is not None and stop.is_set() and s + size < n:
            return                                                      # stopped mid-prompt: no token
    seconds = sum(t for _, t in chunks)
    step = 0
    while True:
        t0 = time.perf_counter()
        tok, prob = sample_with_prob(logits, temperature, top_k, top_p, rng)
        seconds += time.perf_counter() - t0
        finish = finish_reason(tok, eos, stop_at_eos, step + 1, max_new, int(cache.lengths[0]), capacity)
        if finish is None and stop is not None and stop.is_set():
            finish = FinishReason.STOPPED
        text = ""
        if decoder is not None:
            text = "" if finish == "eos" else decoder.push(tok)
            if finish:
                text += decoder.flush()
        yield LoopStep(step=step, token_id=tok, prob=prob, logits=logits, seconds=seconds, text=text, cache=cache,
                       finish_reason=finish)
        if on_progress:
            on_progress(step + 1, max_new, "decode")
        if finish:
            return
        hooks = hooks_for("decode", True) if hooks_for else None
        t0 = time.perf_counter()
        logits = model.forward(np.array([[tok]], np.int64), cache, trace=trace, hooks=hooks)[0]
        seconds = time.perf_counter() - t0
        step += 1
