"""Log-probabilities of a prompt's own tokens: what an evaluation harness scores (lm-evaluation-harness's
loglikelihood asks the server to `echo` the prompt with `logprobs`).

Token i (i ≥ 1) gets log p(ids[i] | ids[:i]) = log_softmax(logits at position i−1)[ids[i]]; the first token has
none (nothing precedes it). The prompt runs through the model in chunks on a private cache, so the logits held at
once are [chunk, V], never [T, V] (8,192 × 49,152 float32 would be 1.6 GB).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.errors import ModelError
from engine.model.sampling import log_softmax, top_logprobs

CHUNK = 128


def prompt_logprobs(model, ids: Sequence[int], top: int = 0, chunk: int = CHUNK
                    ) -> list[tuple[float, tuple[tuple[int, float], ...]] | None]:
    """[None, (log p of ids[1], its `top` most likely alternatives), ..., (log p of ids[-1], ...)]"""
    ids = [int(t) for t in ids]
    if not ids:
        raise ModelError("the prompt is empty")
    if len(ids) > model.config.max_position_embeddings:
        raise ModelError(f"{len(ids)} tokens exceed the context window ({model.config.max_position_embeddings})")
    cache = model.new_cache(1, len(ids))
    out: list = [None]
    for s in range(0, len(ids) - 1, chunk):              # the last token predicts nothing the prompt holds
        piece = np.asarray(ids[s:min(s + chunk, len(ids) - 1)], np.int64)
        lp = log_softmax(model.forward(piece[None, :], cache, all_logits=True)[0])       # [c, V]
        nxt = np.asarray(ids[s + 1:s + 1 + piece.size])
        chosen = lp[np.arange(piece.size), nxt]
        out += [(float(chosen[j]), top_logprobs(lp[j], top)) for j in range(piece.size)]
    return out
