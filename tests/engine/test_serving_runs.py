"""The measured runs the serving lessons show: counts that can be checked by hand, on a tiny random model."""
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
def test_weight_products_run_multiplies_every_matrix_of_a_decode_step(tied):
    """Its FLOP count (2 · rows · Σ matrix sizes, from the engine's own arrays) against the roofline calculator's
    decode step at context 1 less its attention (QKᵀ and P·V: 4 · d · h_q per layer and row), an independent
    per-op formula: equal to the FLOP."""
    from calculators.sizing.roofline import forward_flops
    from engine.serve.serving_runs import weight_products_run
    cfg = tiny(num_layers=3, max_position_embeddings=256, tie_word_embeddings=tied)
    m = Model.random(cfg, seed=0)
    for rows in (1, 4):
        r = weight_products_run(m, rows, repeats=1)
        attention = rows * 4 * cfg.head_dim * cfg.num_heads * cfg.num_layers
        assert r["flops"] == forward_flops(cfg, 1, 1, batch=rows) - attention
        assert r["products_ms"] > 0 and r["gflop_s"] > 0


def test_batching_run_measures_every_gain_against_one_stream(model):
    from engine.serve.serving_runs import batching_run
    with pytest.raises(ModelError, match="start at 1"):
        batching_run(model, [2, 4])
    rows = batching_run(model, [1, 2], prompt_len=3, new_tokens=2)
    assert [r["streams"] for r in rows] == [1, 2]
    assert rows[0]["gain"] == rows[0]["ceiling"] == 1.0
    assert rows[1]["gain"] > 0 and rows[1]["ceiling"] > 0 and rows[1]["weight_products_ms"] > 0


def test_batching_run_gains_are_medians_of_each_rounds_ratio(monkeypatch):
    """A slow round slows 1 row and n rows alike; every ratio pairs them round by round. Scripted times: rounds
    (1 row, 2 rows) = (10, 10), (30, 30), (10, 20) ms -> ratios 2, 2, 1 -> median 2 (the ratio of the medians,
    2·10/20 = 1, would blame the machine's slow second on batching). Tokens/s likewise: (10, 15), (5, 7.5), (10, 5)
    -> gains 1.5, 1.5, 0.5 -> 1.5, where the ratio of the medians would say 7.5 / 10 = 0.75."""
    import engine.serve.serving_runs as sr
    products = {1: [10.0, 30.0, 10.0], 2: [10.0, 30.0, 20.0]}
    speeds = {1: [10.0, 5.0, 10.0], 2: [15.0, 7.5, 5.0]}
    monkeypatch.setattr(sr, "weight_products_run", lambda model, n, repeats=3: dict(
        products_ms=products[n].pop(0), flops=2.0 * n))
    monkeypatch.setattr(sr, "streams_run", lambda model, n, **kw: dict(
        decode_tokens_per_s=speeds[n].pop(0), decode_step_ms=100.0))
    rows = sr.batching_run(None, [1, 2], rounds=3)
    assert rows[1]["ceiling"] == 2.0 and rows[1]["weight_products_ms"] == 20.0
    assert rows[1]["gain"] == 1.5 and rows[1]["decode_tokens_per_s"] == 7.5
