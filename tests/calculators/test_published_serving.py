"""The published data-centre serving table (bench/published_serving.csv) against the planner's predictions with
each source's stack defaults: the acceptance bands of issue 17, and the table's own coverage rules."""
from urllib.parse import urlparse

import pytest

from calculators.planning.published import compare_all, load_rows, speed_error

ROWS = load_rows()


def test_the_table_covers_data_centre_serving():
    assert len(ROWS) >= 25
    busy = [r for r in ROWS if r["mode"] == "offline" or int(r["concurrency"] or 0) >= 8]
    assert len(busy) >= len(ROWS) / 2
    assert sum(int(r["tp"]) >= 2 or int(r["ep"]) >= 2 for r in ROWS) >= 8
    assert any(r["mode"] == "offline" for r in ROWS)                   # maximum-throughput figures
    for r in ROWS:
        assert urlparse(r["url"]).scheme == "https" and r["settings"] and float(r["published"]) > 0


def test_predictions_are_within_15_percent_at_the_median_and_35_at_worst():
    res = compare_all(ROWS)
    assert res["median_abs_error"] <= 0.15
    assert res["worst_abs_error"] <= 0.35


def test_error_sign_is_speed_whatever_the_unit():
    assert speed_error({"metric": "itl_ms", "published": "20"}, 10.0) == pytest.approx(1.0)     # faster than measured
    assert speed_error({"metric": "output_tok_s", "published": "100"}, 50.0) == pytest.approx(-0.5)
