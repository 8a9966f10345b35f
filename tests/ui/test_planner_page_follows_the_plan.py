"""Issue 27, the Capacity planner page made readable: the headline names the deployment, every section follows
the chosen plan, every predicted number carries the held-out error of its regime, the formulas carry the plan's
numbers, and the bar chart of near-equal bars is gone (the frontier marks the plan). One page run (module fixture);
expected values from the page's own plans table, specs/*.json and bench/published_accuracy.json read here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_apptest import chart_specs, errors, run_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "pages" / "42_Capacity_planner.py")


@pytest.fixture(scope="module")
def at():
    return run_script(PAGE, 120)


@pytest.fixture(scope="module")
def row(at) -> dict:
    """The cheapest plan as the page's downloadable plans table gives it."""
    table = next(d.value for d in at.dataframe if "usd_per_million_output_tokens" in d.value.columns)
    return table.iloc[0].to_dict()


def metrics(at) -> dict:
    return {m.label: m for m in at.metric}


def held_out(regime: str, moe: bool = False) -> str:
    """'median 15%, worst 63% over 3 held-out' for a regime, read from the published accuracy file."""
    rows = [r for r in json.loads((ROOT / "bench" / "published_accuracy.json").read_text())["rows"]
            if r["split"] == "test"]
    kind = "MoE" if moe else "dense"
    r = next((r for r in rows if r["group"] == "regime, dense/MoE" and r["value"] == f"{regime}, {kind}"), None) \
        or next(r for r in rows if r["group"] == "regime" and r["value"] == regime)
    return (f"median {100 * r['median_abs_error']:.0f}%, worst {100 * r['worst_abs_error']:.0f}% over {r['n']} "
            "held-out")


def test_the_page_runs_clean(at):
    assert not at.exception and not errors(at)


def test_headline_names_the_deployment_as_the_plans_table_has_it(at, row):
    m = metrics(at)
    assert m["Cheapest plan"].value == f"{int(row['gpus'])} × {row['device']}"
    dp = int(row["dp"]) if "dp" in row else 1
    assert m["TP / PP / EP / DP"].value == f"{int(row['tp'])}/{int(row['pp'])}/{int(row['ep'])}/{dp}"   # one line
    assert m["Weights / KV"].value == f"{row['weight_dtype']} / {row['kv_dtype']}"
    assert m["Replicas"].value == f"{int(row['replicas'])}"
    assert m["Batch cap"].value == f"{int(row['batch_cap'])}"
    assert m["Binding constraint"].value == row["binding"]
    # max batched tokens: vLLM's documented default for this GPU (specs/stacks.json: 2048 below 70 GiB or an A100)
    sched = json.loads((ROOT / "specs" / "stacks.json").read_text())["stacks"]["vllm"]["scheduler"]
    dev = next(d for d in json.loads((ROOT / "specs" / "devices.json").read_text())["devices"]
               if d["name"] == row["device"])
    small = "a100" in row["device"].lower() or dev["memory_gb"] < sched["small_gpu"]["below_gib"]
    mbt = sched["small_gpu"]["max_num_batched_tokens"] if small else sched["max_num_batched_tokens"]
    assert m["Max batched tokens"].value == f"{mbt:,}"
    assert m["$ per hour"].value == f"${row['gpus'] * dev['price_usd_per_hour']:,.2f}"
    # the headline sits above the inputs (the first screen), the launch command right after it
    heads = [s.value for s in at.subheader]
    assert heads.index("The chosen plan at your rate, and how to launch it") < heads.index("Workload and targets")


def test_no_bar_chart_and_the_frontier_marks_the_chosen_plan(at, row):
    specs = chart_specs(at)
    assert not any(t.get("type") == "bar" for s in specs for t in s["data"])
    front = next(s for s in specs if "Every feasible plan" in str(s["layout"].get("title")))
    star = next(t for t in front["data"] if t.get("name") == "chosen plan")
    assert star["x"] == [pytest.approx(row["ttft_p99_ms"])] and star["y"] == [pytest.approx(row["usd_per_million_tokens"])]


def test_throughput_section_opens_on_the_chosen_plan(at, row):
    sel = {s.key.split(".")[2]: s.value for s in at.selectbox if s.key and s.key.startswith("plan.tput.")}
    txt = {t.key.split(".")[2]: t.value for t in at.text_input if t.key and t.key.startswith("plan.tput.")}
    assert sel == {"dev": row["device"], "wd": row["weight_dtype"], "kd": row["kv_dtype"]}
    assert txt == {"gpus": str(int(row["gpus"])), "tp": str(int(row["tp"])), "pp": str(int(row["pp"])),
                   "ep": str(int(row.get("ep", 1)))}


def test_every_section_shows_the_error_of_its_regime(at):
    m = metrics(at)
    rate, top = held_out("under_rate"), held_out("max_throughput")
    for label in ("$ per 1M output tokens", "$ per 1M input tokens", "Mean ITL at the load", "TTFT p99",
                  "Capacity (req/s)", "TTFT p50 / p99 (ms)", "ITL mean / p99 (ms)"):
        assert rate in m[label].help, label
    for label in ("Output tokens/s", "Sequences per replica", "Step", "Per GPU"):
        assert top in m[label].help, label
    captions = [c.value for c in at.caption]
    assert sum(rate in c for c in captions) >= 2 and sum(top in c for c in captions) >= 1


