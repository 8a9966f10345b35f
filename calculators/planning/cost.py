"""What serving costs: $ per request and per million input and output tokens at an operating point.

A replica of `gpus` GPUs at `price_usd_per_gpu_hour` each, serving `batch` sequences at once, spends per request
its prefill time (the prompt is processed with the replica to itself, the compute-bound part) and 1/batch of the
decode time of its output (the weight read is shared by the batch):
    replica-seconds per request = prefill_s + output_tokens × itl_s / batch
    $ per request               = replica-seconds × gpus × price / 3,600
    $ per 1M input tokens       = prefill part / prompt_tokens × 10^6;  output likewise with the decode part.
Prices are typical on-demand rates read in the year stated beside them (`specs/devices.json`: price_source,
price_date); they are assumptions a user should replace with their own.
"""
from __future__ import annotations

from calculators.units import check_int, check_nonneg, check_positive


def cost_per_request(price_usd_per_gpu_hour: float, gpus: int, prefill_ms: float, itl_ms: float, batch: int,
                     prompt_tokens: int, output_tokens: int) -> dict:
    """Split the replica's time between the prompt (prefill) and the reply (decode), then price it.
    1 × A100 at $1.29/h, TinyLlama 100-token prompt in 5 ms, 200 tokens at 1.4 ms, batch 1:
    0.005 + 200 × 0.0014 = 0.285 replica-s -> $0.000102 per request."""
    price = check_positive("price_usd_per_gpu_hour", price_usd_per_gpu_hour)
    g, B = check_int("gpus", gpus), check_int("batch", batch, limit=1 << 30)
    P, N = check_int("prompt_tokens", prompt_tokens), check_int("output_tokens", output_tokens)
    pre_s = check_nonneg("prefill_ms", prefill_ms) / 1e3
    dec_s = N * check_nonneg("itl_ms", itl_ms) / 1e3 / B
    usd_per_s = g * price / 3600.0
    pre_usd, dec_usd = pre_s * usd_per_s, dec_s * usd_per_s
    return dict(replica_seconds_per_request=pre_s + dec_s, usd_per_request=pre_usd + dec_usd,
                usd_prefill_per_request=pre_usd, usd_decode_per_request=dec_usd,
                usd_per_million_input_tokens=pre_usd / P * 1e6, usd_per_million_output_tokens=dec_usd / N * 1e6,
                usd_per_million_tokens=(pre_usd + dec_usd) / (P + N) * 1e6)


def cost_if_priced(price_usd_per_gpu_hour: float | None, gpus: int, prefill_ms: float, itl_ms: float, batch: int,
                   prompt_tokens: int, output_tokens: int) -> dict:
    """`cost_per_request` where the GPU has an hourly price; {} where it has none (some devices list no price)."""
    if not price_usd_per_gpu_hour:
        return {}
    return cost_per_request(price_usd_per_gpu_hour, gpus, prefill_ms, itl_ms, batch, prompt_tokens, output_tokens)


def cost_at_load_usd_per_million_tokens(price_usd_per_gpu_hour: float, total_gpus: int, requests_per_s: float,
                                        tokens_per_request: float) -> float:
    """What a deployment costs per 1M tokens it actually serves: all GPUs are paid whether busy or not:
    gpus × price / (rate × tokens per request × 3,600) × 10^6."""
    return check_int("total_gpus", total_gpus) * check_positive("price_usd_per_gpu_hour", price_usd_per_gpu_hour) / (
        check_positive("requests_per_s", requests_per_s) * check_positive("tokens_per_request", tokens_per_request)
        * 3600.0) * 1e6
