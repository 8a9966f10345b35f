"""The steady state of a loaded server (calculators/serving/steady_state.py) against its referee, the
discrete-event simulator, and each formula against a second computation: lognormal p99 against sampling, the slot
chain against a brute-force birth-death loop (and Erlang C where the step is flat), Little's law against the
simulator's own counts, the deployment step against `throughput.step_time`."""
from __future__ import annotations

import math

import numpy as np
import pytest

from calculators.multi_gpu.tensor_parallel import Mesh, _link_for
from calculators.planning.serve_at import decode_context, serve_at, step_cost
from calculators.planning.throughput import max_throughput, step_time
from calculators.serving.batching import step_model_for
from calculators.serving.lengths import Lengths, lognormal_sigma, preset
from calculators.serving.serving_sim import littles_law, simulate_continuous
from calculators.serving.steady_state import (Load, capacity, operating_point, slot_wait_law, step_fn_for_model)
from calculators.serving.workload import Workload
from calculators.sizing.latency import Efficiency
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset
from specs.stacks import load_stack

L8, L70, MIX = load_preset("llama-3-8b"), load_preset("llama-3-70b"), load_preset("mixtral-8x7b")
H100 = load_device("h100")
MODEL = step_model_for(L8, H100, "bf16", efficiency=Efficiency(), overhead_ms=2.0)


# ------------------------------------------------------------------------------------------ lengths
def test_lognormal_from_mean_and_p99_matches_sampling():
    d = Lengths.from_mean_p99(1000, 4000)
    x = np.exp(math.log(1000) - lognormal_sigma(1000, 4000) ** 2 / 2
               + lognormal_sigma(1000, 4000) * np.random.default_rng(0).standard_normal(400_000))
    assert np.mean(x) == pytest.approx(1000, rel=0.01)
    assert np.percentile(x, 99) == pytest.approx(4000, rel=0.02)
    assert d.mean_tokens == pytest.approx(1000, rel=0.01)          # the quantile grid keeps the mean
    assert d.quantile(0.99) == pytest.approx(4000, rel=0.02)
    s = d.sample(200_000, np.random.default_rng(1))
    assert np.percentile(s, 99) == pytest.approx(4000, rel=0.03)


def test_geometric_moments_equal_the_closed_form():
    q = 1 / 300
    g = Lengths.geometric(300)
    assert g.mean_tokens == pytest.approx(300, rel=1e-6)
    assert g.second_moment == pytest.approx((2 - q) / q ** 2, rel=1e-6)
    assert g.scv == pytest.approx(1 - q, rel=1e-4)


@pytest.mark.parametrize("mean,p99,match", [(1000, 500, "cannot be below the mean"),
                                            (100, 2000, "no lognormal has p99 / mean")])
def test_impossible_distributions_are_one_clear_message(mean, p99, match):
    with pytest.raises(SpecError, match=match):
        Lengths.from_mean_p99(mean, p99)


def test_presets_name_their_sources():
    r = preset("reasoning")
    assert r["output"].mean_tokens > 3000 and r["output"].quantile(0.99) > 15_000 and "MLPerf" in r["source"]
    with pytest.raises(SpecError, match="chat, reasoning"):
        preset("nope")


# ------------------------------------------------------------------------------------------ slot chain
def _birth_death_brute(lam, steps, step_at, B, top=20_000):
    """P(N ≥ B) and P(wait) by building the chain's weights state by state (a plain loop, no closed forms)."""
    w = [1.0]
    for j in range(1, top):
        running = min(j, B)
        leave = running / (steps * step_at(running) / 1e3)      # requests finishing per second with j held
        w.append(w[-1] * lam / leave)
        if w[-1] < 1e-300 * sum(w):
            break
    w = np.array(w) / sum(w)
    return float(w[B:].sum())


@pytest.mark.parametrize("slope", [0.0, 0.02])
def test_slot_wait_probability_equals_the_birth_death_chain_by_brute_force(slope):
    lam, steps, B = 1.2, 500, 16
    step_at = lambda j: 10.0 + slope * np.asarray(j, dtype=float)        # noqa: E731
    p_wait, _ = slot_wait_law(np.array(lam), steps, step_at, B)
    assert float(p_wait) == pytest.approx(_birth_death_brute(lam, steps, step_at, B), rel=1e-6)


def test_a_flat_step_gives_erlang_c():
    """Flat step: M/M/c with c = 16, A = λ·steps·step = 12 Erlangs; Erlang C by its textbook sum."""
    lam, steps, step, c = 2.4, 500, 10.0, 16
    A = lam * steps * step / 1e3
    top = A ** c / math.factorial(c) * c / (c - A)
    erlang_c = top / (sum(A ** k / math.factorial(k) for k in range(c)) + top)
    p_wait, mean_cond = slot_wait_law(np.array(lam), steps, lambda j: step + 0 * np.asarray(j, float), c)
    assert float(p_wait) == pytest.approx(erlang_c, rel=1e-9)
    assert float(mean_cond) == pytest.approx(1 / (c / (steps * step / 1e3) - lam), rel=1e-9)


