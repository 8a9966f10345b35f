"""KV-cache allocation under load: one request stream, three allocators (003 Details 15 and 16).

The serving loop runs in decode steps. A request admitted at step t writes its prompt's P positions, then appends one
position per step from step t on; after O steps it holds P + O and leaves (the text's 10-token prompt + 40
generated = 50 positions). Waiting requests are admitted in arrival order while the allocator can place them (and, with
`max_batch`, while a slot is free). The allocators:

- reserve:    one contiguous slab of `max_tokens` positions per request, taken at admission (internal
              fragmentation: max_tokens − used positions sit idle);
- contiguous: first fit of exactly the prompt; when a request fills its segment it grows in place by
              `grow_tokens` if the neighbouring memory is free, else it is copied to the first hole big enough,
              else it is preempted (its memory freed, the request put back at the head of the queue to be
              recomputed). Free space splinters into holes (external fragmentation);
- paged:      blocks of `block_size` positions from a free list, one more block whenever the last is full; a block
              table per request. When no block is free the most recently admitted request is preempted (vLLM's
              recompute policy). Waste is the unfilled part of each request's last block: at most block_size − 1.

Memory is counted in token positions; multiply by `kv_cache.kv_bytes_per_token` for bytes.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from calculators.units import check_int, check_positive
from calculators.serving.workload import Workload
from specs.model_config import SpecError

POLICIES = ("reserve", "contiguous", "paged")
MAX_STEPS = 2_000_000


# ============================================================================================ first-fit pool
class FirstFitPool:
    """A contiguous address range [0, capacity) carved first-fit into owned segments; freed neighbours merge."""

    def __init__(self, capacity: int):
        self.capacity = check_int("pool size", capacity)
        self.segments: list[list] = [[0, self.capacity, None]]          # [start, size, owner or None]

    def alloc(self, owner, size: int) -> int | None:
        """Start of a new segment of `size` in the first hole that holds it, or None. One segment per owner."""
        for i, (start, n, who) in enumerate(self.segments):
            if who is None and n >= size:
                self.segments[i:i + 1] = [[start, size, owner]] + ([[start + size, n - size, None]] if n > size
                                                                  else [])
                return start
        return None

    def free(self, owner) -> int:
        """Release `owner`'s segment (one per owner) and merge it with free neighbours; returns its size."""
        segs = self.segments
        i = next((k for k, seg in enumerate(segs) if seg[2] == owner), None)
        if i is None:
            raise SpecError(f"cannot free {owner!r}: it holds no memory")
        seg = segs[i]
        seg[2], freed = None, seg[1]
        if i + 1 < len(segs) and segs[i + 1][2] is None:
            seg[1] += segs.pop(i + 1)[1]
        if i > 0 and segs[i - 1][2] is None:
            segs[i - 1][1] += segs.pop(i)[1]
        return freed

    def grow(self, owner, extra: int) -> bool:
        """Extend `owner`'s segment in place by `extra` if the hole right after it is big enough."""
        for i, seg in enumerate(self.segments):
            if seg[2] == owner:
                nxt = self.segments[i + 1] if i + 1 < len(self.segments) else None
                if nxt is None or nxt[2] is not None or nxt[1] < extra:
                    return False
                seg[1] += extra
                nxt[0] += extra
                nxt[1] -= extra
                if nxt[1] == 0:
                    del self.segments[i + 1]
                return True
        raise SpecError(f"cannot grow {owner!r}: it holds no memory")

    def start(self, owner) -> int:
        """Where `owner`'s segment starts."""
        return next(start for start, _, who in self.segments if who == owner)

    def holes(self) -> list[int]:
        return [n for _, n, who in self.segments if who is None]

    def layout(self) -> list[tuple]:
        return [(who, n) for _, n, who in self.segments]


