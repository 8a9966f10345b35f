"""Small model shapes and prompts shared by the engine, serving and server tests."""
import numpy as np

from specs.model_config import ModelConfig


def tiny(**kw) -> ModelConfig:
    """A 2-layer GQA Llama small enough to run in milliseconds; keyword arguments override any field."""
    base = dict(name="tiny", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                intermediate_size=96, vocab_size=300, max_position_embeddings=48, rms_norm_eps=1e-5,
                rope_theta=10000.0, eos_token_id=2)
    base.update(kw)
    return ModelConfig(**base)


def prompt(n, seed=0, vocab=300):
    """n random token ids in [3, vocab), seeded (0-2 are special ids)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, n)]
