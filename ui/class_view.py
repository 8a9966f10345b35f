"""The Class page's words about the live batch, as pure functions (no streamlit): the served model's name, the
last step next to the batch as it is now, and the measured column of the theory table. Each says only what the
snapshot shows (tests/ui/test_class_view.py).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from ui.narration import plural

_QUANT = re.compile(r"[.-](?:Q\d\w*|F16|F32|BF16|fp16|fp32)$", re.IGNORECASE)


def served_model_label(source: str, loaded_name: str | None = None) -> str:
    """The served model as a class reads it: the loaded model's name when the app holds it, else the file's or
    repository's name ("SmolLM2-135M-Instruct" for …/site-packages/…/SmolLM2-135M-Instruct.Q4_1.gguf), never a
    path; random weights say so."""
    if source.startswith("random:"):
        return f"{source.split(':', 1)[1]} (random weights)"
    if loaded_name:
        return loaded_name
    p = Path(source)
    name = p.stem if p.suffix.lower() in (".gguf", ".safetensors", ".bin") else p.name
    return _QUANT.sub("", name) or source


def last_step_words(seconds: float, decoded: int, prefilled: int, tokens_out: int, age_s: float,
                    running_now: int) -> str:
    """The last step in a sentence, and how it relates to the batch running now: a step that decoded 5 while
    4 run now says that one left (finished) since, so the two numbers beside each other do not contradict."""
    head = (f"Last step ({age_s:,.1f} s ago): {seconds * 1e3:,.1f} ms, {plural(decoded, 'sequence')} decoded, "
            f"{plural(prefilled, 'prompt token')} prefilled, {plural(tokens_out, 'token')} out.")
    if decoded == running_now:
        return head
    diff = abs(decoded - running_now)
    change = (f"{plural(diff, 'request')} finished or stopped since" if decoded > running_now else
              f"{plural(diff, 'request')} joined since")
    return head + f" Running now: {running_now} ({change})."


def measured_cells(batch: int, single_tok_s: float, aggregate_tok_s: float) -> list[tuple[str, str]]:
    """(row, measured tokens/s) of the theory table. A batch of one is one row (the lone stream is the current
    batch, measured either way); with a larger batch, a lone stream not yet seen says so in words, so the table
    never reads "not measured" beside a number measured for the same thing."""
    def num(v: float) -> str | None:
        return f"{v:,.1f}" if math.isfinite(v) else None
    if batch <= 1:
        v = num(single_tok_s) or num(aggregate_tok_s)
        return [("one stream (the current batch)", v or "no decode step yet")]
    return [("one stream alone", num(single_tok_s) or "no step has run one stream alone yet"),
            (f"the current batch ({batch})", num(aggregate_tok_s) or "no decode step in the last 10 s")]
