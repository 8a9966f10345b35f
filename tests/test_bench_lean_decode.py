"""bench/lean_decode.py is the NumPy reference `bench_engine.py` sets the engine's decode beside: it must compute
the same logits as the engine, step after step, or its timing says nothing."""
import numpy as np
import pytest

from bench.lean_decode import LeanDecoder
from engine import Model
from helpers_models import prompt, tiny


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_lean_steps_equal_the_engines_decode_steps(kv_heads):
    model = Model.random(tiny(num_kv_heads=kv_heads), seed=3)
    cache = model.new_cache(1, 32)
    model.prefill(prompt(9, seed=kv_heads), cache)
    lean = LeanDecoder(model, cache)
    for token in prompt(12, seed=7):                       # the lean loop keeps its own cache, position by position
        ours, theirs = lean.step(token), model.decode_step(token, cache)
        assert np.abs(ours - theirs).max() <= 1e-4 * max(1.0, float(np.abs(theirs).max()))
    assert lean.pos == int(cache.lengths[0])


def test_lean_loop_refuses_what_it_does_not_cover():
    model = Model.random(tiny(), seed=0)
    model.rope_layout = "interleaved"
    with pytest.raises(ValueError, match="Llama"):
        LeanDecoder(model, model.new_cache(1, 8))
