"""A CUDA GPU (or, for a dry run, the CPU) through PyTorch: each op timed as a serving stack runs it.

GEMM is `F.linear(x, W)` in bf16/fp16 and, in fp8 (e4m3), `torch._scaled_mm` with per-tensor scales where the
device runs it. Attention is `F.scaled_dot_product_attention` with grouped K/V heads (`enable_gqa`): causal for a
prompt without prefix, the lower-right causal mask after one (chunked prefill), no mask for decode. Operands come
in enough copies (COLD_BYTES, above the L2 of current GPUs) that each call reads them from HBM. On CUDA one call
per copy is captured, back to back, in one CUDA graph (as vLLM and SGLang replay decode steps), so a small op is
timed without the CPU's launch overhead; a row is the replay's time divided by its calls (`ops_per_call`). Where
capture fails the calls run eagerly; the counts of each are in the profile's provenance (`cuda_graphs`).

torch is imported when a backend is made, so the project imports this module without it.
"""
from __future__ import annotations

import subprocess
from functools import partial
from typing import Callable

from engine.instruments.profile_file import blas_libraries, cpu_device_name, cpu_model
from engine.instruments.profile_timer import copies_for, cycling
from specs.devices import load_device
from specs.model_config import SpecError

COLD_BYTES = 256e6      # 4x an H100/H200's 50-60 MB L2
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def datasheet_name(gpu_name: str) -> str | None:
    """The devices.json name of a GPU as CUDA names it ('NVIDIA H200' -> 'H200', 'NVIDIA H100 80GB HBM3' ->
    'H100 SXM' by its first word), None when unknown."""
    bare = gpu_name.replace("NVIDIA", "").strip()
    for candidate in (gpu_name, bare, bare.split()[0] if bare else ""):
        try:
            return load_device(candidate).name
        except SpecError:
            continue
    return None


