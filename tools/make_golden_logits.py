"""Write tests/golden/<case>.npz: Hugging Face transformers' LlamaForCausalLM (or Gemma3ForCausalLM) logits for the
tiny checkpoints in tests/golden_cases.py (GQA, MHA, MQA with a wide head, llama3 RoPE scaling, untied head, a
600-token prompt; Gemma 3 with sliding windows). `python tools/make_golden_logits.py gemma3_window` redoes one case.

Run once, with torch and transformers installed (requirements-reference.txt), then commit the .npz files:

    python tools/make_golden_logits.py

tests/engine/test_golden_logits.py compares the engine with them in every default test run, without torch. Each file
holds `logits` (float32 [P, V] at the case's stored positions), `positions`, `tokens`, and the versions used.
The reference runs in float64 (weights are float32 values, exactly representable), so the stored numbers are the
float32 weights' exact-arithmetic logits to ~1e-7 (then rounded to float32).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from golden_cases import CASES, GOLDEN_DIR, case_tokens, case_weights, is_gemma3  # noqa: E402


def reference_model(name: str):
    """transformers' LlamaForCausalLM, or Gemma3ForCausalLM (eager attention: the plain sliding-window mask)."""
    import transformers

    cfg = CASES[name][0]
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "model_type")}
    if is_gemma3(name):
        config = transformers.Gemma3TextConfig(**hf_cfg)
        config._attn_implementation = "eager"
        return transformers.Gemma3ForCausalLM(config).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_cfg)).eval()


def reference_logits(name: str) -> tuple[np.ndarray, list[int], list[int]]:
    import torch

    cfg, _, _, positions = CASES[name]
    model = reference_model(name)
    state = {k: torch.from_numpy(v) for k, v in case_weights(name).items()}
    if cfg["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    model = model.double()
    tokens = case_tokens(name)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].numpy()
    return logits[positions].astype(np.float32), tokens, positions


def main() -> None:
    import torch
    import transformers

    GOLDEN_DIR.mkdir(exist_ok=True)
    for name in sys.argv[1:] or CASES:
        logits, tokens, positions = reference_logits(name)
        path = GOLDEN_DIR / f"{name}.npz"
        np.savez_compressed(path, logits=logits, positions=np.array(positions, np.int32),
                            tokens=np.array(tokens, np.int32),
                            versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"))
        print(f"{path.relative_to(ROOT)}: logits {logits.shape}, {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
