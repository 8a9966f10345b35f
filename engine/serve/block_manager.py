"""Which physical KV blocks are free, who holds each one, and which full blocks can be reused (prefix caching).

003 Details 15-17 (PagedAttention, Kwon et al. 2023; vLLM automatic prefix caching); nano-vllm's block_manager.py.

- A block holds the K/V of `block_size` consecutive tokens of one sequence. Blocks start in a free queue.
- Every block has a reference count: how many sequences' block tables point at it. A block goes back to the pool
  when its count drops to zero.
- Prefix caching: a FULL block is keyed by a chain hash, hash(previous block's hash, its own tokens), so a key
  names the block's tokens AND everything before them. Two prompts that start with the same tokens map their
  first full blocks to the same keys, and the second prompt reuses the first one's blocks instead of recomputing.
- A cached block nobody references is kept (still reusable) until memory is needed or more than
  `prefix_cache_blocks` such blocks pile up; then the least recently used one is evicted first (LRU).
Invariant: free + cached-unreferenced + referenced blocks == num_blocks, at every moment.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Sequence

import numpy as np

from engine.errors import ModelError


class OutOfBlocks(ModelError):
    """The pool has no free block left (the scheduler answers by preempting a request)."""


def check_count(name: str, value, what: str = "") -> int:
    """A whole number ≥ 1 (Python or NumPy integer, not a bool), else a ModelError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ModelError(f"{name} must be a whole number{what} ≥ 1, got {value!r}")
    return int(value)


def check_block_size(block_size) -> int:
    return check_count("block_size", block_size, " of tokens")


def check_num_blocks(num_blocks) -> int:
    return check_count("num_blocks", num_blocks)


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """Key of a full block: covers its tokens and, through `parent`, every token before it."""
    return hash((parent, tuple(int(t) for t in tokens)))


class BlockManager:
    """Free-block queue, reference counts and (optionally) the prefix cache of one KV pool."""

    def __init__(self, num_blocks: int, block_size: int = 16, prefix_caching: bool = False,
                 prefix_cache_blocks: int | None = None) -> None:
        self.num_blocks = check_num_blocks(num_blocks)
        self.block_size = check_block_size(block_size)
        if prefix_cache_blocks is not None and (isinstance(prefix_cache_blocks, bool) or
                                                not isinstance(prefix_cache_blocks, int) or prefix_cache_blocks < 0):
            raise ModelError(f"prefix_cache_blocks must be a whole number ≥ 0 or None, got {prefix_cache_blocks!r}")
        self.prefix_caching = bool(prefix_caching)
        self.prefix_cache_blocks = num_blocks if prefix_cache_blocks is None else prefix_cache_blocks
        self.ref_count = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))          # blocks with no useful content
        self._hash_of: dict[int, int] = {}                          # block -> chain hash (full, cached blocks)
        self._tokens_of: dict[int, tuple[int, ...]] = {}            # block -> its tokens (guards hash collisions)
        self._block_of: dict[int, int] = {}                          # chain hash -> block
        self._unreferenced: OrderedDict[int, None] = OrderedDict()  # cached, count 0, oldest first (LRU)
        self.evictions = 0

    # ------------------------------------------------------------------------------------ counts
    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take: empty ones plus cached ones nobody references (evictable)."""
        return len(self._free) + len(self._unreferenced)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks holding a reusable full prefix block (referenced or not)."""
        return len(self._hash_of)

    def check_invariants(self) -> None:
        """free + cached-unreferenced + referenced == num_blocks, each block in exactly one of the three."""
        free, idle = set(self._free), set(self._unreferenced)
        held = {b for b, n in enumerate(self.ref_count) if n > 0}
        assert len(free) == len(self._free), "a block is twice in the free queue"
        assert not (free & idle) and not (free & held) and not (idle & held), "a block is in two states"
        assert len(free) + len(idle) + len(held) == self.num_blocks, "a block is lost"
        assert all(n >= 0 for n in self.ref_count)

    # ------------------------------------------------------------------------------------ allocation
    def allocate(self) -> int:
        """Take one block (reference count 1): an empty one, else evict the least recently used cached one."""
        if self._free:
            block = self._free.popleft()
        elif self._unreferenced:
            block, _ = self._unreferenced.popitem(last=False)
            self._forget(block)
            self.evictions += 1
        else:
            raise OutOfBlocks(f"the KV pool is full: all {self.num_blocks} blocks of {self.block_size} tokens "
                              "are in use")
        self.ref_count[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more sequence points at `block` (a prefix-cache hit)."""
        if self.ref_count[block] == 0:
            self._unreferenced.pop(block, None)
        self.ref_count[block] += 1

    def release(self, block: int) -> None:
        """One sequence stops pointing at `block`; at zero it is free again (or kept as an evictable cache entry)."""
        if self.ref_count[block] <= 0:
            raise ModelError(f"block {block} released more times than it was taken")
        self.ref_count[block] -= 1
        if self.ref_count[block]:
            return
        if block in self._hash_of and self.prefix_cache_blocks > 0:
            self._unreferenced[block] = None                        # most recently used goes last
            while len(self._unreferenced) > self.prefix_cache_blocks:
                old, _ = self._unreferenced.popitem(last=False)
                self._forget(old)
                self._free.append(old)
                self.evictions += 1
        else:
            self._forget(block)
            self._free.append(block)

    def release_all(self, table: list[int]) -> None:
        """Release every block of a block table (last first, so a sequence's prefix stays cached longest)."""
        for block in reversed(table):
            self.release(block)
        table.clear()

    # ------------------------------------------------------------------------------------ prefix cache
    def lookup(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Cached blocks holding the longest run of full blocks at the start of `token_ids`, covering at most
        `max_tokens` tokens. Takes no reference (call `share` on the blocks you keep)."""
        if not self.prefix_caching:
            return []
        bs, out, parent = self.block_size, [], None
        for i in range(min(len(token_ids), max_tokens) // bs):
            toks = tuple(int(t) for t in token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(parent, toks)
            block = self._block_of.get(h)
            if block is None or self._tokens_of[block] != toks:
                break
            out.append(block)
            parent = h
        return out

    def hash_of(self, block: int) -> int | None:
        """Chain hash of a cached full block (None if the block is not in the prefix cache)."""
        return self._hash_of.get(block)

    def register(self, block: int, parent_hash: int | None, tokens: Sequence[int]) -> int:
        """Record a block that just became full as reusable; returns its chain hash (the next block's parent).
        If another block already holds the same prefix, the first one stays the cache entry."""
        toks = tuple(int(t) for t in tokens)
        if len(toks) != self.block_size:
            raise ModelError(f"only full blocks ({self.block_size} tokens) are cached, got {len(toks)}")
        h = chain_hash(parent_hash, toks)
        if self.prefix_caching and h not in self._block_of and block not in self._hash_of:
            self._block_of[h] = block
            self._hash_of[block] = h
            self._tokens_of[block] = toks
        return h

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        self._tokens_of.pop(block, None)
        if h is not None and self._block_of.get(h) == block:
            del self._block_of[h]
