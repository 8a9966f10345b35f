"""One step model: the same work gets the same number in every command (issue 36: `serve-at` priced a 2,048-token
prefill 1.5x `latency`'s). The work here runs through `latency` (the CLI), `serve-at` at a rate so low that
requests never meet, `throughput`'s step and the planner's vectorised search, priced by the closed form and by a
profile of measured kernels that the test writes itself."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from calculators.cli import main as cli
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.planner import SearchSpace, Workload, plan
from calculators.planning.request_latency import request_latency
from calculators.planning.serve_at import serve_at
from calculators.planning.throughput import max_throughput
from calculators.sizing.measured_ops import (decode_attention_roofline_ms, gemm_roofline_ms,
                                             prefill_attention_roofline_ms)
from specs.devices import load_device
from specs.presets import load_preset
from specs.profiles import load_profile, save_profile

H100 = load_device("h100")
MODEL = load_preset("llama-3-8b")
P, O = 2000, 300


def _table(rows: list[dict]) -> dict:
    return {k: np.asarray([r[k] for r in rows]) for k in rows[0]}


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    """A profile of H100 whose kernels reach a made-up, size-dependent fraction of the datasheet."""
    gemm, dec, pre = [], [], []
    for dt in ("bf16", "fp8"):
        for m in 2 ** np.arange(0, 16):
            for n, k in ((1024, 4096), (4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
                eff = min(0.9, 0.25 + 0.04 * np.log2(m))
                gemm.append(dict(dtype=dt, m=int(m), n=n, k=k, ms=float(gemm_roofline_ms(H100, m, n, k, dt) / eff)))
    for b in (1, 4, 16, 64, 256):
        for ctx in (512, 2048, 8192):
            ideal = float(decode_attention_roofline_ms(H100, b, ctx, 32, 8, 128, "bf16"))
            dec.append(dict(dtype="bf16", kv_dtype="bf16", batch=b, context=ctx, heads=32, kv_heads=8,
                            head_dim=128, window=0, ms=ideal / min(0.9, 0.3 + 0.1 * np.log2(b))))
        for t in (128, 1024, 4096):
            ideal = float(prefill_attention_roofline_ms(H100, b, t, 0, 32, 8, 128, "bf16"))
            pre.append(dict(dtype="bf16", kv_dtype="bf16", batch=b, tokens=t, prefix=0, heads=32, kv_heads=8,
                            head_dim=128, window=0, ms=ideal / 0.5))
    prof = SimpleNamespace(name="test-h100", device="H100 SXM", stack="vllm", stack_version="0.0-test",
                           source={"kind": "profiler", "version": "test", "detail": "made by the test"},
                           provenance={"date": "2026-11-29"},
                           tables=dict(gemm=_table(gemm), generation_attention=_table(dec),
                                       context_attention=_table(pre)))
    from specs.profile_format import Profile
    path = tmp_path_factory.mktemp("profiles") / "test-h100.json.gz"
    save_profile(Profile(name=prof.name, device=prof.device, stack=prof.stack, stack_version=prof.stack_version,
                         source=prof.source, provenance=prof.provenance, tables=prof.tables), path)
    return str(path)


def _latency_cli(capsys, profile: str) -> dict:
    code = cli(["latency", "--model", "llama-3-8b", "--gpu", "h100", "--tokens", str(P), "--output-tokens", str(O),
                "--profile", profile, "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("priced", ["closed form", "measured"])
def test_latency_serve_at_and_the_planner_price_the_same_prefill_and_decode_alike(capsys, profile_path, priced):
    arg = "none" if priced == "closed form" else profile_path
    prof = None if priced == "closed form" else load_profile(profile_path)
    lat = _latency_cli(capsys, arg)
    assert ("measured kernels" in lat["pricing"]) == (prof is not None)
    quiet = serve_at(MODEL, H100, Mesh(), 1e-4, P, O, profile=prof)          # one request at a time
    assert quiet["ttft_p50_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)
    assert quiet["tpot_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    wl = Workload(requests_per_s=1e-3, prompt_tokens=P, output_tokens=O, ttft_p99_ms=1e5, itl_ms=1e4)
    space = SearchSpace(gpu_counts=(1,), tp=(1,), pp=(1,), batch_caps=(1, 8), weight_dtypes=("bf16",),
                        kv_dtypes=("bf16",))
    res = plan(MODEL, [H100], wl, space, profile=prof)
    one = res.find(H100.name, 1, 1, 1, 1, "bf16", "bf16")[0]
    assert one["prefill_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)
    assert one["itl_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    eight = res.find(H100.name, 1, 1, 1, 8, "bf16", "bf16")[0]
    batch8 = request_latency(MODEL, H100, Mesh(), P, O, 8, profile=prof)
    assert eight["itl_ms"] == pytest.approx(batch8["itl_ms"], rel=0.02)


def test_measured_kernels_change_the_answer_and_say_so(profile_path):
    """The profile is not ignored: its kernels reach at most 90% of the datasheet, so every step is slower than
    the roofline, and the throughput and serve-at results name what priced them."""
    prof = load_profile(profile_path)
    closed = max_throughput(MODEL, H100, Mesh(), P, O)
    measured = max_throughput(MODEL, H100, Mesh(), P, O, profile=prof)
    assert measured["step_ms"] != pytest.approx(closed["step_ms"], rel=0.01)
    assert measured["measured_gpu_ms"] > measured["roofline_gpu_ms"]
    assert "measured kernels: profile test-h100" in measured["priced_from"]
    assert closed["priced_from"].startswith("closed form")


def test_a_profile_of_an_unknown_device_or_a_truncated_file_is_one_clear_message(capsys, tmp_path, profile_path):
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(open(profile_path, "rb").read()[:200])
    code = cli(["latency", "--model", "llama-3-8b", "--gpu", "h100", "--profile", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "cut.json.gz" in err
    code = cli(["latency", "--model", "llama-3-8b", "--gpu", "h100", "--profile", "no-such-profile"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown profile 'no-such-profile'" in err


def test_a_request_past_the_context_window_is_one_clear_message(capsys):
    """TinyLlama's window is 2,048 tokens: a 2,048-token prompt has no room for 200 more."""
    code = cli(["latency", "--model", "tinyllama", "--gpu", "h100", "--tokens", "2048", "--output-tokens", "200",
                "--profile", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "2,248 tokens exceeds TinyLlama-1.1B's context window of 2,048" in err
    assert cli(["latency", "--model", "tinyllama", "--gpu", "h100", "--tokens", "1848", "--output-tokens", "200",
                "--profile", "none"]) == 0


def test_the_nearest_profiled_device_skips_a_profile_of_a_device_without_a_datasheet(monkeypatch):
    """This machine's CPU profile names a device specs/devices.json does not list: looking for a GPU's nearest
    profiled device passes over it instead of failing (the Measured kernels page raised on a fresh install)."""
    import specs.profiles as profiles
    from calculators.planning.measured_step import nearest_profiled
    monkeypatch.setattr(profiles, "profiled_devices", lambda stack, directory=None: ["CPU: AMD EPYC (2 cores)",
                                                                                     "H200"])
    assert nearest_profiled(load_device("mi300x"), "vllm").name == "H200"
    monkeypatch.setattr(profiles, "profiled_devices", lambda stack, directory=None: ["CPU: AMD EPYC (2 cores)"])
    assert nearest_profiled(load_device("mi300x"), "vllm") is None


# The Bandwidth floor page's multi-GPU section (`latency_with_floor`) against `latency --tp 2`: Llama-3.1-8B on two
# H100s, a 2,048-token prompt and 128 output tokens. The page priced it with the old pair
# (`generation_latency_parallel`: prefill_parallel at the stack's prefill MFU, ITL at the page's knobs), 29.2 ms
# TTFT against the step's 42.2 ms closed form, and a 4.35 ms ITL at the knobs' defaults against 5.13 ms.
MODEL_31 = load_preset("llama-3.1-8b")
TP2 = Mesh(tp=2)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("priced", ["closed form", "measured"])
def test_the_bandwidth_floor_page_prices_a_tensor_parallel_request_as_latency_does(capsys, profile_path, priced,
                                                                                  batch):
    from calculators.planning.request_latency import latency_with_floor
    arg = "none" if priced == "closed form" else profile_path
    prof = None if priced == "closed form" else load_profile(profile_path)
    code = cli(["latency", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "2", "--tokens", "2048",
                "--output-tokens", "128", "--batch", str(batch), "--profile", arg, "--json"])
    lat = json.loads(capsys.readouterr().out)
    assert code == 0
    page = latency_with_floor(MODEL_31, H100, TP2, 2048, 128, batch, profile=prof)
    real, floor = page["realistic"], page["floor"]
    assert real["ttft_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)
    assert real["itl_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    assert real["total_ms"] == pytest.approx(lat["total_ms"], rel=0.02)
    # the all-reduce the page and the command show is the step's own, a share of the ITL shown beside it
    assert real["allreduce_ms_per_token"] == pytest.approx(lat["allreduce_ms_per_token"], rel=0.02)
    assert real["allreduce_ms_prefill"] == pytest.approx(lat["allreduce_ms_prefill"], rel=0.02)
    assert real["decode_comm_fraction"] * real["itl_ms"] == pytest.approx(real["allreduce_ms_per_token"])
    assert 0 < real["allreduce_ms_per_token"] < real["itl_ms"]
    # the floor: the same step at the datasheet peaks, no faster than any pricing of it
    assert floor["ttft_ms"] < real["ttft_ms"] and floor["itl_ms"] < real["itl_ms"]
    assert ("measured kernels" in page["priced_from"]) == (prof is not None)
    assert real["usd_per_million_tokens"] > 0


@pytest.mark.parametrize("batch", [1, 8])
def test_the_old_pair_priced_that_work_more_than_2_percent_apart(batch):
    """Why the test above can fail: the page's old pricing of the same work, at the stack's efficiencies and at the
    page's knobs, is more than 2% from `latency`'s step (the TTFT by 44%)."""
    from calculators.multi_gpu.tensor_parallel import generation_latency_parallel
    from calculators.sizing.latency import Efficiency
    step = request_latency(MODEL_31, H100, TP2, 2048, 128, batch)
    for eff in (None, Efficiency()):
        old = generation_latency_parallel(MODEL_31, H100, TP2, 2048, 128, batch, efficiency=eff)["realistic"]
        assert old["ttft_ms"] != pytest.approx(step["ttft_ms"], rel=0.02)
    assert old["itl_ms"] != pytest.approx(step["itl_ms"], rel=0.02)


def test_the_page_prices_with_what_latency_defaults_to(capsys, monkeypatch):
    """The page's measured-kernels switch starts where `--profile` does ($INFERENCE_LAB_PROFILE, else auto): on,
    it names the profile `latency --profile auto` uses (the closed form where none is installed); off, the
    closed form."""
    from calculators.planning.request_latency import default_pricing
    assert default_pricing(H100, MODEL_31, measured=False) == (None, "closed form (asked for)")
    monkeypatch.setenv("INFERENCE_LAB_PROFILE", "auto")
    profile, words = default_pricing(H100, MODEL_31)
    assert cli(["latency", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pricing"] == words
