"""The scheduler caps `trtllm-bench throughput` picks for itself when it is not given --max_batch_size and
--max_num_tokens, in place of the LLM API's defaults (2,048 sequences, 8,192 tokens). TensorRT-LLM calls them "a
slightly optimistic upper bound": its runtime tunes the batch it runs to the traffic, so they bound a run's batch
rather than fix it (`python -m calculators throughput --caps trtllm-bench` prices a run at them).

TensorRT-LLM `tensorrt_llm/bench/build/tuning.py` (`calc_engine_setting`, `finetune_setting`; commit
04cba882084a25665e7f80f5bda71b35b9790b6f, the same rule since v0.17), fed the dataset's mean lengths I and O:

    KV per token   = 2 × layers × max(tp, kv heads) × head dim × KV bytes        (every GPU holds ≥ 1 KV head)
    free           = nvml total memory (GiB) × tp × pp − parameters × weight bytes (FP8 1, NVFP4 0.5, else 2)
    requests       = free × fraction / (KV per token × (I + O))       fraction: --kv_cache_free_gpu_mem_fraction
    raw batch      = min(requests, 4,096) / pp;     raw tokens = min(raw batch × (1 + I / O), 32,768)
    max batch      = raw batch rounded up: to 32 (at least 64) below 256, to 128 below 1,024, else to 256
    max tokens     = raw tokens rounded up: to 256 (at least 2,048) below 4,096, to 512 below 8,192, else to 1,024
and, chunked prefill being off by default, max tokens ≥ I + max batch (`bench/benchmark/utils/general.py`
`get_settings`). The run's own KV cache (the stack's fraction of the memory left free) still caps the batch.
"""
from __future__ import annotations

import math

from calculators.sizing.kv_cache import kv_bytes_per_token_from_shape
from calculators.sizing.params import total_params
from calculators.units import check_fraction, check_int
from specs.devices import Device, GiB
from specs.model_config import ModelConfig, SpecError

BYTES_PER_ELEMENT = {"fp8": 1.0, "fp8_block": 1.0, "fp4": 0.5}   # tuning.py BYTES_PER_ELEM; anything else: 2
MAX_REQUESTS = 4096
MAX_TOKENS = 32768


def _round_up(x: float, step: int) -> int:
    return step * math.ceil(x / step)


def finetune(requests: float, prompt_tokens: int, output_tokens: int, pp: int = 1) -> tuple[int, int]:
    """`finetune_setting`: (max batch, max tokens) from the requests the KV estimate holds."""
    raw_bs = min(requests, MAX_REQUESTS) / pp
    raw_tokens = min(raw_bs * (1 + prompt_tokens / output_tokens), MAX_TOKENS)
    if raw_bs < 256:
        bs = max(64, _round_up(raw_bs, 32))
    else:
        bs = _round_up(raw_bs, 128 if raw_bs < 1024 else 256)
    if raw_tokens < 4096:
        tokens = max(2048, _round_up(raw_tokens, 256))
    else:
        tokens = _round_up(raw_tokens, 512 if raw_tokens < 8192 else 1024)
    return bs, tokens


def kv_requests(config: ModelConfig, device: Device, tp: int, pp: int, prompt_tokens: int, output_tokens: int,
                weight_dtype: str, kv_dtype: str, fraction: float) -> float:
    """`calc_engine_setting`'s estimate of the requests of I + O tokens the KV cache holds."""
    per_token = kv_bytes_per_token_from_shape(config.num_layers, max(tp, config.num_kv_heads), config.head_dim,
                                              BYTES_PER_ELEMENT.get(kv_dtype, 2.0)) / GiB
    free = device.memory_bytes / GiB * tp * pp - total_params(config) * BYTES_PER_ELEMENT.get(weight_dtype, 2.0) / GiB
    if free <= 0:
        raise SpecError(f"trtllm-bench: {config.name}'s weights need more memory than {tp * pp} × {device.name} "
                        f"hold; use more GPUs")
    return free * fraction / (per_token * (prompt_tokens + output_tokens))


def trtllm_bench_caps(config: ModelConfig, device: Device, tp: int, pp: int, prompt_tokens: int,
                      output_tokens: int, weight_dtype: str, kv_dtype: str, fraction: float = 0.9) -> dict:
    """The `max_num_seqs` and `max_num_batched_tokens` trtllm-bench throughput runs with (keyword arguments of
    the planning functions), and the request estimate they came from."""
    tp, pp = check_int("tp", tp, limit=1 << 12), check_int("pp", pp, limit=1 << 10)
    I, O = check_int("prompt tokens", prompt_tokens), check_int("output tokens", output_tokens)
    requests = kv_requests(config, device, tp, pp, I, O, weight_dtype, kv_dtype,
                           check_fraction("KV free-memory fraction", fraction))
    bs, tokens = finetune(requests, I, O, pp)
    return dict(max_num_seqs=bs, max_num_batched_tokens=max(tokens, I + bs), estimated_requests=requests)
