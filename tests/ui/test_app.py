"""The Streamlit app, driven headless with AppTest: the home page, the model picker, the generation box.

Tests pick a model the way the picker keeps it: by presetting its selectbox key (`ui.model_picker.CHOICE_KEY`)
in st.session_state before the first run. Random weights of SmolLM2-135M (0.5 GB, ~1 s to make) stand in for a
real model wherever text quality does not matter.
"""
from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.model_picker import (ACTIVE_KEY, CHOICE_KEY, DEFAULT_CHOICE, GEMMA3_CHOICE, LOCAL_CHOICE, PATH_KEY, choices,
                             random_choice, source_for)
from helpers_apptest import SMALL_RANDOM, errors, run_script

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 60


def home(choice: str = SMALL_RANDOM, **state) -> AppTest:
    return run_script(APP, TIMEOUT, choice, **state)


def generate(at: AppTest, max_new_tokens: int = 4) -> AppTest:
    at.text_input(key="gen.max_new_tokens").set_value(str(max_new_tokens))
    return at.button(key="generate").click().run()


def token_table(at: AppTest):
    """Open the generated tokens' table (drawn on demand) -> (the rerun, its table)."""
    at = at.toggle(key="gen.show_tokens").set_value(True).run()
    return at, at.dataframe[0].value


# ------------------------------------------------------------------------------------------ picker entries
def test_picker_lists_default_runnable_presets_as_random_local_path_and_repo():
    opts = choices()
    assert opts[0] == DEFAULT_CHOICE
    randoms = [o for o in opts if o.startswith("Random weights: ")]
    assert randoms[:3] == [SMALL_RANDOM, random_choice("Gemma-3-270M"),           # smallest first; Gemma 3
                           random_choice("TinyLlama-1.1B")]                      # runs too (a second family)
    assert opts[1] == GEMMA3_CHOICE and source_for(GEMMA3_CHOICE) == "gemma3"
    assert random_choice("Llama-2-7B") in randoms
    assert random_choice("DeepSeek-V3") not in randoms                        # MLA + MoE: calculators only
    assert LOCAL_CHOICE in opts and opts[-1] == "Hugging Face repo id"


def test_source_for_each_entry():
    assert source_for(DEFAULT_CHOICE) == "smollm2"
    assert source_for(SMALL_RANDOM) == "random:SmolLM2-135M-Instruct"
    assert source_for(LOCAL_CHOICE, path="  ") is None
    assert source_for("Hugging Face repo id", repo=" TinyLlama/TinyLlama-1.1B-Chat-v1.0 ") == \
        "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


# ------------------------------------------------------------------------------------------ home page
def test_home_page_runs_with_default_model(app_default_model):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert not errors(at)
    assert at.title[0].value
    assert any("SmolLM2" in m.value for m in at.sidebar.markdown)
    assert at.checkbox[0].value is True                       # SmolLM2-Instruct has a chat template
    at = generate(at, 3)
    assert not at.exception and not errors(at)
    assert [m.label for m in at.metric] == ["TTFT (ms)", "Mean ITL (ms)", "Tokens/s", "KV cache (MiB)"]


def test_random_model_is_labelled_and_generates_tokens():
    at = home()
    assert not at.exception
    assert at.session_state[ACTIVE_KEY] == "random:SmolLM2-135M-Instruct"
    assert any("(random weights)" in m.value for m in at.sidebar.markdown)
    assert at.text_area(key="prompt").value == "Write a story"
    at = generate(at, 4)
    assert not at.exception and not errors(at)
    assert not at.dataframe and not at.get("download_button")   # the table is drawn when asked for
    reply = [m.value for m in at.markdown if m.value.startswith("**Reply**")]
    at, table = token_table(at)
    assert not at.exception and [m.value for m in at.markdown if m.value.startswith("**Reply**")] == reply
    assert list(table.columns) == ["step", "token id", "piece", "latency (ms)"]
    assert list(table["step"]) == [0, 1, 2, 3]
    assert (table["latency (ms)"] > 0).all()
    assert at.get("download_button")                         # every table comes with its CSV
    assert any("(random weights)" in m.value for m in at.markdown if m.value.startswith("**Reply**"))


