"""How far a prediction can be trusted: the measured error of its regime on the HELD-OUT rows of the published
table (bench/published_serving.csv, split = test), as `bench/bench_published.py` computed it last and wrote it to
bench/published_accuracy.json (a test recomputes the file and fails when it is stale).

    band("under_rate")  ->  {"regime": "under_rate", "n": 3, "median_abs_error": 0.15, "worst_abs_error": 0.63,
                             "text": "under a rate: median 15%, worst 63% over 3 held-out published rows"}
A request outside anything validated (a regime, vendor or precision with no held-out row) says so.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ACCURACY_JSON = Path(__file__).resolve().parents[2] / "bench" / "published_accuracy.json"
REGIME_WORDS = {"max_throughput": "maximum throughput", "under_rate": "under a rate", "batch1": "one request",
                "concurrency": "a fixed number of users", "static": "a static batch"}


def group_value_words(value: str) -> str:
    """A group's value in words ("max_throughput, dense" -> "maximum throughput, dense"), for a table a class
    reads; the JSON and the CSV keep the identifiers."""
    head, _, rest = str(value).partition(", ")
    return REGIME_WORDS.get(head, head) + (f", {rest}" if rest else "")


@lru_cache(maxsize=1)
def _file() -> dict:
    if not ACCURACY_JSON.is_file():
        return {}
    return json.loads(ACCURACY_JSON.read_text(encoding="utf-8"))


def table() -> tuple:
    return tuple(_file().get("rows", ()))


def committed_predictions(pricing: str = "closed form") -> dict:
    """{1-based row id of bench/published_serving.csv: (predicted, error)} as bench/bench_published.py last priced
    the table, "closed form" or "measured kernels" ({} where it did not: the file is older, or the extra was not
    installed). A test recomputes them."""
    return {p["row"]: (p["predicted"], p["error"]) for p in _file().get("predictions", ())
            if p["pricing"] == pricing}


def _find(group: str, value: str) -> dict | None:
    return next((r for r in table() if r["split"] == "test" and r["group"] == group and r["value"] == value), None)


WIDE_EP = "wide EP (attention DP)"


def band(regime: str, vendor: str | None = None, precision: str | None = None, moe: bool | None = None,
         measured: bool = False, borrowed: bool = False, wide_ep: bool = False) -> dict:
    """The held-out error of `regime` (of its MoE or dense rows when `moe` is given and such rows exist), and
    whether the vendor, the precision and an MoE model were validated at all. `measured`: the step was priced
    from measured kernels (a device profile), whose errors are kept apart (groups "... (measured kernels)");
    `borrowed`: from another GPU's kernels (nothing measured on this one), so the held-out error of `vendor`'s rows
    priced that way is added; `wide_ep`: the layout runs attention data-parallel with the experts across the
    group, so the held-out error of such rows (whatever their regime) is added."""
    kind = None if moe is None else ("MoE" if moe else "dense")
    tag = " (measured kernels)" if measured else ""
    r = (_find(f"regime, dense/MoE{tag}", f"{regime}, {kind}") if kind else None) or _find(f"regime{tag}", regime)
    words = REGIME_WORDS.get(regime, regime) + (", measured kernels" if measured else "")
    if r is None:
        return dict(regime=regime, n=0, median_abs_error=None, worst_abs_error=None,
                    text=f"{words}: no held-out published row measures this regime; the figure is not validated")
    out = dict(regime=regime, n=r["n"], median_abs_error=r["median_abs_error"], worst_abs_error=r["worst_abs_error"],
               text=f"{words}: median {100 * r['median_abs_error']:.0f}%, worst {100 * r['worst_abs_error']:.0f}% "
                    f"over {r['n']} held-out published rows")
    missing = [f"{what} {v}" for what, group, v in (("vendor", "vendor", vendor), ("precision", "precision", precision))
               if v and _find(group, v) is None]
    if kind == "MoE" and _find("regime, dense/MoE", f"{regime}, MoE") is None:
        missing.append("an MoE model in this regime")
    if missing:
        out["text"] += f" (none of them on {' or '.join(missing)}: outside what was validated)"
        out["outside_validated"] = missing
    w = _find(f"experts{tag}", WIDE_EP) if wide_ep else None
    if w is not None:
        out["wide_ep"] = dict(n=w["n"], median_abs_error=w["median_abs_error"], worst_abs_error=w["worst_abs_error"])
        out["text"] += (f"; attention DP with wide EP, as {w['n']} held-out rows ran: median "
                        f"{100 * w['median_abs_error']:.0f}%, worst {100 * w['worst_abs_error']:.0f}%")
    elif wide_ep:
        out["text"] += "; no held-out row ran attention DP with wide EP"
    v = _find(f"vendor{tag}", vendor) if borrowed and measured and vendor else None
    if v is not None:
        out["borrowed_vendor"] = dict(vendor=vendor, n=v["n"], median_abs_error=v["median_abs_error"],
                                      worst_abs_error=v["worst_abs_error"])
        out["text"] += (f"; priced from another GPU's kernels, as {vendor}'s held-out rows were: median "
                        f"{100 * v['median_abs_error']:.0f}%, worst {100 * v['worst_abs_error']:.0f}% over {v['n']}")
    return out


# issue 36's acceptance bar on held-out rows, in every regime, as bench/bench_published.py judges it
# (published.bar_table): median and worst |error|, and the regimes as (words, group of the error table, value)
BAR_MEDIAN, BAR_WORST = 0.08, 0.25
BAR_GROUPS = (("maximum throughput", "regime", "max_throughput"), ("under a rate", "regime", "under_rate"),
              ("one request", "regime", "batch1"), ("a static batch", "regime", "static"),
              ("MoE, wide EP", "experts", "wide EP (attention DP)"), ("AMD fallback", "vendor", "AMD"))


def meets_bar(median_abs_error: float, worst_abs_error: float) -> bool:
    """Issue 36's bar: median |error| ≤ 8% and worst ≤ 25%."""
    return median_abs_error <= BAR_MEDIAN and worst_abs_error <= BAR_WORST


def bar_by_pricing() -> list[dict]:
    """Held-out error of each regime of issue 36's bar priced both ways, from the committed accuracy file: rows
    (n), median and worst |error| by the closed form ("closed ...") and by measured kernels ("measured ..."), and
    whether each meets the bar (median ≤ 8%, worst ≤ 25%); None where no held-out row was priced that way."""
    out = []
    for words, group, value in BAR_GROUPS:
        row = {"regime": words}
        for tag, name in (("", "closed"), (" (measured kernels)", "measured")):
            r = _find(group + tag, value)
            row[f"{name} n"] = r["n"] if r else 0
            row[f"{name} median %"] = 100 * r["median_abs_error"] if r else None
            row[f"{name} worst %"] = 100 * r["worst_abs_error"] if r else None
            row[f"{name} meets"] = meets_bar(r["median_abs_error"], r["worst_abs_error"]) if r else None
        out.append(row)
    return out
