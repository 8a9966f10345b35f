"""Serving numbers of 003 Details 15, 16, 19, 20, 21: paging, speculative decoding, prefix caching, queueing."""
import pytest

from calculators.sizing.kv_cache import kv_bytes_per_token
from calculators.serving.paging import (REFERENCE_WALKTHROUGH, blocks_needed, contiguous_walkthrough, empty_slots,
                                logical_block, max_empty_slots, paged_vs_reserved, physical_slot, reserve_for_max)
from calculators.serving.prefix_cache import (cacheable_blocks, prefill_with_prefix_cache, prefix_kv_bytes,
                                      redundant_prefill)
from calculators.serving.queueing import (chunked_prefill, goodput_p99_slo, goodput_tok_s, mean_queue_wait_ms,
                                  prefill_stall, queue_wait_factor)
from calculators.serving.speculative import expected_tokens_per_pass, speculative_memory_bytes, speculative_speedup
from specs.model_config import SpecError
from specs.presets import load_preset

KV_TOKEN = kv_bytes_per_token(load_preset("tinyllama"), "fp16")     # 22,528 B
PER_TOKEN_45MB = 45e6 / 2048                                          # the text's "45 MB / 2,048 tokens"


# --- paging ----------------------------------------------------------------------------------------------------
def test_50_tokens_reserving_2048_slots_is_45_MB_reserved_1_1_MB_used_97_5_percent_waste():
    r = reserve_for_max(50, 2048, PER_TOKEN_45MB)
    assert round(r["reserved_bytes"] / 1e6) == 45
    assert round(r["used_bytes"] / 1e6, 1) == 1.1
    assert round(reserve_for_max(50, 2048, KV_TOKEN)["used_bytes"] / 1e6, 1) == 1.1     # 50 × 22,528 B
    assert round(r["wasted_bytes"] / 1e6, 1) == 43.9
    assert 97.5 <= r["waste_percent"] < 97.6            # 1,998 / 2,048 = 97.56%, which the text truncates


def test_50_tokens_in_blocks_of_16_is_4_blocks_with_14_empty_slots_at_most_15():
    assert blocks_needed(50, 16) == 4 and empty_slots(50, 16) == 14 and max_empty_slots(16) == 15


def test_token_35_is_in_logical_block_2_offset_3():
    assert logical_block(35, 16) == (2, 3)
    assert physical_slot(35, [7, 2, 14, 5]) == (14, 3)
    with pytest.raises(SpecError):
        physical_slot(64, [7, 2, 14, 5])


def test_50_sequences_of_500_tokens_reserved_2_25_GB_vs_550_MB_used_567_MB_paged_1_7_GB_freed():
    r = paged_vs_reserved(50, 500, 2048, PER_TOKEN_45MB, 16)
    assert r["reserved_bytes"] == pytest.approx(2.25e9)
    assert r["used_bytes"] == pytest.approx(550e6, rel=0.005)                # 549.3 MB
    assert r["slack_bytes_per_sequence"] == pytest.approx(330e3, rel=0.005)  # 15 × 22 KB
    assert r["slack_bytes"] == pytest.approx(17e6, rel=0.035)                # 16.5 MB, rounded up to 17
    assert r["paged_bytes"] == pytest.approx(567e6, rel=0.005)               # 565.8 MB (text: 550 + 17)
    assert round(r["freed_bytes"] / 1e9, 1) == 1.7


def test_contiguous_walkthrough_leaves_660_MB_free_but_no_200_MB_hole_but_the_tail():
    snaps = contiguous_walkthrough(1000, REFERENCE_WALKTHROUGH)
    assert snaps[2]["layout"] == [("A", 100), ("B", 150), ("C", 80), (None, 670)]
    assert snaps[4]["layout"][:2] == [("D", 60), (None, 40)]                  # D reuses A's hole
    last = snaps[-1]
    assert last["layout"] == [("D", 60), (None, 40), (None, 150), ("C", 80), ("E", 200), (None, 470)]
    assert last["free_total"] == 660
    holes_before_tail = [s for o, s in last["layout"][:-1] if o is None]
    assert max(holes_before_tail) < 200 <= last["largest_hole"]              # only the 470 MB tail fits F


