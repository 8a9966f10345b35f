"""The planner's workload: the request rate, prompt and output lengths (mean and p99) and the latency targets a
plan must meet. Its own module so that what the planner's searches share (`screening`, `wide_ep`) reads it without
importing the planner (which imports them). `calculators.planning.planner` re-exports it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from calculators.serving.lengths import Lengths
from calculators.units import check_int, check_positive
from specs.model_config import SpecError
from specs.workloads import mlperf_dataset


@dataclass(frozen=True)
class Workload:
    """The load to serve: request rate, prompt and output lengths (mean, and the p99 prompt for TTFT), targets."""
    requests_per_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_p99_ms: float
    itl_ms: float
    prompt_tokens_p99: int | None = None
    prefix_hit_rate: float = 0.0         # share of each prompt served from the prefix cache (a shared system prompt)
    output_tokens_p99: int | None = None     # None: every reply has the mean length; else a lognormal through both

    def check(self) -> "Workload":
        check_positive("request rate (requests/s)", self.requests_per_s, limit=1e7)
        check_int("prompt tokens", self.prompt_tokens, limit=1 << 24)
        check_int("output tokens", self.output_tokens, limit=1 << 24)
        check_positive("TTFT p99 target (ms)", self.ttft_p99_ms)
        check_positive("ITL target (ms)", self.itl_ms)
        if self.prompt_tokens_p99 is not None and check_int("p99 prompt tokens", self.prompt_tokens_p99,
                                                            limit=1 << 24) < self.prompt_tokens:
            raise SpecError("the p99 prompt length cannot be shorter than the mean")
        if self.output_tokens_p99 is not None and check_int("p99 output tokens", self.output_tokens_p99,
                                                            limit=1 << 24) < self.output_tokens:
            raise SpecError("the p99 output length cannot be shorter than the mean")
        self.prompt_lengths(), self.output_lengths()           # a p99 no lognormal reaches: one clear message
        h = self.prefix_hit_rate
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1:
            raise SpecError(f"prefix-cache hit rate is the share of prompt tokens found in the cache: from 0 up to "
                            f"(not including) 1, got {h!r}")
        return self

    def new_prompt_tokens(self, prompt_tokens: int) -> int:
        """Prompt tokens a prefill still computes when `prefix_hit_rate` of them hit the cache (at least 1)."""
        return max(1, math.ceil(prompt_tokens * (1 - self.prefix_hit_rate)))

    @property
    def p99_prompt(self) -> int:
        return self.prompt_tokens_p99 or self.prompt_tokens

    def prompt_lengths(self, new_only: bool = False) -> Lengths:
        """The prompt distribution (fixed, or the lognormal through mean and p99); `new_only`: the tokens a
        prefill still computes after prefix-cache hits."""
        f = self.new_prompt_tokens if new_only else (lambda x: x)
        return Lengths.from_mean_p99(f(self.prompt_tokens), f(self.p99_prompt))

    def longest_request(self, context_tokens: int) -> int:
        """Prompt p99 + output p99 (or mean), capped at the context window: what a server's max model length must
        hold for this workload."""
        return min(context_tokens, self.p99_prompt + (self.output_tokens_p99 or self.output_tokens))

    def output_lengths(self) -> Lengths:
        return Lengths.from_mean_p99(self.output_tokens, self.output_tokens_p99)


def dataset_length_fields(key: str) -> dict:
    """A measured dataset's lengths as the planner's four length inputs (`specs.workloads`: an MLPerf dataset's
    per-sample statistics): its prompts' mean and p99 and its reference answers' mean and p99, in whole tokens. The
    planner draws a lognormal through each pair; `serve-at --workload mlperf-<key>` prices the histogram itself."""
    d = mlperf_dataset(key)
    p, o = d["prompt"]["samples"], d["output"]["samples"]
    mean_p, mean_o = max(1, round(p["mean"])), max(1, round(o["mean"]))
    return dict(prompt_tokens=mean_p, prompt_tokens_p99=max(mean_p, round(p["p99"])), output_tokens=mean_o,
                output_tokens_p99=max(mean_o, round(o["p99"])), samples=d["samples"], source=d["source"])
