"""The project's serving metrics, defined once: what our load generator (server/loadgen.py) measures, what the
measured sweep (calculators/planning/measured_sweep.py) compares with, and what other tools' results are
normalised to (calculators/planning/load_test_import.py).

Per request, on the client's clock (as vLLM's `bench serve` counts them):
    TTFT = first token chunk − request sent
    ITL  = each gap between successive token chunks (one value per gap; a chunk carrying k tokens is one gap)
    TPOT = (last token chunk − first token chunk) / (output tokens − 1)     (first token OUT; requests of ≥ 2 tokens)
    E2E  = last token chunk − request sent
Per run (a level of a sweep):
    requests/s      = completed requests / (last request end − first request sent)
    output tokens/s = output tokens of completed requests / the same span         (output only)
    total tokens/s  = (prompt + output tokens of completed requests) / the same span
    mean batch      = requests/s × mean E2E (Little's law: requests in flight on average)
Means are arithmetic means over requests (TTFT, TPOT, E2E) or over gaps (ITL); percentiles are NumPy's linear
interpolation (`np.percentile`), p50, p90 and p99. Token counts are the server's `usage`.
"""
from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")

METRIC_DEFINITIONS = {
    "ttft": "first token chunk − request sent",
    "tpot": "(last token chunk − first token chunk) / (output tokens − 1), per request: the first token is left out",
    "itl": "each gap between successive token chunks, per gap (a chunk of k tokens is one gap)",
    "e2e": "last token chunk − request sent",
    "requests_per_s": "completed requests / (last request end − first request sent)",
    "output_tok_s": "output tokens of completed requests / (last request end − first request sent)",
    "total_tok_s": "(prompt + output tokens) of completed requests / (last request end − first request sent)",
    "mean_batch": "requests/s × mean end-to-end latency (Little's law)",
}


def stats_ms(values_s) -> dict:
    """{'mean', 'p50', 'p90', 'p99'} in ms of values in seconds (None each when there are none)."""
    v = np.asarray([x for x in values_s if x is not None], dtype=float)
    if not len(v):
        return dict(mean=None, **{f"p{q}": None for q in PERCENTILES})
    return dict(mean=float(v.mean()) * 1e3, **{f"p{q}": float(np.percentile(v, q)) * 1e3 for q in PERCENTILES})


def summarise_requests(sent_s, first_s, last_s, output_tokens, prompt_tokens=None, gaps_s=None) -> dict:
    """Our run metrics from per-request times (seconds, one clock): request sent, first and last token chunk,
    output tokens (and prompt tokens, and each request's chunk gaps when known; without gaps ITL is left None).
    Returns flat keys: ttft_mean_ms, ttft_p50_ms, ..., requests_per_s, output_tok_s, total_tok_s, mean_batch."""
    sent, first, last = (np.asarray(x, dtype=float) for x in (sent_s, first_s, last_s))
    out = np.asarray(output_tokens, dtype=float)
    span = float(last.max() - sent.min()) if len(sent) else 0.0
    tpot = [(b - a) / (n - 1) for a, b, n in zip(first, last, out) if n > 1]
    gaps = None if gaps_s is None else [g for per in gaps_s for g in per]
    row = {}
    for name, vals in (("ttft", first - sent), ("tpot", tpot), ("itl", gaps or []), ("e2e", last - sent)):
        for k, v in stats_ms(vals).items():
            row[f"{name}_{k}_ms"] = v
    n = len(sent)
    row["requests_per_s"] = n / span if span > 0 else None
    row["output_tok_s"] = float(out.sum()) / span if span > 0 else None
    pin = None if prompt_tokens is None else float(np.sum(prompt_tokens))
    row["total_tok_s"] = (pin + float(out.sum())) / span if span > 0 and pin is not None else None
    row["mean_batch"] = little_mean_batch(row["requests_per_s"], row["e2e_mean_ms"])
    return row


def little_mean_batch(requests_per_s: float | None, e2e_mean_ms: float | None) -> float | None:
    """Requests in flight on average: λ × W (Little's law), W the mean end-to-end latency."""
    if requests_per_s is None or e2e_mean_ms is None:
        return None
    return requests_per_s * e2e_mean_ms / 1e3
