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


def test_the_default_models_stored_precision_is_read_from_its_file():
    """The default model ships as SmolLM2-135M-Instruct.Q4_1.gguf: the file's own type must read Q4_1 (the name in
    the file name, an independent record of it), and a model built in memory (random weights) has none."""
    from engine.load.default_model import GGUF_NAME
    from engine.load.loading import load_model
    from engine.model.quantize import below_16_bits, stored_precision
    stored = stored_precision(load_model())
    assert stored == GGUF_NAME.split(".")[-2] == "Q4_1"
    assert below_16_bits(stored) and not below_16_bits("BF16") and not below_16_bits(None)


def test_the_quantization_page_says_what_the_baseline_is_for_a_4_bit_model():
    from helpers_apptest import errors, run_script
    from ui.model_picker import DEFAULT_CHOICE
    from pathlib import Path
    page = str(Path(__file__).resolve().parents[2] / "pages" / "26_Quantization.py")
    at = run_script(page, 120, choice=DEFAULT_CHOICE)
    assert not at.exception and not errors(at)
    said = " ".join(i.value for i in at.info)
    assert "stored as **Q4_1**" in said and "de-quantized" in said
    rand = run_script(page, 120)                                 # random weights: nothing stored, no such note
    assert "stored as" not in " ".join(i.value for i in rand.info)