class TorchBackend:
    stack = "torch"

    def __init__(self, device: str = "cuda", seed: int = 0) -> None:
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA GPU")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stack_version = torch.__version__
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.graphs = {"captured": 0, "eager": 0}     # shapes timed from a graph replay / eagerly (CUDA)
        self.fp8 = self._probe_fp8()

    # ------------------------------------------------------------------ where
    def gpu_name(self) -> str | None:
        return self.torch.cuda.get_device_name(self.device) if self.cuda else None

    def device_name(self) -> str:
        if not self.cuda:
            return cpu_device_name()
        name = self.gpu_name()
        return datasheet_name(name) or f"GPU: {name}"

    def driver(self) -> str | None:
        if not self.cuda:
            return None
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            return out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            return None

    def provenance(self) -> dict:
        import numpy as np
        t = self.torch
        cudnn = t.backends.cudnn.version() if t.backends.cudnn.is_available() else None
        return {"device_name": self.device_name(), "gpu_name": self.gpu_name(), "cpu_model": cpu_model(),
                "driver": self.driver(),
                "libraries": {"numpy": np.__version__, "blas": blas_libraries(), "torch": t.__version__,
                              "cuda": t.version.cuda, "cudnn": cudnn},
                "threads": t.get_num_threads(), "cuda_graphs": dict(self.graphs),
                "fp8_gemm": "torch._scaled_mm, e4m3, per-tensor scales, bf16 out" if self.fp8 else None}

    def supports(self, dtype: str) -> bool:
        return dtype in ("bf16", "fp16", "fp32") or (dtype == "fp8" and self.fp8)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Give a measured shape's memory back (the next shape may need tens of GB in one piece)."""
        if self.cuda:
            self.torch.cuda.empty_cache()

    def memory_bytes(self) -> float:
        if self.cuda:
            return float(self.torch.cuda.mem_get_info(self.device)[0])
        import os
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    # ------------------------------------------------------------------ operands
    def _rand(self, *shape: int, dtype: str = "bf16"):
        t = self.torch
        x = t.randn(shape, generator=self.generator, device=self.device, dtype=t.float32 if dtype == "fp8" else
                    getattr(t, DTYPES[dtype]))
        return x.to(t.float8_e4m3fn) if dtype == "fp8" else x

    def _probe_fp8(self) -> bool:
        t = self.torch
        if not hasattr(t, "_scaled_mm") or not hasattr(t, "float8_e4m3fn"):
            return False
        if self.cuda and t.cuda.get_device_capability(self.device) < (8, 9):
            return False
        try:
            self._scaled_mm(self._rand(16, 32, dtype="fp8"), self._rand(16, 32, dtype="fp8"))
            return True
        except (RuntimeError, NotImplementedError, TypeError):
            return False

    def _scaled_mm(self, x, w):
        """x [m, k] fp8 · w [n, k]ᵀ fp8 -> [m, n] bf16 (w.t() is the column-major operand _scaled_mm wants)."""
        one = self.torch.ones((), device=self.device, dtype=self.torch.float32)
        return self.torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=self.torch.bfloat16)

    # ------------------------------------------------------------------ ops
    def peaks(self, budget_s: float = 2.0) -> tuple[float, dict[str, float]]:
        """Device-to-device copy bandwidth (bytes read + written) and the bf16 FLOP/s of a large square GEMM."""
        from engine.instruments.profile_timer import median_seconds
        n_bytes = int(2e9 if self.cuda else 64e6)
        src = self.torch.empty(n_bytes // 2, dtype=self.torch.bfloat16, device=self.device)
        dst = self.torch.empty_like(src)
        copy = median_seconds(partial(dst.copy_, src), budget_s / 2, sync=self.sync).seconds
        del src, dst
        n = 8192 if self.cuda else 512
        a, b = self._rand(n, n), self._rand(n, n)
        mm = median_seconds(partial(self.torch.matmul, a, b), budget_s / 2, sync=self.sync).seconds
        del a, b
        self.release()                          # the grid reads the free memory next
        return 2.0 * n_bytes / copy, {"bf16": 2.0 * n ** 3 / mm}

    def gemm(self, dtype: str, m: int, n: int, k: int) -> Callable[[], object]:
        x = self._rand(m, k, dtype=dtype)
        weights = [self._rand(n, k, dtype=dtype) for _ in range(copies_for(ELEMENT_BYTES[dtype] * n * k, COLD_BYTES))]
        op = self._scaled_mm if dtype == "fp8" else self.F.linear
        return self.grouped([partial(op, x, w) for w in weights])

    def _sdpa(self, q, k, v, tokens: int, prefix: int):
        F = self.F
        if tokens == 1:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        if prefix == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        from torch.nn.attention.bias import causal_lower_right
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(tokens, prefix + tokens),
                                              enable_gqa=True)

    def _attention(self, dtype, batch, tokens, prefix, heads, kv_heads, head_dim) -> list[Callable[[], object]]:
        S = prefix + tokens
        q = self._rand(batch, heads, tokens, head_dim, dtype=dtype)                     # [B, H, T, d]
        kv_bytes = 2.0 * ELEMENT_BYTES[dtype] * batch * kv_heads * S * head_dim
        caches = [(self._rand(batch, kv_heads, S, head_dim, dtype=dtype),
                   self._rand(batch, kv_heads, S, head_dim, dtype=dtype))
                  for _ in range(copies_for(kv_bytes, COLD_BYTES, most=32))]
        return [partial(self._sdpa, q, K, V, tokens, prefix) for K, V in caches]

    def context_attention(self, dtype, batch, tokens, prefix, heads, kv_heads, head_dim) -> Callable[[], object]:
        return self.grouped(self._attention(dtype, batch, tokens, prefix, heads, kv_heads, head_dim))

    def generation_attention(self, dtype, batch, context, heads, kv_heads, head_dim) -> Callable[[], object]:
        return self.grouped(self._attention(dtype, batch, 1, context - 1, heads, kv_heads, head_dim))

    def grouped(self, calls: list[Callable[[], object]]) -> Callable[[], object]:
        """On CUDA: every call once, back to back, replayed from one CUDA graph; `ops_per_call` = len(calls).
        Elsewhere: the calls in turn, one per call (a CPU has no launch overhead to hide)."""
        if not self.cuda:
            return cycling(calls)
        replay = self.graphed(lambda: [c() for c in calls])

        def run() -> None:
            replay()
        run.ops_per_call = len(calls)
        return run

    def graphed(self, fn: Callable[[], object]) -> Callable[[], object]:
        """fn captured in a CUDA graph (replay launches all its kernels at once), or fn itself where capture
        fails or there is no CUDA; counted in provenance `decode_timing`."""
        t = self.torch
        if not self.cuda:
            return fn
        try:
            stream = t.cuda.Stream(self.device)
            stream.wait_stream(t.cuda.current_stream(self.device))
            with t.cuda.stream(stream):
                for _ in range(3):
                    fn()
            t.cuda.current_stream(self.device).wait_stream(stream)
            graph = t.cuda.CUDAGraph()
            with t.cuda.graph(graph):
                fn()
            self.graphs["captured"] += 1
            return graph.replay
        except RuntimeError:
            self.graphs["eager"] += 1
            return fn

    def launch(self) -> dict[str, Callable[[], object]]:
        """A tiny elementwise op (16 numbers): what one eager launch (on CPU, one dispatch) costs, and on CUDA what
        one kernel costs inside a graph replay (64 of them back to back)."""
        a, b = self._rand(16), self._rand(16)
        out = self.torch.empty_like(a)
        add = partial(self.torch.add, a, b, out=out)
        return {"torch_tiny_add": add, **({"cuda_graph_tiny_add": self.grouped([add] * 64)} if self.cuda else {})}
