"""Issue 36's bar on the held-out rows, regime by regime (`published.bar_table`): median <= 8% and worst <= 25%,
judged on test rows only, and a regime with no priced held-out row said to be unjudged, never passed."""
from calculators.planning.published import bar_table


def row(regime, error, split="test", vendor="NVIDIA", ep="1", dp="1"):
    return dict(regime=regime, error=error, split=split, vendor=vendor, ep=ep, dp=dp)


def test_each_regime_is_held_to_both_limits_on_its_test_rows_only():
    rows = [row("max_throughput", 0.05), row("max_throughput", -0.07), row("max_throughput", 0.24),
            row("under_rate", 0.05), row("under_rate", 0.30),                  # worst past 25%
            row("batch1", 0.09), row("batch1", -0.09),                         # median past 8%
            row("static", 0.9, split="fit"),                                  # a fit row is not judged
            row("max_throughput", -0.02, vendor="AMD"), row("batch1", 0.01, vendor="AMD", ep="8", dp="8")]
    got = {b["regime"]: b for b in bar_table(rows)}
    assert got["maximum throughput"]["n"] == 4 and got["maximum throughput"]["meets"] is True
    assert got["maximum throughput"]["worst_abs_error"] == 0.24
    assert got["under a rate"]["meets"] is False and got["one request"]["meets"] is False
    assert got["a static batch"] == dict(regime="a static batch", n=0, median_abs_error=None, worst_abs_error=None,
                                         meets=None)
    assert got["MoE, wide EP"]["n"] == 1 and got["MoE, wide EP"]["meets"] is True
    assert got["AMD fallback"]["n"] == 2 and got["AMD fallback"]["median_abs_error"] == (0.02 + 0.01) / 2
