"""A loaded continuous-batching server as a steady state: the operating point a Poisson rate settles at, and the
TTFT / TPOT / ITL it gives (one model for the planner, `throughput`, `serve-at` and the Queueing page; the
discrete-event simulator `serving_sim.simulate_continuous` is its referee).

Every step of a replica carries the decode rows of the running sequences plus the prompt tokens it prefills
(whole prompts, or at most `chunk` prompt tokens per step). In a steady state at λ requests/s, with mean step
time τ (ms):
    decode rows per step     n = λ·E[O − 1]·τ        (each request decodes O − 1 tokens after its first)
    prompt tokens per step   p = λ·E[I]·τ            (each request's prompt is prefilled once)
    τ = step(n, p)                                   the fixed point, solved by bisection
    slots held               N = λ·(E[O − 1] + k)·τ  (Little's law; k = steps a request spends prefilling)
The step cost `step(n, p)` is the stack's mixed step (weights read once, every decoding sequence's KV cache,
the prompt tokens' FLOPs, all-reduces, fixed costs): the same function `throughput` runs with every request
queued. The rate is above capacity when no τ solves the fixed point, when the slots would be more than the batch
cap (N > B), or when the prompt tokens per step exceed the chunk budget (p > chunk).

With a step linear in n, τ = a + s·n, and geometric output lengths, the number decoding is a birth-death chain
whose stationary law is negative binomial with mean exactly the fixed point (each step ends a sequence with
probability 1/O): the mean-field answer is exact for the mean, which is why TPOT agrees with the simulator.

TTFT (p50 and p99, each part at that quantile, added):
    wait for a slot          the birth-death chain of requests held (`slot_wait_law`): P(N ≥ B), then exponential
    wait for the prefill budget  M/G/1 on prompt tokens, ρ_p = p / chunk (Pollaczek-Khinchine, exponential tail)
    whole prompts            the prompt chain: the rest of the step in progress (length-biased), then the own step
                             with the prompts that arrived meanwhile; an idle replica (P = e^(−N)) starts at once
    prompts past half a chunk  ⌈I/chunk⌉ steps carrying its chunks beside the n decode rows
Sources: Little (1961); Pollaczek-Khinchine; Erlang C (the slot chain with a flat step); Kwon et al. 2023 (vLLM) and
Agrawal et al. 2024 (Sarathi-Serve, chunked prefill) for the step's content.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from calculators.serving.lengths import Lengths
from specs.model_config import SpecError

StepFn = Callable[[np.ndarray, np.ndarray], np.ndarray]     # (decode rows n, prompt tokens p) -> step ms
BISECT = 30
HOPELESS_MS = 1e7                 # a mean step longer than this (2.8 hours) counts as no fixed point


@dataclass(frozen=True)
class Load:
    """What a replica is asked to serve: Poisson arrivals of requests with these prompt and output lengths."""
    prompt: Lengths
    output: Lengths
    chunk: float = math.inf               # prompt tokens a step may carry (chunked prefill budget); inf = whole
    slots: float = math.inf               # batch cap: sequences in flight (prefilling + decoding); may be an array

    @property
    def decode_tokens(self) -> float:     # E[O − 1]
        return max(self.output.mean_tokens - 1, 0.0)

    @property
    def prefill_steps(self) -> float:     # E[⌈I / chunk⌉]: steps a prompt needs when it has the budget alone
        if not math.isfinite(self.chunk):
            return 1.0
        return self.prompt.moment(lambda x: np.ceil(x / self.chunk))


K_TERMS = 24


def prompt_packets(p, chunk: float, prompt_mean: float):
    """How the prompt tokens arrive in steps: a step carries K whole prompts (K·E[I] tokens), capped at the chunk
    budget, K Poisson of mean m, so that the mean per step is `p`. Unchunked (or prompts shorter than a chunk):
    m = p / E[I], the prompts that arrived during the step before. Prompts longer than a chunk fill the budget
    whenever any is waiting: P(K ≥ 1) = p / chunk, m = −ln(1 − p/chunk). Returns (k, weights, m), k = 0..K−1."""
    p = np.asarray(p, dtype=float)
    if math.isfinite(chunk) and prompt_mean >= chunk:
        m = -np.log1p(-np.minimum(p / chunk, 0.999999))
    else:
        m = p / prompt_mean
    top = min(float(np.max(m, initial=0.0)), K_TERMS / 6)
    kt = int(min(K_TERMS, max(4, math.ceil(top + 6 * math.sqrt(top) + 4))))
    k = np.arange(kt, dtype=float).reshape((kt,) + (1,) * p.ndim)
    return k, _poisson(k, m), m


_LGAMMA = np.array([math.lgamma(x + 1) for x in range(K_TERMS)])


def _poisson(k, m):
    m = np.maximum(np.asarray(m, dtype=float), 1e-300)
    w = np.exp(k * np.log(m) - m - _LGAMMA[:k.shape[0]].reshape(k.shape))
    return w / np.maximum(w.sum(axis=0), 1e-300)


def whole_prompts(load: "Load") -> bool:
    """True when steps carry whole prompts: no chunking, or at least two mean prompts fit a chunk (otherwise the
    chunk budget is what prompts queue for: `prefill_wait_quantile_s`)."""
    return not math.isfinite(load.chunk) or 2 * load.prompt.mean_tokens <= load.chunk


def _k_terms(step: StepFn, n, lam, load: "Load") -> int:
    """How many prompt counts K the chain needs: past the largest mean arrivals per step (at the longest step
    it reaches) by 6 standard deviations, at most K_TERMS."""
    n = np.asarray(n, dtype=float)
    top = step(n, np.minimum(load.chunk, (K_TERMS - 1) * load.prompt.mean_tokens) + 0 * n)
    m = float(np.max(np.asarray(lam, dtype=float) * top / 1e3, initial=0.0))
    m = min(m, K_TERMS / 6)                 # beyond, mean_step takes the law of large numbers
    return int(min(K_TERMS, max(4, math.ceil(m + 6 * math.sqrt(m) + 4))))


def prompt_chain(step: StepFn, n, lam, load: "Load", iters: int = 16):
    """Whole prompts: the number K of prompts a step carries is a Markov chain. A step carrying K prompts takes
    τ_K = step(n, min(chunk, K·E[I])); the prompts that arrive during it, Poisson of mean λ·τ_K, are the next
    step's K. Returns (π, τ_K): the stationary law of K (power iteration) and the step time of each K, shape
    (..., K_TERMS). A long step gathers more arrivals, so long steps come in runs: the mean step and its tail
    are longer than with K drawn independently."""
    n, lam = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(lam, dtype=float))
    kt = _k_terms(step, n, lam, load)
    k = np.arange(kt, dtype=float).reshape((kt,) + (1,) * n.ndim)
    tok = np.minimum(load.chunk, k * load.prompt.mean_tokens)
    tau_k = np.moveaxis(step(n[None] * np.ones_like(tok), tok * np.ones_like(n)[None]), 0, -1)   # (..., K)
    m = lam[..., None] * tau_k / 1e3                                        # (..., K)
    kk = np.arange(kt, dtype=float).reshape((kt,) + (1,) * m.ndim)
    trans = np.moveaxis(_poisson(kk, m), 0, -1)                             # (..., K from, K to)
    pi = trans[..., 0, :]                                                   # start: the step after an idle one
    for _ in range(iters):
        pi = np.einsum("...k,...kj->...j", pi, trans)
    return pi, tau_k


def mean_step(step: StepFn, n, p, load: "Load", lam=None, chain: bool = True):
    """The mean step time with n decode rows and p prompt tokens per step on average. Whole prompts: the mean
    over the prompt chain (`prompt_chain`); prompts longer than a chunk: E_K[step(n, min(chunk, K·E[I]))] with
    P(K ≥ 1) = p / chunk. A step cost that bends (the max of a memory line and a compute line) makes either more
    than step(n, p) (Jensen): a step that carries a whole prompt is compute-bound while the steps between are
    memory-bound. Where a step carries many prompts (m > K/3), the law of large numbers: step(n, p)."""
    n, p = np.asarray(n, dtype=float), np.asarray(p, dtype=float)
    k, w, m = prompt_packets(p, load.chunk, load.prompt.mean_tokens)
    many = m > K_TERMS / 6
    if chain and whole_prompts(load) and lam is not None:
        pi, tau_k = prompt_chain(step, n, lam, load)
        mixed = (pi * tau_k).sum(axis=-1)
    else:
        tok = np.minimum(load.chunk, k * load.prompt.mean_tokens)
        mixed = (w * step(n[None, ...] * np.ones_like(tok), tok * np.ones_like(n)[None, ...])).sum(axis=0)
    return np.where(many, step(n, p), mixed)


def _fixed_point(step: StepFn, lam: np.ndarray, load: Load, chain: bool = True, near=None,
                 iterations: int = BISECT) -> np.ndarray:
    """τ with τ = mean_step(λ·E[O−1]·τ, λ·E[I]·τ), per element of λ; inf where none exists (the step grows at
    least as fast as τ). Bisection on [step(0, 0), hi], hi doubled until mean_step(hi) < hi."""
    a, b = load.decode_tokens, load.prompt.mean_tokens
    lam = np.asarray(lam, dtype=float)
    f = lambda t: mean_step(step, lam * a * t / 1e3, lam * b * t / 1e3, load, lam, chain)   # noqa: E731
    lo = np.asarray(step(np.zeros_like(lam), np.zeros_like(lam)), dtype=float) * np.ones_like(lam)
    hi = np.maximum(lo, 1e-6) * 2
    if near is not None:                          # a guess (a cheaper model's τ): bracket it first
        g = np.where(np.isfinite(near), near, hi)
        lo = np.where(f(g * 0.8) > g * 0.8, np.maximum(lo, g * 0.8), lo)
        hi = np.maximum(hi, g * 1.25)
    ok = np.zeros(lam.shape, dtype=bool)
    for _ in range(60):
        ok |= f(hi) <= hi
        if np.all(ok | (hi > HOPELESS_MS)):       # a step past 10^7 ms is no operating point: stop doubling
            break
        hi = np.where(ok, hi, hi * 2)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        above = f(mid) > mid
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return np.where(ok, hi, np.inf)


def slots_held(lam, tau_ms, load: Load, prefill_wait_ms=0.0):
    """N = λ·(E[O − 1]·τ + k·τ + prefill wait): sequences holding a slot (Little's law)."""
    return np.asarray(lam) * ((load.decode_tokens + load.prefill_steps) * tau_ms + prefill_wait_ms) / 1e3


def capacity(step: StepFn, load: Load, shape=()) -> np.ndarray:
    """The largest request rate (per second) the replica sustains: the step fixed point exists, the slots held
    stay within the cap and the prompt tokens per step within the chunk budget. Bisection on λ (vectorised over
    the elements `step` broadcasts to)."""
    def fits(lam):
        tau = _fixed_point(step, lam, load)
        ok = np.isfinite(tau)
        t = np.where(ok, tau, 0.0)
        return ok & (slots_held(lam, t, load) <= np.asarray(load.slots)) & \
            (lam * load.prompt.mean_tokens * t / 1e3 <= load.chunk)
    lo, hi = np.zeros(shape), np.ones(shape)
    for _ in range(60):
        f = fits(hi)
        if not f.any():
            break
        lo, hi = np.where(f, hi, lo), np.where(f, hi * 2, hi)
    for _ in range(BISECT):
        mid = (lo + hi) / 2
        f = fits(mid)
        lo, hi = np.where(f, mid, lo), np.where(f, hi, mid)
    return lo


def _tail_quantile(p_wait, mean_cond_s, q):
    """t with P(W > t) = 1 − q when P(W > 0) = p_wait and W | W > 0 is exponential with mean `mean_cond_s`
    (0 when p_wait ≤ 1 − q: the quantile falls among those who do not wait)."""
    ratio = np.asarray(p_wait, dtype=float) / (1 - q)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.log(np.maximum(ratio, 1.0)) * mean_cond_s
    return np.where(ratio <= 1, 0.0, np.where(np.isfinite(t), t, np.inf))


def slot_wait_law(lam, steps_per_request, step_at, slots, held=None):
    """P(wait) and the mean conditional wait (s) for a free slot, from the birth-death chain of the number N of
    requests in the replica: with N = j running, a step takes step_at(j) ms and each running request finishes
    with probability 1/steps_per_request per step, so requests leave at rate j / (steps·step_at(j)) and
        w_j = w_{j−1} · λ · steps · step_at(j) / (1000 · j)      (j ≤ B = slots)
        w_j = w_B · q^(j − B),  q = λ · steps · step_at(B) / (1000 · B)   (j > B: the batch is full, the rest wait)
    (a step that grows with j makes N over-dispersed: negative binomial while it is linear, Poisson, i.e. Erlang's
    M/M/c, while it is flat). P(wait) = P(N ≥ B); the wait then is exponential with mean 1/(μ_B − λ),
    μ_B = λ/q. Vectorised; the loop runs to the largest finite cap."""
    lam = np.asarray(lam, dtype=float)
    c = np.asarray(slots, dtype=float) * np.ones_like(lam)
    finite = np.isfinite(c)
    far = finite & (c > 4 * np.asarray(held) + 60) if held is not None else np.zeros_like(finite)
    if far.all():                                 # a cap far above the requests held is never reached
        return np.zeros_like(lam), np.full_like(lam, np.inf)
    c = np.where(far, np.inf, c)                  # those are done below as if uncapped (P(wait) = 0)
    finite = np.isfinite(c)
    top = int(np.max(np.where(finite, c, 0))) if c.size else 0
    if top == 0:
        return np.where(finite, 1.0, 0.0), np.full_like(lam, np.inf)
    j = np.arange(1, top + 1, dtype=float).reshape((top,) + (1,) * lam.ndim)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rate = lam[None] * steps_per_request * _on_grid(step_at, top, lam) / (1e3 * j)
        logw = np.cumsum(np.log(np.maximum(rate, 1e-300)), axis=0)            # log w_j, j = 1..top
        below = j < c[None]
        log_z = np.logaddexp(0.0, np.log(np.sum(np.where(below, np.exp(logw - logw.max(axis=0)), 0.0), axis=0))
                             + logw.max(axis=0))
        cap = np.clip(np.where(finite, c, 1.0).astype(int), 1, top) - 1
        log_wb = np.take_along_axis(logw, cap[None], axis=0)[0]
        q = lam * steps_per_request * step_at(np.where(finite, c, 1.0)) / (1e3 * np.where(finite, c, 1.0))
        ok = finite & (q < 1)
        log_tail = log_wb - np.log1p(-np.minimum(q, 1 - 1e-12))
        p_wait = np.where(ok, np.exp(log_tail - np.logaddexp(log_z, log_tail)), np.where(finite, 1.0, 0.0))
        p_wait = np.where(far, 0.0, p_wait)
        mean_cond = np.where(ok, 1.0 / np.maximum(lam * (1 / np.maximum(q, 1e-300) - 1), 1e-300), np.inf)
    return p_wait, mean_cond


def _on_grid(step_at, top: int, like) -> np.ndarray:
    """step_at(j) for j = 1..top, shape (top, ...): exact up to 64, else from 48 log-spaced j, interpolated
    (a step is smooth in the number of sequences)."""
    ones = np.ones_like(np.asarray(like, dtype=float))[None]
    if top <= 64:
        return step_at(np.arange(1, top + 1, dtype=float).reshape((top,) + (1,) * (ones.ndim - 1)) * ones)
    grid = np.unique(np.round(np.geomspace(1, top, 48)))
    vals = step_at(grid.reshape((len(grid),) + (1,) * (ones.ndim - 1)) * ones)         # (G, ...)
    j = np.arange(1, top + 1, dtype=float)
    pos = np.interp(j, grid, np.arange(len(grid), dtype=float))
    i0 = np.minimum(pos.astype(int), len(grid) - 2)
    f = (pos - i0).reshape((top,) + (1,) * (ones.ndim - 1))
    return vals[i0] * (1 - f) + vals[i0 + 1] * f


def slot_wait_quantile_s(lam, steps_per_request, step_at, slots, q, held=None):
    """Wait for a free slot at quantile q (s), from `slot_wait_law`; 0 without a cap."""
    p_wait, mean_cond = slot_wait_law(lam, steps_per_request, step_at, slots, held)
    t = _tail_quantile(p_wait, mean_cond, q)
    return np.where(~np.isfinite(np.asarray(slots, dtype=float) * np.ones_like(np.asarray(lam, dtype=float))),
                    0.0, t)


def prefill_wait_quantile_s(rho, service_s, scv, q):
    """Wait for the prefill budget at quantile q: M/G/1 with utilisation ρ and service time S (c² = scv):
    mean W = ρ·S·(1 + c²)/(2(1 − ρ)), P(W > 0) = ρ, W | W > 0 exponential with mean W/ρ."""
    rho = np.asarray(rho, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_cond = service_s * (1 + scv) / (2 * (1 - rho))
        t = _tail_quantile(rho, mean_cond, q)
    return np.where(rho < 1, np.where(rho > 0, t, 0.0), np.inf)


def _chain_ttft_quantiles(step: StepFn, n, lam, load: "Load", qs, busy=None) -> list:
    """TTFT quantiles with whole prompts, from the prompt chain: an arrival lands in a step of state K with
    probability ∝ π_K·τ_K (a long step is more likely to be hit), waits the rest of it (uniform), then its own
    step carries it and the Poisson(λ·τ_K) others that arrived meanwhile. While the replica is idle
    (P = e^(−slots held)) the own step starts at once. CDF on a grid, inverted."""
    pi, tau_k = prompt_chain(step, n, lam, load)
    n = np.asarray(n, dtype=float)
    kt = tau_k.shape[-1]
    k = np.arange(kt, dtype=float).reshape((kt,) + (1,) * n.ndim)
    tok = np.minimum(load.chunk, (k + 1) * load.prompt.mean_tokens)         # own step: itself + k others
    own = np.moveaxis(step(n[None] * np.ones_like(tok), tok * np.ones_like(n)[None]), 0, -1)
    w = pi * tau_k
    w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-300)
    m = np.asarray(lam, dtype=float)[..., None] * tau_k / 1e3
    kk = np.arange(kt, dtype=float).reshape((kt,) + (1,) * m.ndim)
    others = np.moveaxis(_poisson(kk, m), 0, -1)
    lo, hi = own.min(axis=-1), own.max(axis=-1) + tau_k.max(axis=-1)
    grid = lo[..., None] + (hi - lo)[..., None] * np.linspace(0, 1, 65)     # (..., T)
    # P(r + own_j ≤ t | K) with r ~ U(0, τ_K): (..., K, j, T)
    frac = np.clip((grid[..., None, None, :] - own[..., None, :, None]) / tau_k[..., :, None, None], 0, 1)
    cdf = np.einsum("...k,...kj,...kjt->...t", w, others, frac)
    if busy is not None:                      # an arrival at an idle replica starts its own step at once
        idle = 1 - np.asarray(busy, dtype=float)[..., None]
        cdf = idle * (grid >= own[..., :1]) + (1 - idle) * cdf
    return [_invert(grid, cdf, q) for q in qs], own[..., 0]


def _invert(grid, cdf, q):
    """t with CDF(t) = q on each row (linear interpolation; cdf rows non-decreasing)."""
    idx = np.clip((cdf < q).sum(axis=-1), 1, grid.shape[-1] - 1)
    g0, g1 = np.take_along_axis(grid, idx[..., None] - 1, -1)[..., 0], np.take_along_axis(grid, idx[..., None], -1)[..., 0]
    c0, c1 = np.take_along_axis(cdf, idx[..., None] - 1, -1)[..., 0], np.take_along_axis(cdf, idx[..., None], -1)[..., 0]
    return g0 + (g1 - g0) * np.clip((q - c0) / np.maximum(c1 - c0, 1e-12), 0, 1)


def operating_point(step: StepFn, rate, load: Load, chain: bool = True, near_step_ms=None) -> dict:
    """The steady state at `rate` requests/s (arrays broadcast): step time, rows, slots, TTFT/TPOT/ITL p50 and
    p99, and `stable` (False where the rate is above capacity: then the latencies are inf). `chain=False` skips
    the prompt chain (prompts per step drawn independently): cheaper, for screening many candidates."""
    lam = np.asarray(rate, dtype=float)
    tau = _fixed_point(step, lam, load, chain, near_step_ms, BISECT if chain else 20)   # screening: 1e-6 of the bracket
    stable = np.isfinite(tau)
    t = np.where(stable, tau, 1.0)
    n = lam * load.decode_tokens * t / 1e3
    p = lam * load.prompt.mean_tokens * t / 1e3
    I, chunk = load.prompt, load.chunk
    whole = whole_prompts(load)
    rho_p = p / chunk if math.isfinite(chunk) else np.zeros_like(p)
    svc = I.mean_tokens / chunk * t / 1e3 if not whole else np.zeros_like(t)
    out = {}
    pre_mean_wait = prefill_wait_quantile_s(rho_p, svc, I.scv, 0.5) * 1e3 if not whole else 0.0
    held = slots_held(lam, t, load, pre_mean_wait)
    busy = 1 - np.exp(-held)
    if whole and chain:
        (c50, c99), alone = _chain_ttft_quantiles(step, n, lam, load, (0.5, 0.99), busy)
        for q, tag, cq in ((0.5, "p50", c50), (0.99, "p99", c99)):
            longer = step(n, p + I.quantile(q)) - step(n, p + I.mean_tokens)     # a longer own prompt
            out[f"own_prefill_{tag}_ms"] = cq + np.maximum(longer, 0)
            out[f"prefill_wait_{tag}_ms"] = np.zeros_like(t)
    elif whole:
        for q, tag in ((0.5, "p50"), (0.99, "p99")):
            resid = np.where(q <= 1 - busy, 0.0, t * (q - (1 - busy)) / np.maximum(busy, 1e-12))
            out[f"own_prefill_{tag}_ms"] = step(n, p + I.quantile(q)) + resid
            out[f"prefill_wait_{tag}_ms"] = np.zeros_like(t)
    else:
        for q, tag in ((0.5, "p50"), (0.99, "p99")):
            Iq = I.quantile(q)
            out[f"prefill_wait_{tag}_ms"] = prefill_wait_quantile_s(rho_p, svc, I.scv, q) * 1e3
            k = max(1, math.ceil(Iq / chunk))
            last = Iq - (k - 1) * chunk
            own = (k - 1) * step(n, np.full_like(n, chunk)) + step(n, np.minimum(chunk, last + p))
            resid = np.where(q <= 1 - busy, 0.0, t * (q - (1 - busy)) / np.maximum(busy, 1e-12))
            out[f"own_prefill_{tag}_ms"] = own + resid
    steps_per_req = load.decode_tokens + load.prefill_steps + pre_mean_wait / t
    rows_per_held = n / np.maximum(held, 1e-12)                # with j requests held, j·n/N of them decode

    step_at = lambda j: step(j * rows_per_held, p * np.ones_like(j))     # noqa: E731  j requests held
    for q, tag in ((0.5, "p50"), (0.99, "p99")):
        slot_w = slot_wait_quantile_s(lam, steps_per_req, step_at, load.slots, q, held) * 1e3
        ttft = slot_w + out[f"prefill_wait_{tag}_ms"] + out[f"own_prefill_{tag}_ms"]
        out[f"slot_wait_{tag}_ms"] = slot_w
        out[f"ttft_{tag}_ms"] = np.where(stable, ttft, np.inf)
    # ITL: a decode step; its p99 is a step that carries a prompt (or a chunk) when ≥ 1% of steps do
    with_prompt = 1 - np.exp(-lam * t / 1e3 * load.prefill_steps) if whole else np.minimum(1.0, rho_p)
    q_in = np.clip(1 - 0.01 / np.maximum(with_prompt, 1e-12), 0.0, 1.0)
    big = I.quantile(q_in)
    big = np.minimum(big, chunk)
    itl_p99 = np.where(with_prompt >= 0.01, step(n, big * np.ones_like(n)), step(n, 0 * n))
    cap_u = held / np.asarray(load.slots, dtype=float)
    stable = stable & (cap_u < 1) & (rho_p < 1)
    inf = np.inf
    return dict(stable=stable, steps_converge=np.isfinite(tau) & (rho_p < 1),
                step_ms=np.where(stable, tau, inf), decode_rows=n, prompt_tokens_per_step=p,
                in_flight=held, slot_utilisation=cap_u, prefill_budget_utilisation=rho_p,
                tpot_ms=np.where(stable, tau, inf), itl_p50_ms=np.where(stable, step(n, 0 * n), inf),
                itl_p99_ms=np.where(stable, itl_p99, inf),
                ttft_p50_ms=np.where(stable, out["ttft_p50_ms"], inf),
                ttft_p99_ms=np.where(stable, out["ttft_p99_ms"], inf),
                slot_wait_p99_ms=out["slot_wait_p99_ms"], prefill_wait_p99_ms=out["prefill_wait_p99_ms"],
                output_tok_s=lam * load.output.mean_tokens, requests_per_s=lam)


def step_fn_for_model(model, load: Load) -> StepFn:
    """The mixed step of a `batching.StepModel` (the simulator's step cost) under `load`'s lengths: n decode
    rows at the time-weighted mean context E[(O−1)(I + (O−2)/2)]/E[O−1], p prompt tokens with their causal pairs
    E[I(I+1)/2]/E[I] per token and the earlier chunks they read."""
    I, O = load.prompt, load.output
    d = max(O.mean_tokens - 1, 1e-12)
    ctx_dec = (I.mean_tokens * (O.mean_tokens - 1) + O.moment(lambda x: (x - 1) * (x - 2) / 2)) / d
    pairs_tok = I.moment(lambda x: x * (x + 1) / 2) / I.mean_tokens
    if math.isfinite(load.chunk):
        c = load.chunk
        read_tok = I.moment(lambda x: c * np.ceil(x / c) * (np.ceil(x / c) - 1) / 2) / I.mean_tokens
    else:
        read_tok = 0.0

    def step(n, p):
        n, p = np.asarray(n, dtype=float), np.asarray(p, dtype=float)
        mem, comp = model.step_parts_ms(n + p, n * ctx_dec + p * read_tok, n * ctx_dec + p * pairs_tok)
        return np.maximum(mem, comp) + model.overhead_ms
    return step


def check_rate(rate) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
        raise SpecError(f"request rate must be a number of requests per second ≥ 0, got {rate!r}")
    return float(rate)


def sweep_for_model(model, loads, capacity_rps: float, prompt: Lengths, output: Lengths, slots: float = math.inf,
                    chunk: float = math.inf) -> list[dict]:
    """The steady state of a `batching.StepModel` replica at each load (a fraction of `capacity_rps`, the rate the
    simulator sustains; what the Queueing page draws beside the simulator): TTFT p50/p99, TPOT, in flight."""
    rates = np.asarray(loads, dtype=float) * capacity_rps
    load = Load(prompt, output, chunk=chunk, slots=slots)
    step = step_fn_for_model(model, load)
    op = operating_point(step, np.asarray(rates, dtype=float), load)
    return [dict(rate_rps=float(r), stable=bool(s), ttft_p50_ms=float(a), ttft_p99_ms=float(b), tpot_ms=float(t),
                 in_flight=float(n)) for r, s, a, b, t, n in zip(np.asarray(rates, dtype=float), op["stable"],
                                                                 op["ttft_p50_ms"], op["ttft_p99_ms"], op["tpot_ms"],
                                                                 op["in_flight"])]
