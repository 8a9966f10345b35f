"""The engine agrees with itself: full forward == prefill + cached decode == chunked prefill == batched runs."""
import numpy as np
import pytest

from engine import Hooks, Model, ModelError
from engine.model.generate import generate_batch
from engine.model.model import by_columns
from helpers_models import prompt, tiny

# float32 (eps 6e-8) through 2 layers, sums over <= 96 terms in other orders: ~1e-6 on logits of size ~1;
# a wrong position, mask or cache row moves them by > 1e-2
TOL = 1e-5


SHAPES = {
    "gqa": tiny(),
    "mha_tied": tiny(num_kv_heads=4, tie_word_embeddings=True),
    "mqa_theta5e5": tiny(num_kv_heads=1, rope_theta=500000.0, rms_norm_eps=1e-6),
    "llama3_scaling": tiny(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}


@pytest.fixture(params=list(SHAPES), scope="module")
def model(request):
    return Model.random(SHAPES[request.param], seed=3)


def test_prefill_last_logits_equal_full_forward(model):
    ids = prompt(17)
    full = model.logits(ids)
    cache = model.new_cache(1)
    last = model.prefill(ids, cache)
    assert full.shape == (17, model.config.vocab_size)
    assert np.abs(last - full[-1]).max() < TOL
    assert int(cache.lengths[0]) == 17


def test_cached_decode_equals_full_forward(model):
    ids = prompt(20, seed=1)
    full = model.logits(ids)
    cache = model.new_cache(1)
    model.prefill(ids[:6], cache)
    for i in range(6, 20):
        assert np.abs(model.decode_step(ids[i], cache) - full[i]).max() < TOL


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunked_prefill_equals_full_forward(model, chunk):
    ids = prompt(19, seed=2)
    full = model.logits(ids)
    cache = model.new_cache(1)
    last = model.prefill(ids, cache, chunk_size=chunk)
    assert np.abs(last - full[-1]).max() < TOL


def test_ragged_batch_forward_equals_single_sequences(model):
    seqs = [prompt(n, seed=n) for n in (5, 13, 9)]
    B, T = len(seqs), max(map(len, seqs))
    tokens = np.zeros((B, T), np.int64)
    for b, s in enumerate(seqs):
        tokens[b, :len(s)] = s
    cache = model.new_cache(B)
    batch_last = model.forward(tokens, cache, n_valid=[len(s) for s in seqs])
    for b, s in enumerate(seqs):
        assert np.abs(batch_last[b] - model.logits(s)[-1]).max() < TOL
    # then one batched decode step, each row at its own position
    nxt = [4, 5, 6]
    step = model.forward(np.array(nxt)[:, None], cache)
    for b, s in enumerate(seqs):
        assert np.abs(step[b] - model.logits(s + [nxt[b]])[-1]).max() < TOL


def test_batched_generation_equals_one_at_a_time(model):
    seqs = [prompt(n, seed=10 + n) for n in (4, 11, 7)]
    batched = generate_batch(model, seqs, max_new_tokens=6, stop_at_eos=False)
    for s, out in zip(seqs, batched):
        single = [t.token_id for t in model.generate(s, max_new_tokens=6, stop_at_eos=False)]
        assert out == single


def _single(model, ids, max_new, **kw):
    toks = list(model.generate(ids, max_new_tokens=max_new, **kw))
    return [t.token_id for t in toks], toks[-1].finish_reason


def test_batch_row_that_fills_the_context_stops_alone():
    """Context 48: a 45-token prompt has room for 3 fed-back tokens, so it gets 4 ("context"); the short rows run
    on to max_new_tokens ("length"), each equal to its own single-sequence run."""
    model = Model.random(SHAPES["gqa"], seed=3)
    seqs = [prompt(45, seed=1), prompt(5, seed=2), prompt(9, seed=3)]
    out, reasons = generate_batch(model, seqs, max_new_tokens=10, stop_at_eos=False, with_finish_reasons=True)
    assert [len(o) for o in out] == [4, 10, 10] and reasons == ["context", "length", "length"]
    for s, o, r in zip(seqs, out, reasons):
        assert (o, r) == _single(model, s, 10, stop_at_eos=False)


def test_finished_rows_leave_the_batch():
    """A row that ends at its first token (eos) is not decoded again: every later forward pass has one row."""
    base = Model.random(SHAPES["gqa"], seed=4)
    a, b = prompt(6, seed=20), prompt(9, seed=21)
    first_a = _single(base, a, 1, stop_at_eos=False)[0][0]
    model = Model(base.config.replace(eos_token_id=first_a), base.weights)   # a's first token now ends it
    ref_b = _single(model, b, 8)
    assert first_a not in ref_b[0][:-1]                  # b does not stop at once too (else the test shows nothing)
    rows, forward = [], model.forward
    model.forward = lambda tokens, cache, **kw: rows.append(tokens.shape[0]) or forward(tokens, cache, **kw)
    out, reasons = generate_batch(model, [a, b], max_new_tokens=8, with_finish_reasons=True)
    assert (out[0], reasons[0]) == ([first_a], "eos") and (out[1], reasons[1]) == ref_b
    assert rows == [2] + [1] * (len(out[1]) - 1)         # prefill of both, then b alone


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (20, 0.9)])
def test_batched_sampling_equals_each_rows_seeded_single_run(top_k, top_p):
    """temperature > 0: row b draws from its own generator (seed + b), so it samples what a single run with that
    seed samples (the batched logits equal the single ones to 1e-6, far from moving a draw across a CDF step)."""
    model = Model.random(SHAPES["mha_tied"], seed=6)
    seqs = [prompt(n, seed=30 + n) for n in (3, 12, 7)]
    out = generate_batch(model, seqs, max_new_tokens=8, temperature=1.3, top_k=top_k, top_p=top_p, seed=100,
                         stop_at_eos=False)
    for b, (s, o) in enumerate(zip(seqs, out)):
        assert o == _single(model, s, 8, temperature=1.3, top_k=top_k, top_p=top_p, seed=100 + b,
                            stop_at_eos=False)[0]
    assert len({tuple(o) for o in out}) == 3 and out != generate_batch(model, seqs, 8, 1.3, top_k, top_p, seed=7,
                                                                       stop_at_eos=False)


