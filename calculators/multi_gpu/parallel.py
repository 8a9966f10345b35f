"""Multi-GPU primitives: collectives (alpha-beta ring model), the pipeline bubble, context and expert parallelism
(003 Detail 22; reference 001).

- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits every weight matrix over `tp` devices that read
  their shares at the same time: floor = weight_bytes / tp / bandwidth; it costs 2 all-reduces per layer.
- Pipeline parallelism splits layers into p stages; with m microbatches in flight the idle fraction is
  (p − 1) / (m + p − 1) (GPipe, Huang et al. 2018).
- Context parallelism splits the sequence (and its KV cache) over devices (Ring Attention, Liu et al. 2023).
- Expert parallelism places whole experts on devices and routes tokens with two all-to-alls per MoE layer.

Collectives follow the alpha-beta model: time = alpha (a per-call latency that grows with the ring's steps) +
bytes on the wire / link bandwidth PER DIRECTION (a ring sends to one neighbour while receiving from the other, so
a link's bidirectional total is never the rate one transfer sees). Link numbers and their sources live in
`specs/devices.json` (`links`); read them with `specs.devices.load_link` / `device_link`.
"""
from __future__ import annotations

import math

from calculators.multi_gpu.moe import ring_pass_ms
from calculators.sizing.latency import bandwidth_floor_ms
from calculators.units import bytes_per_element, check_int, check_nonneg
from specs.devices import Link
from specs.model_config import SpecError


def tp_bandwidth_floor_ms(weight_bytes: float, bandwidth_bytes_per_s: float, tp: int = 1) -> float:
    """Per-token floor with `tp`-way tensor parallelism: each device streams weight_bytes / tp at once.
    TinyLlama 2.2 GB on A100s: TP 1/2/4 -> 1.41/0.71/0.35 ms; 70B INT4 35 GB: 22.5, 11.3, 5.6, 2.8 ms (TP 1-8)."""
    return bandwidth_floor_ms(check_nonneg("weight_bytes", weight_bytes) / check_int("tp", tp),
                              bandwidth_bytes_per_s)


def allreduces_per_step(num_layers: int) -> int:
    """Tensor parallelism all-reduces twice per layer (after attention's o_proj, after the MLP's down_proj):
    2 × 22 = 44 for TinyLlama; 2 × 80 = 160 for a 70B Llama."""
    return 2 * check_int("num_layers", num_layers)


def _link_bw(link: Link) -> float:
    if link.bytes_per_s is None:
        raise SpecError(f"{link.name} has no bandwidth of its own here; take it from a device (device_link)")
    return link.bytes_per_s


def collective_alpha_s(link: Link, steps: int) -> float:
    """Latency part of a collective with `steps` sequential ring steps: alpha_base + steps × alpha_per_hop
    (NCCL's tuning model, src/graph/tuning.cc: ring LL base 6.6 us; per hop NVLink 0.6, PCIe 1.0, network 2.7 us)."""
    return link.alpha_base_s + check_int("steps", steps, minimum=0) * link.alpha_per_hop_s


def ring_allreduce_ms(message_bytes: float, devices: int, link: Link) -> float:
    """Ring all-reduce, alpha-beta: alpha(2(n−1) steps) + 2·(n − 1)/n × message / per-direction bandwidth
    (reduce-scatter + all-gather; Patarasuk & Yuan 2009; nccl-tests' busbw definition). 0 for one device.
    Llama-3-70B TP8 prefill of 1,024 tokens on H100 NVLink (450 GB/s a direction): 16 MiB -> 0.0152 + 0.0652 ms."""
    n = check_int("devices", devices)
    if n == 1:
        return 0.0
    beta_s = 2 * (n - 1) / n * check_nonneg("message_bytes", message_bytes) / _link_bw(link)
    return (collective_alpha_s(link, 2 * (n - 1)) + beta_s) * 1e3


def all_gather_ms(message_bytes: float, devices: int, link: Link) -> float:
    """Ring all-gather (or reduce-scatter) of a `message_bytes` result: alpha(n−1 steps) + (n−1)/n × M / B."""
    n = check_int("devices", devices)
    if n == 1:
        return 0.0
    beta_s = (n - 1) / n * check_nonneg("message_bytes", message_bytes) / _link_bw(link)
    return (collective_alpha_s(link, n - 1) + beta_s) * 1e3


reduce_scatter_ms = all_gather_ms      # same steps and bytes on the wire, run the other way round


def all_to_all_ms(bytes_per_device: float, devices: int, link: Link) -> float:
    """All-to-all where each device sends `bytes_per_device` spread evenly over all devices: the (n−1)/n that
    leaves the device crosses the link: alpha(n−1 steps) + (n−1)/n × bytes / B."""
    return all_gather_ms(bytes_per_device, devices, link)


def p2p_ms(message_bytes: float, link: Link) -> float:
    """One point-to-point send (a pipeline stage boundary): alpha(1 step) + bytes / B."""
    return (collective_alpha_s(link, 1) + check_nonneg("message_bytes", message_bytes) / _link_bw(link)) * 1e3


def tp_allreduce_bytes(hidden_size: int, tokens: int, act_bytes: float | str = 2) -> float:
    """Message of one TP all-reduce: a [tokens, D] activation. Decode batch 1 of a 70B (D 8,192), bf16: 16 KiB."""
    return check_int("tokens", tokens) * check_int("hidden_size", hidden_size) * bytes_per_element(act_bytes)


