"""The published data-centre serving table (bench/published_serving.csv) against the predictions with each
source's stack defaults. The efficiencies in specs/stacks.json are fitted on the `fit` rows only; the accuracy the
project reports is the error on the `test` rows (every third row, declared in the file before any fit)."""
import json
import statistics
from urllib.parse import urlparse

import pytest

from calculators.planning.published import (committed_comparison, compare_all, error_table, load_rows, priced,
                                            row_id, speed_error)
from specs.presets import load_preset
from specs.stacks import STACKS_FILE

ROWS = load_rows()
MEASURED_TAG = " (measured kernels)"
pytestmark = pytest.mark.xdist_group("published_serving")    # one worker prices the table once (`result`)


@pytest.fixture(scope="module")
def result():
    """compare_all over every row (seconds of CPU): computed when the first test needs it, not at collection, so a
    run that selects none of these tests (or an xdist worker that is sent none) does not pay for it."""
    return compare_all(ROWS)


def test_the_table_covers_data_centre_serving():
    assert len(ROWS) >= 70
    busy = [r for r in ROWS if r["mode"] in ("offline", "server") or int(r["concurrency"] or 0) >= 8]
    assert len(busy) >= len(ROWS) / 2
    assert sum(int(r["tp"]) >= 2 or int(r["ep"]) >= 2 for r in ROWS) >= 8
    for r in ROWS:
        assert urlparse(r["url"]).scheme == "https" and r["settings"] and float(r["published"]) > 0


def test_every_fitted_efficiency_names_only_fit_rows():
    """No test row may have been used by a fit: every id listed in stacks.json's fitted_on lists is a fit row,
    and the lists are not empty (a fit that names no rows would be a hard-coded value)."""
    doc = json.loads(STACKS_FILE.read_text(encoding="utf-8"))
    named = []
    for st in doc["stacks"].values():
        named += st.get("efficiency_fitted_on", [])
        for e in st.get("efficiency_by", []):
            assert e["fitted_on"], e["when"]
            named += e["fitted_on"]
        if "measured_host" in st:                    # the host's work under measured kernels: fit rows too
            assert st["measured_host"]["fitted_on"]
            assert not any(ROWS[i - 1].get("build") for i in st["measured_host"]["fitted_on"])   # a build's own
            named += st["measured_host"]["fitted_on"]
        for key, build in (st.get("builds") or {}).items():     # a build's own factors: its own fit rows
            if build.get("measured_host"):
                ids = build["measured_host"]["fitted_on"]
                assert ids and all(ROWS[i - 1].get("build") == key for i in ids), key
                named += ids
    assert named
    for i in named:
        assert ROWS[i - 1]["split"] == "fit", f"row {i} is a test row"


def test_held_out_rows_are_within_12_percent_at_the_median(result):
    test = [abs(r["error"]) for r in result["rows"] if r["split"] == "test"]
    assert len(test) >= 20
    assert statistics.median(test) <= 0.12


def test_held_out_rows_are_within_35_percent_at_worst(result):
    """Issue 26's bar: ≤ 35% worst on the test rows of the regimes it judged (23.2%: Qwen3-235B FP8 on 8 × H100,
    once TensorRT-LLM's MoE efficiency is fitted apart on its MoE fit rows; 48.1% with one efficiency for dense and
    MoE models). Wide EP (attention DP) came into the table later (rows 103-105, 29 Nov 2026): its held-out row is
    judged by issue 36's bar table, where the closed form's +39% shows, and is kept out of this one; so are the
    MLPerf rows, priced since 29 Nov 2026 (their datasets' mean input lengths; the closed form, not refitted on
    them, is off by up to 46% on AMD's MLPerf Mixtral)."""
    from calculators.planning.published import _experts_layout
    test = sorted(abs(r["error"]) for r in result["rows"] if r["split"] == "test"
                  and _experts_layout(r) != "wide EP (attention DP)" and not r["source"].startswith("MLPerf"))
    assert test[-1] <= 0.35
    wide = [r for r in result["rows"] if r["split"] == "test" and _experts_layout(r) == "wide EP (attention DP)"]
    assert wide and all(abs(r["error"]) > 0.35 for r in wide)     # still out: a change that meets it says so here


def test_error_table_splits_test_from_fit_and_counts_every_priced_row(result):
    t = error_table(result["rows"])
    alls = {e["split"]: e for e in t if e["group"] == "all"}
    assert alls["test"]["n"] + alls["fit"]["n"] == len(result["rows"])
    by_regime = sum(e["n"] for e in t if e["split"] == "test" and e["group"] == "regime")
    assert by_regime == alls["test"]["n"]


