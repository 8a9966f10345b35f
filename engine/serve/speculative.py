"""Speculative decoding, for real: a cheap draft proposes K tokens, the full model checks them in one pass.

003 Detail 19; Leviathan et al. 2022 (arXiv:2211.17192). Greedy version: the target's pass over
[last token, d1 … dK] gives its own greedy choice g0 … gK at every position at once. Drafts are accepted while
d_i == g_(i-1); the first disagreement is replaced by the target's choice, and if all K agree, gK comes free
(the bonus token). Every emitted token is the target's argmax given the tokens before it, so the output equals
plain greedy decoding; only the number of target passes changes.

The draft here is the target's own first layers (an early exit: same embedding, final norm and LM head, arrays
shared read-only), any other model with the same vocabulary, or no model at all: prompt lookup (`PromptLookup`,
vLLM's "ngram" method) copies what followed the last occurrence of the latest n tokens earlier in the text.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from engine.errors import ModelError
from engine.model.stopping import check_max_new_tokens, eos_ids, finish_reason
from engine.model.kv_cache import KVCache
from engine.model.model import Model


def early_exit_draft(model: Model, num_layers: int) -> Model:
    """The model cut after its first `num_layers` layers, sharing every array with it (nothing is copied)."""
    L = model.config.num_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= L:
        raise ModelError(f"an early-exit draft keeps 1 to {L} layers, got {num_layers!r}")
    c, w = model.config, model.weights
    types = c.layer_types[:num_layers] if c.layer_types else None
    draft = copy.copy(model)                      # shallow: tokenizer and RoPE tables shared
    draft.config = c.replace(num_layers=num_layers, layer_types=types, name=f"{c.name} (first {num_layers} layers)")
    draft.weights = replace(w, layers=w.layers[:num_layers])
    return draft


LOOKUP_PARAGRAPH = ("The museum opens at nine in the morning and closes at six in the evening. Tickets cost twelve "
                    "dollars for adults and six dollars for children. Guided tours start every hour from the main "
                    "hall, and the cafe on the second floor serves lunch until three.")
# Two chat prompts for prompt lookup: a reply that repeats its input (the drafts copied from the prompt are mostly
# right), and one that writes new text (the n-grams rarely match, and every verification pass costs extra).
LOOKUP_EXAMPLES = {
    "copy a paragraph, changing one word (copy-heavy)":
        f"Repeat the following text exactly, but replace 'museum' with 'gallery':\n\n{LOOKUP_PARAGRAPH}",
    "write a new story (new text)": "Write a short story about a dragon who learns to bake bread.",
}


@dataclass(frozen=True)
class PromptLookup:
    """Drafts without a draft model (prompt lookup decoding; vLLM's speculative method "ngram"): find the most
    recent earlier place where the last n tokens of the text occurred (n from `max_ngram` down to `min_ngram`)
    and propose the tokens that followed it there. Free to compute, and right whenever the reply repeats its
    input (quoting, rewriting, editing code); when nothing matches, the round is a plain decode step."""
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        for name in ("max_ngram", "min_ngram"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 16:
                raise ModelError(f"{name} must be a whole number from 1 to 16, got {v!r}")
        if self.min_ngram > self.max_ngram:
            raise ModelError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")

    @property
    def name(self) -> str:
        return f"prompt lookup ({self.min_ngram}-{self.max_ngram}-grams)"

    def propose(self, seq: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of seq's last n tokens ([] if none)."""
        if k <= 0:
            return []
        a = np.asarray(seq, np.int64)
        for n in range(min(self.max_ngram, a.size - 1), self.min_ngram - 1, -1):
            starts = np.lib.stride_tricks.sliding_window_view(a[:-1], n)      # every earlier n-gram
            hits = np.flatnonzero((starts == a[-n:]).all(axis=1))
            if hits.size:
                follow = int(hits[-1]) + n                                       # the most recent occurrence
                return [int(t) for t in a[follow:follow + k]]
        return []


@dataclass
class SpeculativeResult:
    token_ids: list[int]
    finish_reason: str
    draft_tokens: int                 # K
    proposed: int = 0                 # draft tokens offered to the target
    accepted: int = 0                 # of which the target agreed with
    rounds: int = 0                   # verification passes of the target (after the prefill)
    rejections: int = 0               # rounds that ended on a disagreement
    seconds: float = 0.0              # whole run, prefill included
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    draft_steps: int = 0
    per_round: list[int] = field(default_factory=list)   # tokens emitted by each verification pass

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability α of the i.i.d. model behind `calculators.serving.speculative`: a round accepts
        drafts until its first rejection, so α̂ = accepted / (accepted + rejections)."""
        n = self.accepted + self.rejections
        return self.accepted / n if n else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Tokens each verification pass produced (the formula's E[tokens])."""
        return float(np.mean(self.per_round)) if self.per_round else float("nan")


def rewind(cache: KVCache, length: int) -> None:
    """Forget the K/V after position `length` (rejected drafts): the next write overwrites them."""
    cache.truncate(length)


def speculative_generate(target: Model, draft: "Model | PromptLookup", prompt: str | Sequence[int],
                         max_new_tokens: int = 32, draft_tokens: int = 4, stop_at_eos: bool = True) -> SpeculativeResult:
    """Greedy decoding of `target` with drafts from `draft` (a model, or `PromptLookup()`); the tokens equal
    `target.generate(..., temperature=0)`, with the same stop rules (eos, length, context)."""
    max_new = check_max_new_tokens(max_new_tokens)
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or not 1 <= draft_tokens <= 64:
        raise ModelError(f"draft_tokens must be a whole number from 1 to 64, got {draft_tokens!r}")
    lookup = draft if isinstance(draft, PromptLookup) else None
    if lookup is None and draft.config.vocab_size != target.config.vocab_size:
        raise ModelError(f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
                         f"({target.config.vocab_size}): they must share a tokenizer")
    ids = target.encode_prompt(prompt)
    target.check_prompt(ids)
    ctx = target.config.max_position_embeddings
    if lookup is None:
        ctx = min(ctx, draft.config.max_position_embeddings)
    eos = eos_ids(target)
    out = SpeculativeResult([], "", draft_tokens)
    t_start = time.perf_counter()
    extra = draft_tokens + 1                          # a sliding-window layer may have to take back k + 1
    t_cache = target.new_cache(1, ctx, extra)
    d_cache = None if lookup else draft.new_cache(1, ctx, extra)
    seq = list(ids)                                          # every token so far; t_cache holds all but the last

    def emit(token: int) -> bool:
        """Append one token under generate's stop rules; True when generation is over."""
        out.token_ids.append(token)
        seq.append(token)
        out.finish_reason = finish_reason(token, eos, stop_at_eos, len(out.token_ids), max_new, len(seq) - 1, ctx)
        return out.finish_reason is not None

    done = emit(int(np.argmax(target.prefill(ids, t_cache))))
    while not done:
        k = min(draft_tokens, max_new - len(out.token_ids) - 1, ctx - len(seq))
        t0 = time.perf_counter()
        drafts = lookup.propose(seq, k) if lookup else propose(draft, d_cache, seq, k)
        t1 = time.perf_counter()
        verify = target.forward(np.array([[seq[-1], *drafts]]), t_cache, all_logits=True)[0]   # [k+1, V]
        out.draft_seconds += t1 - t0
        out.verify_seconds += time.perf_counter() - t1
        out.draft_steps += len(drafts)
        greedy = np.argmax(verify, axis=-1)                  # g_0 … g_k
        n = 0
        while n < len(drafts) and drafts[n] == greedy[n]:
            n += 1
        out.proposed, out.accepted, out.rounds = out.proposed + len(drafts), out.accepted + n, out.rounds + 1
        out.rejections += n < len(drafts)
        new = drafts[:n] + [int(greedy[n])]
        out.per_round.append(len(new))
        rewind(t_cache, len(seq) + n)                        # keep last token + accepted drafts
        if d_cache is not None:
            rewind(d_cache, len(seq) + n)
        for t in new:
            if emit(t):
                done = True
                break
    out.seconds = time.perf_counter() - t_start
    return out


def propose(draft: Model, cache: KVCache, seq: list[int], k: int) -> list[int]:
    """k greedy draft tokens after `seq`: first feed the draft what its cache lacks, then one token at a time."""
    if k <= 0:
        return []
    logits = draft.forward(np.array([seq[int(cache.lengths[0]):]]), cache)[0]
    out = [int(np.argmax(logits))]
    while len(out) < k:
        out.append(int(np.argmax(draft.forward(np.array([[out[-1]]]), cache)[0])))
    return out
