"""Wide expert parallelism (attention data-parallel, the experts spread over the replicas' GPUs) priced from
measured kernels (issue 36): each MoE layer's dispatch and combine from the profile's all-to-all table (DeepEP), and
the fused MoE read at the tokens of the whole EP group. The made-up tables here follow a law the test states, so
each expected value comes from that law and the datasheet; the real B200 profile is checked against its own
parquet files, read here with pandas (skipped without aiconfigurator-core)."""
from dataclasses import replace

import numpy as np
import pytest

from calculators.multi_gpu.moe import dispatch_copies_per_token, moe_layer_comm_ms
from calculators.multi_gpu.tensor_parallel import Mesh, expert_imbalance_for
from calculators.planning.measured_step import (dispatch_format, experts_fan_in, measured_a2a_ms,
                                                measured_collectives, moe_layers_per_stage)
from calculators.sizing.measured_ops import a2a_roofline_ms, moe_a2a_ms
from specs.devices import device_link, load_device
from specs.presets import load_preset
from specs.model_config import SpecError
from specs.stacks import load_stack

B200 = load_device("b200")
LINK = device_link(B200)
R1 = load_preset("deepseek-r1")
TRT = load_stack("trtllm")
DEEPEP = replace(TRT, doc={**TRT.doc, "moe_dp_comm": "all_to_all"})     # a stack configured to run DeepEP
TOKENS = 2.0 ** np.arange(0, 15)                         # 1 .. 16,384 tokens per GPU measured
WIDE = Mesh(tp=1, ep=8, gpus=8)


def law(tokens, phase):
    """A made-up all-to-all efficiency against the link's roofline: 1% at one token rising to 60% (dispatch) or
    45% (combine)."""
    top = 0.6 if phase == "dispatch" else 0.45
    return np.clip(0.01 * np.asarray(tokens, dtype=float) ** 0.5, 0.01, top)


def a2a_profile():
    """A profile with only an all-to-all table: both phases at EP 8 for DeepSeek-R1's shape, dispatch in NVFP4 and
    bf16, combine in bf16, each measured by a fast backend (the law) and a slow one (3× the law's time)."""
    from types import SimpleNamespace
    rows = {c: [] for c in ("backend", "phase", "dtype", "ep", "nodes", "hidden", "topk", "experts", "tokens",
                            "sms", "kernel", "ms")}
    for phase, dtype in (("dispatch", "nvfp4"), ("dispatch", "bfloat16"), ("combine", "bfloat16")):
        for backend, slow in (("ht", 1.0), ("ll", 3.0)):
            for t in TOKENS:
                ms = float(a2a_roofline_ms(LINK.bytes_per_s, t, 7168, 8, 256, 8, dtype) / law(t, phase)) * slow
                for col, v in zip(rows, (backend, phase, dtype, 8, 1, 7168, 8, 256, t, 0, "deepep", ms)):
                    rows[col].append(v)
    return SimpleNamespace(name="law-a2a", device=B200.name, tables={"moe_a2a": {k: np.asarray(v)
                                                                               for k, v in rows.items()}})


def test_the_roofline_sends_each_token_once_to_each_distinct_remote_gpu():
    """1,024 tokens of 7,168 NVFP4 values (4.5 bits each with the scales) to 7 × (1 − C(224, 8)/C(256, 8)) remote
    GPUs, over NVLink 5's 900 GB/s one way."""
    from math import comb
    copies = 7 * (1 - comb(224, 8) / comb(256, 8))
    want = 1024 * copies * 7168 * 0.5625 / 900e9 * 1e3
    assert float(a2a_roofline_ms(LINK.bytes_per_s, 1024, 7168, 8, 256, 8, "nvfp4")) == pytest.approx(want, rel=1e-12)
    assert copies == pytest.approx(dispatch_copies_per_token(256, 8, 8), rel=1e-12)


