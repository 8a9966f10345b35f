"""Load a llama.cpp GGUF file into the engine: metadata -> ModelConfig + Tokenizer, tensors -> float32 HF layout.

A GGUF file is one header (key/value metadata: architecture numbers, the tokenizer, the chat template) followed by
the tensors, each possibly quantized in blocks (Q8_0: 32 int8 + one fp16 scale; Q4_1: 32 4-bit values + fp16
scale and minimum). `gguf.GGUFReader` memory-maps the file; `gguf.quants.dequantize` expands each block format to
float32 with vectorised NumPy.

Two layout facts to undo:
  * names: llama.cpp's "blk.3.attn_q.weight" is Hugging Face's "model.layers.3.self_attn.q_proj.weight".
  * RoPE: llama.cpp's converter reorders the rows of W_q and W_k inside each head so that llama.cpp can rotate
    adjacent pairs (x0,x1),(x2,x3)...; Hugging Face rotates the two halves (x_i, x_{i+d/2}). We put the rows back
    (`unpermute_rows`), so the engine's default rotate-half RoPE is right.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.errors import ModelError
from specs.model_config import ModelConfig, SpecError

Progress = Callable[[float, str], None]

SUPPORTED_ARCHITECTURES = ("llama", "gemma3")
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 (llama.cpp's names -> transformers' Gemma3ForCausalLM names). Note the swap: llama.cpp's ffn_norm is the
# norm BEFORE the MLP (Gemma's pre_feedforward_layernorm) and post_attention_norm the one after attention.
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
GEMMA3_SWA_PATTERN = 6      # llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3): every 6th layer global, when unstated
GEMMA3_LOCAL_ROPE_BASE = 10000.0   # llama.cpp's rope_freq_base_train_swa for Gemma 3 (not stored in the file)
ROPE_FREQS = "rope_freqs.weight"  # Llama-3.1/3.2: one divisor per rotation pair (the llama3 scaling, precomputed)
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def _no_progress(fraction: float, message: str) -> None:
    pass


# ---------------------------------------------------------------------------------------- names and rows
def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """llama.cpp tensor name -> Hugging Face name (None if it is not part of that architecture)."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    layer_names = GEMMA3_LAYER_NAMES if arch == "gemma3" else LAYER_NAMES
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in layer_names:
        return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.weight"
    return None


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `permute`: per head, rows [half0 | half1] -> interleaved pairs.
    [n_heads*d, in] -> [n_heads*d, in]"""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `permute_rows`: per head, interleaved pairs -> [half0 | half1].   [n_heads*d, in] -> same"""
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


