"""Mixture-of-experts across GPUs: expert parallelism (EP) independent of tensor parallelism, the all-to-all that
dispatches tokens to their experts and combines the results, and the load imbalance that lets the busiest GPU
set the pace.

Layout (vLLM `--data-parallel-size N --enable-expert-parallel`, TensorRT-LLM `--ep N` with attention DP): EP
spreads the E routed experts over `ep` GPUs, E/ep each. Attention (and dense layers, shared experts) is split
by TP inside a replica; when ep > tp the EP group spans ep/tp replicas, each running its own requests through
attention (data-parallel attention) and all of them meeting in the MoE layers.

Per MoE layer, a token leaves its GPU once per remote GPU holding one of its k experts (dispatch) and its
results come back the same way (combine). With deduplication (DeepEP, TensorRT-LLM's one-sided all-to-all) a
token goes once to each distinct remote GPU:
    copies per token = (ep − 1) × (1 − C(E − E/ep, k) / C(E, k))          (expected, uniform routing)
without it once per remote expert: k × (ep − 1) / ep.
Bytes a GPU sends per all-to-all = tokens × copies × hidden × bytes per element.
Imbalance: with uniform random routing the busiest GPU receives more than the mean; its expert assignments are
a sum of per-token hypergeometric counts (k draws from E experts, E/ep of them local), so
    mean = T·k/ep,  var = T · k·(1/ep)·(1 − 1/ep)·(E − k)/(E − 1),
    busiest ≈ mean + z_ep · sqrt(var),  z_ep = Φ⁻¹((ep − 0.375)/(ep + 0.25))   (Blom's expected normal maximum)
and imbalance = busiest / mean. A balancer (EPLB) brings it toward 1; skewed real routing pushes it up: it is a
knob (`expert_imbalance`), this formula only its default.
"""
from __future__ import annotations

import math
from statistics import NormalDist

from calculators.units import bytes_per_element, check_int, check_nonneg
from specs.devices import Link
from specs.model_config import ModelConfig, SpecError


def ep_problem(config: ModelConfig, ep: int, tp: int = 1) -> str | None:
    """Why `ep` cannot split this model's experts (None if it can)."""
    if ep == 1:
        return None
    if not config.num_experts:
        return f"EP {ep} needs a mixture-of-experts model; {config.name} is dense"
    E = config.num_experts
    if E % ep:
        ok = [d for d in range(1, min(E, 256) + 1) if E % d == 0]
        return (f"EP {ep} does not divide {config.name}'s {E} experts: choose EP among "
                f"{', '.join(map(str, ok))}")
    if ep % tp and tp % ep:
        return f"EP {ep} and TP {tp} must divide one another (an EP group is a whole number of TP groups or part of one)"
    return None


def dispatch_copies_per_token(num_experts: int, top_k: int, ep: int, dedup: bool = True) -> float:
    """Expected remote GPUs a token is sent to per MoE layer (see the module docstring)."""
    E, k, n = check_int("experts", num_experts), check_int("top_k", top_k), check_int("ep", ep)
    if k > E or E % n:
        raise SpecError(f"top_k {k} and EP {n} must fit {E} experts (k ≤ E, EP divides E)")
    if n == 1:
        return 0.0
    if not dedup:
        return k * (n - 1) / n
    per_gpu = E // n
    miss = math.comb(E - per_gpu, k) / math.comb(E, k)
    return (n - 1) * (1 - miss)


def all_to_all_bytes(tokens: int, config: ModelConfig, ep: int, act_bytes: float | str = 2,
                     dedup: bool = True) -> float:
    """Bytes one GPU sends in one dispatch (and receives back in one combine) for `tokens` of its own."""
    copies = dispatch_copies_per_token(config.num_experts, config.num_experts_per_tok, ep, dedup)
    return check_int("tokens", tokens, minimum=0, limit=1 << 40) * copies * config.hidden_size * \
        bytes_per_element(act_bytes)


