"""The device profiler: its grid, its budget (on a fake clock: nothing here is timed), the FLOPs behind each row,
the engine's own attention as the op it measures, and the file it writes, read back with plain gzip + json."""
import gzip
import json

import numpy as np
import pytest

from calculators.sizing.roofline import layer_ops
from engine.__main__ import _parser
from engine.instruments import profile_grid as grid
from engine.instruments.profile_cli import command_line
from engine.instruments.profile_file import COLUMNS, FORMAT, profile_document, slug, write_profile
from engine.instruments.profile_numpy import NumpyBackend, attention_pass
from engine.instruments.profile_timer import Budget, copies_for, cycling, median_seconds
from engine.instruments.profile_torch import datasheet_name
from engine.instruments.profiler import (attention_flops, best_bandwidth, best_rates, gemm_flops, measure_tables, plan,
                                         run_profile, shape_cost, time_shape)
from engine.model import forward, ops
from specs.presets import load_preset


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


# ============================================================================================ the grid
def test_powers_of_two_with_and_without_points_between():
    assert grid.powers_of_two(1, 2048) == [2 ** i for i in range(12)]
    assert grid.powers_of_two(1, 16, between=True) == [1, 2, 3, 4, 6, 8, 12, 16]


def test_engine_matrices_are_smollm2s_as_the_engine_multiplies_them():
    """Q/K/V fused (9·64 + 2·3·64 = 960 rows), gate/up fused (2·1536), W kept [out, in]."""
    assert grid.engine_matrices(load_preset("smollm2-135m")) == {
        "qkv_proj": (960, 576), "o_proj": (576, 576), "gate_up_proj": (3072, 576), "down_proj": (576, 1536),
        "lm_head": (49152, 576)}


def test_cpu_quick_grid_covers_every_m_for_the_models_matrices_and_stops_the_lm_head_at_256_rows():
    g = grid.cpu_grid(quick=True)
    ms = [m for d, m, n, k in g["gemm"] if (n, k) == (576, 1536)]
    assert ms == [2 ** i for i in range(12)]                              # M = 1..2048
    assert max(m for d, m, n, k in g["gemm"] if n == 49152) == grid.LM_HEAD_MAX_ROWS
    assert {(n, k) for d, m, n, k in g["gemm"]} >= {(1024, 1024), (2048, 2048), (960, 576), (3072, 576)}
    assert {d for d, *_ in g["gemm"]} == {"fp32"}
    for key in g["generation_attention"]:
        dtype, kv_dtype, b, s, h, kv, d, window = key
        assert (dtype, kv_dtype, h, kv, d, window) == ("fp32", "fp32", 9, 3, 64, 0)
        assert grid.kv_bytes(b, s, kv, d, 4) <= grid.CPU_DECODE_MAX_KV_BYTES
    assert (1, 8192) in {(k[2], k[3]) for k in g["generation_attention"]}
    assert {len(k) for k in g["context_attention"]} == {len(COLUMNS["context_attention"]) - 1}
    assert all(b * (p + t) <= 4096 for _, _, b, t, p, *_ in g["context_attention"])


def test_gpu_grid_spans_4096_to_57344_and_keeps_kv_within_memory():
    g = grid.gpu_grid(quick=True, memory_bytes=40e9)
    nk = {v for _, _, n, k in g["gemm"] for v in (n, k)} - {128256}
    assert min(nk) == 4096 and max(nk) == 57344
    assert max(m for _, m, *_ in g["gemm"]) == 16384
    assert {d for d, *_ in g["gemm"]} == {"bf16", "fp8"}
    decode = g["generation_attention"]
    assert {(h, kv, d) for *_, h, kv, d, _ in decode} == {(32, 8, 128), (4, 1, 128), (64, 8, 128), (8, 1, 128)}
    assert {b for _, _, b, *_ in decode} == set(grid.powers_of_two(1, 512))
    pairs = {(b, s) for _, _, b, s, h, kv, d, _ in decode if kv == 8}
    assert (1, 131072) in pairs and (512, 131072) not in pairs               # 275 GB of K/V does not fit
    assert all(grid.kv_bytes(b, s, kv, d, 2) <= 40e9 for _, _, b, s, h, kv, d, _ in decode)


# ============================================================================================ the timer and budget
def test_median_seconds_spends_its_budget_then_stops():
    clock = FakeClock()
    timing = median_seconds(lambda: clock.advance(0.01), 0.1, clock=clock)
    assert timing.seconds == pytest.approx(0.01)
    assert timing.calls == 1 and timing.samples == 9                      # warm-up 0.01 s, then 9 samples


