"""Published Llama-3.x-70B figures on a Tenstorrent Galaxy (`bench/published_galaxy.csv`, each row read in its source,
with the URL at a commit) next to the mesh model's prediction (`calculators.multi_gpu.mesh2d`, IDEAL efficiency:
datasheet peaks, no fitted factor).

Metrics: ttft_ms (prefill of one prompt: tt-metal prefills user by user, "TTFT (per user)"), itl_ms (one decode step
at the row's batch and the mean decoded context, prompt + output / 2: the sources average every decoded token) and
tok_s_u (1 / ITL of the first token after prefill, at context = prompt). Error = predicted speed / published speed − 1
(+ = the prediction is too optimistic), whatever the unit.

A row names the model it ran (Llama 3.1 / 3.3 70B: Llama 3 70B's shapes with a 128k window). Where that preset is not
installed, the Llama-3-70B preset (the same matrices) stands in for rows inside its 8,192-token window; longer rows are
reported as skipped.
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from calculators.multi_gpu.mesh2d import decode_step, prefill
from specs.model_config import ModelConfig, SpecError
from specs.presets import load_preset

GALAXY_CSV = Path(__file__).resolve().parents[2] / "bench" / "published_galaxy.csv"
COLUMNS = ("source", "url", "model", "topology", "prompt_tokens", "output_tokens", "batch", "metric", "published",
           "settings")
METRICS = ("ttft_ms", "itl_ms", "tok_s_u")
STAND_IN = "llama-3-70b"


def load_rows(path: Path = GALAXY_CSV) -> list[dict]:
    """The published rows as read (strings), each checked to have every column and a known metric."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, 2):
        missing = [c for c in COLUMNS if c not in r or r[c] in (None, "")]
        if missing:
            raise SpecError(f"{path}: line {i} lacks {', '.join(missing)}")
        if r["metric"] not in METRICS:
            raise SpecError(f"{path}: line {i}: unknown metric {r['metric']!r}; choose one of {', '.join(METRICS)}")
    return rows


def model_for(row: dict) -> tuple[ModelConfig, str]:
    """(config, note): the row's preset, or the Llama-3-70B stand-in with a note; SpecError when neither can run
    the row's context."""
    P, O = int(row["prompt_tokens"]), int(row["output_tokens"])
    ctx = P + O // 2 if row["metric"] == "itl_ms" else P          # the context the metric is taken at
    try:
        c, note = load_preset(row["model"]), ""
    except SpecError:
        c, note = load_preset(STAND_IN), f"{row['model']} preset not installed: {STAND_IN}'s shapes stand in"
    if ctx > c.max_position_embeddings:
        raise SpecError(f"{c.name} holds {c.max_position_embeddings:,} tokens, the row needs {ctx:,} ({note or 'ok'})")
    return c, note


def predict(row: dict) -> float:
    """The mesh model's value for the row's metric, in the row's unit."""
    c, _ = model_for(row)
    P, O, B = int(row["prompt_tokens"]), int(row["output_tokens"]), int(row["batch"])
    topo = row["topology"]
    if row["metric"] == "ttft_ms":
        return prefill(c, P, 1, topo)["ms"]
    if row["metric"] == "itl_ms":
        return decode_step(c, B, P + O // 2, topo)["step_ms"]
    return 1e3 / decode_step(c, B, P, topo)["step_ms"]


def speed_error(row: dict, predicted: float) -> float:
    """Predicted speed / published speed − 1: times are inverted so + always means too optimistic."""
    pub = float(row["published"])
    return pub / predicted - 1 if row["metric"] in ("ttft_ms", "itl_ms") else predicted / pub - 1


def compare_all(rows: list[dict] | None = None) -> dict:
    """Every row with its prediction and error (or why it was skipped), and the median / worst |error| per metric."""
    rows = load_rows() if rows is None else rows
    out, skipped = [], []
    for r in rows:
        try:
            p = predict(r)
        except SpecError as e:
            skipped.append(dict(row=r, why=str(e)))
            continue
        out.append(dict(row=r, predicted=p, error=speed_error(r, p), note=model_for(r)[1]))
    summary = {}
    for m in METRICS:
        errs = [abs(x["error"]) for x in out if x["row"]["metric"] == m]
        if errs:
            summary[m] = dict(rows=len(errs), median_abs_error=statistics.median(errs), worst_abs_error=max(errs))
    return dict(rows=out, skipped=skipped, by_metric=summary)


def table_text(result: dict) -> str:
    """The comparison as a plain-text table."""
    lines = [f"{'metric':<8} {'in':>7} {'out':>4} {'B':>3} {'published':>11} {'predicted':>11} {'error':>8}  source"]
    for x in result["rows"]:
        r = x["row"]
        lines.append(f"{r['metric']:<8} {r['prompt_tokens']:>7} {r['output_tokens']:>4} {r['batch']:>3} "
                     f"{float(r['published']):>11.2f} {x['predicted']:>11.2f} {x['error']:>+8.1%}  {r['source']}")
    for s in result["skipped"]:
        lines.append(f"skipped {s['row']['metric']} {s['row']['prompt_tokens']}: {s['why']}")
    for m, s in result["by_metric"].items():
        lines.append(f"{m}: {s['rows']} rows, median |error| {s['median_abs_error']:.1%}, "
                     f"worst {s['worst_abs_error']:.1%}")
    return "\n".join(lines)
