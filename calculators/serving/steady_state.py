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
probability 1/O): the mean-field answer is exact for the mean step.

TPOT, a mean over requests, is more than τ with whole prompts: an arrival lands in a long step (∝ its length), the
next carries its prompt too, and the steps it decodes in remember both (`chain_tpot_excess`: the prompt chain at a
fixed number decoding; `decode_count_tpot_excess`: the number decoding, which the bursts of prompts move).

TTFT = X + W (p50 and p99 of the mixture, `ttft_quantile`), X = the prefill parts added at each quantile:
    wait for a slot W        the birth-death chain of requests held (`slot_wait_law`; with j held a step carries
                             the prompts that arrive during it, so longer steps carry more): P(N ≥ B), then
                             exponential with mean (I + c_s²)/2 · 1/(μ_B − λ) (Kingman; Allen-Cunneen), I the
                             dispersion of arrivals counted in steps (`context_dispersion`: the step moves with the
                             running sequences' cached context, so arrivals per step are a Cox process)
    whole prompts            the prompt chain: the rest of the step in progress (length-biased), then the own step
                             with the prompts that arrived meanwhile; an idle replica (P = e^(−N)) starts at once
    prompts past half a chunk  the token stream cut into chunks (`_stream_ttft_levels`): the rest of the step in
                             progress, then ⌈(Q + (J + 1)·I)/chunk⌉ steps, Q the tokens left queued after a step
                             (a Markov chain, `stream_backlog_law`), J the prompts ahead from the same step,
                             mixed over the step's slow wander with the rows decoding and their context
                             (`step_wander_ms`, quasi-static: `stream_backlog_mix`); the
                             screening pass keeps M/G/1 on prompt tokens served at the full-chunk step
                             (Pollaczek-Khinchine mean, Cramér-Lundberg tail), whose mean wait also counts in the
                             slots held
Sources: Little (1961); Pollaczek-Khinchine; Erlang C (the slot chain with a flat step); Kingman (1961) and
Allen-Cunneen (Allen, Probability, Statistics and Queueing Theory, 1990) for a general service; Cramér-Lundberg
for the M/G/1 tail (Asmussen, Applied Probability and Queues, 2003); Halfin & Whitt (1981, GI/M/s in heavy
traffic) and Browne & Whitt (1995, piecewise-linear diffusions) for the dispersed chain; Glynn & Whitt (1993,
"Limit theorems for cumulative processes") for the context's variance rate; Kwon et al. 2023 (vLLM) and Agrawal
et al. 2024 (Sarathi-Serve, chunked prefill) for the step's content.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from calculators.serving.lengths import Lengths
from specs.model_config import SpecError

StepFn = Callable[[np.ndarray, np.ndarray], np.ndarray]     # (decode rows n, prompt tokens p) -> step ms
BISECT = 30
SCREEN_BISECT = 12        # the screening pass (prompts per step drawn independently): 2.4e-4 of the bracket; the
                          # candidates near the targets are solved again with the prompt chain at BISECT
NEAR_BISECT = 20          # from a guess's bracket [0.8, 1.25] × τ: 4e-7 of τ
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


K_TERMS = 48
FILL_ITERATIONS = 4      # the budget's busy share, solved with the mean step it sets (`last_chunk_packing`)


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
    w = k * np.log(m)
    w -= m
    w -= _LGAMMA[:k.shape[0]].reshape(k.shape)
    np.exp(w, out=w)
    w /= np.maximum(w.sum(axis=0), 1e-300)
    return w


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
    step's K. With a finite chunk, the prompts past what a chunk holds wait for the next step (`_carried_over`;
    solved again, from the law without it, only where steps carry more than a chunk's prompts more than
    CARRY_MASS of the time).
    Returns (π, τ_K): the stationary law of K (power iteration) and the step time of each K, shape
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
    fit = load.chunk / load.prompt.mean_tokens                             # prompts a chunk carries
    over = np.arange(kt) > fit
    carry = pi[..., over].sum(axis=-1) > CARRY_MASS if over.any() else np.zeros(pi.shape[:-1], dtype=bool)
    if carry.any():                                     # the prompts past the chunk wait for the next step
        sub = _carried_over(trans[carry], np.maximum(np.arange(kt) - fit, 0.0))
        p_sub = pi[carry]                               # from the law without carrying: most of the way there
        for _ in range(iters * CARRY_MIXING):           # a backlog forgets its start more slowly
            p_sub = np.einsum("...k,...kj->...j", p_sub, sub)
        pi = pi.copy()
        pi[carry] = p_sub
    return pi, tau_k


def _carried_over(arrivals, left):
    """The chain's transitions when a step at K leaves left[K] prompts (fractional: split between ⌊·⌋ and ⌈·⌉
    so the mean is kept) for the next step, on top of the prompts that arrive during it: the arrivals' law
    shifted by the carried prompts, cut at the last state (its mass moved there)."""
    kt = arrivals.shape[-1]
    lo = np.floor(left).astype(int)
    hi_w = left - lo
    out = np.zeros_like(arrivals)
    for k in range(kt):
        for shift, w in ((lo[k], 1 - hi_w[k]), (lo[k] + 1, hi_w[k])):
            if w <= 0:
                continue
            shift = min(shift, kt - 1)
            out[..., k, shift:] += w * arrivals[..., k, :kt - shift]
            out[..., k, -1] += w * arrivals[..., k, kt - shift:].sum(axis=-1)
    return out


CARRY_MASS = 1e-6        # the share of steps past a chunk's prompts below which none are carried over
CARRY_MIXING = 4         # power iterations × this where prompts carry over, from the law without (at 85% of
                         # the budget, 200-token prompts: the mean step 0.4% off a loop; 2×: 1.0%, 1×: 2.9%)
TPOT_LAGS = 32           # steps after its prefill over which a request's decode steps remember its arrival


def _shared(*arrays):
    """Arrays a process-wide cache hands to every caller, made read-only: one caller's in-place edit would
    otherwise change what every later session computes. One array comes back as itself, several as a tuple."""
    for a in arrays:
        if isinstance(a, np.ndarray):
            a.setflags(write=False)
    return arrays[0] if len(arrays) == 1 else arrays


@lru_cache(maxsize=64)
def decode_lag_weights(output: Lengths, lags: int = TPOT_LAGS) -> np.ndarray:
    """h(i) = E[1{O ≥ i} / (O − 1) | O ≥ 2], i = 2..lags+1: the weight of the i-th step after a request's arrival
    step in its TPOT = Σ_{i=2}^{O} τ_(a+i) / (O − 1) (step a+1 prefills it; a request with O = 1 has no TPOT).
    Σ_i h(i) over all i ≥ 2 is 1."""
    x, w = output._grid()
    x, w = x[x >= 2], w[x >= 2]
    i = np.arange(2, lags + 2, dtype=float)[:, None]
    return _shared(np.sum((x[None] >= i) * w[None] / (x[None] - 1), axis=1) / max(float(w.sum()), 1e-300))


def chain_tpot_excess(pi, tau_k, lam, output: Lengths):
    """TPOT − τ with whole prompts at a fixed number decoding. A Poisson arrival lands in a step with probability
    ∝ its length; the next step carries it and Poisson(λ·τ_K) others (Palm), and the prompt chain (`prompt_chain`,
    transitions P) remembers: E[τ_(a+i)] = Σ_K π_K·τ_K·(P₁Pⁱ⁻¹τ)_K / Σ_K π_K·τ_K, P₁ the first step with the
    arrival's own prompt. TPOT = Σ_i h(i)·E[τ_(a+i)] (`decode_lag_weights`) is longer than the mean step τ: long
    steps come in runs, and a request that arrives in one decodes its first tokens in the run (mostly short
    requests: h weighs a request's steps by 1/(O − 1)). The first TPOT_LAGS lags; beyond, E[τ_(a+i)] = τ."""
    h = decode_lag_weights(output)
    m = np.asarray(lam, dtype=float)[..., None] * tau_k / 1e3
    kk = np.arange(tau_k.shape[-1], dtype=float).reshape((-1,) + (1,) * m.ndim)
    trans = np.moveaxis(_poisson(kk, m), 0, -1)                             # (..., K from, K to)
    own = np.concatenate([np.zeros_like(trans[..., :1]), trans[..., :-1]], axis=-1)   # itself + Poisson others
    own = own / np.maximum(own.sum(axis=-1, keepdims=True), 1e-300)
    mean = (pi * tau_k).sum(axis=-1)
    v = pi * tau_k / np.maximum(mean[..., None], 1e-300)                    # the arrival's step, length-biased
    excess = np.zeros_like(mean)
    for i in range(1, len(h) + 2):
        v = np.einsum("...k,...kj->...j", v, own if i == 1 else trans)
        gap = (v * tau_k).sum(axis=-1) - mean
        if i >= 2:
            excess = excess + h[i - 2] * gap
        if i >= 2 and np.all(np.abs(gap) <= 1e-6 * mean):                 # the chain has forgotten the arrival
            break
    return excess


