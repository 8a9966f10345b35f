"""Named instrument points of the forward pass (TransformerLens style).

Names and shapes (B batch, T new tokens, S keys = cached + new, D hidden, F FFN, V vocab):
  hook_embed                      [B, T, D]            token embeddings
  blocks.{l}.hook_resid_pre       [B, T, D]            residual stream entering layer l
  blocks.{l}.attn.hook_q          [B, T, h_q, d_k]     queries after RoPE
  blocks.{l}.attn.hook_k          [B, T, h_kv, d_k]    new keys after RoPE (what is appended to the cache)
  blocks.{l}.attn.hook_v          [B, T, h_kv, d_k]    new values (appended to the cache)
  blocks.{l}.attn.hook_scores     [B, h_q, T, S]       scaled, masked dot products (-inf where hidden)
  blocks.{l}.attn.hook_pattern    [B, h_q, T, S]       softmax of the scores: the attention map
  blocks.{l}.attn.hook_kv_cache   [B]                  cache length per sequence after this layer's append
  blocks.{l}.hook_resid_mid       [B, T, D]            after the attention residual add
  blocks.{l}.mlp.hook_act         [B, T, F]            SiLU(gate) · up
  blocks.{l}.hook_resid_post      [B, T, D]            after the FFN residual add
  hook_final_norm                 [B, T', D]           final RMSNorm (T' = positions sent to the LM head)
  hook_logits                     [B, T', V]
A hook is `fn(name, array)`; it must not modify the array. With no hooks the forward pass only pays one
`if` per point.
"""
from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Callable, Iterable

import numpy as np

HookFn = Callable[[str, np.ndarray], None]


class Hooks:
    """A set of hook functions keyed by name pattern (fnmatch: `blocks.*.attn.hook_pattern`)."""

    def __init__(self) -> None:
        self._fns: list[tuple[str, HookFn]] = []

    def add(self, pattern: str, fn: HookFn) -> None:
        self._fns.append((pattern, fn))

    def __bool__(self) -> bool:
        return bool(self._fns)

    def __call__(self, name: str, x: np.ndarray) -> None:
        for pattern, fn in self._fns:
            if pattern == name or fnmatch.fnmatchcase(name, pattern):
                fn(name, x)


class ActivationCache(dict):
    """Records copies of the arrays at hook points whose name matches one of `patterns` (bounded memory)."""

    def __init__(self, patterns: Iterable[str] = ("*",)) -> None:
        super().__init__()
        self.hooks = Hooks()
        for p in patterns:
            self.hooks.add(p, self._record)

    def _record(self, name: str, x: np.ndarray) -> None:
        self.setdefault(name, []).append(np.array(x, copy=True))


@contextmanager
def recording(model, patterns: Iterable[str] = ("*",)):
    """`with recording(model, ["blocks.*.attn.hook_pattern"]) as cache:` run the model; hooks never leak."""
    cache = ActivationCache(patterns)
    previous = model.hooks
    model.hooks = cache.hooks
    try:
        yield cache
    finally:
        model.hooks = previous
