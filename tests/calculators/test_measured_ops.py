"""Ops priced from a device profile (`calculators.sizing.measured_ops`): measured efficiencies interpolated in log
space, the datasheet roofline beside them, extrapolation marked. The tables here are made by the tests from a known
efficiency law, so every expected value is computed from that law, not by the code under test."""
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from calculators.sizing.measured_ops import (decode_attention_ms, gemm_ms, gemm_roofline_ms, interpolate,
                                             _build_lines)
from specs.devices import load_device

H100, H200 = load_device("h100"), load_device("h200")


def law(m, n):
    """A made-up efficiency: rises with log m, a little higher for the wider matrix."""
    return np.clip(0.02 * np.log2(m) + 0.3 + 0.1 * (n > 5000), 0.05, 0.95)


def profile_from_law(device_name="H100", dtypes=("bf16",)):
    dev = load_device(device_name)
    rows = dict(dtype=[], m=[], n=[], k=[], ms=[])
    for dt in dtypes:
        for m in 2 ** np.arange(0, 15):
            for n, k in ((4096, 4096), (8192, 4096)):
                rows["dtype"].append(dt)
                rows["m"].append(m)
                rows["n"].append(n)
                rows["k"].append(k)
                rows["ms"].append(float(gemm_roofline_ms(dev, m, n, k, dt) / law(m, n)))
    tables = {"gemm": {c: np.asarray(v) for c, v in rows.items()}}
    return SimpleNamespace(name=f"law-{device_name}", device=dev.name, tables=tables)


def test_a_measured_shape_comes_back_exactly():
    p = profile_from_law()
    for m in (1, 64, 4096):
        got = gemm_ms(p, H100, m, 4096, 4096)
        want = float(gemm_roofline_ms(H100, m, 4096, 4096, "bf16") / law(m, 4096))
        assert got.ms == pytest.approx(want, rel=1e-9)
        assert got.efficiency == pytest.approx(float(law(m, 4096)), rel=1e-9) and not got.extrapolated


def test_between_two_measured_sizes_the_efficiency_is_the_geometric_mean():
    """Linear in log m and log efficiency: at m = √(64 · 128) the efficiency is √(e64 · e128)."""
    p = profile_from_law()
    m = math.sqrt(64 * 128)
    got = gemm_ms(p, H100, m, 4096, 4096)
    assert got.efficiency == pytest.approx(math.sqrt(law(64, 4096) * law(128, 4096)), rel=1e-9)


def test_between_two_measured_widths_the_log_efficiency_is_weighted_by_log_width():
    p = profile_from_law()
    n = 4096 * 2 ** 0.25                              # a quarter of the way from 4,096 to 8,192 in log
    got = gemm_ms(p, H100, 256, n, 4096)
    want = math.exp(0.75 * math.log(law(256, 4096)) + 0.25 * math.log(law(256, 8192)))
    assert got.efficiency == pytest.approx(want, rel=1e-9) and not got.extrapolated


def test_past_the_table_the_edge_efficiency_prices_the_roofline_and_says_so():
    p = profile_from_law()
    big = gemm_ms(p, H100, 65536, 4096, 4096)          # the table stops at m = 16,384
    assert big.extrapolated and big.efficiency == pytest.approx(float(law(16384, 4096)), rel=1e-9)
    wide = gemm_ms(p, H100, 64, 16384, 4096)           # n past the widest measured
    assert wide.extrapolated and wide.efficiency == pytest.approx(float(law(64, 8192)), rel=1e-9)


def test_another_device_is_priced_at_its_own_roofline_with_the_profiles_efficiency():
    """At a compute-bound size, where the law's latency rises with m (so the borrowed reading's envelope, tested
    below, leaves it as measured)."""
    p = profile_from_law("H100")
    got = gemm_ms(p, H200, 2048, 4096, 4096)
    assert got.ms == pytest.approx(float(gemm_roofline_ms(H200, 2048, 4096, 4096, "bf16") / law(2048, 4096)),
                                   rel=1e-9)
    assert got.ms < gemm_ms(p, H100, 2048, 4096, 4096).ms * 1.0001   # same FP16 peak, same efficiency
    small = gemm_ms(p, H200, 1, 4096, 4096)                          # memory-bound: more bandwidth, faster
    assert small.ms < gemm_ms(p, H100, 1, 4096, 4096).ms