def decode_count_tpot_excess(step: StepFn, n, lam, load: "Load", pi, tau_k):
    """What the wander of the number decoding n adds to TPOT − τ (whole prompts), from the linearised pair
    x = (K, n) of prompts a step carries and sequences decoding in it: with τ_k = τ + b·δK_k + s·δn_k,
        δK' = λb·δK + λs·δn + ε_K      (K' ~ Poisson(λτ_k): Var ε_K = λτ)
        δn' = δK + (1 − γ)·δn + ε_D    (the prompts just prefilled decode; each leaves w.p. γ = 1/E[O − 1]: γn)
    i.e. x' = A·x + ε. Stationary covariance Σ = AΣAᵀ + Q (solved as a 4×4 system). An arrival lands in a step ∝
    its length, so E[δx_a] = Σc/τ (c = (b, s)), and the next step carries it too: y = E[δx_(a+1)] = AΣc/τ + (1, 0).
        TPOT − τ = cᵀ·M·y,  M = E[Σ_(i=1..O−1) Aⁱ / (O − 1) | O ≥ 2] = G(μ₋)·1 + (G(μ₊) − G(μ₋))/(μ₊ − μ₋)·(A − μ₋)
    (Lagrange on A's real eigenvalues μ±, G = `decode_decay`). The prompt chain already holds the part with n
    fixed (`chain_tpot_excess`, exact for the bent step), so this returns the full pair's answer less that of the
    pair with s = 0 (δn then never moves the step): b·G(λb)·(λb·b·Var(K)/τ + 1), Var(K) = λτ/(1 − (λb)²).
    b: τ_K's regression on K under π; s: ∂step/∂n over π. Geometric outputs only: each decoding sequence then
    leaves with probability γ a step whatever its age. With other lengths a burst's members leave on their own
    clocks (all at once for fixed outputs, mostly soon for a long tail), which one rate γ misplaces: against the
    simulator at 90-95% of capacity with 1000-token prompts it put the excess 2.6-2.8 times too high (fixed 200,
    lognormal 300 / p99 2,000), so those keep the prompt chain's part only."""
    n, lam_ms = np.asarray(n, dtype=float), np.asarray(lam, dtype=float) / 1e3
    kt = tau_k.shape[-1]
    k = np.arange(kt, dtype=float)
    tau = (pi * tau_k).sum(axis=-1)
    ek = (pi * k).sum(axis=-1)
    b = ((pi * k * tau_k).sum(axis=-1) - ek * tau) / np.maximum((pi * k * k).sum(axis=-1) - ek ** 2, 1e-12)
    tok = np.moveaxis(np.minimum(load.chunk, k * load.prompt.mean_tokens).reshape((kt,) + (1,) * n.ndim)
                      * np.ones_like(n), 0, -1)
    dn = np.maximum(0.01 * n, 1e-3)[..., None]
    up = np.moveaxis(step(np.moveaxis(n[..., None] + dn + 0 * tok, -1, 0), np.moveaxis(tok, -1, 0)), 0, -1)
    s = np.maximum((pi * (up - tau_k) / dn).sum(axis=-1), 0.0)
    g = 1 / max(load.decode_tokens, 1.0)
    af = np.minimum(lam_ms * b, 1 - 1e-6)
    s = np.minimum(s, (1 - 1e-3) * g * (1 - af) / np.maximum(lam_ms, 1e-300))   # the pair stays stable
    A = np.stack([np.stack([af, lam_ms * s], -1), np.stack([np.ones_like(af), (1 - g) + 0 * af], -1)], -2)
    Q = np.stack([lam_ms * tau, g * n + 0 * tau], -1)                       # diag(Var ε_K, Var ε_D)
    kron = A[..., :, None, :, None] * A[..., None, :, None, :]              # (A ⊗ A)[ij, kl] = A_ik·A_jl
    S = np.linalg.solve(np.eye(4) - kron.reshape(kron.shape[:-4] + (4, 4)),
                        (Q[..., :, None] * np.eye(2)).reshape(Q.shape[:-1] + (4, 1)))[..., [0, 1, 3], 0]
    Sig = np.stack([np.stack([S[..., 0], S[..., 1]], -1), np.stack([S[..., 1], S[..., 2]], -1)], -2)
    c = np.stack([b, s], -1)
    y = np.einsum("...ij,...jk,...k->...i", A, Sig, c) / tau[..., None] + np.array([1.0, 0.0])
    tr, det = af + 1 - g, af * (1 - g) - lam_ms * s
    root = np.sqrt(np.maximum(tr * tr / 4 - det, 0.0))
    lo, gap = tr / 2 - root, np.maximum(2 * root, 1e-6)
    g_lo = decode_decay(load.output, lo)
    slope = (decode_decay(load.output, lo + gap) - g_lo) / gap
    Ay = np.einsum("...ij,...j->...i", A, y)
    full = g_lo * (c * y).sum(-1) + slope * ((c * Ay).sum(-1) - lo * (c * y).sum(-1))
    fast = b * decode_decay(load.output, af) * (af * b * lam_ms * tau / np.maximum(1 - af ** 2, 1e-12) / tau + 1)
    return full - fast


DECAY_MU = np.r_[np.linspace(-1.0, 0.5, 97), 1 - 0.5 * 10.0 ** (-np.arange(1, 129) / 16)]   # `decode_decay`'s table


@lru_cache(maxsize=64)
def _decay_table(output: Lengths):
    x, w = output._grid()
    x = np.round(x)                                   # whole lengths: μ^(O − 1) with μ < 0
    x, w = x[x >= 2], w[x >= 2] / max(float(w[x >= 2].sum()), 1e-300)
    m = DECAY_MU[:, None]
    return _shared(DECAY_MU, np.sum(w * m * (1 - m ** (x - 1)) / ((1 - m) * (x - 1)), axis=-1))


def decode_decay(output: Lengths, mu):
    """G(μ) = E[Σ_(i=1..O−1) μⁱ / (O − 1) | O ≥ 2] = E[μ(1 − μ^(O−1)) / ((1 − μ)(O − 1))]: the weight of a
    deviation that decays as μⁱ from a request's prefill step in its TPOT. Tabulated per output law (μ from −1 to
    0.5 in steps of 1/64, then 1 − μ falling from 0.5 by 10^(1/16) a point to 5e-9), interpolated; 1 as μ → 1."""
    mu_t, g_t = _decay_table(output)
    return np.interp(np.asarray(mu, dtype=float), mu_t, g_t, right=1.0)


def mean_step(step: StepFn, n, p, load: "Load", lam=None, chain: bool = True):
    """The mean step time with n decode rows and p prompt tokens per step on average. Whole prompts: the mean
    over the prompt chain (`prompt_chain`). Prompts cut into chunks (at least half a chunk long): the budget as
    a token stream (`last_chunk_packing`): steps carrying a full chunk, steps carrying a prompt's last, partial
    chunk alone, and steps carrying none, the share of partial ones set by the time the budget is busy. A step
    cost that bends (the max of a memory line and a compute line) makes either more than step(n, p) (Jensen): a
    step that carries a whole prompt is compute-bound while the steps between are memory-bound. Where a step
    carries many whole prompts (m > K/3), the law of large numbers: step(n, p)."""
    n, p = np.asarray(n, dtype=float), np.asarray(p, dtype=float)
    if not whole_prompts(load):                             # prompts cut into chunks: the token stream
        full, partial, rest = last_chunk_packing(load.prompt, load.chunk)
        prompts = p / load.prompt.mean_tokens                   # prompts whose tokens a step carries, on average
        zero = np.zeros_like(n)
        t0, tc, tr = step(n, zero), step(n, zero + load.chunk), step(n, zero + rest)
        fill = np.minimum(p / load.chunk, 1.0)
        # at least the fill that leaves the steps carrying prompts within all steps (p near the budget)
        least = (prompts * (full + partial) - 1) / np.maximum(prompts * partial * (1 - rest / load.chunk), 1e-12)
        for _ in range(FILL_ITERATIONS):                        # fill = the time share of steps carrying prompts
            fill = np.clip(fill, np.minimum(least, 1.0), 1.0)
            f_full = prompts * (full + partial * fill * rest / load.chunk)
            f_rest = prompts * partial * (1 - fill)
            mixed = (1 - f_full - f_rest) * t0 + f_full * tc + f_rest * tr
            fill = np.minimum((f_full * tc + f_rest * tr) / mixed, 1.0)
        return mixed
    k, w, m = prompt_packets(p, load.chunk, load.prompt.mean_tokens)
    many = m > K_TERMS / 6
    if chain and lam is not None:
        pi, tau_k = prompt_chain(step, n, lam, load)
        mixed = (pi * tau_k).sum(axis=-1)
    else:
        tok = np.minimum(load.chunk, k * load.prompt.mean_tokens)
        mixed = (w * step(n[None, ...] * np.ones_like(tok), tok * np.ones_like(n)[None, ...])).sum(axis=0)
    return np.where(many, step(n, p), mixed)


