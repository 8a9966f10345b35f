"""A measured load sweep next to the calculators: predict each level with the serving simulator, fit the
efficiencies (decode MBU, prefill MFU, fixed per-step overhead) to the sweep, and predict again with them.

A level of the sweep is one load: `concurrency` c (the client keeps c requests in flight, N in all) or `rate` r
(requests sent at given times). The prediction runs `serving_sim.simulate_continuous` on the step model
(`batching.step_model_for`: max(bytes / (bandwidth·MBU), FLOPs / (peak·MFU)) + overhead per step) with the
level's mean prompt and output lengths:
- concurrency c: all N requests queued at t = 0 with a batch cap of c. A closed-loop client sends request k + c
  when one ends, which is when the simulator gives it the freed slot, so the client's clock starts at admission:
  TTFT = first token − admitted, end-to-end = finish − admitted.
- rate r: the requests arrive at the times the client sent them (or Poisson times at r), batch cap = the server's
  maximum number of running requests; TTFT = first token − arrival.
ITL = the mean time per output token after the first, (finish − first token) / (output − 1); output tokens/s =
all output tokens / (last finish − first start).

The fit starts from `calibration.calibrate` with the overhead term, one row per level,
    ITL  ≈ memory_ms_ideal(batch) / MBU + overhead,      TTFT ≈ compute_ms_ideal(prompt) / MFU + overhead,
batch = c (concurrency) or the mean number in flight, requests/s × mean end-to-end (Little's law, rate). Those
rows price one prompt alone, but under load the simulator prefills several prompts in one step (c of them at
once when a concurrency level starts), so the fit is then refined on the simulator itself: Nelder-Mead over
(MBU, MFU, overhead), MBU and MFU ≤ 1, overhead ≥ 0, minimising the mean of
log(predicted / measured)² over every level's mean TTFT and ITL. "Closer" compares each level's prediction
error with the defaults (`latency.Efficiency()`, no overhead) and with the fit.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from calculators.serving.batching import step_model_for
from calculators.planning.calibration import Measurement, calibrate
from calculators.sizing.latency import Efficiency
from calculators.serving.serving_sim import simulate_continuous
from calculators.units import check_int, check_nonneg, check_positive
from calculators.serving.workload import Workload
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError

MODES = ("concurrency", "rate")
METRICS = ("ttft_ms", "itl_ms", "e2e_ms", "output_tok_s")
DEFAULT_SERVER_MAX_BATCH = 256          # vLLM's default max_num_seqs: the batch cap of a rate sweep


@dataclass(frozen=True)
class SweepLevel:
    """One measured level: the load, the mean lengths the server reported, the measured means."""
    mode: str
    level: float
    requests: int
    prompt_tokens: float
    output_tokens: float
    ttft_ms: float
    itl_ms: float
    e2e_ms: float
    output_tok_s: float
    arrival_s: tuple[float, ...] | None = None       # rate: when each request was sent (None = Poisson at rate)

    def __post_init__(self):
        if self.mode not in MODES:
            raise SpecError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        check_positive("level", self.level)
        check_int("requests", self.requests)
        for k in ("prompt_tokens", "output_tokens", "ttft_ms", "itl_ms", "e2e_ms", "output_tok_s"):
            check_positive(k, getattr(self, k))

    @property
    def in_flight(self) -> float:
        """Requests in flight on average, by Little's law: requests/s × mean end-to-end (below c at a concurrency
        c when the client leaves gaps between one request's end and the next one's send)."""
        return self.output_tok_s / self.output_tokens * self.e2e_ms / 1e3

    @property
    def mean_batch(self) -> int:
        """The batch the step model runs at: c (each request decodes beside c − 1 others while it runs), or Little's
        law rounded for a rate."""
        if self.mode == "concurrency":
            return max(1, min(int(self.level), self.requests))
        return max(1, round(self.in_flight))


def level_from_summary(row: dict) -> SweepLevel:
    """A load generator's per-level summary (server.loadgen LevelResult.summary) -> SweepLevel; SpecError when the
    level has no completed request."""
    if not row.get("completed"):
        raise SpecError(f"level {row.get('level')} completed no request")
    return SweepLevel(mode=row["mode"], level=float(row["level"]), requests=int(row["completed"]),
                      prompt_tokens=float(row["mean_prompt_tokens"]), output_tokens=float(row["mean_output_tokens"]),
                      ttft_ms=float(row["ttft_mean_ms"]), itl_ms=float(row["itl_mean_ms"] or row["tpot_mean_ms"]),
                      e2e_ms=float(row["e2e_mean_ms"]), output_tok_s=float(row["output_tok_s"]),
                      arrival_s=tuple(row["arrival_s"]) if row.get("arrival_s") else None)


def _workload(lv: SweepLevel) -> Workload:
    n = lv.requests
    p, o = np.full(n, max(1, round(lv.prompt_tokens))), np.full(n, max(1, round(lv.output_tokens)))
    if lv.mode == "concurrency":
        return Workload(np.zeros(n), p, o, source=f"{n} requests, concurrency {lv.level:g}")
    if lv.arrival_s is not None and len(lv.arrival_s) == n:
        t = np.asarray(lv.arrival_s, dtype=float)
        t = t - t.min()
    else:
        gaps = np.random.default_rng(0).exponential(1.0 / lv.level, size=n)
        t = np.cumsum(gaps) - gaps[0]
    return Workload(t, p, o, source=f"{n} requests at {lv.level:g} req/s")


def predict_level(config: ModelConfig, device: Device, lv: SweepLevel, weight_dtype: str = "bf16",
                  kv_dtype: str | None = None, efficiency: Efficiency | None = None, overhead_ms: float = 0.0,
                  server_max_batch: int = DEFAULT_SERVER_MAX_BATCH) -> dict:
    """The simulator's TTFT, ITL, end-to-end (means, ms) and output tokens/s for the level's load."""
    model = step_model_for(config, device, weight_dtype, kv_dtype, efficiency or Efficiency(),
                           check_nonneg("overhead_ms", overhead_ms))
    cap = check_int("server max batch", server_max_batch)
    closed = lv.mode == "concurrency"
    sim = simulate_continuous(model, _workload(lv), min(int(lv.level), cap) if closed else cap)
    start = sim.admitted if closed else sim.arrival
    out = sim.output_tokens
    tpot = (sim.finish - sim.first_token) / np.maximum(out - 1, 1)
    span = float(sim.finish.max() - start.min())
    return dict(ttft_ms=float(np.mean(sim.first_token - start)) * 1e3,
                itl_ms=float(np.mean(tpot[out > 1])) * 1e3 if np.any(out > 1) else 0.0,
                e2e_ms=float(np.mean(sim.finish - start)) * 1e3,
                output_tok_s=float(out.sum()) / span if span > 0 else float("inf"))


def nelder_mead(f, x0: np.ndarray, step: float = 0.5, evaluations: int = 150) -> np.ndarray:
    """Minimise f from x0 within `evaluations` calls (the textbook simplex: reflect 1, expand 2, contract 0.5,
    shrink 0.5)."""
    calls = [0]

    def g(x):
        calls[0] += 1
        return f(x)

    pts = [np.asarray(x0, float)] + [np.asarray(x0, float) + step * e for e in np.eye(len(x0))]
    vals = [g(x) for x in pts]
    n = len(pts) - 1
    while calls[0] < evaluations:
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = np.mean(pts[:-1], axis=0)
        xr = centre + (centre - pts[-1])
        fr = g(xr)
        if fr < vals[0]:
            xe = centre + 2 * (centre - pts[-1])
            fe = g(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[n - 1]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centre + 0.5 * (pts[-1] - centre)
            fc = g(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (x - pts[0]) for x in pts[1:]]
                vals = [vals[0]] + [g(x) for x in pts[1:]]
    return pts[int(np.argmin(vals))]


def _knobs(x: np.ndarray) -> tuple[float, float, float]:
    """Search coordinates -> (MBU ≤ 1, MFU ≤ 1, overhead ms ≥ 0): log-scaled, so every point is valid."""
    return float(min(1.0, np.exp(x[0]))), float(min(1.0, np.exp(x[1]))), float(np.exp(x[2]) - 1e-3)


def fit_sweep(config: ModelConfig, device: Device, levels: list[SweepLevel], weight_dtype: str = "bf16",
              kv_dtype: str | None = None, start: tuple[float, float, float] = (0.6, 0.7, 0.0),
              server_max_batch: int = DEFAULT_SERVER_MAX_BATCH, base: Efficiency | None = None,
              fit_overhead: bool = True) -> dict:
    """MBU, MFU and overhead (ms per step) that bring the simulator's mean TTFT and ITL closest to the measured
    ones, in log terms, from `start` (see the module docstring). `fit_overhead=False` holds the overhead at
    start[2] and fits MBU and MFU only."""
    base = base or Efficiency()
    held = max(start[2], 0.0)

    def loss(x: np.ndarray) -> float:
        mbu, mfu, ovh = _knobs(x if fit_overhead else np.append(x, np.log(held + 1e-3)))
        eff = Efficiency(decode_mbu=max(mbu, 1e-4), prefill_mfu=max(mfu, 1e-4), prefill_mbu=base.prefill_mbu,
                         decode_mfu=base.decode_mfu)
        err = []
        for lv in levels:
            p = predict_level(config, device, lv, weight_dtype, kv_dtype, eff, max(ovh, 0.0), server_max_batch)
            err += [np.log(p["ttft_ms"] / lv.ttft_ms), np.log(max(p["itl_ms"], 1e-9) / lv.itl_ms)]
        return float(np.mean(np.square(err)))

    x0 = np.log([max(start[0], 1e-4), max(start[1], 1e-4), held + 1e-3])
    if not fit_overhead:
        x0 = x0[:2]
    x = nelder_mead(loss, x0)
    mbu, mfu, ovh = _knobs(x if fit_overhead else np.append(x, np.log(held + 1e-3)))
    return dict(decode_mbu=max(mbu, 1e-4), prefill_mfu=max(mfu, 1e-4), overhead_ms=max(ovh, 0.0) if fit_overhead
                else held)


KNOB_NAMES = {"decode_mbu": "decode MBU", "prefill_mfu": "prefill MFU", "overhead_ms": "overhead per step"}


def knobs_to_fit(levels: list[SweepLevel]) -> tuple[tuple[str, ...], str | None]:
    """Which knobs the levels can fix, and why not all three. Each level gives two equations (its mean TTFT and
    ITL); MBU and the overhead share the ITL (ITL ≈ memory(batch)/MBU + overhead) and MFU and the overhead the
    TTFT, so telling the overhead apart takes two loads that differ: another batch or another prompt length.
    Levels at one load (one run, or the same run measured by several tools) fit MBU and MFU, the overhead held."""
    loads = {(lv.mean_batch, round(lv.prompt_tokens)) for lv in levels}
    if len(loads) >= 2:
        return tuple(KNOB_NAMES), None
    why = ("one run" if len(levels) == 1 else f"{len(levels)} runs at one load (batch {levels[0].mean_batch}, "
           f"{levels[0].in_flight:.2f} requests in flight by Little's law, {round(levels[0].prompt_tokens)} prompt "
           "tokens)") if levels else "no run"
    return ("decode_mbu", "prefill_mfu"), (f"{why} gives two equations (mean TTFT and ITL) for three knobs: decode "
                                           "MBU and prefill MFU are fitted, the overhead per step is held at its "
                                           "default. Import runs at another concurrency or prompt length to fit it.")


def efficiency_for_planner(fit: dict, base: Efficiency | None = None) -> Efficiency:
    """The `latency.Efficiency` that reproduces the fitted step model in the planner (`planner.plan(efficiency=)`,
    `serve_at`): their serving step prices memory at decode_mbu, all its FLOPs at `mfu_at` (decode_mfu · t/(t+t½))
    and adds step_overhead_ms + per-sequence costs; the fitted step model prices memory at the fitted MBU, all
    FLOPs at the fitted MFU (flat) and adds the fitted overhead. So decode_mbu = MBU, prefill_mfu = decode_mfu =
    MFU, gemm_half_tokens = 0 (flat), step_overhead_ms = overhead, sequence_overhead_us = 0; prefill_mbu (not
    fitted) from `base` (the defaults)."""
    b = base or Efficiency()
    mfu = float(fit["prefill_mfu"])
    return Efficiency(decode_mbu=float(fit["decode_mbu"]), prefill_mfu=mfu, prefill_mbu=b.prefill_mbu,
                      decode_mfu=mfu, step_overhead_ms=float(fit["overhead_ms"]), sequence_overhead_us=0.0,
                      gemm_half_tokens=0.0)


def _errors(pred: dict, lv: SweepLevel) -> dict:
    return {f"{m}_error_percent": 100 * (pred[m] - getattr(lv, m)) / getattr(lv, m) for m in METRICS}


def roof_warnings(fit: dict, device: Device) -> list[str]:
    """An efficiency fitted at its bound of 1 means the server beat the device's roof: the device is wrong."""
    out = []
    for key, name, what in (("decode_mbu", "decode MBU", "memory bandwidth"), ("prefill_mfu", "prefill MFU", "FLOP/s")):
        if fit[key] >= 0.999:
            out.append(f"the fitted {name} is at its bound of 1: the server ran faster than {device.name}'s {what} "
                       "allows, so the device's numbers are too low for it (another device, or this machine "
                       "measured while busy?)")
    return out