# ---------------------------------------------------------------------------------------- reading
def _reader_class():
    """gguf.GGUFReader, holding the file as a plain ndarray view of its memory map.

    Why: the reader slices its `np.memmap` ~1 million times (49k vocabulary strings, then every quant block);
    each slice of a memmap *subclass* pays Python-level bookkeeping (`__array_finalize__`). A plain ndarray view
    of the same mapped bytes is still zero-copy and makes opening SmolLM2 ~4x faster (2.9 s -> 0.7 s on 2 cores).
    """
    import gguf

    class PlainArrayGGUFReader(gguf.GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = np.asarray(value)  # base-class view; the mmap stays alive through .base

    return PlainArrayGGUFReader


def open_gguf(path: str | Path):
    """Memory-map a GGUF file; ModelError when it is missing or not a (complete) GGUF file."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"GGUF file not found: {p}")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelError(f"{p} is not a GGUF file (it starts with {magic!r}, a GGUF file starts with b'GGUF'); "
                         f"pass a llama.cpp .gguf file, or a Hugging Face model folder")
    try:
        return _reader_class()(p, "r")
    except Exception as e:  # truncated header, tensor data past the end of the file, ...
        raise ModelError(f"{p} could not be read as GGUF ({type(e).__name__}: {e}); the file is damaged or "
                         f"incomplete: download it again") from None


def read_fields(reader, prefix: str = "") -> dict[str, Any]:
    """Metadata key -> Python value (str, int, float, bool or list), for keys starting with `prefix`."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith(prefix):
            try:
                out[key] = field.contents()
            except Exception:  # a value type gguf-py cannot turn into Python: not one we need
                continue
    return out


def config_from_fields(fields: dict[str, Any], name: str, n_vocab_rows: int | None, tied: bool,
                       rope_freq_factors: np.ndarray | None = None) -> ModelConfig:
    """ModelConfig from llama.cpp metadata ("llama.embedding_length", ...).

    rope_freq_factors: the `rope_freqs` tensor of a Llama-3.1/3.2 GGUF. llama.cpp's converter stores the llama3
    RoPE scaling as one divisor per dimension pair (1 for fast rotations, `factor` for slow ones, a blend in
    between) instead of metadata; llama.cpp divides each frequency by it, and so does `ops.rope_inv_freq`."""
    arch = fields.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"{name}: GGUF architecture {arch!r} is not supported; this engine runs "
                         f"general.architecture = 'llama' (Llama-architecture models) or 'gemma3' (Gemma 3 text)")

    def get(key: str, default: Any = None, required: bool = True) -> Any:
        v = fields.get(f"{arch}.{key}", default)
        if v is None and required:
            raise ModelError(f"{name}: GGUF metadata lacks {arch}.{key}; the file is incomplete")
        return v

    if get("expert_count", 0, required=False):
        raise ModelError(f"{name}: this GGUF is a mixture-of-experts model ({arch}.expert_count > 0); the engine "
                         f"runs dense Llama models only")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = get("rope.dimension_count", None, required=False) or get("attention.key_length", None, False)
    head_dim = int(head_dim) if head_dim else hidden // heads
    vocab = get("vocab_size", None, required=False) or n_vocab_rows or len(fields.get("tokenizer.ggml.tokens", []))
    rope_scaling = _rope_scaling(fields.get(f"{arch}.rope.scaling.type"), get, rope_freq_factors, name)
    extra = {"gguf_file_type": fields.get("general.file_type")}
    family = _gemma3_fields(get, hidden, heads, head_dim) if arch == "gemma3" else {"model_type": "llama"}
    try:
        return ModelConfig(
            name=name, hidden_size=hidden, num_layers=int(get("block_count")), num_heads=heads,
            num_kv_heads=int(get("attention.head_count_kv", heads, required=False)), head_dim=head_dim,
            intermediate_size=int(get("feed_forward_length")), vocab_size=int(vocab),
            max_position_embeddings=int(get("context_length", 2048, required=False)),
            rope_theta=float(get("rope.freq_base", 10000.0, required=False)), rope_scaling=rope_scaling,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5, required=False)),
            tie_word_embeddings=tied, torch_dtype="float32",  # what the engine holds after dequantizing
            bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=fields.get("tokenizer.ggml.eos_token_id"),
            source="GGUF metadata", extra=extra, **family)
    except SpecError as e:
        raise ModelError(f"{name}: GGUF metadata describes an impossible model ({e})") from None


