"""The planner's wide expert parallelism (attention TP t × DP d, EP = t·d over the GPUs): its figures equal `serve_at`
for the same layout and rate, it picks such a layout for DeepSeek-R1 on 8 × H200 where TP 8 cannot carry the rate
(the expectation derived from `serve_at` alone), the layouts it tries, and an EP or DP that does not fit named
with what would."""
import json

import pytest

from calculators.cli import main
from calculators.multi_gpu.tensor_parallel import Mesh, per_gpu_memory
from calculators.planning.planner import SearchSpace, Workload, plan, plan_rows
from calculators.planning.serve_at import serve_at
from calculators.planning.wide_ep import wide_ep_groups, wide_ep_layouts
from specs.devices import load_device
from specs.presets import load_preset

R1, H200 = load_preset("deepseek-r1"), load_device("h200")
RATE = 8.0                                    # requests/s: above what TP 8 on 8 GPUs carries (below)
WL = Workload(requests_per_s=RATE, prompt_tokens=1000, output_tokens=2000, ttft_p99_ms=3000, itl_ms=150)
CAPS = (64, 256, 1024)
SPACE = SearchSpace(gpu_counts=(8, 16), tp=(1, 2, 4, 8), pp=(1,), batch_caps=CAPS, weight_dtypes=("fp8",),
                    kv_dtypes=("fp8",))


@pytest.fixture(scope="module")
def r1_plan():
    return plan(R1, [H200], WL, SPACE)


def _serve_at(mesh: Mesh, cap: int) -> dict:
    return serve_at(R1, H200, mesh, RATE, WL.prompt_lengths(), WL.output_lengths(), "fp8", "fp8",
                    max_num_seqs=cap, with_capacity=False)


def test_tp8_cannot_carry_the_rate_on_8_gpus_but_attention_dp_with_ep8_can():
    """The expectation of the next test, from `serve_at` alone: no batch cap makes TP 8 (EP 1 or 8) on 8 H200s
    stable at the rate, while TP 1 × DP 8 with EP 8 meets both targets."""
    for ep in (1, 8):
        for cap in CAPS:
            assert not _serve_at(Mesh(tp=8, ep=ep, gpus=8), cap)["stable"]
    wide = _serve_at(Mesh(tp=1, ep=8, gpus=8), 256)
    assert wide["stable"] and wide["tpot_ms"] <= WL.itl_ms and wide["ttft_p99_ms"] <= WL.ttft_p99_ms


def test_deepseek_r1_on_8_h200_is_planned_with_attention_dp_and_wide_ep(r1_plan):
    """Any 8-GPU plan is cheaper than a 16-GPU one; the only 8-GPU layouts without wide EP are TP 8 (the model does
    not fit fewer GPUs in FP8), which cannot carry the rate: the cheapest plan is 8 GPUs with EP 8 > TP."""
    best = plan_rows(r1_plan, 1)[0]
    assert best["gpus"] == 8 and best["ep"] == 8 and best["tp"] < 8 and best["dp"] == 8 // best["tp"]
    assert best["usd_per_million_tokens"] == pytest.approx(
        8 * H200.price_usd_per_hour / (RATE * 3000 * 3600) * 1e6, rel=1e-12)
    tp8 = [r for r in r1_plan.find(H200.name, 8, 8, 1, 256, "fp8", "fp8")]
    assert tp8 and all(r["rank"] is None for r in tp8)


def test_wide_ep_figures_equal_serve_at_for_the_same_layout_and_rate(r1_plan):
    rows = [r for r in plan_rows(r1_plan, 40) if r["dp"] > 1]
    assert len(rows) >= 3
    for r in rows[:4]:
        mesh = Mesh(tp=r["tp"], ep=r["ep"], gpus=r["gpus"])
        s = _serve_at(mesh, r["batch_cap"])
        assert s["replicas"] == r["replicas"] == r["dp"]
        for mine, theirs in (("itl_at_load_ms", "tpot_ms"), ("ttft_p99_ms", "ttft_p99_ms"),
                             ("ttft_p50_ms", "ttft_p50_ms"), ("itl_p99_at_load_ms", "itl_p99_ms"),
                             ("step_ms_at_load", "step_ms"), ("concurrency_per_replica", "in_flight_per_replica"),
                             ("utilisation", "slot_utilisation")):
            assert r[mine] == pytest.approx(s[theirs], rel=0.01), mine
        mem = per_gpu_memory(R1, H200, mesh, WL.prompt_tokens + WL.output_tokens, r["batch_cap"], "fp8", "fp8")
        assert r["per_gpu_needed_bytes"] == pytest.approx(mem["per_gpu_needed_bytes"], rel=1e-12)
        assert r["per_gpu_weight_bytes"] == pytest.approx(mem["per_gpu_weight_bytes"], rel=1e-12)


