"""Classroom fixes: number fields that say what was wrong, sources a reader can open, the large-text switch, and
the sizing preset that no longer flips between pages (walked page by page in one AppTest session)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specs.sources import DETAILS_003, readable_source, section_numbers
from ui.charts import LARGE_FONT_PX, LARGE_TEXT_KEY
from ui.model_picker import CHOICE_KEY
from ui.model_source import PRESET_KEY
from ui.world import CLASS
from ui.nav import page_files
from ui.widgets import parse_number
from helpers_apptest import SMALL_RANDOM, errors

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
REFERENCE_003 = Path("/work/shared/reference/003_5263b1745ba7a8d4.txt")


# ------------------------------------------------------------------------------------------ number fields
@pytest.mark.parametrize("text, integer, value", [
    ("64", True, 64), (" 2,048 ", True, 2048), ("1e9", True, 10 ** 9), ("0.7", False, 0.7), ("1e-5", False, 1e-5),
    ("12345678901234567890", True, 12345678901234567890),      # exact beyond float precision
])
def test_parse_number_reads_numbers(text, integer, value):
    assert parse_number("X", text, integer) == (value, None)


@pytest.mark.parametrize("text, integer, says", [
    ("abc", True, "'abc' is not a number"), ("", False, "empty"), ("2.5", True, "whole number"),
    ("1e400", False, "too large"), ("nan", False, "not a number"), ("1,2", True, "not a number"),
])
def test_parse_number_says_what_is_wrong(text, integer, says):
    value, problem = parse_number("X", text, integer)
    assert value is None and says in problem


@pytest.mark.parametrize("key, text, says", [
    ("gen.max_new_tokens", "abc", "Max new tokens: 'abc' is not a number"),
    ("gen.max_new_tokens", "1e9", "got 1,000,000,000"),                      # not silently 1
    ("gen.max_new_tokens", "2.5", "Max new tokens must be a whole number"),  # not silently 2
    ("gen.temperature", "1e400", "Temperature: '1e400' is too large"),       # not silently 0
])
def test_home_number_fields_say_what_was_wrong_and_keep_the_text(key, text, says):
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at.run()
    at.text_input(key=key).set_value(text)
    at.run()
    assert not at.exception
    assert any(says in e for e in errors(at)), errors(at)
    assert at.text_input(key=key).value == text                              # what the user typed stays
    assert at.button(key="generate").disabled


# ------------------------------------------------------------------------------------------ sources
def test_readable_source_names_title_and_section():
    text = readable_source("003 Detail 18 (scales per group); reference 000 shapes; 1,000 tokens")
    assert "LLM Inference: From Black Box to Production" in text and "Detail 18: Quantization" in text
    assert "Transformer Architecture" in text and "1,000 tokens" in text and "003" not in text
    assert section_numbers("11-13 and 21") == ["11", "12", "13", "21"]


@pytest.mark.skipif(not REFERENCE_003.exists(), reason="reference text not on this machine")
def test_section_names_are_the_main_texts_headings():
    headings = dict(re.findall(r"^Detail (\w+): (.+)$", REFERENCE_003.read_text(), re.M))
    assert {k: headings[k].strip() for k in DETAILS_003} == DETAILS_003


# ------------------------------------------------------------------------------------------ walking every page
def test_walking_every_page_keeps_the_first_preset_and_the_large_text_choice():
    """The bug: on first navigation the sizing pages' preset flipped between TinyLlama-1.1B and DeepSeek-V2 on every
    page switch. Walk every page in order twice; the preset never changes, no page raises."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at.run()
    at.sidebar.toggle(key=LARGE_TEXT_KEY).set_value(True)
    at.run()
    seen, charts = [], []
    for _ in range(2):
        for f in page_files():
            at.switch_page(f.relative)
            at.run()
            assert not at.exception, (f.relative, at.exception)
            if PRESET_KEY in at.session_state:
                seen.append(at.session_state[PRESET_KEY])
            assert at.sidebar.toggle(key=LARGE_TEXT_KEY).value is True, f.relative
            charts += [(f.relative, json.loads(c.proto.spec)["layout"]) for c in at.get("plotly_chart")]
    assert len(seen) >= 6 and set(seen) == {CLASS.preset}, seen
    # every chart drawn, on every page, has the projector font (the switch once reached only the Inside pages)
    pages_with_charts = {page for page, _ in charts}
    assert len(pages_with_charts) >= 15, sorted(pages_with_charts)
    small = sorted({page for page, layout in charts if layout.get("font", {}).get("size", 0) < LARGE_FONT_PX})
    assert not small, f"charts without the large font on: {small}"