def test_interleaved_rope_equals_half_rope_on_permuted_weights():
    """GGUF keeps q/k rows permuted for interleaved RoPE; both layouts must give the same logits."""
    cfg = SHAPES["gqa"]
    half = Model.random(cfg, seed=5)
    t = half.to_hf_tensors()
    d = cfg.head_dim

    def to_interleaved(w, heads):             # row i of each head: [0, d/2, 1, d/2+1, ...]
        order = np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=1).reshape(-1)
        return w.reshape(heads, d, -1)[:, order].reshape(w.shape)

    t2 = dict(t)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}.self_attn."
        t2[p + "q_proj.weight"] = to_interleaved(t[p + "q_proj.weight"], cfg.num_heads)
        t2[p + "k_proj.weight"] = to_interleaved(t[p + "k_proj.weight"], cfg.num_kv_heads)
    inter = Model.from_hf_tensors(cfg, t2, rope_layout="interleaved")
    ids = prompt(12)
    assert np.abs(inter.logits(ids) - half.logits(ids)).max() < TOL


def test_hooks_expose_attention_maps_and_kv_growth():
    model = Model.random(SHAPES["gqa"], seed=1)
    cfg = model.config
    ids = prompt(6)
    rec: dict[str, list] = {}
    hooks = Hooks()
    for pattern in ["blocks.*.attn.hook_pattern", "blocks.0.attn.hook_kv_cache", "hook_logits"]:
        hooks.add(pattern, lambda name, x: rec.setdefault(name, []).append(np.array(x)))
    cache = model.new_cache(1)
    model.prefill(ids, cache, hooks=hooks)                        # hooks are per call: nothing on the model
    model.decode_step(7, cache, hooks=hooks)
    assert not hasattr(model, "hooks")
    pat = rec["blocks.1.attn.hook_pattern"]
    assert pat[0].shape == (1, cfg.num_heads, 6, 6) and pat[1].shape == (1, cfg.num_heads, 1, 7)
    assert np.allclose(pat[0].sum(-1), 1.0, atol=1e-6)              # rows are distributions
    assert np.all(np.triu(pat[0][0, 0], k=1) == 0)                  # causal: nothing from the future
    assert [int(x[0]) for x in rec["blocks.0.attn.hook_kv_cache"]] == [6, 7]
    assert rec["hook_logits"][0].shape == (1, 1, cfg.vocab_size)


def test_kv_cache_bytes_follow_the_formula():
    model = Model.random(SHAPES["gqa"], seed=1)
    c = model.config
    cache = model.new_cache(1)
    model.prefill(prompt(10), cache)
    # 2 (K and V) x layers x tokens x kv heads x head dim x 4 bytes (float32)
    assert cache.bytes_used() == 2 * c.num_layers * 10 * c.num_kv_heads * c.head_dim * 4


