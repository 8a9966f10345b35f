"""The step's all-reduces priced from a profile's measured table, a borrowed profile's compute-bound work derated,
and the scheduler caps a published row's source configured (issue 36). Every profile here is written by the test
from a made-up efficiency law, so each expected value comes from that law and the datasheet, not from the code
under test."""
import json

import numpy as np
import pytest

from calculators.cli import main as cli
from calculators.multi_gpu.tensor_parallel import Mesh, _comm_per_stage_ms
from calculators.planning.measured_step import allreduces_per_stage, derated, measured_collectives
from calculators.planning.planner import SearchSpace, Workload, plan
from calculators.planning.published import caps
from calculators.planning.serve_at import serve_at
from calculators.planning.step import step_cost
from calculators.planning.throughput import deployment_defaults
from calculators.sizing.measured_ops import allreduce_roofline_ms, gemm_ms, gemm_roofline_ms
from specs.devices import device_link, load_device
from specs.presets import load_preset
from specs.profile_format import Profile
from specs.profiles import load_profile, save_profile
from specs.stacks import load_stack
from tests.calculators.test_measured_ops import profile_from_law
from tests.calculators.test_one_step_model import profile_path  # noqa: F401  (a fixture this module builds on)

H100 = load_device("h100")
LINK = device_link(H100)
MODEL = load_preset("llama-3-8b")
VLLM = load_stack("vllm")
SIZES = 2.0 ** np.arange(10, 30)          # message bytes the made-up table measures: 1 KiB .. 512 MiB


def ar_law(message_bytes):
    """A made-up all-reduce efficiency against the link's ring roofline: 5% at 1 KiB rising to 80%."""
    return np.clip(0.05 + 0.075 * np.log2(np.asarray(message_bytes, dtype=float) / 1024), 0.05, 0.8)


def allreduce_table(gpus=(2, 4, 8)) -> dict:
    b = np.tile(SIZES, len(gpus))
    g = np.repeat(np.asarray(gpus, dtype=float), len(SIZES))
    return dict(dtype=np.full(len(b), "bf16"), bytes=b, gpus=g, kind=np.full(len(b), "custom"),
                ms=allreduce_roofline_ms(LINK.bytes_per_s, b, g) / ar_law(b))


@pytest.fixture(scope="module")
def ar_profile_path(profile_path, tmp_path_factory):  # noqa: F811
    """The one-step test's H100 profile with an all-reduce table added."""
    p = load_profile(profile_path)
    path = tmp_path_factory.mktemp("ar") / "test-h100-ar.json.gz"
    save_profile(Profile(name="test-h100-ar", device=p.device, stack=p.stack, stack_version=p.stack_version,
                         source=p.source, provenance=p.provenance,
                         tables=dict(p.tables, allreduce=allreduce_table())), path)
    return str(path)


def test_a_dense_layer_runs_two_all_reduces_and_wide_ep_one_plus_the_dense_ffns():
    assert allreduces_per_stage(MODEL, Mesh(tp=4)) == 2 * MODEL.num_layers
    assert allreduces_per_stage(MODEL, Mesh(tp=4, pp=2, gpus=8)) == MODEL.num_layers    # half the layers each
    assert allreduces_per_stage(MODEL, Mesh(tp=1)) == 0


def test_the_stage_all_reduces_are_the_measured_ones_at_every_measured_size(ar_profile_path):
    """Tokens whose [tokens, D] bf16 message is a measured size: the stage's collectives are exactly
    2 × layers × (the roofline / the law's efficiency); the closed form's were something else."""
    prof = load_profile(ar_profile_path)
    mesh = Mesh(tp=4)
    tokens = np.array([1.0, 16.0, 256.0, 4096.0])                 # × 4096 × 2 bytes = 8 KiB .. 32 MiB
    closed = np.array([_comm_per_stage_ms(MODEL, mesh, int(t), LINK, VLLM) for t in tokens])
    got = measured_collectives(prof, MODEL, mesh, LINK, VLLM, tokens, closed)
    message = tokens * MODEL.hidden_size * 2.0
    want = 2 * MODEL.num_layers * allreduce_roofline_ms(LINK.bytes_per_s, message, 4) / ar_law(message)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert not np.allclose(got, closed, rtol=0.05)


def test_without_an_all_reduce_table_or_tensor_parallelism_the_closed_form_stands(profile_path):  # noqa: F811
    tokens = np.array([1.0, 64.0])
    assert measured_collectives(load_profile(profile_path), MODEL, Mesh(tp=2), LINK, VLLM, tokens, tokens) is None
    assert measured_collectives(load_profile(profile_path), MODEL, Mesh(), LINK, VLLM, tokens, tokens) is None