def test_median_seconds_takes_three_samples_however_small_its_budget():
    clock = FakeClock()
    assert median_seconds(lambda: clock.advance(0.5), 0.0, clock=clock).samples == 3


def test_a_tiny_op_is_run_many_times_per_sample():
    clock = FakeClock()
    timing = median_seconds(lambda: clock.advance(1e-5), 0.05, clock=clock, sample_s=1e-3)
    assert timing.calls == 100 and timing.seconds == pytest.approx(1e-5)


def test_median_ignores_one_slow_sample():
    clock, times = FakeClock(), iter([0.01, 0.01, 0.5, 0.01, 0.01, 0.01])
    assert median_seconds(lambda: clock.advance(next(times)), 0.0, clock=clock, min_samples=5).seconds == pytest.approx(0.01)


def test_budget_shares_what_is_left():
    clock = FakeClock()
    b = Budget(10.0, clock)
    assert b.share(0.5, 1.0) == 5.0
    clock.advance(4.0)
    assert b.left() == 6.0 and b.share(1.0, 3.0) == 2.0
    clock.advance(20.0)
    assert b.left() == 0.0


def test_copies_make_a_cold_working_set():
    assert copies_for(1e6, 64e6) == 64 and copies_for(100e6, 64e6) == 1 and copies_for(10, 64e6) == 64
    calls = []
    fn = cycling([lambda: calls.append("a"), lambda: calls.append("b")])
    for _ in range(3):
        fn()
    assert calls == ["a", "b", "a"]


class FakeBackend:
    """Each op advances a fake clock by its shape's predicted time (1 s per GFLOP here)."""
    stack, stack_version = "numpy", "0"

    def __init__(self, clock, interrupt_at=None):
        self.clock, self.made, self.interrupt_at = clock, 0, interrupt_at

    def device_name(self):
        return "CPU: Test (2 cores)"

    def provenance(self):
        return {"device_name": self.device_name(), "cpu_model": "Test", "driver": None,
                "libraries": {"numpy": np.__version__, "blas": [], "torch": None, "cuda": None, "cudnn": None},
                "threads": 1}

    def supports(self, dtype):
        return dtype == "fp32"

    def sync(self):
        pass

    def release(self):
        pass

    def peaks(self, budget_s):
        self.clock.advance(budget_s)
        return 1e12, {"fp32": 1e9}

    def _op(self, seconds):
        self.made += 1
        if self.made == self.interrupt_at:
            raise KeyboardInterrupt
        return lambda: self.clock.advance(seconds)

    def gemm(self, dtype, m, n, k):
        return self._op(gemm_flops(m, n, k) / 1e9)

    def generation_attention(self, dtype, b, s, h, kv, d):
        return self._op(attention_flops(b, 1, s - 1, h, d) / 1e9)

    def context_attention(self, dtype, b, t, p, h, kv, d):
        return self._op(attention_flops(b, t, p, h, d) / 1e9)

    def launch(self):
        return {"tiny": lambda: self.clock.advance(1e-6)}


SMALL_GRID = {"gemm": [("fp32", m, 1000, 1000) for m in (1, 8, 64, 512)] + [("bf16", 1, 8, 8)],
              "generation_attention": [("fp32", "fp32", 1, s, 4, 2, 64, 0) for s in (128, 1024)],
              "context_attention": [("fp32", "fp32", 1, 64, 0, 4, 2, 64, 0)]}


def test_a_short_budget_measures_the_cheap_shapes_and_marks_the_rest_not_measured():
    clock = FakeClock()
    backend = FakeBackend(clock)
    planned = plan(backend, SMALL_GRID, 1e12, {"fp32": 1e9})
    assert [k[1] for k, _ in planned["gemm"]] == [1, 8, 64, 512]           # cheapest first; bf16 not run here
    out = measure_tables(backend, planned, Budget(0.5, clock), clock=clock)
    measured = [row[1] for row in out["rows"]["gemm"]]
    assert measured == [1, 8]                                              # m=64 (0.128 s a call) does not fit
    assert out["not_measured"]["gemm"] == 2
    assert all(row[-1] > 0 for rows in out["rows"].values() for row in rows)


def test_ctrl_c_keeps_what_was_measured():
    clock = FakeClock()
    backend = FakeBackend(clock, interrupt_at=3)
    out = measure_tables(backend, plan(backend, SMALL_GRID, 1e12, {"fp32": 1e9}), Budget(1e6, clock), clock=clock)
    assert out["stopped"] == "interrupted"
    assert len(out["rows"]["gemm"]) == 2 and out["not_measured"]["gemm"] == 2
    assert out["not_measured"]["context_attention"] == 1 and not out["rows"]["context_attention"]