def test_error_sign_is_speed_whatever_the_unit():
    assert speed_error({"metric": "itl_ms", "published": "20"}, 10.0) == pytest.approx(1.0)     # faster than measured
    assert speed_error({"metric": "output_tok_s", "published": "100"}, 50.0) == pytest.approx(-0.5)


def test_row_ids_are_one_based_positions():
    assert row_id(ROWS[2], ROWS) == 3 and ROWS[2]["split"] == "test"


def test_the_committed_error_bars_are_the_tables_own_and_every_regime_has_its_band(result):
    """bench/published_accuracy.json (what the CLI and the planner page quote) equals the error table computed now:
    a band cannot go stale when the predictor, the efficiencies or the table change."""
    from calculators.planning.accuracy import ACCURACY_JSON, band
    committed = [r for r in json.loads(ACCURACY_JSON.read_text(encoding="utf-8"))["rows"]
                 if not r["group"].endswith(MEASURED_TAG)]
    fresh = error_table(result["rows"])
    kept = committed_comparison("closed form", ROWS)                   # what the Calibration page draws
    assert [r["predicted"] for r in kept["rows"]] == pytest.approx([r["predicted"] for r in result["rows"]],
                                                                   rel=1e-9)
    assert len(kept["unpriced"]) == len(result["unpriced"])
    assert len(committed) == len(fresh)
    for a, b in zip(committed, fresh):
        assert (a["split"], a["group"], a["value"], a["n"]) == (b["split"], b["group"], b["value"], b["n"])
        assert a["median_abs_error"] == pytest.approx(b["median_abs_error"], rel=1e-9)
        assert a["worst_abs_error"] == pytest.approx(b["worst_abs_error"], rel=1e-9)
    for e in fresh:
        if e["split"] == "test" and e["group"] == "regime":
            got = band(e["value"])
            assert got["n"] == e["n"] and got["median_abs_error"] == pytest.approx(e["median_abs_error"])
    assert "outside what was validated" in band("max_throughput", "Intel", "fp8")["text"]
    assert band("no such regime")["n"] == 0


def test_an_moe_layout_under_a_rate_quotes_the_moe_rows_not_the_dense_ones(result):
    """Under a rate one held-out row is an MoE model (MLPerf's Mixtral 8x7B Server on 8 MI300X, priced since 29 Nov
    2026): an MoE figure there quotes that row's error, not the dense rows' band; and a regime with no held-out
    MoE row says so instead of borrowing the dense band (a static batch of an MoE model on AMD)."""
    from calculators.planning.accuracy import band
    moe = [r for r in result["rows"] if r["split"] == "test" and r["regime"] == "under_rate"
           and load_preset(r["model"]).num_experts]
    assert [r["model"] for r in moe] == ["mixtral-8x7b"]
    err = f"{100 * abs(moe[0]['error']):.0f}%"
    assert band("under_rate", "AMD", "fp8", moe=True)["text"] == (f"under a rate: median {err}, worst {err} over 1 "
                                                                  "held-out published rows")
    assert "MoE model" not in band("under_rate", "NVIDIA", "bf16", moe=False)["text"]


def test_a_finite_online_run_reports_about_the_throughput_its_source_states():
    """The online rows (500 requests sent at a QPS) state the throughput each run achieved, requests / makespan
    (`achieved_rps`): it is not the rate fed to the model, so it checks the finite run independently. Sent at
    8-32 requests/s, the runs achieved 7-26: the drain of the last requests alone costs 1 to 4 requests/s. The six
    467/256 runs within 7%; the three 202/214 runs +24% to +52% (at 32/s on 4 × H200 the model's capacity is
    above the run's: it achieved 15/s), a bound that holds the present figures."""
    from calculators.planning.published import _setup
    from calculators.planning.serve_at import finite_run_at
    online = [r for r in ROWS if r.get("requests") and r.get("achieved_rps")]
    assert len(online) >= 9
    errs = []
    for r in online:
        c, dev, mesh, stack, eff = _setup(r)
        f = finite_run_at(c, dev, mesh, float(r["rate_rps"]), int(r["requests"]), int(r["prompt_tokens"]),
                          int(r["output_tokens"]), r["weights"], r["kv"], stack, eff)
        assert f["achieved_rps"] < float(r["rate_rps"])           # a finite run reports less than it was sent
        errs.append(abs(f["achieved_rps"] / float(r["achieved_rps"]) - 1))
    assert statistics.median(errs) <= 0.08 and max(errs) <= 0.55


