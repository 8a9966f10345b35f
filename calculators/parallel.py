"""Multi-GPU inference: tensor, pipeline and context parallelism (003 Detail 22; reference 001).

- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits every weight matrix over `tp` devices that read
  their shares at the same time: floor = weight_bytes / tp / bandwidth; it costs 2 all-reduces per layer.
- Pipeline parallelism splits layers into p stages; with m microbatches in flight the idle fraction is
  (p − 1) / (m + p − 1) (GPipe, Huang et al. 2018).
- Context parallelism splits the sequence (and its KV cache) over devices (Ring Attention).
"""
from __future__ import annotations

from calculators.latency import bandwidth_floor_ms
from calculators.units import bytes_per_element, check_int, check_nonneg, check_positive

# Link bandwidths quoted in 003 Detail 22 (bytes/s; NVLink figure is the H100's total bidirectional rate).
INTERCONNECTS_BYTES_PER_S = {
    "NVLink 4 (H100)": 900e9,
    "InfiniBand NDR (one link)": 50e9,
    "400 GbE": 50e9,
    "100 GbE": 12.5e9,
}


def tp_bandwidth_floor_ms(weight_bytes: float, bandwidth_bytes_per_s: float, tp: int = 1) -> float:
    """Per-token floor with `tp`-way tensor parallelism: each device streams weight_bytes / tp at once.
    TinyLlama 2.2 GB on A100s: TP 1/2/4 -> 1.41/0.71/0.35 ms; 70B INT4 35 GB: 22.5, 11.3, 5.6, 2.8 ms (TP 1-8)."""
    return bandwidth_floor_ms(check_nonneg("weight_bytes", weight_bytes) / check_int("tp", tp),
                              bandwidth_bytes_per_s)


def allreduces_per_step(num_layers: int) -> int:
    """Tensor parallelism all-reduces twice per layer (after attention's o_proj, after the MLP's down_proj):
    2 × 22 = 44 for TinyLlama."""
    return 2 * check_int("num_layers", num_layers)


def ring_allreduce_ms(message_bytes: float, devices: int, link_bytes_per_s: float) -> float:
    """Ring all-reduce time: 2·(n − 1)/n × message / link bandwidth (reduce-scatter + all-gather)."""
    n = check_int("devices", devices)
    return 2 * (n - 1) / n * check_nonneg("message_bytes", message_bytes) / \
        check_positive("link_bytes_per_s", link_bytes_per_s) * 1e3


def tp_allreduce_ms_per_step(num_layers: int, hidden_size: int, tokens: int, devices: int,
                             link_bytes_per_s: float, act_bytes: float | str = 2) -> float:
    """All-reduce time one forward adds under TP: 2·L all-reduces of a [tokens, D] activation each."""
    msg = check_int("tokens", tokens) * check_int("hidden_size", hidden_size) * bytes_per_element(act_bytes)
    return allreduces_per_step(num_layers) * ring_allreduce_ms(msg, devices, link_bytes_per_s)


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction (p − 1) / (m + p − 1). p = 4: m 1 -> 75%, 4 -> 43%, 16 -> 16%, 64 -> ≈ 4%."""
    p, m = check_int("stages", stages), check_int("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


def context_parallel_kv(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int,
                        bytes_per_elem: float | str = 2, cp: int = 1, tp: int = 1) -> dict:
    """KV cache of one long sequence: per layer 2 × h_kv × d × tokens × bytes; total × L; per device / (cp·tp).
    003: 70B (GQA-8, d 128, 80 layers), 1M tokens, FP16: ≈ 4.1 GB/layer, ≈ 327 GB; INT8 ≈ 164 GB; TP8 ≈ 41 GB."""
    L, h = check_int("num_layers", num_layers), check_int("num_kv_heads", num_kv_heads)
    d = check_int("head_dim", head_dim)
    t = check_int("tokens", tokens, minimum=0, limit=1 << 40)
    per_layer = 2.0 * h * d * t * bytes_per_element(bytes_per_elem)
    total = per_layer * L
    return dict(bytes_per_layer=per_layer, bytes_total=total,
                bytes_per_device=total / (check_int("cp", cp) * check_int("tp", tp)),
                tokens_per_device=t / cp)