# ============================================================================================ results
@dataclass(repr=False)
class AllocationResult:
    policy: str
    capacity_tokens: int
    block_size: int
    timeline: dict                       # per step: arrays step, running, waiting, used, allocated, free, largest_hole
    arrival_step: np.ndarray             # per request
    admitted_step: np.ndarray            # first admission of each request
    finish_step: np.ndarray
    admissions: int                      # admissions including re-admissions after preemption
    preemptions: int
    relocations: int
    copied_tokens: int
    refused_by_fragmentation: int        # admission attempts refused although total free memory would hold them
    max_slack_per_sequence: int          # most allocated-but-empty positions any one request ever held
    block_tables: dict = field(default_factory=dict)   # paged: request -> physical blocks, at the snapshot step

    def summary(self, kv_bytes_per_token: float | None = None) -> dict:
        """Totals of the run; with `kv_bytes_per_token`, also the peaks in bytes."""
        t = self.timeline
        alloc = t["allocated"].astype(float)
        busy = alloc > 0
        waste = np.where(busy, (alloc - t["used"]) / np.where(busy, alloc, 1), 0.0)
        return dict(policy=self.policy, capacity_tokens=self.capacity_tokens, steps=int(len(t["step"])),
                    requests=len(self.finish_step), completed=int((self.finish_step >= 0).sum()),
                    admissions=self.admissions, preemptions=self.preemptions, relocations=self.relocations,
                    copied_tokens=self.copied_tokens, refused_by_fragmentation=self.refused_by_fragmentation,
                    max_batch=int(t["running"].max()), mean_batch=float(t["running"].mean()),
                    peak_allocated_tokens=int(t["allocated"].max()), peak_used_tokens=int(t["used"].max()),
                    mean_waste_fraction=float(waste[busy].mean()) if busy.any() else 0.0,
                    mean_utilization=float((t["used"] / self.capacity_tokens).mean()),
                    max_slack_per_sequence=self.max_slack_per_sequence,
                    mean_wait_steps=float((self.admitted_step - self.arrival_step).mean()),
                    **({} if kv_bytes_per_token is None else dict(
                        capacity_bytes=float(self.capacity_tokens * kv_bytes_per_token),
                        peak_allocated_bytes=float(t["allocated"].max() * kv_bytes_per_token),
                        peak_used_bytes=float(t["used"].max() * kv_bytes_per_token))))