def test_a_moe_model_takes_the_stacks_moe_efficiency_and_the_fp4_group_wins_over_it():
    """specs/stacks.json's TensorRT-LLM entries, read from the file: a dense FP8 model gets the base efficiency, a
    MoE FP8 model the `moe` entry's decode_mbu / decode_mfu, an FP4 MoE model the FP4 entry's (listed after it), and
    the throughput model uses the MoE values when it fills in the defaults itself."""
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.throughput import max_throughput
    from calculators.sizing.latency import Efficiency
    from specs.devices import load_device
    from specs.presets import load_preset
    st = json.loads(STACKS_FILE.read_text(encoding="utf-8"))["stacks"]["trtllm"]
    moe_set = next(e["set"] for e in st["efficiency_by"] if e["when"] == {"moe": True})
    fp4_set = next(e["set"] for e in st["efficiency_by"] if e["when"] == {"precision": "fp4"})
    h200, b200 = load_device("h200"), load_device("b200")
    qwen, llama = load_preset("qwen3-235b-a22b"), load_preset("llama-3.1-70b")
    dense = Efficiency.for_stack("trtllm", h200, "fp8", llama)
    moe = Efficiency.for_stack("trtllm", h200, "fp8", qwen)
    fp4_moe = Efficiency.for_stack("trtllm", b200, "fp4", qwen)
    assert dense.decode_mbu == st["efficiency"]["decode_mbu"] != moe_set["decode_mbu"]
    assert (moe.decode_mbu, moe.decode_mfu) == (moe_set["decode_mbu"], moe_set["decode_mfu"])
    assert moe.step_overhead_ms == dense.step_overhead_ms                      # the rest stays the base's
    assert (fp4_moe.decode_mbu, fp4_moe.decode_mfu) == (fp4_set["decode_mbu"], fp4_set["decode_mfu"])
    mesh = Mesh(tp=8, ep=8)
    auto = max_throughput(qwen, h200, mesh, 1000, 1000, "fp8", stack="trtllm")["output_tok_s"]
    assert auto == max_throughput(qwen, h200, mesh, 1000, 1000, "fp8", stack="trtllm", efficiency=moe)["output_tok_s"]
    assert auto != max_throughput(qwen, h200, mesh, 1000, 1000, "fp8", stack="trtllm",
                                  efficiency=Efficiency.for_stack("trtllm", h200, "fp8"))["output_tok_s"]