@lru_cache(maxsize=64)
def last_chunk_packing(prompt: Lengths, chunk: float) -> tuple[float, float, float]:
    """A prompt cut into chunks: E[⌊I/chunk⌋] full chunks, then with probability P(I mod chunk > 0) a last,
    partial chunk of E[I mod chunk | > 0] tokens. That last chunk fills its step only when another prompt is
    waiting (its first tokens fill the rest of the budget); otherwise, with probability 1 − ρ, the step carries
    the remainder alone. Per prompt there are E[⌊I/c⌋] + P(r > 0)·ρ·E[r]/c full-budget steps and
    P(r > 0)·(1 − ρ) steps carrying r tokens only (`mean_step`), ρ the share of time in steps that carry prompts
    (a prompt arriving finds one in progress with that probability: PASTA), solved with the mean step it sets.
    Against a step-by-step loop of the token stream, 300-1,000-token prompts and chunks of 512 at 30-85% load:
    within 1.6% (a full chunk for every step that carries prompts was 2% off; Poisson whole prompts cut at the
    chunk, 15%).
    Returns (E[⌊I/c⌋], P(r > 0), E[r | r > 0])."""
    full = prompt.moment(lambda x: np.floor(x / chunk))
    rest = lambda x: x - chunk * np.floor(x / chunk)      # noqa: E731
    partial = prompt.moment(lambda x: (rest(x) > 0.5).astype(float))
    mean_rest = prompt.moment(lambda x: np.where(rest(x) > 0.5, rest(x), 0.0)) / max(partial, 1e-12)
    return full, partial, mean_rest


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


def slot_wait_law(lam, steps_per_request, step_at, slots, held=None, scv=1.0, dispersion=None):
    """P(wait) and the mean conditional wait (s) for a free slot, from the birth-death chain of the number N of
    requests in the replica: with N = j running, a step takes step_at(j) ms and each running request finishes
    with probability 1/steps_per_request per step, so requests leave at rate j / (steps·step_at(j)) and
        w_j = w_{j−1} · λ · steps · step_at(j) / (1000 · j)      (j ≤ B = slots)
        w_j = w_B · q^(j − B),  q = λ · steps · step_at(B) / (1000 · B)   (j > B: the batch is full, the rest wait)
    (a step that grows with j makes N over-dispersed: negative binomial while it is linear, Poisson, i.e. Erlang's
    M/M/c, while it is flat). P(wait) = P(N ≥ B); the wait then is exponential with mean 1/(μ_B − λ),
    μ_B = λ/q, for exponential service. A request's time in its slot has the squared coefficient of variation
    `scv` (c_s² = 1: geometric outputs; 0: fixed ones): while the slots are full the queue is a GI/G/1 queue
    served at rate μ_B, whose wait given a wait is in heavy traffic exponential with mean (c_a² + c_s²)/2 ·
    1/(μ_B − λ), c_a² = 1 for Poisson arrivals (Kingman's heavy-traffic law; Allen-Cunneen's M/G/c
    approximation scales Erlang C's wait by the same factor).
    `dispersion(j)`: z_j = (1 + I_j)/2 where the arrivals, counted in steps, have index of dispersion I_j (1 for
    Poisson; `context_dispersion`). The chain is the birth-death form of a diffusion whose log-weights rise by
    2(λ − μ_j)/(λ + μ_j) ≈ ln(λ/μ_j) per state; births of dispersion I make that 2(λ − μ_j)/(λ·I + μ_j), i.e.
    ln(λ/μ_j)/z_j near balance (Browne & Whitt 1995), so
        log w_j = Σ_{i ≤ j} ln(rate_i) / z_i,   the queue's ratio q^(1/z_B),   mean wait (2z_B − 1 + c_s²)/2/(μ_B − λ)
    With a flat step and z constant this is Halfin & Whitt's (1981) GI/M/s limit, P(wait) = [1 + β̃Φ(β̃)/φ(β̃)]^(−1)
    with β̃ = β/√z, and Kingman's mean with c_a² = I; with z = 1 it is the chain above. Vectorised; the loop runs
    to the largest finite cap."""
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
        z = 1.0 if dispersion is None else _on_grid(dispersion, top, lam)
        logw = np.cumsum(np.log(np.maximum(rate, 1e-300)) / z, axis=0)        # log w_j, j = 1..top
        below = j < c[None]
        log_z = np.logaddexp(0.0, np.log(np.sum(np.where(below, np.exp(logw - logw.max(axis=0)), 0.0), axis=0))
                             + logw.max(axis=0))
        cap = np.clip(np.where(finite, c, 1.0).astype(int), 1, top) - 1
        log_wb = np.take_along_axis(logw, cap[None], axis=0)[0]
        q = lam * steps_per_request * step_at(np.where(finite, c, 1.0)) / (1e3 * np.where(finite, c, 1.0))
        ok = finite & (q < 1)
        zb = np.ones_like(q) if dispersion is None else dispersion(np.where(finite, c, 1.0))
        log_tail = log_wb - np.log1p(-np.minimum(q, 1 - 1e-12) ** (1 / zb))    # Σ_{j ≥ B} w_B q^((j − B)/z)
        p_wait = np.where(ok, np.exp(log_tail - np.logaddexp(log_z, log_tail)), np.where(finite, 1.0, 0.0))
        p_wait = np.where(far, 0.0, p_wait)
        kingman = (2 * zb - 1 + np.asarray(scv)) / 2                           # (c_a² + c_s²)/2, c_a² = I_B
        mean_cond = np.where(ok, kingman / np.maximum(lam * (1 / np.maximum(q, 1e-300) - 1), 1e-300), np.inf)
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
    lo, hi = vals[i0], vals[i0 + 1]
    lo *= 1 - f
    hi *= f
    lo += hi
    return lo


def _state_step(step: StepFn, rows, tokens_per_ms, bend, start, chunk: float = math.inf, iterations: int = 8):
    """The step with `rows` decoding when the prompt tokens it carries are those that arrive during it, at most a
    chunk: τ_j = g(τ_j), g(τ) = step(rows, min(chunk, λ·E[I]·τ)) + bend, found by the secant method from `start`
    (g is near linear in τ, with slope λ·E[I]·∂step/∂p < 1 below capacity; where it is not, inf)."""
    rows = np.asarray(rows, dtype=float)
    g = lambda t: step(rows, np.minimum(chunk, tokens_per_ms * t)) + bend            # noqa: E731
    t0 = np.asarray(start, dtype=float) * np.ones_like(rows)
    h0 = g(t0) - t0
    t1 = t0 + h0
    for _ in range(iterations):
        h1 = g(t1) - t1
        if np.all(np.abs(h1) <= 1e-9 * np.abs(t1)):
            break
        dh = h1 - h0
        with np.errstate(divide="ignore", invalid="ignore"):
            nxt = np.where(np.abs(dh) > 1e-12 * np.abs(t1), t1 - h1 * (t1 - t0) / dh, t1 + h1)
        t0, h0, t1 = t1, h1, nxt
    return np.where(np.isfinite(t1) & (t1 > 0), t1, np.inf)


def _last_answer_kept(f):
    """f(j) with its last answer kept for the same j: `slot_wait_law` reads the step on its grid of states, then
    the dispersion (`context_dispersion`) reads it on the same grid again."""
    last = []

    def f_kept(j):
        j = np.asarray(j, dtype=float)
        if not (last and last[0].shape == j.shape and np.array_equal(last[0], j)):
            last[:] = [j.copy(), f(j)]
        return last[1]
    return f_kept


def full_batch_age_excess(steps_per_row, rho_full, slots):
    """How many more tokens a row of a full batch has decoded than the stationary mix's rows (geometric outputs:
    a row leaves with probability h = 1/L a step). Below the cap, more requests held come as often from arrivals
    (young rows) as from departures that did not happen (old rows), and the two balance (M/G/∞: given the count,
    the ages are the stationary ones). At the cap the arrivals wait outside, so a full batch with q waiting holds
    the rows that missed their departures: each missing departure leaves a row ~L older than its replacement would
    be. With the queue at a full batch a reflected random walk (drift −δ = −h·B·(1 − ρ), variance σ² ≈ 2hB a step:
    mean 1/(1 − ρ), relaxation rate a = δ²/(2σ²)) and the rows' total age an OU process relaxing at h driven by
    the same departures, the regression of the total age on q is L·a/(a + h), so a row is older by
        Δ = (L/B)·(1/(1 − ρ))·a/(a + h) = L(1 − ρ)/4 / (1 + B(1 − ρ)²/4)   steps.
    Against a step-by-step population loop (flat step, cap 16-256, L 100-1,000, 90-95% load), the excess while the
    batch is full and requests wait: 1.2 / 10.8 / 10.8 against 1.8 / 13.8 / 19.6 (55-78% of it: the linear
    regression misses the queue's long swings)."""
    rho = np.clip(np.asarray(rho_full, dtype=float), 0.0, 1.0)
    B = np.asarray(slots, dtype=float)
    return steps_per_row * (1 - rho) / 4 / (1 + B * (1 - rho) ** 2 / 4)


def slot_wait_quantile_s(lam, steps_per_request, step_at, slots, q, held=None, scv=1.0, law=None):
    """Wait for a free slot at quantile q (s), from `slot_wait_law` (or its result `law`); 0 without a cap."""
    p_wait, mean_cond = law if law is not None else slot_wait_law(lam, steps_per_request, step_at, slots, held, scv)
    t = _tail_quantile(p_wait, mean_cond, q)
    return np.where(~np.isfinite(np.asarray(slots, dtype=float) * np.ones_like(np.asarray(lam, dtype=float))),
                    0.0, t)


