"""What the per-call instruments cost, measured in one run (ratios and bytes, not absolute times).

    python bench/bench_instruments.py                  # both parts
    python bench/bench_instruments.py --overhead       # 1 only (about a minute)
    python bench/bench_instruments.py --memory         # 2 only (several minutes: 4,096-token prefills)

1. Recording overhead with NO hooks: `Model.forward(..., trace=None, hooks=None)` against a bare forward written
   here with the same ops and weights but no instrument branches, no `Pass`, no blocks (what the engine would cost
   if instruments did not exist). SmolLM2-135M shape, random weights; decode at a 64-token context and a 64-token
   prefill, timed alternately (median). Target: overhead < 2%.
2. Peak memory beyond weights and KV cache (tracemalloc: NumPy reports its buffers to it; weights and the cache
   are allocated before tracing starts) for a 4,096-token prompt on the default model (SmolLM2-135M), without
   hooks and with the attention-pattern hook. Attention runs in blocks of `engine.model.forward.QUERY_BLOCK` queries,
   so the transient part stays one block of scores whatever the hook asks; what the hook keeps is reported apart.
   (Prefill returns the last position's logits; run_with_cache's [T, V] logits are reported apart.)
"""
from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import ActivationCache, Hooks, Model  # noqa: E402
from engine import threads as blas_threads  # noqa: E402
from engine.model import forward as fwd  # noqa: E402
from engine.model import ops  # noqa: E402
from specs.presets import load_preset  # noqa: E402


# ============================================================================================ 1. overhead
def bare_forward(model: Model, tokens: np.ndarray, cache) -> np.ndarray:
    """The same forward pass with nothing but the math (batch 1, no padding, one attention block)."""
    c, w = model.config, model.weights
    B, T = tokens.shape
    h_q, h_kv, d, G, q_dim, kv_dim, F = (c.num_heads, c.num_kv_heads, c.head_dim, c.group_size, c.q_dim, c.kv_dim,
                                         c.intermediate_size)
    n_valid = np.full(B, T, np.int64)
    pos = cache.lengths[:, None] + np.arange(T)[None, :]
    S = int(cache.lengths.max()) + T
    rotate = ops.rope_rotation(*ops.rope_cos_sin(pos, model._inv_freq), model.rope_layout)
    hidden = None if T == 1 else ~ops.causal_visible(pos, S, np.ones((B, S), bool))[:, None, None]
    x = w.embed[tokens]
    for li, lw in enumerate(w.layers):
        qkv = ops.rms_norm(x, lw.attn_norm, c.rms_norm_eps) @ lw.wqkv.T
        q = rotate(qkv[..., :q_dim].reshape(B, T, h_q, d))
        k = rotate(qkv[..., q_dim:q_dim + kv_dim].reshape(B, T, h_kv, d))
        v = qkv[..., q_dim + kv_dim:].reshape(B, T, h_kv, d)
        cache.write(li, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), n_valid)
        K, V = cache.read(li, S)
        s = ops.gqa_attention_scores(q.reshape(B, T, h_kv, G, d).transpose(0, 2, 3, 1, 4), K, 1 / d ** 0.5)
        if hidden is not None:
            np.copyto(s, -np.inf, where=hidden)
        o = ops.gqa_attention_output(ops.softmax_(s), V).transpose(0, 3, 1, 2, 4).reshape(B, T, q_dim)
        x = x + o @ lw.wo.T
        gu = ops.rms_norm(x, lw.ffn_norm, c.rms_norm_eps) @ lw.w_gate_up.T
        x = x + ops.swiglu(gu[..., :F], gu[..., F:]) @ lw.w_down.T
    cache.advance(n_valid)
    return (ops.rms_norm(x[:, -1:], w.final_norm, c.rms_norm_eps) @ w.lm_head.T)[:, 0]


# CPU seconds of this process, not wall time: with one BLAS thread the work runs on this process's CPU time, and
# waiting for a core that other processes hold (the noise on a shared machine) is not counted.
CLOCK = time.process_time


