"""The measured runs the serving lessons show: counts that can be checked by hand, on a tiny random model."""
import pytest

from engine import Model, ModelError
from engine.serving_runs import (chunked_prefill_run, decode_tokens_per_s, prefix_cache_run, speculative_run,
                                 streams_run)
from engine.speculative import early_exit_draft
from test_engine_forward import tiny


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
