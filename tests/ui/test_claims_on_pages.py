"""Issue 35, "Lessons a teacher can project and trust": on each page, the sentence that states a result comes from
the numbers beside it, the class's world is coherent (fp32 for the fp32 engine, an example that fits this
machine, a Parallelism default that runs), and no table or caption shows a raw identifier, `None` or a Python
literal. Each test names the defect it holds."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers_apptest import errors, in_datacentre, page_text, run_script

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def page(stem: str, **state):
    return run_script(str(next((ROOT / "pages").glob(f"{stem}*.py"))), TIMEOUT, **state)


def clean(at):
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    return at


RAW_ID = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\b")          # itl_p99_at_load_ms, output_tok_s


def captions(at) -> list[str]:
    return [c.value for c in at.caption]


# ------------------------------------------------------------------------------------------ Roofline
def test_roofline_opens_on_fp32_in_the_class_world_and_its_sentence_follows_the_points():
    at = clean(page("23_"))
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if any("ridge" in (t.get("name") or "") for t in json.loads(c.proto.spec)["data"]))
    roof = next(t["name"] for t in spec["data"] if t["name"].startswith("roof:"))
    assert roof.endswith("(fp32)")                               # the legend and the weights agree
    assert at.selectbox(key="roof.wd.engine").value == "fp32"
    text = page_text(at)
    assert "decode ops far to the left" not in text              # the intro no longer claims it for every model
    ridge = next(t["x"][0] for t in spec["data"] if t["name"] == "ridge point")
    decode = [x for t in spec["data"] if t["name"].startswith("decode:") for x in t["x"]]
    said = next(m.value for m in at.markdown if "**Decode:**" in m.value).split("**Decode:**")[1]
    assert ("far to the left" in said and "not far" not in said) == (max(decode) * 4 <= ridge)
    assert ("all" in said and "left of the ridge" in said) == (max(decode) < ridge)


# ------------------------------------------------------------------------------------------ Bandwidth floor
def test_bandwidth_floor_opens_on_the_engines_fp32_and_shows_no_none():
    at = clean(page("24_"))
    assert at.selectbox(key="lat.wd.engine").value == "fp32"
    table = next(d for d in at.dataframe if "$ per 1M output tokens" in d.value.columns)
    assert table.value["$ per 1M output tokens"].isna().all()    # this machine has no price ...
    assert all(d.proto.placeholder == "—" for d in at.dataframe)  # ... shown as "—", not "None"


# ------------------------------------------------------------------------------------------ Embeddings
def test_logit_lens_sentence_comes_from_the_lens_and_says_confidence_is_not_correctness():
    at = clean(page("12_Embeddings", choice=None))               # the default model: real text
    lens = next(d.value for d in at.dataframe if "top token" in d.value.columns)
    said = next(m.value for m in at.markdown if "Confidence is not correctness" in m.value)
    assert "Early layers usually guess poorly" not in page_text(at)
    final = lens["top token"].iloc[-1]
    first = len(lens) - 1
    while first > 0 and lens["top token"].iloc[first - 1] == final:
        first -= 1
    last = len(lens) - 1
    assert (f"leads from layer {first} of 0 to {last}" in said if 0 < first < last else
            f"only at the last layer ({last})" in said if first == last else "leads at every layer" in said)
    assert ("forms in the later layers" in said) == (first >= 0.5 * (len(lens) - 1) and first > 0)


# ------------------------------------------------------------------------------------------ Calibration
def test_calibration_defaults_raise_no_warning_in_either_world():
    at = clean(page("43_"))
    assert not [w.value for w in at.warning], [w.value for w in at.warning]
    mbu = next(m.value for m in at.metric if m.label == "Decode MBU (fitted)")
    assert float(mbu) <= 1
    assert any("made for" in c for c in captions(at))
    # the published section sets the closed form and measured kernels side by side, regime by regime
    bar = next(d.value for d in at.dataframe if "measured median %" in d.value.columns)
    assert list(bar["regime"]) == ["maximum throughput", "under a rate", "one request", "a static batch",
                                   "MoE, wide EP", "AMD fallback"]


def test_calibration_draws_the_published_rows_priced_either_way_without_pricing_them_again():
    """The published section reads the predictions bench/bench_published.py committed: by the closed form, and by
    measured kernels where it ran with them. Switching to measured kernels shows their held-out median, the
    file's own figure."""
    from calculators.planning.published import committed_comparison
    import statistics
    at = page("43_")
    radio = next(r for r in at.radio if r.label == "Priced by")
    measured = committed_comparison("measured kernels")
    if measured is None:
        assert radio.options == ["closed form"]
        return
    assert radio.value == "closed form"          # the tests price with the closed form ($INFERENCE_LAB_PROFILE none)
    want = statistics.median(abs(r["error"]) for r in measured["rows"] if r["split"] == "test")
    at = radio.set_value("measured kernels").run()
    shown = next(m.value for m in at.metric if m.label == "Held-out rows: median |error|")
    assert shown == f"{100 * want:.1f}%"
    closed = statistics.median(abs(r["error"]) for r in committed_comparison()["rows"] if r["split"] == "test")
    assert f"{100 * closed:.1f}%" != shown
    at = at.radio(key="published.pricing").set_value("closed form").run()
    assert next(m.value for m in at.metric if m.label == "Held-out rows: median |error|") == f"{100 * closed:.1f}%"


