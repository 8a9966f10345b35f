"""The app's Streamlit settings for a class: thirty sessions at once must not pay for developer conveniences.

Measured with bench/bench_classroom.py (30 sessions): Streamlit's file watcher (each new session walks every
imported module to watch its file) and its full garbage collection after every script run took most of the app
process's time and stole the cores from the engine server."""
from __future__ import annotations

import tomllib
from pathlib import Path

from streamlit import config

ROOT = Path(__file__).resolve().parents[2]


def app_config() -> dict:
    return tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())


def test_no_file_watching_and_no_gc_after_every_run():
    cfg = app_config()
    assert cfg["server"]["fileWatcherType"] == "none"
    assert cfg["runner"]["postScriptGC"] is False


def test_every_setting_is_one_streamlit_knows():
    """A misspelt key is ignored silently by Streamlit: the setting would do nothing."""
    known = set(config.get_config_options())
    for section, options in app_config().items():
        for name in options:
            assert f"{section}.{name}" in known, f"{section}.{name} is not a Streamlit setting"


def test_the_decode_bar_moves_in_at_most_sixteen_steps_and_reaches_the_end():
    """Brute force over reply lengths: at most PROGRESS_STEPS + 1 moves, never more than ⌈total/steps⌉ tokens
    apart, and always at the last token (a bar moved per token doubled the screen updates of a class)."""
    from ui.generation import PROGRESS_STEPS, progress_due
    for total in range(1, 300):
        due = [d for d in range(1, total + 1) if progress_due(d, total)]
        gaps = [b - a for a, b in zip([0] + due, due)]
        assert due[-1] == total and len(due) <= PROGRESS_STEPS + 1, total
        assert max(gaps) <= -(-total // PROGRESS_STEPS), total
    assert [d for d in range(1, 5) if progress_due(d, 4)] == [1, 2, 3, 4]     # a short reply: every token
