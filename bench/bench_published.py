"""Published measurements next to the calculators' predictions (docs/measurements.md table).

Every published figure is in bench/published_measurements.csv with its source URL and exact settings (model,
quantisation, batch, prompt/generation length, hardware, software build). Predictions for each row:
- decode at batch 1: the bandwidth floor over (weights + KV at the mean context) / datasheet bandwidth (ideal),
  and the same divided by the default decode MBU (realistic); on a TP mesh `decode_step_parallel` (with its
  all-reduces);
- prefill: `prefill_ms` (or `prefill_parallel` on a TP mesh) with ideal and with default efficiencies.
A figure is tokens/s (`tok_s`) or a time (`ttft_ms`, `itl_ms`); `error` compares speeds: predicted speed /
published speed - 1, so + means the calculator is too optimistic, whatever the unit. `published / ideal` is the
fraction of the datasheet roof the measurement reached (achieved MBU for decode, achieved MFU for prefill).

    python bench/bench_published.py            # prints two Markdown tables
    python bench/bench_published.py --fit    # refits the stacks' efficiencies on the FIT rows only (specs/stacks.json)
    python bench/bench_published.py --fit-measured [STACK ...] [--same-rows]   # refits the host work under
                                   # measured kernels (--same-rows: on the rows each fit lists in fitted_on)

The second table is data-centre serving (bench/published_serving.csv: TensorRT-LLM, NVIDIA NIM and vLLM figures at
concurrency 1-250, TP 1-8, EP 8, maximum throughput), each predicted with the default settings of the stack its
source names (`calculators.planning.published`); it ends with the median and worst |error|.
"""
from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.sizing.kv_cache import kv_cache_bytes  # noqa: E402
from calculators.sizing.latency import IDEAL, Efficiency, bandwidth_floor_ms, prefill_ms, step_weight_bytes  # noqa: E402
from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel, prefill_parallel  # noqa: E402
from calculators.units import default_kv_dtype  # noqa: E402
from specs.devices import load_device  # noqa: E402
from specs.presets import load_preset  # noqa: E402

DATA = Path(__file__).with_name("published_measurements.csv")
TIME_METRICS = ("ttft_ms", "itl_ms")


def load_rows(path: Path = DATA) -> list[dict]:
    """The published rows, as read from the CSV (strings)."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def decode_context(row: dict) -> int:
    """Mean context a decode step sees: the prompt plus half of the generated tokens."""
    return int(row["prompt_tokens"]) + int(row["generated_tokens"]) // 2


def _decode_ms(row: dict, eff: Efficiency) -> float:
    c, dev, w, tp = load_preset(row["model"]), load_device(row["device"]), row["weights"], int(row["tp"])
    ctx = decode_context(row)
    if tp > 1:
        return decode_step_parallel(c, dev, Mesh(tp=tp), ctx, 1, w, efficiency=eff)["itl_ms"]
    g = int(row["group_size"]) if row["group_size"] else None
    step = step_weight_bytes(c, w, 1, g) + kv_cache_bytes(c, ctx, 1, default_kv_dtype(w))
    return bandwidth_floor_ms(step, dev.memory_bandwidth_bytes_per_s) / eff.decode_mbu


def _prefill_ms(row: dict, eff: Efficiency) -> float:
    c, dev, w, tp = load_preset(row["model"]), load_device(row["device"]), row["weights"], int(row["tp"])
    n = int(row["prompt_tokens"])
    if tp > 1:
        return prefill_parallel(c, dev, Mesh(tp=tp), n, 1, w, efficiency=eff)["prefill_ms"]
    return prefill_ms(c, dev, n, 1, w, efficiency=eff)["prefill_ms"]


def predict_ms(row: dict, eff: Efficiency) -> float:
    """Predicted time of the row's unit of work: one decode step, or the whole prefill, in ms."""
    return _decode_ms(row, eff) if row["phase"] == "decode" else _prefill_ms(row, eff)


def in_metric(row: dict, ms: float) -> float:
    """A predicted time expressed in the row's published unit (tokens/s or ms)."""
    if row["metric"] in TIME_METRICS:
        return ms
    tokens = 1 if row["phase"] == "decode" else int(row["prompt_tokens"])
    return tokens / ms * 1e3


