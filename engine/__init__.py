"""The experiment: a NumPy Llama that runs real checkpoints and counts what it does.

    from engine import load_model
    model = load_model()                      # SmolLM2-135M-Instruct, offline
    for tok in model.generate("Write a story", max_new_tokens=20):
        print(tok.text, end="", flush=True)
    logits, acts = run_with_cache(model, ids, names=("blocks.*.attn.hook_pattern",), layers=[0])
    rec = record_generation(model, ids, max_new_tokens=8, attention_layers=[0], kv_layers=[0])

Instruments (hooks, trace) are arguments of each call; a loaded Model is read-only and shared.
"""
from engine.errors import ModelError
from engine.model.hooks import ActivationCache, Hooks, run_with_cache
from engine.model.kv_cache import KVCache
from engine.model.generate import Generated
from engine.model.model import Model
from engine.instruments.record import GenerationRecord, StepRecord, record_generation
from engine.model.trace import Trace
from engine.serve.block_manager import BlockManager
from engine.serve.paged_cache import PagedKVCache
from engine.serve.scheduler import Scheduler, StepReport
from engine.serve.sequence import Request


def load_model(source: str | None = None, progress=None) -> Model:
    """Load a model: None/'smollm2' (default, offline), a .gguf path, a Hugging Face folder, a repo id, or
    'random:<preset>'. See `engine.load.loading`."""
    from engine.load.loading import load_model as _load
    return _load(source, progress=progress)


__all__ = ["ModelError", "Model", "KVCache", "Generated", "Trace", "Hooks", "ActivationCache", "run_with_cache",
           "record_generation", "GenerationRecord", "StepRecord", "load_model",
           "Scheduler", "StepReport", "Request", "PagedKVCache", "BlockManager"]