def sidebar_drawn(node, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], str, str]]:
    """What the sidebar draws, element by element: (delta path, type, label or text); empty slots left out (they
    draw nothing)."""
    out = []
    for i, child in sorted(getattr(node, "children", {}).items()):
        if child.type == "empty":
            continue
        text = getattr(child, "label", None) or str(getattr(child, "value", "") or "")
        out += [(path + (i,), child.type, text[:40])] + sidebar_drawn(child, path + (i,))
    return out


def test_sidebar_keeps_its_places_in_the_run_that_streams_a_reply(monkeypatch):
    """Issue 18, "a greyed duplicate model card in the sidebar while streaming": Streamlit keeps the previous run's
    element at a place the rerun has not reached yet, greyed. The run that loads the model drew its progress bar and
    place in line above the card, so in the next run (Generate pressed) the card came two places earlier and the old
    one stayed greyed below it for the whole reply. Every run must draw the sidebar at the same places."""
    picker = importlib.import_module("ui.model_picker")     # (`ui.model_picker` names the function there)
    fresh = picker.SharedModels()                             # no model loaded yet: this session's first run loads
    monkeypatch.setattr(picker, "shared_models", lambda: fresh)
    at = home()
    assert fresh.sources() == ["random:SmolLM2-135M-Instruct"]
    loading = sidebar_drawn(at.sidebar)
    assert any("(random weights)" in text for _, _, text in loading)          # the card is there
    at = generate(at, 2)
    assert not at.exception and any(c.value.startswith("2 tokens after") for c in at.caption)
    assert sidebar_drawn(at.sidebar) == loading


def test_empty_prompt_shows_error_and_generates_nothing():
    at = home()
    at.text_area(key="prompt").input("   ")
    at = at.button(key="generate").click().run()
    assert not at.exception
    assert any("prompt is empty" in e for e in errors(at))
    assert not at.dataframe


def test_prompt_longer_than_context_shows_error_and_keeps_the_prompt():
    at = home()
    long_prompt = "hello " * 9000                            # > 8,192 tokens, SmolLM2's context window
    at.text_area(key="prompt").input(long_prompt)
    at = at.button(key="generate").click().run()
    assert not at.exception
    assert any("context window" in e for e in errors(at))
    assert at.text_area(key="prompt").value == long_prompt


def test_bad_number_shows_error_and_disables_generate():
    at = home()
    at.text_input(key="gen.top_p").set_value("1.5")
    at = at.run()
    assert not at.exception
    assert any("Top-p must be between" in e for e in errors(at))
    assert at.button(key="generate").disabled


def test_bad_local_path_shows_error_and_keeps_the_loaded_model():
    at = home()
    at.sidebar.selectbox(key=CHOICE_KEY).select(LOCAL_CHOICE)
    at = at.run()
    at.sidebar.text_input(key=PATH_KEY).input("/no/such/model.gguf")
    at = at.run()
    assert not at.exception
    assert any("does not exist" in e for e in errors(at))
    assert at.session_state[ACTIVE_KEY] == "random:SmolLM2-135M-Instruct"     # nothing the user had is lost
    assert any("Still using" in c.value for c in at.sidebar.caption)
    at = generate(at, 2)                                     # and it still generates
    assert not at.exception and len(token_table(at)[1]) == 2


def test_bad_path_as_first_model_shows_error_no_exception():
    at = home(LOCAL_CHOICE, **{PATH_KEY: "/no/such/folder"})
    assert not at.exception
    assert errors(at)
    assert any("Pick a model" in i.value for i in at.info)


def test_random_model_too_big_for_memory_is_refused_before_allocating():
    at = home(random_choice("Llama-3.1-405B"))                # 1.6 TB of float32
    assert not at.exception
    assert any("of memory is free" in e for e in errors(at))
    assert ACTIVE_KEY not in at.session_state


