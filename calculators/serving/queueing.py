"""Serving under load: queueing delay, goodput, and the decode stall a long prefill causes (003 Detail 21).

- Queue wait grows like ρ/(1 − ρ) for utilisation ρ (the M/M/1 mean wait in units of the service time):
  1 at 50%, 9 at 90%, 19 at 95%.
- Goodput = throughput × fraction of requests meeting the latency SLO.
- A monolithic prefill stalls every decoding stream for its whole duration; chunked prefill interleaves
  chunks with decode steps so each stall is one chunk long.
"""
from __future__ import annotations

import math

import numpy as np

from calculators.units import check_fraction, check_int, check_nonneg, check_positive


def queue_wait_factor(utilization: float) -> float:
    """ρ / (1 − ρ): mean queueing delay in units of the mean service time (M/M/1), for 0 < ρ < 1."""
    rho = check_fraction("utilization", utilization, allow_one=False)
    return rho / (1 - rho)


def mean_queue_wait_ms(service_ms: float, utilization: float) -> float:
    """Mean wait before service: service time × ρ/(1 − ρ)."""
    return check_nonneg("service_ms", service_ms) * queue_wait_factor(utilization)


def goodput_tok_s(throughput_tok_s: float, fraction_meeting_slo: float) -> float:
    """Throughput that counts: tokens/s × fraction of requests within the SLO."""
    f = check_nonneg("fraction_meeting_slo", fraction_meeting_slo, limit=1.0)
    return check_nonneg("throughput_tok_s", throughput_tok_s) * f


def goodput_p99_slo(throughput_tok_s: float, p99_ttft_ms: float, slo_ttft_ms: float) -> float:
    """Goodput when the SLO is "p99 TTFT ≤ target": the whole throughput if the p99 meets it, else 0.
    003: A 50,000 tok/s at p99 4 s vs B 20,000 tok/s at p99 200 ms, SLO 500 ms -> A 0, B 20,000."""
    meets = check_nonneg("p99_ttft_ms", p99_ttft_ms) <= check_positive("slo_ttft_ms", slo_ttft_ms)
    return check_nonneg("throughput_tok_s", throughput_tok_s) if meets else 0.0


def prefill_stall(prefill_ms: float, decode_step_ms: float, streams: int = 32) -> dict:
    """A monolithic prefill inserted into a decode batch: every stream's ITL for that step becomes the prefill
    time; spike = prefill / normal step. 003: 50 ms vs 1.55 ms -> ≈ 32× ("≈ 30×") for 32 streams."""
    p, d = check_nonneg("prefill_ms", prefill_ms), check_positive("decode_step_ms", decode_step_ms)
    n = check_int("streams", streams, minimum=0)
    return dict(stalled_itl_ms=p, spike_ratio=p / d, streams_stalled=n, lost_tokens=n * p / d)


def chunked_prefill(prefill_ms: float, prompt_tokens: int, chunk_tokens: int, decode_step_ms: float) -> dict:
    """Split the prefill into ⌈prompt/chunk⌉ chunks, each riding along with one decode step. Worst ITL becomes
    decode step + one chunk's share of the prefill; TTFT stretches over that many steps."""
    p = check_nonneg("prefill_ms", prefill_ms)
    n_tok, c = check_int("prompt_tokens", prompt_tokens), check_int("chunk_tokens", chunk_tokens)
    d = check_positive("decode_step_ms", decode_step_ms)
    chunks = math.ceil(n_tok / c)
    chunk_ms = p * min(c, n_tok) / n_tok
    return dict(chunks=chunks, chunk_ms=chunk_ms, worst_itl_ms=d + chunk_ms, spike_ratio=(d + chunk_ms) / d,
                ttft_ms=chunks * d + p)


# ------------------------------------------------------------------------------------------ closed-form queues
def mm1_mean_wait_s(arrival_rate_per_s: float, service_s: float) -> float:
    """M/M/1 (Poisson arrivals, exponential service, one server): Wq = ρ/(1 − ρ) · S with ρ = λ·S."""
    lam, s = check_positive("arrival rate", arrival_rate_per_s), check_positive("service time", service_s)
    return queue_wait_factor(lam * s) * s


def md1_wait_factor(utilization: float) -> float:
    """ρ / (2(1 − ρ)): the M/D/1 mean wait in units of the (fixed) service time, half of M/M/1's."""
    return queue_wait_factor(utilization) / 2


def md1_mean_wait_s(arrival_rate_per_s: float, service_s: float) -> float:
    """M/D/1 (Poisson arrivals, every service exactly S): Wq = ρ/(2(1 − ρ)) · S, half the M/M/1 wait
    (Pollaczek-Khinchine with E[S²] = S²)."""
    lam, s = check_positive("arrival rate", arrival_rate_per_s), check_positive("service time", service_s)
    return md1_wait_factor(lam * s) * s


