"""One step model on the Parallelism page: the ITL of each TP and PP degree it shows (`parallel_step.tp_step_scaling`,
`pp_step_scaling`) is the one `latency --tp N` / `--pp N` reports for the same work, closed form and from measured
kernels, and the parts its bars stack add up to that ITL. The page priced them with the old pair
(`tensor_parallel.tp_scaling` / `pipeline.pp_scaling` at a generic `Efficiency()`): Llama-3.1-70B on H100 after a
2,048-token context, batch 1, TP 1/2/4/8 at 70.5 / 36.0 / 18.4 / 9.6 ms against the command's 77.4 / 39.6 / 20.4 /
10.8 ms (closed form, 9-11% off), and one request through 2 and 4 stages at 70.5 / 72.7 ms against 77.8 / 80.9 ms."""
import json

import pytest

from calculators.cli import main as cli
from calculators.planning.parallel_step import decode_step_segments, pp_step_scaling, tp_step_scaling
from specs.devices import load_device
from specs.presets import load_preset
from specs.profiles import load_profile
from tests.calculators.test_one_step_model import profile_path  # noqa: F401  (the made-up H100 profile)

H100 = load_device("h100")
L70 = load_preset("llama-3.1-70b")
CTX = 2048


def latency_itl(capsys, flag: str, degree: int, batch: int, profile: str) -> dict:
    code = cli(["latency", "--model", "llama-3.1-70b", "--gpu", "h100", "--tokens", str(CTX), "--output-tokens", "1",
                "--batch", str(batch), flag, str(degree), "--profile", profile, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    return out


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("priced", ["closed form", "measured"])
def test_the_parallelism_page_prices_each_tp_and_pp_degree_as_latency_does(capsys, profile_path, priced, batch):  # noqa: F811
    arg = "none" if priced == "closed form" else profile_path
    prof = None if priced == "closed form" else load_profile(profile_path)
    tp = tp_step_scaling(L70, H100, (1, 2, 4, 8), CTX, batch, "bf16", profile=prof)
    pp = pp_step_scaling(L70, H100, (2, 4), CTX, batch, "bf16", profile=prof)
    for row in tp:
        lat = latency_itl(capsys, "--tp", row["tp"], batch, arg)
        assert row["itl_ms"] == pytest.approx(lat["itl_ms"], rel=0.02), row["tp"]
        assert row["allreduce_ms"] == pytest.approx(lat["allreduce_ms_per_token"], rel=0.02)
        # the stacked bar is the ITL, part by part; the all-reduce part is the one the command reports
        assert sum(row["segments"].values()) == pytest.approx(row["itl_ms"], rel=1e-9)
        assert row["segments"]["allreduce_ms"] == pytest.approx(row["allreduce_ms"])
        assert min(row["segments"].values()) >= 0
        assert ("gemm_ms" in row["segments"]) == (prof is not None)
        assert ("measured kernels" in row["priced_from"]) == (prof is not None)
    for row in pp:
        assert row["itl_ms"] == pytest.approx(latency_itl(capsys, "--pp", row["pp"], batch, arg)["itl_ms"], rel=0.02)
        assert row["single_request_itl_ms"] == pytest.approx(latency_itl(capsys, "--pp", row["pp"], 1, arg)["itl_ms"],
                                                             rel=0.02)
        assert sum(row["segments"].values()) == pytest.approx(row["itl_ms"], rel=1e-9)
        assert row["bubble_batch_1"] == pytest.approx((row["pp"] - 1) / row["pp"])
    # the lesson: TP shortens the step, but less each time (the all-reduces and the host's work stay); PP does not
    itl = [r["itl_ms"] for r in tp]
    assert itl == sorted(itl, reverse=True) and tp[-1]["speedup"] < 8
    assert [r["allreduce_ms"] for r in tp][0] == 0 < tp[1]["allreduce_ms"] <= tp[-1]["allreduce_ms"]
    assert batch > 1 or all(r["single_request_itl_ms"] >= tp[0]["itl_ms"] for r in pp)   # one request: no quicker
    assert all(r["tok_s_pp_in_flight"] > r["tok_s_batch_1"] for r in pp)


def test_a_closed_form_step_splits_into_reads_and_the_compute_beyond_them():
    """max(memory, compute) per roofline = memory + the compute that outlasts it: a compute-bound step keeps the
    excess; the host's part is what the stage adds to the GPU's work, counted once per pass."""
    parts = dict(weights_memory_ms=2.0, gemm_compute_ms=5.0, kv_memory_ms=1.0, attention_compute_ms=0.5, comm_ms=0.25,
                 gpu_ms=6.25, passes=2, p2p_ms=0.1, step_ms=2 * (6.25 + 0.4) + 0.1)
    seg = decode_step_segments(parts)
    assert seg == pytest.approx(dict(memory_ms=6.0, compute_ms=6.0, allreduce_ms=0.5, host_ms=0.8, p2p_ms=0.1))
    assert sum(seg.values()) == pytest.approx(parts["step_ms"])
