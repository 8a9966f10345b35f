"""Model presets: one JSON file per model in `specs/models/`, each a Hugging Face config with its source."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from specs.model_config import ModelConfig, SpecError
from specs.hf_config import parse_hf_config

MODELS_DIR = Path(__file__).parent / "models"


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


@lru_cache(maxsize=None)
def _index() -> dict[str, Path]:
    idx: dict[str, Path] = {}
    for p in sorted(MODELS_DIR.glob("*.json")):
        doc = json.loads(p.read_text(encoding="utf-8"))
        for alias in [p.stem, doc["name"], *doc.get("aliases", [])]:
            idx[_key(alias)] = p
    return idx


def list_presets() -> list[str]:
    """Display names of every preset, in file order."""
    return [json.loads(p.read_text(encoding="utf-8"))["name"] for p in sorted(MODELS_DIR.glob("*.json"))]


def preset_document(name: str) -> dict:
    p = _index().get(_key(name))
    if p is None:
        raise SpecError(f"unknown model preset {name!r}; choose one of: {', '.join(list_presets())}")
    return json.loads(p.read_text(encoding="utf-8"))


def load_preset(name: str) -> ModelConfig:
    """The `ModelConfig` of a preset, by display name, file stem or alias (case and punctuation ignored)."""
    doc = preset_document(name)
    return parse_hf_config(doc["config"], name=doc["name"]).replace(source=doc.get("source", ""))


def is_preset(name: str) -> bool:
    return _key(name) in _index()
