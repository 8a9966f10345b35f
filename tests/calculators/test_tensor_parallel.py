"""Multi-GPU sizing (calculators.multi_gpu.tensor_parallel): per-GPU memory two ways, invariants, replication, pipelines."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from calculators.sizing.latency import IDEAL, decode_step_ms
from calculators.sizing.memory import RuntimeOverheads, memory_budget, resident_weight_bytes
from calculators.multi_gpu.pipeline import bubble_table, layers_per_stage, pipeline_pass_ms
from calculators.multi_gpu.tensor_parallel import (Mesh, decode_step_parallel, fit_verdict, mesh_problem, per_gpu_kv_bytes,
                                         per_gpu_memory, per_gpu_weight_bytes)
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import list_presets, load_preset

TINY, L70 = load_preset("tinyllama"), load_preset("llama-3-70b")
A100, H100 = load_device("a100"), load_device("h100")


def test_tp_step_scaling_reproduces_003_tinyllama_floors_1_41_0_71_0_35_ms():
    from calculators.planning.parallel_step import tp_step_scaling
    rows = tp_step_scaling(TINY, A100, (1, 2, 4), 300, 1, "fp16")
    assert [round(r["weights_floor_ms"], 2) for r in rows] == [1.41, 0.71, 0.35]


def test_one_gpu_mesh_equals_the_single_device_budget_computed_by_memory_py():
    """Two code paths (memory.memory_budget, tensor_parallel.per_gpu_memory) must agree exactly at TP 1 PP 1."""
    for name in ("tinyllama", "llama-3-70b", "deepseek-v2", "gemma-3-27b", "qwen3-next-80b-a3b"):
        c = load_preset(name)
        for wd in ("bf16", "fp8", "int4"):
            a = memory_budget(c, H100, 4096, 3, wd, "fp8")
            b = per_gpu_memory(c, H100, Mesh(), 4096, 3, wd, "fp8")
            assert b["per_gpu_weight_bytes"] == pytest.approx(a["weights_bytes"], rel=1e-12)
            assert b["per_gpu_kv_bytes"] == pytest.approx(a["kv_bytes"], rel=1e-12)
            assert b["per_gpu_activation_bytes"] == pytest.approx(a["activation_bytes"], rel=1e-12)
            assert b["per_gpu_needed_bytes"] == pytest.approx(a["needed_bytes"], rel=1e-12)
            assert b["fits"] == a["fits"]


def test_a_tp_group_holds_exactly_the_whole_model_when_tp_divides_the_kv_heads():
    for tp in (1, 2, 4, 8):                                              # Llama-3-70B has 8 KV heads
        assert tp * per_gpu_weight_bytes(L70, Mesh(tp=tp), "fp8") == pytest.approx(
            resident_weight_bytes(L70, "fp8"), rel=1e-12)


def test_kv_heads_are_replicated_past_tp_8_for_8_kv_heads():
    kv8 = per_gpu_kv_bytes(L70, Mesh(tp=8), 8192, 1, "bf16")
    assert kv8 == 80 * 8192 * 2 * 128 * 2 * 1                           # one KV head per GPU: 2·d·2 B per layer
    assert per_gpu_kv_bytes(L70, Mesh(tp=16), 8192, 1, "bf16") == kv8   # not half: each head is kept twice
    w16, w8 = per_gpu_weight_bytes(L70, Mesh(tp=16), "bf16"), per_gpu_weight_bytes(L70, Mesh(tp=8), "bf16")
    # k/v projections stop shrinking too: one whole KV head's k and v per layer stay on every GPU
    assert w16 - w8 / 2 == pytest.approx(80 * 2 * 8192 * 128 * 2 / 2, rel=1e-9)


def test_mla_latent_is_kept_whole_on_every_tp_rank():
    c = load_preset("deepseek-v2")
    assert per_gpu_kv_bytes(c, Mesh(tp=8), 4096, 2, "bf16") == per_gpu_kv_bytes(c, Mesh(tp=1), 4096, 2, "bf16")


MESHES = [(tp, pp) for tp in (1, 2, 4, 8, 16) for pp in (1, 2, 4, 8)]


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(list_presets()), wd=st.sampled_from(["bf16", "fp8", "int4"]),
       ctx=st.integers(1, 32768), batch=st.integers(1, 64), i=st.integers(0, len(MESHES) - 1))
def test_more_gpus_never_raise_per_gpu_memory(name, wd, ctx, batch, i):
    """Doubling TP or PP never raises what the busiest GPU holds (weights + KV + activations); the runtime terms
    are the same for every multi-GPU layout, so from 2 GPUs on the whole need never rises either."""
    c = load_preset(name)
    tp, pp = MESHES[i]
    base = Mesh(tp=tp, pp=pp)
    if mesh_problem(c, base):
        return
    m0 = per_gpu_memory(c, H100, base, ctx, batch, wd)
    for more in (Mesh(tp=2 * tp, pp=pp), Mesh(tp=tp, pp=2 * pp)):
        if mesh_problem(c, more):
            continue
        m1 = per_gpu_memory(c, H100, more, ctx, batch, wd)
        state0 = m0["per_gpu_needed_bytes"] - m0["overhead_bytes"]
        state1 = m1["per_gpu_needed_bytes"] - m1["overhead_bytes"]
        assert state1 <= state0 * (1 + 1e-12)
        if base.gpus_per_replica > 1:
            assert m1["per_gpu_needed_bytes"] <= m0["per_gpu_needed_bytes"] * (1 + 1e-12)


def test_decode_on_one_gpu_matches_latency_decode_step_ms():
    # the mesh path reads the KV cache of `context` tokens; latency.py also counts the one token's KV written:
    # 22,528 B next to 2.2 GB, a relative difference below 1e-4
    a = decode_step_ms(TINY, A100, 300, 4, "fp16", efficiency=IDEAL)
    b = decode_step_parallel(TINY, A100, Mesh(), 300, 4, "fp16", efficiency=IDEAL)
    assert b["itl_ms"] == pytest.approx(a["step_ms"], rel=1e-4)
    assert b["allreduce_ms_per_token"] == 0 and b["comm_fraction"] == 0


def test_pipeline_does_not_speed_up_one_request_but_multiplies_throughput():
    # TinyLlama's 22 layers over 2 stages: 11 each, so one request's ITL is the 1-GPU ITL plus one send
    one = decode_step_parallel(TINY, A100, Mesh(), 300, 1, "fp16")
    pp2 = decode_step_parallel(TINY, A100, Mesh(pp=2), 300, 1, "fp16")
    assert pp2["itl_ms"] >= one["itl_ms"] and pp2["itl_ms"] == pytest.approx(one["itl_ms"] + pp2["pp_send_ms"],
                                                                                rel=1e-3)
    full = decode_step_parallel(TINY, A100, Mesh(pp=2), 300, 2, "fp16")   # one sequence per stage in flight
    assert full["total_tok_s"] > 1.9 * one["total_tok_s"]
    assert pp2["bubble_fraction"] == 0.5 and full["bubble_fraction"] == 0


def test_bubble_table_and_stage_split():
    assert [round(r["bubble_percent"]) for r in bubble_table(4)] == [75, 43, 16, 4]
    assert layers_per_stage(80, 3) == [27, 27, 26] and sum(layers_per_stage(22, 4)) == 22
    assert pipeline_pass_ms(2.0, 4, 16) == (16 + 4 - 1) * 2.0
    with pytest.raises(SpecError):
        layers_per_stage(4, 8)


def test_mesh_problems_are_sentences_not_tracebacks():
    assert "does not divide" in mesh_problem(L70, Mesh(tp=3))
    assert "mixture-of-experts" in mesh_problem(L70, Mesh(tp=8, ep=8))
    assert "multiple" in mesh_problem(L70, Mesh(tp=4, pp=2, gpus=12))
    assert "layers" in mesh_problem(TINY, Mesh(pp=64))
    assert mesh_problem(load_preset("mixtral-8x7b"), Mesh(tp=8, ep=8)) is None
    with pytest.raises(SpecError):
        per_gpu_memory(L70, H100, Mesh(tp=3), 1024)


def test_a_setup_that_does_not_fit_says_by_how_much_and_each_advice_is_true():
    c, dev = load_preset("deepseek-v2"), load_device("a100")      # the case: 37-434 GB short
    v = fit_verdict(c, dev, Mesh(), 4096, 1)
    m = v["memory"]
    assert not v["fits"] and m["short_by_bytes"] == pytest.approx(m["per_gpu_needed_bytes"] - m["usable_bytes"])
    assert "short" in v["text"] and v["advice"]
    tp = int(v["advice"][0].split()[1])                          # "TP 16 (...)": check it really fits
    assert per_gpu_memory(c, dev, Mesh(tp=tp), 4096, 1)["fits"]
    assert not per_gpu_memory(c, dev, Mesh(tp=tp // 2), 4096, 1)["fits"]


def test_overheads_only_add_comm_buffers_with_more_than_one_gpu():
    o = RuntimeOverheads()
    one, two = per_gpu_memory(TINY, A100, Mesh(), 512, 1), per_gpu_memory(TINY, A100, Mesh(tp=2), 512, 1)
    assert one["overhead_bytes"] == o.cuda_context_bytes + o.cuda_graph_bytes
    assert two["overhead_bytes"] - one["overhead_bytes"] == o.comm_buffer_bytes
    assert math.isclose(one["usable_bytes"], 0.9 * 40 * 2 ** 30)