def context_spread(load: Load) -> float:
    """v, tokens²·steps per step: the variance rate of one busy slot's cached context summed over steps. An
    occupant holds its slot X = O − 1 + k steps and reads R = (O − 1)·I + (O − 1)(O − 2)/2 cached positions over
    its decode steps (its context grows by one a step); back-to-back occupants make a renewal-reward process, whose
    sum over many steps is asymptotically normal with variance rate Var(R − c·X)/E[X], c = E[R]/E[X] (the
    renewal-reward central limit theorem; Glynn & Whitt 1993). Prompts and outputs independent. 0 for fixed
    lengths (each slot's context is then a saw-tooth that repeats)."""
    I, O, k = load.prompt, load.output, load.prefill_steps
    ei, ei2 = I.mean_tokens, I.second_moment
    ex = O.moment(lambda o: o - 1 + k)
    c = (ei * O.moment(lambda o: o - 1) + O.moment(lambda o: (o - 1) * (o - 2) / 2)) / ex

    def centred(o):                                      # E_I[(R − c·X)²] at output o
        g = (o - 1) * (o - 2) / 2 - c * (o - 1 + k)
        return (o - 1) ** 2 * ei2 + 2 * (o - 1) * ei * g + g * g
    return max(O.moment(centred), 0.0) / ex


def context_dispersion(step: StepFn, load: Load, lam, rows_at, p, step_at):
    """z(j) = (1 + I_j)/2 of `slot_wait_law`, or None (a step that does not say how it grows with the context, or
    lengths that leave no spread). Counted in steps, a slot is held a fixed number of steps whatever they last, but
    the arrivals per step are Poisson(λ·τ_k): τ_k = step_at(j) + β·(A_k − E[A]), A_k the context the r = rows_at(j)
    decode rows read, β = `step.ms_per_context_token` (the KV read, or attention where compute binds). Over K steps
    the arrivals' variance is λτK + λ²·Var(Σ τ_k) = λτK + λ²β²·r·v·K (v = `context_spread`), so
        I_j = 1 + λ·β²·r·v / step_at(j)                 (λ per ms)
    A full batch whose sequences happen to be old makes every step longer and frees its slots later: the departures
    bunch, and the queue behind a full batch is longer than with Poisson departures (v = 0, I = 1 for fixed
    lengths, and β = 0 where the step does not read the context)."""
    beta = getattr(step, "ms_per_context_token", None)
    v = context_spread(load) if beta is not None else 0.0
    if v <= 0:
        return None
    lam_ms = np.asarray(lam, dtype=float) / 1e3

    def z(j):
        r = rows_at(j)
        return 1 + lam_ms * beta(r, p * np.ones_like(r)) ** 2 * r * v / (2 * step_at(j))
    return z


