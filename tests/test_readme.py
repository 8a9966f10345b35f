"""The README is a newcomer's first screen, and it points at docs/ for the rest.

Checked against the README's own text and the files on disk:
- the two commands, the address to open and the product's one name come in its first screen (a rewrite that
  buries the Quickstart below the architecture again fails);
- it stays under 250 lines (a lab notebook growing back fails);
- every relative link in the README and in docs/*.md names a file that exists, and every docs/*.md file is linked
  from the README (a moved or renamed doc fails);
- `dev.sh` handles each `./dev.sh WORD` the README shows (a command the README documents but dev.sh lost fails);
- the app calls itself by the README's name (the app saying "LLM inference, by hand" again fails).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_SCREEN = 40                      # lines a newcomer sees without scrolling far
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def product_name() -> str:
    """The README's title up to its colon: "# Inference Lab: see and size ..." -> "Inference Lab"."""
    title = _lines()[0]
    assert title.startswith("# "), "the README starts with its title"
    return title[2:].split(":")[0].strip()


def test_first_screen_says_what_it_is_how_to_run_it_and_where_to_look():
    first = "\n".join(_lines()[:FIRST_SCREEN])
    assert "./dev.sh app" in first and "./dev.sh test" in first
    assert "http://localhost:8501" in first
    assert product_name() in first.split("\n", 1)[1], "the name appears in the text too, not only the title"


def test_readme_stays_short():
    assert len(_lines()) < 250


def test_every_relative_link_resolves_and_every_doc_is_linked():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "the README's details live in docs/"
    linked_from_readme = set()
    for md in [README, *docs]:
        for target in LINK.findall(md.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
                continue
            path = (md.parent / target).resolve()
            assert path.exists(), f"{md.relative_to(ROOT)} links to {target}, which does not exist"
            if md == README:
                linked_from_readme.add(path)
    missing = [d.name for d in docs if d.resolve() not in linked_from_readme]
    assert missing == [], f"docs not linked from the README: {missing}"


def test_every_dev_sh_command_in_the_readme_is_handled():
    words = set(re.findall(r"\./dev\.sh (\w+)", README.read_text(encoding="utf-8")))
    assert {"app", "test"} <= words
    handled = set(re.findall(r"^\s*(\w+)\)", (ROOT / "dev.sh").read_text(), re.M))
    assert words <= handled, f"the README shows ./dev.sh {sorted(words - handled)}, which dev.sh does not handle"


def test_the_app_uses_the_readmes_name():
    import ui
    assert ui.APP_TITLE == product_name()
    for path in [ROOT / "app.py", *ROOT.glob("ui/*.py"), *ROOT.glob("pages/*.py"), *ROOT.glob("docs/*.md")]:
        assert "LLM inference, by hand" not in path.read_text(encoding="utf-8"), f"{path.name} uses the old name"
