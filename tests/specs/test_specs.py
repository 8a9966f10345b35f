"""Model presets, the Hugging Face config parser, and device datasheets."""
import json
import math

import pytest

from specs.devices import (all_devices, custom_device, device_documents, list_devices, load_device,
                           measure_this_machine)
from specs.hf_config import parse_hf_config
from specs.model_config import SpecError
from specs.presets import load_preset, preset_document
from calculators.sizing.params import param_breakdown
from specs.hf_config import config_from_json_file

REQUIRED_MODELS = ["TinyLlama-1.1B", "SmolLM2-135M", "Llama-2-7B", "Llama-2-13B", "Llama-2-70B", "Llama-3-8B",
                   "Llama-3-70B", "Llama-3.1-405B", "Mistral-7B", "Qwen2.5-7B", "Gemma-2-9B", "Gemma-3-27B",
                   "DeepSeek-V2", "DeepSeek-V3", "Qwen3-Next-80B-A3B", "Mixtral-8x7B", "Llama-3.1-8B", "DeepSeek-R1",
                   "Qwen3-30B-A3B", "Qwen3-235B-A22B", "gpt-oss-120b", "gpt-oss-20b", "Llama-4-Scout-17B-16E",
                   "Llama-4-Maverick-17B-128E", "Llama-3.1-70B", "Llama-3.3-70B"]
REQUIRED_DEVICES = ["A100 SXM 40GB", "A100 SXM 80GB", "H100 SXM", "H100 PCIe", "H200", "B200", "GB200", "MI300X",
                    "MI325X", "L4", "L40S", "RTX 4090", "RTX 3090", "A10G", "T4", "Apple M1 Ultra", "Apple M2 Ultra",
                    "Apple M3 Max", "Apple M4 Max", "TPU v5e", "TPU v5p", "Gaudi 3", "B300", "GB300", "MI355X", "H20",
                    "RTX 5090", "TPU v6e"]


# --- presets ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_every_required_model_is_a_preset_with_a_source(name):
    doc = preset_document(name)
    assert doc["source"].startswith("https://huggingface.co/")
    assert isinstance(doc["config"], dict) and doc["config"]
    load_preset(name)


# Published totals (model cards / papers), in billions; our counts must land within 1%: the cards round to 3 digits
# (6.74, 46.7) and some count small extras we leave out (biases, a vision tower).
@pytest.mark.parametrize("name, billions, active", [
    ("TinyLlama-1.1B", 1.10, None), ("Llama-2-7B", 6.74, None), ("Llama-2-13B", 13.0, None),
    ("Llama-2-70B", 69.0, None), ("Llama-3-8B", 8.03, None), ("Llama-3-70B", 70.6, None),
    ("Llama-3.1-70B", 70.6, None), ("Llama-3.3-70B", 70.6, None),
    ("Llama-3.1-405B", 405.9, None), ("Mistral-7B", 7.24, None), ("Qwen2.5-7B", 7.61, None),
    ("Gemma-2-9B", 9.24, None), ("DeepSeek-V2", 236, 21), ("DeepSeek-V3", 671, 37), ("Mixtral-8x7B", 46.7, 12.9),
    ("Qwen3-Next-80B-A3B", 80, None), ("SmolLM2-135M", 0.1345, None), ("Llama-3.1-8B", 8.03, None),
    ("DeepSeek-R1", 671, 37), ("Qwen3-30B-A3B", 30.5, 3.3), ("Qwen3-235B-A22B", 235, 22),
    ("Llama-4-Maverick-17B-128E", 400, 17),
    # gpt-oss model card (arXiv:2508.10925): 116.83B and 20.91B total; its active counts (5.13B, 3.61B) leave out
    # the embedding table, which ours include, so only totals are compared
    ("gpt-oss-120b", 116.83, None), ("gpt-oss-20b", 20.91, None),
])

def test_preset_parameter_counts_match_published_totals(name, billions, active):
    b = param_breakdown(load_preset(name))
    assert b.total / 1e9 == pytest.approx(billions, rel=0.01)
    if active is not None:
        # published active counts are rounded to 2-3 digits (12.9, 21, 37): up to 2.4% apart
        assert b.active / 1e9 == pytest.approx(active, rel=0.03)


def test_llama4_scout_is_109b_with_its_vision_tower_and_17b_active():
    # the card's 109B counts the vision encoder (not in the text config): the language model is within 2% of it
    b = param_breakdown(load_preset("Llama-4-Scout-17B-16E"))
    assert b.total / 1e9 == pytest.approx(109, rel=0.02) and b.active / 1e9 == pytest.approx(17, rel=0.03)


