"""Write a loaded engine `Model` as a Hugging Face model folder that transformers and vLLM load.

    config.json              LlamaForCausalLM architecture numbers (from the model's ModelConfig)
    model.safetensors        every weight under its Hugging Face name, float32
    tokenizer.json           the fast tokenizer (for a GGUF: the one rebuilt from its metadata)
    tokenizer_config.json    special tokens, add_bos_token and the chat template
    generation_config.json   bos / eos ids (every id that ends generation for this engine)

Why: real serving stacks (vLLM, SGLang, TGI) load Hugging Face folders, not the Q4_1 GGUF the default model ships
as. Exporting the engine's own dequantized weights gives them exactly the numbers the engine runs, so their greedy
text can be compared with ours token for token.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine.errors import ModelError


def hf_config_dict(model) -> dict:
    """The model's ModelConfig as a Llama `config.json` dict."""
    c = model.config
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": float(c.rms_norm_eps),
        "rope_theta": float(c.rope_theta), "tie_word_embeddings": bool(c.tie_word_embeddings),
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
    }
    if c.rope_scaling:
        if "freq_factors" in c.rope_scaling:
            raise ModelError(f"{model.name}: its RoPE scaling is stored as per-pair factors (a Llama-3.1 GGUF), "
                             f"which a Hugging Face config.json cannot express; export is for plain Llama RoPE")
        cfg["rope_scaling"] = dict(c.rope_scaling)
    return cfg


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """float32 safetensors through the `safetensors` library (what `engine.load.hf_loader` reads back)."""
    from safetensors.numpy import save_file
    save_file({n: np.ascontiguousarray(a, dtype=np.float32) for n, a in tensors.items()}, str(path),
              metadata={"format": "pt"})


def tokenizer_config_dict(tokenizer, context: int) -> dict:
    stm = tokenizer.special_tokens_map
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": bool(tokenizer.add_bos),
           "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": context}
    cfg.update({k: v for k, v in stm.items() if k in ("bos_token", "eos_token", "unk_token", "pad_token")})
    if tokenizer.chat_template:
        cfg["chat_template"] = tokenizer.chat_template
    return cfg


def export_tokenizer(model, out_dir: str | Path) -> Path:
    """Write every file of the Hugging Face folder but the weights (config.json, tokenizer.json,
    tokenizer_config.json, generation_config.json; about 3.5 MB for SmolLM2): what a load tester (guidellm,
    `vllm bench serve`, AIPerf) loads with AutoTokenizer to count tokens, offline, against the engine server."""
    if model.tokenizer is None:
        raise ModelError(f"{model.name} has no tokenizer; a Hugging Face folder needs tokenizer.json")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tok = model.tokenizer
    (out / "config.json").write_text(json.dumps(hf_config_dict(model), indent=2) + "\n", encoding="utf-8")
    tok.backend.save(str(out / "tokenizer.json"))
    tcfg = tokenizer_config_dict(tok, model.config.max_position_embeddings)
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n", encoding="utf-8")
    eos = list(tok.eos_token_ids) or list(model.config.eos_token_ids)
    gen = {"bos_token_id": tok.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    return out


def export_hf(model, out_dir: str | Path) -> Path:
    """Write `model` as a float32 Hugging Face folder in `out_dir` (created; files of the same names replaced).
    A server that wants bfloat16 casts at load (vLLM: `--dtype bfloat16`)."""
    out = export_tokenizer(model, out_dir)
    write_safetensors(out / "model.safetensors", model.to_hf_tensors())
    return out