def test_the_committed_measured_kernel_error_bars_are_the_tables_own():
    """The error bars quoted for predictions priced from measured kernels (groups "... (measured kernels)") are
    the table's own, recomputed with aiconfigurator-core's databases (skipped without them: minutes of CPU)."""
    from specs.aiconfigurator_source import package_dir, readers_installed
    if package_dir() is None or not readers_installed():
        pytest.skip("aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
    from calculators.planning.accuracy import ACCURACY_JSON
    committed = [r for r in json.loads(ACCURACY_JSON.read_text(encoding="utf-8"))["rows"]
                 if r["group"].endswith(MEASURED_TAG)]
    priced_now = compare_all(ROWS, profile="auto")
    fresh = error_table(priced_now["rows"])
    kept = committed_comparison("measured kernels", ROWS)              # what the Calibration page draws
    assert [r["predicted"] for r in kept["rows"]] == pytest.approx([r["predicted"] for r in priced_now["rows"]],
                                                                   rel=1e-6)
    assert len(committed) == len(fresh)
    for a, b in zip(committed, fresh):
        assert (a["split"], a["group"], a["value"], a["n"]) == (b["split"], b["group"] + MEASURED_TAG, b["value"],
                                                                b["n"])
        assert a["median_abs_error"] == pytest.approx(b["median_abs_error"], rel=1e-6)
        assert a["worst_abs_error"] == pytest.approx(b["worst_abs_error"], rel=1e-6)


def test_a_row_at_a_rate_is_read_in_the_statistic_its_source_states():
    """The Triton rows state mean TTFTs (their settings say so; `statistic` = mean): `predict` reads the steady
    state's mean, which for this skewed law is above its median, and equals serve-at's `ttft_mean_ms`. The same row
    marked p50 gets the median; an unknown statistic is refused, and so is a mean the steady state does not compute
    (chunked prompts), instead of a median passed off as a mean."""
    from calculators.planning.published import _setup, predict
    from calculators.planning.serve_at import serve_at
    from specs.model_config import SpecError
    means = [r for r in ROWS if r["metric"] == "ttft_ms" and r["mode"] == "server" and r.get("rate_rps")]
    assert means and all(r["statistic"] == "mean" and "mean TTFT" in r["settings"] for r in means)
    def steady(row):
        c, dev, mesh, stack, eff = _setup(row)
        return serve_at(c, dev, mesh, float(row["rate_rps"]), int(row["prompt_tokens"]), int(row["output_tokens"]),
                        row["weights"], row["kv"], stack, efficiency=eff)
    row = dict(means[0], rate_rps="4")           # well inside capacity: the steady state, not the finite run
    s = steady(row)
    assert s["stable"]
    assert predict(row) == pytest.approx(s["ttft_mean_ms"], rel=1e-9)
    assert predict(dict(row, statistic="p50")) == pytest.approx(s["ttft_p50_ms"], rel=1e-9)
    assert s["ttft_mean_ms"] > s["ttft_p50_ms"]
    with pytest.raises(SpecError, match="mean or p50"):
        predict(dict(row, statistic="p90"))
    with pytest.raises(SpecError, match="no mean TTFT for chunked prompts"):
        predict(dict(row, prompt_tokens="6000", rate_rps="0.5", requests="", max_num_batched_tokens="2048"))


def test_the_bar_side_by_side_reads_the_same_errors_as_the_tables_own_rows(result):
    """`accuracy.bar_by_pricing` reads the committed file; its closed-form columns are the bar of the rows priced
    here (`published.bar_table` on `compare_all`), regime by regime, and a regime meets the bar only with a median
    ≤ 8% and a worst ≤ 25%."""
    from calculators.planning.accuracy import bar_by_pricing
    from calculators.planning.published import bar_table
    mine = bar_by_pricing()
    for got, want in zip(mine, bar_table(result["rows"])):
        assert got["regime"] == want["regime"] and got["closed n"] == want["n"]
        assert got["closed median %"] == pytest.approx(100 * want["median_abs_error"], rel=1e-9)
        assert got["closed worst %"] == pytest.approx(100 * want["worst_abs_error"], rel=1e-9)
        assert got["closed meets"] == want["meets"]
    for r in mine:
        for side in ("closed", "measured"):
            if r[f"{side} n"]:
                assert r[f"{side} meets"] == (r[f"{side} median %"] <= 8 and r[f"{side} worst %"] <= 25)


def test_a_table_longer_than_its_committed_predictions_is_priced_again():
    """A priced row the file holds no prediction for (the table grew after bench/bench_published.py last ran):
    `committed_comparison` gives None, so the page prices the table instead of drawing a stale one."""
    assert committed_comparison("closed form", ROWS) is not None
    assert committed_comparison("closed form", ROWS + [next(r for r in ROWS if r["mode"] == "offline")]) is None
    assert committed_comparison("no such pricing", ROWS) is None


def test_one_users_itl_is_the_latency_commands_decode_step_and_more_users_add_only_the_others_prompts():
    """A user of a fixed number of users sees, between its tokens, steps that carry the OTHER users' prompts: its
    own was prefilled before its first token. At one user that is the bare decode step, the ITL `latency` reports
    for the same request (exactly: one step model); at eight users, the step carries seven users' prompts, more
    than the bare step of eight rows and less than the deployment's average step (all eight users' prompts)."""
    from calculators.multi_gpu.tensor_parallel import _link_for
    from calculators.planning.published import _setup, predict
    from calculators.planning.request_latency import request_latency
    from calculators.planning.throughput import step_time
    one = next(r for r in ROWS if r["mode"] == "concurrency" and r["concurrency"] == "1" and r["metric"] == "itl_ms")
    c, dev, mesh, stack, eff = _setup(one)
    I, O = int(one["prompt_tokens"]), int(one["output_tokens"])
    bare = request_latency(c, dev, mesh, I, O, 1, one["weights"], one["kv"], stack, eff)["itl_ms"]
    assert predict(one) == pytest.approx(bare, rel=1e-9)
    eight = dict(one, concurrency="8")
    args = (c, dev, mesh, 8, I, O, one["weights"], one["kv"], eff, _link_for(dev, None), stack)
    everyone = step_time(*args)["step_ms"]
    bare8 = request_latency(c, dev, mesh, I, O, 8, one["weights"], one["kv"], stack, eff)["itl_ms"]
    assert bare8 < predict(eight) < everyone
    assert predict(eight) == pytest.approx(step_time(*args, prompting_rows=7)["step_ms"], rel=1e-9)


def test_every_priced_row_predicts_and_the_rest_are_listed_apart(result):
    """(Moved from test_validation_table.py to share this module's one pricing of the table.)"""
    res = result
    assert len(res["rows"]) + len(res["unpriced"]) == len(ROWS)
    assert all(not r["prompt_tokens"] for r in res["unpriced"])          # only rows without a stated mean input
    assert all(priced(r) and r["predicted"] > 0 for r in res["rows"])
    assert any(r["mode"] == "server" for r in res["rows"])                  # rows under a rate are priced now
    assert priced({"mode": "server", "prompt_tokens": "100", "output_tokens": "10"})
    assert not priced({"mode": "offline", "prompt_tokens": "", "output_tokens": "294"})
