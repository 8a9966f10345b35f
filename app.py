"""Home page: what this product is, the shared model picker, and a generation box that streams a real reply.

Run with `streamlit run app.py`; every other page is a file in `pages/` that Streamlit lists in the sidebar.
"""
from pathlib import Path

import streamlit as st

from ui import APP_TITLE, model_picker, setup_page
from ui.generation import generation_box

PAGES_DIR = Path(__file__).parent / "pages"


def page_label(path: Path) -> str:
    """The label Streamlit gives a page file: "3_KV_cache.py" -> "KV cache"."""
    stem = path.stem.split("_", 1)[1] if "_" in path.stem and path.stem.split("_", 1)[0].isdigit() else path.stem
    return stem.replace("_", " ").strip() or path.stem


def page_links() -> None:
    """A link to every page file that exists (pages are written independently; none is assumed)."""
    pages = sorted(p for p in PAGES_DIR.glob("*.py") if not p.name.startswith("_"))
    if not pages:
        return
    st.subheader("Lessons")
    cols = st.columns(min(len(pages), 4))
    for i, p in enumerate(pages):
        cols[i % len(cols)].page_link(f"pages/{p.name}", label=page_label(p), icon=":material/menu_book:")


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
    page_links()


home()
