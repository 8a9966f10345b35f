"""The Class page's backend setting is process-wide (every session generates where it points), so in classroom mode
a student's browser must not be able to change it; outside classroom mode the teacher's form is there."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

from helpers_apptest import errors

CLASS_PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "51_Class.py")


def _buttons(at) -> set[str]:
    return {b.key for b in at.sidebar.button}


def test_outside_classroom_mode_the_teacher_can_point_the_class_elsewhere(monkeypatch):
    monkeypatch.delenv("INFERENCE_LAB_CLASSROOM", raising=False)
    at = AppTest.from_file(CLASS_PAGE, default_timeout=120).run()
    assert not errors(at) and not at.exception
    assert "class.backend.use" in _buttons(at)


def test_in_classroom_mode_no_browser_can_change_where_the_class_generates(monkeypatch):
    monkeypatch.setenv("INFERENCE_LAB_CLASSROOM", "1")
    at = AppTest.from_file(CLASS_PAGE, default_timeout=120).run()
    assert not errors(at) and not at.exception
    assert "class.backend.use" not in _buttons(at) and "class.backend.reset" not in _buttons(at)
    assert any("cannot be changed from a browser" in c.value for c in at.sidebar.caption)
