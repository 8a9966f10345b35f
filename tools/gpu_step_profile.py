"""Whole forward steps of Llama-shaped layers with random weights, timed on a GPU through torch: the check the
op-by-op profile is summed against (a step priced from the `gemm` and attention tables should land near these).

    python tools/gpu_step_profile.py --out $OUT/h200-steps.json.gz --budget-s 90
    python tools/gpu_step_profile.py --dry-run --out /tmp/steps.json      # torch on the CPU, tiny shapes

One step = LAYERS_TIMED distinct layers run back to back, scaled by the model's layer count, plus the final norm
and the LM head for one position per sequence (the embedding gather is left out: a few KB). A layer runs what a
serving stack runs: RMSNorm, fused QKV GEMM, RoPE, K/V written into a preallocated cache, attention
(F.scaled_dot_product_attention, grouped K/V heads; causal for a prompt, no mask for decode), output GEMM and
residual, RMSNorm, fused gate/up GEMM, SiLU·up, down GEMM and residual. fp8: weights in e4m3, each GEMM's input
quantised per tensor (torch._scaled_mm), K/V in bf16. Decode steps are replayed from a CUDA graph when capture
works. Shapes whose whole-model K/V would not fit beside the weights are left out (a server could not run them).

Writes an `inference-lab/profile-1` file whose one table, `step`, has columns model, dtype, phase, batch, tokens,
context, layers, layers_timed, layer_ms (the timed layers), lm_head_ms, ms (the whole step).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.instruments.profile_file import host, profile_document, round_ms, utc_now, write_profile  # noqa: E402
from engine.instruments.profile_timer import Budget, median_seconds  # noqa: E402

LAYERS_TIMED = 4
MEMORY_SHARE = 0.85       # of the device memory a server would give weights + K/V


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    layers: int

    def weight_bytes(self, element_bytes: float) -> float:
        per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + \
            self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.inter
        return element_bytes * (self.layers * per_layer + 2 * self.vocab * self.hidden)

    def kv_bytes_per_token(self) -> float:          # bf16 K and V, every layer
        return 2 * 2.0 * self.layers * self.kv_heads * self.head_dim


LLAMA_8B = Shape("llama-3.1-8b", 4096, 32, 8, 128, 14336, 128256, 32)
LLAMA_70B = Shape("llama-3-70b", 8192, 64, 8, 128, 28672, 128256, 80)
TINY = Shape("tiny", 256, 4, 2, 64, 512, 1024, LAYERS_TIMED)
PLANS = {  # model: dtypes (70B in bf16 is 141 GB of weights: it does not fit one H200, so FP8 only)
    LLAMA_8B: ("bf16", "fp8"), LLAMA_70B: ("fp8",)}


def step_grid(shape: Shape, dtype: str, memory_bytes: float, dry_run: bool = False) -> list[tuple]:
    """(phase, batch, tokens, context) to time: decode at batch 1..512 and context 1k..128k, prefill of
    128..32k tokens, where the whole model's K/V fit in memory beside its weights."""
    if dry_run:
        return [("decode", 1, 1, 64), ("decode", 4, 1, 128), ("prefill", 1, 32, 32)]
    room = MEMORY_SHARE * memory_bytes - shape.weight_bytes(1 if dtype == "fp8" else 2)
    fits = lambda b, s: b * s * shape.kv_bytes_per_token() <= room            # noqa: E731
    decode = [("decode", b, 1, s) for s in (1024, 4096, 16384, 65536, 131072) for b in (1, 4, 16, 64, 256, 512)
              if fits(b, s)]
    prefill = [("prefill", 1, t, t) for t in (128, 512, 2048, 8192, 32768) if fits(1, t)]
    return decode + prefill


class Layers:
    """LAYERS_TIMED random-weight layers of `shape` and their K/V caches for `batch` x `context` tokens."""

    def __init__(self, torch, device, shape: Shape, dtype: str, batch: int, context: int):
        self.t, self.F, self.s, self.fp8 = torch, torch.nn.functional, shape, dtype == "fp8"
        bf16, d = torch.bfloat16, shape.head_dim
        self.one = torch.ones((), device=device, dtype=torch.float32)

        def weight(n, k):
            w = torch.randn(n, k, device=device, dtype=bf16) / math.sqrt(k)
            return w.to(torch.float8_e4m3fn) if self.fp8 else w
        q_out = (shape.heads + 2 * shape.kv_heads) * d
        self.layers = [dict(qkv=weight(q_out, shape.hidden), o=weight(shape.hidden, shape.heads * d),
                            gate_up=weight(2 * shape.inter, shape.hidden), down=weight(shape.hidden, shape.inter),
                            k=torch.zeros(batch, shape.kv_heads, context, d, device=device, dtype=bf16),
                            v=torch.zeros(batch, shape.kv_heads, context, d, device=device, dtype=bf16))
                       for _ in range(LAYERS_TIMED)]
        self.lm_head = weight(shape.vocab, shape.hidden)
        self.norm = torch.ones(shape.hidden, device=device, dtype=bf16)

    def linear(self, x, w):
        if not self.fp8:
            return self.F.linear(x, w)
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax().float().clamp(min=1e-6) / 448.0                    # per-tensor, e4m3 max
        q = (rows / scale).to(self.t.float8_e4m3fn)
        y = self.t._scaled_mm(q, w.t(), scale_a=scale, scale_b=self.one, out_dtype=self.t.bfloat16)
        return y.reshape(*x.shape[:-1], w.shape[0])

    def rms(self, x):
        return self.F.rms_norm(x, (x.shape[-1],), self.norm, 1e-5)

    def layer(self, x, lw, start: int):
        """x [B, T, D] -> [B, T, D]; the new K/V land in slots start..start+T-1."""
        s, (B, T, _) = self.s, x.shape
        d, h, kv = s.head_dim, s.heads, s.kv_heads
        qkv = self.linear(self.rms(x), lw["qkv"]).view(B, T, h + 2 * kv, d).transpose(1, 2)   # [B, h+2kv, T, d]
        q, k, v = qkv[:, :h], qkv[:, h:h + kv], qkv[:, h + kv:]
        half = d // 2                                                                # RoPE's arithmetic (angles
        q = self.t.cat((-q[..., half:], q[..., :half]), -1) * 0.5 + q                # fixed: the cost is what
        k = self.t.cat((-k[..., half:], k[..., :half]), -1) * 0.5 + k                # counts, not the angle)
        lw["k"][:, :, start:start + T] = k
        lw["v"][:, :, start:start + T] = v
        K, V = lw["k"][:, :, :start + T], lw["v"][:, :, :start + T]
        o = self.F.scaled_dot_product_attention(q, K, V, is_causal=T > 1 and start == 0, enable_gqa=True)
        x = x + self.linear(o.transpose(1, 2).reshape(B, T, h * d), lw["o"])
        gu = self.linear(self.rms(x), lw["gate_up"])
        g, u = gu.chunk(2, dim=-1)
        return x + self.linear(self.F.silu(g) * u, lw["down"])

    def body(self, x, start: int):
        for lw in self.layers:
            x = self.layer(x, lw, start)
        return x

    def head(self, x):
        return self.linear(self.rms(x[:, -1:]), self.lm_head)                         # one position per sequence


