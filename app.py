"""Entry point: routes to the lessons. The home page (below) holds the model picker and a streaming generation
box; every other page is a file `pages/NN_Title.py`, grouped into the curriculum's parts by `ui.nav`.

Run with `streamlit run app.py`.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui import APP_TITLE, model_picker, setup_page
from ui.generation import generation_box
from ui.nav import TOC_COLUMNS, PageFile, sections, toc_columns

APP_DIR = Path(__file__).parent


def page_links(lessons: dict[str, list[PageFile]], pages: dict[str, st.Page]) -> None:
    """A link to every lesson: the curriculum's parts in order, as a table of contents in four columns. Each link
    goes to its registered `st.Page` (a link given a file path makes Streamlit resolve that path on disk for every
    link of every rerun). Few elements: each is one message to every browser, thirty at once when a class clicks
    Generate (bench/bench_classroom.py)."""
    if not lessons:
        return
    st.subheader("Lessons")
    for col, parts in zip(st.columns(TOC_COLUMNS), toc_columns(lessons, TOC_COLUMNS)):
        for section in parts:
            col.markdown(f"**{section}**")
            for f in lessons[section]:
                col.page_link(pages[f.relative], label=f.title, icon=":material/menu_book:")


def home_page(lessons: dict[str, list[PageFile]], pages: dict[str, st.Page]) -> None:
    setup_page("Home", icon=":material/home:")
    st.title(APP_TITLE)
    st.caption("A real model in plain NumPy on this machine: what every token costs, measured and predicted.")
    box = st.container()                 # the prompt, the reply and its metrics first: a projector's first screen
    model = model_picker()               # (the picker's note on the model goes under them)
    with box:
        generation_box(model)
    page_links(lessons, pages)


PAGES_KEY = "_app.lesson_pages"


def lesson_pages(lessons: dict[str, list[PageFile]]) -> dict[str, st.Page]:
    """This session's `st.Page` of every lesson file, built once per session (building one resolves its path on
    disk: 25 pages cost about as much as the rest of the script up to a Generate click's request, measured with
    thirty sessions at once) and again only when the lessons change. Per session, never shared: navigation marks
    the page it is about to run on the object itself."""
    files = tuple(f for group in lessons.values() for f in group)
    kept = st.session_state.get(PAGES_KEY)
    if kept is None or kept[0] != files:
        kept = (files, {f.relative: st.Page(f.relative, title=f.title) for f in files})
        st.session_state[PAGES_KEY] = kept
    return kept[1]


def main() -> None:
    lessons = sections(APP_DIR / "pages")
    pages = lesson_pages(lessons)

    def home() -> None:
        home_page(lessons, pages)

    nav = {"Start": [st.Page(home, title="Home", default=True)]}  # no Material icon: see ui.FAVICON
    for section, group in lessons.items():
        nav.setdefault(section, []).extend(pages[f.relative] for f in group)
    st.navigation(nav, expanded=True).run()   # every lesson listed: no "View more" hiding Batching or Class


main()
