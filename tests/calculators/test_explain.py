"""The formula behind every number. Each explainer evaluates its own formula text; where that text is a second
formula for a calculator's number (kv bytes, FFN, norms, ...), the two must agree. Where the explainer takes its
number from the calculator (totals, prefill, ITL), comparing them would compare a function with itself: those are
checked against TinyLlama numbers worked by hand here (reference 003 Details 2a, 6, 8, 12)."""
import pytest

from calculators import explain as ex
from calculators.sizing.flash_attention import unfused_attention_hbm_bytes
from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes
from calculators.sizing.latency import IDEAL, total_latency_ms, cost_per_million_tokens
from calculators.sizing.memory import prefill_scratch_bytes
from calculators.multi_gpu.parallel import pipeline_bubble_fraction, tp_bandwidth_floor_ms
from calculators.sizing.params import param_breakdown
from calculators.sizing.quantization import quantize_value
from calculators.serving.queueing import queue_wait_factor
from calculators.sizing.roofline import forward_flops
from calculators.serving.speculative import expected_tokens_per_pass
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
def test_second_formulas_agree_with_the_calculators(name):
    """Explainer formula text vs the calculator's own code path: two formulas for one number. Integers: ==
    (pytest.approx only where a value is a float product such as 4.5-bit weights or a window min)."""
    c = load_preset(name)
    b = param_breakdown(c)
    parts = {e.name: e.value for e in ex.explain_params(c)}
    assert parts["embedding_params"] == b.embedding
    assert parts["lm_head_params"] == b.lm_head and parts["norm_params"] == b.norms
    assert parts.get("ffn_params", 0) == b.ffn_dense
    assert ex.explain_kv_bytes_per_token(c, "fp8").value == kv_bytes_per_token(c, "fp8")
    for t in (100, 5000):
        assert ex.explain_kv_cache_bytes(c, t, 3, "bf16").value == pytest.approx(kv_cache_bytes(c, t, 3, "bf16"),
                                                                                 rel=1e-12)   # float state sizes
    for T, S in ((1, 300), (64, 5000)):
        e = ex.explain_forward_flops(c, T, S, 2)
        if e.symbolic != "projections + attention + lm_head":       # written-out formula (else: the op table)
            assert e.value == forward_flops(c, T, S, 2)


TINY = load_preset("tinyllama")
TINY_PARAMS = 1_100_048_384          # TinyLlama-1.1B's published parameter count
# per layer: W_q, W_o 2048²; W_k, W_v 2048 × 256; FFN 3 × 2048 × 5632; 2 norms × 2048
assert TINY_PARAMS == 32000 * 2048 * 2 + 22 * (2 * 2048 ** 2 + 2 * 2048 * 256 + 3 * 2048 * 5632 + 2 * 2048) + 2048


def test_tinyllama_totals_worked_by_hand():
    parts = {e.name: e.value for e in ex.explain_params(TINY)}
    assert parts["total_params"] == TINY_PARAMS
    assert parts["attention_params"] == 22 * (2 * 2048 * 2048 + 2 * 2048 * 256) == 207_618_048
    assert ex.explain_weight_bytes(TINY, "bf16").value == 2 * TINY_PARAMS
    # 4-bit weights + one fp16 scale per 128: 0.5 + 2/128 bytes each (float product: approx at 1e-12)
    assert ex.explain_weight_bytes(TINY, "int4", 128).value == pytest.approx(TINY_PARAMS * (0.5 + 2 / 128), rel=1e-12)
    mix = {e.name: e.value for e in ex.explain_params(load_preset("mixtral"))}
    assert mix["total_params"] - mix["active_params"] == 32 * 6 * 3 * 4096 * 14336   # 6 of 8 experts idle


def test_tinyllama_flops_decode_floor_itl_and_prefill_worked_by_hand():
    # per layer at T new tokens, S context: 2·T·D·(q+2kv) + 2·T·q·D + 2·T·3·D·F + 4·T·S·d·h ; + 2·D·V once
    def flops(T, S):
        return 22 * (2 * T * 2048 * 2560 + 2 * T * 2048 * 2048 + 2 * T * 3 * 2048 * 5632 + 4 * T * S * 64 * 32) \
            + 2 * 2048 * 32000
    assert ex.explain_forward_flops(TINY, 1, 300, 2).value == 2 * flops(1, 300) == 4_245_815_296
    bw = 1555e9                                    # A100 40GB datasheet
    kv_token = 22 * 2 * 256 * 2                    # bytes of K and V per token, all layers, 16-bit
    # decode floor, batch 4 at 300 tokens: all weights once + 4 caches read + 4 new tokens written (rel 1e-12:
    # the same float division done in another order)
    floor_ms = (2 * TINY_PARAMS + 4 * 300 * kv_token + 4 * kv_token) / bw * 1e3
    assert ex.explain_decode_floor(TINY, A100, 300, 4).value == pytest.approx(floor_ms, rel=1e-12)
    assert floor_ms == pytest.approx(1.4323, abs=1e-4)
    itl_ms = (2 * TINY_PARAMS + 300 * kv_token + kv_token) / bw * 1e3           # 003 Detail 12: "≈ 1.4 ms"
    assert ex.explain_itl(TINY, A100, 300, 1, "fp16", None, IDEAL).value == pytest.approx(itl_ms, rel=1e-12)
    prefill_ms = flops(1000, 1000) / 312e12 * 1e3                                # compute-bound at 312 TFLOP/s
    assert ex.explain_prefill(TINY, A100, 1000, 1, "bf16", None, IDEAL).value == pytest.approx(prefill_ms, rel=1e-12)
    assert prefill_ms == pytest.approx(6.789, abs=1e-3)


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