def speed_ratio(row: dict, predicted: float) -> float:
    """Predicted speed / published speed (> 1: the prediction is too optimistic)."""
    published = float(row["published"])
    return published / predicted if row["metric"] in TIME_METRICS else predicted / published


def compare(row: dict, efficiency: Efficiency | None = None) -> dict:
    """One row: published figure, ideal and realistic predictions in its unit, error, fraction of the roof."""
    ideal = in_metric(row, predict_ms(row, IDEAL))
    real = in_metric(row, predict_ms(row, efficiency or Efficiency()))
    return dict(published=float(row["published"]), ideal=ideal, realistic=real,
                error=speed_ratio(row, real) - 1, of_ideal=1 / speed_ratio(row, ideal))


def error_band(row: dict) -> float | None:
    """The documented |error| band of a row as a fraction, or None where the calculator is not expected to fit
    (docs/measurements.md: "Where the model is off"); every row must still stay under its ideal roof."""
    return float(row["error_band_pct"]) / 100 if row["error_band_pct"] else None


def band_label(row: dict) -> str:
    b = error_band(row)
    return "roof only" if b is None else f"±{100 * b:.0f}%"


def serving_table() -> None:
    """The data-centre serving rows with their predictions (`calculators.planning.published`), then the error by
    split: the TEST rows (held out before any fit) are the accuracy; the fit rows are shown beside them. Each row is
    priced twice: by the closed form (the stacks' fitted efficiencies) and, where aiconfigurator-core's databases
    are installed (requirements-profiles.txt), by kernels measured on its GPU and stack (the nearest profiled GPU's
    for a GPU nothing measured); the error tables of both go to bench/published_accuracy.json."""
    from calculators.planning.accuracy import BAR_MEDIAN, BAR_WORST
    from calculators.planning.published import bar_table, compare_all, error_table, load_rows, row_id, source_row
    from specs.aiconfigurator_source import package_dir
    rows = load_rows()
    runs = [("closed form", compare_all(rows))]
    if package_dir():
        runs.append(("measured kernels", compare_all(rows, profile="auto")))
    accuracy, predictions = [], []
    for label, res in runs:
        predictions += [dict(row=row_id(source_row(r), rows), pricing=label, predicted=r["predicted"],
                             error=r["error"]) for r in res["rows"]]
        print(f"\n### {label}\n")
        print("| split | regime | stack | model | GPUs | in / out | mode | metric | published | predicted | error | "
              "priced from | source |")
        print("|---|---|---|---|---|---|---|---|---:|---:|---:|---|---|")
        for r in res["rows"]:
            mode = r["mode"] + (f" {r['concurrency']}" if r["concurrency"] else "") + \
                (f" {r['rate_rps']} req/s" if r["mode"] == "server" and r["rate_rps"] else "")
            par = f"{r['gpus']} × {load_device(r['device']).name} (TP {r['tp']}" + \
                (f", EP {r['ep']}" if r["ep"] not in ("", "1") else "") + \
                (f", DP {r['dp']}" if r.get("dp") not in (None, "", "1") else "") + ")"
            print(f"| {r['split']} | {r['regime']} | {r['stack']} | {r['model']} {r['weights']} | {par} | "
                  f"{r['prompt_tokens']} / {r['output_tokens']} | {mode} | {r['metric']} | "
                  f"{float(r['published']):,.2f} | {r['predicted']:,.2f} | {100 * r['error']:+.0f}% | "
                  f"{r['pricing'].split(':')[0]} | {r['url']} |")
        table = error_table(res["rows"])
        print("\n| split | by | group | rows | median abs error | worst abs error |")
        print("|---|---|---|---:|---:|---:|")
        for e in table:
            print(f"| {e['split']} | {e['group']} | {e['value']} | {e['n']} | {100 * e['median_abs_error']:.1f}% | "
                  f"{100 * e['worst_abs_error']:.1f}% |")
        print(f"\nIssue 36's bar (held-out rows, median <= {100 * BAR_MEDIAN:.0f}%, worst <= {100 * BAR_WORST:.0f}%):")
        for b in bar_table(res["rows"]):
            print(f"  {b['regime']:<20} " + ("no priced held-out row" if not b["n"] else
                  f"{b['n']:>2} rows, median {100 * b['median_abs_error']:.1f}%, worst "
                  f"{100 * b['worst_abs_error']:.1f}%: {'meets it' if b['meets'] else 'does not'}"))
        tag = "" if label == "closed form" else f" ({label})"
        accuracy += [dict(e, group=e["group"] + tag) for e in table]
        test = [abs(r["error"]) for r in res["rows"] if r["split"] == "test"]
        fit_rows = [abs(r["error"]) for r in res["rows"] if r["split"] == "fit"]
        print(f"\n{label}: TEST rows (held out): {len(test)} priced, median |error| "
              f"{100 * statistics.median(test):.1f}%, worst {100 * max(test):.1f}%. Fit rows (the host costs and "
              f"efficiencies were fitted on them, not an accuracy): {len(fit_rows)} priced, median "
              f"{100 * statistics.median(fit_rows):.1f}%, worst {100 * max(fit_rows):.1f}%. "
              f"{len(res['unpriced'])} rows not priced (no stated mean input length); docs/validation_table.md.")
    write_accuracy(accuracy, predictions)


