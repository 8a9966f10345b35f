"""What the AppTest-driven page tests share: the session they start with (a fast random engine model) and the
errors a run shows."""
from __future__ import annotations

import json
import re

from streamlit.testing.v1 import AppTest

from ui.model_picker import CHOICE_KEY, random_choice
from ui.model_source import DEVICE_KEY, PRESET_KEY, REFERENCE_DEVICE, REFERENCE_PRESET

SMALL_RANDOM = random_choice("SmolLM2-135M-Instruct")     # random weights in SmolLM2's shape: builds in a second
# The reference text's running example, chosen explicitly by tests that quote its numbers (the sizing pages open on
# the class's own model and machine, ui/world.py): session state for TinyLlama-1.1B on an A100 SXM 40GB.
REFERENCE = {PRESET_KEY: REFERENCE_PRESET, DEVICE_KEY: REFERENCE_DEVICE}


def run_script(path: str, timeout: float, choice: str | None = SMALL_RANDOM, **state) -> AppTest:
    """app.py or a page file run once with `choice` as the engine model and `state` in its session."""
    at = AppTest.from_file(path, default_timeout=timeout)
    if choice is not None:
        at.session_state[CHOICE_KEY] = choice
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def errors(at: AppTest) -> list[str]:
    """Every st.error on the page and in the sidebar."""
    return [e.value for e in at.error] + [e.value for e in at.sidebar.error]


CODE = re.compile(r"\b00\d Details? \d+|\breference 00\d\b")      # a source named by its file number only
# a Python expression left in braces (an f-string prefix forgotten on one line of a concatenated text), not LaTeX
PLACEHOLDER = re.compile(r"(?<![\w\\^_}$])\{[A-Za-z_][\w.]*(\([^{}]*\)|\[[^{}]*\])?(:[^{}]*)?\}")


def chart_specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def drawn(spec: dict) -> bool:
    """Some trace of the chart has data to draw (plain lists, or plotly's base64-packed arrays)."""
    def filled(v) -> bool:
        return bool(v.get("bdata")) if isinstance(v, dict) else v is not None and len(v) > 0
    return any(filled(t.get(k)) for t in spec.get("data", []) for k in ("x", "y", "z", "values", "base"))


def page_text(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "success", "subheader", "header")
             for e in at.get(kind)]
    return "\n".join(str(p) for p in parts + [f"{m.label} {m.value}" for m in at.metric])


def walkthrough_problems(at: AppTest) -> list[str]:
    """What a class would notice first on a page (issue 18): an error, an exception, an empty chart, a source
    named by a bare code ("003 Detail 18"), a placeholder left unformatted ("{len(front)} plans")."""
    out = [f"error: {e}" for e in errors(at)] + [f"exception: {e.value}" for e in at.exception]
    out += [f"empty chart: {s.get('layout', {}).get('title')}" for s in chart_specs(at) if not drawn(s)]
    text = page_text(at)
    prose = re.sub(r"`[^`]*`", "", text)                 # code spans may show templates ("blocks.{l}.attn")
    out += [f"unformatted placeholder: {m.group(0)}" for m in PLACEHOLDER.finditer(prose)]
    return out + [f"source named by a code: {m.group(0)}" for m in CODE.finditer(text)]


def press_main_button(at: AppTest) -> str | None:
    """Click the page's first enabled primary button and rerun; its label, or None when there is none."""
    primary = [b for b in at.button if b.proto.type == "primary" and not b.proto.disabled]
    if not primary:
        return None
    primary[0].click().run()
    return primary[0].proto.label


def in_datacentre(state: dict) -> dict:
    """`state` for a page that always works at data-centre scale (Parallelism, the planner): while the switch says
    "this class's machine", such a page keeps its model and device under keys of its own."""
    from ui.world import DATACENTRE, DEVICE_KEY, PRESET_KEY
    return {(f"{DATACENTRE.key}.{k}" if k in (PRESET_KEY, DEVICE_KEY) else k): v for k, v in state.items()}


def in_order(node, out=None) -> list[str]:
    """The page's elements top to bottom: their types (a block's children in their order on the page)."""
    out = [] if out is None else out
    children = getattr(node, "children", None)
    if children:
        for k in sorted(children):
            in_order(children[k], out)
    else:
        out.append(getattr(node, "type", ""))
    return out


def chart_comes_first(at: AppTest, *later: str, since: str = "title") -> list[str]:
    """The page's key (first) chart on its first screen (1366×768): it comes before every element of the kinds
    `later` ("text_area": the prompt box, "markdown": the intro's prose, ...), counted from the first element of
    kind `since` (the page's title: setup_page's style comes before it; or its first input, after the notes a
    sizing page opens with). Returns the element kinds from there for the assertion's message; fails when a kind
    of `later` comes first or the page drew no chart."""
    kinds = in_order(at.main)
    kinds = kinds[kinds.index(since):] if since in kinds else kinds
    assert "plotly_chart" in kinds, kinds
    chart = kinds.index("plotly_chart")
    for kind in later:
        assert kind not in kinds or chart < kinds.index(kind), (kind, kinds)
    return kinds
