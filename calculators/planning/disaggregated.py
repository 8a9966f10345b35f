"""Disaggregated serving: a prefill pool and a decode pool sized separately (different GPU counts, even types),
joined by the KV-cache handoff over the interconnect between them (DistServe, Zhong et al. 2024; Splitwise,
Patel et al. 2024; vLLM/SGLang/Dynamo PD disaggregation).

    prefill instance: one prompt at a time, prefill_ms(P) each  ->  serves 1000 / prefill_ms requests/s
    prefill instances = ceil(rate × prefill_ms / 1000 / max_utilisation)     (utilisation kept below the cap)
    TTFT p99          ≈ prefill_ms × (1 + ln(100·ρ) / (1 − ρ))⁺  + KV handoff      (M/M/1 tail, as the planner)
    KV handoff        = alpha + KV bytes of the prompt (every layer) / (link bandwidth × sending GPUs)
    decode instance : B sequences per step at ITL(B) (the largest B whose ITL meets the target and whose KV fits)
    decode instances  = ceil(rate × O × ITL(B) / 1000 / B)                     (Little's law on sequences)
Co-located serving for the same SLOs is the capacity planner's cheapest plan (`planner.plan`).
"""
from __future__ import annotations

import math

from calculators.multi_gpu.tensor_parallel import Mesh, check_mesh, max_batch_per_replica
from calculators.planning.measured_step import resolve_profile
from calculators.planning.request_latency import request_latency
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.units import check_fraction, check_int, check_positive, default_kv_dtype
from specs.devices import Device, Link, load_link
from specs.model_config import ModelConfig, SpecError
from specs.stacks import load_stack


def kv_handoff_ms(config: ModelConfig, prompt_tokens: int, kv_dtype: str, link: Link, senders: int = 1) -> float:
    """Time to move one prompt's KV cache (all layers) from a prefill instance to a decode instance: alpha of one
    transfer + bytes / (per-direction bandwidth × GPUs sending in parallel, one NIC each)."""
    if link.bytes_per_s is None:
        raise SpecError(f"{link.name} has no bandwidth of its own: choose a network link (ib_ndr, roce_400gbe, ...)")
    b = kv_cache_bytes(config, check_int("prompt tokens", prompt_tokens), 1, kv_dtype)
    return (link.alpha_base_s + b / (link.bytes_per_s * check_int("senders", senders))) * 1e3


def size_disaggregated(config: ModelConfig, prefill_device: Device, prefill_mesh: Mesh, decode_device: Device,
                       decode_mesh: Mesh, requests_per_s: float, prompt_tokens: int, output_tokens: int,
                       itl_target_ms: float, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                       handoff_link: Link | str = "ib_ndr", max_utilisation: float = 0.8, stack=None,
                       batch_limit: int = 1024, profile=None) -> dict:
    """GPUs of each pool, TTFT and ITL, and $ per hour, for `requests_per_s` requests of P in / O out. Prefill and
    decode are the deployment's step (`request_latency`, what `latency`, `serve-at` and `plan` price the same work
    with), from measured kernels on each pool's device where `profile` ("auto", a name or a Profile) finds them."""
    rate = check_positive("request rate (requests/s)", requests_per_s, limit=1e7)
    P, O = check_int("prompt tokens", prompt_tokens), check_int("output tokens", output_tokens)
    itl_target = check_positive("ITL target (ms)", itl_target_ms)
    rho_max = check_fraction("max utilisation", max_utilisation, allow_one=False)
    check_mesh(config, prefill_mesh), check_mesh(config, decode_mesh)
    kd = kv_dtype or default_kv_dtype(weight_dtype)
    s = load_stack(stack) if not hasattr(stack, "key") else stack
    link = load_link(handoff_link) if isinstance(handoff_link, str) else handoff_link

    prof_p = resolve_profile(profile, prefill_device, s.full_key, config)[0] if profile is not None else None
    prof_d = resolve_profile(profile, decode_device, s.full_key, config)[0] if profile is not None else None
    pre = request_latency(config, prefill_device, prefill_mesh, P, O, 1, weight_dtype, kd, s,
                          profile=prof_p)["ttft_ms"]
    n_pre = math.ceil(rate * pre / 1e3 / rho_max)
    rho = rate * pre / 1e3 / n_pre
    wait = max(0.0, math.log(100 * rho)) * pre / (1 - rho) if rho > 0 else 0.0
    hand = kv_handoff_ms(config, P, kd, link, prefill_mesh.gpus_per_replica)

    b_mem = max_batch_per_replica(config, decode_device, decode_mesh, P + O, weight_dtype, kd, limit=batch_limit,
                                  moe_dp_comm=s.moe_dp_comm)
    if b_mem == 0:
        raise SpecError(f"{config.name} does not fit on the decode instance ({decode_mesh.gpus_per_replica} × "
                        f"{decode_device.name}) with one sequence of {P + O:,} tokens")

    def itl(b):
        return request_latency(config, decode_device, decode_mesh, P, O, b, weight_dtype, kd, s,
                               profile=prof_d)["itl_ms"]
    if itl(1) > itl_target:
        raise SpecError(f"the decode instance cannot meet an ITL of {itl_target:g} ms even with one sequence "
                        f"({itl(1):.1f} ms): more TP or a faster device")
    lo, hi = 1, b_mem                                  # largest batch whose ITL meets the target (ITL grows with B)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if itl(mid) <= itl_target else (lo, mid - 1)
    B, step = lo, itl(lo)
    n_dec = math.ceil(rate * O * step / 1e3 / B)
    gp, gd = n_pre * prefill_mesh.gpus_per_replica, n_dec * decode_mesh.gpus_per_replica
    price = [d.price_usd_per_hour for d in (prefill_device, decode_device)]
    usd_h = None if None in price else gp * price[0] + gd * price[1]
    return dict(prefill_instances=n_pre, prefill_gpus=gp, prefill_ms=pre, prefill_utilisation=rho,
                kv_handoff_ms=hand, ttft_p99_ms=pre + wait + hand, decode_instances=n_dec, decode_gpus=gd,
                decode_batch=B, itl_ms=step, total_gpus=gp + gd, usd_per_hour=usd_h,
                usd_per_million_tokens=None if usd_h is None else usd_h / (rate * (P + O) * 3600) * 1e6,
                kv_bytes_per_request=kv_cache_bytes(config, P, 1, kd), handoff_link=link.name)
