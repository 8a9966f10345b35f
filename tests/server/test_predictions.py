"""Predict, then measure (issue 28): ten student sessions answer, the teacher reveals. Answers stay per session
until the reveal, only the teacher's session may open, reveal or reset (checked in the store, on the server), the
spread is right (expected values computed here by hand and with `statistics`, not by the store), and bad input
gets one clear message with nothing lost."""
from __future__ import annotations

import statistics
import threading

import pytest

from server.classroom import ClassroomPolicy, TeacherSessions
from server.predictions import CLOSED, OPEN, REVEALED, PredictionError, PredictionStore, QUESTIONS
from engine.errors import ModelError

KEY = "a long teacher phrase"
NUMERIC, CHOICE = "kv.mb_100", "prefill.decode_bound_2000"
GUESSES = [1.0, 2.0, 2.0, 3.5, 4.0, 4.0, 4.0, 10.0, 2.5, 7.0]          # ten students


@pytest.fixture()
def classroom():
    policy = ClassroomPolicy(enabled=True, teacher_key=KEY)
    teachers = TeacherSessions(policy=lambda: policy, wrong_key_pause_s=0.0)
    teachers.unlock("teacher", KEY)
    return PredictionStore(require_teacher=teachers.require)


def students(n=10):
    return [f"student-{i}" for i in range(n)]


def test_ten_students_answer_and_the_teacher_reveals(classroom):
    store = classroom
    store.open("teacher", NUMERIC)
    threads = [threading.Thread(target=store.answer, args=(s, NUMERIC, str(g))) for s, g in zip(students(), GUESSES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # before the reveal: each student sees their own answer only, no count, no spread
    for s, g in zip(students(), GUESSES):
        v = store.view(s, NUMERIC)
        assert v.state == OPEN and v.mine == g and v.answered is None and v.spread is None
    teacher = store.view("teacher", NUMERIC)
    assert teacher.answered == 10 and teacher.spread is None and teacher.mine is None   # a count, not the values
    # a student cannot reveal (the store asks the teacher sessions, whatever the page showed)
    with pytest.raises(ModelError, match="only the teacher"):
        store.reveal("student-3", NUMERIC)
    with pytest.raises(ModelError, match="only the teacher"):
        store.reset("student-3", NUMERIC)
    assert store.state(NUMERIC) == OPEN and store.view("teacher", NUMERIC).answered == 10
    spread = store.reveal("teacher", NUMERIC)
    # expected, independently: sorted 1, 2, 2, 2.5, 3.5, 4, 4, 4, 7, 10 -> median (3.5 + 4) / 2
    assert spread.n == 10 and spread.median == pytest.approx(3.75)
    q1, _, q3 = statistics.quantiles(GUESSES, n=4, method="inclusive")
    assert (spread.q1, spread.q3) == (pytest.approx(q1), pytest.approx(q3))
    assert (q1, q3) == (pytest.approx(2.125), pytest.approx(4.0))
    # 10 / 1 < 100: ten equal bins of 0.9 from 1 to 10; count each bin here
    assert spread.edges[0] == 1.0 and spread.edges[-1] == 10.0 and not spread.log_bins
    e = spread.edges
    expected = [sum(1 for g in GUESSES if e[i] <= g < e[i + 1] or (i == len(e) - 2 and g == e[-1]))
                for i in range(len(e) - 1)]
    assert list(spread.counts) == expected and sum(spread.counts) == 10
    # by hand: [1, 1.9) 1.0 | [1.9, 2.8) 2, 2, 2.5 | [2.8, 3.7) 3.5 | [3.7, 4.6) 4, 4, 4 | [6.4, 7.3) 7 | [9.1, 10] 10
    assert expected == [1, 3, 1, 3, 0, 0, 1, 0, 0, 1]
    # after the reveal every session sees the same spread, and its own answer
    for s, g in zip(students(), GUESSES):
        v = store.view(s, NUMERIC)
        assert v.state == REVEALED and v.mine == g and v.spread == spread
    with pytest.raises(PredictionError, match="already revealed"):
        store.answer("student-0", NUMERIC, "5")


def test_re_answering_replaces_the_sessions_answer(classroom):
    store = classroom
    store.open("teacher", NUMERIC)
    store.answer("student-0", NUMERIC, "3")
    store.answer("student-0", NUMERIC, "2,048")
    store.answer("student-1", NUMERIC, "1e2")
    assert store.view("student-0", NUMERIC).mine == 2048.0
    assert store.view("teacher", NUMERIC).answered == 2
    assert store.reveal("teacher", NUMERIC).median == pytest.approx((2048 + 100) / 2)


def test_a_choice_question_counts_each_choice(classroom):
    store = classroom
    store.open("teacher", CHOICE)
    picks = ["memory bandwidth"] * 7 + ["compute"] * 3
    for s, p in zip(students(), picks):
        store.answer(s, CHOICE, p)
    spread = store.reveal("teacher", CHOICE)
    assert dict(zip(spread.labels, spread.counts)) == {"memory bandwidth": 7, "compute": 3}
    with pytest.raises(PredictionError, match="not one of the choices"):
        store.answer("x", CHOICE, "the network")


@pytest.mark.parametrize("text, says", [("abc", "'abc' is not a number"), ("", "empty"), ("1,2", "not a number"),
                                         ("1e999", "too large"), ("x" * 80, "characters")])
def test_a_bad_answer_is_refused_and_the_earlier_one_is_kept(classroom, text, says):
    store = classroom
    store.open("teacher", NUMERIC)
    store.answer("student-0", NUMERIC, "12")
    with pytest.raises(PredictionError, match=says):
        store.answer("student-0", NUMERIC, text)
    assert store.view("student-0", NUMERIC).mine == 12.0                # nothing lost
    assert store.view("teacher", NUMERIC).answered == 1


def test_reveal_before_any_answer_or_before_opening_says_so_and_loses_nothing(classroom):
    store = classroom
    with pytest.raises(PredictionError, match="not been opened"):
        store.reveal("teacher", NUMERIC)
    with pytest.raises(PredictionError, match="not opened this question"):
        store.answer("student-0", NUMERIC, "3")
    store.open("teacher", NUMERIC)
    with pytest.raises(PredictionError, match="Nobody has answered yet"):
        store.reveal("teacher", NUMERIC)
    assert store.state(NUMERIC) == OPEN                                  # still open: answers still taken
    store.answer("student-0", NUMERIC, "3")
    assert store.reveal("teacher", NUMERIC).median == 3.0
    store.reset("teacher", NUMERIC)
    assert store.state(NUMERIC) == CLOSED and store.view("student-0", NUMERIC).mine is None


def test_guesses_over_orders_of_magnitude_get_ratio_bins(classroom):
    store = classroom
    store.open("teacher", NUMERIC)
    for s, g in zip(students(4), ["0.5", "5", "50", "500"]):
        store.answer(s, NUMERIC, g)
    spread = store.reveal("teacher", NUMERIC)
    assert spread.log_bins and spread.edges[0] == pytest.approx(0.5) and spread.edges[-1] == pytest.approx(500)
    assert sum(spread.counts) == 4 and spread.median == pytest.approx(27.5)


def test_outside_classroom_mode_the_one_user_is_the_teacher():
    teachers = TeacherSessions(policy=lambda: ClassroomPolicy(enabled=False))
    store = PredictionStore(require_teacher=teachers.require)
    store.open("anyone", NUMERIC)
    store.answer("anyone", NUMERIC, "4")
    assert store.reveal("anyone", NUMERIC).n == 1
    assert set(QUESTIONS) >= {NUMERIC, CHOICE, "batching.speedup_8"}
