"""The "Inside the model" pages and the Walkthrough, driven headless with AppTest: each page's main interaction, and
the bad inputs of issue 6 (empty prompt, prompt past the context window, layer/head index out of range, stepping
past the end of the run, a model without a tokenizer) each giving a clear message while the user's input stays.

Most tests load a tiny Llama written to a temporary folder (no tokenizer: prompts are token ids; a 256-token
context), so every page runs in well under a second; the default SmolLM2 is used where text matters.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from helpers_checkpoints import SHARED_TINYLLAMA_TOKENIZER, tiny_config, write_hf_checkpoint
from ui.generation import PROMPT_KEY
from ui.inside import CHAT_KEY, RUN_MAX_NEW_KEY
from ui.model_picker import CHOICE_KEY, LOCAL_CHOICE, PATH_KEY
from helpers_apptest import chart_comes_first, errors

ROOT = Path(__file__).resolve().parents[2]
PAGES = {p.stem: str(p) for p in (ROOT / "pages").glob("*.py")}
TIMEOUT = 120
TINY = tiny_config(num_layers=3, num_heads=4, num_kv_heads=2)        # GQA: 2 query heads per K/V head
TINY_PROMPT = "5 17 42 99 3 250 8 61 7 12"                           # 10 token ids


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-llama")
    write_hf_checkpoint(folder, TINY, seed=3)
    return str(folder)


def open_page(stem: str, folder: str | None = None, prompt: str | None = None, **state) -> AppTest:
    """A page with the tiny model (folder given) or the default SmolLM2 (folder None)."""
    at = AppTest.from_file(PAGES[stem], default_timeout=TIMEOUT)
    if folder is not None:
        at.session_state[CHOICE_KEY] = LOCAL_CHOICE
        at.session_state[PATH_KEY] = folder
        at.session_state[PROMPT_KEY] = TINY_PROMPT if prompt is None else prompt
    elif prompt is not None:
        at.session_state[PROMPT_KEY] = prompt
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def table(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def ok(at: AppTest) -> AppTest:
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    return at


def type_into(at: AppTest, key: str, text: str) -> AppTest:
    at.text_input(key=key).set_value(text)
    return at.run()


# ------------------------------------------------------------------------------------------ bad prompts, every page
INSIDE = ["11_Tokens", "12_Embeddings_and_the_next_token", "12_Sampling", "13_Attention", "14_KV_cache_step_by_step",
          "15_Prefill_and_decode_measured", "01_Walkthrough"]


@pytest.mark.parametrize("stem", INSIDE)
def test_empty_prompt_says_so_and_keeps_the_box(stem, tiny_folder):
    at = open_page(stem, tiny_folder, prompt="   ")
    assert not at.exception, at.exception
    assert any("prompt is empty" in e for e in errors(at)), errors(at)
    assert at.text_area(key=PROMPT_KEY).value == "   "


@pytest.mark.parametrize("stem", ["12_Embeddings_and_the_next_token", "14_KV_cache_step_by_step"])
def test_prompt_past_the_context_window_is_refused_with_the_numbers(stem, tiny_folder):
    too_long = " ".join(["7"] * 300)                                  # the tiny model's window is 256 tokens
    at = open_page(stem, tiny_folder, prompt=too_long)
    assert not at.exception, at.exception
    assert any("300 tokens" in e and "256" in e for e in errors(at)), errors(at)
    assert at.text_area(key=PROMPT_KEY).value == too_long


def test_model_without_tokenizer_reads_ids_and_says_what_to_type(tiny_folder):
    at = ok(open_page("11_Tokens", tiny_folder))
    assert any("has no tokenizer" in i.value for i in at.info)
    at = open_page("11_Tokens", tiny_folder, prompt="hello there")
    assert any("no tokenizer: type the prompt as token ids" in e for e in errors(at)), errors(at)
    at = open_page("11_Tokens", tiny_folder, prompt="5 999")          # vocabulary is 267 ids
    assert any("between 0 and 266" in e for e in errors(at)), errors(at)


# ------------------------------------------------------------------------------------------ Tokens (real text)
def test_tokens_page_shows_every_piece_with_its_id_and_a_round_trip():
    from engine import load_model
    tok = load_model().tokenizer
    at = ok(open_page("11_Tokens", prompt="Write a story", **{CHAT_KEY: False}))
    ids = tok.encode("Write a story")
    df = table(at, "token_id")
    assert list(df["token_id"]) == ids and "".join(df["piece"]) == "Write▁a▁story"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Tokens"] == str(len(ids)) and metrics["Characters"] == "13"
    assert metrics["Characters per token"] == f"{13 / len(ids):.2f}"
    assert any("decode back to exactly" in s.value for s in at.success)
    at.checkbox(key=CHAT_KEY).check().run()                            # the chat template adds special tokens
    assert "<|im_start|>" in " ".join(at.dataframe[0].value["piece"])
    assert int({m.label: m.value for m in at.metric}["Special tokens"]) >= 3


@pytest.mark.skipif(not (SHARED_TINYLLAMA_TOKENIZER / "tokenizer.json").is_file(), reason="no TinyLlama tokenizer")
def test_tokens_page_compares_two_tokenizers_side_by_side():
    at = ok(open_page("11_Tokens", prompt="Write a story", **{CHAT_KEY: False}))
    at.selectbox(key="tokens.compare").set_value("A local tokenizer (Hugging Face folder or .gguf file)").run()
    at = ok(type_into(at, "tokens.compare_path", str(SHARED_TINYLLAMA_TOKENIZER)))
    text = " ".join(m.value for m in at.markdown)
    assert "vocabulary 49,152" in text and "vocabulary 32,000" in text  # SmolLM2 vs TinyLlama (Llama-2 SentencePiece)


def test_tokens_page_compares_with_tokenizers_built_offline():
    """Issue 35: offline, "Another tokenizer" offered only the default one, so the page compared it with itself."""
    at = ok(open_page("11_Tokens", prompt="Write a story about the KV cache", **{CHAT_KEY: False}))
    options = at.selectbox(key="tokens.compare").options
    assert not any(o.startswith("SmolLM2") for o in options)          # the loaded model beside itself: gone
    choice = next(o for o in options if "trained here" in o)
    at.selectbox(key="tokens.compare").set_value(choice).run()
    text = " ".join(m.value for m in at.markdown)
    assert "vocabulary 49,152" in text and "vocabulary 1,000" in text and "as many" in text
    at.selectbox(key="tokens.compare").set_value(next(o for o in options if o.startswith("Bytes"))).run()
    text = " ".join(m.value for m in at.markdown)
    n = len("Write a story about the KV cache".encode("utf-8"))
    assert "vocabulary 256" in text and f"**{n} tokens**" in text      # one token per byte


# ------------------------------------------------------------------------------------------ Embeddings / next token
def test_next_token_section_points_to_sampling_and_the_lens_ends_on_the_real_prediction(tiny_folder):
    """The sampler has its own lesson now (tests/ui/test_sampling_page.py); here the pointer stays, and the logit
    lens's last layer is the model's own argmax (catches a lens off by one layer)."""
    from engine import load_model
    at = ok(open_page("12_Embeddings_and_the_next_token", tiny_folder))
    assert any("Sampling" in c.value for c in at.caption)
    lens = table(at, "top token")
    logits = load_model(tiny_folder).logits([int(x) for x in TINY_PROMPT.split()])[-1]
    assert lens["token_id"].iloc[-1] == int(np.argmax(logits))


def test_embedding_table_bytes_and_position_out_of_range(tiny_folder):
    at = ok(open_page("12_Embeddings_and_the_next_token", tiny_folder))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Table shape"] == "267 × 64"
    at = type_into(at, "emb.position", "10")                           # 10 tokens: positions 0 … 9
    assert any("must be between 0 and 9, got 10" in e for e in errors(at)), errors(at)
    assert at.text_input(key="emb.position").value == "10"


# ------------------------------------------------------------------------------------------ Attention
def test_attention_rows_sum_to_one_causal_zeros_and_rebuilt_row(tiny_folder):
    at = ok(open_page("13_Attention", tiny_folder))
    captions = " ".join(c.value for c in at.caption)
    assert "exactly 0 (45 of 45 entries)" in captions                  # 10 tokens: 10·9/2 entries above the diagonal
    summary = table(at, "previous token")
    assert len(summary) == TINY["num_attention_heads"]
    gqa = table(at, "query heads reading it")
    assert list(gqa["query heads reading it"]) == ["0, 1", "2, 3"]     # 4 query heads, 2 K/V heads
    rope = table(at, "q·k")
    assert np.ptp(rope["q·k"]) < 1e-4 * max(1.0, np.abs(rope["q·k"]).max())   # float32 rotations, same distance


@pytest.mark.parametrize("key, text, says", [
    ("attn.layer", "3", "Layer must be between 0 and 2, got 3"),
    ("attn.head", "-1", "Head must be between 0 and 3, got -1"),
    ("attn.head", "1.5", "Head must be a whole number"),
])
def test_attention_index_out_of_range_says_so(tiny_folder, key, text, says):
    at = type_into(open_page("13_Attention", tiny_folder), key, text)
    assert not at.exception, at.exception
    assert any(says in e for e in errors(at)), errors(at)
    assert at.text_input(key=key).value == text


# ------------------------------------------------------------------------------------------ KV cache, step by step
def test_kv_steps_record_equals_prediction_and_the_shape_formula(tiny_folder):
    at = ok(open_page("14_KV_cache_step_by_step", tiny_folder, **{RUN_MAX_NEW_KEY: "5"}))
    df = table(at, "predicted_bytes")
    L, h_kv, d = TINY["num_hidden_layers"], TINY["num_key_value_heads"], TINY["hidden_size"] // TINY["num_attention_heads"]
    assert list(df["cache_tokens"]) == list(range(10, 10 + len(df)))  # prefill of 10, then one row per step
    assert list(df["kv_bytes"]) == [2 * L * h_kv * d * t * 4 for t in df["cache_tokens"]]
    assert list(df["kv_bytes"]) == list(df["predicted_bytes"])
    variants = table(at, "variant")
    assert list(variants["kv_heads"]) == [4, 2, 1]                     # MHA, this model (GQA-2), MQA
    tokens = int(df["cache_tokens"].iloc[-1])
    assert list(variants["cache_bytes"]) == [2 * L * h * d * tokens * 4 for h in (4, 2, 1)]
    assert {m.label: m.value for m in at.metric}["Tokens in the cache"] == "10"


def test_kv_stepping_next_back_and_past_the_end(tiny_folder):
    at = ok(open_page("14_KV_cache_step_by_step", tiny_folder, **{RUN_MAX_NEW_KEY: "3"}))
    at.button(key="kv.step.back").click().run()                         # before the first step
    assert any("is the first one" in w.value for w in at.warning)
    assert at.text_input(key="kv.step").value == "0"
    for expected in ("1", "2"):
        at.button(key="kv.step.next").click().run()
        assert at.text_input(key="kv.step").value == expected
    assert {m.label: m.value for m in at.metric}["Tokens in the cache"] == "12"
    at.button(key="kv.step.next").click().run()                         # past the end of a 3-token run
    assert any("is the last one" in w.value for w in at.warning)
    assert at.text_input(key="kv.step").value == "2"
    at = type_into(at, "kv.step", "7")
    assert any("Step must be between 0 and 2, got 7" in e for e in errors(at)), errors(at)


def test_kv_steps_back_next_metrics_and_growth_chart_come_before_the_prose_and_the_prompt(tiny_folder):
    """Projector-first (issue 35): Back / Next, the step's numbers and the growth chart lead the page; the intro, the
    reply's tokens, the prompt box and the run settings follow (the chart started at 1,149 px, Next at 765)."""
    at = ok(open_page("14_KV_cache_step_by_step", tiny_folder, **{RUN_MAX_NEW_KEY: "3"}))
    kinds = chart_comes_first(at, "markdown", "text_area", "expander")
    assert kinds.index("button") < kinds.index("metric") < kinds.index("plotly_chart"), kinds


