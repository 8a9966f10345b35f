"""The steady state of a loaded server (calculators/serving/steady_state.py) against its referee, the
discrete-event simulator (the whole grid of issue 26, stored by bench/steady_state_referee.py and re-simulated in
part live), and each formula against a second computation: lognormal p99 against sampling, the slot chain against
a brute-force birth-death loop (and Erlang C where the step is flat), the prefill budget's tail against Lindley's
recursion, Little's law against the simulator's own counts, the deployment step against `throughput.step_time`."""
from __future__ import annotations

import dataclasses
import heapq
import json
import math

import numpy as np
import pytest

from bench.steady_state_referee import GRID as REFEREE_GRID, PATH as REFEREE_PATH, key as referee_key, load_for, \
    pooled, pooled_standard_error, referee_point, simulate_point
from calculators.multi_gpu.tensor_parallel import Mesh, _link_for
from calculators.planning.serve_at import _replica, decode_context, serve_at
from calculators.planning.step import step_cost
from calculators.planning.throughput import max_throughput, step_time
from calculators.serving.batching import step_model_for
from calculators.serving.lengths import Lengths, lognormal_sigma, preset
from calculators.serving.serving_sim import littles_law, simulate_continuous
from calculators.serving.steady_state import (LEVELS, Load, _chain_ttft_quantiles, _stream_ttft_levels, capacity, chain_tpot_excess, context_spread,
                                              full_batch_age_excess, mean_step,
                                              decode_decay, decode_lag_weights, operating_point,
                                              prefill_wait_quantile_s, prefill_wait_tail, prompt_chain,
                                              row_context_moments, service_shape, slot_wait_law, step_fn_for_model,
                                              step_wander_ms, STREAM_W, stream_arrivals_pmf, stream_backlog_at,
                                              stream_backlog_cdf, stream_backlog_law, stream_backlog_mix)
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


def test_a_slot_time_without_variability_halves_the_full_batch_wait():
    """Kingman / Allen-Cunneen: the wait given a wait scales with (c_a² + c_s²)/2; P(wait) does not change."""
    lam, steps, c = 2.4, 500, 16
    flat = lambda j: 10.0 + 0 * np.asarray(j, float)                      # noqa: E731
    p1, m1 = slot_wait_law(np.array(lam), steps, flat, c)
    p0, m0 = slot_wait_law(np.array(lam), steps, flat, c, scv=0.0)
    assert float(p0) == float(p1) and float(m0) == pytest.approx(float(m1) / 2, rel=1e-12)


