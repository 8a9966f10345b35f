"""Bandwidth floor, latency, batching and cost (003 Details 12, 18, 21)."""
import pytest

from calculators.sizing.latency import (IDEAL, Efficiency, bandwidth_floor_ms, batch_table, batch_table_for,
                                 cost_per_million_tokens, decode_step_ms, generation_latency, prefill_ms,
                                 stage_with_host, step_weight_bytes, throughput_tok_s, total_latency_ms)
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")
A100 = load_device("A100 SXM 40GB")


def test_floor_for_2_2_GB_on_rtx_4090_is_2_18_ms():
    assert round(bandwidth_floor_ms(2.2e9, load_device("RTX 4090").memory_bandwidth_bytes_per_s), 2) == 2.18


def test_floor_for_2_2_GB_on_a100_is_1_41_ms():
    assert round(bandwidth_floor_ms(2.2e9, A100.memory_bandwidth_bytes_per_s), 2) == 1.41


def test_floor_for_2_2_GB_on_h100_sxm_is_0_66_ms():
    assert round(bandwidth_floor_ms(2.2e9, load_device("H100 SXM").memory_bandwidth_bytes_per_s), 2) == 0.66


def test_h100_pcie_is_slower_than_sxm():
    pcie = bandwidth_floor_ms(2.2e9, load_device("H100 PCIe").memory_bandwidth_bytes_per_s)
    assert round(pcie, 2) == 1.08 and pcie > bandwidth_floor_ms(2.2e9, 3350e9)


def test_tinyllama_weights_give_the_same_floors():
    w = step_weight_bytes(TINY, "fp16")
    assert [round(bandwidth_floor_ms(w, bw * 1e9), 2) for bw in (1008, 1555, 3350)] == [2.18, 1.41, 0.66]


def test_70B_fp16_floor_on_a100_is_about_90_ms():
    assert round(bandwidth_floor_ms(140e9, 1555e9)) == 90


def test_200_token_reply_is_5_plus_199_x_1_4_about_284_ms():
    assert round(total_latency_ms(5, 1.4, 200)) == 284


def test_batch_table_steps_are_1_42_1_45_1_55_1_96_ms():
    rows = batch_table(2.2e9, 22e3, 300, (1, 8, 32, 128), 1555e9)      # 22 KB/token -> 6.6 MB/sequence
    assert [round(r["step_ms"], 2) for r in rows] == [1.42, 1.45, 1.55, 1.96]
    assert [round(r["kv_read_bytes"] / 1e6) for r in rows] == [7, 53, 211, 845]
    # totals 2.21, 2.25, 2.41, 3.05 GB: the text adds the rounded 845 MB to 2.2 GB (exact 3.0448 -> 3.04)
    assert [r["total_bytes"] / 1e9 for r in rows] == pytest.approx([2.21, 2.25, 2.41, 3.05], abs=0.006)


def test_batch_table_throughput_is_704_5517_20645_65306_tok_s():
    rows = batch_table(2.2e9, 22e3, 300, (1, 8, 32, 128), 1555e9)
    # the text divides by the step time rounded to 0.01 ms; the exact values are within that rounding
    assert [round(r["batch"] / round(r["step_ms"], 2) * 1e3) for r in rows] == [704, 5517, 20645, 65306]
    # the text divides by steps rounded to 0.01 ms: up to 0.005/1.42 = 0.35% apart
    assert [r["total_tok_s"] for r in rows] == pytest.approx([704, 5517, 20645, 65306], rel=0.004)
    assert [round(1e3 / round(r["step_ms"], 2)) for r in rows] == [704, 690, 645, 510]


def test_batch_128_reads_38_percent_more_for_93x_the_throughput():
    rows = batch_table(2.2e9, 22e3, 300, (1, 128), 1555e9)
    assert round(100 * (rows[1]["total_bytes"] / rows[0]["total_bytes"] - 1)) == 38
    assert round(rows[1]["total_tok_s"] / rows[0]["total_tok_s"]) == 93


