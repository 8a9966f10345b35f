"""engine.instruments.readout (reading a run) and calculators.sizing.kv_counterfactual, checked against hand-made arrays, brute-force
loops and the reference's worked numbers."""
from __future__ import annotations

import numpy as np
import pytest

from calculators.sizing.kv_counterfactual import kv_variant_rows
from engine.instruments.readout import (causal_check, head_summary, kv_cache_bytes_from_shape, nearest_tokens, subsequence_end,
                            sweep_lengths, top_k)
from specs.presets import load_preset


def test_nearest_tokens_match_a_brute_force_loop():
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((50, 8)).astype(np.float32)
    ids, cos = nearest_tokens(embed, 7, k=5)
    brute = sorted(((float(embed[7] @ embed[j] / np.linalg.norm(embed[7]) / np.linalg.norm(embed[j])), j)
                    for j in range(50) if j != 7), reverse=True)[:5]
    assert list(ids) == [j for _, j in brute]
    assert np.allclose(cos, [c for c, _ in brute], atol=1e-6)     # float32 dot products of 8 numbers


def test_top_k_is_sorted_and_complete():
    p = np.array([0.1, 0.4, 0.05, 0.3, 0.15])
    ids, probs = top_k(p, 3)
    assert list(ids) == [1, 3, 4] and list(probs) == [0.4, 0.3, 0.15]


def test_head_summary_on_a_hand_made_pattern():
    T = 4
    first = np.zeros((T, T))
    first[:, 0] = 1                                                 # head 0: always the first token
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1                                                  # head 1: the previous token (row 0: itself)
    s = head_summary(np.stack([first, prev]))
    assert s["first token"].tolist() == [1.0, 0.5]                  # head 1: rows 0 and 1 sit on position 0
    assert s["previous token"].tolist() == [1 / 3, 1.0]             # rows 1..3; head 0 row 1's previous is 0
    assert s["itself"].tolist() == [0.25, 0.25]


def test_causal_check_counts_the_entries_above_the_diagonal():
    p = np.tril(np.full((5, 5), 0.2))
    chk = causal_check(p)
    assert chk["entries_above"] == 10 and chk["zeros_above"] == 10
    assert chk["max_row_error"] == pytest.approx(0.8)               # row 0 sums to 0.2


def test_kv_variants_reproduce_tinyllama_mha_gqa_mqa_per_token():
    rows = {r["variant"]: r for r in kv_variant_rows(load_preset("TinyLlama-1.1B"), 2048, "fp16")}
    # 003 Detail 6: 176 KB, 22 KB and 5.5 KB per token position at FP16 (2 × 22 layers × h_kv × 64 × 2 bytes)
    assert [r["bytes_per_token"] for r in rows.values()] == [180_224, 22_528, 5_632]
    assert rows["GQA-4 (this model)"]["cache_bytes"] == 22_528 * 2048       # ≈ 45 MB at 2,048 tokens


def test_kv_shape_bytes_and_helpers():
    c = load_preset("SmolLM2-135M-Instruct")
    assert kv_cache_bytes_from_shape(c, 10) == 2 * 30 * 3 * 64 * 10 * 4
    assert sweep_lengths(251) == (16, 32, 64, 128) and sweep_lengths(10_000) == (16, 32, 64, 128, 256, 512)
    assert subsequence_end([1, 5, 6, 7, 2, 5, 6, 7, 9], [5, 6, 7]) == 7 and subsequence_end([1, 2], [3]) is None