def test_a_measured_size_comes_back_from_the_fastest_backend_and_between_sizes_in_log():
    p = a2a_profile()
    for t in (1.0, 64.0, 4096.0):
        got = moe_a2a_ms(p, LINK.bytes_per_s, t, 7168, 8, 256, 8, "combine", "bfloat16")
        want = float(a2a_roofline_ms(LINK.bytes_per_s, t, 7168, 8, 256, 8, "bfloat16") / law(t, "combine"))
        assert got.ms == pytest.approx(want, rel=1e-9) and not got.extrapolated     # the slow backend set aside
    mid = moe_a2a_ms(p, LINK.bytes_per_s, np.sqrt(64 * 128), 7168, 8, 256, 8, "dispatch", "nvfp4")
    assert mid.efficiency == pytest.approx(np.sqrt(law(64, "dispatch") * law(128, "dispatch")), rel=1e-9)
    assert moe_a2a_ms(p, LINK.bytes_per_s, 64.0, 7168, 8, 256, 8, "combine", "fp8") is None    # not measured
    past = moe_a2a_ms(p, LINK.bytes_per_s, 64.0, 7168, 8, 256, 16, "combine", "bfloat16")
    assert past.extrapolated                                  # EP 16 was never measured: marked


def test_wide_ep_collectives_are_the_measured_dispatch_and_combine_in_every_moe_layer():
    """Where the EP group spans the replicas and the stack runs DeepEP's all-to-all, the stage's collectives become
    the closed form's with each MoE layer's all-to-alls replaced: moe_layers × (dispatch in NVFP4 for FP4 experts +
    combine in bf16), both from the law; the closed form's were several times less. EP inside the TP group runs no
    all-to-all: nothing measured to put in (None, the closed form stands)."""
    p, tokens = a2a_profile(), np.array([1.0, 128.0, 1024.0, 4096.0])
    closed_a2a = np.array([moe_layer_comm_ms(int(t), R1, 8, LINK, 0.5625,
                                             imbalance=expert_imbalance_for(R1, WIDE, int(t), None))
                           for t in tokens])
    closed = 5.0 + moe_layers_per_stage(R1, WIDE) * closed_a2a           # 5 ms of other collectives kept
    got = measured_collectives(p, R1, WIDE, LINK, DEEPEP, tokens, closed, "fp4")
    per_layer = (a2a_roofline_ms(LINK.bytes_per_s, tokens, 7168, 8, 256, 8, "nvfp4") / law(tokens, "dispatch")
                 + a2a_roofline_ms(LINK.bytes_per_s, tokens, 7168, 8, 256, 8, "bfloat16") / law(tokens, "combine"))
    np.testing.assert_allclose(got, 5.0 + 58 * per_layer, rtol=1e-9)
    assert moe_layers_per_stage(R1, WIDE) == 58                          # 61 layers, the first 3 dense
    closed16 = 5.0 + 58 * np.array([moe_layer_comm_ms(int(t), R1, 8, LINK, 2.0,
                                                      imbalance=expert_imbalance_for(R1, WIDE, int(t), None))
                                    for t in tokens])
    bf16 = measured_collectives(p, R1, WIDE, LINK, DEEPEP, tokens, closed16, "fp8")  # FP8 experts send 16 bits
    assert np.all(bf16 > got)
    assert measured_collectives(p, R1, Mesh(tp=8, ep=8), LINK, DEEPEP, tokens, closed, "fp4") is None
    assert measured_collectives(p, R1, WIDE, LINK, TRT, tokens, closed, "fp4") is None   # TRT-LLM gathers: unmeasured
    assert dispatch_format("fp4") == "nvfp4" and dispatch_format("bf16") == "bfloat16"


def ring_law(size):
    """A made-up all-gather / reduce-scatter efficiency against the ring's wire time: 2% at 1 KiB rising to 70%."""
    return np.clip(0.02 * (np.asarray(size, dtype=float) / 1024) ** 0.4, 0.02, 0.7)