def test_the_layouts_tried_are_every_tp_below_the_gpus_that_splits_heads_and_experts():
    """A plain loop: t < g, t divides g and the 64 query heads, g divides the 128 experts (Qwen3-235B-A22B)."""
    q = load_preset("qwen3-235b-a22b")
    counts, tps = (1, 2, 4, 8, 16, 32, 64, 256), (1, 2, 4, 8, 16)
    want = [(g, t) for g in counts for t in tps if t < g and g % t == 0 and q.num_heads % t == 0
            and q.num_experts % g == 0 and (q.num_kv_heads % t == 0 or t % q.num_kv_heads == 0)]
    got = [(m.gpus, m.tp) for m in wide_ep_layouts(q, counts, tps)]
    assert got == want and all(m.ep == m.gpus and m.pp == 1 for m in wide_ep_layouts(q, counts, tps))
    assert wide_ep_layouts(load_preset("llama-3-8b"), counts, tps) == []


def test_ep_groups_side_by_side_are_every_group_size_among_the_counts_that_divides_the_gpus():
    """A plain loop: g GPUs as g / e groups of e (e one of the counts, dividing g), each group a layout of e GPUs."""
    q = load_preset("qwen3-235b-a22b")
    counts, tps = (2, 4, 8, 16, 32), (1, 2, 4, 8)
    want = sorted((g, e, t) for g in counts for e in counts if g % e == 0 for t in tps
                  if (e, t) in {(m.gpus, m.tp) for m in wide_ep_layouts(q, (e,), tps)})
    got = sorted((m.gpus * k, m.gpus, m.tp) for m, k in wide_ep_groups(q, counts, tps))
    assert got == want
    assert (32, 8, 1) in got and (32, 32, 1) in got          # four EP-8 groups, and one EP-32
    assert wide_ep_groups(load_preset("llama-3-8b"), counts, tps) == []


def test_two_ep_groups_are_two_of_the_one_group_layout_at_half_the_rate(r1_plan):
    """16 H200s as two EP-8 groups: every figure is `serve_at`'s for one group of 8 GPUs at half the rate, the cost
    is 16 GPUs', and the launch plan is the one-group command run twice."""
    from calculators.planning.launch import plan_from_row
    rows = [r for r in r1_plan.find(H200.name, 16, 1, 1, 256, "fp8", "fp8", ep=8)]
    assert len(rows) == 1
    r = rows[0]
    assert r["replicas"] == 16 and r["dp"] == 8 and r["gpus"] == 16
    s = serve_at(R1, H200, Mesh(tp=1, ep=8, gpus=8), RATE / 2, WL.prompt_lengths(), WL.output_lengths(), "fp8",
                 "fp8", max_num_seqs=256, with_capacity=False)
    for mine, theirs in (("itl_at_load_ms", "tpot_ms"), ("ttft_p99_ms", "ttft_p99_ms"),
                         ("step_ms_at_load", "step_ms"), ("concurrency_per_replica", "in_flight_per_replica")):
        assert r[mine] == pytest.approx(s[theirs], rel=0.01), mine
    assert r["usd_per_million_tokens"] == pytest.approx(
        16 * H200.price_usd_per_hour / (RATE * 3000 * 3600) * 1e6, rel=1e-12)
    launch = plan_from_row(r, "deepseek-r1", 3000, 0.9)
    assert launch["replicas"] == 2 and launch["dp"] == 8 and launch["ep"] == 8 and launch["gpus"] == 16
    from calculators.planning.planner import layout_words
    assert layout_words(r) == "2 × (TP 1 × DP 8 attention, EP 8)"


def test_a_dense_model_gets_no_wide_ep_candidates():
    res = plan(load_preset("llama-3-8b"), [load_device("h100")], Workload(1.0, 500, 100, 2000, 50),
               SearchSpace(gpu_counts=(1, 2), tp=(1, 2), pp=(1,), batch_caps=(8,)))
    assert set(res.columns["dp"].tolist()) == {1} and set(res.columns["ep"].tolist()) == {1}


