"""The Batching page on its defaults, this class's machine (issue 35): fp32 titles for the fp32 engine, whole
batches in prose and metrics, a measured default that batches enough streams to show the lesson, the ceiling beside
the measurement, and its sentences from the numbers shown (their conditions: tests/ui/test_batching_claims.py)."""
from __future__ import annotations

import re
from pathlib import Path

from helpers_apptest import chart_specs, errors, page_text, run_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "pages" / "31_Batching.py")
FRACTIONAL_BATCH = re.compile(r"batch \**\d[\d,]*\.\d")


def titles(at) -> list[str]:
    return [s.get("layout", {}).get("title", {}).get("text", "") for s in chart_specs(at)]


def test_defaults_show_fp32_and_whole_batches_on_this_machine():
    at = run_script(PAGE, 180)
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert titles(at) and not any("fp16" in t for t in titles(at)) and "(fp32)" in titles(at)[0], titles(at)
    metrics = {m.label: m.value for m in at.metric}
    for label in ("KV read ≥ weight read from batch", "Compute-bound from batch"):
        assert re.fullmatch(r"never|\d[\d,]*", metrics[label]), metrics
    text = page_text(at)
    assert not FRACTIONAL_BATCH.search(text), FRACTIONAL_BATCH.search(text)
    assert "climbs almost in proportion" not in text            # the intro states no result; the curve's words do
    legends = [t.get("name", "") for s in chart_specs(at) for t in s.get("data", [])]
    assert not any(FRACTIONAL_BATCH.search(n) for n in legends), legends
    # the measured default: enough streams that the weight read is shared by many
    assert int(at.text_input(key="batching.streams").value) >= 8
    assert int(at.text_input(key="batching.new").value) >= 8


def test_measurement_shows_the_ceiling_beside_the_gain_with_an_fp32_title():
    at = run_script(PAGE, 180)
    for k, v in {"batching.streams": "2", "batching.new": "2", "batching.plen": "3"}.items():
        at.text_input(key=k).set_value(v)
    at.run()
    at.button(key="batching.measure").click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    measured = titles(at)[-1]
    assert "(fp32)" in measured and "fp16" not in measured
    metrics = {m.label: m.value for m in at.metric}
    assert "Ceiling, 2 rows (× one row)" in metrics and "Scheduler, 2 streams (× one stream)" in metrics
    assert "Share of the ceiling" in metrics and metrics["Scheduler, 2 streams (× one stream)"].endswith("×")
    df = next(d.value for d in at.dataframe if "share" in d.value.columns)
    assert metrics["Share of the ceiling"] == f"{df['share'].iloc[-1]:.0%}"
    traces = [t.get("name", "") for t in chart_specs(at)[-1]["data"]]
    assert any("weight products alone" in n for n in traces)
