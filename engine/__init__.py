"""The experiment: a NumPy Llama that runs real checkpoints and counts what it does.

    from engine import load_model
    model = load_model()                      # SmolLM2-135M-Instruct, offline
    for tok in model.generate("Write a story", max_new_tokens=20):
        print(tok.text, end="", flush=True)
"""
from engine.errors import ModelError
from engine.hooks import Hooks, recording
from engine.kv_cache import KVCache
from engine.model import Generated, Model
from engine.trace import Trace
from engine.block_manager import BlockManager
from engine.paged_cache import PagedKVCache
from engine.scheduler import Scheduler, StepReport
from engine.sequence import Request


def load_model(source: str | None = None, progress=None) -> Model:
    """Load a model: None/'smollm2' (default, offline), a .gguf path, a Hugging Face folder, a repo id, or
    'random:<preset>'. See `engine.loading`."""
    from engine.loading import load_model as _load
    return _load(source, progress=progress)


__all__ = ["ModelError", "Model", "KVCache", "Generated", "Trace", "Hooks", "recording", "load_model",
           "Scheduler", "StepReport", "Request", "PagedKVCache", "BlockManager"]
