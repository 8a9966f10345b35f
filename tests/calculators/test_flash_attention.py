"""FlashAttention traffic (003 Detail 17): one head, N = 2,048, d = 64, FP16.

The per-head sizes in the text are binary (256 KB = 256 KiB, 8 MB = 8 MiB, 33 MB = 33 MiB). Its layer and
prefill totals multiply rounded figures ("1 GB" × 22 = "22 GB", then 22 GB / 1.6 TB/s ≈ 14 ms); the tests check
the exact traffic (32 heads × 33 MiB = 1.11 GB per layer, 24.4 GB per prefill, 15.2 ms at 1.6 TB/s) and that the
text's figures are those, rounded down to one significant figure.
"""
import pytest

from calculators.sizing.flash_attention import (attention_flops_per_head, attention_tensor_bytes, flash_attention_report,
                                         tile_bytes, tiled_attention_hbm_bytes, unfused_attention_hbm_bytes)
from specs.model_config import SpecError

KiB, MiB = 1024, 1024 ** 2
R = flash_attention_report(2048, 64, heads=32, layers=22, bandwidth_bytes_per_s=1.6e12)


def test_q_k_v_are_256_KiB_each_768_KiB_together():
    t = attention_tensor_bytes(2048, 64)
    assert t["q"] == t["k"] == t["v"] == 256 * KiB and t["qkv"] == 768 * KiB


def test_score_matrix_has_4_194_304_entries_8_MiB():
    t = attention_tensor_bytes(2048, 64)
    assert t["s_entries"] == 4_194_304 and t["s"] == 8 * MiB


def test_unfused_traffic_is_33_MiB_per_head():
    assert unfused_attention_hbm_bytes(2048, 64) == 33 * MiB


def test_unfused_traffic_is_about_1_GB_per_layer():
    assert R["unfused"]["bytes_per_layer"] == 32 * 33 * MiB == 1_107_296_256      # the text's "1 GB"
    assert int(R["unfused"]["bytes_per_layer"] / 1e9) == 1


def test_unfused_traffic_is_about_22_GB_per_prefill():
    assert R["unfused"]["bytes_per_prefill"] == 22 * 32 * 33 * MiB              # 24.4 GB; the text: 22 × "1 GB"


def test_unfused_traffic_takes_about_14_ms_at_1_6_TB_s():
    # 24,360,517,632 bytes / 1.6e12 B/s = 15.2253 ms (float division: rel 1e-12); the text's 14 ms is 22 GB / 1.6
    assert R["unfused"]["time_ms"] == pytest.approx(22 * 32 * 33 * MiB / 1.6e12 * 1e3, rel=1e-12)
    # the text writes 13.75 ms as "about 14 ms": half a unit of its rounding
    assert 22e9 / 1.6e12 * 1e3 == pytest.approx(14, abs=0.5)


def test_about_1_GFLOP_per_head_and_30_flop_per_byte():
    # exact 4·N²·d = 1.074 GFLOP; the text rounds it to "about 1 GFLOP" (7.4% off)
    assert attention_flops_per_head(2048, 64) / 1e9 == pytest.approx(1.0, rel=0.08)
    # exact 1.074e9 / 34.6e6 = 31.0 FLOP/byte; the text says "about 30" (3.4% off)
    assert R["unfused"]["intensity_flop_per_byte"] == pytest.approx(30, rel=0.05)


def test_tile_of_128_x_128_is_32_KiB_and_a_q_block_16_KiB():
    t = tile_bytes(128, 128, 64)
    assert t["score_tile"] == 32 * KiB and t["q_block"] == 16 * KiB
    assert 8 * MiB / t["score_tile"] == 256                                        # "roughly 250x smaller"


def test_tiling_cuts_traffic_and_raises_intensity_with_the_same_flops():
    tiled = tiled_attention_hbm_bytes(2048, 64, block_q=128)
    assert tiled == 2 * 256 * KiB + 16 * 512 * KiB
    assert R["traffic_ratio"] > 3
    assert R["tiled"]["intensity_flop_per_byte"] > 100 > R["unfused"]["intensity_flop_per_byte"]


def test_a_partial_last_query_block_still_reads_all_of_k_and_v():
    # N = 2,000 rows in blocks of 128: 15 full blocks + one of 80 rows = 16 passes over K and V (2·N·d·b each)
    kv_pass = 2 * 2000 * 64 * 2
    assert tiled_attention_hbm_bytes(2000, 64, block_q=128) == kv_pass + 16 * kv_pass == 8_704_000


def test_intermediates_are_over_95_percent_of_the_unfused_traffic():
    t = attention_tensor_bytes(2048, 64)
    assert (2 * t["s"] + 2 * t["p"]) / unfused_attention_hbm_bytes(2048, 64) > 0.95


def test_bad_flash_inputs():
    with pytest.raises(SpecError):
        unfused_attention_hbm_bytes(0, 64)
    with pytest.raises(SpecError):
        flash_attention_report(2048, 64, 32, 22, bandwidth_bytes_per_s=0)
