"""DeepEP's buffers (`calculators.multi_gpu.deepep`): the low-latency layout worked by hand for DeepSeek-V3 from
DeepEP's csrc/config.hpp, the normal-mode NVLink hint, input checks, and the planner's wide-EP rows carrying them."""
import pytest

from calculators.multi_gpu.deepep import (WORKSPACE_BYTES, deepep_low_latency_bytes, deepep_normal_nvl_bytes,
                                          low_latency_message_bytes, wide_ep_buffer_bytes)
from calculators.multi_gpu.tensor_parallel import Mesh, per_gpu_memory
from calculators.planning.planner import SearchSpace, Workload, plan
from calculators.units import GiB, MiB
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

R1, H200 = load_preset("deepseek-r1"), load_device("h200")


def test_low_latency_buffer_for_deepseek_v3_at_128_tokens_per_rank_by_hand():
    """DeepEP's LowLatencyLayout for h = 7,168, E = 256, T = 128 (its tests' token count), written out:
    scales s = 7,168 / 128 = 56
    dispatch message = 16 + max(2·7,168, 7,168 + 4·56) = 16 + max(14,336, 7,392) = 14,352 B
    combine message  = 2·7,168 + 4·56 = 14,560 B
    send   = max(128·14,352, 256·128·14,560) = max(1,837,056, 477,102,080) = 477,102,080
    recv   = max(256·128·14,352, 256·128·14,560) = max(470,286,336, 477,102,080) = 477,102,080
    signal = 4·256 = 1,024 (already a multiple of 128)
    layout = 2·477,102,080 + 2·477,102,080 + 2·1,024 = 1,908,410,368 (a multiple of 128)
    hint   = (1,908,410,368 / 128 + 1)·128 = 1,908,410,496 B ≈ 1.78 GiB.
    The EP rank count (8 or 16) does not enter the layout."""
    assert low_latency_message_bytes(7168) == (14352, 14560)
    assert deepep_low_latency_bytes(7168, 256, 128) == 1_908_410_496
    # vLLM's T = 256 doubles every data buffer: 4·954,204,160 + 2,048 + 128
    assert deepep_low_latency_bytes(7168, 256, 256) == 4 * 256 * 256 * 14560 + 2 * 1024 + 128


