"""The app's table of contents: every file `pages/NN_Title.py` becomes a page, grouped into the curriculum's parts
by the tens digit of NN, in order of NN and then of title (12_Embeddings… comes before 12_Sampling). Adding a
lesson is adding a file; nothing here lists pages by hand.

    00-09  Start               (the home page lives in app.py; 01 Walkthrough)
    10-19  Inside the model    (tokens, embeddings, sampling, attention, KV cache, prefill vs decode)
    20-29  Sizing one GPU      (anatomy, KV variants, roofline, floors, FlashAttention, quantization, your machine)
    30-39  Serving many users  (batching, continuous batching, paging, prefix caching, chunked prefill, ...)
    40-49  Beyond one GPU      (parallelism, capacity planner, calibration, measure a server)
    50-59  Classroom           (the class being served)
"""
from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

PAGES_DIR = Path(__file__).resolve().parents[1] / "pages"
SECTIONS = {0: "Start", 1: "Inside the model", 2: "Sizing one GPU", 3: "Serving many users", 4: "Beyond one GPU",
            5: "Classroom"}
# Titles a file name cannot spell (punctuation); every other title is the file name with "_" read as a space.
TITLE_OVERRIDES = {
    "KV cache step by step": "KV cache, step by step",
    "Prefill and decode measured": "Prefill and decode, measured",
    "Queueing and SLOs": "Queueing and SLOs",
}
_PAGE_FILE = re.compile(r"^(\d{2})_(.+)\.py$")


@dataclass(frozen=True)
class PageFile:
    number: int
    title: str
    path: Path

    @property
    def section(self) -> str:
        return SECTIONS.get(self.number // 10, "More")

    @property
    def relative(self) -> str:
        """The path `st.page_link` / `st.switch_page` take: "pages/21_Model_anatomy.py"."""
        return f"pages/{self.path.name}"


def page_title(stem_rest: str) -> str:
    """ "KV_cache_step_by_step" -> "KV cache, step by step"."""
    plain = stem_rest.replace("_", " ").strip()
    return TITLE_OVERRIDES.get(plain, plain)


def page_files(pages_dir: Path = PAGES_DIR) -> list[PageFile]:
    """Every lesson file, in curriculum order (by its number). Listed again only when the folder changes (a file
    added, removed or renamed changes its modification time), not on every rerun of every session."""
    pages_dir = Path(pages_dir)
    try:
        stamp = pages_dir.stat().st_mtime_ns
    except OSError:
        stamp = None
    return list(_listed(pages_dir, stamp))


@functools.lru_cache(maxsize=16)
def _listed(pages_dir: Path, stamp: int | None) -> tuple[PageFile, ...]:
    out = []
    for p in pages_dir.glob("*.py"):
        m = _PAGE_FILE.match(p.name)
        if m:
            out.append(PageFile(int(m.group(1)), page_title(m.group(2)), p))
    return tuple(sorted(out, key=lambda f: (f.number, f.title)))


def sections(pages_dir: Path = PAGES_DIR) -> dict[str, list[PageFile]]:
    """Page files grouped by curriculum part, parts in order."""
    out: dict[str, list[PageFile]] = {}
    for f in page_files(pages_dir):
        out.setdefault(f.section, []).append(f)
    return out


def leave_pages_folder_mode() -> None:
    """Make a deep link work on a fresh server. Streamlit treats a `pages/` folder beside app.py as an old-style
    multipage app until `st.navigation` has run once in the process, so the first visitor of, say, /Attention would
    get the folder's plain page list (and "app" for Home). Switch the process to app.py's navigation and rerun once:
    the rerun runs app.py, whose navigation opens the same page."""
    import streamlit as st
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


TOC_COLUMNS = 4   # the home page's table of contents


def toc_columns(lessons: dict[str, list], n: int = TOC_COLUMNS) -> list[list[str]]:
    """The parts, in order, cut into at most n columns so that the tallest column is as short as it can be (a
    part's title counts as a line, and a part is never split). There are few parts: every cut is tried.
    -> n lists of part names (empty ones at the end when there are fewer parts than columns)"""
    parts = list(lessons)
    lines = [1 + len(lessons[p]) for p in parts]
    k = min(n, len(parts))

    def tallest(cut: tuple[int, ...]) -> int:
        return max(sum(lines[a:b]) for a, b in zip((0, *cut), (*cut, len(parts))))

    cut = min(itertools.combinations(range(1, len(parts)), k - 1), key=tallest) if parts else ()
    cols = [parts[a:b] for a, b in zip((0, *cut), (*cut, len(parts)))] if parts else []
    return cols + [[] for _ in range(n - len(cols))]