# ------------------------------------------------------------------------------------------ home: Stop and progress
def _stop_script(folder: str, stop_after: int) -> None:
    import threading

    from engine import load_model
    from ui.generation import GenerationResult, _stream_reply, show_result

    class StopAfter(threading.Event):
        """Reads as set from its (stop_after + 1)-th check on: as if Stop were clicked mid-run."""
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n, self.checks = n, 0

        def is_set(self) -> bool:
            self.checks += 1
            return self.checks > self.n

    model = load_model(folder)
    ids = [5, 17, 42, 99, 3, 250, 8, 61, 7, 12]
    result = GenerationResult(model_source=model.source, model_name=model.name, prompt_tokens=len(ids))
    stop = StopAfter(stop_after)

    class EngineStream:
        """What `ui.server.generate` returns, over the engine alone (the worker's own stop is tested in
        test_worker): iterating yields the tokens; on_progress / on_wait / load_note are the stream's hooks."""
        on_progress = on_wait = None

        def __iter__(self):
            return iter(model.generate(ids, max_new_tokens=50, stop=stop, on_progress=self.on_progress))

        def load_note(self) -> str:
            return ""

    _stream_reply(model, ids, EngineStream(), result, stop=stop)
    show_result(result, model)


def test_stop_ends_the_reply_early_and_keeps_what_was_generated(tmp_path):
    from helpers_checkpoints import tiny_config, write_hf_checkpoint
    write_hf_checkpoint(tmp_path, tiny_config(), seed=1)
    # the engine checks the stop event once after the (single-chunk) prefill, then once per token: set at the
    # 4th check, the run ends with its 3rd token
    at = AppTest.from_function(_stop_script, args=(str(tmp_path), 3), default_timeout=60).run()
    assert not at.exception, at.exception
    assert any("3 tokens after a 10-token prompt · stopped with the Stop button" in c.value for c in at.caption)
    assert not [b for b in at.button if b.label == "Stop"]                 # the button goes once the run ends


def test_progress_text_counts_prefill_chunks_then_tokens():
    from ui.generation import PREFILL_CHUNK, progress_text
    chunks = -(-4475 // PREFILL_CHUNK)                                      # the 4,475-token prompt of issue 6
    done = [min((i + 1) * PREFILL_CHUNK, 4475) for i in range(chunks)]
    texts = [progress_text(d, 4475, "prefill") for d in done]
    assert texts[0] == (256 / 4475, "Prefill: 256 of 4,475 prompt tokens read") and texts[-1][0] == 1.0
    assert len(texts) == 18                                                 # 17 full chunks of 256 + 123 tokens
    assert progress_text(3, 64, "decode")[1] == "Decode: 3 of at most 64 new tokens"


def test_formula_expanders_cite_titles_and_sections_not_codes():
    at = AppTest.from_file(str(ROOT / "pages" / "21_Model_anatomy.py"), default_timeout=60)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at.run()
    assert not at.exception, at.exception
    shown = " ".join(m.value for e in at.expander for m in e.markdown)
    assert "LLM Inference: From Black Box to Production" in shown and "Detail 8: Feed-Forward Network (FFN)" in shown
    assert not re.search(r"\b003 Details? \d", shown), "a short reference code reached the screen"
