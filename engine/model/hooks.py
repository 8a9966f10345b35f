"""Named instrument points of the forward pass (TransformerLens style), given PER CALL: `model.forward(...,
hooks=Hooks(...))`. Nothing is ever installed on the shared model, so two users recording at once never see each
other's activations.

Names and shapes (B batch, T new tokens, S keys = cached + new, D hidden, F FFN, V vocab):
  hook_embed                      [B, T, D]            token embeddings
  blocks.{l}.hook_resid_pre       [B, T, D]            residual stream entering layer l
  blocks.{l}.attn.hook_q          [B, T, h_q, d_k]     queries after RoPE
  blocks.{l}.attn.hook_k          [B, T, h_kv, d_k]    new keys after RoPE (what is appended to the cache)
  blocks.{l}.attn.hook_v          [B, T, h_kv, d_k]    new values (appended to the cache)
  blocks.{l}.attn.hook_scores     [B, h, t, S]         scaled, masked dot products (-inf where hidden), ONE BLOCK
  blocks.{l}.attn.hook_pattern    [B, h, t, S]         softmax of the scores (the attention map), ONE BLOCK
  blocks.{l}.attn.hook_kv_cache   [B]                  cache length per sequence after this layer's append
  blocks.{l}.hook_resid_mid       [B, T, D]            after the attention residual add
  blocks.{l}.mlp.hook_act         [B, T, F]            SiLU(gate) · up
  blocks.{l}.hook_resid_post      [B, T, D]            after the FFN residual add
  hook_final_norm                 [B, T', D]           final RMSNorm (T' = positions sent to the LM head)
  hook_logits                     [B, T', V]

A hook is `fn(name, array)`. The array is only valid during the call (copy what you keep) and must not be modified.

Attention scores exist one block of queries at a time (see `engine.model.forward.QUERY_BLOCK`), so the two attention
points are called once per block, and only for what `Hooks(layers=, heads=, rows=)` selects: h = selected query
heads (`hooks.head_ids`), t = selected query rows of this block (`hooks.block_rows`, indices among the T new
tokens). A hook therefore never holds more than one block of scores.
"""
from __future__ import annotations

import fnmatch
from typing import Callable, Iterable

import numpy as np

from engine.errors import ModelError

HookFn = Callable[[str, np.ndarray], None]
Selection = Iterable[int] | slice | None


def _indices(what: str, sel, n: int) -> np.ndarray | None:
    """Sorted unique indices in [0, n) from None (all), an iterable of ints (negative counts from the end) or a
    slice. Out-of-range -> ModelError naming `what`."""
    if sel is None:
        return None
    if isinstance(sel, slice):
        return np.arange(n)[sel]
    if isinstance(sel, (int, np.integer)):
        sel = [sel]
    out = []
    for i in sel:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ModelError(f"{what} must be whole numbers, got {i!r}")
        if not -n <= i < n:
            raise ModelError(f"{what} {int(i)} is out of range: there are {n} (0 to {n - 1})")
        out.append(int(i) % n)
    return np.unique(np.asarray(out, np.int64))


class Hooks:
    """Hook functions keyed by name pattern (fnmatch: `blocks.*.attn.hook_pattern`), plus which attention layers,
    query heads and query rows the attention points report (None = all). One object per call (or per session)."""

    def __init__(self, layers: Selection = None, heads: Selection = None, rows: Selection = None) -> None:
        self._fns: list[tuple[str, HookFn]] = []
        self._matches: dict[str, list[HookFn]] = {}
        self.layers, self.heads, self.rows = layers, heads, rows
        self.layer_ids: np.ndarray | None = None    # resolved by `check` for the current forward pass
        self.head_ids: np.ndarray | None = None
        self.row_ids: np.ndarray | None = None      # selected rows among the T new tokens
        self.block_rows: np.ndarray | None = None   # during an attention hook: rows of the array it gets
        self.passes = 0                             # forward passes these hooks were given so far

    def add(self, pattern: str, fn: HookFn) -> "Hooks":
        """Call `fn(name, array)` at every hook point whose name matches `pattern`; returns self (chainable)."""
        self._fns.append((pattern, fn))
        self._matches.clear()
        return self

    def __bool__(self) -> bool:
        return bool(self._fns)

    def _fns_for(self, name: str) -> list[HookFn]:
        fns = self._matches.get(name)
        if fns is None:
            fns = self._matches[name] = [fn for p, fn in self._fns if p == name or fnmatch.fnmatchcase(name, p)]
        return fns

    def wants(self, name: str) -> bool:
        return bool(self._fns_for(name))

    def __call__(self, name: str, x: np.ndarray) -> None:
        for fn in self._fns_for(name):
            fn(name, x)

    def check(self, config, new_tokens: int | None) -> None:
        """Check the selection against the model and resolve it for a forward pass of `new_tokens` tokens
        (None: check layers and heads only, e.g. before a generation whose passes have different lengths)."""
        self.layer_ids = _indices("attention layer", self.layers, config.num_layers)
        self.head_ids = _indices("attention head", self.heads, config.num_heads)
        if self.head_ids is None:
            self.head_ids = np.arange(config.num_heads)
        if new_tokens is None:
            return
        self.row_ids = _indices("query row", self.rows, new_tokens)
        if self.row_ids is None:
            self.row_ids = np.arange(new_tokens)

    def begin_pass(self, config, new_tokens: int) -> None:
        """Called by the forward pass before its first step."""
        self.check(config, new_tokens)
        self.passes += 1

    def attention(self, layer: int, point: str, scores: np.ndarray, start: int, end: int) -> None:
        """Report the selected heads/rows of one block of scores.   scores [B, h_kv, G, t, S], rows start..end-1"""
        name = f"blocks.{layer}.attn.{point}"
        if self.layer_ids is not None and layer not in self.layer_ids or not self.wants(name):
            return
        lo, hi = np.searchsorted(self.row_ids, [start, end])
        if lo == hi:
            return                                                       # no selected row in this block
        B, h_kv, G, t, S = scores.shape
        x = scores.reshape(B, h_kv * G, t, S)                           # query head = kv_head · G + g
        if self.head_ids.size != h_kv * G:
            x = x[:, self.head_ids]
        if hi - lo != t:
            x = x[:, :, self.row_ids[lo:hi] - start]
        self.block_rows = self.row_ids[lo:hi]
        try:
            self(name, x)
        finally:
            self.block_rows = None


