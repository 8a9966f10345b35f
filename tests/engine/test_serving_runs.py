"""The measured runs the serving lessons show: counts that can be checked by hand, on a tiny random model."""
import numpy as np
import pytest

from engine import Model, ModelError
from engine.serve.serving_runs import (chunked_prefill_run, decode_tokens_per_s, prefix_cache_run, requests_run,
                                       speculative_run, streams_run)
from engine.serve.speculative import early_exit_draft
from helpers_models import tiny


@pytest.fixture(scope="module")
def model():
    return Model.random(tiny(num_layers=3, max_position_embeddings=256), seed=2, std=0.3)


def test_prefix_cache_run_counts_the_tokens_it_skipped(model):
    on, off = prefix_cache_run(model, 40, 5, True), prefix_cache_run(model, 40, 5, False)
    assert on["prompt_tokens"] == off["prompt_tokens"] == 45
    assert on["cached_tokens"] == 32                           # ⌊40 / 16⌋ full blocks of 16
    assert on["prefill_tokens"] == 45 - 32 and off["prefill_tokens"] == 45 and off["cached_tokens"] == 0


def test_chunked_prefill_run_splits_the_long_prompt(model):
    whole, chunked = chunked_prefill_run(model, 40, None), chunked_prefill_run(model, 40, 8)
    for r in (whole, chunked):
        assert r["padded_tokens"] >= r["forward_tokens"] and r["itl_max_ms"] >= r["itl_p50_ms"] > 0
    # useful work is the same: the 40-token prompt + the decoders' tokens, however it is chunked
    assert whole["forward_tokens"] == chunked["forward_tokens"]


def test_streams_and_speculative_runs_report_consistent_numbers(model):
    r = streams_run(model, 3, prompt_len=4, new_tokens=4)
    assert r["streams"] == 3 and r["decode_tokens_per_s"] > 0 and r["decode_step_ms"] > 0
    spec = speculative_run(model, early_exit_draft(model, 1), [5, 6, 7], max_new_tokens=10, draft_tokens=3)
    assert spec["identical"] and 0 <= spec["acceptance_rate"] <= 1 and spec["speedup_measured"] > 0
    with pytest.raises(ModelError, match="decode"):
        decode_tokens_per_s([])


def test_requests_run_gives_each_prompt_its_own_greedy_tokens(model):
    """What bench/bench_vs_vllm.py compares with vLLM: each request's tokens equal that prompt run alone by
    `Model.generate` (a batch that mixed rows up, or stopped at EOS, would differ), and tokens/s counts them all."""
    prompts = [[5, 6, 7], [9, 10], [5, 6, 7], [11, 12, 13, 14, 15]]
    r = requests_run(model, prompts, new_tokens=6)
    alone = [[t.token_id for t in model.generate(p, max_new_tokens=6, stop_at_eos=False)] for p in prompts]
    assert r["token_ids"] == alone
    assert r["end_to_end_tokens_per_s"] == pytest.approx(4 * 6 / r["seconds"])


@pytest.mark.parametrize("tied", [False, True])
def test_plain_products_run_multiplies_every_matrix_of_a_decode_step(tied):
    """Its FLOP count (2 · rows · Σ matrix sizes, from the engine's own arrays) against the roofline calculator's
    decode step at context 1 less its attention (QKᵀ and P·V: 4 · d · h_q per layer and row), an independent
    per-op formula: equal to the FLOP."""
    from calculators.sizing.roofline import forward_flops
    from engine.serve.serving_runs import plain_products_run
    cfg = tiny(num_layers=3, max_position_embeddings=256, tie_word_embeddings=tied)
    m = Model.random(cfg, seed=0)
    for rows in (1, 4):
        r = plain_products_run(m, rows, pairs=1)
        attention = rows * 4 * cfg.head_dim * cfg.num_heads * cfg.num_layers
        assert r["flops"] == forward_flops(cfg, 1, 1, batch=rows) - attention
        assert r["products_ms"] > 0 and r["gflop_s"] > 0 and r["ceiling"] > 0


