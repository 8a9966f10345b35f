"""The scheduler caps `trtllm-bench throughput` picks for itself (`calculators.planning.trtllm_bench`). Each
expected value is worked by hand from TensorRT-LLM's rule (`tensorrt_llm/bench/build/tuning.py`) with the numbers
written out in the test."""
import pytest

from calculators.planning.trtllm_bench import finetune, trtllm_bench_caps
from calculators.sizing.params import total_params
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

QWEN = load_preset("qwen3-235b-a22b")


def test_qwen3_235b_fp8_on_eight_h200_is_2304_sequences_and_4608_tokens():
    """KV per token: 2 × 94 layers × max(8, 4) heads × 128 × 1 B = 192,512 B. Free: 8 × 141 GiB − 235.1 G
    parameters × 1 B. Requests of 2,000 tokens at 90% of it: ≈ 2,282 → rounded up to 256s: 2,304; tokens
    2,282 × (1 + 1000/1000) ≈ 4,563 → rounded up to 512s: 4,608 (≥ 1,000 + 2,304)."""
    per_token = 2 * 94 * 8 * 128 * 1.0
    free = 8 * 141 * 2 ** 30 - total_params(QWEN) * 1.0
    assert 235e9 < total_params(QWEN) < 236e9
    requests = free * 0.9 / (per_token * 2000)
    assert 2250 < requests < 2304
    got = trtllm_bench_caps(QWEN, load_device("h200"), 8, 1, 1000, 1000, "fp8", "fp8", 0.9)
    assert got["estimated_requests"] == pytest.approx(requests, rel=1e-9)
    assert (got["max_num_seqs"], got["max_num_batched_tokens"]) == (2304, 4608)


def test_a_small_model_hits_the_4096_request_cap_and_a_long_prompt_lifts_the_token_budget():
    """Llama-3.1-8B FP8 on one H100, 128 / 128: far more than 4,096 requests fit, so 4,096 sequences and
    min(4,096 × 2, 32,768) = 8,192 tokens. Llama-3.3-70B NVFP4 on one B200, 20,000 / 2,000: (180 − 70.6 × 0.5)
    GiB × 0.9 / (2 × 80 × 8 × 128 B × 22,000) ≈ 39 requests → the floor of 64 sequences; tokens ≈ 433 → 2,048,
    then at least one whole prompt beside the batch (chunked prefill off): 20,000 + 64."""
    llama8 = trtllm_bench_caps(load_preset("llama-3.1-8b"), load_device("h100"), 1, 1, 128, 128, "fp8", "fp8")
    assert (llama8["max_num_seqs"], llama8["max_num_batched_tokens"]) == (4096, 8192)
    big = trtllm_bench_caps(load_preset("llama-3.3-70b"), load_device("b200"), 1, 1, 20000, 2000, "fp4", "fp8")
    assert 35 < big["estimated_requests"] < 45
    assert (big["max_num_seqs"], big["max_num_batched_tokens"]) == (64, 20064)


@pytest.mark.parametrize("requests, want", [
    (10, (64, 2048)),            # at least 64 sequences, at least 2,048 tokens
    (250, (256, 2048)),          # below 256: up to a multiple of 32; 500 tokens -> 2,048
    (600, (640, 2048)),          # below 1,024: up to a multiple of 128; 1,200 tokens -> 2,048
    (2500, (2560, 5120)),        # from 1,024: up to a multiple of 256; 5,000 tokens -> up to 512s
    (9999, (4096, 8192)),        # capped at 4,096 requests; 8,192 tokens -> up to 1,024s
])
def test_finetune_rounds_up_in_the_steps_trtllm_bench_uses(requests, want):
    assert finetune(requests, 1000, 1000) == want


def test_pipeline_stages_split_the_batch_and_the_token_cap_is_32768():
    assert finetune(4000, 1000, 1000, pp=2) == (2048, 4096)
    assert finetune(4096, 20000, 1000)[1] == 32768


def test_a_model_larger_than_the_gpus_says_so():
    with pytest.raises(SpecError, match="need more memory than 1 × H100"):
        trtllm_bench_caps(load_preset("llama-3.1-405b"), load_device("h100"), 1, 1, 128, 128, "bf16", "bf16")
