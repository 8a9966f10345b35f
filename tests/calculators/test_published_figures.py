"""The calculators against published measurements (bench/published_measurements.csv, docs/measurements.md table).

Expected values are the published figures (llama-bench tables, NVIDIA NIM's benchmark page), each with its source
URL and settings in the CSV; the calculators supply only the predictions. Two checks per row:
- the roof: no published figure beats the ideal prediction (datasheet bandwidth / peak FLOP/s). A byte or FLOP
  formula that undercounts by 2x, or a datasheet number typed 10x too high, fails it;
- the documented band: |predicted speed / published speed − 1| with the default efficiencies stays within the
  row's `error_band_pct` (docs/measurements.md says why each band is what it is); rows without a band are the ones the
  same file lists as outside what the closed-form model represents (batch-1 launch overheads)."""
import importlib.util
from pathlib import Path

import pytest

from calculators.sizing.latency import Efficiency

_PATH = Path(__file__).resolve().parents[2] / "bench" / "bench_published.py"
_spec = importlib.util.spec_from_file_location("bench_published", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

ROWS = bench.load_rows()
IDS = [f"{r['device']}-{r['model']}-{r['weights']}-{r['phase']}-{r['prompt_tokens']}" for r in ROWS]


def test_every_row_names_its_source_and_settings():
    assert len(ROWS) >= 20
    assert len(set(IDS)) == len(IDS)                      # no figure entered twice
    for r in ROWS:
        assert r["url"].startswith("https://") and r["settings"] and float(r["published"]) > 0


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_no_published_figure_beats_the_ideal_roof(row):
    x = bench.compare(row)
    # published / ideal is the achieved fraction of the datasheet roof; the highest in the table is 0.89
    # (M3 Max F16 decode). Q4_K_M is modelled at 4.5 bits/weight while the files hold about 4.9, which makes the
    # ideal about 8% too fast, never too slow, so no slack is needed on this side.
    assert 0 < x["of_ideal"] <= 1.0


@pytest.mark.parametrize("row", [r for r in ROWS if bench.error_band(r) is not None],
                         ids=[i for i, r in zip(IDS, ROWS) if bench.error_band(r) is not None])
def test_realistic_prediction_within_the_documented_band(row):
    x = bench.compare(row, Efficiency())
    assert abs(x["error"]) <= bench.error_band(row)


def test_speed_error_sign_is_the_same_for_rates_and_times():
    # A prediction twice as fast as published is +100% whether the figure is tokens/s or milliseconds.
    rate = dict(metric="tok_s", published="50")
    time = dict(metric="itl_ms", published="20")
    assert bench.speed_ratio(rate, 100.0) == pytest.approx(2.0)
    assert bench.speed_ratio(time, 10.0) == pytest.approx(2.0)