def prefill_wait_mean_s(rho, service_s, scv):
    """Mean wait for the prefill budget: M/G/1, Pollaczek-Khinchine ρ·S·(1 + c²)/(2(1 − ρ))."""
    rho = np.asarray(rho, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = rho * service_s * (1 + scv) / (2 * (1 - rho))
    return np.where(rho < 1, np.where(rho > 0, w, 0.0), np.inf)


TAIL_EDGES = np.unique(np.r_[np.arange(1, 32) / 32, 1 - 0.5 ** (np.arange(4, 48) / 2)])


def service_shape(lengths: Lengths):
    """A prompt's service relative to the mean, S / E[S] = I / E[I], as ≤ 76 values (each bin's mean, so the mean
    stays 1): what the budget queue's tail (`prefill_wait_quantile_s`) needs of the prompt lengths. Bins of 1/32
    up to the median, then the tail's mass halving every two bins (the root depends on E[e^(ηS)], i.e. on the
    longest prompts)."""
    x, p = lengths._grid()
    if len(x) <= len(TAIL_EDGES) + 1:
        return x / lengths.mean_tokens, p
    c = np.cumsum(p)
    edge = np.unique(np.searchsorted(c, TAIL_EDGES))
    vals = np.array([np.sum(x[a:b] * p[a:b]) / max(np.sum(p[a:b]), 1e-300)
                     for a, b in zip(np.r_[0, edge], np.r_[edge, len(x)]) if b > a])
    w = np.array([np.sum(p[a:b]) for a, b in zip(np.r_[0, edge], np.r_[edge, len(x)]) if b > a])
    vals = vals / np.sum(vals * w / w.sum())
    return vals, w / w.sum()


def prefill_wait_quantile_s(rho, service_s, shape, q, tail=None):
    """Wait for the prefill budget at quantile q: M/G/1 with utilisation ρ and service times S = E[S]·X, X with
    the law `shape` (values, probabilities; mean 1). The tail is Cramér-Lundberg's, P(W > t) ≈ C·e^(−ηt), η > 0
    the root of λ·(E[e^(ηS)] − 1) = η and C = (1 − ρ)/(λ·E[S·e^(ηS)] − 1): exact for exponential service
    (η = μ − λ, C = ρ), asymptotically exact for any light-tailed one, and at light load with fixed prompts
    right where an exponential with the Pollaczek-Khinchine mean is not (the wait is then at most one
    service, not a long exponential tail). Solved for y = η·E[S] by bisection (λ·E[S] = ρ); `tail`: (y, C) from
    `prefill_wait_tail` when several quantiles are wanted."""
    rho = np.asarray(rho, dtype=float)
    y, C = tail if tail is not None else prefill_wait_tail(rho, shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.log(np.maximum(C / (1 - q), 1.0)) * np.asarray(service_s, dtype=float) / np.maximum(y, 1e-300)
    return np.where(rho < 1, np.where(rho > 1 - q, t, 0.0), np.inf)


def prefill_wait_tail(rho, shape):
    """(y, C) of `prefill_wait_quantile_s`: the decay rate times E[S], and the tail's constant."""
    rho = np.asarray(rho, dtype=float)
    x, w = shape
    r = np.clip(rho, 1e-9, 1 - 1e-9)[..., None]
    mgf = lambda y: np.sum(w * np.exp(np.minimum(y[..., None] * x, 700)), axis=-1)      # noqa: E731  E[e^(yX)]
    f = lambda y: (r[..., 0] * (mgf(y) - 1) - y)[..., None]                          # noqa: E731
    lo, hi = np.zeros(rho.shape), np.full(rho.shape, 1.0)
    for _ in range(40):                               # bracket: f(hi) > 0
        up = f(hi)[..., 0] <= 0
        if not up.any():
            break
        hi = np.where(up, hi * 2, hi)
    for _ in range(BISECT):
        mid = (lo + hi) / 2
        neg = f(mid)[..., 0] <= 0
        lo, hi = np.where(neg, mid, lo), np.where(neg, hi, mid)
    y = (lo + hi) / 2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = r[..., 0] * np.sum(w * x * np.exp(np.minimum(y[..., None] * x, 700)), axis=-1) - 1   # λE[S e^(ηS)] − 1
        C = (1 - r[..., 0]) / np.maximum(d, 1e-12)   # may exceed ρ = P(W > 0): the line fits the tail, not t = 0
    return y, C


STREAM_UNITS = 128        # token units per chunk on the stream's lattice (500 of 512 tokens: 125 of 128 units)
STREAM_BODY = 2           # chunks of backlog held exactly; beyond, the Cramér-Lundberg exponential tail


def stream_arrivals_pmf(m, prompt: Lengths, unit: float, size: int):
    """P(A = a units), a = 0..size−1: the prompt tokens that arrive during one step, compound Poisson: K ~
    Poisson(m) prompts, each of I tokens (rounded to `unit`). PGF exp(m·(G_I(z) − 1)), inverted by FFT on 2·size
    points (the mass past 2·size aliases back; it is below 1e-12 where the queue is stable). Shape (..., size)."""
    x, w = prompt._grid()
    k = np.clip(np.round(x / unit).astype(int), 0, 2 * size - 1)
    pi = np.bincount(k, weights=w, minlength=2 * size) / np.sum(w)
    g = np.fft.rfft(pi)
    m = np.asarray(m, dtype=float)[..., None]
    a = np.fft.irfft(np.exp(m * (g - 1)), n=2 * size)[..., :size]
    return np.maximum(a, 0.0)


def stream_backlog_law(pa, eta, units: int = STREAM_UNITS, body: int = STREAM_BODY):
    """The prompt tokens left queued after a step, Q (in units; a chunk is `units`), stationary: the slotted queue
        Q' = max(Q + A − chunk, 0)
    (the prompts that arrive during a step join at its end, and the next step takes the first `chunk` tokens of
    the queue, whatever prompts they belong to: one token stream cut into chunks). States 0..L−1 exactly
    (L = body·units) and one state for Q ≥ L, inside which Q − L is exponential with the decay η (per unit) of
    the Cramér-Lundberg root (memoryless: from L + E, a step that takes d more tokens than arrived stays above L
    with probability e^(−ηd), else lands at L − d + e with P(e) = e^(−ηe)(1 − e^(−η))). Returns (π, L): π of
    shape (..., L + 1), π[..., L] = P(Q ≥ L). `pa`: P(A = a), a = 0..(size − 1) (`stream_arrivals_pmf`)."""
    G, L = units, body * units
    pa = np.asarray(pa, dtype=float)
    size = pa.shape[-1]
    cdf = np.cumsum(pa, axis=-1)
    cdf_at = lambda i: np.where(i < 0, 0.0, np.take(cdf, np.clip(i, 0, size - 1), axis=-1))   # noqa: E731
    q = np.arange(L)[:, None]
    d = np.arange(L + 1)[None, :]
    idx = d - q + G                                              # the a that takes q to d (0 < d < L)
    mid = np.where((idx >= 0) & (idx < size), np.take(pa, np.clip(idx, 0, size - 1), axis=-1), 0.0)
    P = np.where(d == 0, cdf_at(G - q), np.where(d == L, 1 - cdf_at(L - q + G - 1), mid))      # (..., L, L+1)
    eta = np.asarray(eta, dtype=float)[..., None, None]
    a = np.arange(G)[:, None]
    j = np.arange(L + 1)[None, :]
    e = j - (L - G) - a                                          # from the tail, arrivals a < G land at j
    f = np.where((e >= 0) & (j < L), np.exp(-eta * np.maximum(e, 0)) * -np.expm1(-eta), 0.0)   # (..., G, L+1)
    tail = np.einsum("...a,...aj->...j", pa[..., :G], f)
    tail[..., L] = 1 - tail[..., :L].sum(axis=-1)
    P = np.concatenate([P, tail[..., None, :]], axis=-2)         # (..., L+1, L+1)
    A = np.swapaxes(P, -1, -2) - np.eye(L + 1)
    A[..., -1, :] = 1.0                                          # π(P − 1) = 0 with Σπ = 1
    rhs = np.zeros(A.shape[:-1])
    rhs[..., -1] = 1.0
    pi = np.linalg.solve(A, rhs[..., None])[..., 0]
    return np.maximum(pi, 0.0), L


def stream_backlog_cdf(pi, L: int, eta, y):
    """P(Q ≤ y) for the law `pi` of `stream_backlog_law` (elements along the first axis, y of shape (elements,
    ...) in units): the exact states below L, then 1 − P(Q ≥ L)·e^(−η(y − L))."""
    y = np.floor(np.asarray(y, dtype=float))
    flat = y.reshape(len(pi), -1)
    c = np.cumsum(pi, axis=-1)
    body = np.take_along_axis(c, np.clip(flat, 0, L - 1).astype(int), axis=-1)
    above = 1 - pi[:, L:L + 1] * np.exp(-np.asarray(eta, dtype=float).reshape(-1, 1) * np.maximum(flat - L, 0))
    return np.where(flat < 0, 0.0, np.where(flat < L, body, above)).reshape(y.shape)


def row_context_moments(load: Load):
    """E[c] and E[c²] of one decoding row's cached context c = I + a, a its decode steps so far: a running
    sequence's age is the equilibrium (length-biased) age of its O − 1 decode steps, P(a) = P(O − 1 > a)/E[O − 1],
    so with m = O − 1, E[a] = E[m(m − 1)/2]/E[m] and E[a²] = E[(m − 1)m(2m − 1)/6]/E[m]; prompt and output
    independent."""
    O, I = load.output, load.prompt
    em = max(O.moment(lambda o: o - 1), 1e-12)
    ea = O.moment(lambda o: (o - 1) * (o - 2) / 2) / em
    ea2 = O.moment(lambda o: (o - 2) * (o - 1) * (2 * o - 3) / 6) / em
    return I.mean_tokens + ea, I.second_moment + 2 * I.mean_tokens * ea + ea2


def step_wander_ms(step: StepFn, n, lam, p, load: Load):
    """σ of the mean step over the slow wander of the rows decoding and their context: the rows are an M/G/∞
    population (Poisson in number, each its own context c), so the step's part that they carry,
    Σ_rows (s₀ + β·c), has variance n·E[(s₀ + β·c)²] (compound Poisson; s = ∂step/∂n = s₀ + β·E[c], β =
    `step.ms_per_context_token`, 0 if the step does not say). A longer step brings λ·s more arrivals a step, each
    decoding 1/γ steps (γ = 1/E[O − 1]): the loop gain x = λ·s/γ makes the linearised count an AR(1) with
    φ = 1 − γ(1 − x), whose variance is 1/(1 − x) times the open loop's:
        Var(τ) = n·E[(s₀ + β·c)²] / (1 − x)
    (the open loop's variance holds for any output law; the loop's AR(1) is exact for geometric outputs). It
    relaxes in 1/(γ(1 − x)) steps, far slower than a budget queue below saturation."""
    n, lam_ms = np.asarray(n, dtype=float), np.asarray(lam, dtype=float) / 1e3
    dn = np.maximum(0.01 * n, 1e-3)
    sl = np.maximum((step(n + dn, p) - step(n, p)) / dn, 0.0)
    beta = getattr(step, "ms_per_context_token", None)
    beta = np.zeros_like(n) if beta is None else np.asarray(beta(n, p), dtype=float)
    ec, ec2 = row_context_moments(load)
    s0 = sl - beta * ec
    per_row = s0 * s0 + 2 * s0 * beta * ec + beta * beta * ec2
    x = np.minimum(lam_ms * sl * max(load.decode_tokens, 1.0), 0.99)
    return np.sqrt(np.maximum(n * per_row / (1 - x), 0.0))


STREAM_Z = np.linspace(-4.0, 4.0, 17)     # the step's wander in σ: a quadrature of the normal law
STREAM_W = np.exp(-STREAM_Z ** 2 / 2) / np.exp(-STREAM_Z ** 2 / 2).sum()


def stream_backlog_mix(prompt: Lengths, chunk: float, rho, rel_sd):
    """The backlog's law when the budget's utilisation wanders slowly: ρ·(1 + z·rel_sd), z normal (`STREAM_Z`,
    weights `STREAM_W`), the law at each (`stream_backlog_at`, quasi-static: the wander relaxes far slower than the
    queue). Returns (laws (E, Z, L + 1), L, η (E, Z))."""
    r = np.asarray(rho, dtype=float)[:, None] * np.maximum(1 + STREAM_Z[None, :] * np.asarray(rel_sd)[:, None], 0)
    law, L, eta = stream_backlog_at(prompt, chunk, r.reshape(-1))
    return law.reshape(r.shape + (L + 1,)), L, eta.reshape(r.shape)


STREAM_U = 16             # points of the arrival's place within the step in progress (midpoints)
STREAM_T = 65             # points of the TTFT grid the CDF is inverted on
STREAM_BLOCK = 64         # elements whose TTFT CDF is built at once (grid × place in step × prompts ahead)


def _stream_ttft_levels(step: StepFn, n, lam, t, p, load: "Load", busy, levels):
    """X (TTFT without the slot wait) at `levels` with chunked prefill, from the token stream (`stream_backlog_law`).
    An arrival lands u of the way through a step (u uniform; mean step τ), so it waits the rest, (1 − u)·τ; it
    joins the queue at the step's end behind Q (left after that step) and the J ~ Poisson(λ·u·τ) prompts that
    arrived before it in the same step; its first token comes out of the step that takes its last token:
        m = ⌈(Q + (J + 1)·E[I]) / chunk⌉ steps,  X = (1 − u)·τ + (m − 1)·τ_f + τ_last
    τ_f = step(n, chunk) (the steps while prompts queue are full), τ_last = step(n, min(chunk, last + p)) (its last
    chunk, `last` = E[I] − (⌈E[I]/chunk⌉ − 1)·chunk, with the p tokens a step carries on average). So
        P(X ≤ x) = E_u Σ_J P(J)·P(Q ≤ k·chunk − (J + 1)·E[I]),  k = ⌊(x − (1 − u)τ − τ_last)/τ_f⌋ + 1
    A replica with nothing running (probability 1 − busy) starts at once: X = (⌈E[I]/chunk⌉ − 1)·τ_f + τ_last.
    The queue's arrivals per step are Poisson(λ·τ_f): the queue builds while steps are full. A prompt longer
    than the mean adds its own extra steps at its quantile (as the whole-prompt chain does). The step wanders
    slowly with the rows decoding (σ = `step_wander_ms`): Q is mixed over it (`stream_backlog_mix`,
    `_stream_busy_cdf`). Returns (X, alone):
    arrays (levels, ...), `alone` the own prefill and rest of the step without a queue (the budget's wait is
    X − alone)."""
    I, c = load.prompt, load.chunk
    shape = np.shape(n)
    n, lam, t, p, busy = (np.broadcast_to(np.asarray(v, dtype=float), shape).reshape(-1)
                          for v in (n, lam, t, p, busy))
    G, unit = STREAM_UNITS, c / STREAM_UNITS
    ei = I.mean_tokens

    def own(tokens):                                     # the own prompt's steps from an empty queue
        k = np.maximum(np.ceil(tokens / c), 1)
        return (k - 1) * step(n, np.full_like(n, c)) + step(n, np.minimum(c, tokens - (k - 1) * c + p))

    tau_f, tau_0 = step(n, np.full_like(n, c)), step(n, np.zeros_like(n))
    tau_last = own(np.full_like(n, ei)) - (max(math.ceil(ei / c), 1) - 1) * tau_f
    alone0 = own(np.full_like(n, ei))
    rho = lam * tau_f / 1e3 * ei / c                     # the budget's utilisation while steps are full
    rel_sd = step_wander_ms(step, n, lam, p, load) / tau_f
    xs = np.empty((len(levels), len(n)))
    for b in range(0, len(n), STREAM_BLOCK):
        s = slice(b, b + STREAM_BLOCK)
        pi, L, eta = stream_backlog_mix(I, c, rho[s], rel_sd[s])
        p_empty = (STREAM_W * pi[:, :, 0]).sum(-1) * np.exp(-lam[s] * tau_f[s] / 1e3)   # P(B = 0): nothing
        jt = _j_terms(lam[s] * tau_f[s] / 1e3)                                         # queued, nothing arrived
        tails = L + np.log(np.maximum(STREAM_W * pi[:, :, L] / 2e-4, 1.0)) / np.maximum(eta, 1e-12)   # (E, Z)
        scale = np.maximum(1 + STREAM_Z * rel_sd[s, None], 0.1)                        # (E, Z): the steps' length
        hi = (scale * (t[s] + tau_last[s] + tau_f[s] * ((jt + 2) * ei / c))[:, None]
              + scale * tau_f[s, None] * np.minimum(tails, 1e6) / G).max(axis=-1)
        lo = np.minimum(tau_last[s], alone0[s]) * scale.min(axis=-1)
        grid = lo[:, None] + (hi - lo)[:, None] * np.linspace(0, 1, STREAM_T) ** 2    # (E, T): dense near the fastest
        empty = p_empty                                   # the step in progress carries no prompt
        share = (1 - empty) * tau_f[s] / ((1 - empty) * tau_f[s] + empty * tau_0[s])   # of the time
        busy_cdf = 0.0
        for w, tau_cur, given in ((share, tau_f[s], 1 - empty), (1 - share, tau_0[s], None)):
            busy_cdf = busy_cdf + w[:, None] * _stream_busy_cdf(grid, tau_cur, tau_f[s], tau_last[s], lam[s], pi,
                                                                L, eta, ei / unit, empty, given, scale)
        cdf = (1 - busy[s, None]) * (grid >= alone0[s, None]) + busy[s, None] * busy_cdf
        for i, q in enumerate(levels):
            xs[i, s] = _invert(grid, cdf, q)
    longer = np.stack([np.maximum(own(np.full_like(n, float(I.quantile(q)))) - alone0, 0) for q in levels])
    resid = np.stack([np.where(q <= 1 - busy, 0.0, t * (q - (1 - busy)) / np.maximum(busy, 1e-12)) for q in levels])
    out = (xs + longer).reshape((len(levels),) + shape)
    alone = (alone0[None] + longer + resid).reshape((len(levels),) + shape)
    return out, np.minimum(alone, out)


STREAM_TABLE_STEPS = 16   # laws per decade of 1 − ρ in the table (neighbours' 1 − ρ differ by 10^(1/16) = 1.155)
STREAM_TABLE_DECADES = 3  # down to 1 − ρ = 0.001


@lru_cache(maxsize=32)
def stream_backlog_table(prompt: Lengths, chunk: float):
    """The backlog's law (`stream_backlog_law`) for one prompt law and chunk, tabulated over the budget's
    utilisation ρ = m·E[I]/chunk (it depends on nothing else: m = ρ·chunk/E[I], and the tail's decay η is the
    Cramér-Lundberg root at ρ): 1 − ρ = 10^(−i/16), i = 0..48, solved once. Returns (ρ grid, laws (49, L + 1), L,
    η per unit at each ρ)."""
    i = np.arange(STREAM_TABLE_STEPS * STREAM_TABLE_DECADES + 1)
    rho = 1 - 10.0 ** (-i / STREAM_TABLE_STEPS)
    unit = chunk / STREAM_UNITS
    eta = prefill_wait_tail(rho, service_shape(prompt))[0] * unit / prompt.mean_tokens
    pa = stream_arrivals_pmf(rho * chunk / prompt.mean_tokens, prompt, unit, (STREAM_BODY + 2) * STREAM_UNITS)
    pi, L = stream_backlog_law(pa, eta)
    return _shared(rho, pi, L, eta)


def stream_backlog_at(prompt: Lengths, chunk: float, rho):
    """The backlog's law at each ρ (elements, 1-D): linear between the table's neighbours in log(1 − ρ)
    (`stream_backlog_table`; ρ past the last entry takes the last). Returns (laws (E, L + 1), L, η per unit)."""
    grid, pi, L, eta = stream_backlog_table(prompt, chunk)
    x = -np.log10(np.maximum(1 - np.clip(np.asarray(rho, dtype=float), 0.0, grid[-1]), 1e-300)) * STREAM_TABLE_STEPS
    i = np.clip(np.floor(x).astype(int), 0, len(grid) - 2)
    f = np.clip(x - i, 0.0, 1.0)[:, None]
    law = pi[i] * (1 - f) + pi[i + 1] * f
    return law, L, eta[i] * (1 - f[:, 0]) + eta[i + 1] * f[:, 0]


def _j_terms(m) -> int:
    """Prompts counted ahead in a step: past the largest mean m by 4 standard deviations and 3 (the Poisson mass
    left out is below 1e-5 for m ≤ 2, the most a budget of less than two prompts a step holds), at most K_TERMS."""
    top = float(np.max(m, initial=0.0))
    return int(min(K_TERMS, max(4, math.ceil(top + 4 * math.sqrt(top) + 3))))


def _stream_busy_cdf(grid, tau_cur, tau_f, tau_last, lam, pi, L, eta, prompt_units, empty, given, scale):
    """P(X ≤ x) on `grid` (elements × points) for an arrival during a step of length tau_cur (ms):
        E_u Σ_J P(J; λ·u·tau_cur) · P(Q ≤ k·G − (J + 1)·E[I] | the step),  k = ⌊(x − (1 − u)·tau_cur − τ_last)/τ_f⌋ + 1
    Q over the nodes z of the step's slow wander (`stream_backlog_mix`: weights w_z, the law at ρ·f_z, f_z =
    `scale`[:, z]), where every step is f_z times longer, so the Q tokens queued take the time f_z·Q takes at τ_f:
        P(Q ≤ y) = Σ_z w_z·P(Q_z ≤ y/f_z)
    `given`: P(B > 0) when the step carries prompt tokens (then P(Q ≤ y | B > 0) = (P(Q ≤ y) − P(B = 0))/P(B > 0),
    since B = 0 leaves Q = 0), None when it carries none (then Q = 0)."""
    G = STREAM_UNITS
    u = (np.arange(STREAM_U) + 0.5) / STREAM_U
    m = lam * tau_cur / 1e3
    j = np.arange(_j_terms(m), dtype=float)
    k = np.floor((grid[:, None, :] - (1 - u)[:, None] * tau_cur[:, None, None] - tau_last[:, None, None])
                 / tau_f[:, None, None]) + 1                                                  # (E, U, T)
    k = np.clip(k, 0, None).astype(int)                  # k ≤ 0: y < 0 for every J, as k = 0
    E, _, T = k.shape
    # Σ_J P(J)·P(Q ≤ k·G − (J+1)·E[I]) is needed at each element's U × T steps k: tabled over every k up to the
    # largest (K of them) when that is fewer, else at exactly those (a long TTFT grid spans thousands of steps)
    by_step = k.max(initial=0) + 1 <= STREAM_U * T
    ks = np.arange(int(k.max(initial=0)) + 1, dtype=float)[None, :] if by_step else k.reshape(E, -1).astype(float)
    y = np.broadcast_to(ks[:, :, None] * G - (j + 1) * prompt_units, (E, ks.shape[1], len(j)))   # (E, K, J)
    if given is None:
        cdf_q = (y >= 0).astype(float)
    else:
        mix = sum(w * stream_backlog_cdf(pi[:, z], L, eta[:, z], y / scale[:, z, None, None])
                  for z, w in enumerate(STREAM_W))
        cdf_q = np.where(y < 0, 0.0, (mix - empty.reshape(-1, 1, 1)) / np.maximum(given.reshape(-1, 1, 1), 1e-300))
    pj = _poisson(j.reshape(-1, 1, 1), m[None, :, None] * u[None, None, :])                  # (J, E, U)
    if not by_step:                                      # cdf_q at (E, U·T, J): the steps each (u, t) reads
        return np.einsum("eutj,jeu->et", cdf_q.reshape(E, STREAM_U, T, -1), pj) / STREAM_U
    per_k = np.einsum("ekj,jeu->euk", cdf_q, pj)          # per k: (E, U, K)
    return np.take_along_axis(per_k, k, axis=2).sum(axis=1) / STREAM_U


def _chain_landing(step: StepFn, n, lam, load: "Load"):
    """The prompt chain as an arrival sees it: (π, τ_K) of `prompt_chain`, the own step with j others (own_j),
    the share of arrivals landing in a step of state K (w_K ∝ π_K·τ_K) and P(j others arrive meanwhile | K)."""
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
    return pi, tau_k, own, w, others


def chain_ttft_mean(tau_k, own, w, others, busy) -> np.ndarray:
    """Mean TTFT with whole prompts (no slot wait), the mean of the prompt chain's law in `_chain_ttft_quantiles`:
        E = Σ_K w_K·(τ_K / 2 + Σ_j P(j | K)·own_j) − idle·(τ_0 / 2 + Σ_j P(j | 0)·own_j − own_0)
    (the rest of the step landed in is uniform, so half of it on average; an arrival at an idle replica starts
    its own step at once). Sources that report a mean TTFT (genai-perf, `vllm bench serve`, guidellm) are read
    against this, not against the median: the law is skewed right, so the mean is the larger. Arguments: the
    landing of `_chain_landing` and the share of time the replica is busy."""
    per_k = tau_k / 2 + np.einsum("...kj,...j->...k", others, own)
    idle = np.minimum(1 - np.asarray(busy, dtype=float), w[..., 0])
    return (w * per_k).sum(axis=-1) - idle * (per_k[..., 0] - own[..., 0])


def _chain_ttft_quantiles(step: StepFn, n, lam, load: "Load", qs, busy=None) -> list:
    """TTFT quantiles with whole prompts, from the prompt chain: an arrival lands in a step of state K with
    probability ∝ π_K·τ_K (a long step is more likely to be hit), waits the rest of it (uniform), then its own
    step carries it and the Poisson(λ·τ_K) others that arrived meanwhile. While the replica is idle
    (P = e^(−slots held), taken out of the steps without a prompt) the own step starts at once. CDF on a grid
    (`_landing_grid`), inverted. Returns the quantiles, the own step
    alone, the chain (π, τ_K) and the mean (`chain_ttft_mean`; with `busy`, else nan)."""
    pi, tau_k, own, w, others = _chain_landing(step, n, lam, load)
    grid = _landing_grid(own, tau_k, w, np.einsum("...k,...kj->...j", w, others))
    cdf = _landing_cdf(grid, own, tau_k, w, others)
    if busy is not None:                      # an arrival at an idle replica starts its own step at once
        # idle time is time without a prompt: it comes out of the steps that carry none (K = 0), whose share of
        # the time w_0 the chain already holds; the prefill steps keep theirs (λ·E[I] tokens/s take that long)
        idle = np.minimum(1 - np.asarray(busy, dtype=float), w[..., 0])[..., None]
        quiet = np.einsum("...j,...jt->...t", others[..., 0, :],
                          np.clip((grid[..., None, :] - own[..., :, None]) / tau_k[..., :1, None], 0, 1))
        cdf = cdf + idle * ((grid >= own[..., :1]) - quiet)
    mean = chain_ttft_mean(tau_k, own, w, others, busy) if busy is not None else np.full(own.shape[:-1], np.nan)
    return [_invert(grid, cdf, q) for q in qs], own[..., 0], (pi, tau_k), mean


GRID_TAIL = 1e-5          # `_landing_grid` ends where the step landed in and the others with it pass this tail
GRID_BREAKS = 4           # the CDF's corners own_j + {0, τ_K} for j, K below this are on the grid


def _landing_grid(own, tau_k, w, others, points: int = 65):
    """Where `_landing_cdf` is evaluated (sorted, (..., points)): the CDF Σ w_K·others_j·clip((t − own_j)/τ_K, 0, 1)
    is piecewise linear with corners at own_j and own_j + τ_K, so linear interpolation between grid points is exact
    on the corners the grid holds. It holds those of the likeliest states (j, K < GRID_BREAKS: most of the mass,
    e.g. an arrival in a short decode step then its own prefill alone) and a uniform grid from own_0 to
    own_j* + τ_K*, j* and K* the (1 − GRID_TAIL) quantiles of the others and of the step landed in. (A uniform
    grid to the largest K the chain keeps spaced its points by several whole prefills, and the median, inside
    the first one, came out between points far apart.)"""
    def top(pmf):
        return np.minimum((np.cumsum(pmf, axis=-1) < 1 - GRID_TAIL).sum(axis=-1, keepdims=True), pmf.shape[-1] - 1)
    lo = own[..., :1]
    hi = np.maximum(np.take_along_axis(own, top(others), -1) + np.take_along_axis(tau_k, top(w), -1), lo + 1e-9)
    nb = min(GRID_BREAKS, own.shape[-1])
    corners = (own[..., :nb, None] + np.concatenate([np.zeros_like(tau_k[..., :1]), tau_k[..., :nb]], -1)[..., None, :])
    corners = np.minimum(corners.reshape(corners.shape[:-2] + (-1,)), hi)
    uniform = lo + (hi - lo) * np.linspace(0, 1, points - corners.shape[-1])
    return np.sort(np.concatenate([uniform, corners], axis=-1), axis=-1)


def _invert(grid, cdf, q):
    """t with CDF(t) = q on each row (linear interpolation; cdf rows non-decreasing)."""
    idx = np.clip((cdf < q).sum(axis=-1), 1, grid.shape[-1] - 1)
    g0, g1 = np.take_along_axis(grid, idx[..., None] - 1, -1)[..., 0], np.take_along_axis(grid, idx[..., None], -1)[..., 0]
    c0, c1 = np.take_along_axis(cdf, idx[..., None] - 1, -1)[..., 0], np.take_along_axis(cdf, idx[..., None], -1)[..., 0]
    return g0 + (g1 - g0) * np.clip((q - c0) / np.maximum(c1 - c0, 1e-12), 0, 1)


def _landing_cdf(grid, own, tau_k, w, others, rows: int = 16):
    """Σ_K Σ_j w_K·others_Kj·P(r + own_j ≤ t | K), r ~ U(0, τ_K), at each t of `grid` (..., T): the chain's TTFT CDF
    of `_chain_ttft_quantiles` while the replica is busy. Done `rows` of the first axis at a time, element by
    element the same sums: the (..., K, j, T) fractions of hundreds of candidates at once would not fit the cache."""
    if grid.ndim > 1 and len(grid) > rows:
        return np.concatenate([_landing_cdf(*(x[i:i + rows] for x in (grid, own, tau_k, w, others)))
                               for i in range(0, len(grid), rows)])
    frac = (grid[..., None, None, :] - own[..., None, :, None]) / tau_k[..., :, None, None]
    np.clip(frac, 0, 1, out=frac)
    return np.einsum("...k,...kj,...kjt->...t", w, others, frac)


LEVELS = (0.5, 0.7, 0.9, 0.97, 0.99, 0.997, 0.999)   # quantiles of the TTFT without the slot wait
MEAN_POINTS = 16          # midpoint quantiles of the prompt length averaged for the mean TTFT's own prefill


def ttft_quantile(X, p_wait, mean_wait_ms, q):
    """The q-quantile of TTFT = X + W: X (the TTFT without the slot wait) given at the quantiles LEVELS (rows of
    X), W = 0 with probability 1 − P(wait), else exponential with mean `mean_wait_ms`. Solves
        1 − q = (1 − P(wait))·(1 − F_X(t)) + P(wait)·e^(−(t − x₅₀)⁺ / mean)
    (those who wait are counted at the median X; the wait is the longer part whenever it matters), linearly
    between the levels; past the last level, 1 − F_X stays at 1 − 0.999. With P(wait) ≪ 1 − q it is X's
    q-quantile; with a long wait it is x₅₀ plus the wait's own quantile; between, a request that waits seconds
    no longer counts among the fast ones, so the median moves to X's q/(1 − P(wait)) quantile."""
    levels = np.asarray(LEVELS).reshape((-1,) + (1,) * (X.ndim - 1))
    x50 = X[0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        decay = np.where(np.isfinite(mean_wait_ms), np.exp(-np.maximum(X - x50, 0) / mean_wait_ms), 1.0)
        g = (1 - p_wait) * (1 - levels) + p_wait * decay                       # P(TTFT > X_u), decreasing in u
        r = 1 - q
        i = np.clip((g > r).sum(axis=0), 1, len(LEVELS) - 1)                   # first level with g ≤ r
        g0, g1 = np.take_along_axis(g, i[None] - 1, 0)[0], np.take_along_axis(g, i[None], 0)[0]
        x0, x1 = np.take_along_axis(X, i[None] - 1, 0)[0], np.take_along_axis(X, i[None], 0)[0]
        inside = x0 + (x1 - x0) * np.clip((g0 - r) / np.maximum(g0 - g1, 1e-300), 0, 1)
        rest = r - (1 - p_wait) * (1 - LEVELS[-1])
        beyond = x50 + mean_wait_ms * np.log(np.maximum(p_wait / np.maximum(rest, 1e-300), 1.0))
        t = np.where(g[-1] > r, np.maximum(beyond, X[-1]), inside)
    return np.where(g[0] <= r, X[0], t)


def operating_point(step: StepFn, rate, load: Load, chain: bool = True, near_step_ms=None) -> dict:
    """The steady state at `rate` requests/s (arrays broadcast): step time, rows, slots, TTFT/TPOT/ITL p50 and
    p99, and `stable` (False where the rate is above capacity: then the latencies are inf). `chain=False` skips
    the prompt chain (prompts per step drawn independently) and, with chunks, the token stream (the budget as a
    fluid M/G/1 queue): cheaper, for screening many candidates."""
    lam = np.asarray(rate, dtype=float)
    iterations = SCREEN_BISECT if not chain else BISECT if near_step_ms is None else NEAR_BISECT
    tau = _fixed_point(step, lam, load, chain, near_step_ms, iterations)
    stable = np.isfinite(tau)
    t = np.where(stable, tau, 1.0)
    n = lam * load.decode_tokens * t / 1e3
    p = lam * load.prompt.mean_tokens * t / 1e3
    I, chunk = load.prompt, load.chunk
    whole = whole_prompts(load)
    rho_p = p / chunk if math.isfinite(chunk) else np.zeros_like(p)
    # the prefill budget as a server: busy, a step carries a full chunk and lasts step(n, chunk), so a prompt
    # needs S = (I / chunk)·step(n, chunk) of it; its time utilisation λ·E[S] is the share of time in such steps
    # (more than the share of steps, p / chunk: the full steps are the long ones)
    svc = I.mean_tokens / chunk * step(n, np.full_like(n, chunk)) / 1e3 if not whole else np.zeros_like(t)
    rho_b = np.minimum(lam * svc, np.where(rho_p < 1, 1 - 1e-9, 1.0)) if not whole else np.zeros_like(t)
    out = {}
    pre_mean_wait = prefill_wait_mean_s(rho_b, svc, I.scv) * 1e3 if not whole else 0.0
    shape = service_shape(I) if not whole else None
    tail = prefill_wait_tail(rho_b, shape) if not whole else None
    held = slots_held(lam, t, load, pre_mean_wait)
    busy = 1 - np.exp(-held)
    # X = TTFT without the wait for a slot (prefill budget wait + own prefill), at each of LEVELS
    xs, tpot = [], t
    x_mean = np.full_like(t, np.nan)                  # the mean TTFT: the prompt chain's (whole prompts) only
    if whole and chain:
        cq, alone, (pi, tau_k), chain_mean = _chain_ttft_quantiles(step, n, lam, load, LEVELS, busy)
        tpot = t + chain_tpot_excess(pi, tau_k, lam, load.output)
        if load.output.kind == "geometric":               # the pair's deaths are memoryless (below)
            tpot = tpot + decode_count_tpot_excess(step, n, lam, load, pi, tau_k)
        for u, c in zip(LEVELS, cq):
            longer = step(n, p + I.quantile(u)) - step(n, p + I.mean_tokens)     # a longer own prompt
            xs.append((np.zeros_like(t), c + np.maximum(longer, 0)))
        mids = (np.arange(MEAN_POINTS) + 0.5) / MEAN_POINTS                  # the own prompt's length, averaged
        longer_mean = sum(np.maximum(step(n, p + I.quantile(u)) - step(n, p + I.mean_tokens), 0)
                          for u in mids) / MEAN_POINTS if I.kind != "fixed" else 0.0
        x_mean = chain_mean + longer_mean
    elif whole:
        for u in LEVELS:
            resid = np.where(u <= 1 - busy, 0.0, t * (u - (1 - busy)) / np.maximum(busy, 1e-12))
            xs.append((np.zeros_like(t), step(n, p + I.quantile(u)) + resid))
    elif chain:                                             # the token stream cut into chunks
        stream, alone = _stream_ttft_levels(step, n, lam, t, p, load, busy, LEVELS)
        xs = [(stream[i] - alone[i], alone[i]) for i in range(len(LEVELS))]
    else:                                                   # screening: the budget as a fluid M/G/1 queue
        for u in LEVELS:
            Iq = I.quantile(u)
            k = max(1, math.ceil(Iq / chunk))
            last = Iq - (k - 1) * chunk
            own = (k - 1) * step(n, np.full_like(n, chunk)) + step(n, np.minimum(chunk, last + p))
            resid = np.where(u <= 1 - busy, 0.0, t * (u - (1 - busy)) / np.maximum(busy, 1e-12))
            xs.append((prefill_wait_quantile_s(rho_b, svc, shape, u, tail) * 1e3, own + resid))
    for q, tag in ((0.5, "p50"), (0.99, "p99")):
        out[f"prefill_wait_{tag}_ms"], out[f"own_prefill_{tag}_ms"] = xs[LEVELS.index(q)]
    X = np.stack([w + o for w, o in xs])                                    # (levels, ...)
    steps_per_req = load.decode_tokens + load.prefill_steps + pre_mean_wait / t
    rows_per_held = n / np.maximum(held, 1e-12)                # with j requests held, j·n/N of them decode

    # with j requests held, the mean step over the prompts it carries: the step bends, so the mean step τ is more
    # than step(n, p) (Jensen), most where whole prompts make some steps compute-bound and the rest memory-bound.
    # That excess comes from the prompt tokens, so each state j keeps it (bend = τ − step(n, p)). The prompt tokens
    # a step carries are those that arrived during it (λ·E[I]·τ_j), so a state with more rows, whose steps are
    # longer, also carries more prompt tokens: τ_j = step(j·n/N, λ·E[I]·τ_j) + bend (`_state_step`; at j = N it is
    # τ). Held at the mean p instead, the chain lost that feedback: near capacity, where the prompts' compute is a
    # large share of the step, the requests held wandered far less than the simulator's (Llama-2-70B FP8 on an
    # H200 at MLPerf's lengths, 512 slots, 98% of capacity: TTFT p99 373 ms against the simulator's 1,841-2,318
    # ms; now 2,771 ms). (At j = B it is within 0.3% of the mean step there.)
    bend = t - step(n, p)
    step_at = _last_answer_kept(lambda j: _state_step(step, j * rows_per_held, lam * I.mean_tokens / 1e3, bend,
                                                      np.broadcast_to(t, np.shape(j)), chunk))   # j requests held
    # a slot is held for the prefill steps and the O − 1 decode steps: its variability is the output's
    scv = load.output.scv * (load.output.mean_tokens / np.maximum(steps_per_req, 1e-12)) ** 2
    dispersion = context_dispersion(step, load, lam, lambda j: j * rows_per_held, p, step_at)
    beta = getattr(step, "ms_per_context_token", None)
    if beta is not None and load.output.kind == "geometric" and np.any(np.isfinite(np.asarray(load.slots, float))):
        # a full batch's rows are older than the stationary mix (`full_batch_age_excess`): its step reads more
        B = np.asarray(load.slots, dtype=float) * np.ones_like(t)
        Bf = np.where(np.isfinite(B), B, 1.0)
        rho_full = np.clip(lam * steps_per_req * step_at(Bf) / (1e3 * Bf), 0.0, 1.0)
        older = full_batch_age_excess(load.decode_tokens, rho_full, Bf)
        extra = np.where(np.isfinite(B), beta(Bf * rows_per_held, p) * Bf * rows_per_held * older, 0.0)
        base_at = step_at
        step_at = _last_answer_kept(lambda j: base_at(j) + np.where(np.asarray(j) >= Bf, extra, 0.0))
    law = slot_wait_law(lam, steps_per_req, step_at, load.slots, held, scv, dispersion)
    uncapped = ~np.isfinite(np.asarray(load.slots, dtype=float) * np.ones_like(t))
    p_wait = np.where(uncapped, 0.0, law[0])
    mean_ms = np.where(uncapped | ~np.isfinite(law[1]), np.inf, law[1] * 1e3)
    for q, tag in ((0.5, "p50"), (0.99, "p99")):
        out[f"slot_wait_{tag}_ms"] = slot_wait_quantile_s(lam, steps_per_req, step_at, load.slots, q, held,
                                                          law=law) * 1e3
        out[f"ttft_{tag}_ms"] = np.where(stable, ttft_quantile(X, p_wait, mean_ms, q), np.inf)
    with np.errstate(invalid="ignore"):
        ttft_mean = x_mean + np.where(p_wait > 0, p_wait * mean_ms, 0.0)
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
                tpot_ms=np.where(stable, tpot, inf), itl_p50_ms=np.where(stable, step(n, 0 * n), inf),
                itl_p99_ms=np.where(stable, itl_p99, inf),
                ttft_p50_ms=np.where(stable, out["ttft_p50_ms"], inf),
                ttft_p99_ms=np.where(stable, out["ttft_p99_ms"], inf),
                ttft_mean_ms=np.where(stable, ttft_mean, inf),
                slot_wait_p99_ms=out["slot_wait_p99_ms"], prefill_wait_p99_ms=out["prefill_wait_p99_ms"],
                slot_wait_probability=law[0],
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

    def parts(n, p):                                      # (memory ms, compute ms)
        n, p = np.asarray(n, dtype=float), np.asarray(p, dtype=float)
        return model.step_parts_ms(n + p, n * ctx_dec + p * read_tok, n * ctx_dec + p * pairs_tok)

    def step(n, p):
        mem, comp = parts(n, p)
        return np.maximum(mem, comp) + model.overhead_ms

    def ms_per_context_token(n, p):
        """∂step/∂(cached positions the decode rows read): the KV read where memory binds, else attention."""
        mem, comp = parts(n, p)
        return np.where(mem >= comp, model.kv_bytes_per_token / model.bandwidth_bytes_per_s,
                        model.attn_flops_per_pair / model.peak_flop_s) * 1e3
    step.ms_per_context_token = ms_per_context_token
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
