"""Maximum throughput: the batch caps worked by hand (KV memory against a brute-force loop, the stack's scheduler
limits), output = batch / step × replicas, and the stack data that sets them."""
import pytest

from calculators.multi_gpu.tensor_parallel import Mesh, per_gpu_memory
from calculators.planning.throughput import batch_limits, max_throughput, reserved_context
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.latency import Efficiency
from calculators.sizing.memory import resident_weight_bytes
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack

L8, L70, H100, A100 = load_preset("llama-3.1-8b"), load_preset("llama-3-70b"), load_device("h100"), \
    load_device("a100-80gb")


def test_reserved_context_full_or_on_demand():
    assert reserved_context(1000, 1000, "full") == 2000          # TensorRT-LLM: prompt + max output up front
    assert reserved_context(1000, 1000, "on_demand") == 1500     # vLLM: I + O/2 on average over a sequence's life


def test_token_budget_caps_the_batch_at_short_outputs():
    # vLLM on a >= 70 GiB GPU: 8,192 batched tokens; at 2,048 in / 128 out a decode row brings 16 prompt tokens:
    # 8,192 × 128 / 2,176 = 481.9 -> 481 sequences
    lim = batch_limits(L8, H100, Mesh(), 2048, 128, "fp8", "fp8", load_stack("vllm"), 0.9)
    assert lim["caps"]["scheduler token budget"] == 481
    assert lim["max_num_seqs"] == 1024 and lim["max_num_batched_tokens"] == 8192


def test_small_gpus_get_vllms_small_defaults():
    lim = batch_limits(L8, A100, Mesh(), 128, 128, "fp8", "fp8", load_stack("vllm"), 0.9)
    assert (lim["max_num_seqs"], lim["max_num_batched_tokens"]) == (256, 2048)


@pytest.mark.parametrize("stack,of_free", [("vllm", False), ("trtllm", True)])
def test_memory_cap_is_the_largest_batch_that_fits_by_a_plain_loop(stack, of_free):
    s = load_stack(stack)
    assert s.kv_fraction_of_free is of_free
    lim = batch_limits(L70, H100, Mesh(tp=2), 1000, 1000, "fp8", "fp8", s, 0.9)
    b = lim["caps"]["memory (KV cache)"]
    ctx = reserved_context(1000, 1000, s.kv_reservation)
    fits = [per_gpu_memory(L70, H100, Mesh(tp=2), ctx, n, "fp8", "fp8", usable_fraction=0.9,
                           kv_fraction_of_free=of_free)["fits"] for n in (b, b + 1)]
    assert fits == [True, False]


def test_tensorrt_llms_fraction_is_of_the_memory_the_weights_leave_free():
    # Llama-3-70B FP8 on one H100 (80 GiB = 85.90 GB), 1,000 + 1,000 tokens: KV in FP8 is 2 (k, v) × 80 layers
    # × 8 KV heads × 128 × 1 B = 163,840 B a token; TensorRT-LLM reserves prompt + output (2,000 tokens, 327.68 MB a
    # sequence), vLLM I + O/2 (1,500). TensorRT-LLM gives the KV cache 0.9 of what the weights, activations and
    # buffers leave; vLLM bounds all of them by 0.9 of the device.
    device = 80 * 2 ** 30
    trt, vllm = (batch_limits(L70, H100, Mesh(), 1000, 1000, "fp8", "fp8", load_stack(s), 0.9)["caps"]["memory (KV cache)"]
                 for s in ("trtllm", "vllm"))
    for b, of_free, ctx in ((trt, True, 2000), (vllm, False, 1500)):
        seq = 2 * 80 * 8 * 128 * 1 * ctx
        m = per_gpu_memory(L70, H100, Mesh(), ctx, b, "fp8", "fp8", usable_fraction=0.9, kv_fraction_of_free=of_free)
        rest = m["per_gpu_weight_bytes"] + m["per_gpu_activation_bytes"] + m["overhead_bytes"]
        assert m["per_gpu_kv_bytes"] == b * seq
        room = 0.9 * (device - rest) if of_free else 0.9 * device - rest
        assert b * seq <= room < (b + 1) * seq + 1e8          # the next sequence does not fit (activations grow a little)
    # the weights (about 72 GB) leave 0.9 × ~13 GB to TensorRT-LLM's KV cache, but only 0.9 × 85.9 − ~74 ≈ 3 GB to
    # vLLM's, though vLLM reserves 1,500 tokens a sequence where TensorRT-LLM reserves 2,000
    assert trt * 2000 >= 2.5 * vllm * 1500


def test_output_is_batch_over_step_times_replicas_and_total_adds_the_prompts():
    one = max_throughput(L8, H100, Mesh(), 1000, 1000, "fp8", "fp8", "vllm")
    four = max_throughput(L8, H100, Mesh(gpus=4), 1000, 1000, "fp8", "fp8", "vllm")
    assert one["output_tok_s"] == pytest.approx(one["max_batch"] / one["step_ms"] * 1e3)
    assert four["output_tok_s"] == pytest.approx(4 * one["output_tok_s"]) and four["replicas"] == 4
    assert one["total_tok_s"] == pytest.approx(one["output_tok_s"] * 2000 / 1000)


def test_step_memory_time_is_weights_plus_kv_at_the_mean_context_over_bandwidth_times_mbu():
    r = max_throughput(L8, H100, Mesh(), 1000, 1000, "fp8", "fp8", "vllm")
    B, mbu = r["max_batch"], Efficiency.for_stack("vllm", H100).decode_mbu
    by = resident_weight_bytes(L8, "fp8") + kv_cache_bytes(L8, 1500, B, "fp8")
    assert r["memory_ms"] == pytest.approx(by / (3350e9 * mbu) * 1e3, rel=1e-9)


def test_scheduler_limit_binds_a_small_model_with_short_requests():
    r = max_throughput(L8, H100, Mesh(), 128, 128, "fp8", "fp8", "vllm")
    assert r["batch_binding"] == "scheduler max sequences" and r["max_batch"] == 1024


def test_bad_input_is_one_message():
    with pytest.raises(SpecError, match="exceeds Llama-3-70B's context window"):
        max_throughput(L70, H100, Mesh(tp=8), 8000, 1000, "fp8", "fp8")
    with pytest.raises(SpecError, match="does not fit on 1 × H100 SXM"):
        max_throughput(L70, H100, Mesh(), 1000, 1000, "bf16")
    with pytest.raises(SpecError, match="unknown serving stack"):
        max_throughput(L8, H100, Mesh(), 100, 100, stack="nope")
