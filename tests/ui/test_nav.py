"""The table of contents (`ui.nav`): listed from the pages folder, again whenever the folder changes."""
import os

from ui.nav import page_files, sections


def test_a_lesson_added_while_the_app_runs_is_listed(tmp_path):
    """The listing is kept between reruns (every session's rerun listed the folder), but a file added or removed
    changes the folder, and the next listing shows it."""
    (tmp_path / "21_First_lesson.py").write_text("")
    assert [f.title for f in page_files(tmp_path)] == ["First lesson"]
    (tmp_path / "32_KV_cache.py").write_text("")
    os.utime(tmp_path, ns=(1, tmp_path.stat().st_mtime_ns + 10**9))     # a coarse clock: the folder did change
    assert [f.title for f in page_files(tmp_path)] == ["First lesson", "KV cache"]
    assert list(sections(tmp_path)) == ["Sizing one GPU", "Serving many users"]
    (tmp_path / "21_First_lesson.py").unlink()
    os.utime(tmp_path, ns=(1, tmp_path.stat().st_mtime_ns + 10**9))
    assert [f.title for f in page_files(tmp_path)] == ["KV cache"]


def test_the_listing_is_a_fresh_list_each_time(tmp_path):
    """Callers may change what they get without changing the next caller's listing."""
    (tmp_path / "21_First_lesson.py").write_text("")
    page_files(tmp_path).clear()
    assert len(page_files(tmp_path)) == 1


def test_table_of_contents_columns_keep_parts_whole_in_order_and_even():
    """Worked by hand for this curriculum's parts (1, 5, 7, 7, 4 and 1 lessons: 2, 6, 8, 8, 5 and 2 lines with
    their titles): four columns of 8, 8, 8 and 7 lines; three columns cannot do better than 15 (2+6 | 8 | 8+5+2
    beats 2+6+8 | 8 | 5+2 = 16 and 2+6 | 8+8 | 5+2 = 16). Fewer parts than columns: one part each, then empty."""
    from ui.nav import toc_columns
    lessons = {name: ["x"] * k for name, k in zip("ABCDEF", (1, 5, 7, 7, 4, 1))}
    assert toc_columns(lessons, 4) == [["A", "B"], ["C"], ["D"], ["E", "F"]]
    three = toc_columns(lessons, 3)
    assert max(sum(1 + len(lessons[p]) for p in col) for col in three) == 15
    assert [p for col in three for p in col] == list("ABCDEF")
    assert toc_columns({"A": ["x"], "B": ["x"]}, 4) == [["A"], ["B"], [], []]
    assert toc_columns({}, 4) == [[], [], [], []]
    assert toc_columns(lessons, 1) == [list("ABCDEF")]


def test_the_sidebar_lists_every_lesson_without_view_more(monkeypatch):
    """Streamlit folds a long menu behind "View N more" (Batching, Class and the Capacity planner, pages of the
    README's lesson plans, were hidden): the app's navigation asks for every entry expanded."""
    from pathlib import Path

    import streamlit as st
    from streamlit.testing.v1 import AppTest
    seen = {}
    real = st.navigation

    def navigation(pages, **kw):
        seen.update(kw, count=sum(len(v) for v in pages.values()))
        return real(pages, **kw)
    monkeypatch.setattr(st, "navigation", navigation)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=60).run()
    assert not at.exception
    assert seen["expanded"] is True and seen["count"] > 12
