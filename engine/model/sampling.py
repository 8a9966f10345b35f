"""Turning logits into the next token: greedy, temperature, top-k, top-p (nucleus)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from engine.errors import ModelError


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and 0 <= temperature <= 100):
        raise ModelError(f"temperature must be a number between 0 and 100 (0 = greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ModelError(f"top_k must be a whole number ≥ 0 (0 = off), got {top_k!r}")
    if not (isinstance(top_p, (int, float)) and math.isfinite(top_p) and 0 < top_p <= 1):
        raise ModelError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")


def sampling_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution the sampler draws from.   [V] -> [V] (sums to 1)

    temperature 0 puts all mass on the argmax; top_k keeps the k most likely tokens; top_p keeps the smallest set
    of most likely tokens whose probability reaches p. Filters apply after temperature, as in Hugging Face.
    """
    check_sampling(temperature, top_k, top_p)
    logits = np.asarray(logits, np.float64)
    if temperature == 0:
        p = np.zeros_like(logits)
        p[int(np.argmax(logits))] = 1.0
        return p
    z = logits / temperature
    if top_k and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = cum - p[order] < top_p                   # a token stays if the mass before it is below p
        drop = order[~keep]
        p[drop] = 0.0
        p /= p.sum()
    return p


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """Draw one token id from `sampling_probs` (greedy when temperature is 0)."""
    return sample_with_prob(logits, temperature, top_k, top_p, rng)[0]


def sample_with_prob(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                     rng: np.random.Generator) -> tuple[int, float]:
    """`sample`, plus the chosen token's probability under the distribution it was drawn from (1.0 for greedy)."""
    if temperature == 0:
        check_sampling(temperature, top_k, top_p)
        return int(np.argmax(logits)), 1.0
    p = sampling_probs(logits, temperature, top_k, top_p)
    tok = int(rng.choice(p.size, p=p))
    return tok, float(p[tok])


def token_probability(logits: np.ndarray, token_id: int) -> float:
    """Probability of one token under softmax(logits) at temperature 1: the model's own confidence, whatever the
    sampler (greedy picks with probability 1) did.   [V] -> float"""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max())
    return float(p[int(token_id)] / p.sum())


def top_alternatives(logits: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """The k most likely tokens under softmax(logits) at temperature 1, most likely first.   [V] -> ids, probs"""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    k = min(int(k), p.size)
    if k <= 0:
        return [], []
    top = np.argpartition(-p, k - 1)[:k]
    top = top[np.argsort(-p[top], kind="stable")]
    return [int(i) for i in top], [float(p[i]) for i in top]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p of every token under softmax(logits) at temperature 1, in float64.   [..., V] -> [..., V]"""
    z = np.asarray(logits, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def top_logprobs(logprobs: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The k most likely (token id, log p), most likely first (ties: lower id first).   [V] -> k pairs"""
    k = min(int(k), logprobs.size)
    if k <= 0:
        return ()
    top = np.argpartition(-logprobs, k - 1)[:k]
    top = top[np.lexsort((top, -logprobs[top]))]
    return tuple((int(i), float(logprobs[i])) for i in top)


def check_penalties(presence: float, frequency: float) -> None:
    for name, v in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not -2 <= v <= 2:
            raise ModelError(f"{name} must be a number between -2 and 2 (0 = off), got {v!r}")


def apply_penalties(logits: np.ndarray, generated: Sequence[int], presence: float, frequency: float) -> np.ndarray:
    """OpenAI's presence and frequency penalties over the tokens generated so far (not the prompt):
    logit[j] − c[j]·frequency − (c[j] > 0)·presence, c[j] = times token j was generated.   [V] -> [V] (a copy)"""
    out = np.array(logits, np.float32, copy=True)
    if generated and (presence or frequency):
        ids, counts = np.unique(np.asarray(generated, np.int64), return_counts=True)
        out[ids] -= (counts * frequency + presence).astype(np.float32)
    return out