def test_a_callable_running_several_ops_reports_the_time_of_one():
    """On a GPU one graph replay runs the op once per operand copy: the row is the replay's time / its calls."""
    clock = FakeClock()

    def replay():
        clock.advance(4 * 0.002)
    replay.ops_per_call = 4
    assert time_shape(FakeBackend(clock), lambda: replay, 0.1, clock) == pytest.approx(2.0)


# ============================================================================================ FLOPs behind the rows
def test_a_layers_products_and_attention_add_up_to_the_roofline_count():
    """SmolLM2, batch 4 decoding at context 1000: the grid's matrices at M = 4 rows plus decode attention over
    1000 keys are exactly the matmul and attention FLOPs calculators.sizing.roofline counts for one layer."""
    c = load_preset("smollm2-135m")
    B, S = 4, 1000
    ours = sum(gemm_flops(B, n, k) for op, (n, k) in grid.engine_matrices(c).items() if op != "lm_head")
    ours += shape_cost("generation_attention", ("fp32", "fp32", B, S, 9, 3, 64, 0))[0]
    theirs = sum(op.flops for op in layer_ops(c, 1, S, B, weight_dtype="fp32") if op.kind in ("matmul", "attention"))
    assert ours == theirs
    assert gemm_flops(64, 576, 1536) == 2 * 64 * 576 * 1536


def test_prefill_flops_count_the_full_rectangle_like_the_engine():
    c = load_preset("smollm2-135m")
    theirs = sum(op.flops for op in layer_ops(c, 256, 256 + 512, 1, weight_dtype="fp32") if op.kind == "attention")
    assert shape_cost("context_attention", ("fp32", "fp32", 1, 256, 512, 9, 3, 64, 0))[0] == theirs


def test_the_peaks_are_the_best_any_gemm_row_reached():
    rows = [("fp32", 1024, 1024, 1024, 20.0), ("fp32", 2048, 2048, 2048, 100.0), ("fp32", 1, 4096, 1024, 1.0)]
    assert best_rates(rows)["fp32"] == pytest.approx(2 * 2048 ** 3 / 0.1)
    assert best_bandwidth(rows) == pytest.approx(4 * (4096 * 1024 + 1024 + 4096) / 1e-3)    # the matvec


# ============================================================================================ the op measured
@pytest.mark.parametrize("batch,tokens,prefix", [(1, 1, 7), (2, 5, 3), (1, 6, 0)])
def test_the_attention_it_times_is_the_engines_causal_attention(batch, tokens, prefix):
    rng = np.random.default_rng(0)
    h_kv, G, d, S = 2, 3, 8, prefix + tokens
    q = rng.standard_normal((batch, h_kv, G, tokens, d), dtype=np.float32)
    K = rng.standard_normal((batch, h_kv, S, d), dtype=np.float32)
    V = rng.standard_normal((batch, h_kv, S, d), dtype=np.float32)
    got = forward.attention(q, K, V, 0, attention_pass(load_preset("smollm2-135m"), batch, tokens, prefix))
    scores = np.einsum("bhgtd,bhsd->bhgts", q, K) / np.sqrt(d)
    future = np.arange(S)[None, :] > (prefix + np.arange(tokens))[:, None]              # [T, S]
    scores[..., future] = -np.inf
    want = np.einsum("bhgts,bhsd->bhgtd", ops.softmax(scores), V)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_numpy_ops_have_the_shapes_asked_for():
    b = NumpyBackend()
    assert b.gemm("fp32", 3, 40, 16)().shape == (3, 40)
    assert b.generation_attention("fp32", 2, 10, 6, 2, 8)().shape == (2, 2, 3, 1, 8)
    assert b.supports("fp32") and not b.supports("bf16")