def test_normal_mode_nvlink_buffer_for_deepseek_v3_on_8_ranks_by_hand():
    """Config(20 SMs, nvl recv 256) on 8 ranks, BF16 hidden rows of 14,336 B: 10 channels × 8 peers;
    10·8·(2·1 + 3)·4 = 1,600 B of counters; per token 14,336 + 8 + 128·8 + 128·4 + 128·4 = 16,392 B, 10·8·256 =
    20,480 tokens -> 335,708,160 B; 335,709,760 rounded up to 128 = 335,709,824 B. FP8 rows take 7,168 B less each."""
    assert deepep_normal_nvl_bytes(7168, 8) == 335_709_824
    assert deepep_normal_nvl_bytes(7168, 8, "fp8") == -(-(1600 + 20480 * (16392 - 7168)) // 128) * 128


@pytest.mark.parametrize("call", [
    lambda: deepep_low_latency_bytes(7168, 0, 128),
    lambda: deepep_low_latency_bytes(7168, 256, 0),
    lambda: deepep_low_latency_bytes(7168, 256, 1.5),
    lambda: deepep_low_latency_bytes(0, 256, 128),
    lambda: deepep_normal_nvl_bytes(7168, 12),               # past 8 ranks only whole nodes
    lambda: deepep_normal_nvl_bytes(7168, 8, num_sms=21),
    lambda: wide_ep_buffer_bytes(R1, 1, 8, nvl_bytes=-1),
])
def test_bad_inputs_are_spec_errors(call):
    with pytest.raises(SpecError):
        call()


def test_only_layouts_whose_ep_group_spans_replicas_hold_deepep_buffers():
    """vLLM's defaults: T = 256 tokens per rank, a 1 GiB NVLink buffer, DeepEP's 32 MiB workspace."""
    want = deepep_low_latency_bytes(7168, 256, 256) + 1 * GiB + 32 * MiB
    assert wide_ep_buffer_bytes(R1, 1, 8) == want == 4_924_115_072 and WORKSPACE_BYTES == 32 * MiB
    assert wide_ep_buffer_bytes(R1, 8, 8) == wide_ep_buffer_bytes(R1, 8, 1) == 0.0
    assert wide_ep_buffer_bytes(load_preset("llama-3-8b"), 1, 8) == 0.0
    ctx = 2500
    wide, tp8 = (per_gpu_memory(R1, H200, m, ctx, 64, "fp8", "fp8", moe_dp_comm="all_to_all")
                 for m in (Mesh(tp=1, ep=8, gpus=8), Mesh(tp=8, ep=8, gpus=8)))
    assert wide["a2a_buffer_bytes"] == want and tp8["a2a_buffer_bytes"] == 0.0
    gathering = per_gpu_memory(R1, H200, Mesh(tp=1, ep=8, gpus=8), ctx, 64, "fp8", "fp8")   # the stacks' default
    assert gathering["a2a_buffer_bytes"] == 0.0
    assert wide["per_gpu_needed_bytes"] - gathering["per_gpu_needed_bytes"] == pytest.approx(want, rel=1e-12)
    parts = ("per_gpu_weight_bytes", "per_gpu_kv_bytes", "per_gpu_activation_bytes", "overhead_bytes",
             "a2a_buffer_bytes")
    assert wide["per_gpu_needed_bytes"] == pytest.approx(sum(wide[k] for k in parts), rel=1e-12)


WL = Workload(requests_per_s=16.0, prompt_tokens=2000, output_tokens=500, ttft_p99_ms=3000, itl_ms=150)


def _largest_fitting_cap(a2a: float) -> int:
    """Most sequences TP 1 × DP 8, EP 8 holds per replica on H200 with `a2a` bytes of buffers (by bisection on
    per_gpu_memory, whose need without them is its need minus its own buffers)."""
    mesh, lo, hi = Mesh(tp=1, ep=8, gpus=8), 0, 1 << 12
    while lo < hi:
        mid = (lo + hi + 1) // 2
        m = per_gpu_memory(R1, H200, mesh, 2500, mid, "fp8", "fp8", moe_dp_comm="all_to_all")
        lo, hi = (mid, hi) if m["per_gpu_needed_bytes"] - m["a2a_buffer_bytes"] + a2a <= m["usable_bytes"] \
            else (lo, mid - 1)
    return lo


def test_planner_wide_ep_rows_need_the_buffers_and_a_cap_that_fit_without_them_is_rejected():
    """A stack that runs DeepEP against the same stack gathering (the default, NCCL's buffers): every wide-EP row's
    need is exactly 4,924,115,072 B higher with DeepEP, and the largest batch cap that fits without the buffers
    (while not with them) is a memory reject with them."""
    from dataclasses import replace
    from specs.stacks import load_stack
    vllm = load_stack("vllm")
    deepep = replace(vllm, doc={**vllm.doc, "moe_dp_comm": "all_to_all"})
    a2a = wide_ep_buffer_bytes(R1, 1, 8)
    cap = _largest_fitting_cap(0.0)
    assert _largest_fitting_cap(a2a) < cap
    space = SearchSpace(gpu_counts=(8,), tp=(1, 2), pp=(1,), batch_caps=(64, cap), weight_dtypes=("fp8",),
                        kv_dtypes=("fp8",))
    with_buffers = plan(R1, [H200], WL, space, stack=deepep)
    without = plan(R1, [H200], WL, space, stack=vllm)
    for tp in (1, 2):
        for B in (64, cap):
            (on,) = with_buffers.find(H200.name, 8, tp, 1, B, "fp8", "fp8", ep=8)
            (off,) = without.find(H200.name, 8, tp, 1, B, "fp8", "fp8", ep=8)
            assert on["per_gpu_needed_bytes"] - off["per_gpu_needed_bytes"] == pytest.approx(a2a, rel=1e-9)
    (on,) = with_buffers.find(H200.name, 8, 1, 1, cap, "fp8", "fp8", ep=8)
    (off,) = without.find(H200.name, 8, 1, 1, cap, "fp8", "fp8", ep=8)
    assert on["reason"] == "memory" and on["rank"] is None and off["reason"] != "memory"
