"""Queueing and SLOs measured on the serving simulator (003 Detail 21): waits against the closed-form queues,
p99 TTFT against load, goodput under TTFT and ITL targets, and the batch cap as the operator's knob.

Load is offered as a fraction of the server's CAPACITY: the request rate the simulator sustains when requests
never stop coming (a burst of requests all waiting at t = 0, served with the same batch cap and lengths).
With a batch cap of 1 and fixed lengths every service takes the same time, so the server is an M/D/1 queue and
its mean wait is ρ/(2(1 − ρ))·S exactly; with geometric output lengths service times vary and the general
Pollaczek-Khinchine (M/G/1) formula applies. The ρ/(1 − ρ) curve (M/M/1) is drawn next to both.
"""
from __future__ import annotations

import numpy as np

from calculators.serving.batching import StepModel
from calculators.serving.queueing import goodput_tok_s, md1_mean_wait_s, mg1_mean_wait_s, queue_wait_factor
from calculators.serving.serving_sim import SimResult, simulate
from calculators.units import check_fraction, check_int, check_nonneg, check_positive
from calculators.serving.workload import Workload, synthetic_workload
from specs.model_config import SpecError


def slo_met(result: SimResult, ttft_slo_ms: float, tpot_slo_ms: float | None = None) -> np.ndarray:
    """Per request: TTFT ≤ target and (if given) mean inter-token latency ≤ target."""
    ok = result.ttft * 1e3 <= check_positive("TTFT target (ms)", ttft_slo_ms)
    if tpot_slo_ms is not None:
        tpot = result.tpot * 1e3
        ok &= ~(tpot > check_positive("ITL target (ms)", tpot_slo_ms))          # NaN (one token) passes
    return ok


def goodput(result: SimResult, ttft_slo_ms: float, tpot_slo_ms: float | None = None) -> dict:
    """Goodput = throughput × fraction of requests meeting the SLO (003 Detail 21), in tokens/s and requests/s."""
    s = result.summary()
    frac = float(slo_met(result, ttft_slo_ms, tpot_slo_ms).mean())
    return dict(fraction_meeting_slo=frac, throughput_tok_s=s["throughput_tok_s"],
                goodput_tok_s=goodput_tok_s(s["throughput_tok_s"], frac),
                goodput_req_s=s["throughput_req_s"] * frac)


TTFT_TARGET_TIMES, ITL_TARGET_TIMES = 3.0, 2.0     # a target: this many times the unloaded figure (an assumption)
KNOB_LOAD = 0.9                                     # the batch-cap lesson's rate: this share of the capacity


def _two_digits(x: float) -> float:
    """x rounded to two significant digits (a target a person would type: 450, 21, 0.74)."""
    return float(f"{x:.2g}")


def suggested_targets(model: StepModel, prompt_tokens: float, output_tokens: float) -> dict:
    """TTFT and ITL targets for this server: TTFT_TARGET_TIMES × the unloaded TTFT (the prompt's prefill, whose
    step emits the first token), ITL_TARGET_TIMES × one decode step of a lone request at its mean context
    (I + O/2), each to two significant digits. Targets stated as a multiple of the unloaded latency keep the lesson's shape on any
    hardware: met when the server is idle, missed once the queue and the batch grow; a fixed "15 ms" is never
    met on a laptop and always met on an H100."""
    I = max(1, int(round(check_positive("prompt tokens", prompt_tokens))))
    ctx = I + check_positive("output tokens", output_tokens) / 2
    unloaded_ttft = model.prefill_ms(I)
    itl = model.decode_step_ms(1, ctx)
    return dict(ttft_ms=_two_digits(TTFT_TARGET_TIMES * unloaded_ttft), itl_ms=_two_digits(ITL_TARGET_TIMES * itl),
                unloaded_ttft_ms=unloaded_ttft, unloaded_itl_ms=itl)


def suggested_rate(capacity: float, load: float = KNOB_LOAD) -> float:
    """An arrival rate for the batch-cap lesson: `load` × the capacity at the lesson's default cap, to two
    significant digits; near capacity a small cap queues requests and a large one slows every stream, whatever
    the hardware (a fixed 50 requests/s is 10 times what a laptop serves)."""
    return _two_digits(check_fraction("load", load) * check_positive("capacity", capacity))


def suggested_rate_for(model: StepModel, prompt_mean: float, output_mean: float, slots: int, *,
                       output_kind: str = "exponential", load: float = 0.8) -> float:
    """`suggested_rate` without a simulation: `load` × the steady state's capacity (`steady_state.capacity`, the
    closed form) of `slots` continuous-batching slots serving fixed prompts and `output_kind` outputs of these
    means. A lesson's default rate then sits below what this server serves, on a laptop as on an H100."""
    from calculators.serving.lengths import Lengths, from_kind
    from calculators.serving.steady_state import Load, capacity, step_fn_for_model
    ld = Load(Lengths.fixed(check_positive("prompt tokens", prompt_mean)),
              from_kind(output_kind, check_positive("output tokens", output_mean), 1 << 20),
              slots=float(check_int("slots", slots, limit=1 << 20)))
    return suggested_rate(float(capacity(step_fn_for_model(model, ld), ld)), load)