def paired(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each function, called round-robin (rotating) so load hits all alike (and "<name> min":
    the fastest call, which load from other processes can only lengthen)."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()
    keys = list(fns)
    for r in range(reps):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:          # rotate who goes first
            t = CLOCK()
            fns[k]()
            times[k].append(CLOCK() - t)
    return {**{k: float(np.median(v)) for k, v in times.items()}, **{k + " min": min(v) for k, v in times.items()}}


def bench_overhead(reps: int) -> None:
    model = Model.random(load_preset("smollm2"), seed=0)
    context, V = 64, model.config.vocab_size
    ids = np.random.default_rng(0).integers(3, V, (1, context))
    idle = Hooks().add("no.such.point", lambda n, x: None)               # hooks given, nothing matches
    one = Hooks(layers=[0], heads=[0], rows=[-1]).add("blocks.0.attn.hook_pattern", lambda n, x: None)
    for label, T, base, n in (("decode, 64-token context", 1, context, reps),
                              ("prefill, 64 tokens", context, 0, max(5, reps // 5))):
        cache = model.new_cache(1, context + T)
        model.prefill(ids[0], cache)                                     # real keys/values in the cache
        new = ids[:, :T]

        def at_base(f):
            def go():
                cache.lengths[:] = base                                  # same context every repetition
                return f()
            return go

        bare, engine = at_base(lambda: bare_forward(model, new, cache)), at_base(lambda: model.forward(new, cache))
        assert np.abs(bare() - engine()).max() < 1e-4, "the bare forward must compute the same logits"
        t = paired({"bare": bare, "engine": engine,
                    "idle hooks": at_base(lambda: model.forward(new, cache, hooks=idle)),
                    "pattern hook": at_base(lambda: model.forward(new, cache, hooks=one))}, n)
        over = 100 * (t["engine"] / t["bare"] - 1)
        print(f"\n[{label}] CPU time: bare {t['bare'] * 1e3:.2f} ms · engine, no hooks {t['engine'] * 1e3:.2f} ms")
        print(f"  recording overhead with no hooks: {over:+.2f}% of medians, "
              f"{100 * (t['engine min'] / t['bare min'] - 1):+.2f}% of fastest calls   "
              f"(target < 2%: {'PASS' if over < 2 else 'FAIL'})")
        print(f"  hooks given but matching nothing: {100 * (t['idle hooks'] / t['bare'] - 1):+.2f}% · "
              f"one pattern row of one head: {100 * (t['pattern hook'] / t['bare'] - 1):+.2f}%")


# ============================================================================================ 2. memory
def traced_peak(fn) -> tuple[int, object]:
    """Peak bytes NumPy/Python allocated while `fn` ran, beyond what was alive before it."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    out = fn()
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return peak, out


def bench_memory(tokens: int) -> None:
    from engine import load_model
    model = load_model()
    c = model.config
    ids = [int(t) for t in np.random.default_rng(0).integers(3, c.vocab_size, tokens)]
    cache = model.new_cache(1, tokens)
    for a in cache.k + cache.v:
        a.fill(0.0)                                                      # touch the pages before tracing
    print(f"\n[peak memory, {model.name}, {tokens}-token prompt, query block {fwd.QUERY_BLOCK}] "
          f"weights {model.weights.nbytes() / 2**20:.0f} MiB, KV cache {cache.bytes_reserved() / 2**20:.0f} MiB "
          f"(not counted below)")
    scores_block = c.num_heads * fwd.QUERY_BLOCK * tokens * 4
    print(f"  one block of scores: {c.num_heads} heads x {fwd.QUERY_BLOCK} x {tokens} x 4 B = "
          f"{scores_block / 2**20:.0f} MiB")
    def hooked(**selection):
        acts = ActivationCache(("blocks.*.attn.hook_pattern",), **selection)
        return model.prefill(ids, cache, hooks=acts.hooks), acts

    cases = [("no hooks", lambda: (model.prefill(ids, cache), None)),
             ("pattern hook, every layer, all heads, last query row", lambda: hooked(rows=[-1])),
             ("pattern hook, layer 0, head 0, every query row", lambda: hooked(layers=[0], heads=[0]))]
    for label, fn in cases:
        cache.lengths[:] = 0
        t = time.perf_counter()
        peak, out = traced_peak(fn)
        kept = out[1].nbytes() if out[1] is not None else 0
        print(f"  {label}: peak {peak / 2**20:.0f} MiB beyond weights and cache, of which {kept / 2**20:.0f} MiB "
              f"kept by the hook -> transient {(peak - kept) / 2**20:.0f} MiB ({time.perf_counter() - t:.0f} s)")
    print(f"  (run_with_cache also returns logits for every position: [{tokens}, {c.vocab_size}] float32 = "
          f"{tokens * c.vocab_size * 4 / 2**20:.0f} MiB, counted against its max_bytes)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overhead", action="store_true", help="only part 1")
    ap.add_argument("--memory", action="store_true", help="only part 2")
    ap.add_argument("--reps", type=int, default=60, help="decode repetitions (prefill: a fifth)")
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    if blas_threads.governor().mode == "auto":   # unless INFERENCE_LAB_BLAS_THREADS / OPENBLAS_NUM_THREADS say
        # one thread: on a shared machine a second BLAS thread's spinning drowns a 2% effect in noise, and the
        # bare forward (no Model.forward, so no automatic choice) must run with the engine's thread count
        blas_threads.fix(1, "bench_instruments (both sides of each ratio alike)")
    both = not (args.overhead or args.memory)
    if args.overhead or both:
        bench_overhead(args.reps)
    if args.memory or both:
        bench_memory(args.tokens)


if __name__ == "__main__":
    main()
