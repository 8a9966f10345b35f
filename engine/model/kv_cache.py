"""Per-sequence state: the KV cache. Weights are shared and read-only; each user's session owns one of these."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.errors import ModelError


@dataclass
class KVCache:
    """The contiguous cache. Any cache the forward pass takes offers the same calls: `batch`, `lengths`,
    `check_room(n_valid)`, `first_kept(layer)`, `write(layer, k, v, n_valid)`, `read(layer, n_keys)` and
    `advance(n_valid)` (a paged cache implements them through its block tables).

    Keys and values of every layer for a batch of sequences, preallocated to `capacity` positions.

    k[l], v[l]: [B, h_kv, capacity, d_k] float32.  lengths[b]: positions already filled for sequence b.
    Keys are stored after RoPE, so a cached key never needs rotating again.

    Sliding-window layers (`windows[l]` = W, Gemma 3's local layers) keep only the last W positions of each
    sequence: k[l] is [B, h_kv, W, d_k], slot j holding position first[b] + j. During a pass the new keys are
    appended after the kept ones (the array grows for that pass), and `advance` drops what fell out of the window,
    so a long prompt's local layers stop growing at W positions. (`windows[l]` may be W + a few extra positions:
    speculative decoding keeps them so that it can take back rejected drafts, see `truncate`.)
    """
    k: list[np.ndarray]
    v: list[np.ndarray]
    lengths: np.ndarray          # [B] int64
    windows: list[int | None] = field(default_factory=list)   # per layer: W for a sliding-window layer, else None
    max_positions: int = 0       # positions a sequence may reach (the full layers' capacity)
    first: np.ndarray | None = None   # [B] position in slot 0 of every sliding-window layer (0 until one slides)
    attended_window: int | None = None   # W the model attends (≤ the windows kept); None: no sliding layer

    @classmethod
    def empty(cls, num_layers: int, batch: int, num_kv_heads: int, capacity: int, head_dim: int,
              windows: list[int | None] | None = None, extra: int = 0) -> "KVCache":
        """extra: positions a sliding-window layer keeps beyond its window (0: exactly the last W)."""
        attended = next((w for w in windows or [] if w is not None), None)
        windows = [None if w is None else w + extra for w in windows] if windows else [None] * num_layers
        shapes = [(batch, num_kv_heads, capacity if w is None else min(w, capacity), head_dim) for w in windows]
        return cls(k=[np.zeros(s, np.float32) for s in shapes], v=[np.zeros(s, np.float32) for s in shapes],
                   lengths=np.zeros(batch, np.int64), windows=windows, max_positions=capacity,
                   attended_window=attended)

    def __post_init__(self) -> None:
        if not self.windows:
            self.windows = [None] * len(self.k)
        if not self.max_positions:
            full = [a.shape[2] for a, w in zip(self.k, self.windows) if w is None]
            self.max_positions = full[0] if full else self.k[0].shape[2]
        if self.first is None:
            self.first = np.zeros(len(self.lengths), np.int64)

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.max_positions

    def held(self, layer: int) -> np.ndarray:
        """Positions layer `layer` holds for each sequence: lengths, or at most W on a sliding-window layer. [B]"""
        return self.lengths if self.windows[layer] is None else self.lengths - self.first

    def first_kept(self, layer: int) -> np.ndarray:
        """Position held in slot 0 of `layer` for each sequence (0 unless a window dropped older ones).   [B]"""
        return np.zeros_like(self.lengths) if self.windows[layer] is None else self.first

    def bytes_per_layer(self) -> list[int]:
        """Bytes of K and V filled in each layer: 2 · Σ held positions · h_kv · d_k · itemsize (4, float32), where
        a sliding-window layer holds min(length, W) positions."""
        _, h_kv, _, d = self.k[0].shape
        return [int(2 * int(self.held(l).sum()) * h_kv * d * k.itemsize) for l, k in enumerate(self.k)]

    def bytes_used(self) -> int:
        """Bytes of K and V actually filled: 2 · L · Σ lengths · h_kv · d_k · 4 (float32) when no layer has a
        window; the sum of `bytes_per_layer` in general."""
        return sum(self.bytes_per_layer())

    def bytes_reserved(self) -> int:
        """Bytes allocated for the whole capacity (what a reserve-for-max allocator pays)."""
        return int(sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v))

    def check_room(self, new_tokens: np.ndarray) -> None:
        need = self.lengths + new_tokens
        if np.any(need > self.capacity):
            b = int(np.argmax(need > self.capacity))
            raise ModelError(f"sequence {b} would need {int(need[b])} positions but the KV cache holds "
                             f"{self.capacity} (the context window); shorten the prompt or max_new_tokens")

    def read(self, layer: int, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of `layer` in slots [0, n_keys) of every sequence.   -> [B, h_kv, n_keys, d] each (views)
        (slot = position, except on a sliding-window layer, where slot j holds position first_kept(layer) + j)"""
        return self.k[layer][:, :, :n_keys], self.v[layer][:, :, :n_keys]

    def advance(self, n_valid: np.ndarray) -> None:
        """After every layer has written: the new tokens now count as cached (and windows drop what fell out)."""
        n_valid = np.asarray(n_valid, np.int64)
        filled = self.lengths - self.first + n_valid                  # slots of a sliding layer after the writes
        windows = [(layer, w) for layer, w in enumerate(self.windows) if w is not None]
        for layer, w in windows:
            self._slide(layer, w, filled)
        if windows:
            self.first += np.maximum(filled - windows[0][1], 0)
        self.lengths += n_valid

    def truncate(self, length: int, row: int = 0) -> None:
        """Forget row's K/V from position `length` on (rejected speculative drafts); the next write overwrites
        them. A sliding-window layer must still hold the W - 1 positions before `length`."""
        length = min(int(self.lengths[row]), int(length))
        if self.attended_window is not None and self.first[row] > max(0, length - self.attended_window + 1):
            raise ModelError(f"cannot take the cache back to {length} positions: its sliding-window layers "
                             f"already dropped position {int(self.first[row]) - 1}; keep extra positions "
                             f"(new_cache(..., window_extra=k)) to rewind by up to k")
        self.lengths[row] = length

    def write(self, layer: int, k_new: np.ndarray, v_new: np.ndarray, n_valid: np.ndarray) -> None:
        """Append the first n_valid[b] rows of k_new/v_new [B, h_kv, T, d] after each sequence's held slots."""
        held = self.held(layer)
        if self.windows[layer] is not None:
            self._make_room(layer, int((held + np.asarray(n_valid)).max()))
        K, V = self.k[layer], self.v[layer]
        for b in range(K.shape[0]):
            n, start = int(n_valid[b]), int(held[b])
            if n:
                K[b, :, start:start + n] = k_new[b, :, :n]
                V[b, :, start:start + n] = v_new[b, :, :n]

    def keep_rows(self, rows: list[int]) -> "KVCache":
        """A cache holding only `rows` (one copy when rows finish, instead of decoding them for nothing)."""
        return KVCache(k=[a[rows] for a in self.k], v=[a[rows] for a in self.v], lengths=self.lengths[rows].copy(),
                       windows=list(self.windows), max_positions=self.max_positions, first=self.first[rows].copy(),
                       attended_window=self.attended_window)

    # ------------------------------------------------------------------------------------ sliding windows
    def _make_room(self, layer: int, slots: int) -> None:
        """A sliding-window layer's arrays grow for one pass when its new tokens do not fit after the kept ones."""
        K = self.k[layer]
        if slots > K.shape[2]:
            pad = ((0, 0), (0, 0), (0, slots - K.shape[2]), (0, 0))
            self.k[layer], self.v[layer] = np.pad(K, pad), np.pad(self.v[layer], pad)

    def _slide(self, layer: int, window: int, filled: np.ndarray) -> None:
        """Keep each sequence's last `window` of its `filled` slots, moved to slots [0, window); shrink to W."""
        K, V = self.k[layer], self.v[layer]
        for b, n in enumerate(int(x) for x in filled):
            if n > window:
                K[b, :, :window] = K[b, :, n - window:n].copy()
                V[b, :, :window] = V[b, :, n - window:n].copy()
        if K.shape[2] > window:
            self.k[layer], self.v[layer] = K[:, :, :window].copy(), V[:, :, :window].copy()
