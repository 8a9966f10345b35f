"""A classroom without internet: the app asks the browser for nothing outside this machine.

Streamlit turns a ":material/name:" page icon (the browser tab's favicon, and the default page's icon in the
navigation) into an SVG fetched from fonts.gstatic.com; offline that was one failed request per page (48 in a
teacher's walk). Icons inside the page come from Streamlit's bundled font and cost nothing. Checked here without a
browser: every page's favicon request, the navigation's icons, and the walkthrough's own detector of outside
requests (tools/walkthrough.py, which checks the real thing in Chromium when WALKTHROUGH=1).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ui
from tools.walkthrough import network_problems

ROOT = Path(__file__).resolve().parents[2]


def _icons_pages_ask_for() -> set[str]:
    found = set()
    for path in [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]:
        found |= set(re.findall(r"setup_page\([^)]*icon=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    return found


def test_pages_do_ask_for_material_icons():
    """The premise of the next test: without it, the next one would pass for want of icons to check."""
    assert any(i.startswith(":material/") for i in _icons_pages_ask_for())


@pytest.mark.parametrize("icon", sorted(_icons_pages_ask_for()) + [None])
def test_no_page_sets_a_favicon_fetched_from_another_host(monkeypatch, icon):
    import streamlit as st

    import ui.charts
    import ui.nav
    asked = {}
    monkeypatch.setattr(st, "set_page_config", lambda **kw: asked.update(kw))
    monkeypatch.setattr(ui.charts, "large_text_toggle", lambda: None)
    monkeypatch.setattr(ui.nav, "leave_pages_folder_mode", lambda: None)
    ui.setup_page("A page", icon=icon) if icon is not None else ui.setup_page("A page")
    got = asked["page_icon"]
    assert got is None or not str(got).startswith(":material"), got
    assert asked["page_title"].endswith(ui.APP_TITLE)


def test_an_emoji_or_image_favicon_is_kept():
    assert ui.favicon("🧪") == "🧪"
    assert ui.favicon(":material/memory:") == ui.FAVICON


def test_navigation_pages_carry_no_material_icon():
    """st.Page(icon=":material/...") on the default page becomes the favicon too (fetched from Google's host)."""
    tree = ast.parse((ROOT / "app.py").read_text(encoding="utf-8"))
    icons = [kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", "") == "Page" for kw in node.keywords
             if kw.arg == "icon" and isinstance(kw.value, ast.Constant)]
    assert not [i for i in icons if str(i).startswith(":material")]


def _sent(rid, url):
    return {"method": "Network.requestWillBeSent", "params": {"requestId": rid, "request": {"url": url}}}


def test_walkthrough_flags_requests_to_other_hosts_and_failures_only():
    gstatic = "https://fonts.gstatic.com/s/i/short-term/release/materialsymbolsrounded/home/default/24px.svg"
    events = [
        _sent("1", "http://127.0.0.1:8501/static/js/index.js"),
        _sent("2", "ws://localhost:8501/_stcore/stream"),
        _sent("3", "data:image/svg+xml,<svg/>"),
        _sent("4", gstatic),
        {"method": "Network.loadingFailed", "params": {"requestId": "4", "errorText": "net::ERR_NAME_NOT_RESOLVED"}},
        _sent("5", "http://127.0.0.1:8501/_stcore/health"),
        {"method": "Network.loadingFailed", "params": {"requestId": "5", "errorText": "net::ERR_ABORTED",
                                                       "canceled": True}},
        _sent("6", "http://127.0.0.1:8501/media/x.png"),
        {"method": "Network.loadingFailed", "params": {"requestId": "6", "errorText": "net::ERR_FAILED"}},
    ]
    assert network_problems(events) == [
        "request to another host: " + gstatic,
        "failed request (net::ERR_NAME_NOT_RESOLVED): " + gstatic,
        "failed request (net::ERR_FAILED): http://127.0.0.1:8501/media/x.png",
    ]
    assert network_problems(events[:3]) == []