def ring_profile():
    """A profile with only NCCL all-gather and reduce-scatter tables on 8 GPUs (1 KiB to 1 GiB), at the law."""
    from types import SimpleNamespace
    sizes = 2.0 ** np.arange(10, 31)
    tables = {}
    for name, slow in (("allgather", 1.0), ("reduce_scatter", 1.5)):
        ms = sizes * 7 / 8 / LINK.bytes_per_s * 1e3 / ring_law(sizes) * slow
        tables[name] = {"dtype": np.array(["fp16"] * len(sizes)), "bytes": sizes, "gpus": np.full(len(sizes), 8.0),
                        "kind": np.array(["nccl"] * len(sizes)), "ms": ms}
    return SimpleNamespace(name="law-ring", device=B200.name, tables=tables)


def test_the_closed_form_gather_scatter_is_two_ring_passes_over_the_groups_tokens():
    """TensorRT-LLM, vLLM and SGLang by default (`Stack.moe_dp_comm`): each of the 8 GPUs gathers 8 × 512 tokens
    of 7,168 values (NVFP4, 0.5625 bytes, ahead of FP4 experts) and reduce-scatters 8 × 512 bf16 outputs; each
    ring pass costs alpha_base + 7 hops + 7/8 of the buffer at the link's one-way bandwidth. Routing imbalance does
    not move it (every GPU gets every token)."""
    from calculators.multi_gpu.moe import exchange_bytes, gather_scatter_bytes
    n = 8 * 512 * 7168
    def ring(b):
        return (LINK.alpha_base_s + 7 * LINK.alpha_per_hop_s + 7 / 8 * b / LINK.bytes_per_s) * 1e3
    want = ring(n * 0.5625) + ring(n * 2)
    for imbalance in (1.0, 1.4):
        got = moe_layer_comm_ms(512, R1, 8, LINK, exchange_bytes("fp4"), imbalance, method="allgather_reducescatter")
        assert got == pytest.approx(want, rel=1e-12)
    assert gather_scatter_bytes(512, R1, 8, 2) == (n * 2, n * 2)
    assert exchange_bytes("fp4") == 0.5625 and exchange_bytes("fp8") == 2.0
    assert {load_stack(k).moe_dp_comm for k in ("trtllm", "vllm", "sglang")} == {"allgather_reducescatter"}
    with pytest.raises(SpecError):
        moe_layer_comm_ms(512, R1, 8, LINK, method="broadcast")
    with pytest.raises(SpecError):
        _ = replace(TRT, doc={**TRT.doc, "moe_dp_comm": "broadcast"}).moe_dp_comm


def test_wide_ep_collectives_of_a_gathering_stack_are_the_measured_all_gather_and_reduce_scatter():
    """TensorRT-LLM's exchange priced from the NCCL tables: per MoE layer, the all-gather of the group's tokens in
    NVFP4 and the reduce-scatter of its bf16 outputs, each at the law's efficiency of its buffer, in place of the
    closed form's; a profile without them (the all-to-all one) leaves the closed form."""
    from calculators.multi_gpu.moe import exchange_bytes
    from calculators.planning.measured_step import measured_gather_scatter_ms
    p, tokens = ring_profile(), np.array([1.0, 128.0, 1024.0, 4096.0])
    closed_layer = np.array([moe_layer_comm_ms(int(t), R1, 8, LINK, exchange_bytes("fp4"),
                                               method="allgather_reducescatter") for t in tokens])
    closed = 5.0 + 58 * closed_layer
    got = measured_collectives(p, R1, WIDE, LINK, TRT, tokens, closed, "fp4")
    gathered, scattered = tokens * 8 * 7168 * 0.5625, tokens * 8 * 7168 * 2
    per_layer = (gathered * 7 / 8 / LINK.bytes_per_s * 1e3 / ring_law(gathered)
                 + 1.5 * scattered * 7 / 8 / LINK.bytes_per_s * 1e3 / ring_law(scattered))
    np.testing.assert_allclose(got, 5.0 + 58 * per_layer, rtol=1e-9)
    np.testing.assert_allclose(measured_gather_scatter_ms(p, R1, WIDE, LINK, "fp4", tokens), per_layer, rtol=1e-9)
    assert measured_collectives(a2a_profile(), R1, WIDE, LINK, TRT, tokens, closed, "fp4") is None