# ------------------------------------------------------------------------------------------ Prefill and decode
def test_prefill_decode_run_and_sweep(tiny_folder):
    at = ok(open_page("15_Prefill_and_decode_measured", tiny_folder, **{RUN_MAX_NEW_KEY: "4"}))
    run = table(at, "seconds")
    assert len(run) == 4 and (run["seconds"] > 0).all()
    at.button(key="pd.run_sweep").click().run()
    ok(at)
    sweep = table(at, "TTFT measured (ms)")
    assert list(sweep["prompt tokens"]) == [16, 32, 64, 128]            # doubling, within the 256-token window
    assert (sweep[["TTFT predicted (ms)", "ITL predicted (ms)"]] > 0).all().all()
    # the theory's shape, independent of this machine's speed: prefill grows with the prompt, a decode step barely
    assert sweep["TTFT predicted (ms)"].iloc[-1] > sweep["TTFT predicted (ms)"].iloc[0]


def test_prefill_decode_numbers_and_timeline_come_before_the_prose_and_the_prompt(tiny_folder):
    """Projector-first (issue 35): the run's metrics (units in their labels, thousands separated) and its timeline
    lead the page; the intro, the prompt box and the run settings follow (the chart started at 833 px)."""
    at = ok(open_page("15_Prefill_and_decode_measured", tiny_folder, **{RUN_MAX_NEW_KEY: "3"}))
    kinds = chart_comes_first(at, "markdown", "text_area", "caption")
    assert kinds.index("metric") < kinds.index("plotly_chart"), kinds
    labels = [m.label for m in at.metric]
    assert labels == ["TTFT (ms)", "Median ITL (ms)", "Decode speed (tokens/s)", "Whole run (ms)"], labels
    assert all(" " not in m.value for m in at.metric), [m.value for m in at.metric]


