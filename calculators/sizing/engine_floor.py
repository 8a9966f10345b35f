"""The decode floor of the NumPy engine on a measured machine: the bytes one decode step of `engine/` reads and
writes, over the bandwidth a matvec reaches (`specs.devices.measure_this_machine`).

One weight-byte convention for every prediction of the engine's own ITL (the Your-machine page and
bench/bench_predicted_vs_measured.py): the roofline convention the engine's `Trace` counts, i.e. every per-layer
weight, the final norm and the LM head once, plus the one gathered embedding row (`roofline.weight_bytes_read`),
plus the KV cache read and the new K/V written (`roofline.kv_bytes_step`). A datasheet floor (`latency`) instead
divides ALL parameter bytes, the whole embedding table included, as reference 003 does for a GPU.
"""
from __future__ import annotations

from calculators.sizing.roofline import kv_bytes_step, weight_bytes_read
from calculators.units import check_positive

ENGINE_BYTES_PER_ELEMENT = 4          # the engine holds weights and K/V in float32


def engine_decode_bytes(config, context_tokens: int, bytes_per_element: float = ENGINE_BYTES_PER_ELEMENT) -> dict:
    """Bytes one decode step moves, by the convention `engine.Trace` counts (so the two agree exactly):
    weights = weight_bytes_read(1 new token); kv_read = L·S·2·kv_dim·b; kv_written = L·2·kv_dim·b."""
    kv = kv_bytes_step(config, 1, context_tokens, bytes_per_element)
    weights = weight_bytes_read(config, 1, bytes_per_element)
    return dict(weights=weights, kv_read=kv["read"], kv_written=kv["written"],
                total=weights + kv["read"] + kv["written"])


def engine_itl_floor_ms(config, bandwidth_bytes_per_s: float, context_tokens: int,
                        bytes_per_element: float = ENGINE_BYTES_PER_ELEMENT) -> float:
    """(weights + KV read + KV written) / bandwidth × 1000: the fastest one engine decode step can be (ms)."""
    bw = check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    return engine_decode_bytes(config, context_tokens, bytes_per_element)["total"] / bw * 1e3
