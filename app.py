"""Entry point: routes to the lessons. The home page (below) holds the model picker and a streaming generation
box; every other page is a file `pages/NN_Title.py`, grouped into the curriculum's parts by `ui.nav`.

Run with `streamlit run app.py`.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui import APP_TITLE, model_picker, setup_page
from ui.generation import generation_box
from ui.nav import PageFile, page_files, sections

APP_DIR = Path(__file__).parent


def page_links(files: list[PageFile]) -> None:
    """A link to every lesson, part by part."""
    if not files:
        return
    st.subheader("Lessons")
    by_section: dict[str, list[PageFile]] = {}
    for f in files:
        by_section.setdefault(f.section, []).append(f)
    for section, group in by_section.items():
        st.markdown(f"**{section}**")
        cols = st.columns(min(len(group), 4))
        for i, f in enumerate(group):
            cols[i % len(cols)].page_link(f.relative, label=f.title, icon=":material/menu_book:")


def home() -> None:
    setup_page("Home", icon=":material/home:")
    st.title(APP_TITLE)
    st.markdown(
        "This app runs a real Llama-architecture model in plain NumPy on this machine and measures what every token "
        "costs: time, memory, bytes moved. The other pages predict the same numbers from first principles, so you "
        "can check the theory against the experiment."
    )
    model = model_picker()
    st.subheader("Generate")
    generation_box(model)
    page_links(page_files(APP_DIR / "pages"))


def main() -> None:
    nav = {"Start": [st.Page(home, title="Home", icon=":material/home:", default=True)]}
    for section, files in sections(APP_DIR / "pages").items():
        nav.setdefault(section, []).extend(st.Page(f.relative, title=f.title) for f in files)
    st.navigation(nav).run()


main()
