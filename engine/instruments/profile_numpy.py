"""This CPU through NumPy: each op timed as the engine computes it.

GEMM is `ops.matmul_t(x, W)`, the engine's weight product (a matvec for one row, blocked matvecs for a few, the
BLAS GEMM beyond). Attention is `forward.attention` itself, on a `Pass` built for the shape: QKᵀ, the causal mask
(prefill), the in-place softmax and P·V, QUERY_BLOCK queries at a time. Operands are cycled through enough copies
(COLD_BYTES) that each call reads them from memory, as a step's layers do, not from a warm cache.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Callable

import numpy as np

from engine.instruments.profile_file import blas_libraries, cpu_device_name, cpu_model
from engine.instruments.profile_timer import copies_for, cycling
from engine.model import forward, ops
from specs.devices import measure_this_machine
from specs.presets import load_preset

COLD_BYTES = 64e6       # larger than the last-level cache of the CPUs this runs on (a 2-core VM: a few MB)
PEAK_PROBE_S = 4.0      # specs.devices.measure_this_machine's budget: a 256 MB matvec and a 1024² GEMM


class NumpyBackend:
    stack = "numpy"

    def __init__(self, seed: int = 0) -> None:
        self.stack_version = np.__version__
        self.rng = np.random.default_rng(seed)
        self.config = load_preset("smollm2-135m")           # attention reads only its query_pre_attn_scalar (None)

    def device_name(self) -> str:
        return cpu_device_name()

    def provenance(self) -> dict:
        blas = blas_libraries()
        return {"device_name": self.device_name(), "cpu_model": cpu_model(), "driver": None,
                "libraries": {"numpy": np.__version__, "blas": blas, "torch": None, "cuda": None, "cudnn": None},
                "threads": blas[0]["num_threads"] if blas else 1}

    def supports(self, dtype: str) -> bool:
        return dtype == "fp32"

    def sync(self) -> None:
        pass

    def release(self) -> None:
        pass

    def memory_bytes(self) -> float:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def peaks(self, budget_s: float = PEAK_PROBE_S) -> tuple[float, dict[str, float]]:
        """Bandwidth (bytes/s) and FP32 FLOP/s as the Your-machine page measures them."""
        d = measure_this_machine(seconds_budget=budget_s)
        return d.memory_bandwidth_bytes_per_s, dict(d.peak_flops)

    def _rand(self, *shape: int) -> np.ndarray:
        return self.rng.random(shape, dtype=np.float32) - np.float32(0.5)

    def gemm(self, dtype: str, m: int, n: int, k: int) -> Callable[[], object]:
        """x [m, k] · Wᵀ, W [n, k]: the engine's `ops.matmul_t`."""
        x = self._rand(m, k)
        weights = [self._rand(n, k) for _ in range(copies_for(4.0 * n * k, COLD_BYTES))]
        return cycling([partial(ops.matmul_t, x, w) for w in weights])

    def attention(self, batch: int, tokens: int, prefix: int, heads: int, kv_heads: int,
                  head_dim: int) -> Callable[[], object]:
        """`forward.attention` for `tokens` new queries per sequence after `prefix` cached keys (causal)."""
        B, T, S, G = batch, tokens, prefix + tokens, heads // kv_heads
        q = self._rand(B, kv_heads, G, T, head_dim)                                     # [B, h_kv, G, T, d]
        kv_bytes = 2 * 4.0 * B * kv_heads * S * head_dim
        caches = [(self._rand(B, kv_heads, S, head_dim), self._rand(B, kv_heads, S, head_dim))
                  for _ in range(copies_for(kv_bytes, COLD_BYTES))]
        p = attention_pass(self.config, B, T, prefix)
        return cycling([partial(forward.attention, q, K, V, 0, p) for K, V in caches])

    def generation_attention(self, dtype, batch, context, heads, kv_heads, head_dim) -> Callable[[], object]:
        """One new token per sequence reading `context` keys (its own included)."""
        return self.attention(batch, 1, context - 1, heads, kv_heads, head_dim)

    def context_attention(self, dtype, batch, tokens, prefix, heads, kv_heads, head_dim) -> Callable[[], object]:
        return self.attention(batch, tokens, prefix, heads, kv_heads, head_dim)

    def launch(self) -> dict[str, Callable[[], object]]:
        """The smallest ops a step runs many of: a ufunc on 16 numbers, a 64x64 matvec (dispatch, not work)."""
        a, b, out = np.ones(16, np.float32), np.ones(16, np.float32), np.empty(16, np.float32)
        x, w = np.ones((1, 64), np.float32), np.ones((64, 64), np.float32)
        return {"numpy_ufunc": partial(np.add, a, b, out=out), "numpy_matvec_64": partial(ops.matmul_t, x, w)}


def attention_pass(config, batch: int, tokens: int, prefix: int) -> forward.Pass:
    """The `Pass` a forward call over `tokens` new tokens after `prefix` cached ones would build, with what
    `forward.attention` reads: positions, which keys are real, whether a mask is needed (no cache, no hooks)."""
    S = prefix + tokens
    start = np.full(batch, prefix, np.int64)
    return forward.Pass(config=config, cache=None, n_valid=np.full(batch, tokens, np.int64), start=start,
                        positions=start[:, None] + np.arange(tokens)[None, :],
                        key_valid=np.ones((batch, S), bool), rotation=None, trace=None, hooks=None,
                        masked=tokens > 1)
