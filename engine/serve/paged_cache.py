"""The paged KV cache: one pool of fixed-size blocks shared by every sequence, a block table per sequence.

003 Detail 16 (PagedAttention, Kwon et al. 2023). Token i of a sequence lives in logical block ⌊i/B⌋ at offset
i mod B; the sequence's block table maps the logical block to a physical block of the pool. A sequence holds
⌈n/B⌉ blocks, so at most B − 1 slots of its memory are ever empty.

It offers the same calls as the contiguous `KVCache` (`batch`, `lengths`, `check_room`, `write`, `read`,
`advance`), so `Model.forward` runs on it unchanged: `read` gathers each row's blocks back into the
[B, h_kv, S, d] layout attention expects.

Gathering every row's whole context in every layer of every step copies as many bytes as attention then reads
(16 rows of 256 tokens: 200 MB a step for SmolLM2, 15% of the step). So the gathered rows are kept between passes
(the mirror): while the same rows continue (the same block tables, each row's length where the last pass left it)
a pass writes its new K/V to the pool and to the mirror, and reads the mirror. Any other binding gathers afresh.
The pool stays the one source of truth: the mirror holds the same numbers, and is dropped, never trusted, when in
doubt (rows that share a table, a mirror over MIRROR_BYTES, a row past its room).
"""
from __future__ import annotations

import numpy as np

from engine.serve.block_manager import BlockManager, OutOfBlocks
from engine.errors import ModelError

MIRROR_BYTES = 512 * 2 ** 20   # K and V of every layer's mirror together, at most (else every read gathers)
MIRROR_ROOM = 64               # positions a mirror keeps past the longest row, so it lasts that many decode steps