def test_plain_products_forms_compute_the_same_product():
    """Both ways of writing the product give x · Wᵀ, whichever the ceiling times as faster."""
    from engine.serve.serving_runs import _product_forms
    rng = np.random.default_rng(0)
    W, x = rng.standard_normal((7, 5)), rng.standard_normal((3, 5))
    (one,) = _product_forms(1)
    np.testing.assert_allclose(one(W, x[:1]), (x[:1] @ W.T)[0])
    a, b = _product_forms(3)
    np.testing.assert_allclose(a(W, x), b(W, x).T)


def test_paired_streams_run_pairs_each_decode_step_with_one_streams(model):
    from engine.serve.serving_runs import paired_streams_run
    r = paired_streams_run(model, 3, prompt_len=3, new_tokens=4)
    assert r["streams"] == 3 and r["gain_min"] <= r["gain"] <= r["gain_max"]
    assert r["decode_tokens_per_s"] == pytest.approx(3e3 / r["decode_step_ms"])
    assert r["one_tokens_per_s"] == pytest.approx(1e3 / r["one_step_ms"])
    with pytest.raises(ModelError, match="decode"):
        paired_streams_run(model, 2, prompt_len=3, new_tokens=1)


def test_batching_run_measures_every_gain_against_one_stream(model):
    from engine.serve.serving_runs import batching_run
    with pytest.raises(ModelError, match="start at 1"):
        batching_run(model, [2, 4])
    rows = batching_run(model, [1, 2], prompt_len=3, new_tokens=2, rounds=1)
    assert [r["streams"] for r in rows] == [1, 2]
    assert rows[0]["gain"] == rows[0]["ceiling"] == rows[0]["share"] == 1.0
    assert rows[1]["gain"] > 0 and rows[1]["ceiling"] > 0 and rows[1]["weight_products_ms"] > 0
    assert rows[1]["share"] == pytest.approx(rows[1]["gain"] / rows[1]["ceiling"])


def test_batching_run_reports_the_median_of_each_rounds_ratios(monkeypatch):
    """A slow round slows one stream and n streams alike, so each round's gain and ceiling pair runs made side by
    side, and the share divides a round's gain by the same round's ceiling. Scripted rounds at 2 streams: gains
    1.5, 1.8, 0.6, ceilings 2.0, 1.8, 1.0 -> gain 1.5 (range 0.6-1.8), ceiling 1.8, shares 0.75, 1.0, 0.6 ->
    0.75 (not 1.5 / 1.8 = 0.83, which would pair a gain with another round's ceiling)."""
    import engine.serve.serving_runs as sr
    gains, ceilings = [1.5, 1.8, 0.6], [2.0, 1.8, 1.0]
    monkeypatch.setattr(sr, "paired_streams_run", lambda model, n, **kw: dict(
        gain=gains.pop(0), decode_tokens_per_s=20.0, decode_step_ms=100.0, one_tokens_per_s=10.0, one_step_ms=100.0))
    monkeypatch.setattr(sr, "plain_products_run", lambda model, n, forms: dict(
        ceiling=ceilings.pop(0), products_ms=20.0, one_row_ms=10.0))
    monkeypatch.setattr(sr, "fastest_forms", lambda model, n: [])
    monkeypatch.setattr(sr, "weight_matrices", lambda model: [np.zeros((10, 10))])
    rows = sr.batching_run(None, [1, 2], rounds=3)
    assert rows[1]["gain"] == 1.5 and (rows[1]["gain_min"], rows[1]["gain_max"]) == (0.6, 1.8)
    assert rows[1]["ceiling"] == 1.8 and rows[1]["share"] == 0.75
    assert rows[0]["decode_tokens_per_s"] == 10.0 and rows[0]["weight_products_ms"] == 10.0
    assert rows[1]["weight_products_ms"] == 20.0
    assert rows[1]["products_gflop_s"] == pytest.approx(2 * 2 * 100 / 20 / 1e6)
