"""Quantization measured on a real forward pass (engine/model/quantize.py)."""
import numpy as np
import pytest

from engine import Model, ModelError
from engine.model.quantize import Scheme, measure_quantization, perplexity, quantized_model
from specs.presets import load_preset


@pytest.fixture(scope="module")
def model():
    return Model.random(load_preset("smollm2").replace(num_layers=2), seed=0)


def test_perplexity_of_uniform_logits_is_vocab_size():
    # every next token has probability 1/V -> perplexity V
    # exp(log 37) in floats: default rel 1e-6
    assert perplexity(np.zeros((5, 37)), [1, 2, 3, 4, 5]) == pytest.approx(37.0)


def test_int8_round_trip_error_is_bounded_by_half_a_step(model):
    q = quantized_model(model, Scheme(8, "per_tensor"))
    w, wq = model.weights.layers[0].wqkv, q.weights.layers[0].wqkv
    step = np.abs(w).max() / 127                    # scale = max|W| / 127 (reference 003)
    assert np.abs(wq - w).max() <= step / 2 + 1e-7
    assert q.weights.layers[0].attn_norm is model.weights.layers[0].attn_norm   # norms untouched


def test_fewer_bits_cost_more_and_int8_keeps_top1(model):
    rows = measure_quantization(model, [Scheme(8, "per_channel"), Scheme(4, "per_group", 64)])
    base, int8, int4 = rows
    assert base["top1_agreement"] == 1.0 and base["logit_max_abs_error"] == 0.0
    assert 0 < int8["weight_relative_rmse"] < int4["weight_relative_rmse"]
    assert int8["logit_mean_abs_error"] < int4["logit_mean_abs_error"]
    assert int8["top1_agreement"] >= int4["top1_agreement"]


def test_group_size_that_does_not_divide_is_a_clear_error(model):
    with pytest.raises(ModelError, match="group_size"):
        quantized_model(model, Scheme(4, "per_group", 100))     # 576 is not a multiple of 100
