"""Load a Hugging Face model folder (config.json + *.safetensors + tokenizer files) into the engine.

Safetensors is a simple format, read here directly so that every dtype works with NumPy alone:

    [8 bytes: header length N, little-endian u64][N bytes: JSON header][raw tensor bytes]
    header = {"model.norm.weight": {"dtype": "BF16", "shape": [576], "data_offsets": [begin, end]}, ...}

NumPy has no bfloat16, but bf16 is just the top 16 bits of a float32, so `uint16 << 16` viewed as float32 is
exact. Pickle files (pytorch_model.bin, *.pt) can run arbitrary code when loaded and are never opened.
"""
from __future__ import annotations

import json
import mmap
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from engine.errors import ModelError
from specs.hf_config import lift_rope_parameters
from specs.model_config import ModelConfig, SpecError
from specs.hf_config import parse_hf_config

Progress = Callable[[float, str], None]

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                      "F64": np.dtype("<f8")}
LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER_BYTES = 100 * 2**20


def _no_progress(fraction: float, message: str) -> None:
    pass


# ---------------------------------------------------------------------------------------- safetensors
def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: the 16 bits become the high half of a float32.  [...] -> [...]"""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_safetensors_header(path: Path) -> tuple[dict[str, dict], int]:
    """(tensor name -> {"dtype", "shape", "data_offsets"}, offset where tensor bytes start). Checks the file is
    long enough for every tensor the header announces (a truncated download fails here, not mid-inference)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 0 or n > min(size - 8, MAX_HEADER_BYTES):
            raise ModelError(f"{path} is not a valid safetensors file (bad header length); it is damaged or "
                             f"incomplete: download it again")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ModelError(f"{path} has a corrupt safetensors header; download it again") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path} has a corrupt safetensors header; download it again")
    header.pop("__metadata__", None)
    base = 8 + n
    for name, info in header.items():
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: entry {name!r} of the safetensors header is malformed; download it again")
        if base + end > size:
            raise ModelError(f"{path} is truncated: tensor {name} needs bytes up to {base + end:,} but the file "
                             f"has {size:,}; the download was interrupted, download it again")
        if dtype in SAFETENSORS_DTYPES and end - begin != int(np.prod(shape)) * SAFETENSORS_DTYPES[dtype].itemsize:
            raise ModelError(f"{path}: tensor {name} has {end - begin} bytes, not what shape {shape} x {dtype} "
                             f"needs; the file is corrupt")
    return header, base