class PagedKVCache:
    """k[l], v[l]: [num_blocks, h_kv, block_size, d] float32 pools. Rows = the sequences of the current batch:
    tables[b] is row b's block table (a list the caller may share with its request), lengths[b] its cached
    tokens."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, blocks: BlockManager,
                 max_positions: int, batch: int = 1) -> None:
        shape = (blocks.num_blocks, num_kv_heads, blocks.block_size, head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in range(num_layers)]
        self.v = [np.zeros(shape, np.float32) for _ in range(num_layers)]
        self.blocks = blocks
        self.max_positions = int(max_positions)
        self.tables: list[list[int]] = [[] for _ in range(batch)]
        self.lengths = np.zeros(batch, np.int64)
        self._gather: np.ndarray | None = None      # [B, nb] physical block of each row's logical blocks
        self._slots_for: tuple | None = None        # (n_valid bytes, slots): the same for every layer of a pass
        self._mirror: list | None = None            # per layer: (K, V) [B, h_kv, room, d] of these rows, or None

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16, batch: int = 1, prefix_caching: bool = False,
                  prefix_cache_blocks: int | None = None) -> "PagedKVCache":
        c = model.config
        manager = BlockManager(num_blocks, block_size, prefix_caching, prefix_cache_blocks)
        return cls(c.num_layers, c.num_kv_heads, c.head_dim, manager, c.max_position_embeddings, batch)

    # ------------------------------------------------------------------------------------ rows
    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def batch(self) -> int:
        return len(self.tables)

    def bind(self, tables: list[list[int]], lengths) -> None:
        """Make `tables` (shared lists: blocks allocated here show up in the caller's tables) this pass's rows.
        The same tables at the lengths the last pass left them keep the mirror; anything else drops it."""
        lengths = np.asarray(lengths, np.int64).copy()
        same = (len(tables) == len(self.tables) and all(a is b for a, b in zip(tables, self.tables))
                and np.array_equal(lengths, self.lengths))
        self.tables, self.lengths = tables, lengths
        if not same:
            self._mirror = None
        self._forget()

    def bytes_per_block(self) -> int:
        """2 (K and V) · L · h_kv · block_size · d · 4 bytes (float32)."""
        return 2 * sum(a[0].nbytes for a in self.k)

    def bytes_used(self) -> int:
        """Bytes of K and V actually filled: 2 · L · Σ lengths · h_kv · d · 4 (as `KVCache.bytes_used`)."""
        return self.bytes_per_block() * int(self.lengths.sum()) // self.block_size

    def bytes_reserved(self) -> int:
        """Bytes of the blocks held by any sequence (a shared block counted once)."""
        return self.bytes_per_block() * self.blocks.num_used

    def waste_slots(self, row: int) -> int:
        """Empty slots in row's blocks: block_size · blocks − tokens (at most block_size − 1)."""
        return len(self.tables[row]) * self.block_size - int(self.lengths[row])

    def free(self) -> None:
        """Give every row's blocks back to the pool."""
        for t in self.tables:
            self.blocks.release_all(t)
        self.lengths[:] = 0
        self._mirror = None
        self._forget()

    # ------------------------------------------------------------------------------------ cache protocol
    def check_room(self, n_valid: np.ndarray) -> None:
        """Before a pass: every row gets the blocks its new tokens need, and a block it will write that another
        sequence also points at is copied first (copy on write)."""
        need = self.lengths + np.asarray(n_valid, np.int64)
        if np.any(need > self.max_positions):
            b = int(np.argmax(need > self.max_positions))
            raise ModelError(f"sequence {b} would need {int(need[b])} positions but the context window is "
                             f"{self.max_positions}; shorten the prompt or max_new_tokens")
        bs = self.block_size
        for b, table in enumerate(self.tables):
            grow_table(self.blocks, table, int(need[b]))
            for logical in range(int(self.lengths[b]) // bs, -(-int(need[b]) // bs)):
                if self.blocks.ref_count[table[logical]] > 1:
                    table[logical] = self.copy_on_write(table[logical])
        self._forget()

    def copy_on_write(self, block: int) -> int:
        """A private copy of a shared block: new block, same K/V, one reference moved over."""
        new = self.blocks.allocate()
        for pool in (*self.k, *self.v):
            pool[new] = pool[block]
        self.blocks.release(block)
        return new

    def first_kept(self, layer: int) -> np.ndarray:
        """Position in slot 0 of every row: 0, the pool keeps every position of every layer (a sliding-window
        layer's older keys stay in their blocks and the forward pass's window mask hides them).   [B]"""
        return np.zeros(self.batch, np.int64)

    def write(self, layer: int, k_new: np.ndarray, v_new: np.ndarray, n_valid: np.ndarray) -> None:
        """Scatter the first n_valid[b] rows of k_new/v_new [B, h_kv, T, d] to their (block, offset) slots."""
        rows, steps, blocks, offsets = self._slots(n_valid)
        self.k[layer][blocks, :, offsets] = k_new[rows, :, steps]          # [N, h_kv, d]
        self.v[layer][blocks, :, offsets] = v_new[rows, :, steps]
        mirror = self._mirror[layer] if self._mirror is not None else None
        if mirror is not None:                                               # the same K/V, row by row
            pos = self.lengths[rows] + steps
            if pos.max() < mirror[0].shape[2]:
                mirror[0][rows, :, pos] = k_new[rows, :, steps]
                mirror[1][rows, :, pos] = v_new[rows, :, steps]
            else:
                self._mirror[layer] = None                                   # out of room: gather again

    def read(self, layer: int, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
        """Gather positions [0, n_keys) of every row through its block table.   -> [B, h_kv, n_keys, d] each
        Slots past a row's length hold stale or zero values; the forward pass masks them out."""
        room = self._mirror_room(n_keys)
        if room is None:
            k, v = self._gathered(layer, n_keys)
            return k[:, :, :n_keys], v[:, :, :n_keys]
        if self._mirror is None:
            self._mirror = [None] * len(self.k)
        if self._mirror[layer] is None or self._mirror[layer][0].shape[2] < n_keys:
            self._mirror[layer] = self._gathered(layer, room)
        k, v = self._mirror[layer]
        return k[:, :, :n_keys], v[:, :, :n_keys]                           # [B, h_kv, S, d] views

    def _gathered(self, layer: int, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row's blocks holding positions [0, n_keys), in attention's layout.   -> [B, h_kv, nb·bs, d] each"""
        g = self._gather_table(n_keys)                                       # [B, nb]
        B, nb = g.shape
        h_kv, d = self.k[layer].shape[1], self.k[layer].shape[3]
        heads = np.arange(h_kv)[None, :, None]                               # [1, h_kv, 1]
        # ONE copy, already in attention's order: index (row, head, logical block) -> [B, h_kv, nb, bs, d].
        # (pool[g] and then a transpose copies twice, the second time strided: for 8 rows x 32 blocks of
        # SmolLM2's 3 x 16 x 64 that measured 4.1 ms against 0.10 ms for this one gather.)
        return tuple(pool[g[:, None, :], heads].reshape(B, h_kv, nb * self.block_size, d)
                     for pool in (self.k[layer], self.v[layer]))

    def _mirror_room(self, n_keys: int) -> int | None:
        """Positions a new mirror keeps per row (n_keys + MIRROR_ROOM, in whole blocks), or None where these rows
        may not have one: two rows share a table (a long prompt cut into rows: each row reads what the others
        wrote this pass), or the mirror would pass MIRROR_BYTES."""
        if len({id(t) for t in self.tables}) < len(self.tables):
            return None
        bs = self.block_size
        room = -(-min(n_keys + MIRROR_ROOM, max(self.max_positions, n_keys)) // bs) * bs
        k0 = self.k[0]
        if 2 * len(self.k) * self.batch * k0.shape[1] * room * k0.shape[3] * k0.itemsize > MIRROR_BYTES:
            return None
        return room

    def advance(self, n_valid: np.ndarray) -> None:
        self.lengths += np.asarray(n_valid, np.int64)
        self._forget()

    # ------------------------------------------------------------------------------------ helpers
    def _forget(self) -> None:
        """Rows, tables or lengths changed: the gather table and the write slots must be rebuilt."""
        self._gather = None
        self._slots_for = None

    def _slots(self, n_valid) -> tuple[np.ndarray, ...]:
        """For every new token: its row, its index among the new tokens, its physical block and offset. Computed
        once per pass (every layer writes to the same slots) and forgotten when the rows or lengths change."""
        n_valid = np.asarray(n_valid, np.int64)
        key = n_valid.tobytes()
        if self._slots_for is None or self._slots_for[0] != key:
            self._slots_for = (key, self._compute_slots(n_valid))
        return self._slots_for[1]

    def _compute_slots(self, n_valid: np.ndarray) -> tuple[np.ndarray, ...]:
        rows = np.repeat(np.arange(self.batch), n_valid)                     # [N]
        steps = np.arange(rows.size) - np.repeat(np.cumsum(n_valid) - n_valid, n_valid)
        pos = self.lengths[rows] + steps                                     # absolute positions
        table = self._gather_table(int((self.lengths + n_valid).max()))
        return rows, steps, table[rows, pos // self.block_size], pos % self.block_size

    def _gather_table(self, n_keys: int) -> np.ndarray:
        nb = -(-n_keys // self.block_size)
        if self._gather is None or self._gather.shape[1] < nb:
            g = np.zeros((self.batch, nb), np.int64)       # padding points at block 0: masked, never attended
            for b, t in enumerate(self.tables):
                g[b, :min(nb, len(t))] = t[:nb]
            self._gather = g
        return self._gather[:, :nb]


def grow_table(blocks: BlockManager, table: list[int], tokens: int) -> None:
    """Append blocks to `table` until it holds `tokens` positions (OutOfBlocks when the pool runs dry)."""
    need = -(-tokens // blocks.block_size)
    if need - len(table) > blocks.num_free:
        raise OutOfBlocks(f"a sequence needs {need - len(table)} more blocks of {blocks.block_size} tokens but "
                          f"only {blocks.num_free} of {blocks.num_blocks} are free")
    while len(table) < need:
        table.append(blocks.allocate())
