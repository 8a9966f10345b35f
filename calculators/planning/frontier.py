"""The cost-latency frontier of feasible plans: near-duplicates collapsed, then the Pareto front (no other plan is
at least as cheap AND at least as fast, and strictly better in one).

Near-duplicates: plans on the same device whose cost and latency agree to `rel` (default 2%) are one point; the
one with fewer GPUs (then the smaller batch cap) represents them and counts how many it stands for.
"""
from __future__ import annotations

import math


def collapse_near_duplicates(points: list[dict], x: str, y: str, rel: float = 0.02) -> list[dict]:
    """`points` (dicts with keys x, y, 'device', 'gpus', 'batch_cap') with near-duplicates merged."""
    def bucket(v: float) -> int:
        return round(math.log(max(v, 1e-300)) / math.log1p(rel))
    best: dict = {}
    for p in points:
        k = (p["device"], bucket(p[x]), bucket(p[y]))
        if k not in best:
            best[k] = dict(p, represents=1)
            continue
        keep = best[k]
        n = keep["represents"] + 1
        if (p.get("gpus", 0), p.get("batch_cap", 0)) < (keep.get("gpus", 0), keep.get("batch_cap", 0)):
            keep = dict(p)
        keep["represents"] = n
        best[k] = keep
    return list(best.values())


def pareto_front(points: list[dict], x: str, y: str) -> list[dict]:
    """The points no other point dominates (lower is better on both x and y), sorted by x."""
    pts = sorted(points, key=lambda p: (p[x], p[y]))
    front, best_y = [], math.inf
    for p in pts:
        if p[y] < best_y:
            front.append(p)
            best_y = p[y]
    return front
