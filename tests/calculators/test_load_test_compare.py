"""Imported runs next to the calculators (calculators/planning/load_test_compare.py), what one load can fit
(measured_sweep.knobs_to_fit) and the fit as the planner's Efficiency (measured_sweep.efficiency_for_planner)."""
import json
from pathlib import Path

import pytest

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.load_test_compare import ImportedRun, compare_imported
from calculators.planning.load_test_import import import_load_test, to_sweep_level
from calculators.planning.measured_sweep import efficiency_for_planner, knobs_to_fit
from calculators.sizing.latency import Efficiency
from specs.devices import load_device
from specs.presets import load_preset

DATA = Path(__file__).resolve().parents[1] / "data" / "load_tests" / "scripted"
CONFIG, DEVICE = load_preset("TinyLlama-1.1B"), load_device("A100 SXM 40GB")


def _run(name="vllm_bench_serve.json", mode=None, level=None):
    rec = import_load_test((DATA / name).read_bytes(), name)[0]
    return ImportedRun(name, rec, mode or rec.mode, level or rec.level)


def _rate_run(rate=3.0):
    doc = {"aiperf_version": "0.13.0", "request_count": {"unit": "requests", "avg": 40},
           "time_to_first_token": {"unit": "ms", "avg": 100.0, "p50": 90.0, "p90": 120.0, "p99": 130.0},
           "inter_token_latency": {"unit": "ms", "avg": 20.0, "p50": 20.0, "p90": 21.0, "p99": 22.0},
           "inter_chunk_latency": {"unit": "ms", "avg": 10.0, "p50": 9.0, "p90": 15.0, "p99": 30.0},
           "request_latency": {"unit": "sec", "avg": 0.5}, "request_throughput": {"unit": "requests/sec", "avg": 3.0},
           "output_token_throughput": {"unit": "tokens/sec", "avg": 60.0},
           "input_sequence_length": {"unit": "tokens", "avg": 100.0},
           "output_sequence_length": {"unit": "tokens", "avg": 20.0},
           "input_config": {"phases": [{"kind": "profiling", "request_rate": rate}]}}
    return ImportedRun("rate.json", import_load_test(json.dumps(doc))[0], "rate", rate)


def test_one_load_fits_two_knobs_two_loads_fit_three():
    one = to_sweep_level(_run().record)
    knobs, why = knobs_to_fit([one])
    assert knobs == ("decode_mbu", "prefill_mfu") and "one run" in why and "overhead" in why
    knobs, why = knobs_to_fit([one, one])                         # the same load twice: still one load
    assert knobs == ("decode_mbu", "prefill_mfu") and "2 runs at one load" in why
    other = to_sweep_level(_run("aiperf_profile_export_aiperf.csv", "concurrency", 8).record, "concurrency", 8)
    assert knobs_to_fit([one, other]) == (("decode_mbu", "prefill_mfu", "overhead_ms"), None)


def test_one_run_holds_the_overhead_at_the_stacks_default():
    cmp = compare_imported(CONFIG, DEVICE, [_run()], stack="vllm")
    held = Efficiency.for_stack("vllm", DEVICE, "bf16").step_overhead_ms
    assert cmp["fit"]["overhead_ms"] == held and cmp["fit"]["fitted_knobs"] == ("decode_mbu", "prefill_mfu")
    assert [r["metric"] for r in cmp["rows"]] == ["TTFT mean (ms)", "TPOT mean (ms)", "end-to-end mean (ms)",
                                                  "output tokens/s"]
    rec = _run().record.metrics
    assert [r["measured"] for r in cmp["rows"]] == [rec["ttft_mean_ms"], rec["tpot_mean_ms"], rec["e2e_mean_ms"],
                                                    rec["output_tok_s"]]
    # two knobs, two equations: the fitted model meets the run's mean TTFT and TPOT
    assert abs(cmp["rows"][0]["error (fitted) %"]) < 1 and abs(cmp["rows"][1]["error (fitted) %"]) < 1


def test_a_rate_run_is_predicted_by_serve_at_and_errors_are_predicted_over_measured():
    cmp = compare_imported(CONFIG, DEVICE, [_run(), _rate_run()], stack="vllm")
    rate = [r for r in cmp["rows"] if r["run"] == "rate.json"]
    assert {r["predicted by"] for r in rate} == {"steady state (serve_at)"}
    got = {r["metric"]: r for r in rate}
    assert got["TTFT p50 (ms)"]["measured"] == 90.0 and got["ITL p99 (ms)"]["measured"] == 30.0
    assert got["TPOT mean (ms)"]["measured"] == 20.0
    for r in rate:
        assert r["error (defaults) %"] == pytest.approx(100 * (r["predicted (defaults)"] / r["measured"] - 1))
    # a stable steady state serves every request: output tokens/s = 3 requests/s × 20 tokens
    assert got["output tokens/s"]["predicted (defaults)"] == pytest.approx(60.0)
    assert cmp["knobs"] == ("decode_mbu", "prefill_mfu", "overhead_ms")           # two loads


def test_more_than_one_gpu_predicts_rate_runs_and_fits_nothing():
    cmp = compare_imported(CONFIG, DEVICE, [_run(), _rate_run()], mesh=Mesh(tp=2), stack="vllm")
    assert cmp["fit"] is None and cmp["planner_efficiency"] is None and "one GPU" in cmp["notes"][0]
    assert {r["run"] for r in cmp["rows"]} == {"rate.json"}


def test_the_planners_efficiency_reproduces_the_fitted_step_model():
    eff = efficiency_for_planner({"decode_mbu": 0.55, "prefill_mfu": 0.42, "overhead_ms": 3.5})
    assert (eff.decode_mbu, eff.prefill_mfu, eff.decode_mfu, eff.step_overhead_ms) == (0.55, 0.42, 0.42, 3.5)
    assert eff.gemm_half_tokens == 0 and eff.sequence_overhead_us == 0 and eff.prefill_mbu == Efficiency().prefill_mbu
    assert eff.mfu_at(1) == eff.mfu_at(10_000) == 0.42                           # flat, as the fitted model
    assert eff.overhead_ms(64) == 3.5                                            # no per-sequence part
