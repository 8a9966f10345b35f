"""Capacity planner: the vectorised search agrees with the scalar calculators, every plan keeps the constraints it
claims, the cheapest plan is the brute-force minimum, and bad input gives a reason instead of a traceback."""
import itertools

import numpy as np
import pytest

from calculators.sizing.latency import Efficiency
from calculators.planning.planner import SearchSpace, Workload, plan, plan_rows, rejected_rows
from calculators.planning.request_latency import request_latency
from calculators.planning.serve_at import serve_at
from calculators.planning.throughput import max_throughput
from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel, mesh_problem, per_gpu_memory
from specs.devices import custom_device, load_device
from specs.model_config import SpecError
from specs.presets import load_preset

L8, L70 = load_preset("llama-3-8b"), load_preset("llama-3-70b")
H100, A100 = load_device("h100"), load_device("a100-80gb")
WL = Workload(requests_per_s=3.0, prompt_tokens=1000, output_tokens=200, ttft_p99_ms=1500, itl_ms=40,
              prompt_tokens_p99=3000)
SMALL = SearchSpace(gpu_counts=(1, 2, 4), tp=(1, 2, 4), pp=(1, 2), batch_caps=(1, 8, 64), weight_dtypes=("bf16", "fp8"),
                    kv_dtypes=("bf16", "fp8"))


def _scalar(c, dev, row, wl):
    mesh = Mesh(tp=row["tp"], pp=row["pp"], ep=row.get("ep", 1), gpus=row["gpus"])
    mean_ctx = wl.prompt_tokens + (wl.output_tokens - 1) // 2 + 1
    mem = per_gpu_memory(c, dev, mesh, wl.prompt_tokens + wl.output_tokens, row["batch_cap"], row["weight_dtype"],
                         row["kv_dtype"])
    # the scalar path of the one step model (`request_latency`: step.step_cost at (batch, 0) and (0, prompt)),
    # with the planner's default: vLLM's efficiencies and step cost
    dec = request_latency(c, dev, mesh, wl.prompt_tokens, wl.output_tokens, row["batch_cap"], row["weight_dtype"],
                          row["kv_dtype"])
    pre = dict(prefill_ms=request_latency(c, dev, mesh, wl.prompt_tokens, wl.output_tokens, 1, row["weight_dtype"],
                                          row["kv_dtype"])["ttft_ms"])
    pre99 = dict(prefill_ms=request_latency(c, dev, mesh, wl.p99_prompt, wl.output_tokens, 1, row["weight_dtype"],
                                            row["kv_dtype"])["ttft_ms"])
    assert dec["mean_context_tokens"] == mean_ctx
    return mem, dec, pre, pre99


def _loaded(c, dev, row, wl) -> dict:
    """The same candidate through the scalar path (a second computation): `serve_at` on the layout, its batch cap
    as vLLM's max_num_seqs, the same lengths."""
    mesh = Mesh(tp=row["tp"], pp=row["pp"], ep=row.get("ep", 1), gpus=row["gpus"])
    return serve_at(c, dev, mesh, wl.requests_per_s, wl.prompt_lengths(), wl.output_lengths(), row["weight_dtype"],
                    row["kv_dtype"], max_num_seqs=row["batch_cap"], with_capacity=False)


def test_vectorised_numbers_equal_the_scalar_calculators():
    res = plan(L70, [H100, A100], WL, SMALL)
    rng = np.random.default_rng(0)
    valid = [i for i in range(res.n_candidates) if res.columns["reason"][i] != "mesh"]
    for i in rng.choice(valid, 40, replace=False):
        row = res.plan(int(i))
        dev = H100 if row["device"] == H100.name else A100
        mem, dec, pre, _ = _scalar(L70, dev, row, WL)
        assert row["per_gpu_weight_bytes"] == pytest.approx(mem["per_gpu_weight_bytes"], rel=1e-12)
        assert row["per_gpu_kv_bytes"] == pytest.approx(mem["per_gpu_kv_bytes"], rel=1e-12)
        assert row["per_gpu_needed_bytes"] == pytest.approx(mem["per_gpu_needed_bytes"], rel=1e-12)
        # the scalar step reads its collectives from a log grid of tokens (step.step_tables), the planner computes
        # them at the exact count: within 0.1%
        assert row["itl_ms"] == pytest.approx(dec["itl_ms"], rel=1e-3)
        assert row["prefill_ms"] == pytest.approx(pre["prefill_ms"], rel=1e-3)


