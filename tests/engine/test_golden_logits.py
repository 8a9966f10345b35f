"""The forward pass against Hugging Face transformers, in every default run and without torch: logits that
transformers' LlamaForCausalLM computed (in float64) for tiny random checkpoints, committed as tests/golden/*.npz
by tools/make_golden_logits.py. The weights are regenerated from their seeds (tests/golden_cases.py).

Covers GQA, MHA, MQA with head_dim ≠ D/h, llama3 RoPE scaling, tied and untied LM heads, and a 600-token prompt
(the engine attends in blocks of 512 queries past that length); and Gemma 3 (Gemma3ForCausalLM: sliding windows of
8 and 100 positions, local/global RoPE bases, q/k norms, four norms per layer, GeGLU, √D embeddings, a query scale
that is not 1/√d_k), also decoded through the sliding-window cache. Measured worst case for Gemma 3: 7e-6.

Tolerance 1e-5 absolute, for logits of magnitude ≤ ~3: the engine runs float32 (eps 6e-8) through 1-2 layers of
sums over ≤ 96 terms; the measured worst case is ~1e-6 (printed with -s). A wrong head grouping, mask, RoPE
frequency or norm moves logits by 1e-2 or more.
"""
import numpy as np
import pytest

from engine.model.model import Model
from golden_cases import CASES, GOLDEN_DIR, case_tokens, case_weights
from specs.hf_config import parse_hf_config

ATOL = 1e-5


def _engine(name: str) -> Model:
    cfg = CASES[name][0]
    return Model.from_hf_tensors(parse_hf_config(cfg, name=name), case_weights(name))


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers_golden(name):
    golden = np.load(GOLDEN_DIR / f"{name}.npz")
    tokens = case_tokens(name)
    assert golden["tokens"].tolist() == tokens              # the seed still gives the prompt the file was made for
    ours = _engine(name).logits(tokens)[golden["positions"]]
    err = float(np.abs(ours - golden["logits"]).max())
    print(f"{name}: max |engine - transformers| = {err:.1e} (logit scale {np.abs(golden['logits']).max():.2f})")
    assert err <= ATOL


@pytest.mark.parametrize("name", ["gqa_untied", "llama3_scaling", "gemma3_window", "gemma3_long_prompt"])
def test_cached_decode_matches_transformers_golden(name):
    """Prefill then one decode step per token: the KV-cache path gives the same logits as the full pass."""
    golden = np.load(GOLDEN_DIR / f"{name}.npz")
    tokens, positions = case_tokens(name), list(golden["positions"])
    model, split = _engine(name), len(tokens) - 6
    cache = model.new_cache(1)
    model.prefill(tokens[:split], cache)
    for i in range(split, len(tokens)):
        logits = model.decode_step(tokens[i], cache)
        if i in positions:
            assert np.abs(logits - golden["logits"][positions.index(i)]).max() <= ATOL
