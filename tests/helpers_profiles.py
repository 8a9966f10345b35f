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
