"""The lesson pages, driven headless with AppTest: each runs with its defaults, each turns a bad input into an
st.error (never an exception), and the two measured sections (Quantization, Your machine) run on a small random
model and show their tables. Plus `ui.model_source`'s config.json parsing, without Streamlit.

The model the engine loads is picked as the sidebar picker keeps it (`CHOICE_KEY` preset before the first run);
the model the theory sizes as `ui.model_source` keeps it (its session-state keys).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specs.model_config import SpecError
from ui.model_picker import CHOICE_KEY
from ui.model_source import (CONFIG_JSON, CUSTOM, ENGINE, HUB, LOCAL, MODE_KEY, PASTE, PASTE_KEY, PATH_KEY,
                             PRESET_KEY, REPO_KEY, SOURCE_KEY, THIS_MACHINE, UPLOAD, parse_config_text)
from helpers_apptest import REFERENCE, errors, run_script, walkthrough_problems

ROOT = Path(__file__).resolve().parents[2]
PAGES = {p.stem.split("_", 1)[1]: str(p) for p in sorted((ROOT / "pages").glob("[0-9][0-9]_*.py"))}  # every page
TIMEOUT = 60
TINYLLAMA_CONFIG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                    "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
                    "max_position_embeddings": 2048, "_name_or_path": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}


def page(name: str, **state) -> AppTest:
    return run_script(PAGES[name], TIMEOUT, **state)


def tables(at: AppTest) -> list:
    return [d.value for d in at.dataframe]


def set_number(at: AppTest, key: str, value) -> AppTest:
    at.text_input(key=key).set_value(str(value))
    return at.run()


# ------------------------------------------------------------------------------------------ every page, defaults
def test_the_eight_sizing_lessons_exist():
    assert [name for name, path in PAGES.items() if Path(path).name.startswith("2")] == ["Model_anatomy", "KV_cache_and_attention_variants", "Roofline",
                           "Bandwidth_floor_and_latency", "FlashAttention", "Quantization", "Your_machine",
                           "Measured_kernels"]


@pytest.mark.parametrize("name", list(PAGES))
def test_page_runs_with_defaults_and_every_table_has_a_csv(name):
    at = page(name)
    assert not at.exception, at.exception
    assert not errors(at)
    assert walkthrough_problems(at) == []          # no empty chart, no source named by a bare code (issue 18)
    assert at.title[0].value
    assert len(at.get("download_button")) == len(at.dataframe)
    if Path(PAGES[name]).name.startswith("2"):                 # every sizing lesson shows at least one table
        assert at.dataframe


# ------------------------------------------------------------------------------------------ worked numbers on screen
def test_anatomy_shows_tinyllama_size_and_ops():
    at = page("Model_anatomy", **REFERENCE)                  # the reference text's example, chosen explicitly
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Parameters"] == "1.10 B" and metrics["Weights in bf16"] == "2.20 GB"
    ops = tables(at)[2]
    assert {"q_proj", "attn_scores", "gate_proj", "lm_head"} <= set(ops["op"])
    assert "[2048, 2048] @ [2048, 256] -> [2048, 256]" in set(ops["shape"])       # k_proj in prefill


def test_kv_levers_reproduce_tinyllama_mha_gqa_mqa_bytes_per_token():
    at = page("KV_cache_and_attention_variants", **REFERENCE)
    levers = next(t for t in tables(at) if "lever" in t.columns)
    per_token = dict(zip(levers["variant"], levers["bytes/token"]))
    assert per_token["MHA"] == 180_224 and per_token["GQA-4"] == 22_528 and per_token["MQA"] == 5_632


def test_latency_batching_table_matches_the_reference():
    at = page("Bandwidth_floor_and_latency", **REFERENCE)   # TinyLlama on an A100 40GB, as the text
    batching = next(t for t in tables(at) if "batch" in t.columns)
    assert list(batching["batch"]) == [1, 8, 32, 128]
    # shown values are the text's worked numbers at its rounding (0.01 ms; tok/s from rounded steps, 0.35%)
    assert batching["step (ms)"].iloc[0] == pytest.approx(1.42, abs=0.01)
    assert batching["tokens/s all streams"].iloc[3] == pytest.approx(65_306, rel=0.01)


def test_flash_attention_headline_is_about_33_mib_per_head():
    at = page("FlashAttention", **REFERENCE)
    assert at.metric[0].value == "34.6 MB"                  # 33 MiB: 4·N·d·2 + 4·N²·2 bytes, N = 2,048, d = 64


# ------------------------------------------------------------------------------------------ bad inputs -> st.error
@pytest.mark.parametrize("name, key, value, message", [
    ("Model_anatomy", "anatomy.batch", 0, "Batch B (sequences) must be between"),
    ("KV_cache_and_attention_variants", "kv.window", 0, "Window W (tokens) must be between"),
    ("KV_cache_and_attention_variants", "kv.batch", 0, "Batch (sequences) must be between"),
    ("Roofline", "roof.tokens", 10 ** 9, "must be between"),
    ("Bandwidth_floor_and_latency", "lat.decode_mbu", 1.5, "Decode MBU must be between"),
    ("FlashAttention", "fa.seq", 0, "Sequence length N must be between"),
    ("Quantization", "quant.max", 0.0, "Largest |w| in its group must be between"),
    ("Your_machine", "machine.steps", 0, "Decode steps must be between"),
])
def test_bad_number_shows_error_not_exception(name, key, value, message):
    at = set_number(page(name), key, value)
    assert not at.exception, at.exception
    assert any(message in e for e in errors(at)), errors(at)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "holds a JSON list"),
    (json.dumps({"model_type": "t5", "d_model": 512}), "encoder-decoder"),
    (json.dumps({**TINYLLAMA_CONFIG, "num_key_value_heads": 5}), "not a multiple of num_key_value_heads"),
    (json.dumps({**TINYLLAMA_CONFIG, "hidden_size": 0}), "hidden_size"),
])
def test_malformed_pasted_config_shows_error(text, message):
    at = page("Roofline", **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: PASTE, PASTE_KEY: text})
    assert not at.exception, at.exception
    assert any(message in e for e in errors(at)), errors(at)
    assert any("Choose a model" in i.value for i in at.info)


def test_pasted_config_is_sized():
    at = page("KV_cache_and_attention_variants",
              **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: PASTE, PASTE_KEY: json.dumps(TINYLLAMA_CONFIG)})
    assert not at.exception and not errors(at)
    levers = next(t for t in tables(at) if "lever" in t.columns)
    assert levers["bytes/token"].iloc[0] == 22_528


def test_uploaded_config_bad_and_good():
    at = page("Model_anatomy", **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: UPLOAD})
    at.sidebar.get("file_uploader")[0].set_value(("config.json", b'{"model_type": "bert"}', "application/json"))
    at = at.run()
    assert not at.exception
    assert any("encoder-only" in e or "bert" in e for e in errors(at)), errors(at)
    at.sidebar.get("file_uploader")[0].set_value(("config.json", json.dumps(TINYLLAMA_CONFIG).encode(),
                                                  "application/json"))
    at = at.run()
    assert not at.exception and not errors(at)
    assert at.metric[0].value == "1.10 B"


def test_missing_local_path_and_malformed_repo_id_show_errors():
    at = page("Model_anatomy", **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: LOCAL, PATH_KEY: "/no/such/config.json"})
    assert not at.exception and any("does not exist" in e for e in errors(at))
    at = page("Model_anatomy", **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: HUB, REPO_KEY: "not a repo id"})
    assert not at.exception and any("not a Hugging Face repository id" in e for e in errors(at))


def test_local_config_folder_is_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINYLLAMA_CONFIG))
    at = page("Model_anatomy", **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: LOCAL, PATH_KEY: str(tmp_path)})
    assert not at.exception and not errors(at)
    assert at.metric[0].value == "1.10 B"


def test_offline_hub_fetch_says_so(monkeypatch):
    import ui.model_source
    monkeypatch.setattr(ui.model_source, "_hub_reachable", lambda timeout_s=3.0: False)
    at = page("Model_anatomy", **{SOURCE_KEY: CONFIG_JSON, MODE_KEY: HUB, REPO_KEY: "nobody/no-such-model-here"})
    assert not at.exception
    assert any("offline" in e for e in errors(at)), errors(at)
    assert at.sidebar.button(key="size.hub_retry")                          # and a way to try again


def test_engine_model_is_sized_from_its_config():
    at = page("Model_anatomy", **{SOURCE_KEY: ENGINE})
    assert not at.exception and not errors(at)
    assert at.metric[0].value == "135 M"                                   # SmolLM2-135M (random weights)


def test_this_machine_as_the_device():
    at = page("Bandwidth_floor_and_latency", device=THIS_MACHINE)
    assert not at.exception and not errors(at)
    assert any("This machine (measured)" in c.value for c in at.sidebar.caption)


def test_custom_device_with_zero_bandwidth_shows_error():
    at = page("Bandwidth_floor_and_latency", device=CUSTOM)
    assert not at.exception and not errors(at)
    at = set_number(at, "device.custom.bandwidth_gb_s", 0.0)
    assert not at.exception
    assert any("Memory bandwidth (GB/s) must be between" in e for e in errors(at))


def test_device_without_the_precision_shows_error_not_exception():
    at = page("Roofline", **{"device": "TPU v5e", "roof.wd.gpu": "fp32"})        # no FP32 rate on its datasheet
    assert not at.exception
    assert any("has no peak for fp32" in e for e in errors(at)), errors(at)


def test_preset_with_mla_moe_and_hybrid_layers_run_everywhere():
    for preset in ("DeepSeek-V3", "Qwen3-Next-80B-A3B", "Gemma-3-27B"):
        for name in ("Model_anatomy", "KV_cache_and_attention_variants", "Roofline", "Bandwidth_floor_and_latency"):
            at = page(name, **{PRESET_KEY: preset})
            assert not at.exception, (preset, name, at.exception)
            assert not errors(at), (preset, name, errors(at))


# ------------------------------------------------------------------------------------------ measured sections
def test_quantization_measures_the_loaded_model_on_click():
    at = page("Quantization", **{"quant.schemes": ["INT8 per channel"]})
    assert not any("scheme" in t.columns for t in tables(at))              # nothing runs before the click
    at = at.button(key="quant.measure").click().run()
    assert not at.exception and not errors(at)
    measured = next(t for t in tables(at) if "scheme" in t.columns)
    assert list(measured["scheme"]) == ["fp32 (baseline)", "INT8 per channel"]
    assert measured["top1_agreement"].iloc[1] > 0.5
    at = at.run()                                                           # cached: still shown after a rerun
    assert any("scheme" in t.columns for t in tables(at))


def test_your_machine_runs_the_engine_on_click_and_counters_match_theory():
    at = page("Your_machine", **{"machine.prompt": 8, "machine.steps": 3})
    at = at.button(key="machine.run").click().run()
    assert not at.exception and not errors(at)
    table = next(t for t in tables(at) if "measured / predicted" in t.columns)
    ratios = dict(zip(table["quantity"], table["measured / predicted"]))
    for counted in ("decode weights read (MB)", "decode KV read, first step (MB)", "decode GFLOP, first step",
                    "prefill GFLOP"):
        assert ratios[counted] == 1.0, counted          # same integers counted two ways, same unit division
    assert ratios["decode step time (ms)"] > 0
    by_op = next(t for t in tables(at) if "op" in t.columns and "calls" in t.columns)
    assert {"qkv_proj", "attention", "lm_head"} <= set(by_op["op"])


def test_your_machine_says_how_many_blas_threads_the_engine_uses_and_why():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from engine import threads as blas_threads
    at = page("Your_machine", **{"machine.prompt": 8, "machine.steps": 3})
    at = at.button(key="machine.run").click().run()
    assert not at.exception and not errors(at)
    line = next(c.value for c in at.caption if "BLAS threads" in c.value)
    n = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"][0]  # the library's
    assert f"uses {n} BLAS thread" in line and f"of {len(blas_threads.usable_cpus())} cores" in line
    status = blas_threads.status()
    if status.mode == "auto":
        assert "chosen automatically" in line and status.text in line     # and why


def test_measured_sections_ask_for_a_model_when_none_loads():
    at = page("Quantization", **{CHOICE_KEY: "Local path (.gguf or Hugging Face folder)",
                                 "model_path": "/no/such/model.gguf"})
    assert not at.exception
    assert any("Load a model in the sidebar" in i.value for i in at.info)


# ------------------------------------------------------------------------------------------ parsing, no Streamlit
def test_parse_config_text_reads_a_hub_config():
    c = parse_config_text(json.dumps(TINYLLAMA_CONFIG).encode())
    assert (c.name, c.num_layers, c.num_kv_heads) == ("TinyLlama-1.1B-Chat-v1.0", 22, 4)


@pytest.mark.parametrize("text", ["", "   ", "null", '"a string"', b"\xff\xfe", "{" * 10, '{"model_type": 3}'])
def test_parse_config_text_refuses_junk_with_a_spec_error(text):
    with pytest.raises(SpecError):
        parse_config_text(text)


@pytest.mark.parametrize("data, says", [
    (b"\xff\xfe", "not UTF-8 text; expected a Hugging Face config.json"),
    (b" " * 2_000_001, "2,000,001 bytes: too large for a Hugging Face config.json"),
    (" " * 2_000_001, "2,000,001 characters: too large"),
])
def test_uploads_that_are_not_a_config_say_why(data, says):
    """Binary junk and a file of megabytes (the wrong file picked) name what was wrong, for bytes and pasted text."""
    with pytest.raises(SpecError, match=says):
        parse_config_text(data)
