"""Bring your own load test on the Measure-a-server page (issue 27), driven headless with AppTest's file uploader:
the four tools' real result files (tests/data/load_tests/) show the numbers the importer gives, and the numbers
the runs themselves hold (the scripted server's known timing; an engine run's per-request arrays, recomputed here
by hand); a bad file is one message naming it and leaves the others shown; the predicted-vs-measured table and the
fit are there; Re-plan stores the planner's Efficiency of the fit and opens the planner."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st

from calculators.planning.load_test_import import import_load_test
from helpers_apptest import REFERENCE, errors, run_script
from ui.fitted_efficiency import FITTED_EFFICIENCY_KEY, PLANNER_PAGE
from ui.nav import page_files
from ui.load_import import METRIC_ROWS

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(next((ROOT / "pages").glob("44_*.py")))
DATA = ROOT / "tests" / "data" / "load_tests"
SCRIPTED = ["guidellm_benchmarks.json", "vllm_bench_serve.json", "aiperf_profile_export_aiperf.json",
            "aiperf_profile_export_aiperf.csv", "sglang_bench_serving.jsonl"]
IMPORT = "Import result files (guidellm, vLLM, AIPerf, SGLang)"
TIMEOUT = 120
# the scripted server (tests/data/load_tests/README.md): TTFT 250 ms, 50 ms a token, 16 tokens, concurrency 2
KNOWN = {"TTFT mean (ms)": 250.0, "TPOT mean (ms)": 50.0, "end-to-end mean (ms)": 250.0 + 15 * 50.0,
         "requests/s": 2 / 1.0, "output tokens/s": 2 * 16 / 1.0}


def _file(path: Path) -> tuple[str, bytes, str]:
    return path.name, path.read_bytes(), "application/octet-stream"


def upload(files: list[tuple[str, bytes, str]], **state):
    at = run_script(PAGE, TIMEOUT, **{**REFERENCE, "measure.source": IMPORT, **state})   # the reference example
    at.file_uploader(key="measure.import.files").set_value(files).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table(at, first_column: str):
    return next(d.value for d in at.dataframe if d.value.columns[0] == first_column)


@pytest.fixture(scope="module")
def scripted():
    return upload([_file(DATA / "scripted" / n) for n in SCRIPTED])


def test_every_tools_file_shows_the_importers_numbers_and_the_known_timing(scripted):
    assert not errors(scripted)
    shown = table(scripted, "metric").set_index("metric")
    assert list(shown.columns) == SCRIPTED
    for name in SCRIPTED:
        rec = import_load_test((DATA / "scripted" / name).read_bytes(), name)[0]
        for key, label in METRIC_ROWS.items():
            want = rec.metrics[key]
            got = shown.loc[label, name]
            assert (np.isnan(got) if want is None else got == want), (name, label, got, want)
        for label, want in KNOWN.items():                       # what the scripted server did, within 5%
            assert shown.loc[label, name] == pytest.approx(want, rel=0.05), (name, label)
    runs = table(scripted, "run")
    assert list(runs["load"]) == ["concurrency 2", "concurrency 2", "concurrency 2", "not in the file",
                                  "concurrency 2"]
    assert "AIPerf" in set(runs["tool"]) and "guidellm" in set(runs["tool"])
    text = " ".join(m.value for m in scripted.markdown)
    for words in ("first token chunk − request sent", "(output tokens − 1)", "AIPerf's 'inter token latency' is "
                  "our TPOT", "guidellm's own 'TPOT' counts the first token in"):
        assert words in text
    assert {"Download CSV"} <= {b.proto.label for b in scripted.get("download_button")}


def test_an_engine_run_matches_its_per_request_times_computed_by_hand():
    """vLLM's detailed file keeps each request's TTFT, chunk gaps, latency and output length: the page's
    figures are the means and percentiles of those, computed here with NumPy alone."""
    path = DATA / "engine" / "vllm_bench_serve.json"
    d = json.loads(path.read_text())
    at = upload([_file(path)])
    col = table(at, "metric").set_index("metric")[path.name]
    ttft, lat, out = (np.array(d[k], dtype=float) for k in ("ttfts", "latencies", "output_lens"))
    gaps = np.concatenate([np.array(g, dtype=float) for g in d["itls"]])
    tpot = (lat - ttft) / (out - 1)
    by_hand = {"TTFT mean (ms)": ttft.mean() * 1e3, "TTFT p50 (ms)": np.percentile(ttft, 50) * 1e3,
               "TTFT p99 (ms)": np.percentile(ttft, 99) * 1e3, "TPOT mean (ms)": tpot.mean() * 1e3,
               "ITL mean (ms)": gaps.mean() * 1e3, "ITL p99 (ms)": np.percentile(gaps, 99) * 1e3,
               "end-to-end mean (ms)": lat.mean() * 1e3, "requests/s": len(ttft) / d["duration"],
               "output tokens/s": out.sum() / d["duration"]}
    for label, want in by_hand.items():
        assert col[label] == pytest.approx(want, rel=1e-3), label


def test_bad_files_are_one_message_each_and_the_good_one_stays():
    good = DATA / "scripted" / "vllm_bench_serve.json"
    raw = (DATA / "scripted" / "guidellm_benchmarks.json").read_text()
    at = upload([_file(good), ("cut.json", raw[: len(raw) // 2].encode(), "application/json"),
                 ("other.json", b'{"hello": "world"}', "application/json"), ("empty.json", b"", "text/plain")],
                **{"size.preset": "Llama-3-8B", "measure.wd": "fp8"})
    got = errors(at)
    assert len(got) == 3
    assert got[0].startswith("cut.json:") and "truncated" in got[0]
    assert got[1].startswith("other.json:") and "not a result file of a known load tester" in got[1]
    assert got[2].startswith("empty.json:") and "empty" in got[2]
    assert list(table(at, "metric").columns) == ["metric", good.name]           # the good file still shown
    assert at.sidebar.selectbox(key="size.preset").value == "Llama-3-8B"         # the pickers keep their values
    assert at.sidebar.selectbox(key="measure.wd").value == "fp8"
    at.selectbox(key="measure.import.tool").set_value("AIPerf").run()           # a tool chosen: the file is checked
    assert any(e.startswith("vllm_bench_serve.json: this is a vllm bench serve result, not AIPerf") for e in errors(at))


def test_predicted_vs_measured_and_the_fit_with_one_run_fits_two_knobs():
    at = upload([_file(DATA / "scripted" / "vllm_bench_serve.json")])
    cmp = table(at, "run")
    assert not errors(at)
    pvm = next(d.value for d in at.dataframe if "predicted (fitted)" in d.value.columns)
    assert list(pvm["metric"]) == ["TTFT mean (ms)", "TPOT mean (ms)", "end-to-end mean (ms)", "output tokens/s"]
    for which in ("defaults", "fitted"):                   # error = predicted / measured − 1, per row
        want = 100 * (pvm[f"predicted ({which})"] / pvm["measured"] - 1)
        assert np.allclose(pvm[f"error ({which}) %"], want)
    assert len(cmp) == 1
    labels = [m.label for m in at.metric]
    assert labels == ["Decode MBU (fitted)", "Prefill MFU (fitted)", "Overhead per step (held)"]
    assert any("One run gives two equations" in i.value and "overhead per step is held" in i.value for i in at.info)


def test_replan_stores_the_fits_efficiency_and_opens_the_planner(scripted, monkeypatch):
    """The page runs alone here (no st.navigation), so st.switch_page is recorded instead of followed; the page
    it names is the planner's file as the app's navigation registers it (ui.nav)."""
    switched = []
    monkeypatch.setattr(st, "switch_page", switched.append)
    metrics = {m.label: m.value for m in scripted.metric}
    assert set(metrics) == {"Decode MBU (fitted)", "Prefill MFU (fitted)", "Overhead per step (fitted)"}
    scripted.button(key="measure.import.replan").click().run()
    assert not scripted.exception
    assert switched == [PLANNER_PAGE] and PLANNER_PAGE in {f.relative for f in page_files()}
    assert PLANNER_PAGE.startswith("pages/42_Capacity_planner")
    stored = scripted.session_state[FITTED_EFFICIENCY_KEY]
    eff = stored["efficiency"]
    assert f"{stored['decode_mbu']:.3f}" == metrics["Decode MBU (fitted)"]       # the fit the page showed
    assert f"{stored['prefill_mfu']:.3f}" == metrics["Prefill MFU (fitted)"]
    assert f"{stored['overhead_ms']:.1f} ms" == metrics["Overhead per step (fitted)"]
    assert (eff["decode_mbu"], eff["prefill_mfu"], eff["decode_mfu"], eff["step_overhead_ms"]) == (
        stored["decode_mbu"], stored["prefill_mfu"], stored["prefill_mfu"], stored["overhead_ms"])
    assert eff["gemm_half_tokens"] == 0 and eff["sequence_overhead_us"] == 0
    assert stored["fitted"] == ["decode_mbu", "prefill_mfu", "overhead_ms"] and stored["runs"] == SCRIPTED
    assert stored["model"] == "TinyLlama-1.1B" and stored["device"] == "A100 SXM 40GB"


def _planner_hook():
    import streamlit as st
    from ui.fitted_efficiency import planner_efficiency
    eff = planner_efficiency()
    st.write(f"efficiency={eff}")


def test_the_planner_hook_returns_the_stored_efficiency_and_can_drop_it():
    from streamlit.testing.v1 import AppTest
    from calculators.sizing.latency import Efficiency
    at = AppTest.from_function(_planner_hook)
    at.session_state[FITTED_EFFICIENCY_KEY] = {
        "efficiency": {"decode_mbu": 0.5, "prefill_mfu": 0.4, "prefill_mbu": 0.8, "decode_mfu": 0.4,
                       "step_overhead_ms": 2.0, "sequence_overhead_us": 0.0, "gemm_half_tokens": 0.0},
        "decode_mbu": 0.5, "prefill_mfu": 0.4, "overhead_ms": 2.0, "runs": ["a.json"], "model": "M", "device": "D",
        "weight_dtype": "bf16"}
    at.run()
    assert at.markdown[0].value == f"efficiency={Efficiency(0.5, 0.4, 0.8, 0.4, 2.0, 0.0, 0.0)}"
    assert "fitted on the Measure-a-server page to a.json (M on D" in at.info[0].value
    at.button[0].click().run()                                      # "Use the stack's defaults instead"
    assert at.markdown[0].value == "efficiency=None" and FITTED_EFFICIENCY_KEY not in at.session_state
    at.session_state[FITTED_EFFICIENCY_KEY] = {"efficiency": {"decode_mbu": 7}}
    at.run()
    assert "not valid" in at.error[0].value and at.markdown[0].value == "efficiency=None"
