"""The teacher's walkthrough in a real browser (tools/walkthrough.py): Home and every page at 1366×768, large text
off and on, as drawn and after its main button, and every Walkthrough step; no error box, no cut metric, link or
label, no empty chart, no source named by a bare code; each key chart on the first screen with Next beside it, no
wrapped metric value, no raw identifier, path, repr or unformatted number, every lesson-plan page in the sidebar
(the rules themselves run in the default suite: tests/ui/test_walk_checks.py). It takes minutes, so it runs only
when asked and when Chromium is installed:

    WALKTHROUGH=1 python -m pytest tests/ui/test_walkthrough_browser.py     # apt-get install chromium first
"""
from __future__ import annotations

import os
import shutil

import pytest

pytestmark = [
    pytest.mark.skipif(os.environ.get("WALKTHROUGH") != "1", reason="a real-browser walk of every page: WALKTHROUGH=1"),
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)"),
]


def test_every_page_in_a_real_browser_shows_what_it_claims(tmp_path):
    pytest.importorskip("websockets")
    from tools.walkthrough import run
    problems = run(out=tmp_path, log=lambda line: None)
    assert [str(p) for p in problems] == []
