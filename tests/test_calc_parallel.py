"""Multi-GPU numbers of 003 Detail 22 (tensor, pipeline and context parallelism)."""
import pytest

from calculators.parallel import (INTERCONNECTS_BYTES_PER_S, allreduces_per_step, context_parallel_kv,
                                  pipeline_bubble_fraction, ring_allreduce_ms, tp_allreduce_ms_per_step,
                                  tp_bandwidth_floor_ms)
from calculators.params import weight_bytes
from specs.model_config import SpecError
from specs.presets import load_preset

TINY = load_preset("tinyllama")


def test_tinyllama_tp_1_2_4_floors_are_1_41_0_71_0_35_ms():
    assert [round(tp_bandwidth_floor_ms(2.2e9, 1555e9, tp), 2) for tp in (1, 2, 4)] == [1.41, 0.71, 0.35]
    w = weight_bytes(TINY, "fp16")
    assert [round(tp_bandwidth_floor_ms(w, 1555e9, tp), 2) for tp in (1, 2, 4)] == [1.41, 0.71, 0.35]


def test_70B_int4_is_22_5_ms_on_one_a100_and_11_3_5_6_2_8_with_tp_2_4_8():
    w = weight_bytes(70e9, "int4")
    assert round(tp_bandwidth_floor_ms(w, 1555e9, 1), 1) == 22.5
    assert [round(tp_bandwidth_floor_ms(w, 1555e9, tp), 1) for tp in (2, 4, 8)] == [11.3, 5.6, 2.8]


def test_two_allreduces_per_layer_44_per_tinyllama_step():
    assert allreduces_per_step(22) == 44


@pytest.mark.parametrize("m, bubble", [(1, 75), (4, 43), (16, 16), (64, 4)])
def test_pipeline_bubble_with_4_stages(m, bubble):
    assert round(100 * pipeline_bubble_fraction(4, m)) == bubble


def test_interconnects_nvlink_900_ib_ndr_50_100gbe_12_GB_s():
    assert INTERCONNECTS_BYTES_PER_S["NVLink 4 (H100)"] == 900e9
    assert INTERCONNECTS_BYTES_PER_S["InfiniBand NDR (one link)"] == INTERCONNECTS_BYTES_PER_S["400 GbE"] == 50e9
    assert round(INTERCONNECTS_BYTES_PER_S["100 GbE"] / 1e9) == 12


def test_allreduce_over_nvlink_is_small_next_to_the_decode_floor():
    t = tp_allreduce_ms_per_step(22, 2048, 1, 2, INTERCONNECTS_BYTES_PER_S["NVLink 4 (H100)"])
    assert t < 0.05 * tp_bandwidth_floor_ms(2.2e9, 1555e9, 2)
    assert ring_allreduce_ms(1e9, 1, 1e9) == 0


def test_context_parallel_70B_1M_tokens_is_4_1_GB_per_layer_327_GB_total_164_int8_41_per_tp8_gpu():
    fp16 = context_parallel_kv(80, 8, 128, 1_000_000, 2)
    assert round(fp16["bytes_per_layer"] / 1e9, 1) == 4.1
    assert fp16["bytes_total"] == pytest.approx(327e9, rel=0.003)        # 327.7 GB, which the text truncates
    assert round(context_parallel_kv(80, 8, 128, 1_000_000, 1)["bytes_total"] / 1e9) == 164
    assert round(context_parallel_kv(80, 8, 128, 1_000_000, 2, tp=8)["bytes_per_device"] / 1e9) == 41
    assert context_parallel_kv(80, 8, 128, 1_000_000, 2, cp=8)["tokens_per_device"] == 125_000


def test_bad_parallel_inputs():
    with pytest.raises(SpecError):
        pipeline_bubble_fraction(0, 4)
    with pytest.raises(SpecError):
        tp_bandwidth_floor_ms(1e9, 1e12, 0)
