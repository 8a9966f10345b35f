"""The Measure-a-server page, driven headless: with no URL it says what to type; against the fake OpenAI server it
runs a 2-level sweep and shows the measured table, the measured-vs-predicted chart and the fit; a wrong model
name and an unreachable URL each give one message, never an exception."""
from __future__ import annotations

from pathlib import Path

from helpers_fake_openai import FakeOpenAIServer, Script
from helpers_apptest import errors, run_script

PAGE = str(next((Path(__file__).resolve().parents[2] / "pages").glob("44_*.py")))
TIMEOUT = 90


def run_button(at):
    return next(b for b in at.button if b.label == "Run the sweep")


def test_without_a_url_the_page_says_what_to_type():
    at = run_script(PAGE, TIMEOUT)
    assert not at.exception and not errors(at)
    assert any("Type the address" in i.value and "python -m engine serve" in i.value for i in at.info)
    assert not [b for b in at.button if b.label == "Run the sweep"]


def test_a_two_level_sweep_shows_a_table_a_chart_and_the_fit():
    with FakeOpenAIServer(Script(ttft_s=0.05, itl_s=0.01)) as srv:
        at = run_script(PAGE, TIMEOUT, **{"measure.url": srv.url, "measure.model": "fake-model",
                                          "measure.requests": "3", "measure.output": "5", "measure.prompt": "20"})
        run_button(at).click().run()
        assert not at.exception and not errors(at)
        measured = at.dataframe[0].value
        assert list(measured["level"]) == [1, 4] and list(measured["completed"]) == [3, 3]
        assert (measured["TTFT p50 (ms)"] >= 50).all() and (measured["output tokens (mean)"] == 5).all()
        assert len(at.get("plotly_chart")) == 1
        assert [m.label for m in at.metric] == ["Decode MBU (fitted)", "Prefill MFU (fitted)",
                                                "Overhead per step (fitted)"]
        at.text_input(key="measure.model").set_value("other-model").run()
        run_button(at).click().run()
        assert not at.exception and any("does not serve a model named 'other-model'" in e for e in errors(at))


def test_an_unreachable_url_is_one_message():
    at = run_script(PAGE, TIMEOUT, **{"measure.url": "http://127.0.0.1:9", "measure.model": "m"})
    run_button(at).click().run()
    assert not at.exception and any(e.startswith("cannot reach") for e in errors(at))