def test_gemma3_text_model_is_27B_without_its_vision_tower():
    # 27.0 is the model card's rounding (27.01 B counted)
    assert param_breakdown(load_preset("gemma-3-27b")).total / 1e9 == pytest.approx(27.0, rel=0.01)


def test_llama3_70b_preset_matches_reference_000_symbols():
    c = load_preset("Llama-3-70B")     # V 128,256; D 8,192; F 28,672; L 80; h_q 64; h_kv 8; G 8; d_k 128
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (128256, 8192, 28672, 80)
    assert (c.num_heads, c.num_kv_heads, c.group_size, c.head_dim) == (64, 8, 8, 128)
    assert c.head_dim == c.hidden_size // c.num_heads


def test_llama31_and_33_70b_presets_have_128k_context_where_llama3_has_8k():
    # Meta's config.json files: Llama 3.1/3.3 70B max_position_embeddings 131072 with llama3 rope scaling (factor 8
    # over the original 8192); Llama 3 70B 8192. Same shapes otherwise.
    old = load_preset("Llama-3-70B")
    for name in ("Llama-3.1-70B", "Llama-3.3-70B"):
        c = load_preset(name)
        assert c.max_position_embeddings == 131072 and old.max_position_embeddings == 8192
        assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads,
                c.vocab_size) == (8192, 28672, 80, 64, 8, 128256)
        assert preset_document(name)["config"]["rope_scaling"]["factor"] == 8.0


def test_tinyllama_preset_matches_reference_003():
    c = load_preset("tinyllama")
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.max_position_embeddings) == (32000, 2048, 22, 32, 4, 64, 5632, 2048)


def test_gemma2_alternates_local_and_global_layers():
    c = load_preset("gemma-2-9b")
    assert c.layer_types[:4] == ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
    assert c.layer_types.count("full_attention") == 21 and c.sliding_window == 4096
    assert c.tie_word_embeddings and c.norms_per_layer == 4 and c.head_dim == 256


def test_gemma3_has_five_sliding_layers_per_full_attention_layer():
    c = load_preset("gemma-3-27b")          # 003: "Gemma 3 ... uses a 5:1 ratio"
    lt = c.layer_types
    assert lt[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert all(lt[6 * k:6 * k + 6].count("sliding_attention") == 5 for k in range(10))
    assert lt.count("full_attention") == 10 and c.sliding_window == 1024
    assert c.vocab_size == 262208            # filled from Gemma3TextConfig's defaults


def test_deepseek_v2_is_mla_with_latent_rank_512_and_rope_64():
    c = load_preset("deepseek-v2")
    assert c.attention == "mla" and c.kv_lora_rank == 512 and c.qk_rope_head_dim == 64
    assert (c.num_experts, c.num_experts_per_tok, c.num_shared_experts, c.first_k_dense_layers) == (160, 6, 2, 1)


def test_deepseek_v3_moe_keys():
    c = load_preset("deepseek-v3")
    assert (c.num_experts, c.num_experts_per_tok, c.num_shared_experts, c.first_k_dense_layers) == (256, 8, 1, 3)
    assert c.moe_intermediate_size == 2048 and c.q_lora_rank == 1536


def test_a_block_scaled_fp8_checkpoint_is_known_by_its_quantization_config():
    """DeepSeek-V3 and R1 publish FP8 weights scaled per 128 x 128 block (their config.json's quantization_config);
    a per-tensor FP8 config (no weight_block_size), another method's blocks, or no quantization_config say None."""
    assert load_preset("deepseek-r1").fp8_weight_block == (128, 128) == load_preset("deepseek-v3").fp8_weight_block
    assert load_preset("llama-3.1-70b").fp8_weight_block is None
    q = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    assert parse_hf_config({**BASE, "quantization_config": q}).fp8_weight_block is None
    assert parse_hf_config({**BASE, "quantization_config": {**q, "weight_block_size": [64, 32]}}).fp8_weight_block \
        == (64, 32)
    assert parse_hf_config({**BASE, "quantization_config": {"quant_method": "awq", "weight_block_size": [1, 2]}}) \
        .fp8_weight_block is None


def test_qwen3_next_full_attention_every_fourth_layer():
    c = load_preset("qwen3-next")
    assert c.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert c.layer_types.count("full_attention") == 12
    assert (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
            c.linear_value_head_dim) == (16, 32, 128, 128)
    assert c.attn_output_gate and c.shared_expert_intermediate_size == 512


def test_qwen3_next_explicit_layer_types_win_over_the_interval():
    doc = preset_document("qwen3-next")["config"]
    lt = ["full_attention" if i % 2 else "linear_attention" for i in range(48)]
    c = parse_hf_config({**doc, "layer_types": lt})
    assert c.layer_types == tuple(lt)


def test_mistral_windows_every_layer_and_mixtral_has_8_experts_top_2():
    m = load_preset("mistral-7b")
    assert m.sliding_window == 4096 and set(m.layer_types) == {"sliding_attention"}
    x = load_preset("mixtral-8x7b")
    assert (x.num_experts, x.num_experts_per_tok, x.moe_intermediate_size) == (8, 2, 14336)
    assert x.sliding_window is None and x.layer_types is None


def test_qwen25_ignores_its_unused_sliding_window_and_has_qkv_bias():
    c = load_preset("qwen2.5-7b")
    assert c.sliding_window is None and c.layer_types is None and c.qkv_bias


GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024,
        "layer_norm_epsilon": 1e-05, "vocab_size": 50257}