def capacity_rps(model: StepModel, prompt_mean: float, output_mean: float, max_batch: int, *,
                 prompt_kind: str = "fixed", output_kind: str = "fixed", n: int | None = None, seed: int = 0,
                 chunk_tokens: int | None = None) -> float:
    """Requests/s the server sustains with an endless queue: n requests all waiting at t = 0, served
    continuously with `max_batch` slots; n / makespan."""
    b = check_int("max batch", max_batch, limit=100_000)
    n = n or max(2000, 50 * b)
    w = synthetic_workload(n, 1e9, prompt_mean, output_mean, prompt_kind=prompt_kind, output_kind=output_kind,
                           seed=seed)
    w = Workload(np.zeros(n), w.prompt_tokens, w.output_tokens, source="saturated")
    r = simulate(model, w, "continuous", b, chunk_tokens=chunk_tokens)
    return n / r.makespan_s


def load_sweep(model: StepModel, loads, *, n: int, prompt_mean: float, output_mean: float, max_batch: int,
               prompt_kind: str = "fixed", output_kind: str = "exponential", ttft_slo_ms: float = 1000.0,
               tpot_slo_ms: float | None = None, seed: int = 0, policy: str = "continuous",
               chunk_tokens: int | None = None) -> list[dict]:
    """For each offered load ρ (fraction of `capacity_rps`): simulate n Poisson arrivals at ρ × capacity and
    report the mean batch while busy, mean and p99 wait and TTFT, throughput and goodput. For a batch
    cap of 1 the row also carries the closed-form mean waits (M/M/1, M/D/1 and M/G/1 from the measured service
    moments and the measured arrival rate)."""
    cap = capacity_rps(model, prompt_mean, output_mean, max_batch, prompt_kind=prompt_kind,
                       output_kind=output_kind, seed=seed, chunk_tokens=chunk_tokens)
    rows = []
    for rho in loads:
        rho = check_fraction("load (fraction of capacity)", rho, allow_one=False)
        w = synthetic_workload(n, rho * cap, prompt_mean, output_mean, prompt_kind=prompt_kind,
                               output_kind=output_kind, seed=seed)
        r = simulate(model, w, policy, max_batch, chunk_tokens=chunk_tokens)
        s = r.summary()
        g = goodput(r, ttft_slo_ms, tpot_slo_ms)
        row = dict(load=rho, arrival_rate_rps=rho * cap, capacity_rps=cap, mean_batch_busy=s["mean_batch"],
                   wait_mean_ms=s["wait_mean_ms"],
                   wait_p99_ms=s["wait_p99_ms"], ttft_p50_ms=s["ttft_p50_ms"], ttft_p99_ms=s["ttft_p99_ms"],
                   tpot_p99_ms=s["tpot_p99_ms"], **g,
                   mm1_wait_factor=queue_wait_factor(rho))
        if max_batch == 1:
            service = r.latency - r.wait                            # one at a time: time in service
            es, es2 = float(service.mean()), float((service ** 2).mean())
            lam = n / float(r.arrival.max() - r.arrival.min()) if n > 1 else rho * cap
            row.update(service_mean_ms=1e3 * es, measured_rho=lam * es,
                       wait_over_service=s["wait_mean_ms"] / (1e3 * es),
                       md1_wait_ms=1e3 * md1_mean_wait_s(lam, es) if lam * es < 1 else None,
                       mg1_wait_ms=1e3 * mg1_mean_wait_s(lam, es, es2) if lam * es < 1 else None)
            for q in ("md1", "mg1"):
                v = row[f"{q}_wait_ms"]
                row[f"{q}_wait_over_service"] = None if v is None else v / row["service_mean_ms"]
        rows.append(row)
    return rows


def batch_cap_sweep(model: StepModel, workload: Workload, caps, *, ttft_slo_ms: float,
                    tpot_slo_ms: float | None = None, chunk_tokens: int | None = None) -> list[dict]:
    """The same arrivals served with each batch cap: throughput, p99 TTFT, p99 ITL, goodput. A larger cap
    raises throughput and slows every stream; the best cap for goodput is where the SLO starts to break."""
    check_nonneg("TTFT target (ms)", ttft_slo_ms)
    rows = []
    for b in caps:
        r = simulate(model, workload, "continuous", check_int("batch cap", b, limit=100_000),
                     chunk_tokens=chunk_tokens)
        s = r.summary()
        rows.append(dict(max_batch=int(b), ttft_p99_ms=s["ttft_p99_ms"],
                         itl_p99_ms=s["itl_p99_ms"], tpot_p99_ms=s["tpot_p99_ms"], mean_batch=s["mean_batch"],
                         **goodput(r, ttft_slo_ms, tpot_slo_ms)))
    if not rows:
        raise SpecError("give at least one batch cap")
    return rows