def compare_sweep(config: ModelConfig, device: Device, levels: list[SweepLevel], weight_dtype: str = "bf16",
                  kv_dtype: str | None = None, efficiency: Efficiency | None = None, overhead_ms: float = 0.0,
                  server_max_batch: int = DEFAULT_SERVER_MAX_BATCH, fit_overhead: bool = True) -> dict:
    """Every level measured vs predicted twice (the given/default efficiencies, then the fitted ones), the fit,
    and the mean absolute error of each metric before and after. `fit_overhead=False` holds the overhead at
    `overhead_ms` (`knobs_to_fit` says when the levels cannot fix it)."""
    if not levels:
        raise SpecError("no measured level to compare with")
    eff = efficiency or Efficiency()
    linear = calibrate(config, device, [Measurement(prompt_tokens=max(1, round(lv.prompt_tokens)),
                                                 output_tokens=max(1, round(lv.output_tokens)),
                                                 batch=lv.mean_batch, ttft_ms=lv.ttft_ms, itl_ms=lv.itl_ms)
                                     for lv in levels], weight_dtype, kv_dtype, fit_overhead=fit_overhead)
    fit = fit_sweep(config, device, levels, weight_dtype, kv_dtype,
                    (linear["decode_mbu"], linear["prefill_mfu"],
                     linear["overhead_ms"] if fit_overhead else overhead_ms), server_max_batch, eff, fit_overhead)
    fitted = Efficiency(decode_mbu=fit["decode_mbu"], prefill_mfu=fit["prefill_mfu"],
                        prefill_mbu=eff.prefill_mbu, decode_mfu=eff.decode_mfu)
    rows = []
    for lv in levels:
        before = predict_level(config, device, lv, weight_dtype, kv_dtype, eff, overhead_ms, server_max_batch)
        after = predict_level(config, device, lv, weight_dtype, kv_dtype, fitted, fit["overhead_ms"],
                              server_max_batch)
        row = dict(mode=lv.mode, level=lv.level, batch=lv.mean_batch, in_flight=lv.in_flight,
                   prompt_tokens=lv.prompt_tokens, output_tokens=lv.output_tokens)
        for m in METRICS:
            row[f"measured_{m}"] = getattr(lv, m)
            row[f"predicted_{m}"] = before[m]
            row[f"fitted_{m}"] = after[m]
        row.update({f"predicted_{k}": v for k, v in _errors(before, lv).items()})
        row.update({f"fitted_{k}": v for k, v in _errors(after, lv).items()})
        rows.append(row)
    mae = {f"{which}_{m}": float(np.mean([abs(r[f"{which}_{m}_error_percent"]) for r in rows]))
           for which in ("predicted", "fitted") for m in METRICS}
    return dict(rows=rows, warnings=roof_warnings(fit, device), decode_mbu=fit["decode_mbu"], prefill_mfu=fit["prefill_mfu"],
                overhead_ms=fit["overhead_ms"], efficiency_before=asdict(eff),
                fitted_knobs=tuple(KNOB_NAMES) if fit_overhead else ("decode_mbu", "prefill_mfu"),
                linear_fit={k: linear[k] for k in ("decode_mbu", "prefill_mfu", "overhead_ms")}, overhead_ms_before=overhead_ms,
                mean_abs_error_percent=mae)
