"""FlashAttention: HBM traffic of attention with S and P materialised (three kernels) vs tiled (one kernel).

003 Detail 17, one head, N tokens, head dim d, b bytes per element:
- Unfused: scores kernel reads Q, K and writes S [N, N]; softmax reads S, writes P; output kernel reads P, V and
  writes O. Traffic = 3·N·d·b (Q, K, V) + N·d·b (O) + 4·N²·b (S and P each written once and read once).
  N = 2,048, d = 64, FP16: 768 KiB + 256 KiB + 32 MiB = 33 MiB per head ("≈ 33 MB").
- Tiled (FlashAttention, Dao et al. 2022): S and P never leave SRAM; Q is read once and O written once, while
  every K/V block streams past each block of B_q query rows: N·d·b (Q) + N·d·b (O) + ⌈N/B_q⌉·2·N·d·b (K, V).
- FLOPs are the same either way: QKᵀ and P·V, 2·N·N·d each (full square, the roofline convention).
Memory is binary (KiB/MiB) in the text's per-head figures; bandwidth is decimal (1.6 TB/s = 1.6e12 B/s).
"""
from __future__ import annotations

import math

from calculators.units import bytes_per_element, check_int, check_positive


def attention_tensor_bytes(seq_len: int, head_dim: int, bytes_per_elem: float | str = 2) -> dict:
    """Sizes for one head: Q, K, V, O [N, d] each; the score matrix S (and P) [N, N]; S's entry count."""
    N, d = check_int("seq_len", seq_len), check_int("head_dim", head_dim)
    b = bytes_per_element(bytes_per_elem)
    return dict(q=N * d * b, k=N * d * b, v=N * d * b, qkv=3 * N * d * b, o=N * d * b, s_entries=N * N,
                s=N * N * b, p=N * N * b)


def attention_flops_per_head(seq_len: int, head_dim: int) -> float:
    """QKᵀ + P·V for one head over the full N × N square: 2·N²·d + 2·N²·d = 4·N²·d
    (N = 2,048, d = 64: 1.07 GFLOP, "≈ 1 GFLOP/head")."""
    N, d = check_int("seq_len", seq_len), check_int("head_dim", head_dim)
    return 4.0 * N * N * d


def unfused_attention_hbm_bytes(seq_len: int, head_dim: int, bytes_per_elem: float | str = 2) -> float:
    """HBM bytes for one head when scores, softmax and output are three kernels: Q, K, V, O plus S and P
    written and read back, 4·N·d·b + 4·N²·b."""
    t = attention_tensor_bytes(seq_len, head_dim, bytes_per_elem)
    return t["qkv"] + t["o"] + 2 * t["s"] + 2 * t["p"]


def tiled_attention_hbm_bytes(seq_len: int, head_dim: int, bytes_per_elem: float | str = 2,
                              block_q: int = 128) -> float:
    """HBM bytes for one head with FlashAttention-style tiling: Q read once, O written once, K and V read once
    per block of `block_q` query rows: 2·N·d·b + ⌈N/B_q⌉·2·N·d·b."""
    t = attention_tensor_bytes(seq_len, head_dim, bytes_per_elem)
    blocks = math.ceil(seq_len / check_int("block_q", block_q))
    return t["q"] + t["o"] + blocks * (t["k"] + t["v"])


def tile_bytes(block_q: int, block_k: int, head_dim: int, bytes_per_elem: float | str = 2) -> dict:
    """On-chip working set: one score tile [B_q, B_k] (128 × 128 × 2 B = 32 KiB) and one Q block [B_q, d]
    (128 × 64 × 2 B = 16 KiB)."""
    b = bytes_per_element(bytes_per_elem)
    bq, bk, d = check_int("block_q", block_q), check_int("block_k", block_k), check_int("head_dim", head_dim)
    return dict(score_tile=bq * bk * b, q_block=bq * d * b, kv_block=2 * bk * d * b)


def flash_attention_report(seq_len: int, head_dim: int, heads: int, layers: int, bandwidth_bytes_per_s: float,
                           bytes_per_elem: float | str = 2, block_q: int = 128) -> dict:
    """Unfused vs tiled attention for a whole prefill: traffic per head / layer / prefill, time at
    `bandwidth_bytes_per_s`, and arithmetic intensity. The model and device numbers come from the caller
    (`ModelConfig`, `specs.devices`); block_q = 128 is FlashAttention's usual query tile. 003's TinyLlama example
    (N 2,048, d 64, 32 heads, 22 layers, A100 ≈ 1.6 TB/s) gives ≈ 33 MB/head, ≈ 1 GB/layer, ≈ 22 GB and ≈ 14 ms per
    prefill, ≈ 30 FLOP/byte unfused."""
    h, L = check_int("heads", heads), check_int("layers", layers)
    bw = check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    flops = attention_flops_per_head(seq_len, head_dim)
    out = dict(flops_per_head=flops, tensors=attention_tensor_bytes(seq_len, head_dim, bytes_per_elem),
               tile=tile_bytes(block_q, block_q, head_dim, bytes_per_elem))
    for name, per_head in (("unfused", unfused_attention_hbm_bytes(seq_len, head_dim, bytes_per_elem)),
                           ("tiled", tiled_attention_hbm_bytes(seq_len, head_dim, bytes_per_elem, block_q))):
        out[name] = dict(bytes_per_head=per_head, bytes_per_layer=per_head * h, bytes_per_prefill=per_head * h * L,
                         time_ms=per_head * h * L / bw * 1e3, intensity_flop_per_byte=flops / per_head)
    out["traffic_ratio"] = out["unfused"]["bytes_per_head"] / out["tiled"]["bytes_per_head"]
    return out
