"""Properties that hold for every valid input (hypothesis): monotonicity, orderings, no NaN, clean errors."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes
from calculators.sizing.latency import Efficiency, bandwidth_floor_ms, decode_step_ms, generation_latency
from calculators.sizing.memory import memory_budget
from calculators.sizing.params import param_breakdown, weight_bytes
from calculators.sizing.quantization import dequantize, quantize
from calculators.sizing.roofline import forward_flops, kv_bytes_step, roofline, weight_bytes_read
from specs.devices import custom_device
from specs.hf_config import parse_hf_config
from specs.model_config import ModelConfig, SpecError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEVICE = custom_device("test", memory_gb=80, bandwidth_gb_s=2000, peak_tflops=400, price_usd_per_hour=2.0)


@st.composite
def configs(draw, allow_variants=True):
    """Random valid decoder configs: GQA/MQA/MHA, optional sliding-window pattern, MoE, MLA or hybrid layers."""
    heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16, 32]))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    layers = draw(st.integers(1, 24))
    cfg = dict(name="random", hidden_size=draw(st.sampled_from([64, 128, 256, 512, 1024])), num_layers=layers,
               num_heads=heads, num_kv_heads=kv, head_dim=head_dim, intermediate_size=draw(st.integers(16, 4096)),
               vocab_size=draw(st.integers(100, 50000)), max_position_embeddings=8192,
               tie_word_embeddings=draw(st.booleans()), mlp=draw(st.sampled_from(["swiglu", "gelu"])))
    if allow_variants:
        variant = draw(st.sampled_from(["plain", "sliding", "moe", "mla", "hybrid"]))
        if variant == "sliding":
            cfg["sliding_window"] = draw(st.integers(1, 4096))
            cfg["layer_types"] = tuple(draw(st.sampled_from(["full_attention", "sliding_attention"]))
                                       for _ in range(layers))
        elif variant == "moe":
            e = draw(st.integers(2, 16))
            cfg.update(num_experts=e, num_experts_per_tok=draw(st.integers(1, e)), mlp="swiglu",
                       num_shared_experts=draw(st.integers(0, 2)), moe_intermediate_size=draw(st.integers(8, 512)),
                       first_k_dense_layers=draw(st.integers(0, layers)))
        elif variant == "mla":
            cfg.update(attention="mla", kv_lora_rank=draw(st.sampled_from([32, 64, 512])),
                       q_lora_rank=draw(st.sampled_from([None, 64])), qk_rope_head_dim=16,
                       qk_nope_head_dim=head_dim, v_head_dim=head_dim, num_kv_heads=heads)
        elif variant == "hybrid":
            cfg.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                       linear_value_head_dim=32, linear_conv_kernel_dim=4,
                       layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                         for i in range(layers)))
    return ModelConfig(**cfg)


tokens = st.integers(1, 20000)
batches = st.integers(1, 256)


def finite_nonneg(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


@FAST
@given(configs(), tokens, batches)
def test_no_negative_or_nan_output_for_any_valid_input(c, t, b):
    pb = param_breakdown(c)
    assert all(finite_nonneg(v) for k, v in pb.as_dict().items() if k not in ("tied", "attention_parts"))
    assert 0 < pb.active <= pb.total
    t_new = min(t, 512)
    for v in (weight_bytes(c, "int4", 128), kv_bytes_per_token(c), kv_cache_bytes(c, t, b),
              forward_flops(c, t_new, t, b), weight_bytes_read(c, t_new, 2, b),
              *kv_bytes_step(c, t_new, t, 2, b).values()):
        assert finite_nonneg(v)
    r = roofline(c, DEVICE, t_new, t, b)
    assert all(finite_nonneg(v) for v in r["totals"].values() if not isinstance(v, str))
    g = generation_latency(c, DEVICE, t_new, 50, b)
    for side in ("ideal", "realistic"):
        assert all(finite_nonneg(v) for v in g[side].values() if not isinstance(v, str))
    m = memory_budget(c, DEVICE, t, b)
    assert all(finite_nonneg(m[k]) for k in ("weights_bytes", "kv_bytes", "activation_bytes", "total_bytes"))


@FAST
@given(configs(), tokens, tokens, batches)
def test_memory_grows_with_tokens(c, t1, t2, b):
    lo, hi = sorted((t1, t2))
    assert kv_cache_bytes(c, lo, b) <= kv_cache_bytes(c, hi, b)
    assert memory_budget(c, DEVICE, lo, b)["total_bytes"] <= memory_budget(c, DEVICE, hi, b)["total_bytes"]


@FAST
@given(configs(), tokens, batches, batches)
def test_memory_grows_with_batch(c, t, b1, b2):
    lo, hi = sorted((b1, b2))
    assert kv_cache_bytes(c, t, lo) <= kv_cache_bytes(c, t, hi)
    assert memory_budget(c, DEVICE, t, lo)["total_bytes"] <= memory_budget(c, DEVICE, t, hi)["total_bytes"]
    if hi > lo:
        assert kv_cache_bytes(c, t, lo) < kv_cache_bytes(c, t, hi)


@FAST
@given(configs(allow_variants=False), tokens, batches)
def test_memory_grows_with_kv_heads_and_mqa_le_gqa_le_mha(c, t, b):
    divisors = [d for d in range(1, c.num_heads + 1) if c.num_heads % d == 0]
    sizes = [kv_cache_bytes(c.replace(num_kv_heads=d), t, b) for d in divisors]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] or len(divisors) == 1
    mqa, mha = c.replace(num_kv_heads=1), c.replace(num_kv_heads=c.num_heads)
    assert kv_bytes_per_token(mqa) <= kv_bytes_per_token(c) <= kv_bytes_per_token(mha)
    assert decode_step_ms(mqa, DEVICE, t, b)["step_ms"] <= decode_step_ms(mha, DEVICE, t, b)["step_ms"]


@FAST
@given(st.floats(1e3, 1e13), st.floats(1e8, 1e13), st.floats(1e8, 1e13))
def test_floors_fall_with_bandwidth(bytes_read, bw1, bw2):
    lo, hi = sorted((bw1, bw2))
    assert bandwidth_floor_ms(bytes_read, hi) <= bandwidth_floor_ms(bytes_read, lo)


@FAST
@given(configs(), st.integers(1, 8192), st.floats(100, 10000), st.floats(100, 10000))
def test_decode_floor_falls_with_device_bandwidth(c, t, bw1, bw2):
    lo, hi = sorted((bw1, bw2))
    slow = custom_device("slow", 80, lo, 400)
    fast = custom_device("fast", 80, hi, 400)
    assert decode_step_ms(c, fast, t)["memory_ms"] <= decode_step_ms(c, slow, t)["memory_ms"]


@FAST
@given(configs(), st.integers(1, 256), st.integers(0, 4096), batches)
def test_op_table_matches_convention_and_flops_scale_with_batch(c, t_new, start, b):
    s = t_new + start
    # float sums of different sizes: default rel 1e-6
    assert forward_flops(c, t_new, s, b) == pytest.approx(b * forward_flops(c, t_new, s, 1))
    assert forward_flops(c, t_new, s + 1) >= forward_flops(c, t_new, s)


BAD_COMMON = [0, -1, -1.5, float("nan"), float("inf"), float("-inf"), True, False, "12", None, [3]]
BAD_INTS = st.sampled_from(BAD_COMMON + [1.5, 2.25])          # token counts, batch sizes
BAD_POSITIVE = st.sampled_from(BAD_COMMON)                    # bandwidths, sizes, prices
TINYCFG = ModelConfig(name="x", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=100, max_position_embeddings=512)


@FAST
@given(BAD_INTS)
def test_invalid_counts_raise_spec_error(bad):
    c = TINYCFG
    for call in [lambda: kv_cache_bytes(c, bad if bad != 0 else -1), lambda: kv_cache_bytes(c, 10, bad),
                 lambda: forward_flops(c, bad, 10), lambda: forward_flops(c, 1, 10, bad),
                 lambda: memory_budget(c, DEVICE, 10, bad), lambda: weight_bytes_read(c, bad, 2),
                 lambda: generation_latency(c, DEVICE, bad, 10)]:
        with pytest.raises(SpecError):
            call()


@FAST
@given(BAD_POSITIVE)
def test_invalid_amounts_raise_spec_error(bad):
    for call in [lambda: bandwidth_floor_ms(1e9, bad), lambda: weight_bytes(bad),
                 lambda: custom_device("d", bad, 100, 10), lambda: custom_device("d", 8, bad, 10),
                 lambda: custom_device("d", 8, 100, bad), lambda: Efficiency(decode_mbu=bad)]:
        with pytest.raises(SpecError):
            call()


HF_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10 ** 6), st.floats(allow_nan=True),
                      st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3))
HF_KEYS = st.sampled_from(["hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                           "intermediate_size", "vocab_size", "head_dim", "sliding_window", "layer_types",
                           "num_local_experts", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim",
                           "model_type", "rope_theta", "text_config", "linear_num_value_heads"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(HF_KEYS, HF_VALUES, max_size=10))
def test_parser_accepts_or_raises_spec_error_never_anything_else(cfg):
    base = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
            "intermediate_size": 512}
    try:
        c = parse_hf_config({**base, **cfg})
    except SpecError:
        return
    assert param_breakdown(c).total > 0 and kv_bytes_per_token(c) >= 0


@FAST
@given(st.integers(1, 8), st.sampled_from([16, 32, 64]), st.sampled_from([4, 8]),
       st.sampled_from(["per_tensor", "per_channel", "per_group"]), st.floats(1e-4, 1e3))
def test_quantization_error_is_at_most_half_a_step(rows, cols, bits, granularity, amp):
    w = np.random.default_rng(rows * cols).standard_normal((rows, cols)) * amp
    qt = quantize(w, bits, granularity, group_size=16)
    w_hat = dequantize(qt)
    if granularity == "per_group":
        err = np.abs(w_hat - w).reshape(rows, cols // 16, 16)
        assert np.all(err <= qt.scale / 2 * (1 + 1e-5) + 1e-12)
    else:
        assert np.all(np.abs(w_hat - w) <= qt.scale / 2 * (1 + 1e-5) + 1e-12)
