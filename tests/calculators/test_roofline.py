"""Roofline and the theory-vs-experiment convention (003 Details 11-13; references 000, 004)."""
import pytest

from calculators.sizing.latency import compute_utilization, decode_step_bytes, step_weight_bytes
from calculators.sizing.params import total_params
from calculators.sizing.roofline import (arithmetic_intensity, experts_touched, forward_flops, kv_bytes_step,
                                  layer_ops, roofline, roofline_curve, step_ops, weight_bytes_read)
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import list_presets, load_preset

TINY = load_preset("tinyllama")
A100 = load_device("A100 SXM 40GB")


def llama_flops(c, T, S, B=1):
    """The convention written out: projections over T rows, QKᵀ and P·V over T × S, LM head for one row."""
    D, q, kv, F = c.hidden_size, c.q_dim, c.kv_dim, c.intermediate_size
    per_layer = 2 * T * D * (q + 2 * kv) + 2 * T * q * D + 2 * T * 3 * D * F + 2 * 2 * T * S * c.head_dim * c.num_heads
    return B * (c.num_layers * per_layer + 2 * D * c.vocab_size)


def llama_weight_bytes(c, T, bpp, B=1):
    D, q, kv, F, V = c.hidden_size, c.q_dim, c.kv_dim, c.intermediate_size, c.vocab_size
    per_layer = D * q + 2 * D * kv + q * D + 3 * D * F + 2 * D            # incl. the two norm vectors
    return (c.num_layers * per_layer + D + V * D + B * T * D) * bpp


@pytest.mark.parametrize("name", ["tinyllama", "smollm2", "llama-3-8b"])
@pytest.mark.parametrize("T, S, B", [(1, 1, 1), (1, 300, 1), (7, 7, 1), (128, 640, 1), (1, 2048, 8), (16, 48, 3)])
def test_convention_functions_match_the_written_out_formulas(name, T, S, B):
    c = load_preset(name)
    assert forward_flops(c, T, S, B) == llama_flops(c, T, S, B)
    assert weight_bytes_read(c, T, 2, B) == llama_weight_bytes(c, T, 2, B)     # tied or not, same rule
    kv = kv_bytes_step(c, T, S, 2, B)
    assert kv["written"] == B * c.num_layers * T * 2 * c.kv_dim * 2
    assert kv["read"] == B * c.num_layers * S * 2 * c.kv_dim * 2


def test_bytes_per_param_may_be_a_dtype_name():
    assert weight_bytes_read(TINY, 1, "fp32") == weight_bytes_read(TINY, 1, 4)


def test_context_must_include_the_new_tokens():
    with pytest.raises(SpecError, match="context"):
        forward_flops(TINY, 10, 5)
    for bad in (0, -1, 1.5, float("nan")):
        with pytest.raises(SpecError):
            forward_flops(TINY, bad, 10)


@pytest.mark.parametrize("name", list_presets())
def test_op_table_runs_every_layer_once(name):
    # (forward_flops and the byte totals are sums over this table: they are checked against the written-out
    # formulas above and against the engine's counters in test_theory_vs_experiment, not against this table)
    c = load_preset(name)
    ops = step_ops(c, 64, 4096, 2)
    assert sum(o.count for o in ops if o.name == "attn_norm") == c.num_layers
    assert [o.name for o in ops if o.count == 1][-2:] == ["final_norm", "lm_head"] or c.num_layers == 1


def test_decode_step_reads_about_2_2_GB():
    # 2.207 GB (weights 2.200 + KV 6.8 MB): the text's "2.2 GB" to its last digit
    assert decode_step_bytes(TINY, 300, 1, "fp16")["total"] / 1e9 == pytest.approx(2.2, abs=0.01)


def test_decode_step_is_about_2_2_GFLOP():
    # the text's rule is 2 FLOPs x 1.1B parameters; counting matmuls only (the embedding does no multiply)
    # gives 2.12 GFLOP at 300 tokens of context, within the text's "≈"
    # 2 × 1.100 B = 2.200 GFLOP: the text's last digit
    assert 2 * total_params(TINY) / 1e9 == pytest.approx(2.2, abs=0.01)
    # 2.12 GFLOP (no FLOPs for the embedding table) vs the text's 2 × params: 3.5% apart
    assert forward_flops(TINY, 1, 300) / 1e9 == pytest.approx(2.2, rel=0.05)


def test_decode_is_about_1_flop_per_byte_and_0_5_percent_of_an_a100():
    flops, by = forward_flops(TINY, 1, 300), decode_step_bytes(TINY, 300, 1, "fp16")["total"]
    # 2.12 GFLOP / 2.21 GB = 0.96 FLOP/byte; the text: "about 1"
    assert arithmetic_intensity(flops, by) == pytest.approx(1.0, abs=0.1)
    assert round(100 * compute_utilization(flops, by, A100, "fp16"), 1) == 0.5


