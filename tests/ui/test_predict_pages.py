"""Predict, then measure, page by page (issue 28), in classroom mode: the teacher asks from the Class page, two
students answer on the Roofline page from their own sessions (two AppTest instances), each sees only their own
answer until the teacher reveals; a student's browser has no teacher controls and the store refuses them anyway;
a non-number answer and a reveal with no answer say so and lose nothing.

AppTest gives every instance the same Streamlit session id, so `ui.server.session_id` is read here from each
instance's own session state (the store keys answers by whatever that function returns)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from engine.errors import ModelError
from helpers_apptest import SMALL_RANDOM, errors, page_text

ROOT = Path(__file__).resolve().parents[2]
ROOFLINE, BATCHING, CLASS, KV = (str(ROOT / "pages" / p) for p in ("23_Roofline.py", "31_Batching.py", "51_Class.py",
                                                                    "14_KV_cache_step_by_step.py"))
KEY = "the teacher's long phrase"
BOUND, SPEEDUP = "prefill.decode_bound_2000", "batching.speedup_8"
SID = "_test.session_id"


@pytest.fixture()
def classroom(monkeypatch):
    import ui.server
    from ui.predict import prediction_store
    monkeypatch.setenv("INFERENCE_LAB_CLASSROOM", "1")
    monkeypatch.setenv("INFERENCE_LAB_TEACHER_KEY", KEY)
    monkeypatch.setattr(ui.server, "session_id", lambda: st.session_state.get(SID, "test session id"))
    ui.server.teachers.reset()
    prediction_store.reset()
    ui.server.teachers().unlock("teacher", KEY)
    yield prediction_store()
    prediction_store.reset()
    ui.server.teachers.reset()


def session(path: str, sid: str, timeout: float = 120) -> AppTest:
    at = AppTest.from_file(path, default_timeout=timeout)
    at.session_state[SID] = sid
    return at.run()


def buttons(at: AppTest) -> dict[str, object]:
    return {b.key: b for b in at.button if b.key}


def test_two_students_answer_in_their_own_sessions_and_see_the_spread_only_after_the_reveal(classroom):
    student_a, student_b = session(ROOFLINE, "student-a"), session(ROOFLINE, "student-b")
    assert not student_a.exception and f"predict.{BOUND}.answer" not in {r.key for r in student_a.radio}  # not asked yet
    teacher = session(CLASS, "teacher")
    assert not teacher.exception, teacher.exception
    assert "Predictions" in [s.value for s in teacher.subheader]
    buttons(teacher)[f"predict.{BOUND}.class.open"].click().run()
    assert classroom.state(BOUND) == "open"
    # a reveal with no answer: a message on the teacher's page, the question stays open
    buttons(teacher)[f"predict.{BOUND}.class.reveal"].click().run()
    assert any("Nobody has answered yet" in e for e in errors(teacher)) and not teacher.exception
    assert classroom.state(BOUND) == "open"
    for at, pick in ((student_a, "compute"), (student_b, "memory bandwidth")):
        at.run()
        at.radio(key=f"predict.{BOUND}.answer").set_value(pick).run()
        buttons(at)[f"predict.{BOUND}.send"].click().run()
        assert not at.exception
    # each student's page holds their own answer only, and no teacher control
    text_a, text_b = page_text(student_a), page_text(student_b)
    assert "recorded: **compute**" in text_a and "memory bandwidth**" not in text_a
    assert "recorded: **memory bandwidth**" in text_b and "**compute**" not in text_b
    for at in (student_a, student_b):
        assert not any(k.endswith((".reveal", ".open", ".reset")) for k in buttons(at))
        assert "Predictions" not in [s.value for s in at.subheader]
    # the student cannot reveal, whatever the browser sends: the store checks the session
    with pytest.raises(ModelError, match="only the teacher"):
        classroom.reveal("student-a", BOUND)
    # the teacher sees how many answered, not what
    teacher.run()
    text_t = page_text(teacher)
    assert "**2** answers so far" in text_t
    assert "**compute**" not in text_t and "**memory bandwidth**" not in text_t and "Your guess" not in text_t
    buttons(teacher)[f"predict.{BOUND}.class.reveal"].click().run()
    assert classroom.state(BOUND) == "revealed"
    student_a.run()
    assert not student_a.exception
    metrics = {m.label: m.value for m in student_a.metric}
    assert metrics["Your guess"] == "compute" and metrics["The formula"] in ("memory bandwidth", "compute")
    spread = [json.loads(c.proto.spec) for c in student_a.get("plotly_chart")
              if "guess" in json.dumps(json.loads(c.proto.spec)["layout"].get("title", ""))]
    assert spread, "no chart of the class's guesses"
    bars = spread[0]["data"][0]
    assert list(bars["x"]) == ["memory bandwidth", "compute"] and list(bars["y"]) == [1, 1]
    assert spread[0]["layout"]["font"]["size"] >= 14


def test_a_non_number_answer_says_so_and_the_text_stays(classroom):
    classroom.open("teacher", SPEEDUP)
    at = session(BATCHING, "student-c")
    box = f"predict.{SPEEDUP}.answer"
    at.text_input(key=box).set_value("about eight").run()
    buttons(at)[f"predict.{SPEEDUP}.send"].click().run()
    assert not at.exception
    assert any("'about eight' is not a number" in e for e in errors(at)), errors(at)
    assert at.text_input(key=box).value == "about eight"             # nothing lost
    assert classroom.view("student-c", SPEEDUP).mine is None
    at.text_input(key=box).set_value("6.5").run()
    buttons(at)[f"predict.{SPEEDUP}.send"].click().run()
    assert classroom.view("student-c", SPEEDUP).mine == 6.5
    assert "recorded: **6.5 ×**" in page_text(at)


def test_outside_classroom_mode_the_one_user_asks_answers_and_reveals_on_the_kv_page(monkeypatch):
    """Single-user mode: the user is the teacher; after the reveal the KV page puts the formula's value and the
    engine's own count beside the guess (2 · L · h_kv · d · 4 bytes · 100 tokens, SmolLM2-135M's shape: 30 layers,
    3 K/V heads of 64, float32)."""
    from ui.model_picker import CHOICE_KEY
    from ui.predict import prediction_store
    monkeypatch.delenv("INFERENCE_LAB_CLASSROOM", raising=False)
    prediction_store.reset()
    at = AppTest.from_file(KV, default_timeout=240)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at.run()
    qid = "kv.mb_100"
    buttons(at)[f"predict.{qid}.open"].click().run()
    at.text_input(key=f"predict.{qid}.answer").set_value("5").run()
    buttons(at)[f"predict.{qid}.send"].click().run()
    buttons(at)[f"predict.{qid}.reveal"].click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    metrics = {m.label: m.value for m in at.metric}
    expected_mb = 2 * 30 * 3 * 64 * 4 * 100 / 1e6                         # 4.608 MB
    assert metrics["Your guess"] == "5 MB"
    assert metrics["The formula"] == metrics["The engine measured"] == f"{expected_mb:g} MB"
    prediction_store.reset()


def test_a_students_clear_cache_message_keeps_the_answers(classroom):
    """The store is process-wide (server.registry), not st.cache_resource: a browser's "clear cache" message
    (Streamlit's own handler, as it runs for any browser) leaves every answer in place."""
    from types import SimpleNamespace
    from streamlit.runtime.app_session import AppSession
    from ui.predict import prediction_store
    classroom.open("teacher", SPEEDUP)
    classroom.answer("student-d", SPEEDUP, "7")
    AppSession._handle_clear_cache_request(SimpleNamespace(_session_state=SimpleNamespace(clear=lambda: None)))
    assert prediction_store() is classroom and classroom.view("student-d", SPEEDUP).mine == 7.0
    assert classroom.view("teacher", SPEEDUP).answered == 1