# ------------------------------------------------------------------------------------------ against the simulator
def _sim_vs_model(I, O, B, chunk, u, n_min=4000, seed=0):
    load = Load(Lengths.fixed(I), Lengths("geometric", float(O), maximum=8192 - I),
                chunk=chunk or math.inf, slots=B)
    step = step_fn_for_model(MODEL, load)
    lam = u * float(capacity(step, load))
    op = operating_point(step, lam, load)
    R = O * float(op["tpot_ms"]) / 1e3                        # a request's time in the replica, s
    relax = max(R / (1 - u), R / (B * (1 - math.sqrt(u)) ** 2))
    n = int(min(60_000, max(n_min, 15 * lam * relax)))
    rng = np.random.default_rng(seed)
    w = Workload(np.cumsum(rng.exponential(1 / lam, n)), load.prompt.sample(n, rng), load.output.sample(n, rng))
    r = simulate_continuous(MODEL, w, B, chunk_tokens=chunk)
    keep = slice(n // 3, None)
    tpot = r.tpot[keep][np.isfinite(r.tpot[keep])] * 1e3
    ttft = r.ttft[keep] * 1e3
    return op, r, dict(tpot=tpot.mean(), ttft_p50=np.percentile(ttft, 50), ttft_p99=np.percentile(ttft, 99))


# The declared grid of this test (bench/bench_steady_state.py prints the full 72-point grid, loads up to 95%).
GRID = [(1000, 100, 16, None, 0.5), (1000, 100, 256, 512, 0.8), (1000, 100, 1024, None, 0.5),
        (500, 500, 16, 512, 0.5), (500, 500, 256, None, 0.8), (500, 500, 1024, None, 0.8),
        (100, 1000, 256, None, 0.5), (100, 1000, 1024, 512, 0.5), (100, 1000, 16, None, 0.5),
        (100, 1000, 256, 512, 0.8), (1000, 100, 256, None, 0.1), (500, 500, 1024, 512, 0.1)]


@pytest.mark.parametrize("I,O,B,chunk,u", GRID)
def test_steady_state_agrees_with_the_simulator(I, O, B, chunk, u):
    op, _, sim = _sim_vs_model(I, O, B, chunk, u)
    assert float(op["tpot_ms"]) == pytest.approx(sim["tpot"], rel=0.10)
    assert float(op["ttft_p50_ms"]) == pytest.approx(sim["ttft_p50"], rel=0.10)
    assert float(op["ttft_p99_ms"]) == pytest.approx(sim["ttft_p99"], rel=0.20)


def test_in_flight_is_littles_law_on_the_simulators_own_counts():
    op, r, _ = _sim_vs_model(500, 500, 256, None, 0.5)
    ll = littles_law(r, trim=0.3)
    assert ll["L"] == pytest.approx(ll["lambda_W"], rel=0.05)             # the simulator obeys Little's law
    # and the steady state finds its L (12% high here: it counts a token at the count-weighted mean step)
    assert float(op["in_flight"]) == pytest.approx(ll["L"], rel=0.15)


def test_capacity_is_where_the_steady_state_stops_existing():
    load = Load(Lengths.fixed(500), Lengths.geometric(500), slots=256)
    step = step_fn_for_model(MODEL, load)
    cap = float(capacity(step, load))
    assert bool(operating_point(step, 0.995 * cap, load)["stable"])
    assert not bool(operating_point(step, 1.01 * cap, load)["stable"])


# ------------------------------------------------------------------------------------------ a deployment's step
@pytest.mark.parametrize("config,mesh,wd", [(L70, Mesh(tp=4), "fp8"), (L70, Mesh(tp=2, pp=2), "bf16"),
                                            (MIX, Mesh(tp=2, ep=2), "bf16"), (MIX, Mesh(tp=1, ep=4, gpus=4), "fp8")])
def test_the_mixed_step_is_throughputs_step_when_every_request_is_queued(config, mesh, wd):
    """n = B decode rows, p = B·I/O prompt tokens at context I + O/2: `throughput.step_time` exactly (the step is
    interpolated on a token grid, so 0.5%)."""
    stack = load_stack(None)
    eff, link = Efficiency.for_stack(stack, H100), _link_for(H100, None)
    I, O = 2000, 500
    f = step_cost(config, H100, mesh, wd, wd, eff, link, stack, decode_context(Lengths.fixed(I), Lengths.fixed(O)), I)
    for B in (1, 8, 96, 512):
        want = step_time(config, H100, mesh, B, I, O, wd, wd, eff, link, stack)["step_ms"]
        got = float(f(B, B * I / O))
        assert got == pytest.approx(want, rel=0.005), B


def test_serve_at_never_reports_more_capacity_than_the_maximum_throughput():
    for mesh, rate in ((Mesh(tp=4), 10.0), (Mesh(tp=4, gpus=8), 10.0), (Mesh(tp=8), 3.0)):
        r = serve_at(L70, H100, mesh, rate, 2000, 500, "fp8", "fp8")
        mt = max_throughput(L70, H100, mesh, 2000, 500, "fp8", "fp8")
        assert r["capacity_requests_per_s"] <= mt["requests_per_s"] * (1 + 1e-9)
        assert r["stable"] == (rate <= r["capacity_requests_per_s"])
    over = serve_at(L70, H100, Mesh(tp=4), 10.0, 2000, 500, "fp8", "fp8")
    assert not over["stable"] and "serves at most" in over["verdict"] and math.isinf(over["ttft_p99_ms"])


def test_long_output_tails_cost_capacity_that_a_mean_cannot_see():
    """Same means, one with the reasoning tail: the tail holds more KV per decoding sequence (the time-weighted
    context E[O²]/2E[O] is larger), so the capacity is lower."""
    r = preset("reasoning")
    L31 = load_preset("llama-3.1-8b")                       # 128k context: the 20k-token tail fits
    fixed = serve_at(L31, H100, Mesh(), 0.1, int(r["prompt"].mean_tokens), int(round(r["output"].mean_tokens)), "fp8")
    tail = serve_at(L31, H100, Mesh(), 0.1, r["prompt"], r["output"], "fp8")
    assert tail["capacity_requests_per_s"] < fixed["capacity_requests_per_s"]
