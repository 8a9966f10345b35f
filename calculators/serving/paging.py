"""KV-cache allocation: reserving for the maximum, contiguous growth and its fragmentation, and paging.

003 Details 15-16 (PagedAttention, Kwon et al. 2023):
- Reserve-for-max: a sequence that uses n of max_tokens slots wastes 1 − n/max_tokens of its reservation
  (50 of 2,048 -> 97.5%).
- Paging with blocks of B tokens: ⌈n/B⌉ blocks, B·⌈n/B⌉ − n empty slots (at most B − 1 per sequence);
  token i lives in logical block ⌊i/B⌋ at offset i mod B, and the block table maps that to a physical block.
- Contiguous allocation suffers external fragmentation: plenty of free memory, no hole big enough.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from calculators.units import check_int, check_nonneg, check_positive
from specs.model_config import SpecError


def blocks_needed(tokens: int, block_size: int = 16) -> int:
    """⌈tokens / block_size⌉ (50 tokens, blocks of 16 -> 4)."""
    return math.ceil(check_int("tokens", tokens, minimum=0) / check_int("block_size", block_size))


def empty_slots(tokens: int, block_size: int = 16) -> int:
    """Unused slots in the last block: block_size·⌈tokens/block_size⌉ − tokens (50 -> 14)."""
    return blocks_needed(tokens, block_size) * block_size - tokens


def max_empty_slots(block_size: int = 16) -> int:
    """Worst case per sequence: block_size − 1 (15 for blocks of 16)."""
    return check_int("block_size", block_size) - 1


def logical_block(token_index: int, block_size: int = 16) -> tuple[int, int]:
    """(logical block, offset) of a token: (⌊i/B⌋, i mod B). Token 35, B = 16 -> (2, 3)."""
    i, b = check_int("token_index", token_index, minimum=0), check_int("block_size", block_size)
    return i // b, i % b


def physical_slot(token_index: int, block_table: list[int], block_size: int = 16) -> tuple[int, int]:
    """(physical block, offset) through a sequence's block table. Table [7, 2, 14, 5], token 35 -> (14, 3)."""
    blk, off = logical_block(token_index, block_size)
    if blk >= len(block_table):
        raise SpecError(f"token {token_index} is in logical block {blk}, past the block table "
                        f"({len(block_table)} blocks)")
    return block_table[blk], off


def reserve_for_max(tokens_used: int, max_tokens: int, kv_bytes_per_token: float) -> dict:
    """One sequence that reserved `max_tokens` slots but used `tokens_used`: bytes reserved, used, wasted,
    waste %. 50 of 2,048 at 22 KB/token: 45 MB reserved, 1.1 MB used, 97.5% wasted."""
    n, m = check_int("tokens_used", tokens_used, minimum=0), check_int("max_tokens", max_tokens)
    if n > m:
        raise SpecError(f"tokens_used ({n}) exceeds max_tokens ({m})")
    per = check_nonneg("kv_bytes_per_token", kv_bytes_per_token)
    return dict(reserved_bytes=m * per, used_bytes=n * per, wasted_bytes=(m - n) * per,
                waste_percent=100.0 * (m - n) / m)


def paged_vs_reserved(sequences: int, avg_tokens: float, max_tokens: int, kv_bytes_per_token: float,
                      block_size: int = 16) -> dict:
    """Many sequences: reserve-for-max vs paged (worst case: block_size − 1 empty slots each).
    003: 50 sequences averaging 500 of 2,048 tokens at 45 MB/2,048 per token: reserved 2.25 GB, used ≈ 550 MB,
    paged ≈ 567 MB (slack ≤ 330 KB/sequence, ≈ 17 MB), ≈ 1.7 GB freed."""
    n = check_int("sequences", sequences)
    avg = check_nonneg("avg_tokens", avg_tokens)
    per = check_nonneg("kv_bytes_per_token", kv_bytes_per_token)
    m = check_int("max_tokens", max_tokens)
    slack = max_empty_slots(block_size) * per
    reserved, used = n * m * per, n * avg * per
    paged = used + n * slack
    return dict(reserved_bytes=reserved, used_bytes=used, slack_bytes_per_sequence=slack,
                slack_bytes=n * slack, paged_bytes=paged, freed_bytes=reserved - paged,
                utilization_reserved=used / reserved if reserved else 0.0,
                utilization_paged=used / paged if paged else 0.0)


@dataclass
class Segment:
    start: float
    size: float
    owner: str | None      # None = free


def contiguous_walkthrough(pool_size: float, events: list[tuple], coalesce: bool = False) -> list[dict]:
    """Simulate first-fit contiguous allocation. `events` are ("alloc", name, size) or ("free", name).
    Returns one snapshot per event: layout [(owner or None, size)], whether it succeeded, total free, largest
    hole. `coalesce=False` keeps neighbouring holes separate, as 003's walk-through draws them."""
    size = check_positive("pool_size", pool_size)
    segs = [Segment(0.0, size, None)]
    out = []
    for ev in events:
        if not isinstance(ev, (tuple, list)) or not ev or ev[0] not in ("alloc", "free"):
            raise SpecError(f"event must be ('alloc', name, size) or ('free', name), got {ev!r}")
        ok = True
        if ev[0] == "alloc":
            _, name, need = ev
            need = check_positive("allocation size", need)
            hole = next((s for s in segs if s.owner is None and s.size >= need), None)
            if hole is None:
                ok = False
            else:
                i = segs.index(hole)
                segs[i:i + 1] = [Segment(hole.start, need, name)] + (
                    [Segment(hole.start + need, hole.size - need, None)] if hole.size > need else [])
        else:
            name = ev[1]
            owned = [s for s in segs if s.owner == name]
            if not owned:
                raise SpecError(f"cannot free {name!r}: it holds no memory")
            for s in owned:
                s.owner = None
        if coalesce:
            merged: list[Segment] = []
            for s in segs:
                if merged and merged[-1].owner is None and s.owner is None:
                    merged[-1].size += s.size
                else:
                    merged.append(s)
            segs = merged
        holes = [s.size for s in segs if s.owner is None]
        out.append(dict(event=tuple(ev), ok=ok, layout=[(s.owner, s.size) for s in segs],
                        free_total=sum(holes), largest_hole=max(holes, default=0.0)))
    return out


# 003 Detail 15's walk-through (MB): A, B, C placed; A done; D, E placed; B done; F wants 200 contiguous.
REFERENCE_WALKTHROUGH = [("alloc", "A", 100), ("alloc", "B", 150), ("alloc", "C", 80), ("free", "A"),
                         ("alloc", "D", 60), ("alloc", "E", 200), ("free", "B")]