def mg1_mean_wait_s(arrival_rate_per_s: float, mean_service_s: float, second_moment_s2: float) -> float:
    """M/G/1, Pollaczek-Khinchine: Wq = λ·E[S²] / (2(1 − ρ)), ρ = λ·E[S] (any service-time distribution)."""
    lam = check_positive("arrival rate", arrival_rate_per_s)
    s = check_positive("mean service time", mean_service_s)
    rho = check_fraction("utilization", lam * s, allow_one=False)
    return lam * check_positive("second moment of service time", second_moment_s2) / (2 * (1 - rho))


# ------------------------------------------------------------------------------------------ continuous batching
def batching_concurrency(rate_per_s, prefill_s, output_tokens: float, itl_one_s, itl_slope_s):
    """Requests in flight on one continuous-batching replica (Little's law, L = λ·R), solved in closed form.

    A request spends `prefill_s` in its prefill step, then gets one token per step. A decode step with n sequences
    takes I(n) = itl_one + slope·(n − 1) (the step line between batch 1 and the cap); a newcomer's prefill step
    (λ of them per second, taking the share ρ_p = λ·prefill of the time) also gives every running sequence a
    token, so a second holds λ + (1 − ρ_p)/I steps and a token takes t = I/(1 − ρ_p + λ·I) on average. With
    R = prefill + output·t and L = λ·R, L solves a quadratic with one positive root. inf where ρ_p ≥ 1 (the
    prefills alone exceed the replica's time). NumPy arrays broadcast."""
    lam = np.asarray(rate_per_s, dtype=float)
    c = 1 - lam * prefill_s
    b = lam * itl_slope_s
    a = lam * (itl_one_s - itl_slope_s)                    # λ·I(n) = a + b·n
    lam_pre, lam_out = lam * prefill_s, lam * output_tokens
    # (n − λ·pre)(c + a + b·n) = λ·out·(a + b·n)/λ·λ  ->  b·n² + (c + a − b·λ·pre − out·b)·n − λ·pre·(c + a) − out·a = 0
    qa = b
    qb = c + a - b * lam_pre - output_tokens * b
    qc = -lam_pre * (c + a) - output_tokens * a
    with np.errstate(divide="ignore", invalid="ignore"):
        disc = np.sqrt(np.maximum(qb * qb - 4 * qa * qc, 0.0))
        root = np.where(qa > 0, 2 * -qc / (qb + disc), -qc / qb)     # the positive root, stable form
    del lam_out
    return np.where(c > 0, np.maximum(root, 0.0), np.inf)


def token_time_s(rate_per_s, prefill_s, itl_s):
    """Mean time between a running sequence's tokens, t = I/(1 − ρ_p + λ·I) (see `batching_concurrency`)."""
    lam = np.asarray(rate_per_s, dtype=float)
    return itl_s / (1 - lam * prefill_s + lam * itl_s)


def prefill_wait_p99_s(rate_per_s, prefill_s, scv: float = 0.0):
    """p99 wait for the prefill steps ahead (M/G/1 on prefills, ρ_p = λ·prefill): the Pollaczek-Khinchine mean
    W = ρ_p·prefill·(1 + c²)/(2(1 − ρ_p)) and an exponential tail P(wait > t) ≈ ρ_p·exp(−ρ_p·t/W), so
    t99 = W/ρ_p · ln(100·ρ_p) (0 when ρ_p ≤ 1%). c² = `scv`, the squared coefficient of variation of the prefill
    time: 0 for prompts of one length (M/D/1), 1 for exponential ones (then this is M/M/1's tail exactly)."""
    rho = np.asarray(rate_per_s, dtype=float) * prefill_s
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = prefill_s * (1 + scv) / (2 * (1 - rho))
        t = np.maximum(0.0, np.log(np.maximum(100 * rho, 1e-300))) * scale
    return np.where(rho < 1, t, np.inf)


def slot_wait_p99_s(rate_per_s, residence_s, slots):
    """p99 wait for a free slot when `slots` sequences at most run at once (M/M/c, c = slots, service time =
    a request's residence R): P(wait) from Sakasegawa's approximation u^(√(2(c+1)) − 1), u = λR/c (exact for
    c = 1), and the conditional wait exponential with mean R/(c(1 − u)): t99 = ln(100·P(wait))·R/(c(1 − u))."""
    c = np.asarray(slots, dtype=float)
    u = np.asarray(rate_per_s, dtype=float) * residence_s / c
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        p_wait = np.power(np.clip(u, 0.0, 1.0), np.sqrt(2 * (c + 1)) - 1)
        t = np.maximum(0.0, np.log(np.maximum(100 * p_wait, 1e-300))) * residence_s / (c * (1 - u))
    return np.where(u < 1, t, np.inf)