OPT_125M = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 768, "ffn_dim": 3072,
            "num_attention_heads": 12, "num_hidden_layers": 12, "max_position_embeddings": 2048,
            "vocab_size": 50272, "word_embed_proj_dim": 768, "do_layer_norm_before": True,
            "activation_function": "relu", "enable_bias": True, "torch_dtype": "float16"}


def test_gpt2_keys_mha_two_matrix_mlp_and_124M_params():
    c = parse_hf_config(GPT2)
    assert c.attention == "mha" and c.mlp == "gelu" and c.num_kv_heads == 12 and c.intermediate_size == 3072
    assert c.norm_type == "layernorm" and c.tie_word_embeddings and c.learned_position_embeddings == 1024
    assert param_breakdown(c).total == 124_439_808          # GPT-2 small


def test_opt_125m_parameter_count():
    c = parse_hf_config(OPT_125M)
    assert c.attention == "mha" and c.mlp == "gelu" and c.learned_position_embeddings == 2050
    assert param_breakdown(c).total == 125_239_296          # OPT-125m


def test_parse_any_config_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(preset_document("mistral-7b")["config"]))
    assert config_from_json_file(p).hidden_size == 4096


# --- malformed and unsupported configs ------------------------------------------------------------------------
BASE = preset_document("tinyllama")["config"]


@pytest.mark.parametrize("cfg, words", [
    ([1, 2, 3], "JSON object"),
    ("hidden_size", "JSON object"),
    ({"model_type": "t5", "d_model": 512, "num_heads": 8, "num_layers": 6, "vocab_size": 32128}, "encoder-decoder"),
    ({**BASE, "is_encoder_decoder": True}, "encoder-decoder"),
    ({**BASE, "model_type": "bert"}, "encoder-only"),
    ({**BASE, "num_attention_heads": 30}, "multiple"),
    ({**BASE, "num_key_value_heads": 3}, "multiple"),
    ({**BASE, "num_attention_heads": 3, "num_key_value_heads": 3}, "divisible"),
    ({**BASE, "hidden_size": 0}, "positive"),
    ({**BASE, "num_hidden_layers": -4}, "positive"),
    ({**BASE, "vocab_size": float("nan")}, "positive"),
    ({**BASE, "intermediate_size": 56.5}, "positive integer"),
    ({**BASE, "hidden_size": "2048"}, "positive integer"),
    ({**BASE, "num_hidden_layers": True}, "positive integer"),
    ({**BASE, "hidden_size": 10 ** 12}, "implausibly large"),
    ({**BASE, "rope_theta": -1.0}, "positive number"),
    ({k: v for k, v in BASE.items() if k != "vocab_size"}, "vocab_size"),
    ({**BASE, "layer_types": ["full_attention"] * 3}, "layer_types"),
    ({**BASE, "layer_types": ["banana"] * 22}, "unsupported"),
    ({**BASE, "num_local_experts": 8, "num_experts_per_tok": 9}, "exceeds"),
    ({**BASE, "sliding_window": 0}, "positive"),
    ({**BASE, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, "weight_block_size"),
    ({**BASE, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 0]}}, "two whole numbers"),
    ({**BASE, "quantization_config": {"quant_method": "fp8", "weight_block_size": "128x128"}}, "two whole numbers"),
])
def test_bad_configs_raise_spec_error_with_a_clear_message(cfg, words):
    with pytest.raises(SpecError, match=words):
        parse_hf_config(cfg)


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)