def test_generation_stops_at_length_eos_and_context():
    model = Model.random(SHAPES["gqa"], seed=1)
    toks = list(model.generate(prompt(5), max_new_tokens=4, stop_at_eos=False))
    assert len(toks) == 4 and toks[-1].finish_reason == "length" and toks[0].step == 0
    # context window 48: a 45-token prompt leaves room for 3 new positions + the final sampled token
    toks = list(model.generate(prompt(45), max_new_tokens=100, stop_at_eos=False))
    assert toks[-1].finish_reason == "context" and len(toks) == 4
    greedy_first = int(np.argmax(model.logits(prompt(5))[-1]))
    cfg_eos = model.config.replace(eos_token_id=greedy_first)
    m2 = Model(cfg_eos, model.weights)
    toks = list(m2.generate(prompt(5), max_new_tokens=10))
    assert len(toks) == 1 and toks[0].finish_reason == "eos"


def test_seeded_sampling_is_reproducible():
    model = Model.random(SHAPES["gqa"], seed=1, std=0.5)
    a = [t.token_id for t in model.generate(prompt(5), 8, temperature=1.0, top_k=50, seed=7, stop_at_eos=False)]
    b = [t.token_id for t in model.generate(prompt(5), 8, temperature=1.0, top_k=50, seed=7, stop_at_eos=False)]
    assert a == b


@pytest.mark.parametrize("kwargs, words", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_k=-3), "top_k"), (dict(temperature=float("nan")), "temperature"),
])
def test_bad_generation_options_raise_clear_errors(kwargs, words):
    model = Model.random(SHAPES["gqa"], seed=1)
    with pytest.raises(ModelError, match=words):
        model.generate(prompt(5), **{"max_new_tokens": 4, **kwargs})


def test_prompt_longer_than_context_window_is_refused_with_advice():
    model = Model.random(SHAPES["gqa"], seed=1)
    with pytest.raises(ModelError, match="context window is 48 tokens"):
        model.generate(prompt(60), max_new_tokens=2)
    with pytest.raises(ModelError, match="empty"):
        model.generate([], max_new_tokens=2)


def test_profile_run_counts_one_trace_per_step():
    from engine.instruments.profile import profile_run
    model = Model.random(SHAPES["gqa"], seed=1)
    run = profile_run(model, prompt_tokens=9, decode_steps=4)
    assert len(run.decodes) == 4 and run.prefill_ms > 0 and run.itl_ms > 0
    # the 3rd decode step attends to 9 prompt + 3 tokens: KV read = L · 12 · 2 · kv_dim · 4 bytes
    c = model.config
    assert run.decodes[2].kv_read_bytes == c.num_layers * 12 * 2 * c.kv_dim * 4
    with pytest.raises(ModelError, match="context window"):
        profile_run(model, prompt_tokens=40, decode_steps=20)


@pytest.mark.parametrize("shape, block", [((1000, 7), 256), ((5, 3), 256), ((513, 4), 1), ((300, 9), 299)])
def test_by_columns_copies_every_block_in_column_order(shape, block):
    """The blocked copy behind `head_by_columns`, on shapes that leave a partial last block."""
    a = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    got = by_columns(a, block)
    assert got.shape == a.shape and got.flags.f_contiguous and np.array_equal(got, np.asfortranarray(a))


@pytest.mark.parametrize("tied", [True, False])
def test_the_lm_head_is_stored_by_columns_with_the_checkpoints_values(tied):
    """`Weights.head_by_columns`: the LM head keeps its [V, D] values but is laid out column by column (the fast
    product); a tied embedding stays the very same array (not a second copy), an untied one is left as it was;
    a model built on another's weights shares them."""
    cfg = tiny(tie_word_embeddings=tied)
    tensors = {k: np.ascontiguousarray(v) for k, v in Model.random(cfg, seed=5).to_hf_tensors().items()}
    assert all(t.flags.c_contiguous for t in tensors.values())             # as a checkpoint file gives them
    m = Model.from_hf_tensors(cfg, tensors)
    head = tensors["model.embed_tokens.weight" if tied else "lm_head.weight"]
    assert m.weights.lm_head.flags.f_contiguous and np.array_equal(m.weights.lm_head, head)
    assert np.array_equal(m.weights.embed, tensors["model.embed_tokens.weight"])
    assert (m.weights.embed is m.weights.lm_head) == tied
    if not tied:
        assert m.weights.embed.flags.c_contiguous
    assert Model(cfg, m.weights).weights.lm_head is m.weights.lm_head
    seen = {}
    hooks = Hooks().add("hook_final_norm", lambda name, a: seen.setdefault("h", a.copy()))
    logits = m.logits(prompt(6, seed=2), hooks=hooks)
    expected = seen["h"].reshape(-1, cfg.hidden_size).astype(np.float64) @ head.T.astype(np.float64)
    assert np.abs(logits.reshape(expected.shape) - expected).max() < 1e-5
