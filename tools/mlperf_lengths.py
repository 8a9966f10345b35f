"""The MLPerf datasets' length distributions as log-binned histograms (specs/mlperf_lengths.json), for pricing the
MLPerf rows of bench/published_serving.csv at their workloads' lengths instead of their means.

Input: per-sample token counts, one `input_length,output_length` line per sample, as published in
openshift-psap/performance-dashboard (`mlperf-data/summaries/*.csv`, `datasets/summaries/deepseek-r1.csv`; the
files are not copied here). Download them into a folder, then:

    python tools/mlperf_lengths.py FOLDER          # rewrites specs/mlperf_lengths.json

Each marginal (prompt and output lengths) is binned on edges 5% apart in length: a bin keeps its count and its mean
length rounded to a whole token, so the histogram's mean and mean square stay within a fraction of a percent of the
samples' (both are written beside it). The prompt and output columns are kept apart: the serving models take them
as independent. The output column is the dataset's reference answers, not what a submitted system generated:
`published.row_lengths` rescales it to each row's generated tokens per sample.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "specs" / "mlperf_lengths.json"
BIN_RATIO = 1.05
REPO = "openshift-psap/performance-dashboard"
DATASETS = {           # key -> (file, path in REPO, commit, the benchmark's sample count)
    "llama2-70b": ("llama2-70b-99.csv", "mlperf-data/summaries/llama2-70b-99.csv",
                   "7cd1065d1e2c53ee745cbda08e2a8f13a42c93bb", 24576),
    "mixtral-8x7b": ("mixtral-8x7b.csv", "mlperf-data/summaries/mixtral-8x7b.csv",
                     "67033baeaac181a3a35641dd2b86a7cb22d856dd", 15000),
    "llama3.1-405b": ("llama3-1-405b.csv", "mlperf-data/summaries/llama3-1-405b.csv",
                      "739352b63288db5f45ec1c5e5c941000568734a2", 8313),
    "llama3.1-8b": ("llama3-1-8b-datacenter.csv", "mlperf-data/summaries/llama3-1-8b-datacenter.csv",
                    "b04ea53f86b6b9b2c153f143084a7818376e6f0c", 13368),
    "deepseek-r1": ("deepseek-r1.csv", "datasets/summaries/deepseek-r1.csv",
                    "c402a312853dbfd7096e59c4f15a23e14ed43c7c", 4388),
}


def log_bins(lengths: np.ndarray, ratio: float = BIN_RATIO) -> tuple[list[int], list[int]]:
    """(values, counts): the lengths grouped on edges `ratio` apart, each bin's mean rounded to a whole token; a
    bin whose rounded mean lands on its neighbour's value is merged into it."""
    x = np.asarray(lengths, dtype=float)
    edges = ratio ** np.arange(0, math.ceil(math.log(x.max() + 1) / math.log(ratio)) + 2)
    which = np.searchsorted(edges, x, side="right")
    merged: dict[int, list[float]] = {}
    for b in np.unique(which):
        part = x[which == b]
        v = max(1, int(round(part.mean())))
        s = merged.setdefault(v, [0.0, 0.0])
        s[0] += part.sum()
        s[1] += len(part)
    values = sorted(merged)
    return values, [int(merged[v][1]) for v in values]


def stats(x: np.ndarray) -> dict:
    return dict(mean=round(float(x.mean()), 4), mean_square=round(float((x * x).mean()), 2),
                median=float(np.median(x)), p99=float(np.percentile(x, 99)), max=int(x.max()), min=int(x.min()))


def summarise(folder: Path) -> dict:
    out = {}
    for key, (name, path, commit, samples) in DATASETS.items():
        raw = (folder / name).read_bytes()
        data = np.loadtxt(folder / name, delimiter=",", skiprows=1, ndmin=2)
        if len(data) != samples:
            raise SystemExit(f"{name}: {len(data)} samples, the benchmark has {samples}")
        entry = dict(source=f"{REPO} {path} @{commit}", sha256=hashlib.sha256(raw).hexdigest(), samples=samples)
        for col, what in ((0, "prompt"), (1, "output")):
            values, counts = log_bins(data[:, col])
            v, c = np.array(values, dtype=float), np.array(counts, dtype=float)
            entry[what] = dict(values=values, counts=counts, samples=stats(data[:, col]),
                               binned_mean=round(float((v * c).sum() / c.sum()), 4),
                               binned_mean_square=round(float((v * v * c).sum() / c.sum()), 2))
        out[key] = entry
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the folder holding the per-sample CSV files")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    doc = dict(about=("MLPerf Inference datasets' prompt and output lengths (tokens per sample), log-binned "
                      f"({BIN_RATIO:g}x bins, each bin's mean rounded), from per-sample token counts published by "
                      f"{REPO}; written by tools/mlperf_lengths.py. The output lengths are the dataset's reference "
                      "answers; a row is priced with them rescaled to the tokens its system generated per sample."),
               datasets=summarise(args.folder))
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for k, e in doc["datasets"].items():
        print(f"{k}: prompt mean {e['prompt']['samples']['mean']} (binned {e['prompt']['binned_mean']}, "
              f"{len(e['prompt']['values'])} bins), output mean {e['output']['samples']['mean']} "
              f"(binned {e['output']['binned_mean']}, {len(e['output']['values'])} bins)")


if __name__ == "__main__":
    main()
