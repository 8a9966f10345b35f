"""Theory equals experiment: what the engine counts while it runs (engine/model/trace.py) equals the closed-form
calculators (calculators/sizing/roofline.py) exactly, under the one convention both document. Both sides count whole
FLOPs and bytes (integers far below 2**53, so their float totals are exact): any difference is a bug."""
import pytest

from calculators.sizing.engine_floor import engine_decode_bytes, engine_itl_floor_ms
from calculators.explain import explain_engine_itl_floor
from calculators.sizing.kv_cache import kv_cache_bytes
from calculators.sizing.roofline import forward_flops, kv_bytes_step, weight_bytes_read
from engine import Model, Trace
from specs.model_config import ModelConfig
from specs.presets import load_preset

FP32 = 4

SHAPES = [
    ModelConfig(name="gqa", hidden_size=96, num_layers=3, num_heads=6, num_kv_heads=2, head_dim=16,
                intermediate_size=160, vocab_size=400, max_position_embeddings=256),
    ModelConfig(name="mha-tied", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
                intermediate_size=128, vocab_size=300, max_position_embeddings=256, tie_word_embeddings=True),
    ModelConfig(name="mqa-wide-head", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=48,
                intermediate_size=200, vocab_size=512, max_position_embeddings=256),
    load_preset("smollm2").replace(num_layers=3),      # SmolLM2's real widths (9 q / 3 kv heads, tied), 3 layers
]


def check(model: Model, trace: Trace, new_tokens: int, context_tokens: int) -> None:
    c = model.config
    assert trace.flops == forward_flops(c, new_tokens, context_tokens)
    assert trace.weight_bytes == weight_bytes_read(c, new_tokens, FP32)
    kv = kv_bytes_step(c, new_tokens, context_tokens, FP32)
    assert trace.kv_write_bytes == kv["written"]
    assert trace.kv_read_bytes == kv["read"]


@pytest.mark.parametrize("cfg", SHAPES, ids=lambda c: c.name)
def test_prefill_counts_match_calculators(cfg):
    model = Model.random(cfg, seed=0)
    cache, tr = model.new_cache(1, 128), Trace()
    model.prefill(list(range(3, 40)), cache, trace=tr)
    check(model, tr, 37, 37)
    # the cache's own size report (shown after every generated token) = the calculator's KV bytes
    assert cache.bytes_used() == kv_cache_bytes(cfg, 37, 1, FP32) == cfg.num_layers * 37 * 2 * cfg.kv_dim * FP32


@pytest.mark.parametrize("cfg", SHAPES, ids=lambda c: c.name)
def test_decode_counts_match_calculators(cfg):
    model = Model.random(cfg, seed=0)
    cache = model.new_cache(1, 128)
    model.prefill(list(range(3, 60)), cache)                 # 57 cached tokens
    tr = Trace()
    model.decode_step(5, cache, trace=tr)
    check(model, tr, 1, 58)
    # the ITL floor's bytes (Your-machine page, bench) are exactly what the engine counted in that step
    assert engine_decode_bytes(cfg, 58)["total"] == tr.weight_bytes + tr.kv_read_bytes + tr.kv_write_bytes


def test_engine_itl_floor_of_tinyllama_worked_by_hand():
    c = load_preset("tinyllama")
    per_layer = 2048 * 2048 * 2 + 2048 * 256 * 2 + 3 * 2048 * 5632 + 2 * 2048     # W_q,W_o + W_k,W_v + FFN + norms
    weights = (22 * per_layer + 2048 + 32000 * 2048 + 2048) * FP32                 # + final norm, LM head, 1 row
    kv = 22 * 2 * 256 * FP32                                                       # K and V of one token, all layers
    assert engine_decode_bytes(c, 300) == dict(weights=weights, kv_read=300 * kv, kv_written=kv,
                                               total=weights + 301 * kv)
    # 10 GB/s: bytes / 1e10 s = bytes / 1e7 ms (float division, rel 1e-12)
    assert engine_itl_floor_ms(c, 1e10, 300) == pytest.approx((weights + 301 * kv) / 1e7, rel=1e-12)
    assert explain_engine_itl_floor(c, 1e10, 300).value == pytest.approx((weights + 301 * kv) / 1e7, rel=1e-12)


@pytest.mark.parametrize("cfg", SHAPES[:2], ids=lambda c: c.name)
def test_chunked_prefill_counts_match_calculators(cfg):
    model = Model.random(cfg, seed=0)
    cache = model.new_cache(1, 128)
    model.prefill(list(range(3, 35)), cache)                 # 32 cached, then a 16-token chunk
    tr = Trace()
    model.prefill(list(range(3, 19)), cache, trace=tr)
    check(model, tr, 16, 48)


def test_default_model_counts_match_calculators(default_model):
    cache = default_model.new_cache(1, 64)
    tr = Trace()
    default_model.prefill(list(range(10, 30)), cache, trace=tr)
    check(default_model, tr, 20, 20)
    tr = Trace()
    default_model.decode_step(42, cache, trace=tr)
    check(default_model, tr, 1, 21)
