"""One source of truth for architecture numbers (models) and hardware numbers (devices).

The engine (experiment) and the calculators (theory) both read `ModelConfig`; presets live as JSON data
in `specs/models/` and device datasheets in `specs/devices.json`, each number with its source.
"""
from specs.model_config import ModelConfig, SpecError

__all__ = ["ModelConfig", "SpecError"]
