"""Batching theory (003 Details 13 and 21): the step-time model reproduces the reference batch table, and the two
critical batches agree with a brute-force search over the same step model."""
import math

import pytest

from calculators.serving.batching import (StepModel, batch_curve, batch_row, compute_critical_batch, kv_critical_batch,
                                  reference_batch_table, step_model_for)
from calculators.sizing.latency import decode_step_ms
from calculators.sizing.roofline import forward_flops
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")
A100 = load_device("A100 SXM 40GB")
# The text's model: 2.2 GB of weights, 22 KB per token position, 1,555 GB/s; FLOPs ≈ 2 × 1.1 B per token.
TEXT = StepModel(weight_bytes=2.2e9, kv_bytes_per_token=22e3, bandwidth_bytes_per_s=1555e9, flops_per_token=2.2e9,
                 attn_flops_per_pair=0.0, peak_flop_s=312e12)


def test_reference_batch_table_steps_1_42_1_45_1_55_1_96_ms():
    rows = batch_curve(TEXT, 300, (1, 8, 32, 128))
    # the step also writes the new token's K/V (b × 22 KB, +0.002 ms at b = 128): inside the text's 0.01 ms
    assert [round(r["step_ms"], 2) for r in rows] == [1.42, 1.45, 1.55, 1.96]
    assert [round(r["kv_read_bytes"] / 1e6) for r in rows] == [7, 53, 211, 845]
    assert all(r["bound"] == "memory" for r in rows)


def test_reference_batch_table_throughput_704_5517_20645_65306_and_per_stream_704_690_645_510():
    rows = batch_curve(TEXT, 300, (1, 8, 32, 128))
    # the text divides the batch by the step rounded to 0.01 ms
    assert [round(r["batch"] / round(r["step_ms"], 2) * 1e3) for r in rows] == [704, 5517, 20645, 65306]
    assert [round(1e3 / round(r["itl_ms"], 2)) for r in rows] == [704, 690, 645, 510]
    # unrounded: within 0.4% (the rounding of 1.955.. to 1.96 is the largest, 0.25%)
    assert [r["total_tok_s"] for r in rows] == pytest.approx([704, 5517, 20645, 65306], rel=0.004)


def test_the_pages_reference_table_is_the_texts():
    rows = reference_batch_table()
    assert [round(r["step_ms"], 2) for r in rows] == [1.42, 1.45, 1.55, 1.96]
    assert [round(r["batch"] / round(r["step_ms"], 2) * 1e3) for r in rows] == [704, 5517, 20645, 65306]


def test_kv_critical_batch_is_where_kv_read_first_reaches_the_weight_read():
    b_kv = kv_critical_batch(TEXT, 300)
    assert b_kv == pytest.approx(2.2e9 / 6.6e6)                    # ≈ 333: "push to 256 and it approaches"
    brute = next(b for b in range(1, 10_000) if batch_row(TEXT, b, 300)["kv_read_bytes"] >= TEXT.weight_bytes)
    assert brute == math.ceil(b_kv)


@pytest.mark.parametrize("context", [1, 100, 300])
def test_compute_critical_batch_matches_a_brute_force_search(context):
    m = step_model_for(TINY, A100, "fp16")
    b_c = compute_critical_batch(m, context)
    brute = next(b for b in range(1, 100_000) if batch_row(m, b, context)["bound"] == "compute")
    assert brute == math.floor(b_c) + 1                              # first whole batch past the crossing


def test_no_compute_critical_batch_when_a_sequence_moves_more_time_in_bytes_than_in_flops():
    m = step_model_for(TINY, A100, "fp16")          # at 2,000 tokens one sequence's KV read outlasts its FLOPs
    assert compute_critical_batch(m, 2000) == math.inf
    assert all(batch_row(m, b, 2000)["bound"] == "memory" for b in (1, 1000, 100_000))
    slow_compute_free = StepModel(2.2e9, 22e3, 1555e9, 1.0, 0.0, 312e12)
    assert compute_critical_batch(slow_compute_free, 300) == math.inf
    assert kv_critical_batch(TEXT, 0) == math.inf


def test_step_model_of_tinyllama_matches_the_latency_calculator_and_the_roofline_flops():
    m = step_model_for(TINY, A100, "fp16")
    assert m.weight_bytes / 1e9 == pytest.approx(2.2, abs=0.005)
    for S in (1, 300, 2047):                                           # f_lin + f_attn·S = the roofline's FLOPs
        assert m.flops_per_token + m.attn_flops_per_pair * S == pytest.approx(forward_flops(TINY, 1, S, 1))
    for b, S in ((1, 300), (8, 300), (128, 1000)):
        ref = decode_step_ms(TINY, A100, S, b, "fp16")                 # (weights + KV read + written) / BW
        row = batch_row(m, b, S)
        assert row["memory_ms"] == pytest.approx(ref["memory_ms"], rel=1e-12)
        assert row["compute_ms"] == pytest.approx(ref["compute_ms"], rel=1e-12)


def test_throughput_rises_and_each_stream_slows_with_batch():
    rows = batch_curve(step_model_for(TINY, A100, "fp16"), 300, (1, 2, 4, 8, 64, 256, 1024))
    tps = [r["total_tok_s"] for r in rows]
    itl = [r["itl_ms"] for r in rows]
    assert tps == sorted(tps) and itl == sorted(itl)


@pytest.mark.parametrize("bad", [dict(batch=0), dict(batch=-3), dict(batch=2.5), dict(context_tokens=-1)])
def test_bad_batch_or_context_is_a_clear_error(bad):
    args = dict(batch=8, context_tokens=300) | bad
    with pytest.raises(SpecError, match="batch|context"):
        batch_row(TEXT, args["batch"], args["context_tokens"])


def test_step_model_rejects_zero_bandwidth():
    with pytest.raises(SpecError, match="bandwidth"):
        StepModel(2.2e9, 22e3, 0.0, 2.2e9, 0.0, 312e12)
    with pytest.raises(SpecError, match="at least one"):
        batch_curve(TEXT, 300, [])
