"""Quantization (003 Detail 18): the scale walk-through, sizes and floors per precision, NumPy round trips."""
import numpy as np
import pytest

from calculators.sizing.quantization import (dequantize, kv_bytes_ratio, precision_table, q_range, quantization_error,
                                      quantize, quantize_value)
from specs.model_config import SpecError
from specs.presets import load_preset


def test_scale_is_max_over_127_and_0_0217_becomes_3_then_0_0236():
    r = quantize_value(0.0217, max_abs=1.0, bits=8)
    # one float division: default rel 1e-6
    assert r["scale"] == pytest.approx(1 / 127) and round(r["scale"], 5) == 0.00787
    assert round(r["ratio"], 2) == 2.76 and r["q"] == 3
    assert round(r["dequantized"], 4) == 0.0236 and round(r["error"], 4) == 0.0019


def test_0_0118_sits_between_two_int8_grid_points():
    s = 1 / 127
    assert round(s, 5) == 0.00787 and round(2 * s, 5) == 0.01575
    assert quantize_value(0.0118, 1.0)["q"] in (1, 2)


def test_int4_range_is_minus_8_to_7_and_int8_minus_128_to_127():
    assert q_range(4) == (-8, 7) and q_range(8) == (-128, 127)


def test_tinyllama_fp16_int8_int4_are_2_2_1_1_0_55_GB_and_1_41_0_71_0_35_ms_on_a100():
    rows = precision_table(1.1e9, 1555e9, ("fp16", "int8", "int4"))
    assert [round(r["weight_bytes"] / 1e9, 2) for r in rows] == [2.2, 1.1, 0.55]
    assert [round(r["bandwidth_floor_ms"], 2) for r in rows] == [1.41, 0.71, 0.35]
    model_rows = precision_table(load_preset("tinyllama"), 1555e9)
    assert [round(r["bandwidth_floor_ms"], 2) for r in model_rows] == [1.41, 0.71, 0.35]


def test_group_scales_make_int4_files_slightly_larger():
    plain, grouped = precision_table(70e9, 1555e9, ("int4",))[0], precision_table(70e9, 1555e9, ("int4",), 128)[0]
    assert grouped["weight_bytes"] > plain["weight_bytes"] and grouped["bits_per_weight"] == 4.125


RNG = np.random.default_rng(0)
W = RNG.standard_normal((64, 256)).astype(np.float32) * 0.02


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel", "per_group"])
def test_round_trip_error_is_at_most_half_a_step(bits, granularity):
    qt = quantize(W, bits, granularity, group_size=64)
    lo, hi = q_range(bits)
    assert qt.q.dtype == np.int8 and qt.q.min() >= lo and qt.q.max() <= hi and qt.q.shape == W.shape
    w_hat = dequantize(qt)
    assert w_hat.shape == W.shape and w_hat.dtype == np.float32
    step = np.broadcast_to(qt.scale, (64, 4, 1) if granularity == "per_group" else W.shape)
    err = np.abs(w_hat - W).reshape(step.shape[:-1] + (-1,)) if granularity == "per_group" else np.abs(w_hat - W)
    assert np.all(err <= step / 2 + 1e-7)


def test_finer_granularity_is_more_accurate_with_an_outlier():
    w = W.copy()
    w[0, 0] = 10.0                                   # one outlier stretches a per-tensor scale
    e = {g: quantization_error(w, dequantize(quantize(w, 4, g, group_size=64)))["rmse"]
         for g in ("per_tensor", "per_channel", "per_group")}
    assert e["per_group"] < e["per_channel"] < e["per_tensor"]


def test_int8_is_more_accurate_than_int4():
    e8 = quantization_error(W, dequantize(quantize(W, 8)))["relative_rmse"]
    e4 = quantization_error(W, dequantize(quantize(W, 4)))["relative_rmse"]
    assert e8 < e4 < 1


def test_number_of_scales_and_storage():
    assert quantize(W, 8, "per_tensor").num_scales == 1
    assert quantize(W, 8, "per_channel").num_scales == 64
    qt = quantize(W, 4, "per_group", group_size=128)
    assert qt.num_scales == 64 * 2 and qt.storage_bytes(2) == W.size / 2 + 128 * 2


def test_all_zero_tensor_round_trips():
    z = np.zeros((4, 8))
    assert np.all(dequantize(quantize(z, 4, "per_channel")) == 0)


def test_kv_quantization_halves_or_quarters_the_cache():
    assert kv_bytes_ratio("fp8") == kv_bytes_ratio("int8") == 0.5 and kv_bytes_ratio("int4") == 0.25


@pytest.mark.parametrize("kw", [dict(bits=5), dict(granularity="per_row"),
                                dict(granularity="per_group", group_size=100)])
def test_bad_quantization_options(kw):
    with pytest.raises(SpecError):
        quantize(W, **kw)


def test_nan_and_empty_arrays_are_refused():
    with pytest.raises(SpecError):
        quantize(np.array([1.0, np.nan]))
    with pytest.raises(SpecError):
        quantize(np.array([]))
