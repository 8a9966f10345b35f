"""The serving engine measured in one run: batching, speculative decoding, chunked prefill (ratios, not absolutes).

    python bench/bench_scheduler.py            # the default model (SmolLM2-135M-Instruct)
    python bench/bench_scheduler.py --quick    # a small random shape, for a smoke run
    python bench/bench_scheduler.py --json out.json --threads 1    # numbers to a file; one BLAS thread
    python bench/bench_scheduler.py --batching-only    # [1] and [1b] only: the streams' gain and its ceiling
    python bench/bench_scheduler.py --batching-only --streams 1,8,16 --prompt-tokens 256    # longer contexts

1. Continuous batching: 1/2/4/8/16/32 concurrent greedy streams through `engine.Scheduler`, each count decoding
   side by side with one stream (`paired_streams_run`: steps taken in turn, each pair met the same moment of the
   machine). Decode tokens/s and its gain over one stream.
1b. The ceiling: the same step's weight products alone in plain NumPy (`plain_products_run`: no engine op, no
   attention, no scheduler), n rows against one row. n·t(1)/t(n) is the most batching can give on this machine's
   BLAS; the scheduler's gain is printed as a share of it. Target: >= 90% at 8 and 16 streams. (The gain can pass
   the ceiling a little: the step's fixed costs, Python and the norms, are shared by the batch too.)
2. Speculative decoding with early-exit drafts (the model's first layers): acceptance, tokens per target pass
   measured vs (1 - a^(K+1)) / (1 - a), and the wall-time speedup measured vs `calculators.serving.speculative`'s
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.serving.speculative import expected_tokens_per_pass, speculative_speedup  # noqa: E402
from engine import Model, load_model  # noqa: E402
from engine import threads as blas_threads  # noqa: E402
from engine.serve.serving_runs import (batching_run, chunked_prefill_run, prefix_cache_run,  # noqa: E402
                                 random_prompts, speculative_run)
from engine.serve.speculative import early_exit_draft  # noqa: E402
from specs.model_config import ModelConfig  # noqa: E402

TARGET_STREAMS = (8, 16)   # where the scheduler's gain should reach TARGET_SHARE of the ceiling
TARGET_SHARE = 0.9


def bench_streams(model: Model, streams: list[int], new_tokens: int, rounds: int, prompt_len: int = 8) -> list[dict]:
    """`batching_run`: every stream count in every round, each ratio from runs made side by side (median and range
    over rounds)."""
    alone = list(model.generate(random_prompts(model, 1, 8)[0], max_new_tokens=new_tokens, stop_at_eos=False))
    print(f"  model.generate, 1 stream (no scheduler): decode {1 / np.mean([t.seconds for t in alone[1:]]):7.1f} "
          "tok/s", flush=True)
    rows = batching_run(model, streams, prompt_len=prompt_len, new_tokens=new_tokens, rounds=rounds)
    for r in rows:
        print(f"  {r['streams']:>3} streams: decode {r['decode_tokens_per_s']:7.1f} tok/s  (step "
              f"{r['decode_step_ms']:7.1f} ms)  x{r['gain']:5.2f} vs 1 stream (rounds {r['gain_min']:.2f}-"
              f"{r['gain_max']:.2f})", flush=True)
    print("\n[1b] the ceiling: the same step's weight products alone, plain NumPy (no attention, no scheduler)")
    for r in rows:
        print(f"  {r['streams']:>3} rows: weight products {r['weight_products_ms']:7.1f} ms  "
              f"({r['products_gflop_s']:5.1f} GFLOP/s)   ceiling x{r['ceiling']:5.2f} vs 1 row (rounds "
              f"{r['ceiling_min']:.2f}-{r['ceiling_max']:.2f});  scheduler's share {r['share']:4.0%} (rounds "
              f"{r['share_min']:.0%}-{r['share_max']:.0%})", flush=True)
    for r in rows:
        if r["streams"] in TARGET_STREAMS:
            verdict = "PASS" if r["share"] >= TARGET_SHARE else "FAIL"
            print(f"  {r['streams']} streams: gain x{r['gain']:.2f} of a ceiling x{r['ceiling']:.2f} = "
                  f"{r['share']:.0%} (target >= {TARGET_SHARE:.0%}: {verdict})")
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
    ap.add_argument("--threads", default="auto",
                    help="BLAS threads: a number, or auto (default: engine.threads sizes them to the free cores)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the stream sweep (median reported)")
    ap.add_argument("--batching-only", action="store_true", help="only [1] and [1b]: the streams and the ceiling")
    ap.add_argument("--streams", help="stream counts of [1], comma-separated, starting at 1 (default 1,2,4,8,16,32)")
    ap.add_argument("--prompt-tokens", type=int, default=8, help="prompt tokens of each stream in [1] (default 8)")
    args = ap.parse_args()
    if args.threads != "auto":
        if not args.threads.isdigit() or int(args.threads) < 1:
            ap.error(f"--threads must be auto or a whole number >= 1, got {args.threads!r}")
        blas_threads.fix(int(args.threads), f"--threads {args.threads}")
    if args.quick:
        cfg = ModelConfig(name="bench-small", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2,
                          head_dim=32, intermediate_size=688, vocab_size=2048, max_position_embeddings=512)
        model = Model.random(cfg, seed=0, std=0.5)
        streams, new_tokens, long_len = [1, 2, 4, 8], 8, 96
    else:
        model = load_model()
        streams, new_tokens, long_len = [1, 2, 4, 8, 16, 32], 8, 128
    print(f"{model.name}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} (shared machine: noisy)")
    out = {"model": model.name, "load_average_start": os.getloadavg()[0]}
    print("\n[1] continuous batching, greedy streams")
    if args.streams:
        streams = [int(n) for n in args.streams.split(",")]
    out["streams"] = bench_streams(model, streams, new_tokens, args.rounds, args.prompt_tokens)
    if args.batching_only:
        streams_done(out, args.json)
        return
    print("\n[2] speculative decoding, early-exit drafts")
    prompt = (model.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
              if model.tokenizer is not None else random_prompts(model, 1, 12)[0])
    L = model.config.num_layers
    out["speculative"] = bench_speculative(model, prompt, 24, sorted({max(1, L // 4), max(1, L // 2)}), k=4)
    print("\n[3] chunked prefill: a long prompt arrives while 4 requests decode")
    out["chunked_prefill"] = bench_chunked_prefill(model, long_len, chunk=32)
    print("\n[4] prefix caching: the same system prompt twice")
    out["prefix_cache"] = bench_prefix_cache(model, system_len=long_len * 2)
    streams_done(out, args.json)


def streams_done(out: dict, json_path: str | None) -> None:
    out["load_average_end"] = os.getloadavg()[0]
    out["blas_threads"] = blas_threads.status().describe()
    print(f"\nload average at the end {out['load_average_end']:.1f}; {out['blas_threads']}")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
