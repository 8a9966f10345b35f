"""What the AppTest-driven page tests share: the session they start with (a fast random engine model) and the
errors a run shows."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from ui.model_picker import CHOICE_KEY, random_choice

SMALL_RANDOM = random_choice("SmolLM2-135M-Instruct")     # random weights in SmolLM2's shape: builds in a second


def run_script(path: str, timeout: float, choice: str | None = SMALL_RANDOM, **state) -> AppTest:
    """app.py or a page file run once with `choice` as the engine model and `state` in its session."""
    at = AppTest.from_file(path, default_timeout=timeout)
    if choice is not None:
        at.session_state[CHOICE_KEY] = choice
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def errors(at: AppTest) -> list[str]:
    """Every st.error on the page and in the sidebar."""
    return [e.value for e in at.error] + [e.value for e in at.sidebar.error]
