"""What a long prompt will cost before its first word, said before Generate is pressed: the calculators' prefill
time (`calculators.sizing.latency.prefill_ms`, float32 as the engine computes) on this machine as measured. Pure:
the home page passes the prediction in (tests/ui/test_prefill_eta.py).
"""
from __future__ import annotations

SAY_FROM_S = 3.0         # a wait shorter than this needs no warning


def prefill_eta_words(prompt_tokens: int, predicted_ms: float, flop_s: float, say_from_s: float = SAY_FROM_S) -> str:
    """A sentence for a prompt whose prefill is predicted to take `say_from_s` or more: how long, from what, and
    that the progress bar counts it; "" for a short one. The prediction is a floor (every FLOP at the speed NumPy
    reached when the machine was measured), so the sentence says "at least"."""
    s = predicted_ms / 1e3
    if not s >= say_from_s:
        return ""
    return (f"This prompt is {prompt_tokens:,} tokens: reading it (prefill) will take at least about {s:,.0f} s "
            f"before the first word appears (its FLOPs at the {flop_s / 1e9:,.0f} GFLOP/s this machine was measured "
            "at; more when the class is generating). The bar under Generate counts the seconds against it.")


def prefill_wait_words(waited_s: float, predicted_s: float, prompt_tokens: int) -> str:
    """The progress bar's words while a long prompt is read (the server says nothing until the first token): the
    seconds waited against the prediction, and, once past it, that the machine is slower now than measured."""
    if waited_s <= predicted_s:
        return (f"Prefill: reading {prompt_tokens:,} prompt tokens, {waited_s:,.0f} s of at least about "
                f"{predicted_s:,.0f} s predicted")
    return (f"Prefill: reading {prompt_tokens:,} prompt tokens, {waited_s:,.0f} s, past the {predicted_s:,.0f} s "
            "predicted (the machine is busier or slower than when it was measured)")
