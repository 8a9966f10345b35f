"""A timed, counted run of the engine: one prefill, then decode steps, each under its own `Trace(timing=True)`.

The "Your machine" page and `bench/` compare these measurements with the calculators' predictions.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from engine.errors import ModelError
from engine.model.model import Model
from engine.model.trace import Trace


@dataclass
class ProfileRun:
    prompt_tokens: int
    prefill: Trace                # one Trace for the whole prompt
    decodes: list[Trace]          # one Trace per decode step

    @property
    def prefill_ms(self) -> float:
        return self.prefill.total("seconds") * 1e3

    @property
    def step_ms(self) -> list[float]:
        return [tr.total("seconds") * 1e3 for tr in self.decodes]

    @property
    def itl_ms(self) -> float:
        """Median decode step: the first steps pay for touching fresh memory pages, the median ignores them."""
        return statistics.median(self.step_ms)

    @property
    def decode_all(self) -> Trace:
        """Every decode step's records in one Trace (for per-op totals)."""
        return Trace(timing=True, records=[r for tr in self.decodes for r in tr.records])


def profile_run(model: Model, prompt_tokens: int, decode_steps: int, seed: int = 0) -> ProfileRun:
    """Prefill `prompt_tokens` random token ids, then greedy-decode `decode_steps` tokens, timing every op."""
    ctx = model.config.max_position_embeddings
    if prompt_tokens < 1 or decode_steps < 1 or prompt_tokens + decode_steps > ctx:
        raise ModelError(f"prompt tokens ({prompt_tokens}) + decode steps ({decode_steps}) must be ≥ 1 each and "
                         f"fit in the context window ({ctx})")
    ids = [int(t) for t in np.random.default_rng(seed).integers(0, model.config.vocab_size, prompt_tokens)]
    cache = model.new_cache(1, prompt_tokens + decode_steps)
    prefill = Trace(timing=True)
    token = int(np.argmax(model.prefill(ids, cache, trace=prefill)))
    decodes = []
    for _ in range(decode_steps):
        tr = Trace(timing=True)
        token = int(np.argmax(model.decode_step(token, cache, trace=tr)))
        decodes.append(tr)
    return ProfileRun(prompt_tokens=prompt_tokens, prefill=prefill, decodes=decodes)
