"""The tiny checkpoints behind the golden logits (tests/golden/*.npz, made by tools/make_golden_logits.py).

Only the expected logits are committed: the weights are regenerated here from a seed (NumPy's PCG64 stream is
stable across versions), so the generator (which runs transformers) and the test (which runs the engine, no
torch) see the same float32 tensors.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers_checkpoints import random_gemma3_tensors, random_tensors, tiny_config, tiny_gemma3_config

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
_BASE = dict(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96)

# name -> (config.json dict, weight seed, prompt length, positions whose logits are stored)
CASES: dict[str, tuple[dict, int, int, list[int]]] = {
    "gqa_untied": (tiny_config(**_BASE, num_kv_heads=2, tie=False), 11, 24, list(range(24))),
    "mha_tied": (tiny_config(**_BASE, num_kv_heads=4, tie=True, rms_norm_eps=1e-6), 12, 24, list(range(24))),
    "mqa_wide_head": (tiny_config(**_BASE, num_kv_heads=1, tie=True, head_dim=24, rope_theta=500000.0), 13, 24,
                      list(range(24))),
    "llama3_scaling": (tiny_config(**_BASE, num_kv_heads=2, tie=False, rope_theta=500000.0, rope_scaling=LLAMA3),
                       14, 80, list(range(0, 80, 4)) + [79]),
    # longer than the engine's 512-query attention block: the blocked path and its causal mask
    "gqa_long_prompt": (tiny_config(**{**_BASE, "num_layers": 1}, num_kv_heads=2, tie=True,
                                    max_position_embeddings=1024), 15, 600,
                        [0, 1, 255, 510, 511, 512, 513, 560, 599]),
}


# Gemma 3 (Gemma3ForCausalLM): MQA, head_dim 32 ≠ D/h, window 8 on layers 0, 1 (3, 4), query scale 1/sqrt(24),
# local RoPE base 10,000 vs global 1,000,000, q/k norms, four norms per layer, GeGLU, embeddings × sqrt(D)
CASES.update({
    "gemma3_window": (tiny_gemma3_config(), 21, 40, list(range(40))),
    # past the 512-query block with a window of 100: the window mask across blocks, skipped key slots
    "gemma3_long_prompt": (tiny_gemma3_config(num_layers=2, sliding_window=100,
                                              layer_types=["sliding_attention", "full_attention"]), 22, 600,
                           [0, 99, 100, 101, 300, 511, 512, 513, 599]),
})


def is_gemma3(name: str) -> bool:
    return CASES[name][0]["model_type"] == "gemma3_text"


def case_weights(name: str) -> dict[str, np.ndarray]:
    cfg, seed, _, _ = CASES[name]
    return random_gemma3_tensors(cfg, seed) if is_gemma3(name) else random_tensors(cfg, seed)


def case_tokens(name: str) -> list[int]:
    cfg, seed, n, _ = CASES[name]
    return [int(t) for t in np.random.default_rng(1000 + seed).integers(0, cfg["vocab_size"], n)]
