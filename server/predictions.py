"""Predict, then measure: a lesson opens with a question, every student answers from their own browser, the teacher
reveals the spread of guesses next to the formula's value and the engine's measurement.

Pure (no Streamlit): one `PredictionStore` per app process (held by `server.registry.process_wide` in
`ui.predict`, never in `st.cache_resource`, which any browser can empty), shared by every session's thread.

    store = PredictionStore(require_teacher=teachers().require)
    store.open(teacher_sid, "kv.bytes_100")            # teacher only (checked here, on the server)
    store.answer(student_sid, "kv.bytes_100", "2.5")   # one answer per session; answering again replaces it
    store.view(student_sid, "kv.bytes_100")            # that student's own answer; the spread only after the reveal
    store.reveal(teacher_sid, "kv.bytes_100")          # teacher only; refused (PredictionError) with no answer yet

Before the reveal no session (the teacher's included) can read another session's answer: the teacher sees only how
many answered. Every refusal is a `PredictionError` (a `ModelError`): one clear line the page shows as a message.
"""
from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.errors import ModelError

CLOSED, OPEN, REVEALED = "not asked yet", "open", "revealed"
MAX_ANSWER_CHARS = 40
HIST_BINS = 10
_NUMBER = re.compile(r"[+-]?(\d{1,3}(,\d{3})+|\d+)?(\.\d*)?([eE][+-]?\d+)?")


class PredictionError(ModelError):
    """A prediction action that cannot be done as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    unit: str = ""                       # shown beside the box and on the chart's axis ("MB", "×")
    choices: tuple[str, ...] = ()        # empty: a number is asked for

    @property
    def numeric(self) -> bool:
        return not self.choices


# The lessons' questions (the pages ask them with `ui.predict.prediction_box(id)`).
QUESTIONS: dict[str, Question] = {q.id: q for q in (
    Question("kv.mb_100", "How many MB does the KV cache hold after 100 tokens (this page's model, float32 as the "
                          "engine keeps it)?", unit="MB"),
    Question("batching.speedup_8", "How many times more tokens per second do 8 streams decoding together give than "
                                   "one stream alone?", unit="×"),
    Question("prefill.decode_bound_2000", "At 2,000 tokens of context, batch 1: what limits a decode step?",
             choices=("memory bandwidth", "compute")),
)}


def parse_answer(question: Question, text: object) -> float | str:
    """The answer as stored: a finite number for a numeric question ("2,048", "1e6", "0.5" accepted), one of the
    choices for a choice question. PredictionError (saying what is wrong) otherwise."""
    raw = "" if text is None else str(text).strip()
    if not raw:
        raise PredictionError("The answer box is empty: type your guess first.")
    if len(raw) > MAX_ANSWER_CHARS:
        raise PredictionError(f"That answer is {len(raw)} characters long; at most {MAX_ANSWER_CHARS} are kept.")
    if question.choices:
        if raw not in question.choices:
            raise PredictionError(f"{raw!r} is not one of the choices ({', '.join(question.choices)}).")
        return raw
    clean = raw.removesuffix(question.unit).strip() if question.unit else raw
    if not _NUMBER.fullmatch(clean) or not re.search(r"\d", clean):
        raise PredictionError(f"{raw!r} is not a number: type digits only, e.g. 12.5 or 2,048"
                              + (f" ({question.unit})." if question.unit else "."))
    value = float(clean.replace(",", ""))
    if not math.isfinite(value):
        raise PredictionError(f"{raw!r} is too large to be a number here.")
    return value


@dataclass(frozen=True)
class Distribution:
    """The class's answers, counted. Numeric: histogram (counts over `edges`), median and quartiles (linear
    interpolation between order statistics, as numpy.percentile and statistics.quantiles(method="inclusive")).
    Choice: counts per choice, in the question's order."""
    n: int
    counts: tuple[int, ...]
    edges: tuple[float, ...] = ()         # numeric: len(counts) + 1 bin edges
    labels: tuple[str, ...] = ()          # choice: the choices
    median: float | None = None
    q1: float | None = None
    q3: float | None = None
    log_bins: bool = False

    def bin_of(self, value: float | str | None) -> int | None:
        """The bar `value` falls in (a choice's index, or the histogram bin; the last bin holds its right edge);
        None when it lies outside every bar or is None."""
        if value is None:
            return None
        if self.labels:
            return self.labels.index(value) if value in self.labels else None
        if not self.edges[0] <= float(value) <= self.edges[-1]:
            return None
        return min(int(np.searchsorted(self.edges, float(value), side="right")) - 1, len(self.counts) - 1)