def test_latency_serve_at_and_the_planner_price_the_measured_all_reduces_alike(capsys, ar_profile_path):
    """The same TP-2 decode and prefill through the `latency` CLI, `serve-at` at a rate where requests never
    meet and the planner: within 2% of each other, and the CLI's step carries the measured all-reduces."""
    P, O = 2000, 300
    code = cli(["latency", "--model", "llama-3-8b", "--gpu", "h100", "--tp", "2", "--tokens", str(P),
                "--output-tokens", str(O), "--profile", ar_profile_path, "--json"])
    lat = json.loads(capsys.readouterr().out)
    assert code == 0
    prof = load_profile(ar_profile_path)
    mesh = Mesh(tp=2, gpus=2)
    quiet = serve_at(MODEL, H100, mesh, 1e-4, P, O, profile=prof)
    assert quiet["ttft_p50_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)
    assert quiet["tpot_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    wl = Workload(requests_per_s=1e-3, prompt_tokens=P, output_tokens=O, ttft_p99_ms=1e5, itl_ms=1e4)
    space = SearchSpace(gpu_counts=(2,), tp=(2,), pp=(1,), batch_caps=(1,), weight_dtypes=("bf16",),
                        kv_dtypes=("bf16",))
    one = plan(MODEL, [H100], wl, space, profile=prof).find(H100.name, 2, 2, 1, 1, "bf16", "bf16")[0]
    assert one["prefill_ms"] == pytest.approx(lat["ttft_ms"], rel=0.02)
    assert one["itl_ms"] == pytest.approx(lat["itl_ms"], rel=0.02)
    # the decode step's collectives are the law's: one token's 8 KiB message, 2 × 32 all-reduces
    kd, _, eff, lk = deployment_defaults(H100, mesh, "bf16", None, VLLM, None, None, None, MODEL)
    step = step_cost(MODEL, H100, mesh, "bf16", kd, eff, lk, VLLM, P + O // 2, P, profile=prof)
    b = MODEL.hidden_size * 2.0
    want = 2 * MODEL.num_layers * allreduce_roofline_ms(LINK.bytes_per_s, b, 2) / ar_law(b)
    assert float(step.parts(1, 0)["comm_ms"]) == pytest.approx(float(want), rel=0.01)


def test_a_derated_device_slows_compute_bound_gemms_by_the_scale_and_leaves_memory_bound_ones():
    """A borrowed profile's efficiencies read against peaks divided by 2: a 16,384-token GEMM (compute-bound)
    takes twice the time, a one-token GEMV (memory-bound) the same; the datasheet is untouched."""
    p = profile_from_law("H100")
    slow = derated(H100, 2.0)
    assert slow.peak("bf16") == H100.peak("bf16") / 2 and slow.memory_bandwidth_bytes_per_s == \
        H100.memory_bandwidth_bytes_per_s
    assert derated(H100, 1.0) is H100
    big = gemm_ms(p, slow, 16384, 4096, 4096).ms / gemm_ms(p, H100, 16384, 4096, 4096).ms
    assert big == pytest.approx(float(gemm_roofline_ms(slow, 16384, 4096, 4096, "bf16")
                                      / gemm_roofline_ms(H100, 16384, 4096, 4096, "bf16")), rel=1e-9)
    assert big == pytest.approx(2.0, rel=1e-9)
    assert gemm_ms(p, slow, 1, 4096, 4096).ms == pytest.approx(gemm_ms(p, H100, 1, 4096, 4096).ms, rel=1e-9)


def test_a_memory_derate_slows_memory_bound_gemms_by_its_scale_and_leaves_compute_bound_ones():
    """Bandwidth divided by 1.5: the one-token GEMV (memory-bound: bytes over bandwidth) takes 1.5x, the
    16,384-token GEMM (compute-bound) the same, the peaks untouched; both scales at once compose."""
    p = profile_from_law("H100")
    slow = derated(H100, 1.0, 1.5)
    assert slow.memory_bandwidth_bytes_per_s == H100.memory_bandwidth_bytes_per_s / 1.5
    assert slow.peak("bf16") == H100.peak("bf16")
    assert gemm_ms(p, slow, 1, 4096, 4096).ms / gemm_ms(p, H100, 1, 4096, 4096).ms == pytest.approx(1.5, rel=1e-9)
    assert gemm_ms(p, slow, 16384, 4096, 4096).ms == pytest.approx(gemm_ms(p, H100, 16384, 4096, 4096).ms, rel=1e-9)
    both = derated(H100, 2.0, 1.5)
    assert gemm_ms(p, both, 1, 4096, 4096).ms / gemm_ms(p, H100, 1, 4096, 4096).ms == pytest.approx(1.5, rel=1e-9)
    assert gemm_ms(p, both, 16384, 4096, 4096).ms / gemm_ms(p, H100, 16384, 4096, 4096).ms == \
        pytest.approx(2.0, rel=1e-9)


def test_a_rows_stated_caps_reach_the_prediction():
    """A published vLLM row that states max num seqs alone (AMD's MLPerf Llama-2-70B, 1,792) is predicted with that
    cap, and a stated token budget joins it: a cap of 8 holds the batch at 8 and the throughput far below the
    stack's default of 1,024 sequences."""
    from calculators.planning.published import load_rows, predict
    row = next(r for r in load_rows() if r["max_num_seqs"] and not r["max_num_batched_tokens"]
               and r["mode"] == "offline" and r["stack"] == "vllm")
    assert caps(row) == {"max_num_seqs": int(row["max_num_seqs"])}
    assert caps(dict(row, max_num_batched_tokens="4096")) == {"max_num_seqs": int(row["max_num_seqs"]),
                                                              "max_num_batched_tokens": 4096}
    assert caps(dict(row, max_num_seqs="", max_num_batched_tokens="")) == {}
    free = predict(dict(row, max_num_seqs="", requests=""))
    held = predict(dict(row, max_num_seqs="8", requests=""))
    assert held < 0.25 * free


def test_a_server_rows_stated_caps_reach_the_rate_it_can_serve():
    """MLPerf Server rows are priced by `max_rate_under_slo`: a source's max num seqs reaches it too (it did not
    until 29 Nov 2026). Llama-2-70B FP8 on 8 H200, closed form: 8 sequences per replica serve far fewer
    requests/s under the same p99 limits than the stack's default cap."""
    from calculators.planning.published import load_rows, predict
    row = next(r for r in load_rows() if r["mode"] == "server" and r["ttft_p99_ms"] and r["device"] == "h200"
               and r["model"] == "llama-2-70b")
    free = predict(dict(row, max_num_seqs="", max_num_batched_tokens=""))
    held = predict(dict(row, max_num_seqs="8", max_num_batched_tokens=""))
    assert held < 0.25 * free