def test_moe_plans_with_expert_parallelism_equal_the_scalar_calculators():
    mix = load_preset("mixtral-8x7b")
    res = plan(mix, [H100], WL, SMALL)
    ep_rows = [i for i in range(res.n_candidates) if res.columns["ep"][i] > 1 and res.columns["dp"][i] == 1
               and res.columns["reason"][i] != "mesh"]          # EP = TP (wide EP: test_planner_wide_ep.py)
    assert ep_rows
    for i in ep_rows[::7]:
        row = res.plan(i)
        mem, dec, pre, _ = _scalar(mix, H100, row, WL)
        # the scalar step reads the experts a step touches and the busiest rank's imbalance from a log grid of
        # tokens (step.step_tables), the planner computes them at the exact count: within 2%
        assert row["itl_ms"] == pytest.approx(dec["itl_ms"], rel=2e-2)
        assert row["prefill_ms"] == pytest.approx(pre["prefill_ms"], rel=2e-2)
        assert row["per_gpu_needed_bytes"] == pytest.approx(mem["per_gpu_needed_bytes"], rel=1e-12)


def test_every_ranked_plan_respects_the_constraints_it_claims():
    """The top plans, recomputed one by one through `serve_at` (scalar step cost, the steady state with the prompt
    chain): the same TPOT and TTFT p99 within 3%, every target met, the rate below capacity."""
    res = plan(L70, [H100, A100], WL, SMALL)
    rows = plan_rows(res, 12)
    assert rows
    for r in rows:
        dev = H100 if r["device"] == H100.name else A100
        mem, _, _, _ = _scalar(L70, dev, r, WL)
        s = _loaded(L70, dev, r, WL)
        assert mem["fits"] and s["stable"]
        assert r["itl_at_load_ms"] == pytest.approx(s["tpot_ms"], rel=0.03)
        assert r["ttft_p99_ms"] == pytest.approx(s["ttft_p99_ms"], rel=0.03)
        assert s["tpot_ms"] <= WL.itl_ms * 1.03 and s["ttft_p99_ms"] <= WL.ttft_p99_ms * 1.03
        assert r["binding"] in ("memory", "bandwidth", "compute", "communication", "queueing")
    costs = [r["usd_per_million_tokens"] for r in rows]
    assert costs == sorted(costs)


def test_ties_in_cost_go_to_the_plan_with_the_most_headroom():
    """Plans of equal cost are ordered by their worst ratio to a limit (issue 27: batch cap 1 at 92% of the TTFT
    target used to win over batch cap 32 at 40% because its ITL was lower)."""
    res = plan(L8, [H100], WL, SMALL)
    rows = res.ranked(50)
    for a, b in zip(rows, rows[1:]):
        if a["usd_per_million_tokens"] == pytest.approx(b["usd_per_million_tokens"], rel=1e-12):
            assert a["worst_ratio"] <= b["worst_ratio"] + 1e-12