def test_fragmentation_can_refuse_an_allocation_that_total_free_memory_could_hold():
    events = [("alloc", "A", 300), ("alloc", "B", 100), ("alloc", "C", 300), ("alloc", "D", 100),
              ("alloc", "E", 200), ("free", "A"), ("free", "C"), ("alloc", "F", 400)]
    snaps = contiguous_walkthrough(1000, events, coalesce=True)
    assert snaps[-1]["free_total"] == 600 and not snaps[-1]["ok"]


# --- speculative decoding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("acceptance, tokens", [(0.8, 3.4), (0.5, 1.9), (0.2, 1.2)])
def test_k4_expected_tokens_per_target_pass(acceptance, tokens):
    assert round(expected_tokens_per_pass(acceptance, 4), 1) == tokens


def test_speculation_bounds_1_to_k_plus_1():
    assert expected_tokens_per_pass(0, 4) == 1 and expected_tokens_per_pass(1, 4) == 5
    # (1 - 0.8^5) / 0.2 = 3.3616: the text's two decimals
    assert speculative_speedup(0.8, 4, 0.0) == pytest.approx(3.36, abs=0.01)
    assert speculative_speedup(0.2, 4, 0.5) < 1                             # a bad draft slows decoding down
    with pytest.raises(SpecError):
        expected_tokens_per_pass(1.2, 4)


def test_125M_draft_is_250_MB_and_target_plus_draft_2_45_GB():
    m = speculative_memory_bytes(1.1e9, 125e6, "fp16")
    assert m["draft_bytes"] == pytest.approx(250e6) and m["total_bytes"] == pytest.approx(2.45e9)


# --- prefix caching -------------------------------------------------------------------------------------------
def test_500_token_system_prompt_is_11_MB_of_kv():
    assert round(prefix_kv_bytes(500, KV_TOKEN) / 1e6) == 11


def test_508_token_prompt_with_500_cached_prefills_8_tokens_98_percent_less():
    r = prefill_with_prefix_cache(508, 500)
    assert r["tokens_to_prefill"] == 8 and round(r["percent_saved"]) == 98


def test_100_requests_per_minute_are_50000_shared_vs_2000_unique_tokens_96_percent_redundant():
    r = redundant_prefill(100, 500, 20)
    assert r["shared_tokens"] == 50_000 and r["unique_tokens"] == 2_000 and round(100 * r["redundant_fraction"]) == 96


def test_500_token_prefix_fills_31_full_blocks_of_16():
    assert cacheable_blocks(500, 16) == dict(full_blocks=31, partial_block_tokens=4, total_blocks=32)


# --- queueing, goodput, chunked prefill -----------------------------------------------------------------------
@pytest.mark.parametrize("rho, wait", [(0.5, 1), (0.9, 9), (0.95, 19)])
def test_queue_wait_factor_is_1_at_50_9_at_90_19_at_95_percent(rho, wait):
    assert queue_wait_factor(rho) == pytest.approx(wait)


def test_queue_wait_needs_utilization_below_1():
    assert mean_queue_wait_ms(10, 0.5) == pytest.approx(10)
    for bad in (0, 1, 1.2, -0.1):
        with pytest.raises(SpecError):
            queue_wait_factor(bad)


def test_goodput_config_b_20000_beats_config_a_under_a_500_ms_slo():
    a = goodput_p99_slo(50_000, p99_ttft_ms=4000, slo_ttft_ms=500)
    b = goodput_p99_slo(20_000, p99_ttft_ms=200, slo_ttft_ms=500)
    assert a == 0 and b == 20_000
    assert goodput_tok_s(50_000, 0.3) == pytest.approx(15_000)


def test_1000_token_prefill_of_50_ms_stalls_32_streams_about_30x():
    s = prefill_stall(50, 1.55, streams=32)
    assert round(s["spike_ratio"], -1) == 30 and s["streams_stalled"] == 32


def test_chunked_prefill_turns_one_spike_into_small_bumps():
    c = chunked_prefill(50, 1000, 128, 1.55)
    assert c["chunks"] == 8 and c["worst_itl_ms"] < 10 and c["spike_ratio"] < prefill_stall(50, 1.55)["spike_ratio"]
