"""A teacher's walkthrough of every page, headless (AppTest): each page after pressing its main (primary) button
shows no error, no empty chart and no source named by a bare code. (As drawn, every page gets the same check in
tests/ui/test_pages.py, in the default run.) Pressing every button runs the engine on many pages, a few minutes on
two cores, so this runs when asked, with the real-browser walk:

    WALKTHROUGH=1 python -m pytest tests/ui/test_walkthrough.py tests/ui/test_walkthrough_browser.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers_apptest import press_main_button, run_script, walkthrough_problems

ROOT = Path(__file__).resolve().parents[2]
PAGES = {p.stem.split("_", 1)[1]: str(p) for p in sorted((ROOT / "pages").glob("[0-9][0-9]_*.py"))}

pytestmark = pytest.mark.skipif(os.environ.get("WALKTHROUGH") != "1",
                                reason="presses every page's main button (minutes): WALKTHROUGH=1")


@pytest.mark.parametrize("name", list(PAGES))
def test_page_is_clean_after_its_main_button(name):
    at = run_script(PAGES[name], 180)
    pressed = press_main_button(at)
    assert walkthrough_problems(at) == [], f"after pressing {pressed!r}"