# ============================================================================================ simulation
def simulate_kv_allocation(workload: Workload, policy: str, capacity_tokens: int, *, step_s: float,
                           block_size: int = 16, max_tokens: int | None = None, grow_tokens: int = 16,
                           max_batch: int | None = None, snapshot_step: int | None = None) -> AllocationResult:
    """Run `workload` (arrival times turned into steps of `step_s`) through `policy`'s allocator in a pool of
    `capacity_tokens` positions. `max_tokens`: reserve-for-max's slab (the model's context); `block_size`: paged;
    `grow_tokens`: contiguous growth. `snapshot_step`: keep the paged block tables at that step (default: the
    step with the most running requests). SpecError for bad sizes or a pool too small for one request."""
    if policy not in POLICIES:
        raise SpecError(f"allocation policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    cap = check_int("KV pool (tokens)", capacity_tokens, limit=10 ** 10)
    bs = check_int("block size", block_size, limit=1 << 20)
    grow = check_int("growth step (tokens)", grow_tokens, limit=1 << 20)
    check_positive("step time (s)", step_s)
    slots = math.inf if max_batch is None else check_int("max batch", max_batch)
    P, O = workload.prompt_tokens.tolist(), workload.output_tokens.tolist()
    n = len(P)
    need = [p + o for p, o in zip(P, O)]
    worst = max(range(n), key=need.__getitem__)
    if policy == "reserve":
        mt = check_int("max tokens per request (reservation)", max_tokens if max_tokens is not None else max(need))
        if need[worst] > mt:
            raise SpecError(f"request {worst} needs {need[worst]:,} positions, more than the {mt:,} reserved per "
                            "request")
        if mt > cap:
            raise SpecError(f"the KV pool ({cap:,} tokens) is too small for one reservation of {mt:,} tokens")
    pool_need = need[worst] if policy != "paged" else -(-need[worst] // bs) * bs
    if pool_need > cap:
        raise SpecError(f"the KV pool ({cap:,} tokens) is too small for one request: request {worst} needs "
                        f"{pool_need:,} positions (prompt {P[worst]:,} + output {O[worst]:,}"
                        f"{', in whole blocks' if policy == 'paged' else ''})")
    arrival_step = np.floor(workload.arrival_s / step_s).astype(np.int64)
    arr = arrival_step.tolist()

    pool = FirstFitPool(cap)
    n_blocks = cap // bs
    free_blocks = deque(range(n_blocks))
    tables: dict[int, list[int]] = {}
    used = [0] * n                       # positions written
    held = [0] * n                       # positions allocated
    running: list[int] = []              # in admission order
    waiting: deque[int] = deque()
    admitted_step = np.full(n, -1, dtype=np.int64)
    finish_step = np.full(n, -1, dtype=np.int64)
    counts = dict(admissions=0, preemptions=0, relocations=0, copied=0, refused=0)
    rec = {k: [] for k in ("step", "running", "waiting", "used", "allocated", "free", "largest_hole")}
    max_slack, nxt, done, step, best = 0, 0, 0, 0, (-1, -1)
    snapshot: dict = {}

    def release(r: int) -> None:
        if policy == "paged":
            free_blocks.extend(tables.pop(r))
        else:
            pool.free(r)
        held[r] = used[r] = 0

    def preempt(r: int) -> None:
        running.remove(r)
        release(r)
        waiting.appendleft(r)
        counts["preemptions"] += 1

    def place(r: int) -> bool:           # allocate a newly admitted request's prompt
        p = P[r]
        if policy == "paged":
            k = -(-p // bs)
            if len(free_blocks) < k:
                return False
            tables[r] = [free_blocks.popleft() for _ in range(k)]
            held[r] = k * bs
        else:
            size = max_tokens_for_reserve if policy == "reserve" else p
            if pool.alloc(r, size) is None:
                if sum(pool.holes()) >= size:
                    counts["refused"] += 1
                return False
            held[r] = size
        used[r] = p
        return True

    max_tokens_for_reserve = mt if policy == "reserve" else 0

    def extend(r: int) -> bool:          # room for one more position; False if r itself was preempted
        if used[r] < held[r]:
            return True
        if policy == "paged":
            while not free_blocks:
                victim = running[-1]
                preempt(victim)
                if victim == r:
                    return False
            tables[r].append(free_blocks.popleft())
            held[r] += bs
            return True
        extra = min(grow, need[r] - held[r])
        while True:
            if pool.grow(r, extra):
                held[r] += extra
                return True
            start = pool.start(r)
            pool.free(r)                 # copy to the first hole that holds the grown segment
            if pool.alloc(r, held[r] + extra) is not None:
                counts["relocations"] += 1
                counts["copied"] += used[r]
                held[r] += extra
                return True
            if pool.alloc(r, held[r]) != start:   # no such hole: r stays (a hole that held it just opened)
                counts["relocations"] += 1
                counts["copied"] += used[r]
            victim = running[-1]         # preempt the newest request, as paging does (the oldest, preempted
            preempt(victim)              # first, restarted and preempted again: the stream never finished)
            if victim == r:
                return False

    while done < n:
        if step > MAX_STEPS:
            raise SpecError(f"the allocation simulation did not finish within {MAX_STEPS:,} steps")
        while nxt < n and arr[nxt] <= step:
            waiting.append(nxt)
            nxt += 1
        if not running and not waiting:
            step = arr[nxt]
            continue
        while waiting and len(running) < slots:          # admit in arrival order (head-of-line)
            r = waiting[0]
            if not place(r):
                break
            waiting.popleft()
            running.append(r)
            counts["admissions"] += 1
            if admitted_step[r] < 0:
                admitted_step[r] = step
        for r in list(running):                          # one decode step: every request appends a position
            if r not in running:
                continue
            if used[r] == need[r]:
                continue
            if extend(r):
                used[r] += 1
        alloc_total = sum(held[r] for r in running)
        used_total = sum(used[r] for r in running)
        if alloc_total > cap or used_total > alloc_total:
            raise SpecError(f"internal: {policy} over-committed the pool at step {step}")   # pragma: no cover
        max_slack = max([max_slack] + [held[r] - used[r] for r in running])
        if (snapshot_step is None and len(running) > best[1]) or step == snapshot_step:
            best = (step, len(running))
            if policy == "paged":
                snapshot = {r: list(tables[r]) for r in running}
        holes = pool.holes() if policy != "paged" else [len(free_blocks) * bs]
        for k, v in (("step", step), ("running", len(running)), ("waiting", len(waiting)),
                     ("used", used_total), ("allocated", alloc_total), ("free", cap - alloc_total),
                     ("largest_hole", max(holes, default=0))):
            rec[k].append(v)
        for r in [r for r in running if used[r] == need[r]]:     # finished: memory back at once
            running.remove(r)
            release(r)
            finish_step[r] = step
            done += 1
        step += 1
    timeline = {k: np.array(v) for k, v in rec.items()}
    return AllocationResult(policy, cap, bs, timeline, arrival_step, admitted_step, finish_step, counts["admissions"],
                            counts["preemptions"], counts["relocations"], counts["copied"], counts["refused"],
                            max_slack, snapshot)


def compare_allocators(workload: Workload, capacity_tokens: int, *, step_s: float, block_size: int = 16,
                       max_tokens: int | None = None, grow_tokens: int = 16,
                       max_batch: int | None = None) -> dict[str, AllocationResult]:
    """The same stream through all three allocators."""
    return {p: simulate_kv_allocation(workload, p, capacity_tokens, step_s=step_s, block_size=block_size,
                                      max_tokens=max_tokens, grow_tokens=grow_tokens, max_batch=max_batch)
            for p in POLICIES}
