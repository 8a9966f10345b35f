"""Workloads measured from real datasets: the MLPerf Inference datasets' prompt and answer lengths
(specs/mlperf_lengths.json, log-binned per-sample token counts with their source and commit; tools/mlperf_lengths.py
writes it). Raw histograms here; `calculators.serving.lengths` turns them into length distributions."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from specs.model_config import SpecError

MLPERF_LENGTHS = Path(__file__).with_name("mlperf_lengths.json")


@functools.lru_cache(maxsize=1)
def mlperf_length_datasets() -> dict:
    """Each MLPerf dataset's histograms: {key: {source, sha256, samples, prompt: {values, counts, samples,
    binned_mean, ...}, output: {...}}}."""
    return json.loads(MLPERF_LENGTHS.read_text(encoding="utf-8"))["datasets"]


def mlperf_dataset(key: str) -> dict:
    """One dataset's histograms, or a SpecError naming the datasets there are."""
    d = mlperf_length_datasets()
    if key not in d:
        raise SpecError(f"no MLPerf length distribution {key!r}: {', '.join(d)}")
    return d[key]
