"""A finite online run: N requests sent at λ requests/s (a benchmark client such as Triton's or `vllm bench serve`
at a QPS), followed step by step until the last one finishes. The steady state (`steady_state`) assumes the run
lasts for ever; a run of 500 requests is short, and at a rate past capacity it has no steady state at all: the
requests in flight pile up for as long as they arrive, then drain. What such a run reports is
    throughput   N / makespan, makespan = first arrival to last completion
                 ≈ max(arrival span N/λ, the work at capacity) + the drain of the last requests,
                 so below λ even when the server keeps up (the drain), and far below it past capacity;
    ITL          the mean token gap over the run: Σ_steps n·τ / Σ_steps n (a step of τ ms gives each of its n
                 decoding sequences one token);
    TTFT         the mean over requests of (end of the step that prefills its prompt − its arrival).

The run is followed in cohorts of whole requests: request i is sent at i / λ (the mean path of a Poisson stream,
without its bunching); each step admits the requests waiting at its start up to the slot cap and the prompt-token
budget (whole prompts), prefills them in that step (first token at its end: a request sent during a step waits for
it to end), and a cohort decodes for O − 1 further steps and leaves. Each step costs step(n decode rows, p prompt
tokens), the deployment's own mixed step (`step.step_cost`), so at a rate the server sustains the run's middle
is the steady state's mean path. Steps that admit nobody repeat unchanged until a cohort leaves or a request
arrives, and are taken together (`_quiet_steps`): the run costs one step call per event, not per token.
An offline benchmark (every request queued at once, `trtllm-bench throughput`) is the same run at an unbounded
rate: its throughput is N·O / makespan, the ramp while the batch fills and the drain of the last wave included.
Fixed lengths (the means): a finite run's figures are means, and so are the published ones it is compared with.
"""
from __future__ import annotations

import math
from collections import deque

from calculators.units import check_int, check_positive
from calculators.serving.steady_state import StepFn, check_rate

MAX_STEPS = 2_000_000


def _quiet_steps(cohorts, s: int, tau: float, t: float, next_arrival_ms: float | None) -> int:
    """Steps that repeat unchanged from time t, step s next, when nobody is admitted (the slots are full, or nobody
    waits): until the first cohort leaves (its last step included), and, when nobody waits, only the steps that
    start before the next arrival (floor: never one too many). At least 1."""
    m = cohorts[0][1] - s + 1 if cohorts else 1
    if next_arrival_ms is not None and tau > 0:
        m = min(m, max(1, math.floor((next_arrival_ms - t) / tau)))
    return max(1, m)


def _leave(cohorts: deque, s: int, decoding: int) -> int:
    """Drop the cohorts whose last step came before step s; the sequences still decoding."""
    while cohorts and cohorts[0][1] < s:
        decoding -= cohorts.popleft()[0]
    return decoding


def finite_run(step: StepFn, rate: float, requests: int, prompt_tokens: float, output_tokens: int,
               slots: float = math.inf, chunk: float = math.inf) -> dict:
    """Follow `requests` requests sent at `rate`/s (math.inf: all queued at t = 0, an offline run) through a replica
    whose step costs step(n, p) ms; see the module docstring. Returns makespan_s, achieved_rps (= requests /
    makespan), itl_ms, ttft_ms (means), peak_in_flight, steps (the steps run, those taken together included)."""
    offline = rate == math.inf                    # every request queued at t = 0 (an offline benchmark)
    lam = math.inf if offline else check_positive("rate", check_rate(rate))
    N = check_int("requests", requests, limit=1 << 24)
    I = check_positive("prompt tokens", prompt_tokens)
    O = check_int("output tokens", output_tokens, limit=1 << 24)
    dec = O - 1                                   # decode steps after the step that prefills and gives token 1
    per_step = max(math.floor(chunk / I), 1) if math.isfinite(chunk) else N   # whole prompts a step may take
    cap = int(slots) if math.isfinite(slots) else N
    t = 0.0                                       # ms since the first arrival
    admitted = 0                                  # requests admitted so far
    cohorts: deque = deque()                      # (size, the step it decodes last in) of the decoding cohorts:
    decoding = 0                                  # admitted in order with one length, so they leave in order
    s = 1                                         # the next step's number
    tok_gaps = tok_count = 0.0                    # Σ n·τ and Σ n over the steps
    ttft_sum = 0.0
    peak = 0.0
    steps = 0
    while admitted < N or decoding > 0:
        arrived = N if offline else min(N, math.floor(lam * t / 1e3 + 1e-9) + 1)   # request i arrives at i / λ
        waiting = arrived - admitted
        if waiting == 0 and decoding == 0:                        # idle until the next arrival
            t = max(t, admitted / lam * 1e3)
            continue
        steps += 1
        if steps > MAX_STEPS:
            raise RuntimeError("finite run: too many steps")
        a = max(0, min(waiting, cap - decoding, per_step))
        tau = float(step(decoding, a * I))
        if a == 0:                                                # nobody admitted: the same step repeats
            m = _quiet_steps(cohorts, s, tau, t, None if waiting or arrived >= N else arrived / lam * 1e3)
            if m > 1:
                steps += m - 1
                tok_gaps += decoding * tau * m
                tok_count += decoding * m
                s += m
                decoding = _leave(cohorts, s, decoding)
                t += m * tau
                continue
        # the requests admitted are i = admitted … admitted + a − 1, sent at i / λ
        mean_arrival_ms = (admitted + (a - 1) / 2) / lam * 1e3 if a > 0 and not offline else 0.0
        ttft_sum += a * (t + tau - min(mean_arrival_ms, t))
        tok_gaps += decoding * tau
        tok_count += decoding
        # the step ends: every decoding cohort emits a token (those in their last step leave), the admitted one has
        # its first and decodes in the next O − 1 steps
        s += 1
        decoding = _leave(cohorts, s, decoding)
        if a > 0 and dec > 0:
            cohorts.append((a, s + dec - 1))
            decoding += a
        admitted += a
        peak = max(peak, decoding)
        t += tau
    makespan = t / 1e3
    return dict(makespan_s=makespan, achieved_rps=N / makespan, arrival_span_s=0.0 if offline else (N - 1) / lam,
                itl_ms=tok_gaps / tok_count if tok_count else math.nan, ttft_ms=ttft_sum / N,
                peak_in_flight=peak, steps=steps)