def tp_allreduce_ms_per_step(num_layers: int, hidden_size: int, tokens: int, devices: int, link: Link,
                             act_bytes: float | str = 2) -> float:
    """All-reduce time one forward adds under TP: 2·L all-reduces of a [tokens, D] activation each."""
    msg = tp_allreduce_bytes(hidden_size, tokens, act_bytes)
    return allreduces_per_step(num_layers) * ring_allreduce_ms(msg, devices, link)


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction (p − 1) / (m + p − 1). p = 4: m 1 -> 75%, 4 -> 43%, 16 -> 16%, 64 -> ≈ 4%."""
    p, m = check_int("stages", stages), check_int("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


def kv_head_replication(num_kv_heads: int, tp: int) -> float:
    """How many copies of each KV head the TP group keeps: max(1, tp / h_kv). Past tp = h_kv a GPU cannot hold
    less than one whole KV head, so heads are replicated (vLLM, TensorRT-LLM) and KV per GPU stops shrinking."""
    return max(1.0, check_int("tp", tp) / check_int("num_kv_heads", num_kv_heads))


def context_parallel_kv(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int,
                        bytes_per_elem: float | str = 2, cp: int = 1, tp: int = 1) -> dict:
    """KV cache of one long sequence: per layer 2 × h_kv × d × tokens × bytes; total × L; per device
    total / (cp·tp) × max(1, tp / h_kv) (KV heads replicated once TP exceeds them).
    003: 70B (GQA-8, d 128, 80 layers), 1M tokens, FP16: ≈ 4.1 GB/layer, ≈ 327 GB; INT8 ≈ 164 GB; TP8 ≈ 41 GB."""
    L, h = check_int("num_layers", num_layers), check_int("num_kv_heads", num_kv_heads)
    d = check_int("head_dim", head_dim)
    t = check_int("tokens", tokens, minimum=0, limit=1 << 40)
    cp, tp = check_int("cp", cp), check_int("tp", tp)
    per_layer = 2.0 * h * d * t * bytes_per_element(bytes_per_elem)
    total = per_layer * L
    per_device = total / (cp * tp) * kv_head_replication(h, tp)
    return dict(bytes_per_layer=per_layer, bytes_total=total, bytes_per_device=per_device,
                tokens_per_device=t / cp, kv_head_copies=kv_head_replication(h, tp),
                bytes_per_token_per_device=per_device / (t / cp) if t else 0.0)


def ring_attention(tokens: int, cp: int, kv_bytes_per_token_per_device: float, link: Link,
                   load_balanced: bool = True) -> dict:
    """Ring attention over `cp` devices (Liu et al. 2023): each holds tokens/cp queries and passes its KV block
    around the ring, cp − 1 transfers, each of (tokens/cp) × kv bytes per token, overlappable with compute.
    Causal masking makes a contiguous split uneven: device i attends to i + 1 blocks, so the busiest does
    cp blocks against a mean of (cp + 1)/2 (imbalance 2·cp/(cp + 1)); a zig-zag split (each device takes block i
    and block 2·cp − 1 − i) evens it to 1."""
    t, n = check_int("tokens", tokens), check_int("cp", cp)
    block = t / n * check_nonneg("kv_bytes_per_token_per_device", kv_bytes_per_token_per_device)
    passes = n - 1
    transfer_ms = passes * p2p_ms(block, link) if passes else 0.0
    imbalance = 1.0 if load_balanced else 2 * n / (n + 1)
    return dict(passes=passes, block_bytes=block, transfer_ms=transfer_ms, causal_imbalance=imbalance,
                tokens_per_device=t / n)


def expert_parallel(num_experts: int, top_k: int, hidden_size: int, tokens: int, ep: int, link: Link,
                    act_bytes: float | str = 2) -> dict:
    """Expert parallelism over `ep` devices, `tokens` on each: experts per device = E / ep, and the two ways a
    serving stack moves a MoE layer's tokens. DeepEP-style, two all-to-alls (dispatch to the chosen experts,
    combine back), each moving tokens × top_k × D × bytes from a device, (ep − 1)/ep of it to other devices
    (uniform routing). The default of vLLM, SGLang and TensorRT-LLM on one node (`Stack.moe_dp_comm`), an
    all-gather of every device's tokens (a buffer of ep × tokens × D × bytes) and a reduce-scatter of the outputs
    in 16 bits, each a ring pass (`moe.ring_pass_ms`). DeepSeek-V3 (256 experts, top 8, D 7,168) on EP 8, 1 token:
    32 experts per device, 114,688 bytes per all-to-all, a 114,688-byte gathered buffer."""
    E, k = check_int("num_experts", num_experts), check_int("top_k", top_k)
    n = check_int("ep", ep)
    if E % n:
        raise SpecError(f"{E} experts do not split evenly over EP {n}: choose an EP degree that divides {E}")
    vol = check_int("tokens", tokens) * k * check_int("hidden_size", hidden_size) * bytes_per_element(act_bytes)
    one = all_to_all_ms(vol, n, link)
    vectors = tokens * n * hidden_size
    gathered = vectors * bytes_per_element(act_bytes)
    return dict(experts_per_device=E // n, all_to_all_bytes=vol, remote_fraction=(n - 1) / n,
                all_to_all_ms=one, ms_per_layer=2 * one, gathered_bytes=gathered,
                gather_scatter_ms_per_layer=ring_pass_ms(gathered, n, link) + ring_pass_ms(vectors * 2.0, n, link))


def divisors(n: int) -> list[int]:
    """Every d with n % d == 0, ascending (TP degrees that split n heads evenly)."""
    n = check_int("n", n)
    return [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] + \
        sorted(n // d for d in range(1, math.isqrt(n) + 1) if n % d == 0 and d * d != n)
