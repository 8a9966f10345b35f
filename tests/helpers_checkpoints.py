"""Write tiny test checkpoints: Hugging Face folders (config.json + safetensors) and llama.cpp GGUF files.

Every writer returns the float32 tensors (Hugging Face names, [out, in] layout) exactly as a correct loader must
see them after the file's dtype rounding, so tests can compare weights and logits across formats.

    cfg = tiny_config()
    ref = write_hf_checkpoint(tmp_path / "hf", cfg, seed=0, dtype="bfloat16")
    write_gguf(tmp_path / "m.gguf", cfg, tensors=ref)          # same weights, GGUF layout, q/k permuted
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TINYLLAMA_TOKENIZER = REPO_ROOT.parent / "shared/models/tinyllama-tokenizer"


# ---------------------------------------------------------------------------------------- configs and weights
def tiny_config(vocab_size: int = 267, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 96, tie: bool = False, **extra) -> dict:
    """A Hugging Face Llama config.json dict, small enough to run in milliseconds."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden_size,
        "intermediate_size": intermediate_size, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads, "vocab_size": vocab_size, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": tie, "hidden_act": "silu",
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    cfg.update(extra)
    return cfg


def random_tensors(cfg: dict, seed: int = 0, std: float = 0.08) -> dict[str, np.ndarray]:
    """Random float32 weights with HF Llama names and shapes for `cfg`."""
    rng = np.random.default_rng(seed)
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or D // H

    def mat(*shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm():
        return rng.uniform(0.5, 1.5, D).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(V, D), "model.norm.weight": norm()}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
                  p + "self_attn.q_proj.weight": mat(H * hd, D), p + "self_attn.k_proj.weight": mat(KV * hd, D),
                  p + "self_attn.v_proj.weight": mat(KV * hd, D), p + "self_attn.o_proj.weight": mat(D, H * hd),
                  p + "mlp.gate_proj.weight": mat(F, D), p + "mlp.up_proj.weight": mat(F, D),
                  p + "mlp.down_proj.weight": mat(D, F)})
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = mat(V, D)
    return t


def tiny_gemma3_config(vocab_size: int = 96, hidden_size: int = 64, num_layers: int = 3, num_heads: int = 4,
                       num_kv_heads: int = 1, head_dim: int = 32, intermediate_size: int = 96,
                       sliding_window: int = 8, **extra) -> dict:
    """A Hugging Face Gemma 3 text config.json dict (Gemma3ForCausalLM): MQA with a wide head, a sliding window
    on every layer but each third, local and global RoPE bases, a query scale that is not 1/sqrt(head_dim)."""
    cfg = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": hidden_size,
        "intermediate_size": intermediate_size, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads, "head_dim": head_dim, "vocab_size": vocab_size,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "sliding_window": sliding_window,
        "layer_types": ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(num_layers)],
        "query_pre_attn_scalar": 24, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "torch_dtype": "float32", "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
        "final_logit_softcapping": None, "attn_logit_softcapping": None,
    }
    cfg.update(extra)
    return cfg


def random_gemma3_tensors(cfg: dict, seed: int = 0, std: float = 0.08) -> dict[str, np.ndarray]:
    """Random float32 weights with HF Gemma 3 names: Llama's plus q/k norms and the pre/post MLP norms. Norm
    weights are Gemma's w (the layer multiplies by 1 + w), drawn around 0."""
    rng = np.random.default_rng(seed)
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def mat(*shape):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n=D):
        return rng.uniform(-0.5, 0.5, n).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(V, D), "model.norm.weight": norm()}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
                  p + "pre_feedforward_layernorm.weight": norm(), p + "post_feedforward_layernorm.weight": norm(),
                  p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
                  p + "self_attn.q_proj.weight": mat(H * hd, D), p + "self_attn.k_proj.weight": mat(KV * hd, D),
                  p + "self_attn.v_proj.weight": mat(KV * hd, D), p + "self_attn.o_proj.weight": mat(D, H * hd),
                  p + "mlp.gate_proj.weight": mat(F, D), p + "mlp.up_proj.weight": mat(F, D),
                  p + "mlp.down_proj.weight": mat(D, F)})
    return t


