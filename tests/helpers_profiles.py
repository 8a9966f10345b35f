"""A device profile made by hand, for the tests of what draws or reads profiles without aiconfigurator-core."""
from __future__ import annotations

from calculators.sizing.measured_ops import decode_attention_roofline_ms, gemm_roofline_ms
from specs.devices import load_device
from specs.profile_format import Profile, tables_from_columns

H200 = load_device("H200")
LLAMA_8B_GEMMS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (65536, 4096))   # (n, k), TP 1


def _columns(names: tuple, rows: list) -> dict:
    return {n: [r[i] for r in rows] for i, n in enumerate(names)}


def hand_made_h200_profile(name: str = "h200-test-curves") -> Profile:
    """An H200 profile of Llama-3.1-8B's shapes: every weight GEMM at 60% of its roofline below m = 256 and 80%
    from it (m measured 1 to 4,096), decode attention at 50% (batch 1) and 90% (batch 32 and 256) of its roofline
    at 1k and 32k positions, and a 2- and 8-GPU all-reduce at 70% of NVLink 4's ring bound (1 KiB and 1 MiB)."""
    gemm = [("bf16", m, n, k, float(gemm_roofline_ms(H200, m, n, k, "bf16")) / (0.6 if m < 256 else 0.8))
            for n, k in LLAMA_8B_GEMMS for m in (1, 16, 256, 4096)]
    dec = [("bf16", "bf16", b, ctx, 32, 8, 128, 0,
            float(decode_attention_roofline_ms(H200, b, ctx, 32, 8, 128, "bf16")) / (0.5 if b == 1 else 0.9))
           for b in (1, 32, 256) for ctx in (1024, 32768)]
    ar = [("bf16", s, g, "custom_graph", s * 2 * (g - 1) / g / 450e9 * 1e3 / 0.7) for g in (2, 8)
          for s in (1024, 1 << 20)]
    tables = tables_from_columns({
        "gemm": _columns(("dtype", "m", "n", "k", "ms"), gemm),
        "generation_attention": _columns(("dtype", "kv_dtype", "batch", "context", "heads", "kv_heads", "head_dim",
                                          "window", "ms"), dec),
        "allreduce": _columns(("dtype", "bytes", "gpus", "kind", "ms"), ar)}, "test")
    return Profile(name=name, device="H200", stack="vllm", stack_version="0.0-test",
                   source={"kind": "profiler", "version": "test", "detail": "hand-made"}, provenance={}, tables=tables)


def qwen3_moe_fp8_slow_profile(name: str = "h200-router-test", block: bool = False):
    """A hand-made H200 profile for Qwen3-30B-A3B's shapes (TP 1): bf16 GEMMs at 50% of their roofline, fp8 ones
    at 10%, the fused MoE measured in fp8 only (30%), decode attention at 90% and prefill attention at 50%.
    `block`: block-scaled FP8 measured too, its GEMMs at 20% and its fused MoE at 15%."""
    from calculators.sizing.measured_ops import moe_roofline_ms, prefill_attention_roofline_ms
    from specs.presets import load_preset
    qwen = load_preset("qwen3-30b-a3b")
    shapes = [(n, k) for n, k in ((5120, 2048), (2048, 4096), (128, 2048), (151936, 2048))]
    gemm = [(dt, m, n, k, float(gemm_roofline_ms(H200, m, n, k, dt)) / eff)
            for dt, eff in (("bf16", 0.5), ("fp8", 0.1), ("fp8_block", 0.2))[:3 if block else 2]
            for n, k in shapes for m in (1, 64, 4096)]
    moe = [(dt, t, 2048, 768, 128, 8, 1, 1, "power_law_1.01",
            float(moe_roofline_ms(H200, t, 2048, 768, 128, 8, 1, 1, dt)) / eff)
           for dt, eff in (("fp8", 0.3), ("fp8_block", 0.15))[:2 if block else 1] for t in (1, 64, 4096)]
    dec = [("bf16", "fp8", b, ctx, 32, 4, 128, 0,
            float(decode_attention_roofline_ms(H200, b, ctx, 32, 4, 128, "fp8")) / 0.9)
           for b in (1, 64, 4096) for ctx in (1024, 32768)]
    pre = [("bf16", "fp8", b, t, 0, 32, 4, 128, 0,
            float(prefill_attention_roofline_ms(H200, b, t, 0, 32, 4, 128, "fp8")) / 0.5)
           for b in (1, 8) for t in (128, 1024, 8192)]
    tables = tables_from_columns({
        "gemm": {c: [r[i] for r in gemm] for i, c in enumerate(("dtype", "m", "n", "k", "ms"))},
        "generation_attention": {c: [r[i] for r in dec] for i, c in enumerate(
            ("dtype", "kv_dtype", "batch", "context", "heads", "kv_heads", "head_dim", "window", "ms"))},
        "context_attention": {c: [r[i] for r in pre] for i, c in enumerate(
            ("dtype", "kv_dtype", "batch", "tokens", "prefix", "heads", "kv_heads", "head_dim", "window", "ms"))},
        "moe": {c: [r[i] for r in moe] for i, c in enumerate(("dtype", "tokens", "hidden", "inter", "experts",
                                                               "topk", "tp", "ep", "distribution", "ms"))}}, "test")
    p = Profile(name=name, device="H200", stack="trtllm", stack_version="0-test",
                source={"kind": "profiler", "version": "test", "detail": "hand-made"}, provenance={}, tables=tables)
    return p, qwen
