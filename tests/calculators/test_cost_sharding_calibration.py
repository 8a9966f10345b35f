"""Cost per request and per 1M input/output tokens; the one-layer sharding view (reference 001); calibration."""
import json

import pytest

from calculators.planning.calibration import Measurement, calibrate, read_csv, read_vllm_json
from calculators.planning.cost import cost_at_load_usd_per_million_tokens, cost_per_request
from calculators.sizing.latency import Efficiency
from calculators.multi_gpu.parallel import tp_allreduce_ms_per_step
from calculators.multi_gpu.sharding import layer_comm_ms, layer_sharding
from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel, prefill_parallel
from specs.devices import load_device, load_link
from specs.model_config import SpecError
from specs.presets import load_preset

L70, TINY = load_preset("llama-3-70b"), load_preset("tinyllama")
NV = load_link("nvlink4")


def test_cost_splits_prefill_and_decode_time():
    # by hand: 1 GPU at $1.29/h; prefill 5 ms; 200 tokens × 1.4 ms / batch 1 = 0.28 s; $ = s × 1.29 / 3600
    c = cost_per_request(1.29, 1, 5.0, 1.4, 1, 100, 200)
    assert c["usd_per_request"] == pytest.approx(0.285 * 1.29 / 3600)
    assert c["usd_per_million_input_tokens"] == pytest.approx(0.005 * 1.29 / 3600 / 100 * 1e6)
    assert c["usd_per_million_output_tokens"] == pytest.approx(0.28 * 1.29 / 3600 / 200 * 1e6)
    # a batch of 8 shares each decode step: the reply's share drops 8×, the prompt's does not
    c8 = cost_per_request(1.29, 1, 5.0, 1.4, 8, 100, 200)
    assert c8["usd_decode_per_request"] == pytest.approx(c["usd_decode_per_request"] / 8)
    assert c8["usd_prefill_per_request"] == c["usd_prefill_per_request"]
    # 8 GPUs at $2.99 serving 1 req/s of 1,000 tokens: 23.92 $/h over 3.6M tokens/h
    assert cost_at_load_usd_per_million_tokens(2.99, 8, 1.0, 1000) == pytest.approx(8 * 2.99 / 3.6)
    with pytest.raises(SpecError):
        cost_per_request(0, 1, 1, 1, 1, 1, 1)


