"""The Sampling lesson (pages/12_Sampling.py), headless: its numbers against a softmax written by hand and top-k /
top-p written as plain loops, on the engine's own logits for the prompt; the seeded draws; the bad inputs
(temperature 0 or negative, top-p outside (0, 1]); its place in the course, right after Embeddings."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from helpers_apptest import chart_specs, errors, run_script
from helpers_checkpoints import tiny_config, write_hf_checkpoint
from ui.generation import PROMPT_KEY
from ui.model_picker import LOCAL_CHOICE, PATH_KEY

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "pages" / "12_Sampling.py")
TIMEOUT = 120
PROMPT = "5 17 42 99 3 250 8 61 7 12"                 # token ids: the tiny model has no tokenizer


# ------------------------------------------------------------------------------------------ reference, by hand
def softmax_by_hand(z: list[float]) -> list[float]:
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = sum(e)
    return [x / s for x in e]


def top_k_by_loop(p: list[float], k: int) -> list[float]:
    """Keep the k largest (0 = all), renormalise."""
    if k == 0 or k >= len(p):
        return list(p)
    order = sorted(range(len(p)), key=lambda i: -p[i])
    kept = set(order[:k])
    total = sum(p[i] for i in kept)
    return [p[i] / total if i in kept else 0.0 for i in range(len(p))]


def top_p_by_loop(p: list[float], top_p: float) -> list[float]:
    """Walk the tokens from the most likely; a token is kept while the mass before it is below top_p."""
    kept, mass = set(), 0.0
    for i in sorted(range(len(p)), key=lambda i: -p[i]):
        if mass >= top_p:
            break
        kept.add(i)
        mass += p[i]
    total = sum(p[i] for i in kept)
    return [p[i] / total if i in kept else 0.0 for i in range(len(p))]


def reference(logits, t: float, k: int, top_p: float) -> tuple[list[float], list[float], list[float], list[float]]:
    z = [float(x) for x in logits]
    model = softmax_by_hand(z)
    after_t = softmax_by_hand([x / t for x in z])
    after_k = top_k_by_loop(after_t, k)
    return model, after_t, after_k, top_p_by_loop(after_k, top_p)


# ------------------------------------------------------------------------------------------ the engine, fixed logits
FIXED = [2.0, 1.0, 0.5, 3.0, -1.0, 0.0, 2.5, 1.5]


@pytest.mark.parametrize("t, k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (2.0, 3, 1.0), (0.7, 5, 0.8),
                                         (1.3, 0, 0.5), (0.5, 2, 0.99)])
def test_engine_sampler_equals_the_hand_written_steps_on_fixed_logits(t, k, top_p):
    """Catches: temperature multiplying instead of dividing, top-k keeping k−1 or k+1, top-p keeping one token too
    few or too many, a missing renormalisation after either filter."""
    from engine.model.sampling import sampling_probs
    logits = np.array(FIXED)
    model, after_t, after_k, final = reference(FIXED, t, k, top_p)
    assert np.allclose(sampling_probs(logits), model, atol=1e-12)
    assert np.allclose(sampling_probs(logits, t), after_t, atol=1e-12)
    assert np.allclose(sampling_probs(logits, t, k), after_k, atol=1e-12)
    assert np.allclose(sampling_probs(logits, t, k, top_p), final, atol=1e-12)


def test_the_hand_reference_is_not_trivial():
    """The cases above do cut tokens: top-k 3 keeps 3, top-p 0.8 after top-k 5 keeps fewer than 5."""
    _, _, after_k, final = reference(FIXED, 2.0, 3, 1.0)
    assert sum(x > 0 for x in final) == 3
    _, _, after_k, final = reference(FIXED, 0.7, 5, 0.8)
    assert sum(x > 0 for x in after_k) == 5 and 1 < sum(x > 0 for x in final) < 5


# ------------------------------------------------------------------------------------------ the page
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-llama-sampling")
    write_hf_checkpoint(folder, tiny_config(num_layers=2), seed=11)
    return str(folder)


def open_page(folder: str, **fields) -> AppTest:
    return run_script(PAGE, TIMEOUT, choice=LOCAL_CHOICE, **{PATH_KEY: folder, PROMPT_KEY: PROMPT, **fields})


def table(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def tiny_logits(folder: str) -> np.ndarray:
    from engine import load_model
    model = load_model(folder)
    return model.logits([int(x) for x in PROMPT.split()])[-1].astype(np.float64)


def test_page_numbers_equal_the_hand_written_steps_on_the_models_logits(tiny_folder):
    """Every column of the step table against the hand reference on the model's own last-position logits.
    Catches: a step drawn from the wrong stage (e.g. top-p applied before top-k, or the 'after temperature' bars
    still at T = 1), the table's rows not being the model's favourites, a filter switched off on the page."""
    t, k, top_p = 0.7, 6, 0.6
    at = open_page(tiny_folder, **{"samp.temperature": str(t), "samp.top_k": str(k), "samp.top_p": str(top_p)})
    assert not at.exception and not errors(at), (at.exception, errors(at))
    df = table(at, "p after top-p")
    logits = tiny_logits(tiny_folder)
    model, after_t, after_k, final = reference(logits, t, k, top_p)
    by_hand_top = sorted(range(len(model)), key=lambda i: -model[i])[:len(df)]
    assert list(df["token_id"]) == by_hand_top
    ids = list(df["token_id"])
    for column, ref in (("p model", model), ("p after temperature", after_t), ("p after top-k", after_k),
                        ("p after top-p", final)):
        # float32 forward pass on the page (chunked readout) vs the same pass here: logits agree to ~1e-6
        assert np.allclose(df[column], [ref[i] for i in ids], atol=2e-5), column
    assert sum(x > 0 for x in final) < k                               # the case cuts something at every step
    kept = f"{sum(x > 0 for x in final):,} of {len(final):,} tokens"
    assert any(kept in m.value for m in at.markdown)


def test_seeded_draws_repeat_and_follow_the_distribution(tiny_folder):
    """The same seed gives the same draws; they equal draws made here from the hand-computed distribution with
    the same NumPy generator; a token the filters removed is never drawn. Catches: a page drawing from the
    unfiltered softmax, an unseeded generator."""
    t, k, top_p, n = 1.0, 4, 1.0, 300
    fields = {"samp.temperature": str(t), "samp.top_k": str(k), "samp.top_p": str(top_p), "samp.seed": "7",
              "samp.draws": str(n)}
    first = table(open_page(tiny_folder, **fields), "drawn")
    again = table(open_page(tiny_folder, **fields), "drawn")
    assert first.equals(again) and first["drawn"].sum() == n
    final = np.array(reference(tiny_logits(tiny_folder), t, k, top_p)[3])
    rng = np.random.default_rng(7)
    mine = np.bincount([rng.choice(final.size, p=final) for _ in range(n)], minlength=final.size)
    assert {int(i): int(c) for i, c in zip(first["token_id"], first["drawn"])} == \
        {int(i): int(c) for i, c in enumerate(mine) if c}
    assert set(first["token_id"]) <= set(np.flatnonzero(final))
    other = table(open_page(tiny_folder, **{**fields, "samp.seed": "8"}), "drawn")
    assert not other.equals(first)


def test_charts_are_horizontal_bars_with_the_engines_code_beside_them(tiny_folder):
    """Token names on the vertical axis read horizontally (no rotated labels); the code under each step is the
    engine's, read from the function (it changes when the engine does)."""
    at = open_page(tiny_folder, **{"samp.top_k": "3", "samp.top_p": "0.9"})
    bars = [t for s in chart_specs(at) for t in s["data"] if t["type"] == "bar"]
    assert len(bars) == 7 and all(t["orientation"] == "h" for t in bars)
    code = "\n".join(c.value for c in at.code)
    for line in ("z = logits / temperature", "np.partition(z, -top_k)", "keep = cum - p[order] < top_p",
                 "rng.choice(p.size, p=p)"):
        assert line in code, line