def test_calibration_opens_on_the_pricing_the_planner_uses_here(monkeypatch):
    """Where a profile is installed and nothing asks for the closed form, the planner prices with measured kernels,
    and the Calibration page opens on their errors; else on the closed form's."""
    from calculators.planning.published import committed_comparison
    from specs.profiles import available_profiles
    monkeypatch.setenv("INFERENCE_LAB_PROFILE", "auto")
    radio = next(r for r in page("43_").radio if r.label == "Priced by")
    measured = committed_comparison("measured kernels") is not None and bool(available_profiles())
    assert radio.value == ("measured kernels" if measured else "closed form")


# ------------------------------------------------------------------------------------------ Parallelism
def test_parallelism_default_fits():
    at = clean(page("41_"))
    assert not any("Does NOT fit" in w.value for w in at.warning)
    assert any(s.value.startswith("Fits") for s in at.success)


def test_parallelism_with_zero_gpus_says_so_in_the_main_area():
    at = page("41_", **{"mg.gpus": "0"})
    assert not at.exception
    main = [e.value for e in at.main.error] if hasattr(at, "main") else [e.value for e in at.error]
    assert any("GPUs in the sidebar" in e for e in main), main


# ------------------------------------------------------------------------------------------ Capacity planner
def test_planner_never_says_meets_when_the_plan_cannot_be_checked_and_keeps_its_commands():
    """Llama-3-70B (8,192 tokens) with an 8,000-token p99 prompt: the headline said "It meets every target" over
    a section that could not evaluate the plan, and the launch commands vanished."""
    at = clean(page("42_", **in_datacentre({"size.preset": "Llama-3-70B"}), **{"plan.p99": "8000",
                                                                             "plan.out99": "500"}))
    text = page_text(at)
    assert "meets" not in text.split("Every feasible plan")[0].lower() or "Not checked" in text
    assert "**Not checked at your rate:**" in text and "meets both targets" not in text
    assert re.search(r"\d[\d,]* prompt \+ \d[\d,]* output", text)     # the parts of the p99 request, stated
    assert [c for c in at.get("code") if "--max-model-len" in c.value or "serve" in c.value]


