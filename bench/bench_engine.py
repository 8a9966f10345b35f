"""Engine speed against the floors this machine can reach, measured in one run (ratios, not absolute times).

    python bench/bench_engine.py            # TinyLlama shape (fp32, random weights) + the default model
    python bench/bench_engine.py --quick    # smaller shape, for a smoke run

1. Decode, batch 1: time per token vs the bare matrix-vector products over the SAME weight matrices
   (the memory-bandwidth floor NumPy reaches here). Target: ratio <= 1.05. Beside it, the leanest NumPy loop
   (bench/lean_decode.py) against the same floor: what the work between the products costs at least with NumPy.
2. Decode vs Hugging Face transformers (torch CPU, fp32, same thread count, same shape), when installed.
3. Prefill of 256 tokens: FLOP rate vs the bare GEMM rate over the same matrices. Target: >= 60%.
4. Default model (SmolLM2-135M Q4_1 GGUF): load time (< 10 s) and streaming rate (>= 10 tokens/s).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Model, Trace  # noqa: E402
from engine import threads as blas_threads  # noqa: E402
from specs.presets import load_preset  # noqa: E402
from bench.lean_decode import LeanDecoder  # noqa: E402


def median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def matrices(model: Model) -> list[np.ndarray]:
    ms = [W for lw in model.weights.layers for W in lw.matrices().values()]
    return ms + [model.weights.lm_head]


def rotated_runs(fns: dict, reps: int) -> dict[str, np.ndarray]:
    """Times of every function, run back to back `reps` times, the order rotated each round so that no function
    always follows the same one (what ran just before decides how cold the caches are)."""
    names = list(fns)
    for f in fns.values():
        f()
    times = {k: np.empty(reps) for k in names}
    for i in range(reps):
        for k in names[i % len(names):] + names[:i % len(names)]:
            t = time.perf_counter()
            fns[k]()
            times[k][i] = time.perf_counter() - t
    return times


def paired_times(fn_a, fn_b, reps: int) -> tuple[float, float]:
    """Median times of two functions measured alternately, so load from other processes hits both alike."""
    t = rotated_runs({"a": fn_a, "b": fn_b}, reps)
    return float(np.median(t["a"])), float(np.median(t["b"]))


def bench_decode(model: Model, reps: int, context: int = 32) -> dict:
    """Decode at batch 1 against the bare products, and the leanest NumPy loop (bench/lean_decode.py) against them
    too: medians of `reps` per-round ratios, and their quartiles."""
    cache = model.new_cache(1, context + reps + 8)           # the lean loop decodes on its own copy
    model.prefill(list(range(3, 3 + context)), cache)
    lean = LeanDecoder(model, cache)
    err = float(np.abs(lean.step(5) - model.decode_step(5, cache)).max())
    assert err < 1e-3, f"the lean loop disagrees with the engine by {err}"
    xs = {n: np.random.rand(1, n).astype(np.float32) for n in {W.shape[1] for W in matrices(model)}}
    mats = matrices(model)
    t = rotated_runs({"engine": lambda: model.decode_step(5, cache), "lean": lambda: lean.step(5),
                      "bare": lambda: [xs[W.shape[1]] @ W.T for W in mats]}, reps)
    gb = sum(W.nbytes for W in mats) / 1e9
    out = dict(engine_ms=np.median(t["engine"]) * 1e3, lean_ms=np.median(t["lean"]) * 1e3,
               bare_ms=np.median(t["bare"]) * 1e3, weights_gb=gb, bare_gbps=gb / np.median(t["bare"]))
    for k in ("engine", "lean"):
        r = t[k] / t["bare"]
        out |= {f"{k}_ratio": float(np.median(r)), f"{k}_q1": float(np.percentile(r, 25)),
                f"{k}_q3": float(np.percentile(r, 75)), f"{k}_extra_ms": float(np.median(t[k] - t["bare"])) * 1e3}
    return out


def bench_prefill(model: Model, tokens: int, reps: int) -> dict:
    ids = list(np.random.default_rng(0).integers(3, model.config.vocab_size, tokens))
    tr = Trace()
    model.prefill(ids, model.new_cache(1, tokens), trace=tr)
    mats = matrices(model)[:-1]                                  # per-layer matrices (LM head: 1 row only)
    xs = {n: np.random.rand(tokens, n).astype(np.float32) for n in {W.shape[1] for W in mats}}
    engine_s, bare_s = paired_times(lambda: model.prefill(ids, model.new_cache(1, tokens)),
                                    lambda: [xs[W.shape[1]] @ W.T for W in mats], reps)
    bare_flops = sum(2.0 * tokens * W.shape[0] * W.shape[1] for W in mats)
    return dict(engine_ms=engine_s * 1e3, bare_ms=bare_s * 1e3, engine_gflops=tr.flops / engine_s / 1e9,
                bare_gflops=bare_flops / bare_s / 1e9, rate_ratio=(tr.flops / engine_s) / (bare_flops / bare_s))


def bench_torch(model: Model, reps: int, context: int = 32) -> dict | None:
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    c = model.config
    torch.set_num_threads(blas_threads.status().threads or 1)       # the count the engine's decode just used
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings)).float().eval()
    with torch.inference_mode():
        out = hf(torch.arange(3, 3 + context)[None], use_cache=True)
        past = out.past_key_values
        tok = torch.tensor([[5]])

        def step():
            nonlocal past
            past = hf(tok, past_key_values=past, use_cache=True).past_key_values

        torch_s = median_time(step, reps)
    return dict(torch_ms=torch_s * 1e3, threads=torch.get_num_threads())


def bench_default_model(n_tokens: int) -> dict | None:
    from engine import ModelError, load_model
    t = time.perf_counter()
    try:
        m = load_model()
    except ModelError as e:
        print(f"  default model unavailable: {e}")
        return None
    load_s = time.perf_counter() - t
    prompt = m.tokenizer.apply_chat_template([{"role": "user", "content": "Write a story about a robot."}])
    t = time.perf_counter()
    n = sum(1 for _ in m.generate(prompt, max_new_tokens=n_tokens, stop_at_eos=False))
    gen_s = time.perf_counter() - t
    return dict(load_s=load_s, tokens=n, tokens_per_s=n / gen_s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small shape, few repetitions")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    cfg = load_preset("tinyllama")
    if args.quick:
        cfg = cfg.replace(num_layers=4, name="TinyLlama (4 layers)")
    print(f"machine: {os.cpu_count()} cores; numpy {np.__version__}; BLAS threads sized by engine.threads "
          f"(INFERENCE_LAB_BLAS_THREADS=N fixes them)")
    t = time.perf_counter()
    model = Model.random(cfg, seed=0)
    print(f"{cfg.name} fp32 random weights: {model.weights.nbytes() / 1e9:.2f} GB built in {time.perf_counter() - t:.1f} s")

    d = bench_decode(model, 3 * args.reps)
    print(f"\n[decode, batch 1] engine {d['engine_ms']:.1f} ms/token · bare matvec {d['bare_ms']:.1f} ms "
          f"({d['bare_gbps']:.1f} GB/s over {d['weights_gb']:.2f} GB) · leanest NumPy loop {d['lean_ms']:.1f} ms")
    print(f"  ratio engine / bare = {d['engine_ratio']:.3f} (median of {3 * args.reps} rounds; quartiles "
          f"{d['engine_q1']:.3f}-{d['engine_q3']:.3f}; engine - bare {d['engine_extra_ms']:.1f} ms)   "
          f"(target <= 1.05: {'PASS' if d['engine_ratio'] <= 1.05 else 'FAIL'})")
    print(f"  ratio lean / bare   = {d['lean_ratio']:.3f} (quartiles {d['lean_q1']:.3f}-{d['lean_q3']:.3f}; "
          f"lean - bare {d['lean_extra_ms']:.1f} ms): the same arithmetic in the fewest NumPy calls, no structure")
    print(f"  {blas_threads.status().describe()}")
    tr = bench_torch(model, args.reps)
    if tr is None:
        print("  transformers not installed: torch comparison skipped")
    else:
        r = d["engine_ms"] / tr["torch_ms"]
        print(f"  transformers (torch CPU fp32, {tr['threads']} threads) {tr['torch_ms']:.1f} ms/token · "
              f"engine / torch = {r:.3f}   (target < 1: {'PASS' if r < 1 else 'FAIL'})")

    p = bench_prefill(model, 256, max(3, args.reps // 3))
    print(f"\n[prefill, 256 tokens] engine {p['engine_ms']:.0f} ms ({p['engine_gflops']:.1f} GFLOP/s) · bare GEMM "
          f"{p['bare_ms']:.0f} ms ({p['bare_gflops']:.1f} GFLOP/s)")
    print(f"  rate ratio engine / bare = {p['rate_ratio']:.3f}   "
          f"(target >= 0.60: {'PASS' if p['rate_ratio'] >= 0.6 else 'FAIL'})")
    del model

    dm = bench_default_model(32 if args.quick else 64)
    if dm:
        print(f"\n[default model] load {dm['load_s']:.2f} s (target < 10: {'PASS' if dm['load_s'] < 10 else 'FAIL'}) · "
              f"{dm['tokens_per_s']:.1f} tokens/s over {dm['tokens']} tokens "
              f"(target >= 10: {'PASS' if dm['tokens_per_s'] >= 10 else 'FAIL'})")


if __name__ == "__main__":
    main()