@pytest.mark.parametrize("key, text, says", [
    ("samp.temperature", "0", "Temperature 0 would divide every logit by zero"),
    ("samp.temperature", "-1", "Temperature must be between 0 and 100, got -1"),
    ("samp.temperature", "hot", "Temperature: 'hot' is not a number"),
    ("samp.top_p", "0", "Top-p must be above 0"),
    ("samp.top_p", "1.5", "Top-p must be between 0 and 1, got 1.5"),
    ("samp.top_p", "-0.2", "Top-p must be between 0 and 1, got -0.2"),
    ("samp.top_k", "2.5", "Top-k must be a whole number"),
])
def test_bad_settings_say_what_is_wrong_and_keep_the_box(tiny_folder, key, text, says):
    at = open_page(tiny_folder, **{key: text})
    assert not at.exception, at.exception
    assert any(says in e for e in errors(at)), errors(at)
    assert at.text_input(key=key).value == text
    assert not at.get("plotly_chart")                                # nothing drawn from a bad setting


def test_source_excerpt_refuses_a_marker_the_function_no_longer_has():
    from engine.model.sampling import sampling_probs
    from ui.code import source_lines
    assert source_lines(sampling_probs, "if top_k", "z = np.where").startswith("if top_k")
    with pytest.raises(ValueError, match="no line containing"):
        source_lines(sampling_probs, "this line is not there")


def test_sampling_comes_right_after_embeddings_in_the_course():
    from ui.nav import page_files
    titles = [f.title for f in page_files()]
    i = titles.index("Embeddings and the next token")
    assert titles[i + 1] == "Sampling"
