"""Predict, then measure: the question box a measured lesson opens with, and the teacher's controls.

    slot = prediction_box("kv.mb_100")                  # at the top of the page: question, answer box, status
    ...
    slot.compare(formula=(value, "kv_cache_bytes"), measured=(value, "the engine's record"))   # once known

Before the reveal each browser sees only its own answer (the teacher sees how many answered); after it, every
browser sees the histogram of guesses beside the formula's value and the engine's measurement. The answers live in
`server.predictions.PredictionStore`, one per process (`server.registry.process_wide`, out of any browser's reach);
open, reveal and reset are checked there against the teacher sessions (`ui.server.teachers`).
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from calculators.units import fmt_num
from engine.errors import ModelError
from server.predictions import CLOSED, OPEN, REVEALED, QUESTIONS, PredictionStore, View
from server.registry import process_wide
from ui.charts import figure, style

ERROR_KEY = "_predict.error.{}"
BOUND_CHOICE = {"memory": "memory bandwidth", "compute": "compute"}     # a calculator's `bound` as the question's choice
ANSWER_KEY = "predict.{}.answer"


@process_wide
def prediction_store() -> PredictionStore:
    """The class's questions and answers (every session's thread shares it)."""
    from ui.server import teachers
    return PredictionStore(require_teacher=lambda session, action: teachers().require(session, action))


def _sid() -> str:
    from ui.server import session_id
    return session_id()


def _act(qid: str, action: str) -> None:
    """A button's callback: `action` on the store for this session; a refusal is kept to show as a message."""
    store = prediction_store()
    try:
        if action == "answer":
            store.answer(_sid(), qid, st.session_state.get(ANSWER_KEY.format(qid)))
        else:
            getattr(store, action)(_sid(), qid)
        st.session_state.pop(ERROR_KEY.format(qid), None)
    except ModelError as e:                                 # PredictionError, or the teacher check's refusal
        st.session_state[ERROR_KEY.format(qid)] = str(e)


def show_value(view_or_question: Any, value: float | str | None) -> str:
    q = getattr(view_or_question, "question", view_or_question)
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    text = fmt_num(value, 4)
    if "." in text and "e" not in text.lower():
        text = text.rstrip("0").rstrip(".")                   # 6.5 as typed, not "6.500"
    return f"{text} {q.unit}".strip()


def teacher_controls(qid: str, view: View, where: Any = None, key: str = "") -> None:
    """Open / reveal / reset, and how many answered (never what): the teacher's only (`view.answered` is None for
    a student, and the store checks the session again)."""
    if view.answered is None:
        return
    box = where if where is not None else st
    k = f"predict.{qid}{key}"
    cols = box.columns([1.5, 1.3, 1, 1])             # "Ask the class" whole with Large text (1366×768)
    cols[0].markdown(f"**{view.answered}** answer{'s' if view.answered != 1 else ''} so far ({view.state}).")
    cols[1].button("Ask the class", key=f"{k}.open", on_click=_act, args=(qid, "open"),
                   disabled=view.state != CLOSED, icon=":material/campaign:")
    cols[2].button("Reveal", key=f"{k}.reveal", on_click=_act, args=(qid, "reveal"), type="primary",
                   disabled=view.state != OPEN, icon=":material/visibility:")
    cols[3].button("Reset", key=f"{k}.reset", on_click=_act, args=(qid, "reset"), disabled=view.state == CLOSED,
                   icon=":material/restart_alt:")


def _problem(qid: str, where: Any) -> None:
    problem = st.session_state.pop(ERROR_KEY.format(qid), None)
    if problem:
        where.error(problem, icon=":material/error:")


class PredictionSlot:
    """The question's box on the page; `compare` adds the formula's value and the measurement once the page has
    them (the spread is drawn at once, and again with them)."""

    def __init__(self, qid: str, view: View | None, chart: Any = None) -> None:
        self.qid, self.view, self.chart = qid, view, chart
        self.formula: tuple | None = None
        self.measured: tuple | None = None

    @property
    def revealed(self) -> bool:
        """The spread is on screen: the page may compute what it compares with (a measurement costs time)."""
        return self.view is not None and self.view.spread is not None and self.chart is not None

    def compare(self, formula: tuple[float | str, str] | None = None,
                measured: tuple[float | str, str] | None = None) -> None:
        """`formula` / `measured`: (value, where it comes from), in the question's unit; None keeps what an
        earlier call gave (a page may know the formula's value before its measurement)."""
        self.formula = formula if formula is not None else self.formula
        self.measured = measured if measured is not None else self.measured
        if self.revealed:
            with self.chart.container():
                spread_view(self.view, self.formula, self.measured)