def test_gpu_names_map_to_datasheet_names():
    assert datasheet_name("NVIDIA H200") == "H200"
    assert datasheet_name("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert datasheet_name("NVIDIA H100 PCIe") == "H100 PCIe"
    assert datasheet_name("NVIDIA A100-SXM4-80GB") == "A100 SXM 80GB"
    assert datasheet_name("Mystery Accelerator 9000") is None


def test_torch_ops_dry_run_on_cpu():
    pytest.importorskip("torch")
    from engine.instruments.profile_torch import TorchBackend
    b = TorchBackend("cpu")
    assert tuple(b.gemm("bf16", 2, 32, 16)().shape) == (2, 32)
    assert tuple(b.context_attention("bf16", 1, 4, 4, 4, 2, 8)().shape) == (1, 4, 4, 8)
    calls = []
    b.cuda, b.graphed = True, lambda fn: fn                      # as on CUDA, capture aside: all calls per replay
    run = b.grouped([lambda i=i: calls.append(i) for i in range(3)])
    run()
    assert calls == [0, 1, 2] and run.ops_per_call == 3


# ============================================================================================ the file
def test_the_written_profile_has_the_exact_format(tmp_path):
    clock = FakeClock()
    doc = run_profile(FakeBackend(clock), budget_s=0.5, grid=SMALL_GRID, detail="python -m engine profile",
                      clock=clock)
    path = write_profile(doc, tmp_path / "p.json.gz")
    back = json.loads(gzip.decompress(path.read_bytes()))
    assert list(back) == ["format", "name", "device", "stack", "stack_version", "datasheet", "source",
                          "provenance", "tables"]
    assert back["format"] == FORMAT and back["name"] == "cpu-test-2c" and back["stack"] == "numpy"
    assert back["source"] == {"kind": "profiler", "version": "0.1.0", "detail": "python -m engine profile"}
    ds = back["datasheet"]
    assert ds["peak_flops"]["fp32"] > 0 and ds["memory_bandwidth_bytes_per_s"] == 1e12     # the probe's
    prov = back["provenance"]
    for key in ("device_name", "cpu_model", "driver", "libraries", "date", "host", "threads", "duration_s",
                "partial", "not_measured"):
        assert key in prov
    assert set(prov["libraries"]) == {"numpy", "blas", "torch", "cuda", "cudnn"}
    assert prov["date"].endswith("Z") and prov["partial"] is True and prov["not_measured"]["gemm"] == 2
    for name, t in back["tables"].items():
        assert t["columns"] == COLUMNS[name] and t["columns"][-1] == "ms"
        for row in t["rows"]:
            assert len(row) == len(t["columns"]) and isinstance(row[-1], float) and row[-1] > 0
            for col, v in zip(t["columns"], row):
                assert isinstance(v, str) if col in ("dtype", "kv_dtype", "kind") else isinstance(v, (int, float))
    assert [r[:4] for r in back["tables"]["gemm"]["rows"]] == [["fp32", 1, 1000, 1000], ["fp32", 8, 1000, 1000]]


def test_a_plain_json_name_writes_uncompressed(tmp_path):
    doc = profile_document(name="p", device="H200", stack="numpy", stack_version="2", detail="test",
                           provenance={}, tables={"launch": [("numpy_ufunc", 0.001)]})
    path = write_profile(doc, tmp_path / "sub" / "p.json")
    assert json.loads(path.read_text()) == doc and doc["format"] == FORMAT


def test_a_document_the_reader_would_refuse_is_not_written(tmp_path):
    """The profiler's files load by name: a document specs.profile_format would refuse (here the datasheet at the
    top level, as the first CPU profile was written) is one SpecError and no file."""
    from specs.model_config import SpecError
    bad = {"format": FORMAT, "name": "p", "device": "CPU: test", "stack": "numpy", "stack_version": "2",
           "memory_bandwidth_bytes_per_s": 1e10, "peak_flops": {"fp32": 1e11}, "source": {"kind": "profiler", "version": "1"},
           "provenance": {}, "tables": {}}
    with pytest.raises(SpecError, match="unknown device 'CPU: test'"):
        write_profile(bad, tmp_path / "p.json.gz")
    assert not (tmp_path / "p.json.gz").exists()


def test_the_command_line_spells_out_every_choice():
    args = _parser().parse_args(["profile", "--backend", "torch", "--budget-s", "420", "--full"])
    assert command_line(args) == "python -m engine profile --backend torch --device cuda --budget-s 420 --full"
    assert slug("CPU: AMD EPYC (2 cores)") == "cpu-amd-epyc-2-cores"


# ============================================================================================ the GPU step script
def test_step_grid_keeps_the_shapes_a_server_could_hold_in_memory():
    """Llama-3-70B in FP8 on an H200 (143 GB): 70.6 GB of weights leave room for about 156k tokens of bf16 K/V
    (320 KiB a token), so batch 16 at 4k fits and batch 64 at 4k does not; one 128k sequence does."""
    from tools.gpu_step_profile import LLAMA_70B, step_grid
    assert LLAMA_70B.weight_bytes(1) == pytest.approx(70.55e9, rel=1e-3)
    assert LLAMA_70B.kv_bytes_per_token() == 327680
    shapes = {(phase, b, ctx) for phase, b, t, ctx in step_grid(LLAMA_70B, "fp8", 143e9)}
    assert ("decode", 16, 4096) in shapes and ("decode", 64, 4096) not in shapes
    assert ("decode", 1, 131072) in shapes and ("prefill", 1, 32768) in shapes
