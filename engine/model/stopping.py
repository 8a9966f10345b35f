"""When a sequence stops, and why: one rule for every loop that generates (generate, generate_batch, the scheduler,
speculative decoding), and the names of every way a request can end or wait.

`FinishReason` and `Status` are `str` enums: a reason compares equal to its plain text ("eos"), prints as it, and
serialises as it, so a page or an HTTP reply shows the same words.
"""
from __future__ import annotations

from enum import Enum

import numpy as np

from engine.errors import ModelError


class FinishReason(str, Enum):
    EOS = "eos"                          # the model produced an end-of-sequence token (and the caller stops there)
    LENGTH = "length"                    # max_new_tokens reached
    CONTEXT = "context"                  # the cache holds the whole context window
    STOPPED = "stopped"                  # the user pressed Stop (a threading.Event was set)
    CANCELLED = "cancelled"              # the scheduler's cancel(): the client went away or asked to stop
    SESSION_CLOSED = "session closed"    # the browser session that asked for it is gone
    SERVER_SHUTDOWN = "server shut down"
    ERROR = "error"                      # the forward pass raised; the message travels separately

    def __str__(self) -> str:
        return self.value


class Status(str, Enum):
    """waiting (queued, holds no blocks) -> prefill (prompt being computed) -> running (one decode token per step)
    -> finished (finish_reason says why). A preempted request goes back to waiting."""
    WAITING = "waiting"
    PREFILL = "prefill"
    RUNNING = "running"
    FINISHED = "finished"

    def __str__(self) -> str:
        return self.value


def eos_ids(model) -> frozenset[int]:
    """The tokens that end a reply: the tokenizer's end-of-sequence ids, or the config's without a tokenizer."""
    tok = model.tokenizer
    return frozenset(tok.eos_token_ids if tok is not None else model.config.eos_token_ids)


def finish_reason(token: int, eos: frozenset[int], stop_at_eos: bool, generated: int, max_new_tokens: int,
                  cached_tokens: int, context_tokens: int) -> FinishReason | None:
    """Why generation ends after `token` (the `generated`-th new token), or None to go on. `cached_tokens` is how
    many positions the KV cache already holds: at `context_tokens` there is no room for the next one."""
    if stop_at_eos and token in eos:
        return FinishReason.EOS
    if generated >= max_new_tokens:
        return FinishReason.LENGTH
    if cached_tokens >= context_tokens:
        return FinishReason.CONTEXT
    return None


def check_max_new_tokens(max_new_tokens) -> int:
    """max_new_tokens as an int, or a ModelError saying it must be a whole number of at least 1."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ModelError(f"max_new_tokens must be a whole number ≥ 1, got {max_new_tokens!r}")
    return int(max_new_tokens)