def test_formulas_carry_the_plans_numbers(at, row):
    plan = next(e for e in at.expander if e.label == "This plan's formulas, with its numbers")
    body = "\n".join(str(md.value) for md in plan.markdown)
    assert "λ per replica" in body and "step(n, p)" in body and "TTFT p99" in body
    assert f"{row['itl_at_load_ms']:.4g}" in body                                     # ITL at the load, τ
    assert f"${row['usd_per_million_tokens']:.3g}" in body                            # the blended cost
    assert f"{int(row['gpus']):,} × " in body and "inspect" not in body
    tput = next(e for e in at.expander if e.label.startswith("How this maximum throughput is computed"))
    tbody = "\n".join(str(md.value) for md in tput.markdown)
    step = metrics(at)["Step"].value.split()[0]
    assert f"= {step}" in tbody or step in tbody


def test_back_to_the_chosen_plan_restores_the_defaults(at, row):
    gpus = next(t for t in at.text_input if t.key and t.key.startswith("plan.tput.gpus."))
    gpus.set_value("64").run()
    assert next(t for t in at.text_input if t.key and t.key.startswith("plan.tput.gpus.")).value == "64"
    at.button(key="plan.tput.back").click().run()
    assert next(t for t in at.text_input if t.key and t.key.startswith("plan.tput.gpus.")).value == \
        str(int(row["gpus"]))


def test_a_plan_outside_the_validated_rows_says_so():
    """No held-out published row ran int4 weights or an MoE model under a rate (bench/published_accuracy.json)."""
    from specs.devices import load_device
    from specs.presets import load_preset
    from ui.plan_deploy import error_band
    rows = json.loads((ROOT / "bench" / "published_accuracy.json").read_text())["rows"]
    assert not any(r["split"] == "test" and r["group"] == "precision" and r["value"] == "int4" for r in rows)
    dense, h100 = load_preset("llama-3-8b"), load_device("h100")
    assert "outside what was validated" in error_band("under_rate", h100, "int4", dense)
    assert "outside what was validated" not in error_band("under_rate", h100, "fp8", dense)
    assert held_out("under_rate") in error_band("under_rate", h100, "fp8", dense)


def test_fitted_efficiencies_from_the_measure_page_replan_the_search():
    """The Measure-a-server page's "Re-plan" stores a fit under plan.fitted_efficiency; the planner then searches
    with it: a decode MBU a fifth of the default's can only make every plan slower, so the cheapest plan may not
    get cheaper, and the page says which efficiencies it used."""
    from dataclasses import asdict

    from calculators.sizing.latency import Efficiency
    from ui.fitted_efficiency import FITTED_EFFICIENCY_KEY
    slow = Efficiency(decode_mbu=0.1, prefill_mfu=0.1, decode_mfu=0.1, prefill_mbu=0.1)
    stored = dict(efficiency=asdict(slow), decode_mbu=0.1, prefill_mfu=0.1, overhead_ms=0.0, fitted=["decode_mbu"],
                  model="Llama-3-70B", device="H100 SXM", weight_dtype="fp8", kv_dtype="fp8", stack="vllm",
                  runs=["run 1"])
    base = run_script(PAGE, 120)
    fitted = run_script(PAGE, 120, **{FITTED_EFFICIENCY_KEY: stored})
    assert not fitted.exception and not errors(fitted)
    assert any("fitted on the Measure-a-server page" in i.value for i in fitted.info)

    def cheapest(at):
        t = next(d.value for d in at.dataframe if "usd_per_million_output_tokens" in d.value.columns)
        return float(t["usd_per_million_tokens"].iloc[0]), float(t["itl_at_load_ms"].iloc[0])
    (c0, _), (c1, _) = cheapest(base), cheapest(fitted)
    assert c1 > c0                                       # a slower GPU costs more per token at the same targets


def test_with_measured_kernels_the_throughput_section_prices_as_the_throughput_command(capsys):
    """The sidebar's measured-kernels switch reaches every section: the chosen plan's maximum throughput is the
    `throughput` command's with `--profile auto` (within 2%), and says what priced it. Needs the optional extra."""
    pytest.importorskip("aiconfigurator_core")
    from calculators.cli import main as cli
    at = run_script(PAGE, 180, **{"planner.measured": True})
    assert not errors(at)
    table = next(d.value for d in at.dataframe if "usd_per_million_output_tokens" in d.value.columns)
    best = table.iloc[0].to_dict()
    caption = next(c.value for c in at.caption if "every request queued at once" in c.value)
    assert "measured kernels" in caption
    shown = float(metrics(at)["Output tokens/s"].value.replace(",", ""))
    given = {t.key: t.value for t in at.text_input if t.key in ("plan.prompt", "plan.output")}
    code = cli(["throughput", "--model", "llama-3.1-70b", "--gpu", best["device"], "--gpus", str(int(best["gpus"])),
                "--tp", str(int(best["tp"])), "--pp", str(int(best["pp"])), "--ep", str(int(best.get("ep", 1))),
                "--weight-dtype", best["weight_dtype"], "--kv-dtype", best["kv_dtype"],
                "--prompt-tokens", given["plan.prompt"], "--output-tokens", given["plan.output"],
                "--profile", "auto", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and shown == pytest.approx(out["output_tok_s"], rel=0.02)