def test_a_format_not_measured_is_priced_by_the_next_wider_one_and_marked():
    p = profile_from_law(dtypes=("bf16", "fp8"))
    fp4 = gemm_ms(p, load_device("b200"), 4096, 4096, 4096, "fp4")
    assert "fp4 priced as fp8" in fp4.note and fp4.extrapolated
    assert not gemm_ms(p, H100, 4096, 4096, 4096, "fp8").note


def test_arrays_of_m_match_one_at_a_time():
    p = profile_from_law()
    ms = np.array([1.0, 3.0, 100.0, 5000.0, 40000.0])
    ideal, t, past = gemm_ms(p, H100, ms, 8192, 4096)
    for i, m in enumerate(ms):
        one = gemm_ms(p, H100, float(m), 8192, 4096)
        assert t[i] == pytest.approx(one.ms) and ideal[i] == pytest.approx(one.ideal_ms) and past[i] == one.extrapolated


def test_scattered_tables_use_the_measured_corners_only():
    """Corners of the cell that were not measured drop out and the weights renormalise: with only (n=1, k=1)
    and (n=4, k=4) measured, a query at (2, 2) averages the two lines' log efficiencies equally."""
    lines = _build_lines(np.array([1.0, 2.0, 1.0, 2.0]),
                         dict(n=np.array([1.0, 1.0, 4.0, 4.0]), k=np.array([1.0, 1.0, 4.0, 4.0])),
                         np.log(np.array([0.2, 0.4, 0.8, 0.8])))
    le, past = interpolate(lines, np.array([1.0]), dict(n=2.0, k=2.0))
    assert math.exp(le[0]) == pytest.approx(math.sqrt(0.2 * 0.8)) and not past[0]


def test_decode_attention_streams_the_kv_at_the_measured_fraction_of_the_datasheet():
    """A decode-attention table measured at 85% of H200's bandwidth prices a new context at that fraction."""
    dev = H200
    rows = dict(batch=[], context=[], heads=[], kv_heads=[], head_dim=[], kv_dtype=[], window=[], ms=[])
    for b in (1, 8, 64):
        for ctx in (1024, 4096, 16384):
            kv_bytes = b * ctx * 2 * 8 * 128 * 2
            for k, v in dict(batch=b, context=ctx, heads=32, kv_heads=8, head_dim=128, kv_dtype="bf16", window=0,
                             ms=kv_bytes / (0.85 * dev.memory_bandwidth_bytes_per_s) * 1e3).items():
                rows[k].append(v)
    p = SimpleNamespace(name="attn", device="H200", tables={"generation_attention": {c: np.asarray(v)
                                                                                     for c, v in rows.items()}})
    got = decode_attention_ms(p, dev, 16, 8192, 32, 8, 128, "bf16")
    assert got.efficiency == pytest.approx(0.85, rel=1e-6) and not got.extrapolated
    assert got.ms == pytest.approx(16 * 8192 * 4096 / (0.85 * dev.memory_bandwidth_bytes_per_s) * 1e3, rel=1e-6)


def sawtooth_profile(device_name="H200"):
    """One GEMM line (4,096 × 4,096, bf16) whose latency jumps past each power of two and falls again, as vLLM's
    FP8 tables do on an H200: m = 257 measured slower than m = 512."""
    dev = load_device(device_name)
    ms = {1: 0.010, 256: 0.020, 257: 0.060, 512: 0.030, 513: 0.090, 1024: 0.050}
    tables = {"gemm": {"dtype": np.array(["bf16"] * len(ms)), "m": np.array(list(ms), dtype=float),
                       "n": np.full(len(ms), 4096.0), "k": np.full(len(ms), 4096.0),
                       "ms": np.array(list(ms.values()))}}
    return SimpleNamespace(name="sawtooth", device=dev.name, tables=tables), ms


def test_on_its_own_device_a_profile_keeps_its_kernel_size_cliffs():
    p, ms = sawtooth_profile()
    for m, t in ms.items():
        assert gemm_ms(p, H200, m, 4096, 4096).ms == pytest.approx(t, rel=1e-9)


