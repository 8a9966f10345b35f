"""The serving engine measured in one run: batching, speculative decoding, chunked prefill (ratios, not absolutes).

    python bench/bench_scheduler.py            # the default model (SmolLM2-135M-Instruct)
    python bench/bench_scheduler.py --quick    # a small random shape, for a smoke run
    python bench/bench_scheduler.py --json out.json --threads 1    # numbers to a file; one BLAS thread

1. Continuous batching: 1/2/4/8/16/32 concurrent greedy streams through `engine.Scheduler`. Decode tokens/s
   (steps with no prefill in them) and its ratio to one stream. Target: 8 streams >= 4x one stream, because
   the weights are read once per step for all of them.
1b. The BLAS ceiling: the same step's weight products alone at n rows vs 1 row (`ops.matmul_t`, no attention, no
   scheduler). n·t(1)/t(n) bounds what any scheduler on this machine's BLAS can reach; the measured ratio is also
   printed as a share of it.
2. Speculative decoding with early-exit drafts (the model's first layers): acceptance, tokens per target pass
   measured vs (1 - a^(K+1)) / (1 - a), and the wall-time speedup measured vs `calculators.speculative`'s
   prediction E[tokens] / (1 + K*c), with a and the draft cost ratio c measured in the same run.
3. Chunked prefill: a long prompt arrives while 4 requests decode; inter-token latency of those 4 with and
   without chunking.
4. Prefix caching: a repeated system prompt; prefill tokens and TTFT of the second request with and without it.
On a shared machine every number moves with the load: compare the ratios, and run it again when in doubt.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if "--threads" in sys.argv:   # BLAS reads its thread count when NumPy is first imported
    n = sys.argv[sys.argv.index("--threads") + 1]
    os.environ.update(OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.speculative import expected_tokens_per_pass, speculative_speedup  # noqa: E402
from engine import Model, load_model  # noqa: E402
from engine.serving_runs import (chunked_prefill_run, prefix_cache_run, random_prompts,  # noqa: E402
                                 speculative_run, streams_run, weight_products_run)
from engine.speculative import early_exit_draft  # noqa: E402
from specs.model_config import ModelConfig  # noqa: E402


def bench_streams(model: Model, streams: list[int], new_tokens: int, rounds: int) -> list[dict]:
    """Every stream count once per round, rounds interleaved, so a slow minute on a shared machine hits all counts
    alike; each round's ratio is taken to that same round's 1-stream run, and the median over rounds reported."""
    alone = list(model.generate(random_prompts(model, 1, 8)[0], max_new_tokens=new_tokens, stop_at_eos=False))
    print(f"  model.generate, 1 stream (no scheduler): decode {1 / np.mean([t.seconds for t in alone[1:]]):7.1f} "
          "tok/s", flush=True)
    runs = {n: [] for n in streams}
    for _ in range(rounds):
        for n in streams:
            runs[n].append(streams_run(model, n, prompt_len=8, new_tokens=new_tokens))
    ones = [r["decode_tokens_per_s"] for r in runs[streams[0]]]
    rows = []
    for n in streams:
        ratios = [r["decode_tokens_per_s"] / one for r, one in zip(runs[n], ones)]
        rows.append(dict(streams=n, rounds=rounds,
                         decode_tokens_per_s=float(np.median([r["decode_tokens_per_s"] for r in runs[n]])),
                         decode_step_ms=float(np.median([r["decode_step_ms"] for r in runs[n]])),
                         end_to_end_tokens_per_s=float(np.median([r["end_to_end_tokens_per_s"] for r in runs[n]])),
                         ratio_to_one=float(np.median(ratios)), ratio_min=min(ratios), ratio_max=max(ratios)))
        r = rows[-1]
        print(f"  {n:>3} streams: decode {r['decode_tokens_per_s']:7.1f} tok/s  (step {r['decode_step_ms']:7.1f} ms)"
              f"  x{r['ratio_to_one']:5.2f} vs 1 stream (rounds {r['ratio_min']:.2f}-{r['ratio_max']:.2f})   "
              f"end-to-end {r['end_to_end_tokens_per_s']:6.1f} tok/s", flush=True)
    return rows


def bench_blas_ceiling(model: Model, streams: list[int], rounds: int) -> list[dict]:
    """The best any scheduler could do on this machine's BLAS: the step's weight products alone, n rows vs 1 row
    (`weight_products_run`, rounds interleaved, median). n·t(1)/t(n) is the tokens/s ratio of a scheduler with
    zero overhead and free attention."""
    times = {n: [] for n in streams}
    for _ in range(rounds):
        for n in streams:
            times[n].append(weight_products_run(model, n, repeats=1)["products_ms"])
    flops_per_row = weight_products_run(model, 1, repeats=1)["flops"]
    rows = []
    for n in streams:
        ratios = [n * one / t for one, t in zip(times[streams[0]], times[n])]
        t = float(np.median(times[n]))
        rows.append(dict(streams=n, weight_products_ms=t, ceiling_ratio=float(np.median(ratios)),
                         gflop_s=n * flops_per_row / t / 1e6))
        print(f"  {n:>3} rows: weight products {t:7.1f} ms  ({rows[-1]['gflop_s']:5.1f} GFLOP/s)   ceiling "
              f"x{rows[-1]['ceiling_ratio']:5.2f} vs 1 row", flush=True)
    return rows


def bench_speculative(model: Model, prompt: list[int], new_tokens: int, draft_layers: list[int], k: int) -> list[dict]:
    rows = []
    for n in draft_layers:
        r = speculative_run(model, early_exit_draft(model, n), prompt, max_new_tokens=new_tokens, draft_tokens=k)
        assert r["identical"], "speculative output differs from plain greedy"
        r["tokens_per_pass_predicted"] = expected_tokens_per_pass(r["alpha"], k)
        r["speedup_predicted"] = speculative_speedup(r["alpha"], k, r["draft_cost_ratio"])
        # the formula takes a verification pass = one decode step; here it is v steps: E[tokens] / (v + K·c)
        r["speedup_predicted_with_verify_cost"] = r["tokens_per_pass_predicted"] / (
            r["verify_cost_ratio"] + k * r["draft_cost_ratio"])
        rows.append(r)
        print(f"  draft = first {n:>2} of {model.config.num_layers} layers, K={k}: acceptance "
              f"{r['acceptance_rate']:.2f} (a = {r['alpha']:.2f}); tokens/pass {r['tokens_per_pass']:.2f} measured vs "
              f"{r['tokens_per_pass_predicted']:.2f} predicted; draft cost c = {r['draft_cost_ratio']:.2f}, verify "
              f"pass = {r['verify_cost_ratio']:.2f} decode steps; speedup {r['speedup_measured']:.2f}x measured vs "
              f"{r['speedup_predicted']:.2f}x predicted, {r['speedup_predicted_with_verify_cost']:.2f}x with the "
              f"measured verify cost (plain {r['plain_s']:.2f} s)", flush=True)
    return rows


def bench_chunked_prefill(model: Model, long_len: int, chunk: int) -> list[dict]:
    rows = []
    for chunk_size in (None, chunk):
        r = chunked_prefill_run(model, long_len, chunk_size)
        rows.append(r)
        print(f"  chunk_size={str(chunk_size):>4}: decoders' ITL p50 {r['itl_p50_ms']:7.1f} ms, p99 "
              f"{r['itl_p99_ms']:7.1f} ms, max {r['itl_max_ms']:7.1f} ms; long prompt ({long_len} tokens) "
              f"TTFT {r['long_prompt_ttft_ms']:7.1f} ms; computed/useful token slots {r['padded_tokens']}/"
              f"{r['forward_tokens']}", flush=True)
    return rows


def bench_prefix_cache(model: Model, system_len: int) -> list[dict]:
    rows = [prefix_cache_run(model, system_len, prefix_caching=c) for c in (False, True)]
    for r in rows:
        print(f"  prefix_caching={str(r['prefix_caching']):>5}: second request prefilled {r['prefill_tokens']:>4} "
              f"of {r['prompt_tokens']} tokens ({r['cached_tokens']} from cache), TTFT {r['ttft_ms']:7.1f} ms")
    print(f"  prefill time saved: {rows[0]['ttft_ms'] - rows[1]['ttft_ms']:.1f} ms "
          f"({rows[0]['ttft_ms'] / rows[1]['ttft_ms']:.1f}x faster TTFT)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small random shape instead of the default model")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--threads", help="BLAS threads (default: the library's choice)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the stream sweep (median reported)")
    args = ap.parse_args()
    if args.quick:
        cfg = ModelConfig(name="bench-small", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2,
                          head_dim=32, intermediate_size=688, vocab_size=2048, max_position_embeddings=512)
        model = Model.random(cfg, seed=0, std=0.5)
        streams, new_tokens, long_len = [1, 2, 4, 8], 8, 96
    else:
        model = load_model()
        streams, new_tokens, long_len = [1, 2, 4, 8, 16, 32], 8, 128
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"{model.name}; {os.cpu_count()} cores, BLAS threads {threads}; "
          f"load average {os.getloadavg()[0]:.1f} (shared machine: noisy)")
    out = {"model": model.name, "load_average_start": os.getloadavg()[0]}
    print("\n[1] continuous batching, greedy streams")
    out["streams"] = bench_streams(model, streams, new_tokens, args.rounds)
    print("\n[1b] the BLAS ceiling: the same step's weight products alone (no attention, no scheduler)")
    out["blas_ceiling"] = bench_blas_ceiling(model, streams, 3 * args.rounds)
    eight = next((r for r in out["streams"] if r["streams"] == 8), None)
    if eight:
        ceiling = next(r for r in out["blas_ceiling"] if r["streams"] == 8)["ceiling_ratio"]
        print(f"  8 streams / 1 stream = {eight['ratio_to_one']:.2f}x (target >= 4: "
              f"{'PASS' if eight['ratio_to_one'] >= 4 else 'FAIL'}); this BLAS's ceiling for 8 rows: "
              f"{ceiling:.2f}x, so the scheduler reaches {eight['ratio_to_one'] / ceiling:.0%} of it")
    print("\n[2] speculative decoding, early-exit drafts")
    prompt = (model.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
              if model.tokenizer is not None else random_prompts(model, 1, 12)[0])
    L = model.config.num_layers
    out["speculative"] = bench_speculative(model, prompt, 24, sorted({max(1, L // 4), max(1, L // 2)}), k=4)
    print("\n[3] chunked prefill: a long prompt arrives while 4 requests decode")
    out["chunked_prefill"] = bench_chunked_prefill(model, long_len, chunk=32)
    print("\n[4] prefix caching: the same system prompt twice")
    out["prefix_cache"] = bench_prefix_cache(model, system_len=long_len * 2)
    out["load_average_end"] = os.getloadavg()[0]
    print(f"\nload average at the end {out['load_average_end']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