# ------------------------------------------------------------------------------------------ pages
def test_home_links_every_page_file(tmp_path):
    """A copy of the app with two page files: the home page links both, labelled as Streamlit labels them."""
    shutil.copy(APP, tmp_path / "app.py")
    (tmp_path / "pages").mkdir()
    for name in ("21_First_lesson.py", "32_KV_cache.py"):
        (tmp_path / "pages" / name).write_text("import streamlit as st\nst.write('page')\n")
    at = AppTest.from_file(str(tmp_path / "app.py"), default_timeout=TIMEOUT)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at = at.run()
    assert not at.exception
    labels = [link.label for link in at.get("page_link")]
    assert labels == ["First lesson", "KV cache"]


# (every page file runs once with its defaults in tests/ui/test_pages.py::test_page_runs_with_defaults...)


def test_model_choice_survives_a_page_switch(tmp_path):
    """Streamlit drops widget state on a page that does not draw the widget; the picker keeps its choice anyway."""
    shutil.copy(APP, tmp_path / "app.py")
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "21_Lesson.py").write_text(
        "import streamlit as st\nfrom ui import model_picker\nm = model_picker()\nst.write(m.name if m else 'none')\n")
    at = AppTest.from_file(str(tmp_path / "app.py"), default_timeout=TIMEOUT).run()
    at.sidebar.selectbox(key=CHOICE_KEY).select(SMALL_RANDOM)
    at = at.run()
    at.switch_page("pages/21_Lesson.py")
    at = at.run()
    assert not at.exception
    assert at.sidebar.selectbox(key=CHOICE_KEY).value == SMALL_RANDOM
    assert at.main.markdown[-1].value == "SmolLM2-135M-Instruct (random weights)"
    at.switch_page("app.py")
    at = at.run()
    assert at.sidebar.selectbox(key=CHOICE_KEY).value == SMALL_RANDOM


def test_a_session_keeps_its_pages_and_still_moves_between_them(tmp_path):
    """The lesson pages are built once per session (each resolves its path on disk), then reused by every rerun:
    moving to a lesson, back home and to the lesson again must still run the right page each time, and a lesson
    file added meanwhile gets its page."""
    shutil.copy(APP, tmp_path / "app.py")
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "21_First_lesson.py").write_text("import streamlit as st\nst.write('first lesson')\n")
    at = AppTest.from_file(str(tmp_path / "app.py"), default_timeout=TIMEOUT)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at = at.run()
    built = at.session_state["_app.lesson_pages"][1]
    for _ in range(2):
        at.switch_page("pages/21_First_lesson.py").run()
        assert not at.exception and [m.value for m in at.markdown] == ["first lesson"]
        at.switch_page("app.py").run()
        assert not at.exception and at.get("page_link")
    assert at.session_state["_app.lesson_pages"][1] is built                  # the same objects all along
    (tmp_path / "pages" / "32_KV_cache.py").write_text("import streamlit as st\nst.write('kv cache')\n")
    os.utime(tmp_path / "pages", ns=(1, (tmp_path / "pages").stat().st_mtime_ns + 10**9))
    at = at.run()
    assert [link.label for link in at.get("page_link")] == ["First lesson", "KV cache"]
    at.switch_page("pages/32_KV_cache.py").run()
    assert not at.exception and [m.value for m in at.markdown] == ["kv cache"]


def test_a_long_prompt_says_its_predicted_wait_before_generate_and_a_short_one_does_not(monkeypatch):
    """A 20,000-character prompt ran 22 s to its first token with no word that it would: the home page now says
    the calculators' prefill time on this machine as measured (here a stand-in machine of 50 GFLOP/s FP32)."""
    import dataclasses

    import ui.machine
    from specs.devices import load_device
    slow = dataclasses.replace(load_device("H100 SXM"), peak_flops={"fp32": 50e9}, peak_flops_sparse={})
    monkeypatch.setattr(ui.machine, "measured_machine", lambda quick=False: slow)
    at = home(**{"prompt": "The lighthouse keeper wrote every evening in a thick notebook. " * 320})
    assert not at.exception and not errors(at)
    said = [i.value for i in at.info if "This prompt is" in i.value]
    assert len(said) == 1 and "before the first word" in said[0] and "50 GFLOP/s" in said[0], said
    at = home(**{"prompt": "Write a story"})
    assert not [i.value for i in at.info if "This prompt is" in i.value]