def test_plan_json_shows_dp_and_ep(capsys):
    code = main(["plan", "--model", "deepseek-r1", "--gpu", "h200", "--rate", "8", "--prompt-tokens", "1000",
                 "--output-tokens", "2000", "--ttft-ms", "3000", "--itl-ms", "150", "--top", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["plans"]
    assert all({"dp", "ep", "replicas"} <= set(r) for r in out["plans"])
    assert any(r["ep"] > r["tp"] for r in out["plans"])


def test_plan_text_names_ep_groups_side_by_side_among_plans_and_rejects(capsys):
    """At 40 requests/s DeepSeek-R1 needs 32 H200s; the text names a layout of several EP groups as such, in the
    ranked plans and in the nearest rejects alike (a reject's words once dropped the groups)."""
    code = main(["plan", "--model", "deepseek-r1", "--gpu", "h200", "--rate", "40", "--prompt-tokens", "2000",
                 "--output-tokens", "500", "--ttft-ms", "3000", "--itl-ms", "100", "--top", "40", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    rows = out["plans"] + out["nearest_rejected"]
    grouped = [r for r in rows if r["dp"] > 1 and r["replicas"] > r["dp"]]
    assert grouped and any(r in out["nearest_rejected"] for r in grouped)
    from calculators.planning.planner import layout_words
    for r in grouped:
        assert layout_words(r).startswith(f"{r['gpus'] // r['ep']} × (TP {r['tp']} × DP {r['dp']} attention")


@pytest.mark.parametrize("argv,words", [
    (["--ep", "16", "--tp", "2", "--gpus", "8"], "choose EP among 1, 2, 4, 8"),
    (["--ep", "6", "--gpus", "8"], "choose EP among 1, 2, 4, 8, 16"),
    (["--dp", "3", "--tp", "2", "--gpus", "8"], "DP is 4"),
])
def test_an_ep_or_dp_that_does_not_fit_is_one_line_naming_what_would(capsys, argv, words):
    code = main(["serve-at", "--model", "deepseek-r1", "--gpu", "h200", "--rate", "4", "--prompt-tokens", "2000",
                 "--output-tokens", "500", "--weight-dtype", "fp8", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_a_wide_ep_layout_whose_weights_do_not_fit_is_rejected_for_memory():
    """DeepSeek-R1 in BF16 over 2 H200s: even the routed experts alone (over half of its ~671B parameters, 2 bytes
    each, split 2 ways) exceed a 141 GB GPU, so TP 1 × DP 2 with EP 2 is a memory reject that says so."""
    res = plan(R1, [H200], WL, SearchSpace(gpu_counts=(2,), tp=(1,), pp=(1,), batch_caps=(8,),
                                           weight_dtypes=("bf16",), kv_dtypes=("bf16",)))
    (row,) = res.find(H200.name, 2, 1, 1, 8, "bf16", "bf16", ep=2)
    assert row["dp"] == 2 and row["reason"] == "memory" and row["rank"] is None
    routed_floor = 0.5 * 671e9 * 2 / 2           # half the parameters, 2 bytes each, over 2 GPUs
    assert row["per_gpu_weight_bytes"] > routed_floor > H200.memory_bytes
    assert "memory: needs" in row["why"]


def test_a_wide_ep_plan_launches_as_one_instance_of_dp_ranks(r1_plan):
    """The planner counts attention replicas and sequences per replica; a server instance spans the EP group: vLLM
    gets --data-parallel-size d and the replica's cap per rank, SGLang the whole instance's d × cap."""
    from calculators.planning.launch import launch_commands, plan_from_row
    best = plan_rows(r1_plan, 1)[0]
    d, cap = best["dp"], best["batch_cap"]
    cmds = launch_commands(plan_from_row(best, "deepseek-r1", 3000, 0.9))
    vllm, sglang = cmds["vllm"].argv, cmds["sglang"].argv
    assert vllm[vllm.index("--data-parallel-size") + 1] == str(d)
    assert vllm[vllm.index("--max-num-seqs") + 1] == str(cap)
    assert sglang[sglang.index("--attn-dp-size") + 1] == str(d)
    assert sglang[sglang.index("--max-running-requests") + 1] == str(d * cap)
