"""What the browser walk (tools/walkthrough.py) checks on a page, as pure functions of what the browser measured:
the text a class reads, the metrics' boxes, where a step's heading, chart and Next button lie on a 1366×768 screen,
which lessons the sidebar lists. tests/tools/test_walk_checks.py feeds them small fixtures, so the rules run in the
default test suite without a browser.

    text_problems("Model being served /usr/lib/python3/site-packages/x.gguf")  -> ["file path: ..."]
    metric_problems([{"text": "20.4 tokens/s", "height": 96, "line_px": 48}]) -> ["metric value wraps ..."]
    fold_problems({"chart_top": 822, "next_top": 300, "next_bottom": 340}, 768) -> ["key chart starts at 822 px ..."]
"""
from __future__ import annotations

import re
from pathlib import Path

MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
SNAKE = re.compile(r"(?<![\w.$\\/-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b(?![(.]\w)")      # itl_p50_ms, not a.b_c()
PATH = re.compile(r"(?<![\w:/.])(?:~|\.{1,2})?/(?:[\w.@+-]+/)+[\w.@+-]*|\b[A-Za-z]:\\[\w\\. -]+|\bsite-packages\b")
NONE = re.compile(r"\bNone\b")
REPR = re.compile(r"\{['\"][^'\"]*['\"]\s*:|\[['\"][^'\"\]]*['\"](?:,\s*['\"]|\])|\[-?\d+(?:\.\d+)?(?:,\s*-?\d+(?:\.\d+)?){2,}\]"
                  r"|\{[A-Za-z_][\w.]*(?:\([^{}]*\))?(?::[^{}]*)?\}|\b(?:np\.)?(?:float|int)(?:32|64)\(|\barray\(")
BIG_INT = re.compile(r"(?<![\w.,:#×/\\-])\d{4,}(?![\w]|[.,]\d|\s*[×x]\s*\d)")
# narrow exceptions: a year after a month or in "(2024)"/"in 2024.", a port, an id, an RTX card
YEAR_OK = re.compile(rf"(?:{MONTHS} (?:\d{{1,2}},? )?|\(|\bin |\bsince |©\s?|[\"”], |\bet al\.,? )((?:19|20)\d\d)(?=[),.;:\s]|$)"
                     r"|\b((?:19|20)\d\d)-[01]\d-[0-3]\d\b")       # a citation's year ("Sinks", 2023), a date
ID_OK = re.compile(r"(?:\bport |\bids? |\bRTX |\bGTX |\btoken )(\d{4,})\b")


def text_problems(text: str) -> list[str]:
    """What a class should never read on a slide: a raw identifier (itl_p50_ms), a file path, `None`, a Python
    repr ({'a': 1}, ['x', 'y'], [1, 2, 4] (an interval [-128, 127] is math), np.float64(…), an f-string's
    {placeholder}) or an integer of 4+ digits
    without thousands separators (1699 for 1,699; a year, port, id or RTX card number is allowed)."""
    out: list[str] = []
    plain = URL.sub(" ", text)
    for m in SNAKE.finditer(plain):
        out.append(f"raw identifier: {m.group(0)!r} in {_around(plain, m)!r}")
    for m in PATH.finditer(plain):
        out.append(f"file path: {_around(plain, m)!r}")
    for m in NONE.finditer(plain):
        out.append(f"None shown: {_around(plain, m)!r}")
    for m in REPR.finditer(plain):
        out.append(f"Python repr: {_around(plain, m)!r}")
    allowed = {m.start(g) for pat in (YEAR_OK, ID_OK) for m in pat.finditer(plain)
               for g in range(1, (pat.groups or 0) + 1) if m.group(g)}
    for m in BIG_INT.finditer(plain):
        if m.start() not in allowed:
            out.append(f"number without thousands separators: {m.group(0)} in {_around(plain, m)!r}")
    return out


def _around(text: str, m: re.Match, k: int = 40) -> str:
    return text[max(0, m.start() - k):m.end() + k].strip()


def metric_problems(boxes: list[dict]) -> list[str]:
    """Metric values that wrap: a box taller than 1.5 of its first line (`height`, `line_px` in px, as the browser
    measured them: "32.5 / tokens/s" on two lines, "20.4 / tokens/ / s" on three)."""
    return [f"metric value wraps onto {round(b['height'] / b['line_px'])} lines: {b['text']!r}"
            for b in boxes if b.get("line_px") and b["height"] > 1.5 * b["line_px"]]


def fold_problems(geom: dict, height: int = 768) -> list[str]:
    """A step or page whose key chart starts below the first screen, or whose Next button is off screen while the
    chart is on it. `geom`: chart_top (px from the top of the window of the key chart, or of the first metric on
    a page without a chart, `key` saying which; None = neither), next_top and next_bottom (None = no Next button),
    heading_top."""
    out = []
    top = geom.get("chart_top")
    if top is not None and top > height:
        out.append(f"key {geom.get('key', 'chart')} starts at {top:.0f} px, below the first screen ({height} px)"
                   + (f"; heading at {geom['heading_top']:.0f} px" if geom.get("heading_top") is not None else ""))
    nt, nb = geom.get("next_top"), geom.get("next_bottom")
    if nt is not None and (nt < 0 or nb > height):
        out.append(f"Next button at {nt:.0f}-{nb:.0f} px, off the first screen with the chart")
    return out


def sidebar_problems(links: dict[str, bool], needed: list[str]) -> list[str]:
    """Lessons of the lesson plans that the sidebar does not show without "View more" (`links`: URL path ->
    visible)."""
    return [f"sidebar hides {p} (behind \"View more\" or missing)" for p in needed if not links.get(p)]


PLAN_HEADINGS = ("**45 minutes", "**90 minutes")


def lesson_plan_titles(readme: str) -> list[str]:
    """The page titles of the README's lesson plans, in order of first use (a cell may name several, split by
    "·" or ", " before a capital; "as above" rows name pages already listed)."""
    titles: list[str] = []
    in_plan = False
    for line in readme.splitlines():
        if line.startswith(PLAN_HEADINGS):
            in_plan = True
        elif in_plan and line.startswith("|") and not line.startswith(("| min", "|---")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for name in (n for part in re.split(r"\s*·\s*", cells[1]) for n in _names(part)):
                if name and name not in titles:
                    titles.append(name)
        elif in_plan and line.strip() and not line.startswith("|"):
            in_plan = line.startswith(PLAN_HEADINGS)
    return titles


def _names(cell: str) -> list[str]:
    """ "Home, Walkthrough" -> two pages; "KV cache, step by step" is one (a title's own comma is followed by a
    lower-case word)."""
    parts = [p.strip() for p in cell.split(",")]
    return parts if all(p[:1].isupper() for p in parts) else [cell.strip()]


def lesson_plan_paths(readme: str, pages_dir: Path) -> list[str]:
    """URL paths of the README's lesson-plan pages ("/" for Home), via the app's own page titles (ui.nav)."""
    from ui.nav import page_files
    by_title = {f.title: "/" + f.path.stem.split("_", 1)[1] for f in page_files(pages_dir)}
    by_title["Home"] = "/"
    missing = [t for t in lesson_plan_titles(readme) if t not in by_title]
    if missing:
        raise ValueError(f"the README's lesson plans name pages the app does not have: {missing}")
    return [by_title[t] for t in lesson_plan_titles(readme)]
