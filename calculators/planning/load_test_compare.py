"""Imported load-test runs (`load_test_import`) next to the calculators: each run's prediction for its own load,
the error per metric, and the efficiencies fitted to the runs.

- A run at a CONCURRENCY is predicted by the measured sweep's level model (`measured_sweep.predict_level`: the
  serving simulator with every request queued and a batch cap of c, one GPU): mean TTFT, mean TPOT (the level's
  ITL), mean end-to-end and output tokens/s.
- A run at a RATE is predicted by `serve_at` (the deployment's steady state under a Poisson rate, any TP and GPU
  count): TTFT p50/p99, TPOT, ITL p50/p99 and output tokens/s.
"Defaults" are the serving stack's efficiencies for the device (`Efficiency.for_stack`) and its fixed step cost.
The fit is `measured_sweep.compare_sweep` over every run (one GPU only: its step model has no TP); with runs at
only one load it fits decode MBU and prefill MFU and holds the overhead (`measured_sweep.knobs_to_fit`). The
fitted numbers become a planner `Efficiency` with `measured_sweep.efficiency_for_planner`.
Error = predicted / measured − 1, in %.
"""
from __future__ import annotations

from dataclasses import dataclass

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.load_test_import import LoadTestRecord, to_sweep_level
from calculators.planning.measured_sweep import (KNOB_NAMES, compare_sweep, efficiency_for_planner, knobs_to_fit)
from calculators.planning.serve_at import serve_at
from calculators.sizing.latency import Efficiency
from specs.devices import Device
from specs.model_config import ModelConfig, SpecError

# (label, measured key in the record, predicted key): per predictor
CONCURRENCY_METRICS = (("TTFT mean (ms)", "ttft_mean_ms", "ttft_ms"), ("TPOT mean (ms)", "tpot_mean_ms", "itl_ms"),
                       ("end-to-end mean (ms)", "e2e_mean_ms", "e2e_ms"),
                       ("output tokens/s", "output_tok_s", "output_tok_s"))
RATE_METRICS = (("TTFT p50 (ms)", "ttft_p50_ms", "ttft_p50_ms"), ("TTFT p99 (ms)", "ttft_p99_ms", "ttft_p99_ms"),
                ("TPOT mean (ms)", "tpot_mean_ms", "tpot_ms"), ("ITL p50 (ms)", "itl_p50_ms", "itl_p50_ms"),
                ("ITL p99 (ms)", "itl_p99_ms", "itl_p99_ms"), ("output tokens/s", "output_tok_s", "output_tok_s"))
LEVEL_MODEL = "level model (measured_sweep)"
STEADY_STATE = "steady state (serve_at)"


@dataclass(frozen=True)
class ImportedRun:
    """One imported run with the load it ran at (the file's, or the one the user gave)."""
    label: str
    record: LoadTestRecord
    mode: str
    level: float


def _error(pred: float | None, measured: float | None) -> float | None:
    if pred is None or measured is None or measured == 0:
        return None
    return 100 * (pred - measured) / measured


def _row(run: ImportedRun, by: str, label: str, measured, before, after) -> dict:
    return {"run": run.label, "load": load_words(run.mode, run.level), "predicted by": by, "metric": label,
            "measured": measured, "predicted (defaults)": before, "error (defaults) %": _error(before, measured),
            "predicted (fitted)": after, "error (fitted) %": _error(after, measured)}


def load_words(mode: str, level: float) -> str:
    return f"concurrency {level:g}" if mode == "concurrency" else f"{level:g} requests/s"


def compare_imported(config: ModelConfig, device: Device, runs: list[ImportedRun], weight_dtype: str = "bf16",
                     kv_dtype: str | None = None, mesh: Mesh = Mesh(), stack: str | None = None) -> dict:
    """Every run measured vs predicted (defaults, then fitted) per metric, the fit and what it could fit (see the
    module docstring). Returns dict(rows, fit (None without one), knobs, held_reason, notes, efficiency_before,
    planner_efficiency (an Efficiency or None))."""
    if not runs:
        raise SpecError("no imported run to compare with")
    base = Efficiency.for_stack(stack, device, weight_dtype, config)
    levels = [to_sweep_level(r.record, r.mode, r.level) for r in runs]
    notes, fit, knobs, held = [], None, (), None
    one_gpu = mesh.total_gpus == 1
    if one_gpu:
        knobs, held = knobs_to_fit(levels)
        fit = compare_sweep(config, device, levels, weight_dtype, kv_dtype, base, base.step_overhead_ms,
                            fit_overhead="overhead_ms" in knobs)
        # the fit's own rows predict every level with the level model (a rate level by simulated Poisson arrivals)
    else:
        notes.append(f"The fit and the level model are for one GPU ({mesh.total_gpus} given): runs at a "
                     "concurrency are not predicted, and nothing is fitted. Runs at a rate are predicted by the "
                     "steady state with the stack's defaults.")
    fitted = efficiency_for_planner(fit, base) if fit else None
    rows = []
    for i, (run, lv) in enumerate(zip(runs, levels)):
        m = run.record.metrics
        if run.mode == "concurrency":
            if fit is None:
                continue
            r = fit["rows"][i]
            measured = {"ttft_ms": lv.ttft_ms, "itl_ms": lv.itl_ms, "e2e_ms": lv.e2e_ms,
                        "output_tok_s": lv.output_tok_s}
            for label, mkey, pkey in CONCURRENCY_METRICS:
                got = m.get(mkey) if m.get(mkey) is not None else measured[pkey]
                rows.append(_row(run, LEVEL_MODEL, label, got, r[f"predicted_{pkey}"], r[f"fitted_{pkey}"]))
        else:
            kw = dict(prompt=max(1, round(lv.prompt_tokens)), output=max(1, round(lv.output_tokens)),
                      weight_dtype=weight_dtype, kv_dtype=kv_dtype, stack=stack)
            before = serve_at(config, device, mesh, run.level, efficiency=base, **kw)
            after = serve_at(config, device, mesh, run.level, efficiency=fitted, **kw) if fitted else None
            for x in (before, after):
                if x is not None and not x["stable"]:
                    notes.append(f"{run.label}: {x['verdict']} (with the {'fitted' if x is after else 'default'} "
                                 "efficiencies), so its latencies are unbounded")
            for label, mkey, pkey in RATE_METRICS:
                if m.get(mkey) is None:
                    continue
                rows.append(_row(run, STEADY_STATE, label, m[mkey], before[pkey] if before["stable"] else None,
                                 after[pkey] if after is not None and after["stable"] else None))
    return dict(rows=rows, fit=fit, knobs=knobs, held_reason=held, notes=notes, efficiency_before=base,
                planner_efficiency=fitted)


__all__ = ["CONCURRENCY_METRICS", "ImportedRun", "KNOB_NAMES", "RATE_METRICS", "compare_imported", "load_words"]
