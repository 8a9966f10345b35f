"""One request the scheduler serves: its prompt, the tokens generated so far, its block table, status and timings."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from engine.model.stopping import FinishReason, Status

@dataclass(eq=False)
class Request:
    """status: "waiting" (queued, holds no blocks) -> "prefill" (prompt being computed) -> "running" (one decode
    token per step) -> "finished" (finish_reason says why). A preempted request goes back to "waiting" and later
    recomputes its prompt and the tokens it already generated.

    num_cached counts the tokens of prompt_ids + token_ids whose K/V sit in the blocks of block_table; every step
    the request feeds the rest (a prompt chunk, or the one token it just sampled)."""
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_at_eos: bool = True
    logprobs: int | None = None       # keep log p of each sampled token and this many alternatives (None: none)
    presence_penalty: float = 0.0     # OpenAI's penalties over the generated tokens (engine.model.sampling)
    frequency_penalty: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)      # log p of token_ids[i] (raw logits, T = 1)
    top_logprobs: list[tuple] = field(default_factory=list)        # ((id, log p), ...) most likely first
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0
    prefix_cached_tokens: int = 0     # prompt tokens served from the prefix cache (not recomputed)
    preemptions: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    scheduled_at: float | None = None  # first admitted into the batch: the end of its wait (vLLM's queue time)
    first_token_at: float | None = None
    finished_at: float | None = None
    itl_s: list[float] = field(default_factory=list)
    last_token_at: float | None = None
    hashed_blocks: int = field(default=0, repr=False)          # full blocks already offered to the prefix cache
    last_hash: int | None = field(default=None, repr=False)    # chain hash of the last of them
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)   # its own stream: the same draws as the request run alone

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.token_ids

    @property
    def num_pending(self) -> int:
        """Tokens not yet in the cache (the prompt's rest, or the last sampled token)."""
        return len(self.prompt_ids) + len(self.token_ids) - self.num_cached

    @property
    def done(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at

    def record_token(self, token_id: int, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        else:
            self.itl_s.append(now - self.last_token_at)
        self.last_token_at = now
        self.token_ids.append(int(token_id))

    def finish(self, reason: FinishReason, now: float | None = None) -> None:
        self.status, self.finish_reason = Status.FINISHED, FinishReason(reason)
        self.finished_at = time.perf_counter() if now is None else now