# ---------------------------------------------------------------------------------------- safetensors
def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even like torch."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """What a float32 array becomes after a round trip through `dtype` (as float32)."""
    if dtype == "float32":
        return a.astype(np.float32)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)
    raise ValueError(dtype)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "float32") -> None:
    """float32/float16 with the safetensors library itself; bfloat16 (no NumPy dtype) by writing the documented
    format: u64 header length, JSON header, raw little-endian bytes."""
    if dtype in ("float32", "float16"):
        from safetensors.numpy import save_file
        np_dtype = np.float32 if dtype == "float32" else np.float16
        save_file({k: np.ascontiguousarray(v, dtype=np_dtype) for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
        return
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        raw = bf16_bits(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def write_hf_checkpoint(folder: str | Path, cfg: dict, seed: int = 0, dtype: str = "float32",
                        tokenizer_src: str | Path | None = None, shards: int = 1,
                        tensors: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """config.json + model.safetensors (or `shards` files + model.safetensors.index.json) with random weights;
    copies tokenizer files from `tokenizer_src` when given. Returns the weights as the loader must read them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**cfg, "torch_dtype": dtype}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = tensors if tensors is not None else random_tensors(cfg, seed)
    names = list(tensors)
    if shards <= 1:
        write_safetensors(folder / "model.safetensors", tensors, dtype)
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[s::shards]}
            write_safetensors(folder / fname, part, dtype)
            weight_map.update({n: fname for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer_src is not None:
        for f in Path(tokenizer_src).iterdir():
            if f.suffix == ".json" or f.name.endswith(".jinja"):
                shutil.copy(f, folder / f.name)
    return {k: round_to(v, dtype) for k, v in tensors.items()}


# ---------------------------------------------------------------------------------------- tokenizers for GGUF
def byte_level_tokenizer_fields() -> dict:
    """A tiny GPT-2-style vocabulary: 3 control tokens, the 256 byte characters, 8 merges (267 tokens)."""
    from engine.load.tokenizer import byte_to_char

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r", "l l", "o r"]
    tokens = specials + [byte_to_char()[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                       "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                                       "assistant\n{% endif %}"}


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _proto_fields(buf: bytes):
    """Yield (field number, wire type, value) of one protobuf message (enough for sentencepiece's ModelProto)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def sentencepiece_gguf_fields(tokenizer_model: str | Path) -> dict:
    """GGUF "llama" tokenizer metadata from a SentencePiece tokenizer.model, as llama.cpp's converter writes it:
    pieces, scores and types (1 normal, 2 unknown, 3 control, 6 byte), read with a 30-line protobuf parser."""
    tokens, scores, types = [], [], []
    for field, _, value in _proto_fields(Path(tokenizer_model).read_bytes()):
        if field != 1:  # ModelProto.pieces
            continue
        piece, score, kind = "", 0.0, 1
        for f, _, v in _proto_fields(value):
            if f == 1:
                piece = v.decode("utf-8")
            elif f == 2:
                score = struct.unpack("<f", v)[0]
            elif f == 3:
                kind = v
        tokens.append(piece)
        scores.append(score)
        types.append(kind)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_space_prefix": True}


# ---------------------------------------------------------------------------------------- GGUF
def permute_llama_cpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `permute` (copied semantics): rotate-half rows -> interleaved pairs."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    _, _, i, rest = hf.split(".", 3)                     # model.layers.{i}.{module}.weight
    return f"blk.{i}.{_GGUF_LAYER[rest.removesuffix('.weight')]}.weight"


def llama3_rope_freqs(cfg: dict) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's convert_hf_to_gguf.py writes for a config with llama3 rope_scaling:
    per dimension pair, 1 (short wavelength), `factor` (long), or 1 / ((1 - smooth) / factor + smooth) between.
    Written as the converter's own loop, independently of engine.model.ops.rope_inv_freq."""
    import math
    rs, dim = cfg["rope_scaling"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * cfg["rope_theta"] ** (i / dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def gguf_writer(path: str | Path, arch: str, name: str, cfg: dict):
    """A GGUFWriter with the shape metadata every architecture has (context, widths, layers, heads)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    return w


def write_gguf(path: str | Path, cfg: dict, tensors: dict[str, np.ndarray] | None = None, seed: int = 0,
               qtype: str = "F32", tokenizer: dict | None = None, permute: bool = True,
               arch: str = "llama", rope_freqs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A llama GGUF file as llama.cpp's converter writes it: llama.* metadata, tokenizer metadata, tensors with
    GGUF names and q/k rows permuted for interleaved RoPE; 2-D weights quantized to `qtype` (F32, F16, Q8_0,
    Q4_0, Q4_1), norms kept F32; `rope_freqs` (Llama-3.1 frequency factors) as an F32 tensor when given.
    Returns the HF-layout float32 weights a correct loader must reconstruct."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    tensors = tensors if tensors is not None else random_tensors(cfg, seed)
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg["hidden_size"]
    w = gguf_writer(path, arch, "tiny-test-llama", cfg)
    w.add_rope_dimension_count(cfg.get("head_dim") or D // H)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if tokenizer:
        _add_tokenizer(w, tokenizer)
    expected = {}
    q = Q[qtype]
    for hf, a in tensors.items():
        if hf == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        data = a.astype(np.float32)
        if permute and hf.endswith("q_proj.weight"):
            data = permute_llama_cpp(data, H)
        elif permute and hf.endswith("k_proj.weight"):
            data = permute_llama_cpp(data, KV)
        if data.ndim == 1 or q == Q.F32:
            stored, seen = data, data
        elif q == Q.F16:
            stored = data.astype(np.float16)
            seen = stored.astype(np.float32)
        else:
            stored = quantize(data, q)
            seen = reference_dequantize(stored, qtype, data.shape)    # not gguf-py's decoder: the loader uses it
        w.add_tensor(gguf_name(hf), stored, raw_dtype=None if stored.dtype != np.uint8 else q)
        back = seen
        if permute and hf.endswith("q_proj.weight"):
            back = _unpermute(seen, H)
        elif permute and hf.endswith("k_proj.weight"):
            back = _unpermute(seen, KV)
        expected[hf] = np.ascontiguousarray(back, dtype=np.float32)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def reference_dequantize(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """GGUF block formats decoded from their byte layout (ggml-common.h), independently of gguf-py: what a test
    expects the loader's dequantized weights to be. Blocks of 32 weights; fp16 scale d (and minimum m):
      Q8_0  d | 32 x int8 q                     -> d·q
      Q4_0  d | 16 bytes, low nibbles = 0..15    -> d·(q - 8)      (high nibbles are weights 16..31)
      Q4_1  d, m | 16 bytes of nibbles           -> d·q + m
      Q5_0  d | 32-bit high bits | 16 bytes      -> d·(q5 - 16)    (bit j of the 32 is weight j's fifth bit)
      Q5_1  d, m | 32-bit high bits | 16 bytes   -> d·q5 + m
    BF16 is the top half of a float32."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if qtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    has_min = qtype in ("Q4_1", "Q5_1")
    head = 4 if has_min else 2
    five = qtype.startswith("Q5")
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}[qtype]
    blocks = raw.reshape(-1, size)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)                  # [n, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32) if has_min else np.float32(0)
    if qtype == "Q8_0":
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)
    start = head + (4 if five else 0)
    nib = blocks[:, start:start + 16].astype(np.int32)
    q = np.concatenate([nib & 0xF, nib >> 4], axis=1)                             # [n, 32]: weights 0..15, 16..31
    if five:
        high = blocks[:, head:head + 4].copy().view("<u4").astype(np.int64)       # [n, 1]
        q = q | (((high >> np.arange(32)) & 1) << 4).astype(np.int32)
    offset = {"Q4_0": 8, "Q5_0": 16}.get(qtype, 0)
    return (d * (q - offset).astype(np.float32) + m).reshape(shape)


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_tokenizer(w, f: dict) -> None:
    w.add_tokenizer_model(f["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in f:
        w.add_tokenizer_pre(f["tokenizer.ggml.pre"])
    w.add_token_list(f["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.scores" in f:
        w.add_token_scores(f["tokenizer.ggml.scores"])
    if "tokenizer.ggml.token_type" in f:
        w.add_token_types(f["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in f:
        w.add_token_merges(f["tokenizer.ggml.merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id)):
        if f"tokenizer.ggml.{key}" in f:
            add(f[f"tokenizer.ggml.{key}"])
    if "tokenizer.ggml.add_bos_token" in f:
        w.add_add_bos_token(f["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_space_prefix" in f:
        w.add_add_space_prefix(f["tokenizer.ggml.add_space_prefix"])
    if f.get("tokenizer.chat_template"):
        w.add_chat_template(f["tokenizer.chat_template"])


_GEMMA3_GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                      "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                      "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                      "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
                      "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gemma3_gguf(path: str | Path, cfg: dict, tensors: dict[str, np.ndarray], drop: str | None = None,
                      arch: str = "gemma3") -> None:
    """A Gemma 3 GGUF as llama.cpp's converter (Gemma3Model) writes it: gemma3.* metadata (key_length = head_dim,
    the per-layer sliding-window pattern as booleans, no local RoPE base: readers assume 10,000), F32 tensors
    with llama.cpp names, q/k rows NOT permuted, every norm stored as 1 + w. `drop`: a GGUF tensor name to leave
    out (a damaged file); `arch`: the general.architecture string to write."""
    w = gguf_writer(path, arch, "tiny-test-gemma3", cfg)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    for hf, a in tensors.items():
        if hf.startswith("model.layers."):
            _, _, i, rest = hf.split(".", 3)
            name = f"blk.{i}.{_GEMMA3_GGUF_LAYER[rest.removesuffix('.weight')]}.weight"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[hf]
        if name == drop:
            continue
        data = a.astype(np.float32) + (np.float32(1.0) if hf.endswith("norm.weight") else np.float32(0.0))
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
