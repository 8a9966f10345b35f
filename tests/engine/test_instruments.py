"""Per-call instruments: hooks, run_with_cache, record_generation. Expected values come from a naive NumPy
reference written here (full [T, T] attention, no blocks, no cache), from formulas, or from slicing a full capture."""
import threading

import numpy as np
import pytest

import engine.model.forward
from engine import (ActivationCache, GenerationRecord, Hooks, Model, ModelError, Trace, record_generation,
                    run_with_cache)
from specs.model_config import ModelConfig

CFG = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=96, vocab_size=300, max_position_embeddings=64, rms_norm_eps=1e-5,
                  rope_theta=10000.0, eos_token_id=2)
# float32 engine vs float32 reference with different summation order: differences are a few ulp of values ~1-10,
# far below 1e-4; a missing mask or a wrong row changes results by O(0.1) or more
TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return Model.random(CFG, seed=4, std=0.2)          # std 0.2: peaked attention, so a leak is not averaged away


@pytest.fixture
def small_blocks(monkeypatch):
    """Attention in blocks of 8 queries, so a 20-token prompt takes 3 blocks (8 + 8 + 4)."""
    monkeypatch.setattr(engine.model.forward, "QUERY_BLOCK", 8)


def ids(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(3, CFG.vocab_size, n)]