def test_a_borrowed_profile_loses_its_cliffs_but_keeps_its_level():
    """On another device (here a twin of the H200 under another name, so the rooflines are the same) each
    measured size is priced at the fastest latency measured at that size or a larger one (brute force over the
    table): no cliff, no size slower than a larger one, and the fastest points as measured."""
    p, ms = sawtooth_profile()
    twin = replace(H200, name="H200 twin")
    for m in ms:
        assert gemm_ms(p, twin, m, 4096, 4096).ms == pytest.approx(min(t for mm, t in ms.items() if mm >= m),
                                                                    rel=1e-9)
    _, t, _ = gemm_ms(p, twin, np.geomspace(1, 1024, 200), 4096, 4096)
    assert np.all(np.diff(t) >= -1e-12)
    on_h100 = gemm_ms(p, H100, 1024, 4096, 4096)            # another roofline: the envelope's efficiency there
    assert on_h100.efficiency == pytest.approx(float(gemm_roofline_ms(H200, 1024, 4096, 4096, "bf16")) / 0.05,
                                               rel=1e-9)


def test_a_borrowed_profile_reads_a_quantized_kernel_at_no_less_than_its_bf16_efficiency():
    """A profile whose FP8 GEMMs run at 10% of their roofline and bf16 ones at 50% (FP8 2.5x the slower): on its own
    device FP8 keeps its measured time; on a twin device (same rooflines, another name) FP8 runs at bf16's 50% of
    the FP8 roofline, at every size; the fused MoE, measured in FP8 only, has no bf16 to compare and stays."""
    from helpers_profiles import qwen3_moe_fp8_slow_profile
    from calculators.sizing.measured_ops import moe_ms
    p, _ = qwen3_moe_fp8_slow_profile()
    twin = replace(H200, name="H200 twin")
    for m in (1.0, 64.0, 700.0, 4096.0):
        own, wide = gemm_ms(p, H200, m, 5120, 2048, "fp8"), gemm_ms(p, twin, m, 5120, 2048, "bf16")
        assert own.ms == pytest.approx(float(gemm_roofline_ms(H200, m, 5120, 2048, "fp8")) / 0.1, rel=1e-6)
        assert own.ms > 1.5 * wide.ms
        assert wide.ms == pytest.approx(float(gemm_roofline_ms(H200, m, 5120, 2048, "bf16")) / 0.5, rel=1e-6)
        assert gemm_ms(p, twin, m, 5120, 2048, "fp8").ms == pytest.approx(
            float(gemm_roofline_ms(H200, m, 5120, 2048, "fp8")) / 0.5, rel=1e-6)
    for t in (1.0, 64.0, 4096.0):
        assert moe_ms(p, twin, t, 2048, 768, 128, 8, dtype="fp8").ms == pytest.approx(
            moe_ms(p, H200, t, 2048, 768, 128, 8, dtype="fp8").ms, rel=1e-9)


def test_a_weight_format_no_profile_table_prices_takes_the_closed_form_and_says_so():
    """A profile of bf16 GEMMs only: FP8 weights are priced by the next wider table (bf16), INT4 by none (its
    weight-only kernels are not an FP8 or bf16 GEMM), so an INT4 request takes the closed form: its latency equals
    the closed form's exactly, and every sentence says why (resolve_profile, the step's priced_from)."""
    from helpers_profiles import hand_made_h200_profile
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.measured_step import format_problem, resolve_profile
    from calculators.planning.request_latency import request_latency
    from specs.presets import load_preset
    p, llama = hand_made_h200_profile(), load_preset("llama-3.1-8b")
    assert format_problem(p, "fp8") is None and format_problem(p, "bf16") is None
    assert format_problem(None, "int4") is None
    why = format_problem(p, "int4")
    assert why == ("profile h200-test-curves measured no int4 GEMMs (INT4 runs weight-only kernels that no profile "
                   "measures)")
    prof, words = resolve_profile(p, H200, "vllm", llama, "int4")
    assert prof is None and words == f"closed form: {why}"
    assert resolve_profile(p, H200, "vllm", llama, "bf16")[0] is p
    measured = request_latency(llama, H200, Mesh(), 1024, 128, 8, "int4", "bf16", "vllm", profile=p)
    closed = request_latency(llama, H200, Mesh(), 1024, 128, 8, "int4", "bf16", "vllm")
    assert measured["itl_ms"] == closed["itl_ms"] and measured["ttft_ms"] == closed["ttft_ms"]
    assert measured["priced_from"].startswith("closed form") and why in measured["priced_from"]
    from calculators.planning.step import pricing_words
    assert pricing_words(p, "bf16").startswith("measured kernels") and pricing_words(p).startswith("measured")
