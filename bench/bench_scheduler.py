"""The serving engine measured in one run: batching, speculative decoding, chunked prefill (ratios, not absolutes).

    python bench/bench_scheduler.py            # the default model (SmolLM2-135M-Instruct)
    python bench/bench_scheduler.py --quick    # a small random shape, for a smoke run
    python bench/bench_scheduler.py --json out.json --threads 1    # numbers to a file; one BLAS thread

1. Continuous batching: 1/2/4/8/16/32 concurrent greedy streams through `engine.Scheduler`. Decode tokens/s
   (steps with no prefill in them) and its ratio to one stream. Target: 8 streams >= 4x one stream, because
   the weights are read once per step for all of them.
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
import time
from pathlib import Path

if "--threads" in sys.argv:   # BLAS reads its thread count when NumPy is first imported
    n = sys.argv[sys.argv.index("--threads") + 1]
    os.environ.update(OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.speculative import expected_tokens_per_pass, speculative_speedup  # noqa: E402
from engine import Model, Scheduler, load_model  # noqa: E402
from engine.speculative import early_exit_draft, speculative_generate  # noqa: E402
from specs.model_config import ModelConfig  # noqa: E402


def random_prompts(model: Model, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(10, model.config.vocab_size, length)] for _ in range(n)]


def bench_streams(model: Model, streams: list[int], new_tokens: int, prompt_len: int) -> list[dict]:
    alone = list(model.generate(random_prompts(model, 1, prompt_len)[0], max_new_tokens=new_tokens,
                                stop_at_eos=False))
    print(f"  model.generate, 1 stream (no scheduler): decode {1 / np.mean([t.seconds for t in alone[1:]]):7.1f} "
          "tok/s", flush=True)
    rows = []
    for n in streams:
        s = Scheduler(model, block_size=16, max_batch=n)
        for p in random_prompts(model, n, prompt_len, seed=n):
            s.submit(p, max_new_tokens=new_tokens, stop_at_eos=False)
        t0 = time.perf_counter()
        reports = s.run()
        total = time.perf_counter() - t0
        decode = [r for r in reports if not r.prefilled and r.decoded]
        dec_tokens, dec_s = sum(r.tokens_produced for r in decode), sum(r.seconds for r in decode)
        rows.append(dict(streams=n, decode_tokens_per_s=dec_tokens / dec_s, step_ms=1e3 * dec_s / len(decode),
                         end_to_end_tokens_per_s=n * new_tokens / total, seconds=total))
        base = rows[0]["decode_tokens_per_s"]
        r = rows[-1]
        r["ratio_to_one"] = r["decode_tokens_per_s"] / base
        print(f"  {n:>3} streams: decode {r['decode_tokens_per_s']:7.1f} tok/s  (step {r['step_ms']:7.1f} ms)  "
              f"x{r['ratio_to_one']:5.2f} vs 1 stream   end-to-end {r['end_to_end_tokens_per_s']:6.1f} tok/s",
              flush=True)
    return rows


def bench_speculative(model: Model, prompt: list[int], new_tokens: int, draft_layers: list[int], k: int) -> list[dict]:
    plain = list(model.generate(prompt, max_new_tokens=new_tokens, stop_at_eos=False))
    plain_s = sum(t.seconds for t in plain)
    step_s = float(np.mean([t.seconds for t in plain[1:]]))            # one target decode step
    print(f"  plain greedy: {new_tokens} tokens in {plain_s:.2f} s ({1e3 * step_s:.1f} ms per decode step)")
    rows = []
    for n in draft_layers:
        draft = early_exit_draft(model, n)
        res = speculative_generate(model, draft, prompt, max_new_tokens=new_tokens, draft_tokens=k,
                                   stop_at_eos=False)
        assert res.token_ids == [t.token_id for t in plain], "speculative output differs from plain greedy"
        c = (res.draft_seconds / res.draft_steps) / step_s if res.draft_steps else float("nan")
        verify_ratio = (res.verify_seconds / res.rounds) / step_s
        row = dict(draft_layers=n, k=k, acceptance_rate=res.acceptance_rate, alpha=res.alpha,
                   tokens_per_pass=res.tokens_per_pass,
                   tokens_per_pass_predicted=expected_tokens_per_pass(res.alpha, k),
                   draft_cost_ratio=c, verify_cost_ratio=verify_ratio,
                   speedup_measured=plain_s / res.seconds, speedup_predicted=speculative_speedup(res.alpha, k, c))
        rows.append(row)
        print(f"  draft = first {n:>2} of {model.config.num_layers} layers, K={k}: acceptance {res.acceptance_rate:.2f}"
              f" (a = {res.alpha:.2f}); tokens/pass {res.tokens_per_pass:.2f} measured vs "
              f"{row['tokens_per_pass_predicted']:.2f} predicted; draft cost c = {c:.2f}, verify pass = "
              f"{verify_ratio:.2f} decode steps; speedup {row['speedup_measured']:.2f}x measured vs "
              f"{row['speedup_predicted']:.2f}x predicted", flush=True)
    return rows


def bench_chunked_prefill(model: Model, long_len: int, chunk: int, new_tokens: int) -> list[dict]:
    rows = []
    long_prompt = random_prompts(model, 1, long_len, seed=99)[0]
    for chunk_size in (None, chunk):
        s = Scheduler(model, block_size=16, max_batch=8, chunk_size=chunk_size)
        decoders = [s.submit(p, max_new_tokens=new_tokens, stop_at_eos=False)
                    for p in random_prompts(model, 4, 8, seed=7)]
        for _ in range(3):
            s.step()
        long_req = s.submit(long_prompt, max_new_tokens=2, stop_at_eos=False)
        s.run()
        itl = np.array([x for r in decoders for x in r.itl_s]) * 1e3
        row = dict(chunk_size=chunk_size, itl_p50_ms=float(np.median(itl)), itl_p99_ms=float(np.percentile(itl, 99)),
                   itl_max_ms=float(itl.max()), long_prompt_ttft_ms=1e3 * long_req.ttft_s)
        rows.append(row)
        print(f"  chunk_size={str(chunk_size):>4}: decoders' ITL p50 {row['itl_p50_ms']:7.1f} ms, p99 "
              f"{row['itl_p99_ms']:7.1f} ms, max {row['itl_max_ms']:7.1f} ms; long prompt ({long_len} tokens) "
              f"TTFT {row['long_prompt_ttft_ms']:7.1f} ms", flush=True)
    return rows


def bench_prefix_cache(model: Model, system_len: int, question_len: int) -> list[dict]:
    """The same system prompt twice: the second request's prefill with and without cached blocks."""
    system = random_prompts(model, 1, system_len, seed=11)[0]
    first, second = (system + q for q in random_prompts(model, 2, question_len, seed=12))
    rows = []
    for caching in (False, True):
        s = Scheduler(model, block_size=16, max_batch=2, prefix_caching=caching)
        s.submit(first, max_new_tokens=1, stop_at_eos=False)
        s.run()
        before = s.prefill_tokens_computed
        req = s.submit(second, max_new_tokens=1, stop_at_eos=False)
        s.run()
        rows.append(dict(prefix_caching=caching, prefill_tokens=s.prefill_tokens_computed - before,
                         cached_tokens=req.prefix_cached_tokens, ttft_ms=1e3 * req.ttft_s))
    for r in rows:
        print(f"  prefix_caching={str(r['prefix_caching']):>5}: second request prefilled {r['prefill_tokens']:>4} "
              f"tokens ({r['cached_tokens']} from cache), TTFT {r['ttft_ms']:7.1f} ms", flush=True)
    print(f"  prefill time saved: {rows[0]['ttft_ms'] - rows[1]['ttft_ms']:.1f} ms "
          f"({rows[0]['ttft_ms'] / rows[1]['ttft_ms']:.1f}x faster TTFT)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small random shape instead of the default model")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--threads", help="BLAS threads (default: the library's choice)")
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
    out["streams"] = bench_streams(model, streams, new_tokens, prompt_len=8)
    eight = next((r for r in out["streams"] if r["streams"] == 8), None)
    if eight:
        print(f"  8 streams / 1 stream = {eight['ratio_to_one']:.2f}x (target >= 4: "
              f"{'PASS' if eight['ratio_to_one'] >= 4 else 'FAIL'})")
    print("\n[2] speculative decoding, early-exit drafts")
    prompt = (model.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
              if model.tokenizer is not None else random_prompts(model, 1, 12)[0])
    L = model.config.num_layers
    out["speculative"] = bench_speculative(model, prompt, 24, sorted({max(1, L // 4), max(1, L // 2)}), k=4)
    print("\n[3] chunked prefill: a long prompt arrives while 4 requests decode")
    out["chunked_prefill"] = bench_chunked_prefill(model, long_len, chunk=32, new_tokens=16)
    print("\n[4] prefix caching: the same system prompt twice")
    out["prefix_cache"] = bench_prefix_cache(model, system_len=long_len * 2, question_len=8)
    out["load_average_end"] = os.getloadavg()[0]
    print(f"\nload average at the end {out['load_average_end']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