def time_step(torch, device, shape: Shape, dtype: str, phase: str, batch: int, tokens: int, context: int,
              budget_s: float, graphed) -> tuple[float, float]:
    """(ms of LAYERS_TIMED layers, ms of the LM head) for one step shape."""
    m = Layers(torch, device, shape, dtype, batch, context)
    x = torch.randn(batch, tokens, shape.hidden, device=device, dtype=torch.bfloat16)
    start = context - tokens
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        body = partial(m.body, x, start)
        if phase == "decode":
            body = graphed(body)
        layers_s = median_seconds(body, budget_s * 0.8, sync=sync).seconds
        head_s = median_seconds(partial(m.head, x), budget_s * 0.2, sync=sync).seconds
    return layers_s * 1e3, head_s * 1e3


def run(args) -> dict:
    import torch
    from engine.instruments.profile_torch import TorchBackend
    device_kind = "cpu" if args.dry_run else "cuda"
    backend = TorchBackend(device_kind)
    budget = Budget(args.budget_s)
    plans = {TINY: ("bf16", "fp8") if backend.fp8 else ("bf16",)} if args.dry_run else \
        {s: tuple(d for d in ds if backend.supports(d)) for s, ds in PLANS.items()}
    grids = [[(s, d, g) for g in step_grid(s, d, backend.memory_bytes(), args.dry_run)]
             for s, ds in plans.items() for d in ds]
    todo = [grid[j] for j in range(max(map(len, grids))) for grid in grids if j < len(grid)]   # round robin
    rows, errors, skipped, stopped = [], [], 0, None
    for i, (shape, dtype, (phase, b, t, ctx)) in enumerate(todo):
        if stopped or budget.left() <= 0:
            skipped += 1
            continue
        try:
            layer_ms, head_ms = time_step(torch, backend.device, shape, dtype, phase, b, t, ctx,
                                          min(3.0, budget.left() / (len(todo) - i)), backend.graphed)
        except KeyboardInterrupt:                                                    # Ctrl-C, or timeout -s INT:
            stopped, skipped = "interrupted", skipped + 1                            # keep what was measured
            continue
        except (RuntimeError, MemoryError) as e:                                     # out of memory, a refused shape
            errors.append(f"{shape.name} {dtype} {phase} b={b} t={t} ctx={ctx}: {type(e).__name__}: {str(e)[:160]}")
            continue
        finally:
            if device_kind == "cuda":
                torch.cuda.empty_cache()
        step_ms = layer_ms * shape.layers / LAYERS_TIMED + head_ms
        rows.append((shape.name, dtype, phase, b, t, ctx, shape.layers, LAYERS_TIMED, round_ms(layer_ms),
                     round_ms(head_ms), step_ms))
        print(f"[{i + 1}/{len(todo)}] {budget.elapsed():6.1f} s {shape.name} {dtype} {phase} batch {b} "
              f"tokens {t} context {ctx}: step {step_ms:.3f} ms", file=sys.stderr, flush=True)
    device = backend.device_name()
    provenance = {**backend.provenance(), "date": utc_now(), "host": host(), "duration_s": round(budget.elapsed(), 1),
                  "budget_s": args.budget_s, "partial": bool(skipped), "stopped": stopped, "not_measured": {"step": skipped} if skipped
                  else {}, "errors": errors[:10], "layers_timed": LAYERS_TIMED,
                  "method": "LAYERS_TIMED distinct random-weight layers timed back to back, scaled by the layer "
                            "count, plus the final norm and LM head; median of >= 3 samples after a warm-up"}
    name = "dry-run-steps" if args.dry_run else f"{device.lower().replace(' ', '-')}-steps"
    doc = profile_document(name=name, device=device, stack="torch", stack_version=backend.stack_version,
                           detail="python tools/gpu_step_profile.py " + " ".join(sys.argv[1:]),
                           provenance=provenance, tables={"step": rows})
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the profile file to write (.json or .json.gz)")
    p.add_argument("--budget-s", type=float, default=90.0)
    p.add_argument("--dry-run", action="store_true", help="torch on the CPU, a tiny model, three shapes")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    path = write_profile(run(args), args.out)
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
