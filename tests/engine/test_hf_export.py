"""`python -m engine export-hf`: a GGUF model written as a Hugging Face folder loads back through our own HF loader
with the same logits, tokenizer, chat template and end-of-generation ids (what vLLM needs to run the same model)."""
import json

import numpy as np
import pytest

from engine import load_model
from engine.load.hf_export import export_hf
from helpers_checkpoints import byte_level_tokenizer_fields, tiny_config, write_gguf

MESSAGES = [{"role": "user", "content": "the three"}]


def _same_model(a, b, ids):
    # exact: float32 weights written and read back bit for bit, so the forward pass is the same computation
    np.testing.assert_array_equal(a.logits(ids), b.logits(ids))
    assert b.tokenizer.encode("the other thin") == a.tokenizer.encode("the other thin")
    assert b.tokenizer.apply_chat_template(MESSAGES) == a.tokenizer.apply_chat_template(MESSAGES)
    assert set(b.tokenizer.eos_token_ids) == set(a.tokenizer.eos_token_ids)
    assert b.tokenizer.bos_token_id == a.tokenizer.bos_token_id


def test_a_quantized_gguf_round_trips_through_the_hf_loader(tmp_path):
    cfg = tiny_config()
    write_gguf(tmp_path / "m.gguf", cfg, qtype="Q4_1", tokenizer=byte_level_tokenizer_fields())
    gguf_model = load_model(tmp_path / "m.gguf")
    folder = export_hf(gguf_model, tmp_path / "hf")
    hf_model = load_model(folder)
    _same_model(gguf_model, hf_model, [5, 77, 200, 3, 9])
    written = json.loads((folder / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"]
    assert (written["num_hidden_layers"], written["num_key_value_heads"]) == (cfg["num_hidden_layers"],
                                                                            cfg["num_key_value_heads"])


def test_the_default_model_round_trips(tmp_path, default_model):
    folder = export_hf(default_model, tmp_path / "smollm2")
    back = load_model(folder)
    _same_model(default_model, back, default_model.tokenizer.encode("Once upon a time"))
    gen = json.loads((folder / "generation_config.json").read_text())
    assert 2 in (gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]])  # <|im_end|>


def test_a_model_without_a_tokenizer_is_refused(tmp_path):
    from engine.errors import ModelError
    write_gguf(tmp_path / "m.gguf", tiny_config())          # no tokenizer metadata
    model = load_model(tmp_path / "m.gguf")
    with pytest.raises(ModelError, match="tokenizer"):
        export_hf(model, tmp_path / "x")


def test_export_tokenizer_writes_the_folder_without_weights(tmp_path, default_model, capsys):
    """`python -m engine export-tokenizer`: what a load tester loads with AutoTokenizer offline (guidellm,
    `vllm bench serve`, AIPerf), a few MB instead of the 538 MB float32 folder; the same ids and chat template."""
    from engine.__main__ import main
    from engine.load.tokenizer import Tokenizer
    assert main(["export-tokenizer", str(tmp_path / "tok")]) == 0
    folder = tmp_path / "tok"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert sum(p.stat().st_size for p in folder.iterdir()) < 5e6
    back = Tokenizer.from_hf_folder(folder)
    text = "Once upon a time, 12 foxes"
    assert back.encode(text) == default_model.tokenizer.encode(text)
    assert back.apply_chat_template(MESSAGES) == default_model.tokenizer.apply_chat_template(MESSAGES)
    assert "no weights" in capsys.readouterr().out