def _gi_m_c(lam, mean_s, c, ca2, n=400_000, seed=0):
    """P(wait) and E[wait | wait] of a GI/M/c queue, FCFS, by the Kiefer-Wolfowitz recursion over customers (a
    plain loop): renewal arrivals with squared coefficient of variation ca2 (balanced hyperexponential above 1,
    Erlang-2 at 0.5), exponential service."""
    rng = np.random.default_rng(seed)
    if ca2 > 1:
        p1 = (1 + math.sqrt((ca2 - 1) / (ca2 + 1))) / 2
        gaps = np.where(rng.random(n) < p1, rng.exponential(1 / (2 * p1 * lam), n),
                        rng.exponential(1 / (2 * (1 - p1) * lam), n))
    else:
        gaps = rng.gamma(2.0, 1 / (2 * lam), n)
    arrival, service = np.cumsum(gaps), rng.exponential(mean_s, n)
    free, wait = [0.0] * c, np.empty(n)
    for i in range(n):
        f = heapq.heappop(free)
        wait[i] = max(0.0, f - arrival[i])
        heapq.heappush(free, arrival[i] + wait[i] + service[i])
    wait = wait[n // 10:]
    return float(np.mean(wait > 0)), float(wait[wait > 0].mean())


@pytest.mark.parametrize("rho,ca2", [(0.95, 2.0), (0.9, 0.5)])
def test_dispersed_arrivals_give_the_gi_m_c_queue(rho, ca2):
    """Arrivals with index of dispersion I = c_a² (a renewal stream): the chain's log-weights divided by
    z = (1 + I)/2 against a simulated GI/M/c queue with 100 slots, 4 runs of 400,000 customers (P(wait) and the
    wait given a wait within 8%; one run's spread is 5-8%); the Poisson chain (z = 1) misses the wait by 30-50%."""
    steps, step, c = 500, 10.0, 100
    mean_s = steps * step / 1e3
    lam = rho * c / mean_s
    flat = lambda j: step + 0 * np.asarray(j, float)                        # noqa: E731
    z = (1 + ca2) / 2
    p_wait, mean_cond = slot_wait_law(np.array(lam), steps, flat, c, dispersion=lambda j: z + 0 * np.asarray(j, float))
    sim_p, sim_mean = np.mean([_gi_m_c(lam, mean_s, c, ca2, seed=s) for s in range(4)], axis=0)
    assert float(p_wait) == pytest.approx(sim_p, rel=0.08)
    assert float(mean_cond) == pytest.approx(sim_mean, rel=0.08)
    poisson = slot_wait_law(np.array(lam), steps, flat, c)
    assert abs(float(poisson[1]) / sim_mean - 1) > 0.25


def _context_variance_rate(load, occupants=200_000, batch=4000, seed=0):
    """One slot's cached context, step by step, for back-to-back occupants drawn from the lengths (k prefill
    steps that read nothing, then decode steps reading I, I + 1, ...): the variance of its sums over batches of
    `batch` steps, per step (batch means)."""
    rng = np.random.default_rng(seed)
    I = load.prompt.sample(occupants, rng).astype(float)
    O = load.output.sample(occupants, rng).astype(int)
    k = int(round(load.prefill_steps))
    held = k + O - 1
    pos = np.arange(held.sum()) - np.repeat(np.cumsum(held) - held, held)     # step within the occupancy
    who = np.repeat(np.arange(occupants), held)
    ctx = np.where(pos >= k, I[who] + pos - k, 0.0)
    m = len(ctx) // batch
    return float(ctx[: m * batch].reshape(m, batch).sum(axis=1).var(ddof=1) / batch)


def test_a_slots_context_spread_by_hand_and_by_a_long_run():
    """Two-point lengths by hand: I ∈ {50, 150}, O ∈ {3, 5}: X = O, R = (O − 1)·I + (O − 1)(O − 2)/2 ∈
    {101, 301, 206, 606}, c = E[R]/E[X] = 303.5/4; R − c·X = ±126.625 / 73.375, −173.375 / 226.625;
    E[(R − cX)²] = 25,708.89, / E[X] = 6,427.22. Fixed lengths: 0. Geometric outputs with random prompts: the
    variance rate of a simulated slot's context (4 million steps, batch means) within 10%."""
    two = Load(Lengths.histogram([50, 150]), Lengths.histogram([3, 5]))
    assert context_spread(two) == pytest.approx(102_835.5625 / 4 / 4, rel=1e-9)
    assert context_spread(Load(Lengths.fixed(500), Lengths.fixed(500))) == pytest.approx(0, abs=1e-6)
    geo = Load(Lengths.histogram([50, 150]), Lengths.geometric(20))
    assert context_spread(geo) == pytest.approx(_context_variance_rate(geo), rel=0.10)


def _lindley_p99(rho, service, n=400_000, seed=0):
    """The M/G/1 wait's p99 by Lindley's recursion W' = max(0, W + S − A) over n customers (a plain loop)."""
    rng = np.random.default_rng(seed)
    a = rng.exponential(1 / rho, n)                  # mean service 1 -> arrival rate ρ
    s = service(rng, n)
    w, out = 0.0, np.empty(n)
    for i in range(n):
        out[i] = w
        w = max(0.0, w + s[i] - a[i])
    return float(np.percentile(out[n // 10:], 99))


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8])
def test_the_prefill_budget_tail_matches_lindleys_recursion(rho):
    """Fixed prompts (M/D/1) against a simulated queue (within 6%: the tail is Cramér-Lundberg's asymptote, not
    the exact law); exponential service against M/M/1's exact p99 (2%: the lengths' grid is binned; not at
    ρ = 0.1, where η = 0.9·μ sits by the pole of E[e^(ηS)], carried by prompts past 17× the mean that a finite
    grid of lengths does not hold)."""
    fixed = (np.array([1.0]), np.array([1.0]))
    got = float(prefill_wait_quantile_s(np.array(rho), 1.0, fixed, 0.99))
    assert got == pytest.approx(_lindley_p99(rho, lambda rng, n: np.ones(n)), rel=0.06)
    expo = service_shape(Lengths.geometric(2000))      # geometric with a large mean: exponential service
    mm1 = math.log(rho / 0.01) / (1 - rho)                 # P(W > t) = ρ·e^(−(1 − ρ)t), μ = 1
    if rho >= 0.5:
        assert float(prefill_wait_quantile_s(np.array(rho), 1.0, expo, 0.99)) == pytest.approx(mm1, rel=0.02)


# ------------------------------------------------------------------------------------------ TPOT
def test_a_requests_step_weights_by_hand():
    """Outputs 3 or 5: a request's TPOT averages its steps 2..O after its arrival step, each by 1/(O − 1):
    h = (1/2 + 1/4)/2 at lags 2 and 3, (1/4)/2 at 4 and 5, 0 beyond (they sum to 1)."""
    h = decode_lag_weights(Lengths.histogram([3, 5]))
    assert h[:5] == pytest.approx([0.375, 0.375, 0.125, 0.125, 0.0], abs=1e-12)


@pytest.mark.parametrize("mu", [-0.5, 0.3, 0.9, 0.999])
def test_the_decay_weight_is_its_double_sum(mu):
    """G(μ) = E[Σ_(i=1..O−1) μⁱ / (O − 1) | O ≥ 2] against the plain double loop over lengths and lags (the table is
    interpolated: 0.2%)."""
    for out in (Lengths.geometric(20), Lengths.histogram([2, 7, 40], [1, 2, 1])):
        x, w = out._grid()
        total = sum(p * sum(mu ** i for i in range(1, int(o))) / (o - 1) for o, p in zip(x, w) if o >= 2)
        assert float(decode_decay(out, mu)) == pytest.approx(total / sum(p for o, p in zip(x, w) if o >= 2), rel=2e-3)


def _step_process_tpot(step, lam, prompt, out_mean, steps=200_000, seed=0):
    """A replica step by step (a plain loop): step k carries the K_k prompts that arrived during step k − 1
    (Poisson(λ·τ_(k−1))) beside the n_k requests decoding, and takes τ_k = step(n_k, K_k·prompt); a request
    prefilled in step k decodes in steps k+1..k+O−1 (O geometric). Returns the mean step and the mean over requests
    (O ≥ 2) of their TPOT."""
    rng = np.random.default_rng(seed)
    tau, born = np.empty(steps), np.zeros(steps, dtype=np.int64)
    ends, outs, k, n = np.zeros(steps + 1, dtype=np.int64), [], 0, 0
    for s in range(steps):
        n -= ends[s]
        tau[s] = float(step(n, k * prompt))
        o = rng.geometric(1 / out_mean, k)
        np.add.at(ends, np.minimum(s + o, steps), 1)
        n, born[s] = n + k, k
        outs.append(o)
        k = rng.poisson(lam * tau[s] / 1e3)
    o, pre = np.concatenate(outs), np.repeat(np.arange(steps), born)
    T = np.r_[0.0, np.cumsum(tau)]
    keep = (o >= 2) & (pre + o < steps) & (pre > steps // 10)
    return tau[steps // 10:].mean(), float(np.mean((T[pre[keep] + o[keep]] - T[pre[keep] + 1]) / (o[keep] - 1)))


@pytest.mark.parametrize("per_row", [0.0, 0.05])
def test_tpot_above_the_mean_step_matches_a_step_by_step_replica(per_row):
    """Whole 1000-token prompts at 20 ms each (a step with a prompt gathers the next: the prompt chain is at 0.8 of
    its own instability), outputs geometric with mean 20. TPOT − mean step (each against its own mean step) within
    6% of the plain loop's; where the step also grows with the number decoding (0.05 ms a row), the prompt chain
    at a fixed number decoding (`chain_tpot_excess`) misses it by more than 10%."""
    step = lambda n, p: 10 + per_row * np.asarray(n, float) + 0.02 * np.asarray(p, float)   # noqa: E731
    load = Load(Lengths.fixed(1000), Lengths.geometric(20))
    op = operating_point(step, 40.0, load)
    sim_tau, sim_tpot = _step_process_tpot(step, 40.0, 1000, 20)
    want = sim_tpot - sim_tau
    assert float(op["tpot_ms"] - op["step_ms"]) == pytest.approx(want, rel=0.06)
    chain_only = float(chain_tpot_excess(*prompt_chain(step, op["decode_rows"], np.asarray(40.0), load), 40.0,
                                         load.output))
    assert (chain_only == pytest.approx(want, rel=0.06)) if per_row == 0 else chain_only < 0.9 * want


def test_outputs_that_are_not_memoryless_keep_the_prompt_chains_part_only():
    """The number decoding's part assumes each sequence leaves at one rate whatever its age (geometric outputs):
    with fixed outputs TPOT − mean step is the prompt chain's part alone."""
    step = lambda n, p: 10 + 0.05 * np.asarray(n, float) + 0.02 * np.asarray(p, float)    # noqa: E731
    load = Load(Lengths.fixed(1000), Lengths.fixed(20))
    op = operating_point(step, 40.0, load)
    chain = chain_tpot_excess(*prompt_chain(step, op["decode_rows"], np.asarray(40.0), load), 40.0, load.output)
    assert float(op["tpot_ms"] - op["step_ms"]) == pytest.approx(float(chain), rel=1e-9)


# ------------------------------------------------------------------------------------------ the token stream
FIXED_500 = Load(Lengths.fixed(500), Lengths.geometric(500), chunk=512)


def test_the_token_streams_backlog_by_hand_at_light_load():
    """500-token prompts, 512-token chunks, m = 0.01 prompts a step (units of 4 tokens: a prompt is 125, a chunk
    128). A backlog is left only when two prompts arrive in one step: 1000 − 512 = 488 tokens (122 units), taken by
    the next step, so P(Q = 122) = P(K = 2)·P(Q = 0) ≈ e^(−0.01)·0.01²/2 = 4.9502e-5; three prompts leave 988
    (247 units, 1.65e-7), and 476 (119 units) is left two ways: a prompt arriving behind 488 (4.95e-5 × 0.0099 =
    4.90e-7) or nothing arriving behind 988 (1.65e-7 × 0.990 = 1.63e-7)."""
    pi, L = stream_backlog_law(stream_arrivals_pmf(0.01, FIXED_500.prompt, 4.0, 512), 1.0)
    assert float(pi[122]) == pytest.approx(math.exp(-0.01) * 0.01 ** 2 / 2, rel=1e-3)
    assert float(pi[247]) == pytest.approx(math.exp(-0.01) * 0.01 ** 3 / 6, rel=0.02)
    assert float(pi[119]) == pytest.approx(4.90e-7 + 1.63e-7, rel=0.02)
    assert float(1 - pi[0]) == pytest.approx(4.95e-5 + 1.65e-7 + 6.53e-7, rel=0.01)


def _token_stream(m, I, c, steps, seed=0):
    """The slotted queue by brute force, a plain loop: K ~ Poisson(m) prompts of I tokens arrive during a step and
    queue at its end; a step takes the first c tokens of the queue. Per step, the tokens left after it; per
    request, the steps from its arrival to the end of the step that takes its last token (arrival uniform in its
    step; those before it in the same step are ahead of it)."""
    rng = np.random.default_rng(seed)
    K = rng.poisson(m, steps)
    left, ttft, q = np.empty(steps), [], 0
    for k in range(steps):
        if K[k]:
            u = np.sort(rng.random(K[k]))
            ttft.append((1 - u) + np.ceil((q + I * np.arange(1, K[k] + 1)) / c))
            q += K[k] * I
        q = max(q - c, 0)
        left[k] = q
    return left[steps // 10:], np.concatenate(ttft)


@pytest.mark.parametrize("m,tol_p,tol_t", [(0.49, 0.005, 0.02), (0.83, 0.025, 0.05)])
def test_the_token_stream_equals_a_direct_simulation(m, tol_p, tol_t):
    """The backlog's law (exact below two chunks, the Cramér-Lundberg tail above) and the TTFT in steps (a flat
    step of 1 ms, replica always busy) against 300,000 simulated steps of the stream: P(Q = 0), P(Q ≤ 1 chunk),
    P(Q ≤ 4 chunks) and TTFT p50 and p99. At 48% of the budget (m = 0.49) within 0.005 and 2%: the 500-token
    prompts share steps, so the median is 1.8 steps where "one prompt per step" says 1.5. At 81% (m = 0.83) the
    tail glued at two chunks is a little light: P(Q ≤ 1 chunk) 0.60 against 0.58, TTFT 2-6% short."""
    left, ttft = _token_stream(m, 500, 512, 300_000)
    pi, L = stream_backlog_law(stream_arrivals_pmf(m, FIXED_500.prompt, 4.0, 512),
                               prefill_wait_tail(np.array(m * 500 / 512), service_shape(FIXED_500.prompt))[0] * 4 / 500)
    cdf = np.cumsum(pi)
    assert float(pi[0]) == pytest.approx(np.mean(left == 0), abs=tol_p)
    assert float(cdf[128]) == pytest.approx(np.mean(left <= 512), abs=tol_p)
    y = prefill_wait_tail(np.array(m * 500 / 512), service_shape(FIXED_500.prompt))[0]
    above = 1 - float(pi[L]) * math.exp(-float(y) / 500 * (2048 - 4 * L))
    assert above == pytest.approx(np.mean(left <= 2048), abs=tol_p)
    flat = lambda n, p: 1.0 + 0 * np.asarray(n, float) + 0 * np.asarray(p, float)     # noqa: E731
    X, _ = _stream_ttft_levels(flat, 0.0, m * 1e3, 1.0, 0.0, FIXED_500, 1.0, (0.5, 0.99))
    assert float(X[0]) == pytest.approx(np.percentile(ttft, 50), rel=tol_t)
    assert float(X[1]) == pytest.approx(np.percentile(ttft, 99), rel=tol_t)


@pytest.mark.parametrize("prompt", [Lengths.fixed(500), Lengths.from_mean_p99(700, 2000)])
def test_the_tabulated_backlog_is_the_chain_solved_at_that_load(prompt):
    """The table (1 − ρ in steps of 10^(1/16), interpolated) against the chain solved at ρ itself, off the grid:
    the backlog's CDF within 0.002 and the tail's decay within 1.5%."""
    for rho in (0.3, 0.7, 0.97):
        law, L, eta = stream_backlog_at(prompt, 512.0, np.array([rho]))
        exact_eta = float(prefill_wait_tail(np.array(rho), service_shape(prompt))[0]) * 4 / prompt.mean_tokens
        pi, _ = stream_backlog_law(stream_arrivals_pmf(rho * 512 / prompt.mean_tokens, prompt, 4.0, 512), exact_eta)
        assert np.abs(np.cumsum(law[0]) - np.cumsum(pi)).max() < 0.002, rho
        assert float(eta[0]) == pytest.approx(exact_eta, rel=0.015), rho


def _wandering_stream(m, rel_sd, I, c, steps, relax=2000, seed=0):
    """The slotted token stream of `_token_stream` whose prompts per step wander slowly: Poisson(m·(1 + δ_k)),
    δ an AR(1) of standard deviation rel_sd relaxing in `relax` steps (a plain loop). The tokens left per step."""
    rng = np.random.default_rng(seed)
    phi = 1 - 1 / relax
    noise = rng.normal(0.0, rel_sd * math.sqrt(1 - phi * phi), steps)
    left, q, d = np.empty(steps), 0, rng.normal(0.0, rel_sd)
    for k in range(steps):
        d = phi * d + noise[k]
        q = max(q + rng.poisson(m * max(1 + d, 0.0)) * I - c, 0)
        left[k] = q
    return left[steps // 10:]


def test_the_wandering_backlog_is_the_mixture_of_its_laws():
    """`stream_backlog_mix`: with no wander it is the law at ρ; with the budget's load wandering by 8% over ~2,000
    steps (the queue at 72% relaxes in tens) it is the quasi-static mixture, against 600,000 steps of the stream
    whose prompts per step wander so. The chain at a still load is itself 0.006-0.012 off the still stream there
    (the glued tail), so: P(Q = 0), P(Q ≤ 1 chunk) and P(Q ≤ 4 chunks) within 0.025 (0.012-0.021 found; the
    seeds' own spread is ±0.009), and each nearer than the law at the mean load (off by 0.023-0.032)."""
    rho = 0.72
    law, L, eta = stream_backlog_at(FIXED_500.prompt, 512.0, np.array([rho]))
    same, _, _ = stream_backlog_mix(FIXED_500.prompt, 512.0, np.array([rho]), np.array([0.0]))
    assert np.abs(same[0] - law[0]).max() < 1e-12
    mix, L, eta_z = stream_backlog_mix(FIXED_500.prompt, 512.0, np.array([rho]), np.array([0.08]))
    left = _wandering_stream(rho * 512 / 500, 0.08, 500, 512, 600_000)
    for y in (0, 512, 2048):
        at = np.array([[y / 4.0]])                        # units of 4 tokens
        mixed = sum(w * float(stream_backlog_cdf(mix[:, z], L, eta_z[:, z], at)[0, 0]) for z, w in enumerate(STREAM_W))
        sim = float(np.mean(left <= y))
        assert mixed == pytest.approx(sim, abs=0.025), y
        assert abs(mixed - sim) < abs(float(stream_backlog_cdf(law, L, eta, at)[0, 0]) - sim), y


def _rows_by_steps(lam, a, s0, beta, prompt, out_mean, steps=120_000, seed=0):
    """Rows decoding, step by step (a plain loop): step k lasts τ_k = a + Σ_rows (s0 + β·c) ms, c a row's cached
    context; Poisson(λ·τ_k) prompts of `prompt` tokens join after it, every row's context grows by one, and each row
    leaves with probability 1/out_mean (geometric outputs). Returns the steps' τ and the rows' contexts, sampled."""
    rng = np.random.default_rng(seed)
    ctx, taus, seen = np.empty(0), np.empty(steps), []
    for k in range(steps):
        taus[k] = a + s0 * len(ctx) + beta * ctx.sum()
        ctx = ctx[rng.random(len(ctx)) >= 1 / out_mean] + 1
        ctx = np.r_[ctx, np.full(rng.poisson(lam * taus[k] / 1e3), float(prompt))]
        if k % 97 == 0 and k > steps // 10:
            seen.append(ctx)
    return taus[steps // 10:], np.concatenate(seen)


@pytest.mark.parametrize("s0,beta", [(0.05, 0.0), (0.0, 1e-4), (0.02, 5e-5)])
def test_the_steps_wander_matches_a_step_by_step_population(s0, beta):
    """σ of the step from the rows' number and context (`step_wander_ms`: compound Poisson over the rows, times
    1/(1 − x) for the arrivals a longer step brings) and a row's context moments (`row_context_moments`) against
    the plain loop: 500-token prompts, outputs geometric with mean 60, a 10 ms fixed part, λ at a loop gain x of
    0.45. E[c], E[c²] within 2% (0.05% found), the mean step within 3% (1.5%), σ within 6% (2-4%)."""
    out_mean, a, I = 60, 10.0, 500
    load = Load(Lengths.fixed(I), Lengths.geometric(out_mean), chunk=512)
    ec, ec2 = row_context_moments(load)
    slope = s0 + beta * ec
    lam = 0.45 / (slope * (out_mean - 1)) * 1e3                             # per s: the loop gain x = λ·s/γ = 0.45
    n = lam / 1e3 * (out_mean - 1) * a / (1 - lam / 1e3 * (out_mean - 1) * slope)
    t = a + slope * n

    def step(rows, p):
        return a + slope * np.asarray(rows, dtype=float) + 0 * np.asarray(p, dtype=float)
    step.ms_per_context_token = lambda rows, p: beta + 0 * np.asarray(rows, dtype=float)
    taus, ctx = _rows_by_steps(lam, a, s0, beta, I, out_mean)
    assert np.mean(ctx) == pytest.approx(ec, rel=0.02)
    assert np.mean(ctx ** 2) == pytest.approx(ec2, rel=0.02)
    assert np.mean(taus) == pytest.approx(t, rel=0.03)
    assert float(step_wander_ms(step, np.array(n), lam, np.array(0.0), load)) == pytest.approx(np.std(taus),
                                                                                                   rel=0.06)


def _token_stream_by_steps(lam, prompt: Lengths, chunk, step_of_tokens, steps=100_000, seed=0):
    """A prefill budget, step by step (a plain loop): each step carries min(chunk, tokens waiting) and lasts
    step_of_tokens(carried) ms; Poisson(λ·τ) prompts arrive during it. Returns (mean step, mean tokens per step)."""
    rng = np.random.default_rng(seed)
    backlog, taus, toks = 0.0, np.empty(steps), np.empty(steps)
    for k in range(steps):
        toks[k] = min(chunk, backlog)
        taus[k] = step_of_tokens(toks[k])
        backlog += prompt.sample(rng.poisson(lam * taus[k] / 1e3), rng).sum() - toks[k]
    return taus[steps // 10:].mean(), toks[steps // 10:].mean()


@pytest.mark.parametrize("prompt,load_share", [(Lengths.fixed(700), 0.6), (Lengths.fixed(300), 0.85),
                                               (Lengths("lognormal", 900.0, p99=3000), 0.85),
                                               (Lengths.fixed(200), 0.85), (Lengths.fixed(100), 0.85)])
def test_the_mean_step_keeps_every_prompt_token_a_chunked_budget_carries(prompt, load_share):
    """The mean step over the prompt tokens steps carry, against the loop above: a step costs max(6, 1 + 0.04·T)
    + 2 ms for T prompt tokens (memory-bound below 125 tokens), the budget 512 tokens, λ at 60-85% of the budget's
    time. Prompts of half a chunk or more (`last_chunk_packing`: a last, partial chunk rides alone when no other
    prompt waits), and shorter ones (the prompt chain, the prompts past a chunk carried to the next step): within
    2% (0.1-1.6% found). Before: every step with prompts a full chunk (+2.1% at 700 tokens) and whole prompts cut
    at the chunk, their excess lost (-12% at 300 tokens, -17% at 200)."""
    c = 512

    def cost(T):
        return np.maximum(6.0, 1 + 0.04 * np.asarray(T, dtype=float)) + 2.0
    lam = load_share * c / prompt.mean_tokens / (float(cost(c)) / 1e3)
    tau, p = _token_stream_by_steps(lam, prompt, c, lambda T: float(cost(T)))
    load = Load(prompt, Lengths.geometric(100), chunk=c)
    model = float(mean_step(lambda n, q: cost(q) + 0 * np.asarray(n), np.array(5.0), np.array(p), load,
                            lam=np.array(lam)))
    assert model == pytest.approx(tau, rel=0.02)


def _ages_by_steps(B, L, rho, steps=150_000, seed=1):
    """A capped batch, step by step (a plain loop): Poisson(ρ·B/L) arrivals a step join a FIFO queue, as many as
    there are free slots enter (age 0), each row leaves with probability 1/L, the rest age by one. Returns the
    rows' mean age over all steps (row-weighted) and over the steps where the batch is full and requests wait."""
    rng = np.random.default_rng(seed)
    age, queue, full, mean, rows = np.zeros(0), 0, [], [], []
    for k in range(steps):
        queue += rng.poisson(rho * B / L)
        enter = min(queue, B - len(age))
        queue -= enter
        age = np.r_[age[rng.random(len(age)) >= 1 / L] + 1, np.zeros(enter)]
        if k > steps // 10:
            full.append(len(age) >= B and queue > 0)
            mean.append(age.mean())
            rows.append(len(age))
    full, mean, rows = np.array(full), np.array(mean), np.array(rows)
    return float((mean * rows).sum() / rows.sum()), float(mean[full].mean())


@pytest.mark.parametrize("B,L,rho", [(16, 100, 0.95), (64, 500, 0.9)])
def test_a_full_batch_holds_older_rows_as_a_population_loop_shows(B, L, rho):
    """`full_batch_age_excess` against the loop above: the excess age of a full batch's rows is positive and the
    formula gives 55-80% of it (1.2 against 1.7 steps; 10.8 against 14.8, and 19.6 over twice the steps: the
    linear regression misses the queue's long swings). Held: between 45% and 105% of the loop's."""
    stationary, at_full = _ages_by_steps(B, L, rho)
    excess = at_full - stationary
    assert excess > 0
    assert 0.45 * excess <= float(full_batch_age_excess(L, rho, B)) <= 1.05 * excess


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


# The whole declared grid of issue 26 (bench/steady_state_referee.py): 3 prompt/output ratios × caps 16, 256, 1024
# × whole prompts / chunks of 512 × loads 10, 50, 80, 95%. The referee is pooled over 8 to 64 seeded simulator runs
# per point (TPOT over all their requests, TTFT p50/p99 of all their TTFTs), each ~200 relaxation times of the queue
# (up to 150,000 requests), as many seeds as the referee's own standard error asks for (a bootstrap over the seeds,
# at most a quarter of each tolerance), stored by that script; a seeded random subset of (point, seed) pairs, and one
# whole point, are re-simulated live below, so the stored answers are the simulator's.
STORED = json.loads(REFEREE_PATH.read_text())
REFEREE, POOLED = STORED["points"], STORED["referee"]

# Points where the steady state still misses the tolerances against the referee (docs/planner-under-load.md
# says why). strict: a point that starts agreeing must leave this list.
MISSES: dict[str, str] = {}


def _within(I, O, B, chunk, u):
    runs, sim = REFEREE[referee_key(I, O, B, chunk, u)], POOLED[referee_key(I, O, B, chunk, u)]
    load = load_for(I, O, B, chunk)
    op = operating_point(step_fn_for_model(MODEL, load), runs[0]["rate"], load)
    return (float(op["tpot_ms"]) == pytest.approx(sim["tpot"], rel=0.10)
            and float(op["ttft_p50_ms"]) == pytest.approx(sim["ttft_p50"], rel=0.10)
            and float(op["ttft_p99_ms"]) == pytest.approx(sim["ttft_p99"], rel=0.20)), (op, sim)


@pytest.mark.parametrize("I,O,B,chunk,u", [
    pytest.param(I, O, B, chunk, u, marks=pytest.mark.xfail(strict=True, reason=MISSES[referee_key(I, O, B, chunk, u)]))
    if referee_key(I, O, B, chunk, u) in MISSES else (I, O, B, chunk, u)
    for (I, O), B, chunk, u in REFEREE_GRID])
def test_steady_state_agrees_with_the_simulator(I, O, B, chunk, u):
    ok, (op, sim) = _within(I, O, B, chunk, u)
    assert ok, (float(op["tpot_ms"]), float(op["ttft_p50_ms"]), float(op["ttft_p99_ms"]), sim)


def test_the_stored_referee_is_the_simulators_answer():
    """Three (point, seed) pairs drawn with a fixed seed from the whole grid, simulated again: the same numbers."""
    rng = np.random.default_rng(26)
    for i in rng.choice(len(REFEREE_GRID), 3, replace=False):
        (I, O), B, chunk, u = REFEREE_GRID[i]
        seed = int(rng.integers(len(REFEREE[referee_key(I, O, B, chunk, u)])))
        stored = REFEREE[referee_key(I, O, B, chunk, u)][seed]
        live = simulate_point(I, O, B, chunk, u, seed, stored["n"])
        assert live == pytest.approx(stored, rel=1e-9), referee_key(I, O, B, chunk, u)


def test_one_whole_point_of_the_referee_is_the_simulators_pooled_answer():
    """One of the cheapest points (fewest seeds × requests × output tokens: the steps simulated; chosen by a fixed
    seed) simulated again from scratch: the same seeds, runs and pooled answer (the seed rule re-applied)."""
    def work(p):
        runs = REFEREE[referee_key(*p[0], *p[1:])]
        return len(runs) * runs[0]["n"] * p[0][1]
    cheap = [p for p in REFEREE_GRID if work(p) == min(map(work, REFEREE_GRID))]
    (I, O), B, chunk, u = cheap[int(np.random.default_rng(26).integers(len(cheap)))]
    k = referee_key(I, O, B, chunk, u)
    _, runs, ref = referee_point((I, O, B, chunk, u))
    assert len(runs) == len(REFEREE[k])
    for live, stored in zip(runs, REFEREE[k]):
        assert live == pytest.approx(stored, rel=1e-9)
    assert {f: ref[f] for f in ("tpot", "ttft_p50", "ttft_p99", "seeds")} == \
        pytest.approx({f: POOLED[k][f] for f in ("tpot", "ttft_p50", "ttft_p99", "seeds")}, rel=1e-9)


def test_the_referees_standard_error_is_a_bootstrap_over_the_seeds():
    """`pooled_standard_error` reads each resample's quantile off binned counts; a brute-force bootstrap that
    concatenates the resampled runs and takes np.percentile: within 10% of it (bins 0.6% wide). And a run that
    repeats another adds no spread to the TPOT, while runs of different levels do."""
    rng = np.random.default_rng(5)
    runs = [(rng.lognormal(np.log(50) + 0.3 * rng.standard_normal(), 0.8, 3000), rng.normal(10 + i % 3, 0.5, 3000))
            for i in range(8)]
    value = pooled(runs)
    se = pooled_standard_error(runs, value, seed=1)
    picks = np.random.default_rng(1).integers(8, size=(400, 8))
    brute = {f: [] for f in ("tpot", "ttft_p50", "ttft_p99")}
    for row in picks:
        t = np.concatenate([runs[i][0] for i in row])
        brute["tpot"].append(np.concatenate([runs[i][1] for i in row]).mean())
        brute["ttft_p50"].append(np.percentile(t, 50))
        brute["ttft_p99"].append(np.percentile(t, 99))
    for f, x in brute.items():
        assert se[f] == pytest.approx(np.std(x, ddof=1) / value[f], rel=0.10), f
    same = [runs[0]] * 8
    assert pooled_standard_error(same, pooled(same))["tpot"] == pytest.approx(0.0, abs=1e-12)


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


@pytest.mark.parametrize("config,mesh,wd,eff", [
    (L70, Mesh(tp=4, pp=2), "fp8", None), (MIX, Mesh(tp=2, ep=2), "bf16", None),
    (load_preset("gpt-oss-20b"), Mesh(), "bf16", None), (load_preset("deepseek-v2"), Mesh(tp=8), "fp8", None),
    (L8, Mesh(), "bf16", Efficiency(overlap_host=True, sequence_overhead_us=9_000.0))])
def test_the_mixed_steps_context_slope_is_its_finite_difference_in_context(config, mesh, wd, eff):
    """`step.ms_per_context_token(n, p)` (β of the dispersed slot chain) against the whole step built at a decode
    context 64 positions longer: (step' − step)/(64·n), memory- and compute-bound attention, pipeline passes
    (PP 2), experts, sliding-window layers (gpt-oss), MLA (DeepSeek-V2), and a host's overlapped per-sequence work
    longer than the GPU's (β = 0 there, where one more position costs nothing)."""
    stack = load_stack(None)
    eff, link = eff or Efficiency.for_stack(stack, H100), _link_for(H100, None)
    lo, hi = (step_cost(config, H100, mesh, wd, wd, eff, link, stack, ctx, 2000) for ctx in (2300, 2364))
    for n, p in ((1, 0), (2, 0), (8, 0), (64, 512), (256, 2048), (3, 8192)):
        fd = float(hi(n, p) - lo(n, p)) / (64 * n)
        assert float(lo.ms_per_context_token(n, p)) == pytest.approx(fd, rel=1e-6, abs=1e-12), (n, p)
    if eff.overlap_host:
        assert float(lo.ms_per_context_token(1, 0)) == 0.0


def test_serve_at_slot_wait_is_the_steady_state_with_the_simulators_context_slope():
    """One model for the Queueing page and serve_at: a capped replica (64 slots) at 95% of its capacity, lognormal
    prompts and geometric outputs. serve_at's slot wait p99 equals `operating_point` on the same step given β the
    simulator's way (`step_fn_for_model`: kv bytes per token / bandwidth where the KV read binds, attention FLOPs
    per (query, key) pair / FLOP/s where attention's FLOPs do; per token from `kv_cache.kv_bytes_per_token` and
    `forward_flops(1, 2) − forward_flops(1, 1)`, another computation than the step's), and is longer than the
    undispersed chain's (z = 1)."""
    I, O, eff = Lengths.from_mean_p99(1000, 4000), Lengths.geometric(300), Efficiency()
    step, load, *_ = _replica(L8, H100, Mesh(), I, O, "bf16", None, load_stack(None), None, eff, None, 64, None,
                              None)
    rate = 0.95 * float(capacity(step, load))
    r = serve_at(L8, H100, Mesh(), rate, I, O, "bf16", efficiency=eff, max_num_seqs=64)
    sim = step_model_for(L8, H100, "bf16", efficiency=eff)

    def simulator_style(n, p):
        return step(n, p)

    def beta(n, p):
        d = step.parts(n, p)
        return np.where(d["kv_memory_ms"] >= d["attention_compute_ms"], sim.kv_bytes_per_token
                        / sim.bandwidth_bytes_per_s, sim.attn_flops_per_pair / d["attention_flop_s"]) * 1e3
    simulator_style.ms_per_context_token = beta
    kv_binds = step.parts(np.arange(1.0, 65.0), r["prompt_tokens_per_step"])
    assert 0 < np.mean(kv_binds["kv_memory_ms"] >= kv_binds["attention_compute_ms"]) < 1   # both branches used
    want = float(operating_point(simulator_style, rate, load)["slot_wait_p99_ms"])
    assert r["slot_wait_p99_ms"] > 0 and r["slot_wait_p99_ms"] == pytest.approx(want, rel=1e-9)
    flat = float(operating_point(lambda n, p: step(n, p), rate, load)["slot_wait_p99_ms"])
    assert r["slot_wait_p99_ms"] > 1.02 * flat


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


# ------------------------------------------------------------------------------------------ prefill-heavy replicas
# The Queueing page's default on a 2-core CPU (SmolLM2-135M in fp32 at the CPU's measured 42.31 GB/s and
# 0.173 TFLOP/s): a 100-token prompt takes ~157 ms, 12 decode steps, against ~3 on the grid's H100.
CPU = dataclasses.replace(step_model_for(load_preset("smollm2-135m-instruct"), H100, "fp32"),
                          bandwidth_bytes_per_s=42.31e9, peak_flop_s=0.173e12)
CPU_LOAD = Load(Lengths.fixed(100), Lengths.fixed(50), slots=16)


@pytest.mark.parametrize("u", [0.1, 0.5, 0.9])
def test_the_chain_ttft_quantiles_match_sampling_the_landing(u):
    """`_chain_ttft_quantiles` (its CDF on `_landing_grid`, interpolated) against 400,000 draws of the same landing:
    idle with P = min(e^(−N), w_0), then the own step alone; else the step landed in, K ~ w (less the idle share of
    K = 0), the rest of it U(0, τ_K), and the own step with j ~ Poisson(λ·τ_K) others. Within 1% at each level, on
    the prefill-heavy replica (a uniform grid to the chain's largest K put the median 25% high at 50% load)."""
    step = step_fn_for_model(CPU, CPU_LOAD)
    lam = u * 4.2356
    op = operating_point(step, lam, CPU_LOAD)
    n, busy = op["decode_rows"], 1 - np.exp(-op["in_flight"])
    qs, _, (pi, tau_k), mean = _chain_ttft_quantiles(step, n, np.asarray(lam), CPU_LOAD, LEVELS, busy)
    kt = tau_k.shape[-1]
    own = step(n + 0 * np.arange(kt), 100.0 * np.arange(1, kt + 1))
    w = pi * tau_k / np.sum(pi * tau_k)
    idle = min(float(np.exp(-op["in_flight"])), float(w[0]))
    rng = np.random.default_rng(7)
    size = 400_000
    landed = w - idle * (np.arange(kt) == 0)
    K = rng.choice(kt, size, p=landed / landed.sum())
    j = np.minimum(rng.poisson(lam * tau_k[K] / 1e3), kt - 1)
    ttft = np.where(rng.random(size) < idle, own[0], rng.random(size) * tau_k[K] + own[j])
    for level, q in zip(LEVELS, qs):
        assert float(q) == pytest.approx(np.quantile(ttft, level), rel=0.01), level
    assert float(mean) == pytest.approx(ttft.mean(), rel=0.005)          # `chain_ttft_mean`, the same landing
    assert float(mean) > float(qs[0])                                    # skewed right: the mean above the median


def _cpu_page_case(u, n=20_000, seed=0):
    """Simulator against the steady state at load u of the page's capacity (its own burst measurement)."""
    from calculators.serving.slo import capacity_rps
    from calculators.serving.workload import synthetic_workload
    cap = capacity_rps(CPU, 100, 50, 16, output_kind="fixed")
    r = simulate_continuous(CPU, synthetic_workload(n, u * cap, 100, 50, prompt_kind="fixed", output_kind="fixed",
                                                    seed=seed), 16)
    op = operating_point(step_fn_for_model(CPU, CPU_LOAD), u * cap, CPU_LOAD)
    sim = dict(tpot=float(np.nanmean(r.tpot)) * 1e3, ttft_p50=float(np.percentile(r.ttft, 50)) * 1e3,
               ttft_p99=float(np.percentile(r.ttft, 99)) * 1e3, ttft_mean=float(np.mean(r.ttft)) * 1e3)
    return {f: float(op[f"{f}_ms"]) for f in sim}, sim


CPU_MISSES = ("the number of requests held wanders far wider than the slot chain's: a prefill is 12 decode steps, so "
              "a step that carries prompts gathers the next ones and the step is convex in the rows (memory-bound "
              "below 8, compute-bound above); the simulator holds 16 at 5.8% of arrivals at 70% load, 43% at 90%, "
              "the chain at 0.2% and 16% (0.01% and 0.9% before each state's step carried the prompts that arrive "
              "during it). A chain on (requests held, prompts in the step) matches the simulator's law uncapped "
              "(geometric outputs, 70%: P(N ≥ 16) 2.8% against 2.9%), the birth-death chain gave 0.01%")


@pytest.mark.parametrize("u", [0.1, 0.3, 0.5, pytest.param(0.7, marks=pytest.mark.xfail(strict=True, reason=CPU_MISSES)),
                               pytest.param(0.9, marks=pytest.mark.xfail(strict=True, reason=CPU_MISSES))])
def test_the_queueing_pages_prefill_heavy_case_agrees_with_the_simulator(u):
    """The page's default case on the class's CPU, 20,000 seeded requests: TPOT and TTFT p50 and mean within 10%,
    TTFT p99 within 20% (the grid's tolerances). Whole prompts there put p50 at 50% load 25% high (the landing grid)
    and p99 at 10% load 22% low (the idle share taken from the prefill steps too)."""
    model, sim = _cpu_page_case(u)
    assert model["tpot"] == pytest.approx(sim["tpot"], rel=0.10), (model, sim)
    assert model["ttft_p50"] == pytest.approx(sim["ttft_p50"], rel=0.10), (model, sim)
    assert model["ttft_mean"] == pytest.approx(sim["ttft_mean"], rel=0.10), (model, sim)
    assert model["ttft_p99"] == pytest.approx(sim["ttft_p99"], rel=0.20), (model, sim)


H100_FIXED_MISS = ("fixed outputs under a binding cap of 16: a cohort of prompts prefilled in one step leaves in one step "
                   "O − 1 steps later and frees its slots at once, so the waiting prompts are admitted as a cohort "
                   "again; the wait's Kingman factor takes departures as regular (c_s² = 0). At 70% load the simulator's "
                   "TTFT p99 is 342 ms, the model's 160 (c_s² = 1 gives 289 here but +22% and +55% at 80% and 90%)")


@pytest.mark.parametrize("I,O,B,u", [(1000, 100, 256, 0.8), (1000, 100, 256, 0.9), (500, 500, 256, 0.9),
                                     pytest.param(1000, 100, 16, 0.7,
                                                  marks=pytest.mark.xfail(strict=True, reason=H100_FIXED_MISS))])
def test_fixed_outputs_off_the_grid_agree_with_the_simulator(I, O, B, u):
    """The grid's H100 replica with fixed outputs (the grid's are geometric), whole prompts, 20,000 seeded requests
    at 80-90% of the capacity the page measures: TPOT, TTFT p50 and mean within 10%, p99 within 20%."""
    from calculators.serving.slo import capacity_rps
    from calculators.serving.workload import synthetic_workload
    cap = capacity_rps(MODEL, I, O, B, output_kind="fixed")
    r = simulate_continuous(MODEL, synthetic_workload(20_000, u * cap, I, O, prompt_kind="fixed", output_kind="fixed",
                                                      seed=1), B)
    load = Load(Lengths.fixed(I), Lengths.fixed(O), slots=B)
    op = operating_point(step_fn_for_model(MODEL, load), u * cap, load)
    assert float(op["tpot_ms"]) == pytest.approx(float(np.nanmean(r.tpot)) * 1e3, rel=0.10)
    assert float(op["ttft_p50_ms"]) == pytest.approx(float(np.percentile(r.ttft, 50)) * 1e3, rel=0.10)
    assert float(op["ttft_mean_ms"]) == pytest.approx(float(np.mean(r.ttft)) * 1e3, rel=0.10)
    assert float(op["ttft_p99_ms"]) == pytest.approx(float(np.percentile(r.ttft, 99)) * 1e3, rel=0.20)


def test_the_process_wide_tables_are_read_only():
    """decode_lag_weights, the decay table and the stream's backlog table are cached for the whole process (every
    browser session and the planner share them): an in-place edit by one caller must fail, not change the others'."""
    from calculators.serving.steady_state import _decay_table, decode_lag_weights, stream_backlog_table
    arrays = [decode_lag_weights(Lengths.geometric(100)), *_decay_table(Lengths.fixed(50)),
              *(a for a in stream_backlog_table(Lengths.fixed(500), 512.0) if isinstance(a, np.ndarray))]
    for a in arrays:
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 0


def test_a_states_step_carries_the_prompts_that_arrive_during_it():
    """`_state_step`: τ = step(rows, min(chunk, k·τ)) + bend. For a step linear in both (a + b·n + c·p) it is
    exactly (a + b·n + bend) / (1 − k·c), or a + b·n + c·chunk + bend where a chunk caps the prompts; for a roofline
    step (the max of a memory and a compute line) it is the fixed point a plain iteration reaches after 5,000
    rounds; where k·c ≥ 1 there is none (inf)."""
    from calculators.serving.steady_state import _state_step
    rows = np.array([1.0, 40.0, 300.0, 2000.0])
    lin = lambda n, p: 20.0 + 0.1 * np.asarray(n) + 0.05 * np.asarray(p)          # noqa: E731
    k, bend = 8.0, 1.5                                        # prompt tokens per ms of step; the state's bend
    got = _state_step(lin, rows, k, bend, np.full_like(rows, 30.0))
    assert got == pytest.approx((20.0 + 0.1 * rows + bend) / (1 - k * 0.05), rel=1e-9)
    roof = lambda n, p: np.maximum(25.0 + 0.02 * np.asarray(n), 0.09 * (np.asarray(n) + np.asarray(p)))   # noqa: E731
    t = np.full_like(rows, 30.0)
    for _ in range(5000):
        t = roof(rows, k * t) + bend
    assert _state_step(roof, rows, k, bend, np.full_like(rows, 30.0)) == pytest.approx(t, rel=1e-7)
    assert np.all(np.isinf(_state_step(lin, rows, 25.0, bend, np.full_like(rows, 30.0))))     # k·c = 1.25
    capped = _state_step(lin, rows, k, bend, np.full_like(rows, 30.0), chunk=100.0)     # a chunk holds 100 tokens
    assert capped == pytest.approx(np.minimum(got, 20.0 + 0.1 * rows + 0.05 * 100.0 + bend), rel=1e-9)


def test_near_capacity_the_requests_held_wander_as_the_simulators_do():
    """Llama-2-70B FP8 on one H200 (the closed form's step, 2 ms overhead) at MLPerf's OpenOrca lengths, 512 slots,
    8,192-token chunks, at 98% of capacity: the prompts' compute is a large share of each step, so a state with more
    requests held has longer steps that carry more prompts, and the requests held wander up to the cap. The
    simulator (`_simulated_and_modelled` in test_mlperf_lengths.py, seeds 0-7 of 12,000 Poisson arrivals, 29 Nov
    2026) puts the TTFT p99 at 1,841 ms (2,318 ms over seeds 0-3); the steady state is within a factor of 2 of it.
    With each state's step at the mean's prompt tokens it said 373 ms."""
    from calculators.planning.published import length_datasets
    from calculators.serving.batching import step_model_for
    from calculators.sizing.latency import Efficiency
    d = length_datasets()["llama2-70b"]
    prompt = Lengths.histogram(d["prompt"]["values"], d["prompt"]["counts"])
    output = Lengths.histogram(d["output"]["values"], d["output"]["counts"])
    m = step_model_for(load_preset("llama-2-70b"), load_device("h200"), "fp8", efficiency=Efficiency(), overhead_ms=2.0)
    load = Load(prompt, output, chunk=8192, slots=512)
    step = step_fn_for_model(m, load)
    op = operating_point(step, 0.98 * float(capacity(step, load)), load)
    assert 1841 / 2 <= float(op["ttft_p99_ms"]) <= 1841 * 2
    assert float(op["slot_wait_probability"]) > 0.01