def all_to_all_ms(bytes_per_gpu: float, ep: int, link: Link) -> float:
    """One all-to-all among `ep` GPUs: alpha_base + (ep − 1)·hop + bytes / per-direction bandwidth (every GPU
    sends and receives at once; on a switch the links do not share)."""
    n = check_int("ep", ep)
    if n == 1:
        return 0.0
    if link.bytes_per_s is None:
        raise SpecError(f"{link.name} has no bandwidth of its own here; take it from a device (device_link)")
    return (link.alpha_base_s + (n - 1) * link.alpha_per_hop_s + check_nonneg("bytes", bytes_per_gpu) /
            link.bytes_per_s) * 1e3


def routing_imbalance(tokens: float, num_experts: int, top_k: int, ep: int) -> float:
    """Busiest GPU's expert assignments ÷ the mean, for uniform random top-k routing of `tokens` tokens."""
    n = check_int("ep", ep)
    if n == 1 or tokens <= 0:
        return 1.0
    E, k = num_experts, top_k
    mean = tokens * k / n
    var = tokens * k * (1 / n) * (1 - 1 / n) * ((E - k) / (E - 1) if E > 1 else 0.0)
    z = NormalDist().inv_cdf((n - 0.375) / (n + 0.25))
    return (mean + z * math.sqrt(var)) / mean


def exchange_bytes(weight_dtype: str) -> float:
    """Bytes per element of the tokens a MoE layer's exchange sends: NVFP4 (0.5 + one FP8 scale per 16 values)
    ahead of FP4 experts, which quantize before sending, else 16 bits."""
    return 0.5 + 1 / 16 if str(weight_dtype) in ("fp4", "nvfp4") else 2.0


def ring_pass_ms(total_bytes: float, n: int, link: Link) -> float:
    """One ring all-gather (or reduce-scatter) of `total_bytes` in all among n GPUs: alpha_base + (n − 1)·hop +
    (n − 1)/n · total / per-direction bandwidth (each GPU sends and receives (n − 1)/n of the total)."""
    if n == 1:
        return 0.0
    if link.bytes_per_s is None:
        raise SpecError(f"{link.name} has no bandwidth of its own here; take it from a device (device_link)")
    return (link.alpha_base_s + (n - 1) * link.alpha_per_hop_s + (n - 1) / n * total_bytes / link.bytes_per_s) * 1e3


def gather_scatter_bytes(tokens: int, config: ModelConfig, ep: int, act_bytes: float | str = 2) -> tuple:
    """(all-gather, reduce-scatter) bytes in all of one MoE layer for `tokens` tokens on each of `ep` GPUs: every
    GPU gathers the group's ep × tokens hidden vectors (in `act_bytes`, NVFP4 where the experts are FP4) and the
    partial outputs go back in 16 bits."""
    n = check_int("tokens", tokens, minimum=0, limit=1 << 40) * check_int("ep", ep) * config.hidden_size
    return n * bytes_per_element(act_bytes), n * 2.0


def moe_layer_comm_ms(tokens: int, config: ModelConfig, ep: int, link: Link, act_bytes: float | str = 2,
                      imbalance: float = 1.0, dedup: bool = True, method: str = "all_to_all") -> float:
    """The MoE layer's token exchange for `tokens` tokens on each GPU, by `method` (`Stack.moe_dp_comm`):
    "all_to_all", dispatch + combine (the busiest GPU receiving `imbalance` × the mean), or
    "allgather_reducescatter", one ring all-gather of the group's tokens and one ring reduce-scatter of the
    outputs (every GPU gets every token, so routing imbalance does not move it)."""
    if method == "allgather_reducescatter":
        gathered, scattered = gather_scatter_bytes(tokens, config, ep, act_bytes)
        return ring_pass_ms(gathered, ep, link) + ring_pass_ms(scattered, ep, link)
    if method != "all_to_all":
        raise SpecError(f"MoE token exchange {method!r}: all_to_all or allgather_reducescatter")
    b = all_to_all_bytes(tokens, config, ep, act_bytes, dedup) * max(1.0, imbalance)
    return 2 * all_to_all_ms(b, ep, link)