# ------------------------------------------------------------------------------------ naive reference
def naive_forward(model, tokens):
    """Llama forward written out plainly: full causal attention over all T queries at once, head by head.
    -> logits [T, V], patterns [layer][head] -> [T, T]"""
    c, w = model.config, model.weights
    T, d, G = len(tokens), c.head_dim, c.num_heads // c.num_kv_heads

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_norm_eps) * g

    inv = c.rope_theta ** (-np.arange(0, d, 2) / d)
    ang = np.arange(T)[:, None] * inv[None, :]                          # [T, d/2]

    def rope(x):                                                        # [T, d], "rotate half" layout
        x1, x2 = x[:, : d // 2], x[:, d // 2:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    x = w.embed[tokens].astype(np.float64)
    future = np.triu(np.ones((T, T), bool), k=1)
    patterns = []
    for lw in w.layers:
        h = rms(x, lw.attn_norm)
        qkv = h @ lw.wqkv.T
        q, k, v = np.split(qkv, [c.q_dim, c.q_dim + c.kv_dim], axis=-1)
        outs, pats = [], []
        for j in range(c.num_heads):
            g = j // G                                                  # the K/V head query head j shares
            qj, kg, vg = rope(q[:, j * d:(j + 1) * d]), rope(k[:, g * d:(g + 1) * d]), v[:, g * d:(g + 1) * d]
            s = qj @ kg.T / np.sqrt(d)
            s[future] = -np.inf
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            pats.append(p)
            outs.append(p @ vg)
        patterns.append(pats)
        x = x + np.concatenate(outs, -1) @ lw.wo.T
        gate, up = np.split(rms(x, lw.ffn_norm) @ lw.w_gate_up.T, 2, axis=-1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ lw.w_down.T
    return rms(x, w.final_norm) @ w.lm_head.T, patterns


def test_prompt_longer_than_one_query_block_equals_naive_full_attention(model, small_blocks):
    tokens = ids(20)
    ref_logits, ref_pat = naive_forward(model, tokens)
    logits, acts = run_with_cache(model, tokens, names=("blocks.*.attn.hook_pattern",))
    assert np.abs(logits - ref_logits).max() < TOL                      # every position, all 3 blocks
    for li in range(CFG.num_layers):
        pat = acts[f"blocks.{li}.attn.hook_pattern"]
        assert pat.shape == (CFG.num_heads, 20, 20)
        assert np.abs(pat - np.stack(ref_pat[li])).max() < TOL


def test_chunked_prefill_past_one_block_equals_naive(model, small_blocks):
    tokens = ids(20, seed=1)
    ref_logits, _ = naive_forward(model, tokens)
    cache = model.new_cache(1)
    model.prefill(tokens[:5], cache)                                    # then 15 queries starting at position 5
    last = model.prefill(tokens[5:], cache)
    assert np.abs(last - ref_logits[-1]).max() < TOL


def test_pattern_rows_are_distributions_and_masked_entries_are_exactly_zero(model, small_blocks):
    _, acts = run_with_cache(model, ids(20, seed=2), names=("blocks.*.attn.hook_pattern", "blocks.*.attn.hook_scores"))
    future = np.triu(np.ones((20, 20), bool), k=1)
    for li in range(CFG.num_layers):
        pat, scores = acts[f"blocks.{li}.attn.hook_pattern"], acts[f"blocks.{li}.attn.hook_scores"]
        assert np.allclose(pat.sum(-1), 1.0, atol=1e-6)                 # float32 sum of ≤ 20 terms
        assert np.all(pat[:, future] == 0.0)
        assert np.all(np.isneginf(scores[:, future])) and np.all(np.isfinite(scores[:, ~future]))


def test_head_and_row_selection_equals_slicing_the_full_capture(model, small_blocks):
    tokens = ids(20, seed=3)
    _, full = run_with_cache(model, tokens)
    _, some = run_with_cache(model, tokens, layers=[1], heads=[3, 0], rows=[2, 15, -1])
    assert some.names() == ["blocks.1.attn.hook_pattern"]               # layer 0 not kept
    want = full["blocks.1.attn.hook_pattern"][[0, 3]][:, [2, 15, 19]]   # heads and rows in ascending order
    assert np.array_equal(some["blocks.1.attn.hook_pattern"], want)
    _, tail = run_with_cache(model, tokens, heads=[1], rows=slice(9, None))
    assert np.array_equal(tail["blocks.0.attn.hook_pattern"], full["blocks.0.attn.hook_pattern"][[1], 9:])
    assert some.nbytes() == 2 * 3 * 20 * 4 and some.nbytes() < full.nbytes() / 10


def test_hooks_get_at_most_one_block_of_scores(model, small_blocks):
    seen = []
    hooks = Hooks().add("blocks.0.attn.hook_scores", lambda name, x: seen.append(x.shape))
    model.forward(np.array([ids(20)]), model.new_cache(1), hooks=hooks)
    assert seen == [(1, 4, 8, 20), (1, 4, 8, 20), (1, 4, 4, 20)]


def test_run_with_cache_keeps_only_matching_names_for_one_sequence(model):
    logits, acts = run_with_cache(model, ids(7), names=("hook_embed", "blocks.1.attn.hook_q", "hook_logits"))
    assert acts.names() == ["blocks.1.attn.hook_q", "hook_embed", "hook_logits"]
    assert acts["blocks.1.attn.hook_q"].shape == (7, CFG.num_heads, CFG.head_dim)
    assert acts["hook_embed"].shape == (7, CFG.hidden_size) and logits.shape == (7, CFG.vocab_size)
    assert np.array_equal(acts["hook_logits"], logits)
    assert acts.nbytes() == 4 * (7 * CFG.num_heads * CFG.head_dim + 7 * CFG.hidden_size + 7 * CFG.vocab_size)


def test_captured_keys_and_values_equal_the_cache_contents(model):
    got = {}
    hooks = Hooks().add("blocks.*.attn.hook_[kv]", lambda name, x: got.setdefault(name, []).append(x[0].copy()))
    cache = model.new_cache(1)
    model.prefill(ids(9), cache, hooks=hooks)
    model.decode_step(5, cache, hooks=hooks)
    for li in range(CFG.num_layers):
        k = np.concatenate(got[f"blocks.{li}.attn.hook_k"])             # [10, h_kv, d]
        v = np.concatenate(got[f"blocks.{li}.attn.hook_v"])
        assert np.array_equal(k.transpose(1, 0, 2), cache.k[li][0, :, :10])
        assert np.array_equal(v.transpose(1, 0, 2), cache.v[li][0, :, :10])


@pytest.mark.parametrize("kwargs, words", [
    (dict(layers=[2]), "attention layer 2 is out of range"), (dict(heads=[4]), "attention head 4"),
    (dict(heads=[-5]), "attention head -5"), (dict(rows=[6]), "query row 6"), (dict(layers=["a"]), "whole numbers"),
])
def test_bad_layer_head_or_row_is_a_clear_error(model, kwargs, words):
    with pytest.raises(ModelError, match=words):
        run_with_cache(model, ids(6), **kwargs)


def test_weights_are_read_only(model):
    with pytest.raises(ValueError, match="read-only"):
        model.weights.layers[0].wqkv[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        model.weights.embed[3] += 1.0
    assert model.weights.lm_head is model.weights.embed or not CFG.tie_word_embeddings
    mine = {name: np.array(a) for name, a in model.to_hf_tensors().items()}     # writable copies a loader holds
    loaded = Model.from_hf_tensors(CFG, mine)
    assert not any(a.flags.writeable for lw in loaded.weights.layers for a in lw.matrices().values())
    assert not loaded.weights.embed.flags.writeable and not loaded.weights.final_norm.flags.writeable
    assert mine["model.norm.weight"].flags.writeable                 # the caller's own arrays are left alone
    again = Model(CFG, loaded.weights)                                 # sharing weights shares the same objects
    assert again.weights is loaded.weights


# ------------------------------------------------------------------------------------ many users, one model
def test_two_threads_recording_at_once_each_see_only_their_own(model):
    prompts = {"a": ids(11, seed=5), "b": ids(17, seed=6)}
    names = ("blocks.*.attn.hook_pattern", "hook_embed")
    alone = {k: run_with_cache(model, p, names=names)[1] for k, p in prompts.items()}
    barrier, results, errors = threading.Barrier(2), {"a": [], "b": []}, []

    def user(key):
        try:
            barrier.wait()
            for _ in range(6):
                results[key].append(run_with_cache(model, prompts[key], names=names)[1])
        except Exception as e:                                          # surfaces in the main thread
            errors.append(e)

    threads = [threading.Thread(target=user, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for key, runs in results.items():
        for acts in runs:
            assert acts.names() == alone[key].names()
            for name in acts:                                           # same prompt, same numbers; another
                assert np.allclose(acts[name], alone[key][name], atol=1e-6)   # prompt differs in shape or O(1)


def test_generation_with_hooks_beside_one_without(model):
    calls = []
    hooks = Hooks().add("hook_embed", lambda name, x: calls.append(x.shape))
    other = threading.Thread(target=lambda: list(model.generate(ids(30, seed=9), 10, stop_at_eos=False)))
    other.start()
    toks = list(model.generate(ids(4), 5, stop_at_eos=False, hooks=hooks))
    other.join()
    assert len(toks) == 5 and calls == [(1, 4, CFG.hidden_size)] + [(1, 1, CFG.hidden_size)] * 4


# ------------------------------------------------------------------------------------ recorded generation
@pytest.fixture(scope="module")
def rec(model) -> GenerationRecord:
    return record_generation(model, ids(9, seed=7), max_new_tokens=6, alternatives=4, attention_layers=[1],
                             attention_heads=[0, 3], kv_layers=[0], chunk_size=4)


def test_record_keeps_the_models_own_probability_of_each_token(model, rec):
    """The walkthrough's bars showed `prob` (the sampler's: 1.0 for every greedy pick) as the model's confidence."""
    seq = rec.tokens_ids
    for s in rec.steps:
        z = model.logits(seq[:s.cache_tokens]).astype(np.float64)[-1]
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert s.model_prob == pytest.approx(p[s.token_id], rel=1e-4)
        assert s.model_prob == pytest.approx(s.top_probs[0], rel=1e-9)          # greedy: the favourite
        assert s.prob == 1.0


def test_record_kv_bytes_follow_the_formula(rec):
    L, h_kv, d = CFG.num_layers, CFG.num_kv_heads, CFG.head_dim
    assert [s.step for s in rec.steps] == list(range(6)) and rec.finish_reason == "length"
    for s in rec.steps:
        tokens = 9 + s.step                                             # prompt + tokens fed back so far
        assert s.cache_tokens == tokens
        assert s.kv_bytes_per_layer == [2 * h_kv * d * tokens * 4] * L
        assert s.kv_bytes == 2 * L * h_kv * d * tokens * 4


def test_record_attention_rows_and_new_kv_match_one_full_pass(model, rec):
    seq = rec.tokens_ids[:-1]                                           # every token that went through the model
    _, acts = run_with_cache(model, seq, names=("blocks.1.attn.hook_pattern", "blocks.0.attn.hook_[kv]"))
    for s in rec.steps:
        q = s.cache_tokens - 1                                          # the query that produced this token
        assert set(s.attention) == {(1, 0), (1, 3)}
        for (li, h), row in s.attention.items():
            assert row.shape == (s.cache_tokens,)
            assert np.abs(row - acts["blocks.1.attn.hook_pattern"][h, q, :s.cache_tokens]).max() < TOL
    k = np.concatenate([s.k_new[0] for s in rec.steps], axis=1)         # [h_kv, 14, d]: 9 prompt rows, then 1/step
    v = np.concatenate([s.v_new[0] for s in rec.steps], axis=1)
    assert rec.steps[0].k_new[0].shape == (CFG.num_kv_heads, 9, CFG.head_dim) and rec.steps[1].k_new[0].shape[1] == 1
    assert np.abs(k - acts["blocks.0.attn.hook_k"].transpose(1, 0, 2)).max() < TOL
    assert np.abs(v - acts["blocks.0.attn.hook_v"].transpose(1, 0, 2)).max() < TOL


def test_record_probabilities_and_alternatives_come_from_the_logits(model, rec):
    logits = model.logits(rec.tokens_ids[:-1])
    for s in rec.steps:
        z = logits[s.cache_tokens - 1].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p)[:4]
        assert s.prob == 1.0 and s.token_id == s.top_ids[0]             # greedy: all mass on the argmax
        assert s.top_ids == [int(i) for i in order]
        assert np.allclose(s.top_probs, p[order], atol=1e-5)            # float32 logits: ~1e-6 relative


def test_record_times_prefill_chunks_and_ttft_includes_sampling(rec):
    assert [n for n, _ in rec.prefill_chunks] == [4, 4, 1]
    assert rec.prefill_seconds == pytest.approx(sum(t for _, t in rec.prefill_chunks))
    assert rec.steps[0].seconds > rec.prefill_seconds                  # + sampling the first token
    assert all(s.seconds > 0 for s in rec.steps)


def test_progress_is_reported_per_chunk_and_per_token(model):
    calls = []
    record_generation(model, ids(20), max_new_tokens=3, chunk_size=6, on_progress=lambda *a: calls.append(a))
    assert calls == [(6, 20, "prefill"), (12, 20, "prefill"), (18, 20, "prefill"), (20, 20, "prefill"),
                     (1, 3, "decode"), (2, 3, "decode"), (3, 3, "decode")]


def test_stop_event_ends_the_run_with_stopped(model):
    stop = threading.Event()

    def progress(done, total, phase):
        if phase == "decode" and done == 3:
            stop.set()

    r = record_generation(model, ids(5), max_new_tokens=50, stop=stop, on_progress=progress)
    assert r.finish_reason == "stopped" and len(r.steps) == 4           # the pass under way still gives a token
    stop2 = threading.Event()
    stop2.set()
    r2 = record_generation(model, ids(20), max_new_tokens=5, chunk_size=8, stop=stop2)
    assert r2.finish_reason == "stopped" and r2.steps == [] and len(r2.prefill_chunks) == 1
    toks = list(model.generate(ids(5), 50, stop_at_eos=False, stop=stop2))
    assert len(toks) == 1 and toks[0].finish_reason == "stopped"


@pytest.mark.parametrize("kwargs, words", [
    (dict(attention_layers=[2]), "attention layer 2"), (dict(attention_heads=[9]), "attention head 9"),
    (dict(kv_layers=[-3]), "kv layer -3"), (dict(alternatives=-1), "alternatives"), (dict(chunk_size=0), "chunk_size"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(stop="yes"), "stop"), (dict(on_progress=3), "on_progress"),
])
def test_record_checks_arguments_before_any_work(model, kwargs, words):
    with pytest.raises(ModelError, match=words):
        record_generation(model, ids(5), **kwargs)
    with pytest.raises(ModelError, match="empty"):
        record_generation(model, [])


def test_generate_takes_per_call_trace_and_rejects_bad_hook_layers(model):
    tr = Trace()
    toks = list(model.generate(ids(6), 3, stop_at_eos=False, trace=tr))
    # one lm_head record per forward pass: the prefill + 2 decode steps
    assert len(toks) == 3 and tr.by_op()["lm_head"]["calls"] == 3
    with pytest.raises(ModelError, match="attention layer 7"):
        model.generate(ids(6), 3, hooks=Hooks(layers=[7]).add("*", lambda n, x: None))
    assert isinstance(ActivationCache(), dict)


def test_capture_size_is_predicted_exactly_and_bounded(model):
    from engine.model.hooks import capture_bytes
    names = ("blocks.*.attn.hook_pattern", "blocks.0.attn.hook_v", "hook_embed", "blocks.1.mlp.hook_act")
    logits, acts = run_with_cache(model, ids(12), names=names, layers=[1], heads=[0, 2], rows=slice(0, 5))
    # pattern: layer 1 only, 2 heads x 5 rows x 12 keys; V: 12 x kv_dim; embed: 12 x D; act: 12 x F; float32
    c = CFG
    want = 4 * (2 * 5 * 12 + 12 * c.kv_dim + 12 * c.hidden_size + 12 * c.intermediate_size)
    assert acts.nbytes() == want == capture_bytes(c, 12, acts.hooks)
    with pytest.raises(ModelError, match="over the 0 MiB limit"):
        run_with_cache(model, ids(12), names=names, max_bytes=1000)


def test_an_activation_cache_refuses_a_second_pass(model):
    acts = ActivationCache(("hook_embed",))
    cache = model.new_cache(1)
    model.prefill(ids(4), cache, hooks=acts.hooks)
    assert acts["hook_embed"].shape == (4, CFG.hidden_size)
    with pytest.raises(ModelError, match="ONE forward pass"):
        model.decode_step(5, cache, hooks=acts.hooks)