def _gemma3_fields(get: Callable, hidden: int, heads: int, head_dim: int) -> dict:
    """What a Gemma 3 GGUF leaves to the reader, filled in as llama.cpp does (llama-model.cpp, LLM_ARCH_GEMMA3) and
    as transformers' Gemma3TextConfig defaults say: every 6th layer global, the others a sliding window; local
    RoPE base 10,000; scores ÷ sqrt(head_dim) (27B: ÷ sqrt(D / h_q)); embeddings × sqrt(D); tanh-GELU MLP."""
    layers = int(get("block_count"))
    pattern = get("attention.sliding_window_pattern", None, required=False)
    if isinstance(pattern, list):          # newer files: one flag per layer, True = sliding window
        types = tuple("sliding_attention" if bool(f) else "full_attention" for f in pattern)
    else:
        k = int(pattern or GEMMA3_SWA_PATTERN)
        types = tuple("sliding_attention" if (i + 1) % k else "full_attention" for i in range(layers))
    cap = get("final_logit_softcapping", None, required=False)
    return dict(model_type="gemma3_text", sliding_window=int(get("attention.sliding_window")), layer_types=types,
                rope_local_theta=GEMMA3_LOCAL_ROPE_BASE, hidden_activation="gelu_tanh",
                query_pre_attn_scalar=float(hidden // heads if layers == 62 else head_dim),
                embed_scale=hidden ** 0.5, final_logit_softcapping=float(cap) if cap else None,
                norms_per_layer=4, qk_norm=True, attention="mqa" if int(get("attention.head_count_kv")) == 1
                else "gqa")


def _rope_scaling(kind: str | None, get: Callable, freq_factors: np.ndarray | None, name: str) -> dict | None:
    """GGUF RoPE metadata (+ the rope_freqs tensor) -> a Hugging Face-style rope_scaling dict for ops.rope_inv_freq."""
    if kind not in (None, "none", "linear"):
        raise ModelError(f"{name}: RoPE scaling type {kind!r} is not supported (supported: none, linear, and "
                         f"Llama-3.1 rope_freqs factors)")
    scaling: dict = {}
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    if freq_factors is not None:
        scaling = {"rope_type": "default", **scaling, "freq_factors": [float(f) for f in freq_factors.ravel()]}
    return scaling or None


def dequantize_tensor(t, path: Path) -> np.ndarray:
    """One GGUF tensor -> float32 array in row-major [rows, cols] order (= HF [out, in]).  Vectorised."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType(t.tensor_type)
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists the fastest-moving dimension first
    try:
        if qtype == GGMLQuantizationType.F32:
            a = np.asarray(t.data, dtype=np.float32)
        elif qtype == GGMLQuantizationType.F16:
            a = np.asarray(t.data).view(np.float16).astype(np.float32)
        else:
            a = quants.dequantize(t.data, qtype)
    except NotImplementedError:
        raise ModelError(f"{path.name}: tensor {t.name} uses quantization {qtype.name}, which gguf-py cannot "
                         f"dequantize; use a GGUF quantized as F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_*, Q*_K") from None
    return np.ascontiguousarray(a, dtype=np.float32).reshape(shape)


def load_gguf(path: str | Path, progress: Progress | None = None, name: str | None = None):
    """Load a Llama GGUF file as an engine `Model` (float32 weights, HF names, rotate-half RoPE rows).

    name: display name for the model (default: the file's general.name, else the file name)."""
    from engine.model.model import Model
    from engine.load.tokenizer import Tokenizer

    progress = progress or _no_progress
    p = Path(path)
    t0 = time.perf_counter()
    progress(0.0, f"reading {p.name}")
    reader = open_gguf(p)
    fields = read_fields(reader)
    names = {t.name: t for t in reader.tensors}
    name = name or str(fields.get("general.name") or p.stem)
    embd = names.get("token_embd.weight")
    if embd is None:
        raise ModelError(f"{p.name}: no token_embd.weight tensor; this is not a complete GGUF model")
    freqs = dequantize_tensor(names[ROPE_FREQS], p) if ROPE_FREQS in names else None
    config = config_from_fields(fields, name, int(embd.shape[-1]), tied="output.weight" not in names,
                                rope_freq_factors=freqs)
    tokenizer = None
    if "tokenizer.ggml.tokens" in fields:
        tokenizer = Tokenizer.from_gguf_fields({k: v for k, v in fields.items() if k.startswith("tokenizer.")},
                                               source=str(p))
    arch = fields.get("general.architecture")
    unknown = [n for n in names if hf_name(n, arch) is None and n != ROPE_FREQS]
    if unknown:
        raise ModelError(f"{p.name}: tensors {unknown[:3]} are not part of a plain {arch} model; this engine runs "
                         f"dense Llama-architecture and Gemma 3 GGUFs only")
    _check_complete(config, arch, names, p)

    tensors: dict[str, np.ndarray] = {}
    for i, (gname, t) in enumerate(names.items()):
        if gname == ROPE_FREQS:                                  # already applied through config.rope_scaling
            continue
        w = dequantize_tensor(t, p)
        if arch == "gemma3":
            if gname.endswith("norm.weight"):    # the converter stored Gemma's 1 + w; HF names mean w
                w = w - np.float32(1.0)          # (as transformers' Gemma2TensorProcessor does)
        elif gname.endswith("attn_q.weight"):    # Gemma's q/k rows were never permuted (llama.cpp uses NEOX RoPE)
            w = _unpermute_checked(w, config.num_heads, gname, p)
        elif gname.endswith("attn_k.weight"):
            w = _unpermute_checked(w, config.num_kv_heads, gname, p)
        tensors[hf_name(gname, arch)] = w
        progress(0.05 + 0.9 * (i + 1) / len(names), f"dequantizing {gname} ({t.tensor_type.name})")
    model = Model.from_hf_tensors(config, tensors, tokenizer=tokenizer, source=str(p))
    progress(1.0, f"loaded {name} from {p.name} in {time.perf_counter() - t0:.1f} s")
    return model


def _check_complete(config: ModelConfig, arch: str, names: dict, path: Path) -> None:
    """Every tensor the architecture needs is in the file, else one message naming the first missing ones."""
    from engine.model.model import hf_tensor_names

    have = {hf_name(n, arch) for n in names}
    missing = [n for n in hf_tensor_names(config) if n not in have]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ModelError(f"{path.name}: this {arch} GGUF lacks tensors {missing[:3]}{more} (Hugging Face names); "
                         f"the file is incomplete or not a {arch} model")


def _unpermute_checked(w: np.ndarray, n_heads: int, gname: str, path: Path) -> np.ndarray:
    if w.shape[0] % (2 * n_heads):
        raise ModelError(f"{path.name}: {gname} has {w.shape[0]} rows, not a multiple of 2 x {n_heads} heads; "
                         f"the metadata and the tensors do not match")
    return unpermute_rows(w, n_heads)
