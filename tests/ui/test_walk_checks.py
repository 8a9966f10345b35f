"""The browser walk's rules (tools/walk_checks.py) on small fixtures: each flags what a projector must not show,
and lets the ordinary text through. They run in the default suite; the walk that feeds them a real page is opt-in
(WALKTHROUGH=1, tests/ui/test_walkthrough_browser.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.walk_checks import (fold_problems, lesson_plan_paths, lesson_plan_titles, metric_problems,
                               sidebar_problems, text_problems)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, kind", [
    ("ITL p50: itl_p50_ms", "raw identifier"),
    ("Model being served /root/.venv/lib/python3.11/site-packages/inference_lab_models/smollm2.gguf", "file path"),
    ("Model being served C:\\models\\smollm2.gguf", "file path"),
    ("bound: None", "None shown"),
    ("{'batch': 4, 'ms': 3}", "Python repr"),
    ("['prefill', 'decode']", "Python repr"),
    ("[1, 2, 4]", "Python repr"),
    ("np.float64(3.5) tokens/s", "Python repr"),
    ("{len(front)} Pareto plans", "Python repr"),
    ("the cache holds 1699 tokens", "number without thousands separators"),
    ("TTFT 22050 ms", "number without thousands separators"),
])
def test_each_thing_a_class_should_not_read_is_flagged(text, kind):
    assert any(p.startswith(kind) for p in text_problems(text)), text_problems(text)


@pytest.mark.parametrize("text", [
    "the cache holds 1,699 tokens at 46,080 bytes a token",
    "1366×768, measured 27 Nov 2026 (2024) and in 2023.",
    "Open http://192.168.1.5:8501/Class or https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
    "token id 4093, port 8501, an RTX 4090, arXiv 2205.14135, 0.0001 s, 1234.5",
    'measured 2026-11-29 05:22 on glibc2.36; "Efficient Streaming Language Models with Attention Sinks", 2023, arXiv (Kurtic et al. 2024)',
    "INT8 keeps integers in [-128, 127]; a probability in [0, 1]",
    "46 KB per token · tokens/s/GPU · GB/s · Llama-3.1-70B on an H100 SXM · fp16",
    "TTFT p50 is 120 ms; None of the requests waited",
])
def test_ordinary_lesson_text_passes(text):
    if "None of" in text:                       # a sentence starting "None" is English, but reads like a repr:
        assert text_problems(text) == [f"None shown: {text!r}"]   # flagged, the page should say "No request"
        return
    assert text_problems(text) == []


def test_a_metric_value_on_two_or_three_lines_is_flagged_and_one_line_is_not():
    boxes = [{"text": "32.5 tokens/s", "height": 90, "line_px": 45},
             {"text": "20.4 tokens/ s", "height": 135, "line_px": 45},
             {"text": "64.9", "height": 45, "line_px": 45}]
    assert metric_problems(boxes) == ["metric value wraps onto 2 lines: '32.5 tokens/s'",
                                      "metric value wraps onto 3 lines: '20.4 tokens/ s'"]


def test_a_chart_below_the_fold_or_next_off_screen_is_flagged():
    today = {"heading_top": 654, "chart_top": 822, "next_top": 600, "next_bottom": 640}
    assert fold_problems(today) == ["key chart starts at 822 px, below the first screen (768 px); heading at 654 px"]
    assert fold_problems({"chart_top": 420, "next_top": 800, "next_bottom": 840}) == \
        ["Next button at 800-840 px, off the first screen with the chart"]
    assert fold_problems({"chart_top": 420, "next_top": -50, "next_bottom": -10}) != []
    assert fold_problems({"heading_top": 200, "chart_top": 420, "next_top": 150, "next_bottom": 190}) == []
    assert fold_problems({"chart_top": None, "next_top": None, "next_bottom": None}) == []
    assert fold_problems({"chart_top": 900, "key": "metric", "next_top": None, "next_bottom": None}) == \
        ["key metric starts at 900 px, below the first screen (768 px)"]


def test_lesson_plan_pages_hidden_in_the_sidebar_are_flagged():
    assert sidebar_problems({"/Batching": False, "/Class": True}, ["/Batching", "/Class"]) == \
        ['sidebar hides /Batching (behind "View more" or missing)']
    assert sidebar_problems({}, ["/Capacity_planner"]) != []


def test_the_readmes_two_lesson_plans_name_pages_the_app_has():
    readme = (ROOT / "README.md").read_text()
    titles = lesson_plan_titles(readme)
    assert titles[:2] == ["Home", "Walkthrough"] and {"Batching", "Class", "Capacity planner"} <= set(titles)
    assert "as above" not in " ".join(titles)
    paths = lesson_plan_paths(readme, ROOT / "pages")
    assert paths[0] == "/" and "/Batching" in paths and "/Capacity_planner" in paths and len(paths) == len(titles)


def test_lesson_plan_titles_split_cells_and_stop_at_the_tables_end():
    readme = ("**45 minutes: x**\n\n| min | page | what |\n|---:|---|---|\n| 0-5 | Home | a |\n"
              "| 5-9 | Tokens · Sampling | b |\n\nPages not on either path (Roofline)\n| x | Roofline | c |\n")
    assert lesson_plan_titles(readme) == ["Home", "Tokens", "Sampling"]
