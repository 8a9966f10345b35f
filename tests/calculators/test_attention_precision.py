"""Attention at its own precision: the weight GEMMs run at the weights' precision (FP4 on Blackwell with NVFP4
weights), attention's products (QKᵀ, P·V, MLA's latent scores and absorbed W_UK/W_UV) at BF16, or FP8 where the
KV cache is FP8, never FP4. Expected values worked by hand from the models' configs and the devices' datasheet
peaks (specs/devices.json: B200 dense 9,000 TFLOP/s FP4, 4,500 FP8, 2,250 BF16)."""
import pytest

from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel
from calculators.sizing.latency import IDEAL, decode_step_ms
from calculators.sizing.roofline import (attention_precision_for, compute_seconds, forward_flops,
                                         forward_flops_split, step_peaks)
from specs.devices import load_device
from specs.presets import load_preset

R1, L8, B200 = load_preset("deepseek-r1"), load_preset("llama-3.1-8b"), load_device("b200")


def test_attention_precision_never_fp4():
    assert attention_precision_for("fp4", "fp8") == "fp8"      # NVFP4 weights, FP8 KV: FP8 attention
    assert attention_precision_for("fp4", "bf16") == "bf16"
    assert attention_precision_for("fp4", "fp4") == "fp8"      # an FP4 cache is widened for the products
    assert attention_precision_for("fp8", "fp8") == "fp8"
    assert attention_precision_for("fp8", "bf16") == "bf16"
    assert attention_precision_for("bf16") == "bf16"
    assert attention_precision_for("int4") == "bf16"           # weight-only int4: BF16 KV, BF16 attention
    assert attention_precision_for("fp32") == "fp32"


def test_mla_decode_attention_flops_by_hand():
    # DeepSeek-R1: 61 layers, 128 heads, kv_lora_rank 512 + rope 64 = latent 576, qk_nope 128, v_head 128.
    # One decode row at 1,000 keys, per layer: scores 2·1000·128·576 = 147,456,000; P·V 2·1000·128·512 =
    # 131,072,000; W_UK absorb 2·128·128·512 = 16,777,216; W_UV 2·128·512·128 = 16,777,216; sum 312,082,432;
    # × 61 = 19,037,028,352
    f = forward_flops_split(R1, 1, 1000, 1)
    assert f["attention"] == 19_037_028_352
    assert f["weights"] + f["attention"] == pytest.approx(forward_flops(R1, 1, 1000, 1), rel=1e-12)


def test_gqa_attention_flops_by_hand():
    # Llama-3.1-8B: 32 layers × (QKᵀ + P·V) = 32 × 4 · 2048 keys · 128 head dim · 32 query heads = 1,073,741,824
    assert forward_flops_split(L8, 1, 2048, 1)["attention"] == 1_073_741_824


def test_fp4_weights_on_b200_attention_at_fp8_peak():
    pk = step_peaks(B200, "fp4", "fp8")
    assert (pk["weights"], pk["attention"]) == (9000e12, 4500e12)
    assert (pk["precision"], pk["attention_precision"]) == ("fp4", "fp8")
    # 64 decode rows of DeepSeek-R1 at 1,000 keys, IDEAL efficiency (MFU 1): the weight GEMMs' FLOPs / 9 PFLOP/s
    # + 64 × 19,037,028,352 attention FLOPs / 4.5 PFLOP/s (0.27075 ms), not everything at 9 PFLOP/s
    f = forward_flops_split(R1, 1, 1000, 64)
    attn_ms = 64 * 19_037_028_352 / 4500e12 * 1e3
    assert attn_ms == pytest.approx(0.270749, rel=1e-5)
    want = f["weights"] / 9000e12 * 1e3 + attn_ms
    assert compute_seconds(f, pk) * 1e3 == pytest.approx(want, rel=1e-12)
    d = decode_step_ms(R1, B200, 1000, 64, "fp4", "fp8", IDEAL)
    assert d["compute_ms"] == pytest.approx(want, rel=1e-12)
    assert d["compute_ms"] > (f["weights"] + f["attention"]) / 9000e12 * 1e3     # slower than all-FP4
    t = decode_step_parallel(R1, B200, Mesh(tp=1), 1000, 64, "fp4", "fp8", IDEAL)
    assert t["compute_ms"] == pytest.approx(want, rel=1e-9)


def test_bf16_kv_with_fp4_weights_costs_attention_at_bf16():
    f = forward_flops_split(R1, 1, 1000, 64)
    pk = step_peaks(B200, "fp4", "bf16")
    assert compute_seconds(f, pk) == pytest.approx(f["weights"] / 9000e12 + f["attention"] / 2250e12, rel=1e-12)
