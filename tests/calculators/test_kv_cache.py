"""KV cache: reference 003 Details 6 and 10 (MHA/GQA/MQA, Llama-2-70B, MLA), 002 (gated delta rule state).

The text mixes units: "22 KB" per token is 22,528 B = 22 KiB, and "45 MB" at 2,048 tokens is 2,048 × 22 KiB
written as 45 (thousand-KiB) "MB"; the true product is 46.1 MB (44 MiB). Tests for those sequence totals allow
3%, the size of that mixing; every per-token figure is exact.
"""
import pytest

from calculators.sizing.kv_cache import (kv_bytes_per_token, kv_bytes_per_token_from_shape, kv_cache_bytes,
                                  kv_cache_layers, kv_reduction, linear_state_bytes_per_layer,
                                  mla_kv_elements_per_token)
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")
MHA = TINY.replace(num_kv_heads=32, attention="mha")
MQA = TINY.replace(num_kv_heads=1, attention="mqa")
L2_70B = load_preset("llama-2-70b")
# the text writes KiB-based sizes with decimal prefixes ("45 MB" for 44 MiB = 46.1 MB): 2.4% apart
MIXED_UNITS = 0.03


def test_tinyllama_mha_kv_per_token_is_176_KiB():
    assert kv_bytes_per_token(MHA, "fp16") == 176 * 1024 == 4096 * 22 * 2


def test_tinyllama_gqa4_kv_per_token_is_22_KiB():
    assert kv_bytes_per_token(TINY, "fp16") == 22 * 1024 == 22_528


def test_tinyllama_gqa4_is_1_KiB_per_layer_per_token():
    assert kv_bytes_per_token(TINY.replace(num_layers=1), "fp16") == 1024


def test_tinyllama_mqa_kv_per_token_is_5_6_KB():
    assert kv_bytes_per_token(MQA, "fp16") == 5632                      # 5.6 KB (decimal)
    assert round(kv_bytes_per_token(MQA, "fp16") / 1e3, 1) == 5.6


def test_tinyllama_mha_at_2048_tokens_is_about_360_MB():
    assert kv_cache_bytes(MHA, 2048, kv_dtype="fp16") == pytest.approx(360e6, rel=MIXED_UNITS)


def test_tinyllama_gqa4_at_2048_tokens_is_about_45_MB():
    assert kv_cache_bytes(TINY, 2048, kv_dtype="fp16") == pytest.approx(45e6, rel=MIXED_UNITS)


def test_tinyllama_mqa_at_2048_tokens_is_11_5_MB():
    assert round(kv_cache_bytes(MQA, 2048, kv_dtype="fp16") / 1e6, 1) == 11.5


def test_mha_to_mqa_is_32x_smaller():
    assert kv_bytes_per_token(MHA) / kv_bytes_per_token(MQA) == 32
    assert kv_bytes_per_token(MHA) / kv_bytes_per_token(TINY) == 8


def test_lever_formula_matches_the_config_based_count():
    assert kv_bytes_per_token_from_shape(22, 4, 64, 2) == kv_bytes_per_token(TINY, "fp16")


def test_llama2_70b_like_mha_at_2048_tokens_is_5_4_GB():
    mha = L2_70B.replace(num_kv_heads=64, attention="mha")
    assert round(kv_cache_bytes(mha, 2048, kv_dtype="fp16") / 1e9, 1) == 5.4


def test_llama2_70b_gqa8_at_2048_tokens_is_0_67_GB():
    assert round(kv_cache_bytes(L2_70B, 2048, kv_dtype="fp16") / 1e9, 2) == 0.67


def test_serving_100_sequences_at_max_context_needs_4_5_GB_and_36_GB_with_mha():
    assert kv_cache_bytes(TINY, 2048, batch=10, kv_dtype="fp16") == pytest.approx(450e6, rel=MIXED_UNITS)
    assert kv_cache_bytes(TINY, 2048, batch=100, kv_dtype="fp16") == pytest.approx(4.5e9, rel=MIXED_UNITS)
    assert kv_cache_bytes(MHA, 2048, batch=100, kv_dtype="fp16") == pytest.approx(36e9, rel=MIXED_UNITS)


def test_deepseek_v2_mla_caches_34_6K_elements_per_token():
    assert mla_kv_elements_per_token(load_preset("deepseek-v2")) == 60 * (512 + 64) == 34_560   # "34.6K"


def test_mla_860_2K_to_34_6K_is_about_25x_fewer():
    r = kv_reduction(860.2e3, mla_kv_elements_per_token(load_preset("deepseek-v2")))
    assert round(r["ratio"]) == 25
    # 860.2K -> 34.6K is 96.0% fewer elements. The 93.3% the text attaches to it is DeepSeek-V2's headline
    # reduction vs DeepSeek 67B (95 layers, GQA-8, d 128, 16-bit) with V2's KV stored at ~6 bits per element:
    # 1 - 34.6/860.2 = 95.98%: half a unit of the text's one decimal
    assert r["percent_saved"] == pytest.approx(96.0, abs=0.05)


def test_mla_93_3_percent_is_deepseek_v2_vs_deepseek_67b():
    v2_bytes = kv_bytes_per_token(load_preset("deepseek-v2"), 6 / 8)         # 6-bit KV cache
    ds67b_bytes = kv_bytes_per_token_from_shape(95, 8, 128, 2)
    assert round(kv_reduction(ds67b_bytes, v2_bytes)["percent_saved"], 1) == 93.3


def test_gemma3_sliding_layers_cache_at_most_the_window():
    g = load_preset("gemma-3-27b")
    rows = {r["kind"]: r for r in kv_cache_layers(g, 32768)}
    assert rows["sliding_attention"]["tokens_kept"] == 1024 and rows["full_attention"]["tokens_kept"] == 32768
    per_layer_token = 2 * 16 * 128 * 2
    assert kv_cache_bytes(g, 32768, kv_dtype="bf16") == (10 * 32768 + 52 * 1024) * per_layer_token
    # below the window every layer keeps every token
    assert kv_cache_bytes(g, 1000, kv_dtype="bf16") == 62 * 1000 * per_layer_token


def test_gated_delta_rule_state_is_heads_x_head_k_x_head_v_float32_and_independent_of_context():
    q = load_preset("qwen3-next")
    assert linear_state_bytes_per_layer(q, include_conv=False) == 32 * 128 * 128 * 4     # [32, 128, 128] fp32
    fixed = [r for r in kv_cache_layers(q, 10) if r["fixed"]][0]["bytes"]
    assert fixed == [r for r in kv_cache_layers(q, 100_000) if r["fixed"]][0]["bytes"]
    assert kv_bytes_per_token(q, "bf16") == 12 * 2 * 2 * 256 * 2       # only the 12 full-attention layers grow


def test_kv_dtype_scales_the_cache():
    assert kv_bytes_per_token(TINY, "fp8") == kv_bytes_per_token(TINY, "fp16") / 2
    assert kv_bytes_per_token(TINY, "int4") == kv_bytes_per_token(TINY, "fp16") / 4
    assert kv_bytes_per_token(TINY, "fp32") == kv_bytes_per_token(TINY, "fp16") * 2


def test_bad_kv_inputs():
    with pytest.raises(SpecError):
        kv_cache_bytes(TINY, -1)
    with pytest.raises(SpecError):
        kv_cache_bytes(TINY, 10, batch=0)
    with pytest.raises(SpecError):
        kv_bytes_per_token(TINY, "int5")
    with pytest.raises(ValueError):
        mla_kv_elements_per_token(TINY)