def test_non_json_file_is_a_spec_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        config_from_json_file(p)


# --- devices --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", REQUIRED_DEVICES)
def test_every_required_device_has_numbers_and_a_source(name):
    d = load_device(name)
    assert d.memory_bytes > 0 and d.memory_bandwidth_bytes_per_s > 0 and d.peak_flops
    assert d.source.startswith("https://")
    assert all(v > 0 for v in d.peak_flops.values())


def test_every_price_is_marked_as_an_assumption_with_a_source():
    for doc in device_documents():
        assert doc["price_is_assumption"] is True and doc["price_source"]
        assert doc["price_usd_per_hour"] is None or doc["price_usd_per_hour"] > 0


def test_dense_peaks_are_dense_not_sparse():
    assert load_device("H100 SXM").peak("bf16") == 989.4e12          # datasheet 1,979 is with sparsity
    assert load_device("A100").peak("bf16") == 312e12                 # 624 with sparsity
    for d in all_devices():
        for p, sparse in d.peak_flops_sparse.items():
            # 2:4 sparsity doubles the rate (L40S's sheet rounds: 362.05 dense, 733 sparse)
            assert sparse == pytest.approx(2 * d.peak_flops[p], rel=0.02), (d.name, p)


def test_fp4_runs_natively_where_the_datasheet_has_it_and_is_refused_elsewhere():
    for name in ("B200", "B300", "GB300", "MI355X", "RTX 5090"):
        peak, used = load_device(name).flops_for("fp4")
        assert used == "fp4" and peak > load_device(name).peak("fp8")
    with pytest.raises(SpecError, match="H100 SXM has no FP4 tensor cores.*choose FP8 or INT4"):
        load_device("H100 SXM").flops_for("fp4")


def test_reference_bandwidths():
    assert load_device("A100 SXM 40GB").memory_bandwidth_bytes_per_s == 1555e9
    assert load_device("H100 SXM").memory_bandwidth_bytes_per_s == 3350e9
    assert load_device("H100 PCIe").memory_bandwidth_bytes_per_s == 2039e9
    assert load_device("RTX 4090").memory_bandwidth_bytes_per_s == 1008e9
    assert load_device("m1-ultra").memory_bandwidth_bytes_per_s == 800e9   # Apple, M1 Ultra launch (March 2022)


def test_device_lookup_by_alias_and_unknown_device():
    assert load_device("a100").name == "A100 SXM 40GB" and load_device("rtx4090").name == "RTX 4090"
    with pytest.raises(SpecError, match="unknown device"):
        load_device("Voodoo 3")
    assert len(list_devices()) >= len(REQUIRED_DEVICES)


def test_missing_precision_falls_back_to_a_wider_format():
    a100 = load_device("a100")
    assert a100.flops_for("fp8") == (312e12, "bf16")                  # no FP8 tensor cores on Ampere
    with pytest.raises(SpecError, match="no peak"):
        load_device("TPU v5e").flops_for("fp32")


def test_a100_ridge_point_is_about_200_flop_per_byte():
    # 312e12 / 1555e9 = 200.64: one decimal
    assert load_device("a100").ridge_flop_per_byte("bf16") == pytest.approx(200.6, abs=0.1)


def test_custom_device_is_validated():
    d = custom_device("my card", memory_gb=24, bandwidth_gb_s=500, peak_tflops=100)
    assert d.peak("fp16") == 100e12 and d.memory_bandwidth_bytes_per_s == 500e9
    d2 = custom_device("x", 8, 100, {"fp32": 10, "bfloat16": 20}, price_usd_per_hour=0.5)
    assert d2.peak("bf16") == 20e12 and d2.price_usd_per_hour == 0.5
    for bad in [dict(memory_gb=0), dict(bandwidth_gb_s=-1), dict(peak_tflops=float("nan")),
                dict(peak_tflops={"fp99": 3}), dict(peak_tflops={}), dict(memory_gb=1e9), dict(name="")]:
        kw = dict(name="c", memory_gb=8, bandwidth_gb_s=100, peak_tflops=10, **{})
        kw.update(bad)
        with pytest.raises(SpecError):
            custom_device(**kw)


def test_measure_this_machine_returns_a_usable_device():
    d = measure_this_machine(seconds_budget=0.2)
    assert d.memory_bandwidth_bytes_per_s > 1e8 and d.peak("fp32") > 1e8 and d.memory_bytes > 1e8
    assert math.isfinite(d.ridge_flop_per_byte("fp32"))
    with pytest.raises(SpecError):
        measure_this_machine(seconds_budget=0)