def test_cheapest_plan_is_the_brute_force_minimum_over_the_same_space():
    """A plain loop over every candidate, each through the scalar calculators and `serve_at`, finds the same
    cheapest plan (ties: the smallest worst ratio to a limit)."""
    space = SearchSpace(gpu_counts=(1, 2, 4), tp=(1, 2), pp=(1,), batch_caps=(8, 64), weight_dtypes=("bf16", "fp8"),
                        kv_dtypes=("fp8",))
    res = plan(L8, [H100], WL, space)
    best = None
    for g, tp, pp, B, wd, kd in itertools.product(space.gpu_counts, space.tp, space.pp, space.batch_caps,
                                                  space.weight_dtypes, space.kv_dtypes):
        if g % (tp * pp) or mesh_problem(L8, Mesh(tp=tp, pp=pp)):
            continue
        row = dict(tp=tp, pp=pp, gpus=g, batch_cap=B, weight_dtype=wd, kv_dtype=kd)
        mem, _, _, _ = _scalar(L8, H100, row, WL)
        if not mem["fits"]:
            continue
        s = _loaded(L8, H100, row, WL)
        if not s["stable"] or s["tpot_ms"] > WL.itl_ms or s["ttft_p99_ms"] > WL.ttft_p99_ms:
            continue
        worst = max(mem["per_gpu_needed_bytes"] / mem["usable_bytes"], s["tpot_ms"] / WL.itl_ms,
                    s["ttft_p99_ms"] / WL.ttft_p99_ms, s["slot_utilisation"], s["prefill_budget_utilisation"])
        cost = g * H100.price_usd_per_hour / (WL.requests_per_s * 1200 * 3600) * 1e6
        key = (round(cost, 12), round(worst, 3))
        if best is None or key < best[0]:
            best = (key, g, tp, pp, B, wd, kd)
    top = res.ranked(1)[0]
    assert best is not None
    assert (top["gpus"], top["tp"], top["pp"], top["batch_cap"], top["weight_dtype"], top["kv_dtype"]) == best[1:]
    assert top["usd_per_million_tokens"] == pytest.approx(best[0][0])


def test_the_issue_example_is_never_planned_above_the_capacity_throughput_reports():
    """Issue 26: Llama-3-70B, 10 requests/s of 2,000 in / 500 out, TTFT p99 2 s, ITL 50 ms used to get 4 × H100 TP 4
    (whose maximum throughput is ~7.5 requests/s). Every ranked plan's rate per replica must stay below the
    maximum throughput `throughput` computes for that replica, and its ITL at the load includes the prefills."""
    wl = Workload(requests_per_s=10, prompt_tokens=2000, output_tokens=500, ttft_p99_ms=2000, itl_ms=50)
    space = SearchSpace(gpu_counts=(4, 8), tp=(2, 4, 8), pp=(1,), batch_caps=(64, 256, 512),
                        weight_dtypes=("fp8",), kv_dtypes=("fp8",))
    res = plan(L70, [H100], wl, space)
    rows = res.ranked(20)
    assert rows and all(r["gpus"] >= 8 for r in rows)
    for r in rows:
        mesh = Mesh(tp=r["tp"], pp=r["pp"], gpus=r["gpus"])
        mt = max_throughput(L70, H100, mesh, 2000, 500, "fp8", "fp8", max_num_seqs=r["batch_cap"])
        assert wl.requests_per_s < mt["requests_per_s"]
        decode_alone = decode_step_parallel(L70, H100, mesh, 2250, max(1, int(r["concurrency_per_replica"] * 0.9)),
                                            "fp8", "fp8", Efficiency.for_stack(None, H100))["itl_ms"]
        assert r["itl_at_load_ms"] > 0.999 * decode_alone          # a prefill share on top of decode alone
    four = res.find(H100.name, 4, 4, 1, 256, "fp8", "fp8")[0]
    assert not four["feasible"] and four["reason"] in ("utilisation", "concurrency", "itl", "ttft")


def test_default_space_searches_more_than_10_000_candidates():
    res = plan(L70, [H100, A100, load_device("h200")], WL)
    assert res.n_candidates >= 10_000
    assert sum(res.reasons.values()) + len(res.feasible_order) == res.n_candidates


def test_zero_rate_and_impossible_targets_give_a_reason():
    with pytest.raises(SpecError, match="rate"):
        plan(L8, [H100], Workload(0, 100, 100, 1000, 50))
    res = plan(L8, [H100], Workload(1, 100, 100, 1000, 0.001), SMALL)             # 1 µs ITL: nothing can
    assert not len(res.feasible_order) and "itl" in res.no_plan_reason()
    assert res.rejected(1)[0]["why"].startswith("ITL")


def test_a_model_that_fits_nowhere_says_memory():
    t4 = load_device("t4")
    res = plan(load_preset("llama-3.1-405b"), [t4], WL, SearchSpace(gpu_counts=(1, 2, 4), tp=(1, 2, 4), pp=(1,)))
    reason = res.no_plan_reason()
    assert reason.startswith("no feasible plan") and "memory" in reason
    # T4 has no FP4 tensor cores: the FP4 candidates are refused as such, never upcast
    assert all(r["reason"] in ("memory", "mesh", "precision") for r in rejected_rows(res, 100))
    fp4 = [r for r in rejected_rows(res, 10 ** 6) if r["weight_dtype"] == "fp4"]
    assert fp4 and all(r["reason"] in ("precision", "mesh") for r in fp4)


