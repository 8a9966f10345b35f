"""The formula behind every number: each explained value equals the calculator function that owns it."""
import pytest

from calculators import explain as ex
from calculators.flash_attention import unfused_attention_hbm_bytes
from calculators.kv_cache import kv_bytes_per_token, kv_cache_bytes
from calculators.latency import decode_step_ms, IDEAL, total_latency_ms, cost_per_million_tokens
from calculators.memory import prefill_scratch_bytes
from calculators.parallel import pipeline_bubble_fraction, tp_bandwidth_floor_ms
from calculators.params import param_breakdown, weight_bytes
from calculators.quantization import quantize_value
from calculators.queueing import queue_wait_factor
from calculators.roofline import forward_flops
from calculators.speculative import expected_tokens_per_pass
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import list_presets, load_preset

A100 = load_device("a100")


def test_explained_carries_value_unit_formula_and_source():
    e = ex.explain_kv_bytes_per_token(load_preset("tinyllama"), "fp16")
    d = e.to_dict()
    assert set(d) >= {"value", "unit", "formula", "symbolic", "source"}
    assert d["symbolic"] == "2 × L × h_kv × d_k × b"
    assert d["formula"].startswith("2 × 22 × 4 × 64 × 2 = 22,528 bytes")
    assert d["value"] == 22528 and d["unit"] == "bytes" and "003" in d["source"]


@pytest.mark.parametrize("name", list_presets())
def test_model_formulas_equal_the_calculators(name):
    c = load_preset(name)
    b = param_breakdown(c)
    parts = {e.name: e.value for e in ex.explain_params(c)}
    assert parts["total_params"] == b.total
    assert parts.get("active_params", b.active) == b.active
    assert parts["embedding_params"] == b.embedding and parts["attention_params"] == b.attention
    assert parts["lm_head_params"] == b.lm_head and parts["norm_params"] == b.norms
    assert parts.get("ffn_params", 0) == b.ffn_dense
    assert ex.explain_weight_bytes(c, "bf16").value == weight_bytes(c, "bf16")
    assert ex.explain_weight_bytes(c, "int4", 128).value == pytest.approx(weight_bytes(c, "int4", 128))
    assert ex.explain_kv_bytes_per_token(c, "fp8").value == kv_bytes_per_token(c, "fp8")
    for t in (100, 5000):
        assert ex.explain_kv_cache_bytes(c, t, 3, "bf16").value == pytest.approx(kv_cache_bytes(c, t, 3, "bf16"))
    for T, S in ((1, 300), (64, 5000)):
        assert ex.explain_forward_flops(c, T, S, 2).value == pytest.approx(forward_flops(c, T, S, 2), rel=1e-12)
    assert ex.explain_decode_floor(c, A100, 300, 4).value == pytest.approx(
        decode_step_ms(c, A100, 300, 4, efficiency=IDEAL)["memory_ms"])


@pytest.mark.parametrize("name", ["tinyllama", "deepseek-v3", "qwen3-next", "gemma-2-9b"])
def test_prefill_and_itl_formulas_equal_the_latency_model(name):
    from calculators.latency import Efficiency, prefill_ms
    c, eff = load_preset(name), Efficiency()
    for T in (1, 100, 4000):
        assert ex.explain_prefill(c, A100, T, 2, "bf16", None, eff).value == pytest.approx(
            prefill_ms(c, A100, T, 2, "bf16", None, eff)["prefill_ms"])
        assert ex.explain_itl(c, A100, T, 2, "int4", None, eff).value == pytest.approx(
            decode_step_ms(c, A100, T, 2, "int4", None, eff)["step_ms"])


def test_scalar_formulas_equal_the_calculators():
    assert ex.explain_total_latency(5, 1.4, 200).value == total_latency_ms(5, 1.4, 200)
    assert ex.explain_prefill_scratch(4096, 4096, 4096, 1024, 14336).value == \
        prefill_scratch_bytes(4096, 4096, 4096, 1024, 14336)
    assert ex.explain_unfused_attention(2048, 64).value == unfused_attention_hbm_bytes(2048, 64)
    assert ex.explain_speculative(0.8).value == expected_tokens_per_pass(0.8, 4)
    assert ex.explain_speculative(1.0).value == expected_tokens_per_pass(1.0, 4)
    assert ex.explain_queue_wait(0.9).value == pytest.approx(queue_wait_factor(0.9))
    assert ex.explain_pipeline_bubble(4, 16).value == pytest.approx(100 * pipeline_bubble_fraction(4, 16))
    assert ex.explain_tp_floor(35e9, 1555e9, 4).value == pytest.approx(tp_bandwidth_floor_ms(35e9, 1555e9, 4))
    assert ex.explain_cost_per_million(2.0, 500).value == pytest.approx(cost_per_million_tokens(2.0, 500))
    assert ex.explain_ridge_point(A100).value == A100.ridge_flop_per_byte()
    assert ex.explain_bandwidth_floor(2.2e9, 1555e9).formula.endswith("= 1.415 ms")


def test_quantization_walkthrough_formulas():
    steps = {e.name: e for e in ex.explain_quantize_value(0.0217, 1.0, 8)}
    r = quantize_value(0.0217, 1.0, 8)
    assert steps["q"].value == r["q"] == 3
    assert steps["dequantized"].value == pytest.approx(r["dequantized"])
    assert steps["error"].value == pytest.approx(r["error"])
    assert "round(0.0217 ÷ 0.007874)" in steps["q"].formula


def test_paging_and_prefix_formulas():
    blocks, empty = ex.explain_paging(50, 16)
    assert blocks.value == 4 and empty.value == 14
    assert round(ex.explain_prefix_saving(508, 500).value) == 98


def test_formulas_refuse_unknown_names_and_statements():
    with pytest.raises(SpecError):
        ex.explain("x", "a * b", "", "", a=1)
    with pytest.raises(SpecError):
        ex.explain("x", "__import__('os')", "", "")
