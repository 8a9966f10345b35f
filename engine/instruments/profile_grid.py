"""The shapes a device profile measures: pure functions of the models whose steps it will price.

A step is priced op by op (`specs/profiles/`), so the grid holds the ops a step runs: every weight product as the
engine multiplies it (`x · Wᵀ`, W kept [out, in]: M token rows, N = out, K = in; Q/K/V fused, gate/up fused), and
attention over the model's own heads. M runs in powers of two, so a lookup interpolates in log space between two
measured rows. Rows are (table, key) pairs; the key holds every column of the table but `ms`.

CPU (NumPy): the default model's matrices (SmolLM2-135M: hidden 576, intermediate 1536, 9 heads, 3 KV heads,
head dim 64, vocabulary 49152) plus a few squares, M = 1..2048 (`--quick`) or 1..4096 with points between.
GPU (torch): Llama-3.1-8B's and Llama-3-70B's matrices (N, K from 4096 to 57344) plus squares, M = 1..16384;
attention at batch 1..512 and contexts 1k..128k where the K/V fit in memory.
"""
from __future__ import annotations

from typing import Iterator

from specs.model_config import ModelConfig
from specs.presets import load_preset

CPU_MODELS = ("smollm2-135m",)
GPU_MODELS = ("llama-3.1-8b", "llama-3-70b")
CPU_SQUARES = (512, 1024, 2048)
GPU_SQUARES = (4096, 8192, 16384)
LM_HEAD_MAX_ROWS = 256     # the LM head runs for the one position per sequence whose logits are needed
CPU_DECODE_MAX_KV_BYTES = 0.1e9      # CPU: at most this many K/V bytes in one decode-attention shape