def test_planner_headline_and_section_come_from_one_evaluation():
    at = clean(page("42_", **{"plan.p99": "2000"}))
    head = next(m.value for m in at.markdown if "at your rate" in m.value)
    itl = next(m.value for m in at.metric if m.label == "ITL mean / p99 (ms)")
    mean, p99 = (float(x.replace(",", "")) for x in re.findall(r"[\d,.]+", itl)[:2])
    target = 50.0
    assert ("meets both targets" in head) == (mean <= target)
    section = " ".join(captions(at))
    assert "is for the mean gap" in section and ((f"above {target:g}" in section) == (p99 > target))
    assert "of the ITL target" in head or "of the usable memory" in head or "of its batch cap" in head \
        or "of the TTFT p99 target" in head or "prompt tokens a step may carry" in head
    assert "of this layout's capacity" in head                   # the capacity percentage says what it is of
    said = next(m.value for m in at.markdown if "cheaper here" in m.value)
    prices = [float(x) for x in re.findall(r"\$([\d.]+) ", said)[:2]]
    assert prices[0] <= prices[1]                                # the cheaper one's price comes first


def test_planner_pluralises_and_wraps_its_commands_between_flags():
    at = clean(page("42_"))
    assert "replica(s)" not in page_text(at)
    for code in at.get("code"):
        for line in code.value.splitlines():
            assert line.count(" --") <= 1, line                   # one flag a line: a wrap never splits one


# ------------------------------------------------------------------------------------------ every table
@pytest.mark.parametrize("stem", ["42_", "43_", "33_", "37_", "35_", "26_"])
def test_tables_show_human_headings_not_identifiers(stem):
    at = clean(page(stem))
    for d in at.dataframe:
        config = json.loads(d.proto.columns or "{}")
        drawn = list(d.proto.column_order) or [str(c) for c in d.value.columns]
        for c in drawn:
            label = (config.get(c) or {}).get("label") or c
            assert not RAW_ID.search(label), (stem, c, label)
    for c in captions(at):
        if c.startswith("Also in the CSV:"):
            assert not RAW_ID.search(c), c


# ------------------------------------------------------------------------------------------ numbers as written
def test_prefix_caching_chart_names_the_engines_fp32_on_this_machine():
    at = clean(page("34_"))
    titles = [(json.loads(c.proto.spec)["layout"].get("title") or {}).get("text") or "" for c in at.get("plotly_chart")]
    assert any("(fp32)" in t for t in titles) and not any("fp16" in t for t in titles), titles


def test_continuous_batching_summary_writes_whole_batches_and_separators():
    at = clean(page("32_"))
    table = next(d.value for d in at.dataframe if "metric" in d.value.columns)
    batch = table.set_index("metric").loc["mean batch"]
    assert all(str(v).startswith("≈ ") and str(v)[2:].replace(",", "").isdigit() for v in batch)
    for v in table.drop(columns="metric").to_numpy().ravel():
        assert not re.fullmatch(r"\d{4,}(\.\d+)?", str(v)), v                 # 1699 → 1,700
    static = next(m for m in at.metric if m.label == "Throughput, continuous")
    assert str(static.proto.delta).endswith("tok/s")                           # "static 84.12" had no unit


def test_quantization_metrics_and_log_ticks_are_written_for_a_reader():
    at = clean(page("26_"))
    for m in at.metric:
        digits = re.sub(r"[^\d]", "", str(m.value).split("e")[0]).lstrip("0")
        assert "." not in str(m.value) or len(digits) <= 3, (m.label, m.value)       # 0.007874 → 0.00787
    roof = clean(page("23_"))
    spec = next(json.loads(c.proto.spec) for c in roof.get("plotly_chart"))
    assert spec["layout"]["xaxis"]["tickformat"] == ",~g"                             # 10,000, not 10000


def test_kv_cache_step_zero_shows_its_written_rows():
    """Step 0's 'K/V rows written' bar (the prompt's rows) sat left of x = 0, cut by an axis that stopped at zero."""
    at = clean(page("14_"))
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if any("written" in (t.get("name") or "") for t in json.loads(c.proto.spec)["data"]))
    written = next(t for t in spec["data"] if "written" in t["name"])
    assert written["x"][0] == 0 and written["y"][0] > 1                        # the prompt's rows, at step 0
    assert spec["layout"]["xaxis"].get("rangemode") != "nonnegative"          # so the bar at 0 is drawn whole
    assert any(f"appended {written['y'][0]} rows" in c for c in captions(at))