def test_fp4_weights_are_searched_where_the_device_runs_them_natively():
    res = plan(load_preset("llama-3-70b"), [load_device("b200"), H100], WL, SearchSpace(
        gpu_counts=(1, 2), tp=(1, 2), pp=(1,), batch_caps=(8, 64), weight_dtypes=("fp8", "fp4")))
    rows = [res.plan(int(i)) for i in res.feasible_order]
    assert any(r["weight_dtype"] == "fp4" and r["device"] == "B200" for r in rows)
    assert not any(r["weight_dtype"] == "fp4" and r["device"] == H100.name for r in rows)


def test_a_tp_degree_that_does_not_divide_the_heads_is_named():
    res = plan(L8, [H100], WL, SearchSpace(gpu_counts=(3,), tp=(3,), pp=(1,)))
    assert "TP 3" in res.notes[0] and "mesh" in res.no_plan_reason()


def test_a_device_without_a_price_is_not_ranked():
    free = custom_device("no price", 80, 3350, {"bf16": 989, "fp8": 1979}, interconnect_gb_s=450)
    res = plan(L8, [free], WL, SMALL)
    assert not len(res.feasible_order) and res.reasons["no price"] > 0


def test_prefix_cache_hits_remove_prefill_flops_of_the_cached_tokens():
    # Llama-3-70B, 3,000-token prompts, 75% cached: 750 new tokens attend over all 3,000. On 8 H100s (FP8 peak
    # 1,978.9 TFLOP/s, the MFU of vLLM's serving step from specs/stacks.json, the one step model's: a prompt alone
    # is the step at 0 decode rows) it is compute-bound: FLOPs / 8 / (peak × MFU), plus
    # 160 all-reduces of a [750, 8,192] bf16 activation: 12.3 MB is past vLLM's 8 MiB custom kernel, so NCCL runs
    # it and picks NVLS on the NVSwitch (23 us + 12.3 MB / 450 GB/s, below the ring's 15 us + 2·7/8 × 12.3 MB / B);
    # and the fixed step cost (no decode row: no per-sequence cost)
    from calculators.sizing.roofline import forward_flops
    wl = Workload(1.0, 3000, 200, 5000, 100, prefix_hit_rate=0.75)
    space = SearchSpace(gpu_counts=(8,), tp=(8,), pp=(1,), batch_caps=(8,), weight_dtypes=("fp8",), kv_dtypes=("fp8",))
    row = plan(L70, [H100], wl, space).plan(0)
    eff = Efficiency.for_stack("vllm", H100)                    # the stack's data (specs/stacks.json), not a formula
    assert eff.gemm_half_tokens == 0                            # NVIDIA: a flat MFU in the step's tokens
    compute = forward_flops(L70, 750, 3000, 1) / 8 / (1978.9e12 * eff.decode_mfu) * 1e3
    allreduce = 160 * (23e-3 + 750 * 8192 * 2 / 450e9 * 1e3)
    fixed = eff.step_overhead_ms
    assert row["prefill_ms"] == pytest.approx(compute + allreduce + fixed, rel=1e-9)
    full = plan(L70, [H100], Workload(1.0, 3000, 200, 5000, 100), space).plan(0)
    assert row["prefill_ms"] < 0.35 * full["prefill_ms"]
    with pytest.raises(SpecError, match="prefix-cache hit rate"):
        Workload(1.0, 3000, 200, 5000, 100, prefix_hit_rate=1.0).check()


def test_the_longest_request_is_both_p99s_capped_at_the_context():
    assert Workload(1, 1000, 200, 1e3, 50, 3000, output_tokens_p99=800).longest_request(8192) == 3800
    assert Workload(1, 1000, 200, 1e3, 50).longest_request(8192) == 1200       # no p99s: the means
    assert Workload(1, 1000, 200, 1e3, 50, 8000, output_tokens_p99=900).longest_request(8192) == 8192
