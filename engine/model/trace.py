"""Counting what a forward pass does: FLOPs, weight bytes read, KV bytes read/written, and time per operation.

Convention (the same one `calculators/sizing/roofline.py` uses, so theory and experiment must agree exactly):
- FLOPs count matrix products only, 2·M·N·K each: the Q/K/V/O and gate/up/down projections over the new tokens,
  attention scores QKᵀ and P·V over the full rectangle new_tokens × context_tokens for every query head (no causal
  saving), and the LM head for the positions whose logits are computed (the last one in prefill and decode).
- Weight bytes read = every per-layer weight (norm vectors included) + final norm + LM head matrix, once per
  forward, plus the gathered embedding rows (new_tokens · D), at the bytes per parameter the engine holds (4, fp32).
- KV bytes: written = new_tokens · 2 · kv_dim per layer; read = context_tokens · 2 · kv_dim per layer, where
  context_tokens = cached + new keys attended.
Rows that are padding in a batched call are not counted (they are not useful work).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class OpRecord:
    op: str                  # e.g. "qkv_proj", "attn_scores", "lm_head"
    layer: int | None        # None for embedding / final norm / LM head
    flops: float = 0.0
    weight_bytes: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    seconds: float = 0.0
    shape: str = ""          # human-readable shapes, e.g. "[1, 7, 2048] @ [2048, 2560]"


@dataclass
class Trace:
    """Pass as `trace=` to `Model.forward`; collects one OpRecord per operation per layer."""
    timing: bool = False
    records: list[OpRecord] = field(default_factory=list)
    _t0: float = 0.0

    def start(self) -> None:
        if self.timing:
            self._t0 = time.perf_counter()

    def add(self, op: str, layer: int | None, **counts) -> None:
        seconds = 0.0
        if self.timing:
            now = time.perf_counter()
            seconds, self._t0 = now - self._t0, now
        self.records.append(OpRecord(op=op, layer=layer, seconds=seconds, **counts))

    def total(self, what: str) -> float:
        return float(sum(getattr(r, what) for r in self.records))

    @property
    def flops(self) -> float:
        return self.total("flops")

    @property
    def weight_bytes(self) -> float:
        return self.total("weight_bytes")

    @property
    def kv_read_bytes(self) -> float:
        return self.total("kv_read_bytes")

    @property
    def kv_write_bytes(self) -> float:
        return self.total("kv_write_bytes")

    def by_op(self) -> dict[str, dict[str, float]]:
        """Totals per operation name (summed over layers)."""
        out: dict[str, dict[str, float]] = {}
        for r in self.records:
            d = out.setdefault(r.op, dict(flops=0.0, weight_bytes=0.0, kv_read_bytes=0.0, kv_write_bytes=0.0,
                                          seconds=0.0, calls=0))
            for k in ("flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "seconds"):
                d[k] += getattr(r, k)
            d["calls"] += 1
        return out