def powers_of_two(first: int, last: int, between: bool = False) -> list[int]:
    """first, 2·first, ... up to last (both powers of two); `between` adds 3·2^(k-1) between 2^k and 2^(k+1)."""
    out, m = [], first
    while m <= last:
        out.append(m)
        if between and m >= 2 and m * 3 // 2 <= last:
            out.append(m * 3 // 2)
        m *= 2
    return out


def engine_matrices(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """The weight products of one layer and the LM head as the engine runs them: name -> (N = out, K = in)."""
    D, F = c.hidden_size, c.intermediate_size
    return {"qkv_proj": (c.q_dim + 2 * c.kv_dim, D), "o_proj": (D, c.q_dim),
            "gate_up_proj": (2 * F, D), "down_proj": (D, F), "lm_head": (c.vocab_size, D)}


def gemm_nk(models: tuple[str, ...], squares: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Distinct (N, K, max M) over the models' matrices and the squares; the LM head stops at LM_HEAD_MAX_ROWS."""
    seen: dict[tuple[int, int], int] = {}
    for name in models:
        for op, nk in engine_matrices(load_preset(name)).items():
            cap = LM_HEAD_MAX_ROWS if op == "lm_head" else 1 << 62
            seen[nk] = max(seen.get(nk, 0), cap)
    for s in squares:
        seen.setdefault((s, s), 1 << 62)
    return [(n, k, cap) for (n, k), cap in seen.items()]


def gemm_rows(dtypes: tuple[str, ...], models: tuple[str, ...], squares: tuple[int, ...],
              m_values: list[int]) -> Iterator[tuple]:
    """Keys of the `gemm` table: (dtype, m, n, k)."""
    for dtype in dtypes:
        for n, k, cap in gemm_nk(models, squares):
            for m in m_values:
                if m <= cap:
                    yield dtype, m, n, k


def heads_of(models: tuple[str, ...], tp: tuple[int, ...] = (1,)) -> list[tuple[int, int, int]]:
    """Distinct (heads, kv_heads, head_dim) of the models, per GPU under each tensor-parallel degree."""
    out = []
    for name in models:
        c = load_preset(name)
        for t in tp:
            if c.num_heads % t == 0:
                h = (c.num_heads // t, max(1, c.num_kv_heads // t), c.head_dim)
                if h not in out:
                    out.append(h)
    return out


def kv_bytes(batch: int, context: int, kv_heads: int, head_dim: int, bytes_per_elem: float) -> float:
    """K and V of `batch` sequences of `context` tokens for one layer."""
    return 2.0 * batch * context * kv_heads * head_dim * bytes_per_elem


def generation_rows(dtype: str, heads: list[tuple[int, int, int]], batches: list[int], contexts: list[int],
                    max_kv_bytes: float, bytes_per_elem: float) -> Iterator[tuple]:
    """Keys of `generation_attention` (one new token per sequence over `context` cached ones):
    (dtype, kv_dtype, batch, context, heads, kv_heads, head_dim, window); shapes whose K/V exceed max_kv_bytes
    are left out."""
    for h, kv, d in heads:
        for b in batches:
            for s in contexts:
                if kv_bytes(b, s, kv, d, bytes_per_elem) <= max_kv_bytes:
                    yield dtype, dtype, b, s, h, kv, d, 0


def context_rows(dtype: str, heads: list[tuple[int, int, int]], batches: list[int], tokens: list[int],
                 prefixes: list[int], max_tokens: int) -> Iterator[tuple]:
    """Keys of `context_attention` (a prompt of `tokens` new tokens after `prefix` cached ones, causal):
    (dtype, kv_dtype, batch, tokens, prefix, heads, kv_heads, head_dim, window); batch·(prefix + tokens) is
    capped at max_tokens."""
    for h, kv, d in heads:
        for b in batches:
            for t in tokens:
                for p in prefixes:
                    if b * (p + t) <= max_tokens:
                        yield dtype, dtype, b, t, p, h, kv, d, 0


def cpu_grid(quick: bool) -> dict[str, list[tuple]]:
    """Every key the NumPy profile measures, by table."""
    heads = heads_of(CPU_MODELS)
    m_values = powers_of_two(1, 2048 if quick else 4096, between=not quick)
    contexts = powers_of_two(128, 8192)
    return {
        "gemm": list(gemm_rows(("fp32",), CPU_MODELS, CPU_SQUARES[1:] if quick else CPU_SQUARES, m_values)),
        "generation_attention": list(generation_rows("fp32", heads, powers_of_two(1, 16 if quick else 64),
                                                     contexts, CPU_DECODE_MAX_KV_BYTES, 4)),
        "context_attention": list(context_rows("fp32", heads, [1] if quick else [1, 4], powers_of_two(16, 2048),
                                               [0, 1024] if quick else [0, 512, 2048], 4096)),
    }


def gpu_grid(quick: bool, memory_bytes: float, dtypes: tuple[str, ...] = ("bf16", "fp8")) -> dict[str, list[tuple]]:
    """Every key the torch profile measures, by table. `memory_bytes`: what one attention shape's K/V may take
    (a share of the device's free memory); `dtypes`: GEMM precisions this device runs (fp8 where _scaled_mm is)."""
    heads = heads_of(GPU_MODELS, tp=(1, 8))
    m_values = powers_of_two(1, 16384, between=not quick)
    contexts = powers_of_two(1024, 131072)
    return {
        "gemm": list(gemm_rows(dtypes, GPU_MODELS, GPU_SQUARES, m_values)),
        "generation_attention": list(generation_rows("bf16", heads, powers_of_two(1, 512), contexts,
                                                     memory_bytes, 2)),
        "context_attention": list(context_rows("bf16", heads, powers_of_two(1, 8), powers_of_two(128, 32768),
                                               [0] if quick else [0, 4096], 65536)),
    }


def tiny_grid() -> dict[str, list[tuple]]:
    """A handful of small shapes for a dry run of any backend (seconds, any device)."""
    return {
        "gemm": [(d, m, 256, 128) for d in ("fp32", "bf16", "fp16", "fp8") for m in (1, 16)],
        "generation_attention": [(d, d, b, 256, 4, 2, 32, 0) for d in ("fp32", "bf16") for b in (1, 4)],
        "context_attention": [(d, d, 1, 64, p, 4, 2, 32, 0) for d in ("fp32", "bf16") for p in (0, 64)],
    }