def spread_view(view: View, formula: tuple | None = None, measured: tuple | None = None) -> None:
    """The class's guesses as bars (the bar holding the formula's value in orange, the measurement's in green),
    with the median, the middle half, the formula and the measurement beside it."""
    d, q = view.spread, view.question
    if d.labels:
        names = list(d.labels)
    else:
        names = [f"{fmt_num(a, 3)} – {fmt_num(b, 3)}" for a, b in zip(d.edges[:-1], d.edges[1:])]
    colors = ["#94a3b8"] * len(names)
    notes = []
    for ref, color, who in ((measured, "#16a34a", "measured"), (formula, "#f59e0b", "formula")):
        i = d.bin_of(ref[0]) if ref is not None else None
        if i is not None:
            colors[i] = color
            notes.append(dict(x=names[i], y=d.counts[i], text=who, showarrow=False, yanchor="bottom",
                              yshift=4 + 24 * (who == "formula")))
    fig = figure(dict(type="bar", x=names, y=list(d.counts), marker=dict(color=colors),
                      hovertemplate="%{x}: %{y} guesses<extra></extra>"),
                 title=f"The class's {d.n} guess{'es' if d.n != 1 else ''}", annotations=notes,
                 xaxis=dict(title=f"guess{f' ({q.unit})' if q.unit else ''}", type="category"),
                 yaxis=dict(title="students", dtick=1, rangemode="tozero"))
    cols = st.columns([3, 1])
    cols[0].plotly_chart(style(fig, height=380, legend_top=False, span=0.75), width="stretch")
    side = cols[1]
    if d.median is not None:
        side.metric("Median guess", show_value(q, d.median),
                    help=f"middle half of the guesses: {show_value(q, d.q1)} to {show_value(q, d.q3)}")
    else:
        side.metric("Most chosen", d.labels[max(range(len(d.counts)), key=d.counts.__getitem__)])
    side.metric("Your guess", show_value(q, view.mine))
    for ref, label in ((formula, "The formula"), (measured, "The engine measured")):
        if ref is not None:
            side.metric(label, show_value(q, ref[0]), help=ref[1])
    if formula is None and measured is None:
        side.caption("The formula's value and the measurement appear here once the page has computed them.")


def prediction_box(qid: str) -> PredictionSlot:
    """The question at the top of a lesson: nothing for a student until the teacher asks it; then the answer box
    (this browser's own answer only); after the reveal, the spread of the class's guesses."""
    store = prediction_store()
    view = store.view(_sid(), qid)
    teacher = view.answered is not None
    if view.state == CLOSED and not teacher:
        return PredictionSlot(qid, None)
    q = view.question
    box = st.container(border=True)
    box.markdown(f"**Predict, then measure.** {q.text}")
    if view.state == CLOSED:
        box.caption("Ask the class before talking through this page's numbers: each student answers from their own "
                    "browser, then you reveal the spread next to the formula and the measurement.")
    if view.state == OPEN:
        c = box.columns([2, 1])
        if q.choices:
            c[0].radio("Your answer", q.choices, index=None, key=ANSWER_KEY.format(qid), horizontal=True)
        else:
            c[0].text_input(f"Your answer ({q.unit})" if q.unit else "Your answer", key=ANSWER_KEY.format(qid),
                            placeholder="a number, e.g. 12.5", max_chars=40)
        c[1].button("Record my answer", key=f"predict.{qid}.send", on_click=_act, args=(qid, "answer"),
                    icon=":material/how_to_vote:")
        if view.mine is not None:
            box.success(f"Your answer is recorded: **{show_value(q, view.mine)}**. Nobody else sees it until the "
                        "teacher reveals the class's answers; answering again replaces it.", icon=":material/check:")
            box.button("Has the teacher revealed?", key=f"predict.{qid}.check", icon=":material/refresh:",
                       help="The page shows the reveal at its next run: this button (or any other) runs it.")
    _problem(qid, box)
    teacher_controls(qid, view, box)
    chart = None
    if view.state == REVEALED:
        box.markdown(f"**Revealed.** Your guess: {show_value(q, view.mine)}.")
        chart = box.empty()
        with chart.container():
            spread_view(view)
    return PredictionSlot(qid, view, chart)


def class_predictions() -> None:
    """The Class page's section for the teacher: every lesson's question, its state and how many answered."""
    store = prediction_store()
    sid = _sid()
    views = {qid: store.view(sid, qid) for qid in QUESTIONS}
    if next(iter(views.values())).answered is None:
        return                                                  # a student: nothing here
    st.subheader("Predictions")
    st.caption("Ask a question before a measured lesson: students answer on that lesson's page, each sees only "
               "their own answer; revealing shows everyone the spread beside the formula and the measurement.")
    for qid, view in views.items():
        with st.container(border=True):
            st.markdown(f"{view.question.text}")
            _problem(qid, st)
            teacher_controls(qid, view, key=".class")
            if view.state == REVEALED and view.spread is not None:
                d = view.spread
                st.caption(f"{d.n} answers; " + (f"median {show_value(view, d.median)}, middle half "
                                                 f"{show_value(view, d.q1)} to {show_value(view, d.q3)}."
                                                 if d.median is not None else
                                                 ", ".join(f"{c}: {n}" for c, n in zip(d.labels, d.counts)) + "."))