def test_001_mesh_4_by_8_gives_8_query_heads_1_kv_head_and_a_1280_wide_qkv_per_device():
    rows = layer_sharding(L70, 4, 8, 2048, NV)
    assert "8 query heads, 1 KV head" in rows[1]["op"]
    assert rows[0]["output_shard"] == (2048, (8 + 2) * 128) == (2048, 1280)
    assert rows[0]["input_shard"] == (2048, 8192 // 4)
    assert [r["group_devices"] for r in rows] == [4, 1, 8, 4, 8]
    assert rows[2]["message_bytes"] == 2048 * 2048 * 2


def test_a_one_row_mesh_is_megatron_tp_with_two_allreduces_per_layer():
    one_layer = layer_comm_ms(L70, 1, 8, 1024, NV)
    assert sum(r["collective"] != "none" for r in layer_sharding(L70, 1, 8, 1024, NV)) == 2
    assert one_layer * 80 == pytest.approx(tp_allreduce_ms_per_step(80, 8192, 1024, 8, NV), rel=1e-12)
    with pytest.raises(SpecError):
        layer_sharding(L70, 1, 3, 16, NV)


def test_calibration_recovers_known_knobs_from_synthetic_measurements():
    """Measurements made with MBU 0.55, MFU 0.65 and 20 µs per all-reduce call are fitted back."""
    dev = load_device("h100")
    rows = []
    for P, B, tp in ((256, 1, 1), (1024, 4, 2), (2048, 16, 4), (512, 8, 8), (4096, 2, 2)):
        mesh = Mesh(tp=tp)
        ctx = P + (128 - 1) // 2 + 1
        d = decode_step_parallel(L70, dev, mesh, ctx, B, "fp8", None, Efficiency(decode_mbu=1.0), None)
        pre = prefill_parallel(L70, dev, mesh, P, 1, "fp8", None, Efficiency(prefill_mfu=1.0))
        itl = d["memory_ms"] / 0.55 + (2 * 80 if tp > 1 else 0) * 0.020
        rows.append(Measurement(P, 128, B, pre["compute_ms"] / 0.65, itl, tp))
    fit = calibrate(L70, dev, rows, "fp8")
    assert fit["decode_mbu"] == pytest.approx(0.55, rel=1e-6)
    assert fit["prefill_mfu"] == pytest.approx(0.65, rel=1e-6)
    assert fit["alpha_ms_per_call"] == pytest.approx(0.020, rel=1e-6)
    assert fit["itl_mean_abs_error_percent"] < 1e-6


def test_calibration_says_when_the_data_imply_a_step_faster_than_the_floor():
    """ITLs at half the bandwidth floor imply MBU 2.0: it was clamped to 1.00 without a word."""
    dev = load_device("h100")
    d = decode_step_parallel(L70, dev, Mesh(), 256 + 64, 1, "fp8", None, Efficiency(decode_mbu=1.0), None)
    pre = prefill_parallel(L70, dev, Mesh(), 256, 1, "fp8", None, Efficiency(prefill_mfu=1.0))
    fit = calibrate(L70, dev, [Measurement(256, 128, 1, pre["compute_ms"] / 0.5, d["memory_ms"] / 2.0, 1)], "fp8")
    assert fit["decode_mbu"] == 1.0 and fit["raw_decode_mbu"] == pytest.approx(2.0, rel=1e-6)
    assert len(fit["held_at_one"]) == 1 and "decode MBU = 2.00" in fit["held_at_one"][0]


def test_readers_take_vllm_json_and_csv_and_refuse_bad_rows():
    doc = {"completed": 100, "total_input_tokens": 102400, "total_output_tokens": 12800, "mean_ttft_ms": 50.0,
           "mean_itl_ms": 7.5, "max_concurrency": 16, "output_throughput": 2100.0}
    m = read_vllm_json(json.dumps(doc), tp=4)[0]
    assert (m.prompt_tokens, m.output_tokens, m.batch, m.itl_ms, m.tp) == (1024, 128, 16, 7.5, 4)
    rows = read_csv("prompt_tokens,output_tokens,batch,ttft_ms,itl_ms\n100,50,1,10,2\n")
    assert rows[0].ttft_ms == 10 and rows[0].tp == 1
    with pytest.raises(SpecError, match="lacks"):
        read_csv("prompt,output\n1,2\n")
    with pytest.raises(SpecError, match="line 2"):
        read_csv("prompt_tokens,output_tokens,batch,ttft_ms,itl_ms\n100,50,0,10,2\n")
    with pytest.raises(SpecError):
        read_vllm_json("{not json")


def test_calibration_fits_the_fixed_step_cost_from_rows_of_different_sizes():
    # ITL rows generated as memory_ms / 0.5 + 3 ms from the calculators' own ideal memory time at batch 1, 8, 32:
    # the fit must return MBU 0.5 and a 3 ms step cost
    from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel
    from calculators.planning.calibration import Measurement, calibrate
    from specs.devices import load_device
    from specs.presets import load_preset
    c, dev = load_preset("llama-3-8b"), load_device("h100")
    rows = []
    for b in (1, 8, 32):
        mem = decode_step_parallel(c, dev, Mesh(), 128 + 64, b, "bf16")["memory_ms"]
        rows.append(Measurement(128, 128, b, 20.0, mem / 0.5 + 3.0))
    fit = calibrate(c, dev, rows, "bf16")
    assert fit["decode_mbu"] == pytest.approx(0.5, rel=1e-6) and fit["step_overhead_ms"] == pytest.approx(3.0, rel=1e-6)
