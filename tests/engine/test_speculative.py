"""Speculative decoding emits exactly the target's greedy tokens, whatever the draft proposes."""
import numpy as np
import pytest

from calculators.serving.speculative import expected_tokens_per_pass
from engine import Model, ModelError
from engine.serve.speculative import early_exit_draft, speculative_generate
from helpers_models import prompt, tiny


@pytest.fixture(scope="module")
def target():
    return Model.random(tiny(num_layers=4), seed=5, std=0.3)


def greedy(model, ids, **kw):
    return [t.token_id for t in model.generate(ids, **kw)]


@pytest.mark.parametrize("k", [1, 3, 4])
def test_self_draft_accepts_everything_and_equals_greedy(target, k):
    """Draft = the target itself: every draft is accepted, each pass yields K + 1 tokens (the bonus path)."""
    ids = prompt(7, seed=1)
    res = speculative_generate(target, target, ids, max_new_tokens=21, draft_tokens=k, stop_at_eos=False)
    assert res.token_ids == greedy(target, ids, max_new_tokens=21, stop_at_eos=False)
    assert res.accepted == res.proposed and res.rejections == 0
    # 1 token from the prefill, then full rounds of k+1 and a last, shorter one: ⌈20 / (k+1)⌉ passes
    assert res.rounds == -(-20 // (k + 1))
    assert res.per_round[0] == k + 1 == expected_tokens_per_pass(1.0, k)


@pytest.mark.parametrize("layers", [1, 2])
def test_early_exit_draft_equals_greedy(target, layers):
    """A truncated draft disagrees often: the rejection path runs, the output still equals plain greedy."""
    draft = early_exit_draft(target, layers)
    assert draft.weights.layers[0] is target.weights.layers[0] and draft.weights.lm_head is target.weights.lm_head
    for seed in range(3):
        ids = prompt(5 + 3 * seed, seed=seed)
        res = speculative_generate(target, draft, ids, max_new_tokens=16, draft_tokens=4, stop_at_eos=False)
        assert res.token_ids == greedy(target, ids, max_new_tokens=16, stop_at_eos=False)
        assert res.proposed > 0 and 0 <= res.accepted <= res.proposed
        assert sum(res.per_round) + 1 >= len(res.token_ids)          # every token came from a pass
    assert target.config.num_layers == 4                             # the target is untouched


def test_unrelated_draft_is_rejected_but_output_unchanged(target):
    other = Model.random(tiny(num_layers=1), seed=99, std=0.3)        # shares only the vocabulary size
    ids = prompt(6, seed=4)
    res = speculative_generate(target, other, ids, max_new_tokens=12, draft_tokens=3, stop_at_eos=False)
    assert res.token_ids == greedy(target, ids, max_new_tokens=12, stop_at_eos=False)
    assert res.rejections > 0


def test_stop_rules_equal_plain_decoding(target):
    ctx = target.config.max_position_embeddings
    ids = prompt(ctx - 6, seed=5)                                     # runs into the context window
    plain = list(target.generate(ids, max_new_tokens=20, stop_at_eos=False))
    res = speculative_generate(target, target, ids, max_new_tokens=20, draft_tokens=4, stop_at_eos=False)
    assert res.token_ids == [t.token_id for t in plain] and res.finish_reason == plain[-1].finish_reason == "context"
    ids = prompt(5, seed=6)
    first = greedy(target, ids, max_new_tokens=8, stop_at_eos=False)
    with_eos = Model(tiny(num_layers=4, eos_token_id=first[3]), target.weights)   # 4th greedy token ends it
    res = speculative_generate(with_eos, with_eos, ids, max_new_tokens=8, draft_tokens=4)
    assert res.token_ids == greedy(with_eos, ids, max_new_tokens=8) and res.finish_reason == "eos"


def test_bad_speculative_options_raise_clear_errors(target):
    with pytest.raises(ModelError, match="draft_tokens"):
        speculative_generate(target, target, [1, 2], draft_tokens=0)
    with pytest.raises(ModelError, match="layers"):
        early_exit_draft(target, 0)
    with pytest.raises(ModelError, match="vocabulary"):
        speculative_generate(target, Model.random(tiny(vocab_size=301), seed=1), [1, 2])
    with pytest.raises(ModelError, match="context window"):
        speculative_generate(target, target, prompt(target.config.max_position_embeddings))


def test_default_model_speculative_equals_greedy(default_model):
    ids = default_model.tokenizer.encode("The capital of France is")
    draft = early_exit_draft(default_model, default_model.config.num_layers // 2)
    res = speculative_generate(default_model, draft, ids, max_new_tokens=8, draft_tokens=3, stop_at_eos=False)
    assert res.token_ids == greedy(default_model, ids, max_new_tokens=8, stop_at_eos=False)
    assert np.isfinite(res.alpha)


# ---------------------------------------------------------------------------------------- prompt lookup (n-grams)
@pytest.mark.parametrize("seq,k,expected", [
    ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),          # no earlier [4, 1, 2]; [1, 2] occurred at 0: what followed it
    ([7, 8, 9, 7, 8, 5, 7, 8], 2, [5, 7]),       # the LATEST earlier [7, 8] wins (at 3, not at 0)
    ([5, 6, 7, 6, 7], 4, [6, 7]),                # [6, 7] at 1: only two tokens follow it
    ([1, 2, 3], 4, []),                          # nothing repeats: no draft, the round is a plain decode step
])
def test_prompt_lookup_proposes_what_followed_the_latest_earlier_ngram(seq, k, expected):
    from engine.serve.speculative import PromptLookup
    assert PromptLookup(max_ngram=3, min_ngram=1).propose(seq, k) == expected


def brute_force_lookup(seq, k, max_n, min_n):
    """The same rule as a plain loop: longest n first, latest earlier start first."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(seq):
            continue
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i:i + n] == seq[-n:]:
                return seq[i + n:i + n + k]
    return []


def test_prompt_lookup_agrees_with_a_brute_force_loop():
    from engine.serve.speculative import PromptLookup
    rng = np.random.default_rng(0)
    for _ in range(300):
        seq = [int(t) for t in rng.integers(0, 4, rng.integers(1, 30))]
        k, hi = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        lo = int(rng.integers(1, hi + 1))
        assert PromptLookup(hi, lo).propose(seq, k) == brute_force_lookup(seq, k, hi, lo), (seq, k, hi, lo)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_prompt_lookup_equals_greedy_on_a_repetitive_prompt(target, k):
    from engine.serve.speculative import PromptLookup
    ids = prompt(10, seed=3) * 3                                    # the text repeats: lookups find n-grams
    res = speculative_generate(target, PromptLookup(), ids, max_new_tokens=24, draft_tokens=k, stop_at_eos=False)
    assert res.token_ids == greedy(target, ids, max_new_tokens=24, stop_at_eos=False)
    assert sum(res.per_round) >= len(res.token_ids) - 1 and res.rounds == len(res.per_round)


def test_prompt_lookup_refuses_bad_ngram_sizes():
    from engine.serve.speculative import PromptLookup
    with pytest.raises(ModelError, match="min_ngram"):
        PromptLookup(max_ngram=2, min_ngram=3)
    with pytest.raises(ModelError, match="max_ngram"):
        PromptLookup(max_ngram=0)
