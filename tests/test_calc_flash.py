"""FlashAttention traffic (003 Detail 17): one head, N = 2,048, d = 64, FP16.

The per-head sizes in the text are binary (256 KB = 256 KiB, 8 MB = 8 MiB, 33 MB = 33 MiB). Its layer and
prefill totals multiply rounded figures ("1 GB" × 22 = "22 GB", then 22 GB / 1.6 TB/s ≈ 14 ms); the exact
traffic is 24.4 GB (22.7 GiB), 15.2 ms at 1.6 TB/s, so those two tests allow 10%.
"""
import pytest

from calculators.flash_attention import (attention_flops_per_head, attention_tensor_bytes, flash_attention_report,
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
    assert R["unfused"]["bytes_per_layer"] == pytest.approx(1e9, rel=0.12)       # 1,056 MiB = 1.11 GB


def test_unfused_traffic_is_about_22_GB_per_prefill():
    assert R["unfused"]["bytes_per_prefill"] == pytest.approx(22e9, rel=0.11)    # exact 24.4 GB (22.7 GiB)


def test_unfused_traffic_takes_about_14_ms_at_1_6_TB_s():
    assert R["unfused"]["time_ms"] == pytest.approx(14, rel=0.10)                # exact 15.2 ms


def test_about_1_GFLOP_per_head_and_30_flop_per_byte():
    assert attention_flops_per_head(2048, 64) / 1e9 == pytest.approx(1.0, rel=0.08)
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


def test_intermediates_are_over_95_percent_of_the_unfused_traffic():
    t = attention_tensor_bytes(2048, 64)
    assert (2 * t["s"] + 2 * t["p"]) / unfused_attention_hbm_bytes(2048, 64) > 0.95


def test_bad_flash_inputs():
    with pytest.raises(SpecError):
        unfused_attention_hbm_bytes(0, 64)
    with pytest.raises(SpecError):
        flash_attention_report(bandwidth_bytes_per_s=0)
