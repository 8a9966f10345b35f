"""A recorded generation: per step the token, its probability, the top-k alternatives, the KV cache's bytes per
layer, the time, and on request attention rows and the new K/V rows. Pages draw from the record; it belongs to
the caller (a session), never to the shared model.

    rec = record_generation(model, ids, max_new_tokens=16, attention_layers=[0], kv_layers=[0])
    rec.steps[3].attention[(0, 2)]     # layer 0, head 2: where the query that produced token 3 looked
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from engine.errors import ModelError
from engine.model.stopping import check_max_new_tokens
from engine.model.hooks import Hooks, _indices
from engine.model.sampling import check_sampling, token_probability, top_alternatives
from engine.model.token_loop import Progress, check_controls, run_tokens
from specs.model_config import ModelConfig

if TYPE_CHECKING:
    from engine.model.model import Model


@dataclass
class StepRecord:
    step: int                          # 0 = the token sampled from the prefill logits
    token_id: int
    text: str                          # streamed piece ("" without a tokenizer)
    prob: float                        # probability of token_id under the sampling distribution
    top_ids: list[int]                 # alternatives under softmax at temperature 1, most likely first
    top_probs: list[float]
    seconds: float                     # the forward pass that produced this token's logits + sampling
    cache_tokens: int                  # positions in the KV cache after this step's forward pass
    kv_bytes_per_layer: list[int]      # 2 · kv_heads · head_dim · cache_tokens · 4 each (float32)
    attention: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)   # (layer, head) -> [cache_tokens]
    k_new: dict[int, np.ndarray] = field(default_factory=dict)                    # layer -> [h_kv, T_new, d]
    v_new: dict[int, np.ndarray] = field(default_factory=dict)
    model_prob: float = float("nan")   # probability of token_id under softmax at temperature 1 (the model's own)

    @property
    def kv_bytes(self) -> int:
        return int(sum(self.kv_bytes_per_layer))


@dataclass
class GenerationRecord:
    prompt_ids: list[int]
    config: ModelConfig
    prefill_seconds: float = 0.0                                  # all prefill chunks' forward passes
    prefill_chunks: list[tuple[int, float]] = field(default_factory=list)   # (tokens, seconds) per chunk
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: str = "stopped"                                # "eos" | "length" | "context" | "stopped"

    @property
    def generated_ids(self) -> list[int]:
        return [s.token_id for s in self.steps]

    @property
    def tokens_ids(self) -> list[int]:
        return list(self.prompt_ids) + self.generated_ids

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)


class _Capture:
    """Hooks for one step's forward pass(es): the last query's attention row and the appended K/V rows."""

    def __init__(self, layers: list[int], heads: np.ndarray | None, kv_layers: list[int]) -> None:
        self.layers, self.heads, self.kv_layers = layers, heads, kv_layers
        self.reset()

    def reset(self) -> None:
        self.attention: dict[tuple[int, int], np.ndarray] = {}
        self.new: dict[str, dict[int, list[np.ndarray]]] = {"hook_k": {}, "hook_v": {}}

    def hooks_for(self, phase: str, last_chunk: bool) -> Hooks | None:
        hooks = Hooks(layers=self.layers or None, heads=self.heads, rows=[-1])
        if self.layers and last_chunk:
            hooks.add("blocks.*.attn.hook_pattern", lambda name, x: self._pattern(hooks, name, x))
        for li in self.kv_layers:
            hooks.add(f"blocks.{li}.attn.hook_k", self._kv).add(f"blocks.{li}.attn.hook_v", self._kv)
        return hooks if hooks else None

    def _pattern(self, hooks: Hooks, name: str, x: np.ndarray) -> None:     # x [1, h_sel, 1, S]
        layer = int(name.split(".")[1])
        for i, head in enumerate(hooks.head_ids):
            self.attention[(layer, int(head))] = x[0, i, -1].copy()

    def _kv(self, name: str, x: np.ndarray) -> None:                       # x [1, T, h_kv, d]
        self.new[name.rsplit(".", 1)[1]].setdefault(int(name.split(".")[1]), []).append(x[0].transpose(1, 0, 2))

    def kv(self, point: str) -> dict[int, np.ndarray]:
        return {li: np.concatenate(parts, axis=1) for li, parts in self.new[point].items()}   # [h_kv, T_new, d]


def _check_layers(what: str, sel: Iterable[int] | None, n: int) -> list[int]:
    ids = _indices(what, list(sel) if sel is not None else [], n)
    return [int(i) for i in ids]


def record_generation(model: "Model", prompt_ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0,
                      top_k: int = 0, top_p: float = 1.0, seed: int | None = 0, alternatives: int = 5,
                      attention_layers: Iterable[int] = (), attention_heads: Iterable[int] | None = None,
                      kv_layers: Iterable[int] = (), chunk_size: int | None = None, stop=None,
                      on_progress: Progress | None = None) -> GenerationRecord:
    """Generate like `engine.model.generate.generate` and record every step (see `StepRecord`).

    attention_layers/attention_heads: which attention rows to keep (heads None = all query heads); kv_layers:
    which layers' new K/V rows to keep. stop (threading.Event): the run ends after the current forward pass,
    finish_reason "stopped". on_progress(done_tokens, total_tokens, phase) after each prefill chunk ("prefill")
    and each token ("decode"). A step's `seconds` is its forward pass plus sampling (step 0: TTFT).
    All argument checks happen before any work (ModelError).
    """
    c = model.config
    max_new = check_max_new_tokens(max_new_tokens)
    check_sampling(temperature, top_k, top_p)
    check_controls(stop, on_progress, chunk_size)
    ids = [int(t) for t in prompt_ids]
    model.check_prompt(ids)
    if min(ids) < 0 or max(ids) >= c.vocab_size:
        raise ModelError(f"token ids must be in [0, {c.vocab_size})")
    if isinstance(alternatives, bool) or not isinstance(alternatives, (int, np.integer)) or \
            not 0 <= alternatives <= c.vocab_size:
        raise ModelError(f"alternatives must be a whole number between 0 and {c.vocab_size}, got {alternatives!r}")
    layers = _check_layers("attention layer", attention_layers, c.num_layers)
    heads = None if attention_heads is None else _indices("attention head", list(attention_heads), c.num_heads)
    capture = _Capture(layers, heads, _check_layers("kv layer", kv_layers, c.num_layers))

    rec = GenerationRecord(prompt_ids=ids, config=c)
    for s in run_tokens(model, ids, max_new, temperature, top_k, top_p, seed, True, chunk_size,
                        hooks_for=capture.hooks_for, stop=stop, on_progress=on_progress,
                        prefill_chunks=rec.prefill_chunks):
        top_ids, top_probs = top_alternatives(s.logits, alternatives)
        model_prob = token_probability(s.logits, s.token_id)
        n = int(s.cache.lengths[0])
        rec.steps.append(StepRecord(
            step=s.step, token_id=s.token_id, text=s.text, prob=s.prob, top_ids=top_ids, top_probs=top_probs,
            seconds=s.seconds, cache_tokens=n, kv_bytes_per_layer=s.cache.bytes_per_layer(),
            attention=capture.attention, k_new=capture.kv("hook_k"), v_new=capture.kv("hook_v"),
            model_prob=model_prob))
        capture.reset()
        if s.finish_reason:
            rec.finish_reason = s.finish_reason
    rec.prefill_seconds = float(sum(t for _, t in rec.prefill_chunks))
    return rec
