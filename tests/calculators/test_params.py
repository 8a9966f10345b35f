"""Parameter counts and weight bytes: worked numbers of reference 003 (Details 2a, 8, 18, 22)."""
import pytest

from calculators.sizing.params import (active_params, attention_parts_per_layer, bytes_per_param,
                                dense_ffn_params_per_layer, embedding_bytes, param_breakdown, total_params,
                                weight_bytes)
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")


def test_tinyllama_embedding_table_is_131_MB():
    assert embedding_bytes(TINY, "fp16") == 32000 * 2048 * 2 == 131_072_000     # "= 131 MB"


def test_tinyllama_ffn_is_34_6M_params_per_layer():
    # 3 × 2,048 × 5,632 = 34.60M: the text's one decimal
    assert dense_ffn_params_per_layer(TINY) / 1e6 == pytest.approx(34.6, abs=0.05)


def test_tinyllama_ffn_is_761M_params_total_about_two_thirds_of_1_1B():
    b = param_breakdown(TINY)
    # 22 × 34.60M = 761.2M: the text's whole millions
    assert b.ffn_dense / 1e6 == pytest.approx(761, abs=0.5)
    assert b.ffn_dense / 1.1e9 == pytest.approx(2 / 3, abs=0.03)           # "roughly 2/3" (0.69)


def test_tinyllama_is_1_1B_params():
    # 1.100 B: the text's "1.1B" to its last digit
    assert total_params(TINY) / 1e9 == pytest.approx(1.1, abs=0.005)


def test_tinyllama_fp16_weights_are_2_2_GB():
    # 2.200 GB: the text's "2.2 GB" to its last digit
    assert weight_bytes(TINY, "fp16") / 1e9 == pytest.approx(2.2, abs=0.005)


def test_tinyllama_gqa4_projection_shapes():
    p = attention_parts_per_layer(TINY)           # W_Q 2,048 -> 2,048; W_K, W_V 2,048 -> 256
    assert p["q_proj"] == 2048 * 2048 and p["k_proj"] == p["v_proj"] == 2048 * 256 and p["o_proj"] == 2048 * 2048


def test_tinyllama_int8_is_1_1_GB_and_int4_is_0_55_GB():
    # float products below: approx's default rel 1e-6 absorbs their last bits
    assert weight_bytes(1.1e9, "int8") == pytest.approx(1.1e9)
    assert weight_bytes(1.1e9, "int4") == pytest.approx(0.55e9)


def test_70B_fp16_is_140_GB_and_int4_is_35_GB():
    assert weight_bytes(70e9, "fp16") == pytest.approx(140e9)
    assert weight_bytes(70e9, "int4") == pytest.approx(35e9)


def test_70B_int4_with_scales_is_38_to_40_GB():
    # 003 Detail 18: "Add scale-factor metadata, call it 38 to 40 GB": an fp16 scale per 32 weights (GGUF Q4_0
    # layout, 4.5 bits/weight) lands in that range; GPTQ's group 128 with scale + zero point is slightly less.
    assert 38e9 <= weight_bytes(70e9, "int4", group_size=32) <= 40e9
    assert weight_bytes(70e9, "int4", group_size=128, zero_point=True) == pytest.approx(70e9 * (0.5 + 4 / 128))


def test_bytes_per_param_with_group_scales():
    assert bytes_per_param("int4", 128) == 0.5 + 2 / 128
    assert bytes_per_param("bf16") == 2 and bytes_per_param("fp8") == 1 and bytes_per_param("fp32") == 4
    with pytest.raises(SpecError):
        bytes_per_param("int3")
    with pytest.raises(SpecError):
        bytes_per_param("int4", group_size=0)


def test_draft_125M_is_250_MB():
    assert weight_bytes(125e6, "fp16") == pytest.approx(250e6)


def test_tied_embeddings_have_no_separate_lm_head():
    smol = param_breakdown(load_preset("smollm2"))
    assert smol.tied and smol.lm_head == 0
    assert param_breakdown(TINY).lm_head == 32000 * 2048


def test_moe_active_params_count_top_k_and_shared_experts_only():
    mix = load_preset("mixtral")
    b = param_breakdown(mix)
    one_expert = 3 * 4096 * 14336
    assert b.experts_routed == 32 * 8 * one_expert
    assert b.total - b.active == 32 * 6 * one_expert
    assert active_params(mix) < total_params(mix)


def test_tinyllama_components_worked_by_hand():
    # (the total is defined as the sum of the components; test_specs checks totals against published counts)
    b = param_breakdown(TINY)
    assert b.embedding == b.lm_head == 32000 * 2048
    assert b.attention == 22 * (2 * 2048 * 2048 + 2 * 2048 * 256)
    assert b.ffn_dense == 22 * 3 * 2048 * 5632 and b.norms == (2 * 22 + 1) * 2048
    assert b.total == 1_100_048_384                                    # TinyLlama-1.1B's published count


def test_weight_bytes_rejects_bad_counts():
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(SpecError):
            weight_bytes(bad, "fp16")