def distribution(question: Question, answers: list[float | str]) -> Distribution:
    """The spread of `answers` (PredictionError when there are none)."""
    if not answers:
        raise PredictionError("Nobody has answered this question yet: there is no spread of guesses to show.")
    if question.choices:
        return Distribution(n=len(answers), counts=tuple(answers.count(c) for c in question.choices),
                            labels=question.choices)
    v = np.asarray(answers, float)
    q1, med, q3 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    lo, hi = float(v.min()), float(v.max())
    log_bins = lo > 0 and hi / lo >= 100           # guesses spanning orders of magnitude: bins of equal ratio
    if lo == hi:
        pad = 0.5 if lo == 0 else abs(lo) * 0.1           # everyone agreed: one bar around that value
        edges = np.array([lo - pad, hi + pad])
    elif log_bins:
        edges = np.geomspace(lo, hi, HIST_BINS + 1)
    else:
        edges = np.linspace(lo, hi, HIST_BINS + 1)
    counts, edges = np.histogram(v, bins=edges)
    return Distribution(n=len(answers), counts=tuple(int(c) for c in counts), edges=tuple(float(e) for e in edges),
                        median=med, q1=q1, q3=q3, log_bins=log_bins)


@dataclass(frozen=True)
class View:
    """What one session may see of a question now."""
    question: Question
    state: str                              # CLOSED, OPEN or REVEALED
    mine: float | str | None                # this session's own answer
    answered: int | None                    # how many sessions answered: the teacher's view only
    spread: Distribution | None             # only once revealed


@dataclass
class _Asked:
    state: str = CLOSED
    answers: dict[str, float | str] = field(default_factory=dict)       # session id -> answer


class PredictionStore:
    """Every question's state and answers, keyed by session id; thread-safe (one lock)."""

    def __init__(self, require_teacher: Callable[[str, str], None],
                 questions: dict[str, Question] | None = None) -> None:
        self.require_teacher = require_teacher
        self.questions = dict(QUESTIONS if questions is None else questions)
        self._lock = threading.Lock()
        self._asked = {qid: _Asked() for qid in self.questions}

    def _get(self, qid: str) -> tuple[Question, _Asked]:
        if qid not in self.questions:
            raise PredictionError(f"There is no question {qid!r} (known: {', '.join(self.questions)}).")
        return self.questions[qid], self._asked[qid]

    def _is_teacher(self, session: str) -> bool:
        try:
            self.require_teacher(session, "see how many answered")
            return True
        except ModelError:
            return False

    # ------------------------------------------------------------------------------ everyone
    def answer(self, session: str, qid: str, text: object) -> float | str:
        """Record (or replace) this session's answer; the value stored. Refused unless the question is open."""
        question, asked = self._get(qid)
        value = parse_answer(question, text)
        with self._lock:
            if asked.state == CLOSED:
                raise PredictionError("The teacher has not opened this question yet: answers are not taken.")
            if asked.state == REVEALED:
                raise PredictionError("The answers are already revealed: this question takes no more answers "
                                      "(the teacher can reset it to ask again).")
            asked.answers[session] = value
        return value

    def state(self, qid: str) -> str:
        return self._get(qid)[1].state

    def view(self, session: str, qid: str) -> View:
        question, asked = self._get(qid)
        teacher = self._is_teacher(session)
        with self._lock:
            state, mine, answers = asked.state, asked.answers.get(session), list(asked.answers.values())
        return View(question=question, state=state, mine=mine, answered=len(answers) if teacher else None,
                    spread=distribution(question, answers) if state == REVEALED else None)

    # ------------------------------------------------------------------------------ the teacher only
    def open(self, session: str, qid: str) -> None:
        """Start taking answers (answers already given stay)."""
        self.require_teacher(session, "open a prediction question")
        _, asked = self._get(qid)
        with self._lock:
            if asked.state == CLOSED:
                asked.state = OPEN

    def reveal(self, session: str, qid: str) -> Distribution:
        """Close the question and show everyone the spread. Refused while nobody has answered (nothing is lost:
        the question stays open)."""
        self.require_teacher(session, "reveal the class's answers")
        question, asked = self._get(qid)
        with self._lock:
            if asked.state == CLOSED:
                raise PredictionError("This question has not been opened yet: open it, let the class answer, "
                                      "then reveal.")
            if not asked.answers:
                raise PredictionError("Nobody has answered yet: there is nothing to reveal. The question stays "
                                      "open; reveal once answers arrive.")
            asked.state = REVEALED
            answers = list(asked.answers.values())
        return distribution(question, answers)

    def reset(self, session: str, qid: str) -> None:
        """Forget every answer and close the question."""
        self.require_teacher(session, "reset a prediction question")
        _, asked = self._get(qid)
        with self._lock:
            asked.state, asked.answers = CLOSED, {}