# ------------------------------------------------------------------------------------------ Walkthrough
def test_walkthrough_steps_through_every_idea_and_stops_at_the_end(tiny_folder):
    at = ok(open_page("01_Walkthrough", tiny_folder, **{RUN_MAX_NEW_KEY: "3"}))
    headers = [at.header[0].value]
    for _ in range(10):                                                 # 8 inside the model, 3 serving it
        at.button(key="walk.step.next").click().run()
        ok(at)
        headers.append(at.header[0].value)
    assert headers[0].startswith("1.") and headers[-1].startswith("11.") and len(set(headers)) == 11
    at.button(key="walk.step.next").click().run()
    assert any("is the last one" in w.value for w in at.warning)
    assert at.header[0].value == headers[-1]


def test_walkthrough_uses_the_teachers_prompt_with_the_real_model():
    at = ok(open_page("01_Walkthrough", prompt="Write a story", **{RUN_MAX_NEW_KEY: "4"}))
    assert any("Write a story" in m.value for m in at.markdown)
    at.button(key="walk.step.next").click().run()                       # step 2: the chips of the real tokens
    assert any("▁story" in m.value for m in at.markdown)


def test_readout_of_a_long_prompt_in_chunks_equals_one_full_pass(tmp_path):
    """The Embeddings page reads a long prompt in 256-token chunks (progress, bounded memory) keeping only the last
    position; its logits must equal the model's own full-sequence pass."""
    from engine import load_model
    from ui.inside import Prompt, prompt_readout
    write_hf_checkpoint(tmp_path, tiny_config(max_position_embeddings=1024), seed=5)
    model = load_model(str(tmp_path))
    ids = tuple(int(i) for i in np.random.default_rng(0).integers(0, 267, 600))       # 3 chunks: 256, 256, 88
    readout = prompt_readout(model, Prompt("", "", ids, False))
    full = model.logits(list(ids))[-1]
    # float32: the chunked pass sums attention in a different order; 1e-5 of the logits' scale is ~100 ulps
    assert np.abs(readout.last_logits - full).max() <= 1e-5 * np.abs(full).max()
    assert readout.last_resid.shape == (model.config.num_layers, model.config.hidden_size)
    from engine.instruments.readout import logit_lens                           # the last layer's residual IS the prediction
    assert logit_lens(model.weights, model.config, readout.last_resid)[0][-1] == int(np.argmax(full))


# ------------------------------------------------------------------------------------------ projector-first
@pytest.mark.parametrize("stem, later", [
    ("12_Embeddings_and_the_next_token", ("text_area", "expander")),      # 784 / 1,146 px before (normal / Large)
    ("12_Sampling", ("text_area",)),                                       # 980 with Large text
    ("13_Attention", ("text_area",)),                                      # 1,136 with Large text
])
def test_inside_pages_draw_their_key_chart_before_the_intro_and_the_prompt(stem, later, tiny_folder):
    """Projector-first (issue 35): the key chart comes right after the title (and the inputs it needs); the intro's
    prose and the prompt box follow, so at 1366×768 the chart starts on the first screen."""
    at = ok(open_page(stem, tiny_folder))
    chart_comes_first(at, *later)