def test_batch_table_from_a_config_agrees_with_the_text_within_its_rounding():
    rows = batch_table_for(TINY, A100, 300, (1, 8, 32, 128), "fp16")
    # the config counts all 1.100 B params (2.200 GB) vs the text's rounded 2.2e9 + 22 KB: 0.01-0.02 ms
    assert [r["step_ms"] for r in rows] == pytest.approx([1.42, 1.45, 1.55, 1.96], abs=0.02)
    assert rows[0]["usd_per_million_tokens"] > 0


def test_cost_per_million_tokens():
    assert cost_per_million_tokens(3.6, 1000) == pytest.approx(1.0)      # $3.60/h at 1,000 tok/s = $1 per 1M


def test_throughput_is_batch_over_step():
    # 32 / 1.55 ms = 20,645.16 tok/s, given to two decimals (rel 1e-6 = 0.02 tok/s)
    assert throughput_tok_s(32, 1.55) == pytest.approx(20645.16, rel=1e-6)


def test_ideal_decode_step_is_the_bandwidth_floor_at_batch_1():
    d = decode_step_ms(TINY, A100, 300, 1, "fp16", efficiency=IDEAL)
    assert d["bound"] == "memory" and round(d["step_ms"], 2) == 1.42


def test_realistic_is_slower_than_ideal():
    g = generation_latency(TINY, A100, 100, 200, weight_dtype="fp16")
    ideal, real = g["ideal"], g["realistic"]
    assert real["ttft_ms"] > ideal["ttft_ms"] and real["itl_ms"] > ideal["itl_ms"]
    # float sum in another order: approx's default rel 1e-6
    assert ideal["total_ms"] == pytest.approx(ideal["ttft_ms"] + 199 * ideal["itl_ms"])
    assert real["usd_per_million_tokens"] > ideal["usd_per_million_tokens"] > 0


def test_short_prefill_is_memory_bound_long_prefill_compute_bound_on_an_a100():
    assert prefill_ms(TINY, A100, 100, weight_dtype="fp16")["bound"] == "memory"    # ≈ 94 FLOP/byte < ridge 200
    assert prefill_ms(TINY, A100, 2000, weight_dtype="fp16")["bound"] == "compute"


def test_efficiency_knobs_are_validated():
    assert Efficiency().decode_mbu == 0.6
    for bad in (0, 1.5, -0.1, float("nan")):
        with pytest.raises(SpecError):
            Efficiency(decode_mbu=bad)


def test_bad_latency_inputs():
    with pytest.raises(SpecError):
        total_latency_ms(5, 1.4, 0)
    with pytest.raises(SpecError):
        bandwidth_floor_ms(1e9, 0)
    with pytest.raises(SpecError):
        cost_per_million_tokens(-1, 100)


def test_only_the_hosts_per_sequence_work_hides_behind_the_gpu():
    # a step of 10 ms of GPU work, a 2 ms fixed cost (on the GPU's timeline), 100 sequences at 50 µs of host work
    # each (5 ms): without an overlap scheduler 10 + 2 + 5 = 17 ms; with one, max(10 + 2, 5) = 12 ms; with 300
    # sequences (15 ms of host work) the host binds: max(12, 15) = 15 ms
    over = Efficiency(step_overhead_ms=2.0, sequence_overhead_us=50.0, overlap_host=True)
    plain = Efficiency(step_overhead_ms=2.0, sequence_overhead_us=50.0, overlap_host=False)
    assert float(plain.stage_ms(10.0, 100)) == pytest.approx(17.0)
    assert float(over.stage_ms(10.0, 100)) == pytest.approx(12.0)
    assert float(over.stage_ms(10.0, 300)) == pytest.approx(15.0)
    assert stage_with_host([10.0, 10.0], 2.0, [5.0, 15.0], True).tolist() == pytest.approx([12.0, 15.0])