def test_one_gpus_experts_see_the_tokens_of_every_replica_in_its_ep_group():
    assert experts_fan_in(WIDE) == 8 and experts_fan_in(Mesh(tp=2, ep=8, gpus=8)) == 4
    assert experts_fan_in(Mesh(tp=8, ep=8)) == 1 and experts_fan_in(Mesh(tp=4)) == 1


# ------------------------------------------------------------------------------------------ the real B200 profile
@pytest.fixture(scope="module")
def b200():
    from specs import aiconfigurator_source as aic
    if aic.package_dir() is None or not aic.readers_installed():
        pytest.skip("aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
    from calculators.planning.measured_step import resolve_profile
    prof, words = resolve_profile("auto", B200, "trtllm", R1)
    assert prof is not None, words
    return prof, aic.package_dir() / "systems" / "data" / "b200_sxm"


def _fastest(df, **equal):
    for k, v in equal.items():
        df = df[df[k] == v]
    assert len(df), equal
    return float(df.latency.min())


def test_the_real_b200_all_to_all_is_deepeps_measured_dispatch_and_combine(b200):
    """1,024 tokens per GPU, EP 8: the fastest dispatch measured in NVFP4 plus the fastest combine in bf16, read
    from the package's parquet here (µs there, ms in the step)."""
    pd = pytest.importorskip("pandas")
    prof, data = b200
    df = pd.concat([pd.read_parquet(p) for p in data.glob("comm/trtllm/*/moe_a2a_perf.parquet")])
    shape = dict(ep_size=8, node_num=1, hidden_size=7168, topk=8, num_experts=256, num_tokens=1024)
    want = (_fastest(df, phase="dispatch", comm_dtype="nvfp4", **shape)
            + _fastest(df, phase="combine", comm_dtype="bfloat16", **shape)) / 1e3
    got = measured_a2a_ms(prof, R1, WIDE, LINK, "fp4", np.array([1024.0]))
    assert float(got[0]) == pytest.approx(want, rel=1e-6)
    assert 0.3 < want < 1.5                                   # DeepEP's order of magnitude, in ms


def test_the_real_b200_fused_moe_of_a_wide_ep_step_reads_the_whole_groups_tokens(b200):
    """A replica's step of 512 tokens: its GPU's experts take the 8 replicas' 4,096 tokens, so the op is the
    package's fastest NVFP4 EP-8 fused MoE that TensorRT-LLM runs by default (not its min-latency kernel, faster
    under this skew but opt-in) at aiconfigurator's default routing (power law 1.01) at 4,096 tokens (not at 512:
    a third less) in each MoE layer."""
    pd = pytest.importorskip("pandas")
    from calculators.planning.measured_step import step_ops_table
    prof, data = b200
    df = pd.concat([pd.read_parquet(p) for p in data.glob(f"moe/trtllm/{prof.stack_version}/moe_perf.parquet")])
    shape = dict(moe_dtype="nvfp4", hidden_size=7168, inter_size=2048, num_experts=256, topk=8, moe_tp_size=1,
                 moe_ep_size=8, distribution="power_law_1.01")
    default = df[~df.kernel_source.str.contains("min_latency")]     # TensorRT-LLM's opt-in min-latency kernel
    at_group, at_replica = _fastest(default, num_tokens=4096, **shape), _fastest(default, num_tokens=512, **shape)
    assert _fastest(df, num_tokens=4096, **shape) < 0.7 * at_group    # which it measured faster, here
    ops = step_ops_table(prof, R1, B200, WIDE, "fp4", "fp8", 512, 2048.0)
    moe = next(r for r in ops if r["op"].startswith("routed experts"))
    assert moe["measured_ms"] == pytest.approx(58 * at_group, rel=1e-6)
    assert at_group > 1.3 * at_replica and "× 8 replicas" in moe["shape"]


def test_the_real_b200_wide_ep_step_prices_its_weights_as_its_ops_table_shows(b200):
    """The step's grid (what every command prices) and the ops table (what the page shows) read the fused MoE at
    the same group's tokens: their GEMMs, experts included, agree at 512 rows."""
    from calculators.planning.measured_step import step_grid_tables, step_ops_table
    prof, _ = b200
    grid = step_grid_tables(prof, R1, B200, WIDE, "fp4", "fp8", 2048.0, 1024.0, np.array([512.0]))
    ops = step_ops_table(prof, R1, B200, WIDE, "fp4", "fp8", 512, 2048.0)
    weights = sum(r["measured_ms"] for r in ops if "attention" not in r["op"] and r["op"] != "LM head"
                  and not r["op"].startswith("norms"))
    assert float(grid["gemm"][0]) == pytest.approx(weights, rel=1e-6)


def test_the_planners_wide_ep_rows_price_as_serve_at_does_from_the_same_kernels():
    """DeepSeek-R1 on 8 H200 in FP8 at 4 requests/s (the wide-EP planner test's lengths), priced from the H200
    TensorRT-LLM profile: each wide-EP row the planner ranks carries serve-at's figures for its layout, cap and
    rate within 1%, and they are not the closed form's (its decode step at the batch cap is 20% off or more)."""
    from specs import aiconfigurator_source as aic
    if aic.package_dir() is None or not aic.readers_installed():
        pytest.skip("aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
    from calculators.planning.planner import SearchSpace, Workload, plan, plan_rows
    from calculators.planning.serve_at import serve_at
    h200 = load_device("h200")
    wl = Workload(requests_per_s=4.0, prompt_tokens=1000, output_tokens=2000, ttft_p99_ms=3000, itl_ms=150)
    space = SearchSpace(gpu_counts=(8,), tp=(1, 2, 8), pp=(1,), batch_caps=(64, 256), weight_dtypes=("fp8",),
                        kv_dtypes=("fp8",))
    rows = {p: [r for r in plan_rows(plan(R1, [h200], wl, space, stack="trtllm", profile=p), 40) if r["dp"] > 1]
            for p in (None, "auto")}
    assert rows["auto"]
    from calculators.planning.measured_step import resolve_profile
    prof, _ = resolve_profile("auto", h200, "trtllm", R1)
    for r in rows["auto"][:3]:
        s = serve_at(R1, h200, Mesh(tp=r["tp"], ep=r["ep"], gpus=r["gpus"]), 4.0, wl.prompt_lengths(),
                     wl.output_lengths(), "fp8", "fp8", "trtllm", max_num_seqs=r["batch_cap"], with_capacity=False,
                     profile=prof)
        assert "measured kernels" in s["priced_from"]
        for mine, theirs in (("itl_at_load_ms", "tpot_ms"), ("step_ms_at_load", "step_ms"),
                             ("ttft_p99_ms", "ttft_p99_ms")):
            assert r[mine] == pytest.approx(s[theirs], rel=0.01), mine
    pairs = [(c, r) for r in rows["auto"] for c in rows[None] if (c["tp"], c["batch_cap"]) == (r["tp"], r["batch_cap"])]
    assert pairs and all(abs(c["itl_ms"] / r["itl_ms"] - 1) > 0.2 for c, r in pairs)     # the step at its cap


def test_the_all_to_all_curves_read_the_law_back_and_their_caption_quotes_them():
    """The Measured kernels page's all-to-all curves on the made-up table: at each measured size the efficiency is
    the law's; the caption quotes 1,024 tokens' times and shares from those curves; a dense model gets none."""
    from calculators.planning.measured_curves import a2a_caption, a2a_curves
    curves = a2a_curves(a2a_profile(), B200, R1, "fp4")
    assert [c.label for c in curves] == ["dispatch, EP 8 (nvfp4)", "combine, EP 8 (bfloat16)"]
    for c, phase in zip(curves, ("dispatch", "combine")):
        np.testing.assert_allclose(c.efficiency, law(c.x, phase), rtol=1e-9)
    i = list(curves[0].x).index(1024.0)
    text = a2a_caption(curves, "NVLink 5")
    d_us, c_us = curves[0].ms[i] * 1e3, curves[1].ms[i] * 1e3
    assert f"dispatch {d_us:,.3g} µs ({100 * law(1024, 'dispatch'):.0f}% of the link)" in text
    assert f"combine {c_us:,.3g} µs ({100 * law(1024, 'combine'):.0f}% of the link)" in text
    assert "the best any size reaches is 60% (dispatch, EP 8)" in text
    assert a2a_curves(a2a_profile(), B200, load_preset("llama-3.1-8b")) == []


def test_the_gather_scatter_curves_read_the_law_back_and_the_captions_say_which_exchange_the_stack_runs():
    """The Measured kernels page's all-gather / reduce-scatter curves on the made-up NCCL tables: the all-gather's
    efficiency is the law's, the reduce-scatter's the law's / 1.5; the caption quotes the 16 MiB buffer and says
    TensorRT-LLM exchanges this way; the all-to-all caption then says DeepEP is opt-in, and for a stack set to
    DeepEP that the planner prices wide EP with it."""
    from calculators.planning.measured_curves import a2a_caption, a2a_curves, gather_scatter_caption, \
        gather_scatter_curves
    curves = gather_scatter_curves(ring_profile(), B200)
    assert [c.label for c in curves] == ["all-gather, 8 GPUs", "reduce-scatter, 8 GPUs"]
    np.testing.assert_allclose(curves[0].efficiency, ring_law(curves[0].x), rtol=1e-9)
    np.testing.assert_allclose(curves[1].efficiency, ring_law(curves[1].x) / 1.5, rtol=1e-9)
    text = gather_scatter_caption(curves, "NVLink 5", TRT.name, TRT.moe_dp_comm)
    i = list(curves[0].x).index(float(1 << 24))
    from calculators.units import fmt_bytes
    assert text.startswith(f"A {fmt_bytes(1 << 24, binary=True)} buffer on 8 GPUs of NVLink 5")
    assert f"({100 * ring_law(1 << 24):.0f}% of the ring's wire time)" in text
    assert f"{curves[0].ms[i] * 1e3:,.3g} µs" in text and "TensorRT-LLM moves a wide-EP MoE layer's tokens" in text
    assert "DeepEP's all-to-all instead" in gather_scatter_caption(curves, "NVLink 5", "X", "all_to_all")
    a2a = a2a_curves(a2a_profile(), B200, R1, "fp4")
    assert "DeepEP is opt-in" in a2a_caption(a2a, "NVLink 5", TRT.moe_dp_comm)
    assert "The planner prices wide EP with these" in a2a_caption(a2a, "NVLink 5", DEEPEP.moe_dp_comm)
    assert gather_scatter_curves(a2a_profile(), B200) == []


def test_a_wide_ep_candidate_in_a_format_no_profile_measures_is_priced_by_the_closed_form_not_dropped():
    """INT4 weights (weight-only kernels no profile measures) next to FP8 in one search with measured kernels: the
    wide-EP INT4 rows carry the closed form's figures (the same search without a profile), and the FP8 ones the
    profile's; before, the whole search stopped on "no GEMM table for int4"."""
    from helpers_profiles import qwen3_moe_fp8_slow_profile
    from calculators.planning.planner import SearchSpace, Workload, plan
    profile, qwen = qwen3_moe_fp8_slow_profile("h200-int4-fallback")
    h200 = load_device("h200")
    wl = Workload(requests_per_s=4.0, prompt_tokens=1000, output_tokens=200, ttft_p99_ms=1e5, itl_ms=1e4)
    space = SearchSpace(gpu_counts=(8,), tp=(1,), pp=(1,), batch_caps=(64,), weight_dtypes=("fp8", "int4"),
                        kv_dtypes=("fp8",))
    measured, closed = (plan(qwen, [h200], wl, space, stack="trtllm", profile=p) for p in (profile, None))
    for wd, same in (("int4", True), ("fp8", False)):
        (m,) = measured.find(h200.name, 8, 1, 1, 64, wd, "fp8", ep=8)
        (c,) = closed.find(h200.name, 8, 1, 1, 64, wd, "fp8", ep=8)
        assert (m["itl_ms"] == pytest.approx(c["itl_ms"], rel=1e-12)) == same, wd


def test_with_attention_tp_inside_a_replica_each_gpu_exchanges_its_share_of_the_replicas_tokens():
    """TP 2 × DP 4 with EP 8: a replica's 512 tokens are held by its 2 GPUs after attention's all-reduce and each
    sends 256, so the group gathers 8 × 256 tokens (not 8 × 512). The stage's collectives, by hand: per layer the
    TP all-reduce of [512, 7,168], and per MoE layer the gather (NVFP4) and scatter (bf16) of that buffer."""
    from calculators.multi_gpu.collectives import allreduce_ms
    from calculators.multi_gpu.parallel import tp_allreduce_bytes
    from calculators.multi_gpu.tensor_parallel import _comm_per_stage_ms, exchange_tokens
    m2 = Mesh(tp=2, ep=8, gpus=8)
    assert exchange_tokens(512, m2) == 256 and exchange_tokens(1, m2) == 1 and exchange_tokens(512, WIDE) == 512

    def ring(b):
        return (LINK.alpha_base_s + 7 * LINK.alpha_per_hop_s + 7 / 8 * b / LINK.bytes_per_s) * 1e3
    ar = allreduce_ms(tp_allreduce_bytes(7168, 512), 2, LINK, TRT)
    vectors = 8 * 256 * 7168
    want = 61 * ar + 3 * ar + 58 * (ring(vectors * 0.5625) + ring(vectors * 2))
    assert _comm_per_stage_ms(R1, m2, 512, LINK, TRT, 1.0, "fp4") == pytest.approx(want, rel=1e-12)


def test_the_ops_command_shows_one_replicas_step_of_a_wide_ep_group(tmp_path, capsys):
    """`ops --tp 1 --ep 8` (no --gpus): one EP group of 8 attention replicas, the op table of one replica's step,
    whose step is the one step model's for that mesh (`step.step_cost`); it used to stop on "1 GPUs are not a
    multiple of EP 8"."""
    import json as _json
    from helpers_profiles import qwen3_moe_fp8_slow_profile
    from calculators.cli import main
    from calculators.multi_gpu.tensor_parallel import _link_for
    from calculators.planning.step import step_cost
    from calculators.planning.throughput import deployment_defaults
    from specs.profiles import save_profile
    profile, qwen = qwen3_moe_fp8_slow_profile("h200-ops-wide")
    path = save_profile(profile, tmp_path / "h200-ops-wide.json")
    h200 = load_device("h200")
    assert main(["ops", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--tp", "1", "--ep", "8", "--weight-dtype",
                 "fp8", "--kv-dtype", "fp8", "--decode-rows", "64", "--context", "1024", "--stack", "trtllm",
                 "--profile", str(path), "--json"]) == 0
    d = _json.loads(capsys.readouterr().out)
    assert d["gpus"] == 8 and d["ep"] == 8 and d["tp"] == 1
    mesh = Mesh(tp=1, ep=8, gpus=8)
    kd, _, eff, lk = deployment_defaults(h200, mesh, "fp8", "fp8", TRT, None, None, None, qwen)
    want = step_cost(qwen, h200, mesh, "fp8", kd, eff, _link_for(h200, lk), TRT, 1024, 1, profile=profile)
    assert d["step_ms"] == pytest.approx(float(want.parts(64, 0)["step_ms"]), rel=1e-9)
    assert main(["ops", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--tp", "1", "--ep", "8", "--weight-dtype",
                 "fp8", "--kv-dtype", "fp8", "--stack", "trtllm", "--profile", str(path)]) == 0
    assert "attention DP 8 over 8 GPUs" in capsys.readouterr().out
