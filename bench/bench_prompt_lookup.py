"""Prompt-lookup speculative decoding (vLLM's "ngram" method) against plain greedy decoding, in one run.

    python bench/bench_prompt_lookup.py              # the default model (SmolLM2-135M-Instruct), 3 rounds
    python bench/bench_prompt_lookup.py --rounds 5 --new 96

Two chat prompts: one whose reply repeats its input (rewrite a paragraph with one change: the draft, copied from
the prompt, is mostly right) and one whose reply is new text (a story: the n-grams rarely match). For each, plain
greedy and prompt-lookup decoding alternate `--rounds` times; the script prints the median wall time and its
range, the speedup (plain ÷ lookup, median of per-round ratios), acceptance, tokens per target pass, and the
formula's tokens per pass (1 - α^(K+1)) / (1 - α) with the measured α next to them. Outputs must be identical.
On a shared machine the wall times move with the load: compare the ratios, measured back to back.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.serving.speculative import expected_tokens_per_pass  # noqa: E402
from engine import load_model  # noqa: E402
from engine.serve.speculative import LOOKUP_EXAMPLES, PromptLookup, speculative_generate  # noqa: E402

PROMPTS = LOOKUP_EXAMPLES


def chat_ids(model, text: str) -> list[int]:
    tok = model.tokenizer
    if tok.has_chat_template:
        return list(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}])))
    return list(tok.encode(text))


def one_round(model, ids, new, k, lookup):
    t0 = time.perf_counter()
    plain = [t.token_id for t in model.generate(ids, max_new_tokens=new, stop_at_eos=False)]
    plain_s = time.perf_counter() - t0
    res = speculative_generate(model, lookup, ids, max_new_tokens=new, draft_tokens=k, stop_at_eos=False)
    return plain, plain_s, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=64, help="new tokens per run")
    ap.add_argument("--k", type=int, default=8, help="draft tokens per round")
    args = ap.parse_args()
    model = load_model(args.model)
    lookup = PromptLookup()
    print(f"{model.name}: {lookup.name}, K = {args.k}, {args.new} new tokens, {args.rounds} rounds")
    for label, text in PROMPTS.items():
        ids = chat_ids(model, text)
        one_round(model, ids, 4, args.k, lookup)                          # warm-up
        ratios, plain_t, spec_t = [], [], []
        for _ in range(args.rounds):
            plain, plain_s, res = one_round(model, ids, args.new, args.k, lookup)
            assert res.token_ids == plain, "prompt lookup changed the greedy output"
            ratios.append(plain_s / res.seconds)
            plain_t.append(plain_s)
            spec_t.append(res.seconds)
        a = res.alpha
        formula = expected_tokens_per_pass(a, args.k) if a == a else float("nan")
        print(f"\n{label}: prompt {len(ids)} tokens; reply starts {model.tokenizer.decode(plain[:24])!r}")
        print(f"  plain  {statistics.median(plain_t):.2f} s (range {min(plain_t):.2f}-{max(plain_t):.2f})   "
              f"lookup {statistics.median(spec_t):.2f} s (range {min(spec_t):.2f}-{max(spec_t):.2f})")
        print(f"  speedup {statistics.median(ratios):.2f}x (per-round ratios "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); identical output: yes")
        print(f"  proposed {res.proposed}, accepted {res.accepted} (rate {res.acceptance_rate:.2f}), alpha {a:.2f}; "
              f"target passes {res.rounds} for {len(res.token_ids) - 1} tokens after the first: "
              f"{res.tokens_per_pass:.2f} tokens/pass (formula with this alpha: {formula:.2f})")


if __name__ == "__main__":
    main()
