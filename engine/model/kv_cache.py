"""Per-sequence state: the KV cache. Weights are shared and read-only; each user's session owns one of these."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import ModelError


@dataclass
class KVCache:
    """The contiguous cache. Any cache the forward pass takes offers the same five calls: `batch`, `lengths`,
    `check_room(n_valid)`, `write(layer, k, v, n_valid)`, `read(layer, n_keys)` and `advance(n_valid)` (a paged
    cache implements them through its block tables).

    Keys and values of every layer for a batch of sequences, preallocated to `capacity` positions.

    k[l], v[l]: [B, h_kv, capacity, d_k] float32.  lengths[b]: positions already filled for sequence b.
    Keys are stored after RoPE, so a cached key never needs rotating again.
    """
    k: list[np.ndarray]
    v: list[np.ndarray]
    lengths: np.ndarray          # [B] int64

    @classmethod
    def empty(cls, num_layers: int, batch: int, num_kv_heads: int, capacity: int, head_dim: int) -> "KVCache":
        shape = (batch, num_kv_heads, capacity, head_dim)
        return cls(k=[np.zeros(shape, np.float32) for _ in range(num_layers)],
                   v=[np.zeros(shape, np.float32) for _ in range(num_layers)],
                   lengths=np.zeros(batch, np.int64))

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def bytes_used(self) -> int:
        """Bytes of K and V actually filled: 2 · L · Σ lengths · h_kv · d_k · 4 (float32)."""
        _, h_kv, _, d = self.k[0].shape
        return int(2 * len(self.k) * int(self.lengths.sum()) * h_kv * d * self.k[0].itemsize)

    def bytes_per_layer(self) -> list[int]:
        """Bytes of K and V filled in each layer: 2 · Σ lengths · h_kv · d_k · itemsize (4, float32)."""
        _, h_kv, _, d = self.k[0].shape
        return [int(2 * int(self.lengths.sum()) * h_kv * d * k.itemsize) for k in self.k]

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
        """K and V of `layer` for positions [0, n_keys) of every sequence.   -> [B, h_kv, n_keys, d] each (views)"""
        return self.k[layer][:, :, :n_keys], self.v[layer][:, :, :n_keys]

    def advance(self, n_valid: np.ndarray) -> None:
        """After every layer has written: the new tokens now count as cached."""
        self.lengths += np.asarray(n_valid, np.int64)

    def write(self, layer: int, k_new: np.ndarray, v_new: np.ndarray, n_valid: np.ndarray) -> None:
        """Append the first n_valid[b] rows of k_new/v_new [B, h_kv, T, d] at each sequence's current length."""
        K, V = self.k[layer], self.v[layer]
        for b in range(K.shape[0]):
            n, start = int(n_valid[b]), int(self.lengths[b])
            if n:
                K[b, :, start:start + n] = k_new[b, :, :n]
                V[b, :, start:start + n] = v_new[b, :, :n]