def read_safetensors(path: str | Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Tensors of one .safetensors file as float32 arrays (only `names` when given)."""
    p = Path(path)
    header, base = read_safetensors_header(p)
    wanted = header.keys() if names is None else [n for n in names if n in header]
    out = {}
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for name in wanted:
            info = header[name]
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ModelError(f"{p.name}: tensor {name} is stored as {info['dtype']}; this engine reads F32, "
                                 f"F16 and BF16 safetensors (convert the checkpoint to one of those)")
            begin, end = info["data_offsets"]
            count = (end - begin) // dtype.itemsize
            raw = np.frombuffer(mm, dtype=dtype, count=count, offset=base + begin)
            arr = bf16_to_f32(raw) if info["dtype"] == "BF16" else raw.astype(np.float32)
            out[name] = arr.reshape(info["shape"])
            del raw  # release the view before the map closes
    return out


def safetensors_files(folder: Path) -> dict[str, Path]:
    """tensor name -> file holding it, from model.safetensors, a sharded index, or a lone *.safetensors."""
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            assert isinstance(weight_map, dict)
        except Exception:
            raise ModelError(f"{index} is not a valid safetensors index (no 'weight_map'); download it again") from None
        missing = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
        if missing:
            raise ModelError(f"{folder}: shard files {missing[:3]} listed in {index.name} are missing; the download "
                             f"is incomplete")
        return {name: folder / f for name, f in weight_map.items()}
    else:
        files = sorted(folder.glob("*.safetensors"))
        if len(files) != 1:
            pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise ModelError(f"{folder} has only PyTorch pickle weights ({', '.join(pickles[:3])}). Pickle files "
                                 f"can run arbitrary code when opened, so this engine never loads them: use a "
                                 f"repository that publishes model.safetensors, or convert once with transformers "
                                 f"(`AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out_dir)`)")
            what = "no" if not files else f"{len(files)} unindexed"
            raise ModelError(f"{folder} has {what} .safetensors weight files; expected model.safetensors or "
                             f"model.safetensors.index.json with its shards")
    out = {}
    for f in files:
        header, _ = read_safetensors_header(f)
        out.update({name: f for name in header})
    return out


# ---------------------------------------------------------------------------------------- config
def read_config_json(folder: Path) -> dict:
    p = folder / "config.json"
    if not p.is_file():
        raise ModelError(f"{folder} has no config.json; a Hugging Face model folder needs config.json next to "
                         f"its *.safetensors weights")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{p} is not valid JSON ({e}); re-download it from the model's repository") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{p} must hold a JSON object")
    return cfg


def check_llama_architecture(cfg: dict, where: str) -> None:
    """Only plain Llama blocks run here: RMSNorm, RoPE, GQA attention without biases, SwiGLU MLP; and Gemma 3
    text models (the engine's second family: sliding windows, q/k norms, GeGLU, no attention soft-capping)."""
    model_type = cfg.get("model_type")
    archs = [a for a in (cfg.get("architectures") or []) if isinstance(a, str)]
    if model_type == "gemma3_text" and cfg.get("attn_logit_softcapping") is None:
        return
    ok = model_type == "llama" or (not model_type and "LlamaForCausalLM" in archs)
    ok |= model_type == "mistral" and cfg.get("sliding_window") is None
    if not ok:
        shown = ", ".join(archs) or "?"
        raise ModelError(f"{where}: unsupported architecture {shown} (model_type {model_type!r}); this engine runs "
                         f"Llama-architecture models ({', '.join(LLAMA_ARCHITECTURES)}, e.g. TinyLlama, SmolLM2, "
                         f"Llama-2/3)")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ModelError(f"{where}: this checkpoint has attention/MLP biases, which the engine's Llama does not have")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelError(f"{where}: hidden_act {cfg.get('hidden_act')!r} is not supported (Llama uses 'silu')")


def config_from_hf_folder(folder: Path) -> ModelConfig:
    cfg = lift_rope_parameters(read_config_json(folder))
    check_llama_architecture(cfg, str(folder / "config.json"))
    try:
        return parse_hf_config(cfg, name=cfg.get("_name_or_path") or folder.name)
    except SpecError as e:
        raise ModelError(f"{folder / 'config.json'}: {e}") from None


# ---------------------------------------------------------------------------------------- model
def load_hf_folder(path: str | Path, progress: Progress | None = None, name: str | None = None):
    """Load a Llama checkpoint folder (config.json, model.safetensors[.index.json], tokenizer files)."""
    from engine.model.model import Model, hf_tensor_names
    from engine.load.tokenizer import Tokenizer

    progress = progress or _no_progress
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"model folder not found: {folder}")
    t0 = time.perf_counter()
    config = config_from_hf_folder(folder)
    if name:
        config = config.replace(name=name)
    expected = hf_tensor_names(config)
    where = safetensors_files(folder)
    _check_shapes(expected, where)
    tensors: dict[str, np.ndarray] = {}
    by_file: dict[Path, list[str]] = {}
    for n in expected:
        if n in where:
            by_file.setdefault(where[n], []).append(n)
    for i, (f, names) in enumerate(by_file.items()):
        progress(0.9 * i / len(by_file), f"reading {f.name} ({len(names)} tensors)")
        tensors.update(read_safetensors(f, names))
    tokenizer = None
    if (folder / "tokenizer.json").is_file():
        progress(0.92, "reading the tokenizer")
        tokenizer = Tokenizer.from_hf_folder(folder)
        tokenizer.eos_token_ids = tuple(dict.fromkeys([*tokenizer.eos_token_ids, *config.eos_token_ids]))
        if tokenizer.vocab_size > config.vocab_size:
            raise ModelError(f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                             f"{config.vocab_size} embedding rows; tokenizer and weights do not belong together")
    model = Model.from_hf_tensors(config, tensors, tokenizer=tokenizer, source=str(folder))
    progress(1.0, f"loaded {config.name} in {time.perf_counter() - t0:.1f} s")
    return model


def _check_shapes(expected: dict[str, tuple[int, ...]], where: dict[str, Path]) -> None:
    """Compare shapes from the headers before reading gigabytes of data."""
    headers: dict[Path, dict[str, Any]] = {}
    for n, shape in expected.items():
        f = where.get(n)
        if f is None:
            continue  # Model.from_hf_tensors lists every missing tensor
        if f not in headers:
            headers[f] = read_safetensors_header(f)[0]
        got = tuple(headers[f][n]["shape"])
        if got != shape:
            raise ModelError(f"{f.name}: tensor {n} has shape {got}, but config.json implies {shape}; the config "
                             f"and the weights do not match")
