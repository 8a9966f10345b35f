"""Attention DP's wait for the busiest rank (`calculators.planning.rank_wait`): the weights against a direct sum over
the Poisson count and against dealing prompts round-robin at random, the wrapped step against a linear step whose
wait has a closed form, the routed experts' share against the config, and where serve_at applies it."""
import math
import re

import numpy as np
import pytest

from calculators import arch
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.rank_wait import (ROWS_GRID, attention_dp_ranks, busiest_rank_weights, local_share,
                                           with_rank_wait)
from calculators.planning.serve_at import random_arrivals_step, serve_at
from calculators.serving.lengths import Lengths
from calculators.serving.steady_state import Load
from calculators.sizing.roofline import forward_flops_split
from specs.devices import load_device
from specs.presets import load_preset


def _pmf(lam: float, k: int) -> float:
    return math.exp(k * math.log(lam) - lam - math.lgamma(k + 1)) if lam > 0 else float(k == 0)


def _direct(f, mu: float, R: int, upto: int = 400) -> float:
    """E[f(busiest rank's prompts) − f(a given rank's)], summed over K directly: the busiest takes ⌈K/R⌉, a given
    rank ⌈K/R⌉ with probability (K mod R)/R, else ⌊K/R⌋."""
    total = 0.0
    for K in range(upto):
        hi, lo, r = -(-K // R), K // R, K % R
        own = r / R * f(hi) + (1 - r / R) * f(lo)
        total += _pmf(R * mu, K) * (f(hi) - own)
    return total


@pytest.mark.parametrize("mu,R", [(0.05, 8), (0.4, 8), (1.7, 4), (3.0, 2), (0.2, 16)])
def test_weights_telescope_the_direct_sum(mu, R):
    """Σ_j w_j (f(j+1) − f(j)) equals the expectation summed over K for a convex f (cost per prompt count)."""
    f = lambda j: 3.0 * j + 0.7 * j * j                                   # noqa: E731
    w = busiest_rank_weights(mu, R, 60)
    assert sum(w[j] * (f(j + 1) - f(j)) for j in range(60)) == pytest.approx(_direct(f, mu, R), rel=1e-9)


def test_weights_match_dealing_prompts_round_robin_at_random():
    """A brute-force run: 200,000 steps, K ~ Poisson(R·μ) prompts dealt in turn from a random rank; the busiest
    rank's tokens (capped at a budget) minus rank 0's, averaged, equal the weights' expectation."""
    rng = np.random.default_rng(7)
    R, mu, I, C = 8, 0.3, 900.0, 2048.0
    T = lambda j: np.minimum(j * I, C)                                    # noqa: E731
    K = rng.poisson(R * mu, 200_000)
    start = rng.integers(0, R, K.size)
    own = K // R + ((-start) % R < K % R)                              # rank 0 is dealt one more if reached
    busiest = -(-K // R)
    sim = float(np.mean(T(busiest) - T(own)))
    w = busiest_rank_weights(mu, R, 8)
    assert sum(w[j] * (T(j + 1) - T(j)) for j in range(8)) == pytest.approx(sim, rel=0.02)
    assert float(np.mean(own)) == pytest.approx(mu, rel=0.01)          # the deal keeps each rank's mean


def test_a_linear_steps_wait_is_its_prompt_cost_times_the_busiest_ranks_excess():
    """step(n, p) = 5 + 0.1 n + 0.02 p (ms): with no budget, wait(n) = s · 0.02 · I · (E⌈K/R⌉ − μ), μ = n / O (a
    given rank's mean is μ); ranks 1 leaves the step as it is."""
    def step(n, p):
        return 5.0 + 0.1 * np.asarray(n, dtype=float) + 0.02 * np.asarray(p, dtype=float)
    step.parts = lambda n, p: dict(step_ms=step(n, p))
    step.ms_per_context_token = lambda n, p: 0.0
    R, s, I, O = 8, 0.6, 1500.0, 400.0
    waited = with_rank_wait(step, R, s, I, O, math.inf, 512)
    for n in ROWS_GRID[[3, 20, 30]]:                                   # points of its grid: read exactly
        mu = n / O
        busiest = sum(_pmf(R * mu, K) * -(-K // R) for K in range(400))
        expect = s * 0.02 * I * (busiest - mu)
        assert float(waited.rank_wait(n)) == pytest.approx(expect, rel=1e-6)
        assert float(waited(n, 100.0)) == pytest.approx(float(step(n, 100.0)) + expect, rel=1e-9)
        assert float(waited.parts(n, 100.0)["rank_wait_ms"]) == pytest.approx(expect, rel=1e-6)
    assert with_rank_wait(step, 1, s, I, O) is step


def _linear(coef):
    """step(n, p) = 2 + 0.05 n + coef · p, `coef` a number or one per candidate (the last axis)."""
    def step(n, p):
        return 2.0 + 0.05 * np.asarray(n, dtype=float) + coef * np.asarray(p, dtype=float)
    step.parts = lambda n, p: dict(step_ms=step(n, p))
    step.ms_per_context_token = lambda n, p: 0.0
    return step


def test_a_stacked_steps_candidates_each_get_their_own_ranks():
    """Over K candidates (the planner's stacked step, last axis): each column equals that candidate alone."""
    coef, ranks, share = np.array([0.01, 0.02, 0.03]), np.array([2.0, 4.0, 8.0]), 0.5
    waited = with_rank_wait(_linear(coef), ranks, share, 800.0, 300.0, 4096.0, 300)
    got = waited.rank_wait(np.array([100.0, 100.0, 100.0]))
    for k in range(3):
        alone = with_rank_wait(_linear(float(coef[k])), ranks[k], share, 800.0, 300.0, 4096.0, 300)
        assert got[k] == pytest.approx(float(alone.rank_wait(100.0)), rel=1e-9)
    assert got[0] < got[1] < got[2]                        # more ranks and dearer prompts: a longer wait


def test_routed_share_from_the_config():
    """DeepSeek-R1: the routed experts' FLOPs per prompt token are 2 · top-k · 3 · D · F_moe per MoE layer; the
    rank's own share is the rest. A dense model's is all of it."""
    c = load_preset("deepseek-r1")
    P = 1000
    total = sum(forward_flops_split(c, P, P).values())
    moe_layers = arch.moe_layer_count(c)
    routed = P * 2 * c.num_experts_per_tok * 3 * c.hidden_size * c.moe_intermediate_size * moe_layers
    assert local_share(c, P) == pytest.approx(1 - routed / total, rel=1e-3)
    assert local_share(load_preset("llama-3.1-70b"), P) == 1.0


def test_serve_at_waits_for_the_busiest_rank_only_with_attention_dp():
    """DeepSeek-R1 on 8 H200: attention DP 8 (EP 8) waits, TP 8 with EP 8 inside it does not; the wait grows the
    step serve_at reports above the rank's mean-load step at the same rows."""
    r1, h200 = load_preset("deepseek-r1"), load_device("h200")
    assert attention_dp_ranks(Mesh(tp=1, ep=8, gpus=8)) == 8 and attention_dp_ranks(Mesh(tp=2, ep=8, gpus=8)) == 4
    assert attention_dp_ranks(Mesh(tp=8, ep=8, gpus=8)) == 1
    load = Load(Lengths.fixed(1000), Lengths.fixed(1000), chunk=8192, slots=256)

    def bare(n, p):
        return 10.0 + 0.01 * np.asarray(p, dtype=float) + 0 * np.asarray(n, dtype=float)
    bare.parts, bare.ms_per_context_token = (lambda n, p: dict(step_ms=bare(n, p))), (lambda n, p: 0.0)
    assert random_arrivals_step(bare, r1, Mesh(tp=8, ep=8, gpus=8), load) is bare
    assert float(random_arrivals_step(bare, r1, Mesh(tp=1, ep=8, gpus=8), load)(128.0, 0.0)) > 10.5
    wide = serve_at(r1, h200, Mesh(tp=1, ep=8, gpus=8), 4.0, 1000, 1000, "fp8", "fp8", stack="vllm")
    tp8 = serve_at(r1, h200, Mesh(tp=8, ep=8, gpus=8), 4.0, 1000, 1000, "fp8", "fp8", stack="vllm")
    assert wide["stable"] and tp8["stable"]
    assert wide["rank_wait_ms"] > 0 and tp8["rank_wait_ms"] == 0


def test_a_wide_ep_plan_carries_the_wait_serve_at_reports_and_its_formula():
    """DeepSeek-R1 FP8 on 8 H200 at 6 requests/s (1,000 in, 2,000 out): the planner's attention-DP row, serve_at on
    its layout and rate, and the plan's opened-up formulas give one wait; a plan without attention DP has none."""
    from calculators.planning.plan_explain import plan_formulas, plan_mesh
    from calculators.planning.planner import SearchSpace, Workload, plan, plan_rows
    r1, h200 = load_preset("deepseek-r1"), load_device("h200")
    wl = Workload(requests_per_s=6.0, prompt_tokens=1000, output_tokens=2000, ttft_p99_ms=3000, itl_ms=150)
    space = SearchSpace(gpu_counts=(8,), tp=(1, 8), pp=(1,), batch_caps=(256,), weight_dtypes=("fp8",),
                        kv_dtypes=("fp8",))
    res = plan(r1, [h200], wl, space)
    wide = next(r for r in plan_rows(res, 10) if r["dp"] > 1)
    served = serve_at(r1, h200, plan_mesh(wide), 6.0, wl.prompt_lengths(), wl.output_lengths(), "fp8", "fp8",
                      max_num_seqs=wide["batch_cap"], with_capacity=False)
    assert wide["rank_wait_ms"] > 1.0
    assert wide["rank_wait_ms"] == pytest.approx(served["rank_wait_ms"], rel=0.01)
    f = {e.name: e for e in plan_formulas(r1, h200, wide, wl, None, served)}
    assert f["rank_wait_ms"].value == pytest.approx(wide["rank_wait_ms"], rel=1e-9)
    c = res.columns                                        # TP 8 (EP 1 or inside TP): costed, rejected, no wait
    tp8 = (c["tp"] == 8) & (c["reason"] != "mesh")
    assert tp8.any() and all(c["rank_wait_ms"][tp8] == 0)


@pytest.mark.parametrize("mu,R", [(0.02, 8), (0.1, 8), (0.5, 4), (2.0, 16)])
def test_the_busiest_ranks_prompts_by_a_direct_sum(mu, R):
    """E[⌈K/R⌉] summed over K directly; one rank's is its own mean; the lesson's sentence quotes them."""
    from calculators.planning.rank_wait import busiest_rank_claim, busiest_rank_prompts
    direct = sum(_pmf(R * mu, K) * -(-K // R) for K in range(600))
    assert float(busiest_rank_prompts(mu, R)) == pytest.approx(direct, rel=1e-9)
    assert float(busiest_rank_prompts(mu, 1)) == mu
    text = busiest_rank_claim(mu, R)
    assert f"{1 - math.exp(-R * mu):.0%} of them" in text and f"prefills {direct:.2f} prompts a step" in text


def test_the_wait_is_worded_only_where_ranks_wait():
    """The page's sentence quotes the step and the wait for 2+ ranks and a wait > 0; nothing for one rank, no wait,
    or a step that does not exist (unstable)."""
    from calculators.planning.rank_wait import rank_wait_words
    assert rank_wait_words(22.34, 108.6, 4) == (
        " Of each 109 ms step, 22.3 ms is spent waiting for the busiest of the 4 attention ranks: a new request's "
        "prompt is prefilled on one rank, and every MoE layer waits for it.")
    assert rank_wait_words(22.3, 108.6, 1) == rank_wait_words(0.0, 108.6, 8) == rank_wait_words(5.0, math.inf, 8) == ""


def test_the_commands_print_the_wait_for_attention_dp_and_not_for_tp(capsys):
    """`serve-at` prints rank_wait_ms (serve_at's own value) for DP 8 × EP 8 and no such line for TP 8 with EP 8;
    `plan` says it for its attention-DP rows only."""
    import json
    from calculators.cli import main
    args = ["--model", "deepseek-r1", "--gpu", "h200", "--rate", "4", "--prompt-tokens", "1000", "--output-tokens",
            "1000", "--weight-dtype", "fp8", "--profile", "none"]
    assert main(["serve-at", *args, "--tp", "1", "--ep", "8", "--gpus", "8"]) == 0
    text = capsys.readouterr().out
    r1, h200 = load_preset("deepseek-r1"), load_device("h200")
    want = serve_at(r1, h200, Mesh(tp=1, ep=8, gpus=8), 4.0, 1000, 1000, "fp8", None, "vllm")["rank_wait_ms"]
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("rank_wait_ms"))
    assert float(line.split()[1]) == pytest.approx(want, rel=1e-3) and want > 0
    assert main(["serve-at", *args, "--tp", "8", "--ep", "8"]) == 0
    assert "rank_wait_ms" not in capsys.readouterr().out
    assert main(["plan", "--model", "deepseek-r1", "--gpu", "h200", "--rate", "6", "--prompt-tokens", "1000",
                 "--output-tokens", "2000", "--ttft-ms", "3000", "--itl-ms", "150", "--profile", "none", "--top",
                 "10", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert any(p["dp"] > 1 for p in plans) and all((p["rank_wait_ms"] > 0) == (p["dp"] > 1) for p in plans)
    assert main(["plan", "--model", "deepseek-r1", "--gpu", "h200", "--rate", "6", "--prompt-tokens", "1000",
                 "--output-tokens", "2000", "--ttft-ms", "3000", "--itl-ms", "150", "--profile", "none", "--top",
                 "10"]) == 0
    ranked = [ln for ln in capsys.readouterr().out.splitlines() if re.match(r"\s*\d+\. ", ln)]
    assert ranked and all(("waiting for the busiest attention rank" in ln) == ("attention, EP" in ln)
                          for ln in ranked)
    assert any("attention, EP" not in ln for ln in ranked)