def test_prefill_of_1000_tokens_is_about_2_2_TFLOP_at_500_to_1000_flop_per_byte():
    # the text multiplies 1,000 tokens by 2.2 GFLOP; with logits for the last position only and no FLOPs for
    # the embedding gather the convention gives 2.12 TFLOP
    flops = forward_flops(TINY, 1000, 1000)
    # 2.118 TFLOP vs the text's 1,000 × 2.2 GFLOP: 3.7% apart (see the comment above)
    assert flops / 1e12 == pytest.approx(2.2, rel=0.05)
    assert 500 <= arithmetic_intensity(flops, step_weight_bytes(TINY, "fp16")) <= 1000


def test_batch_32_decode_is_about_70_GFLOP_and_32_flop_per_byte():
    flops = forward_flops(TINY, 1, 300, batch=32)
    # 32 × 2.12 = 67.9 GFLOP; the text: 32 × 2.2 = "about 70" (3% apart)
    assert flops / 1e9 == pytest.approx(70, rel=0.05)
    assert arithmetic_intensity(flops, step_weight_bytes(TINY, "fp16")) == pytest.approx(32, rel=0.05)


def test_ridge_points_are_100_to_300_flop_per_byte():
    assert 100 <= A100.ridge_flop_per_byte("fp16") <= 300      # ~200 for the A100
    assert 100 <= load_device("H100 SXM").ridge_flop_per_byte("bf16") <= 300


def test_decode_is_memory_bound_and_long_prefill_compute_bound():
    dec = roofline(TINY, A100, 1, 300)
    pre = roofline(TINY, A100, 2048, 2048)
    assert dec["totals"]["bound"] == "memory" and pre["totals"]["bound"] == "compute"
    assert dec["phase"] == "decode" and pre["phase"] == "prefill"
    assert all(r["bound"] == "memory" for r in dec["step_rows"] if r["kind"] == "matmul")
    # one float division: default rel 1e-6
    assert dec["ridge_flop_per_byte"] == pytest.approx(312e12 / 1555e9)
    assert dec["chart"] and all(p["attainable_flop_s"] <= 312e12 for p in dec["chart"])


def test_llama3_70b_layer_ops_use_reference_000_shapes():
    c = load_preset("llama-3-70b")
    ops = {o.name: o for o in layer_ops(c, new_tokens=1, context_tokens=1000)}
    assert ops["q_proj"].shape.startswith("[1, 8192] @ [8192, 8192]")          # w_q [D, h_q, d_k]
    assert ops["k_proj"].shape.startswith("[1, 8192] @ [8192, 1024]")          # w_k [D, h_kv, d_k]
    assert ops["attn_scores"].shape.startswith("[1, 64, 1, 128] . [1, 8, 1000, 128]")  # [B,h_q,1,d_k]·[B,h_kv,s,d_k]
    assert ops["gate_proj"].shape.startswith("[1, 8192] @ [8192, 28672]")
    assert ops["down_proj"].shape.startswith("[1, 28672] @ [28672, 8192]")


def test_lm_head_covers_the_last_position_only():
    ops = {o.name: o for o in step_ops(TINY, 512, 512)}
    assert ops["lm_head"].flops == 2 * 2048 * 32000                            # 004: GEMV on one row


def test_moe_decode_reads_only_the_experts_it_touches():
    # E·(1 - (1 - k/E)^n) in floats: default rel 1e-6
    assert experts_touched(8, 2, 1) == pytest.approx(2)
    assert experts_touched(256, 8, 10_000) == pytest.approx(256)
    mix = load_preset("mixtral")
    assert weight_bytes_read(mix, 1, 2) < weight_bytes_read(mix, 512, 2)


def test_sliding_window_caps_attention_work():
    m = load_preset("mistral-7b")
    assert kv_bytes_step(m, 1, 100_000, 2)["read"] == kv_bytes_step(m, 1, 4096, 2)["read"]
    assert forward_flops(m, 1, 100_000) == forward_flops(m, 1, 4096)


def test_linear_attention_layers_read_a_fixed_state():
    q = load_preset("qwen3-next")
    a, b = kv_bytes_step(q, 1, 1000, 2), kv_bytes_step(q, 1, 2000, 2)
    assert b["read"] - a["read"] == 12 * 1000 * 2 * 512 * 2                     # only full-attention layers grow


def test_roofline_curve_has_a_flat_roof():
    pts = roofline_curve(A100, "fp16")
    assert pts[0]["attainable_flop_s"] < pts[-1]["attainable_flop_s"] == 312e12