def write_accuracy(rows: list[dict], predictions: list[dict]) -> None:
    """bench/published_accuracy.json: the error table the app and the CLI quote as each prediction's error bar, and
    each priced row's prediction (by its 1-based row id in bench/published_serving.csv) that the Calibration page
    draws without pricing the table again."""
    import json
    from calculators.planning.accuracy import ACCURACY_JSON
    ACCURACY_JSON.write_text(json.dumps(dict(about="Held-out (split=test) and fit errors of bench/published_serving.csv "
                                             "by regime, dense/MoE, vendor and precision, and each row's prediction; "
                                             "written by bench/bench_published.py", rows=rows,
                                             predictions=predictions), indent=1) + "\n", encoding="utf-8")


def fit() -> None:
    """Refit the stacks' efficiencies on the FIT rows only (`published.fit_groups`) and write specs/stacks.json."""
    from calculators.planning.published import fit_groups, write_fit
    for key, g in fit_groups().items():
        print(f"{key}: {len(g['rows'])} fit rows, median |error| {100 * g['median']:.1f}%, worst {100 * g['worst']:.1f}%, "
              f"{g['efficiency']}")
        write_fit(key, g)


def fit_measured() -> None:
    """Refit each stack's host work under measured kernels on its FIT rows only (`published.fit_measured_host`);
    with --same-rows, on the fit rows its current fit lists (`fitted_on`), when the pricing changed but the rows
    a fit was declared on should not."""
    from calculators.planning.published import fit_measured_host, load_rows, stack_key_of, write_measured_host
    from specs.stacks import _doc, load_stack
    args = sys.argv[2:]
    same = "--same-rows" in args
    # a stack before its builds ("vllm" sorts before "vllm@..."): a build's fit sits on its stack's
    stacks = [a for a in args if a != "--same-rows"] or sorted({stack_key_of(r) for r in load_rows()})
    for key in stacks:
        s = load_stack(key)
        host = ((s.build_doc or {}) if s.build else s.doc).get("measured_host") if same else None
        g = fit_measured_host(key, fitted_on=host["fitted_on"] if host else None)
        print(f"{key}: {len(g['rows'])} fit rows, median |error| {100 * g['median']:.1f}%, worst "
              f"{100 * g['worst']:.1f}%, {g['host']}", flush=True)
        write_measured_host(key, g)
        _doc.cache_clear()                # the next fit (a build of this stack) reads what was written
        load_stack.cache_clear()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--fit":
        fit()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--fit-measured":
        fit_measured()
        return
    rows = load_rows()
    print("| device | model, settings | phase | unit | published | predicted ideal | predicted realistic | "
          "error | band | published / ideal | source |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        x = compare(r)
        print(f"| {load_device(r['device']).name}{' ×' + r['tp'] if int(r['tp']) > 1 else ''} | {r['settings']} | "
              f"{r['phase']} | {r['metric']} | {x['published']:,.2f} | {x['ideal']:,.1f} | {x['realistic']:,.1f} | "
              f"{100 * x['error']:+.0f}% | {band_label(r)} | {x['of_ideal']:.2f} | {r['url']} |")
    print(f"\nRealistic = default {Efficiency()}. Error = predicted speed / published speed − 1 "
          "(+ = the calculator is too optimistic).")
    serving_table()


if __name__ == "__main__":
    main()