class ActivationCache(dict):
    """What `run_with_cache` returns: name -> array for ONE sequence (batch axis dropped), holding only the hook
    points whose names match `names` and, for attention, only the selected layers/heads/rows. Attention blocks are
    written straight into one preallocated [h_sel, T_sel, S] array per layer, so nothing else is held."""

    def __init__(self, names: Iterable[str] = ("*",), layers: Selection = None, heads: Selection = None,
                 rows: Selection = None) -> None:
        super().__init__()
        self.hooks = Hooks(layers=layers, heads=heads, rows=rows)
        for p in ([names] if isinstance(names, str) else names):
            self.hooks.add(p, self._record)

    def _record(self, name: str, x: np.ndarray) -> None:
        if self.hooks.passes > 1:
            raise ModelError("an ActivationCache holds ONE forward pass: use run_with_cache, or a new "
                             "ActivationCache (or your own Hooks) for each pass")
        rows = self.hooks.block_rows
        if rows is None:
            self[name] = np.array(x[0], copy=True)
            return
        all_rows = self.hooks.row_ids
        if name not in self:
            self[name] = np.empty((x.shape[1], all_rows.size, x.shape[3]), x.dtype)
        at = int(np.searchsorted(all_rows, rows[0]))
        self[name][:, at:at + rows.size] = x[0]

    def names(self) -> list[str]:
        return sorted(self)

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.values()))


MAX_CAPTURE_BYTES = 2 ** 30   # run_with_cache refuses to hold more than this (one shared server, many users)


def hook_point_elements(config, tokens: int) -> dict[str, int]:
    """Every hook point -> float32 elements it carries for ONE sequence of `tokens` tokens from an empty cache
    (attention points: all heads, all query rows, S = tokens keys)."""
    c, T = config, tokens
    out = {"hook_embed": T * c.hidden_size, "hook_final_norm": T * c.hidden_size, "hook_logits": T * c.vocab_size}
    for li in range(c.num_layers):
        b = f"blocks.{li}."
        out.update({b + "hook_resid_pre": T * c.hidden_size, b + "hook_resid_mid": T * c.hidden_size,
                    b + "hook_resid_post": T * c.hidden_size, b + "attn.hook_q": T * c.q_dim,
                    b + "attn.hook_k": T * c.kv_dim, b + "attn.hook_v": T * c.kv_dim, b + "attn.hook_kv_cache": 2,
                    b + "attn.hook_scores": c.num_heads * T * T, b + "attn.hook_pattern": c.num_heads * T * T,
                    b + "mlp.hook_act": T * c.intermediate_size})
    return out


def capture_bytes(config, tokens: int, hooks: Hooks) -> int:
    """Bytes an ActivationCache with these (checked) hooks will hold after one pass over `tokens` tokens."""
    total = 0
    for name, n in hook_point_elements(config, tokens).items():
        if not hooks.wants(name):
            continue
        if name.endswith(("hook_scores", "hook_pattern")):
            layer = int(name.split(".")[1])
            if hooks.layer_ids is not None and layer not in hooks.layer_ids:
                continue
            n = hooks.head_ids.size * hooks.row_ids.size * tokens
        total += 4 * n
    return total


def run_with_cache(model, ids, names: Iterable[str] | str = ("blocks.*.attn.hook_pattern",), layers: Selection = None,
                   heads: Selection = None, rows: Selection = None,
                   max_bytes: int = MAX_CAPTURE_BYTES) -> tuple[np.ndarray, ActivationCache]:
    """One forward pass over `ids` (one sequence, fresh cache) that keeps only the named activations.

    -> logits [T, V] of every position, and an `ActivationCache`, e.g. acts["blocks.3.attn.hook_pattern"]
    [h_sel, T_sel, S]. layers/heads/rows restrict the attention points (None = all; heads and rows come back in
    ascending order; rows are query positions, negative counts from the end, or a slice). Bad indices, or a
    capture (logits included) over `max_bytes`, raise ModelError before any work.
    """
    ids = np.asarray(list(ids), np.int64)
    c = model.config
    if ids.size == 0:
        raise ModelError("the prompt is empty: give at least one token")
    if ids.size > c.max_position_embeddings:
        raise ModelError(f"{ids.size} tokens exceed {c.name}'s context window ({c.max_position_embeddings})")
    acts = ActivationCache(names, layers=layers, heads=heads, rows=rows)
    acts.hooks.check(c, ids.size)                                        # bad layer/head/row: fail before work
    need = capture_bytes(c, ids.size, acts.hooks) + 4 * ids.size * c.vocab_size
    if need > max_bytes:
        raise ModelError(f"this capture would hold {need / 2**20:,.0f} MiB (logits [{ids.size}, {c.vocab_size}] "
                         f"included), over the {max_bytes / 2**20:,.0f} MiB limit: ask for fewer layers, heads or "
                         f"query rows, fewer hook names, or a shorter prompt")
    logits = model.forward(ids[None, :], model.new_cache(1, ids.size), all_logits=True, hooks=acts.hooks)
    return logits[0], acts
