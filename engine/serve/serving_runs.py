"""Real engine runs behind the serving lessons and bench/bench_scheduler.py: each function builds its own
Scheduler (nothing shared between callers), runs a small workload and returns measured numbers in a dict.

- `requests_run`: given prompts, all at once, greedy, EOS ignored -> tokens/s with prefill, decode tokens/s.
- `streams_run`: N concurrent greedy streams of random prompts -> decode tokens/s (weights read once per step).
- `batching_run`: `streams_run` and `weight_products_run` at 1, 2, 4 ... streams, each as a gain over one.
- `chunked_prefill_run`: a long prompt arrives while others decode -> the decoders' inter-token latency.
- `prefix_cache_run`: the same system prompt twice -> prefill tokens and TTFT of the second request.
- `speculative_run`: plain greedy vs speculative decoding on the same prompt -> α, draft cost, speedup.
- `weight_products_run`: one decode step's weight products alone for N rows -> the most any scheduler can gain
  from batching on this machine's BLAS.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from engine.model import ops
from engine.errors import ModelError
from engine.model.model import Model
from engine.serve.scheduler import Scheduler, StepReport
from engine.serve.speculative import PromptLookup, speculative_generate


def random_prompts(model: Model, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `length` token ids drawn uniformly (content does not change timing)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, model.config.vocab_size, length)] for _ in range(n)]


def decode_tokens_per_s(reports: Sequence[StepReport]) -> float:
    """Tokens per second over the steps that only decoded (no prefill chunk in them)."""
    decode = [r for r in reports if r.decoded and not r.prefilled]
    seconds = sum(r.seconds for r in decode)
    if not decode or seconds <= 0:
        raise ModelError("no decode-only step to measure: ask for at least 2 new tokens")
    return sum(r.tokens_produced for r in decode) / seconds


def weight_matrices(model: Model) -> list[np.ndarray]:
    """Every matrix a decode step multiplies by, in order: each layer's QKV, O, gate/up and down, then the LM head."""
    w = model.weights
    return [m for lw in w.layers for m in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)] + [w.lm_head]


def weight_products_run(model: Model, rows: int, repeats: int = 3) -> dict:
    """One decode step's weight products and nothing else, for `rows` sequences, through the engine's own
    `ops.matmul_t` (median of `repeats` after a warm-up): what a step would cost with zero scheduling overhead
    and free attention. rows · t(1) / t(rows) bounds the tokens/s gain of batching on this machine's BLAS."""
    mats = weight_matrices(model)
    rng = np.random.default_rng(rows)
    inputs = [rng.standard_normal((rows, 1, m.shape[1]), dtype=np.float32) for m in mats]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for m, x in zip(mats, inputs):
            ops.matmul_t(x, m)
        times.append(time.perf_counter() - t0)
    seconds = float(np.median(times[1:]))
    flops = 2.0 * rows * sum(m.size for m in mats)
    return dict(rows=rows, products_ms=1e3 * seconds, flops=flops, gflop_s=flops / seconds / 1e9)


def requests_run(model: Model, prompts: Sequence[Sequence[int]], new_tokens: int) -> dict:
    """Every prompt submitted at once as a greedy request of `new_tokens` tokens (EOS ignored) to one Scheduler
    with room for all of them; timed from the first step to the last token, prefill included. What the Batching
    page, bench/bench_scheduler.py and bench/bench_vs_vllm.py (against vLLM at the same concurrency) measure.
    -> tokens/s end to end, decode-only tokens/s and step time, and each request's token ids."""
    s = Scheduler(model, block_size=16, max_batch=len(prompts))
    requests = [s.submit(p, max_new_tokens=new_tokens, stop_at_eos=False) for p in prompts]
    t0 = time.perf_counter()
    reports = s.run()
    seconds = time.perf_counter() - t0
    decode = [r for r in reports if r.decoded and not r.prefilled]
    return dict(streams=len(prompts), decode_tokens_per_s=decode_tokens_per_s(reports),
                decode_step_ms=1e3 * sum(r.seconds for r in decode) / len(decode),
                end_to_end_tokens_per_s=sum(len(r.token_ids) for r in requests) / seconds, seconds=seconds,
                token_ids=[list(r.token_ids) for r in requests])


def streams_run(model: Model, streams: int, prompt_len: int = 8, new_tokens: int = 8) -> dict:
    """`requests_run` on `streams` random prompts of `prompt_len` tokens."""
    return requests_run(model, random_prompts(model, streams, prompt_len, seed=streams), new_tokens)


BATCHING_ROUNDS = 3   # `batching_run` measures every stream count this many times, rounds interleaved (median)


def batching_run(model: Model, counts: Sequence[int], prompt_len: int = 8, new_tokens: int = 8,
                 rounds: int | None = None) -> list[dict]:
    """At each stream count n (the first must be 1): the scheduler's decode tokens/s (`streams_run`) and the
    step's weight products alone (`weight_products_run`), each as a gain over one stream:
        gain    = tokens/s(n) / tokens/s(1)              measured through the scheduler
        ceiling = n · t_products(1) / t_products(n)      the most batching can give on this machine's BLAS
    Every count is measured once per round, rounds interleaved (a busy second on a shared machine slows all counts
    alike); each ratio pairs a round with the same round's one stream, and the median over rounds is reported."""
    counts = [int(n) for n in counts]
    if not counts or counts[0] != 1:
        raise ModelError("the stream counts must start at 1 (every gain is measured against one stream)")
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    products: dict[int, list[dict]] = {n: [] for n in counts}
    for _ in range(rounds or BATCHING_ROUNDS):
        for n in counts:
            runs[n].append(streams_run(model, n, prompt_len=prompt_len, new_tokens=new_tokens))
            products[n].append(weight_products_run(model, n, repeats=1))
    rows = []
    for n in counts:
        ms = float(np.median([w["products_ms"] for w in products[n]]))
        rows.append(dict(
            streams=n, decode_tokens_per_s=float(np.median([r["decode_tokens_per_s"] for r in runs[n]])),
            decode_step_ms=float(np.median([r["decode_step_ms"] for r in runs[n]])),
            weight_products_ms=ms, products_gflop_s=products[n][0]["flops"] / ms / 1e6,
            **_median_and_range("gain", [r["decode_tokens_per_s"] / one["decode_tokens_per_s"]
                                         for one, r in zip(runs[counts[0]], runs[n])]),
            ceiling=float(np.median([n * one["products_ms"] / w["products_ms"]
                                     for one, w in zip(products[counts[0]], products[n])]))))
    return rows


def _median_and_range(name: str, values: list[float]) -> dict:
    return {name: float(np.median(values)), f"{name}_min": float(min(values)), f"{name}_max": float(max(values))}


def chunked_prefill_run(model: Model, long_prompt_len: int, chunk_size: int | None, decoders: int = 4,
                        new_tokens: int = 16) -> dict:
    """`decoders` requests start decoding; after 3 steps a long prompt arrives. Their ITL, and its TTFT."""
    s = Scheduler(model, block_size=16, max_batch=decoders + 1, chunk_size=chunk_size)
    running = [s.submit(p, max_new_tokens=new_tokens, stop_at_eos=False)
               for p in random_prompts(model, decoders, 8, seed=7)]
    for _ in range(3):
        s.step()
    long_req = s.submit(random_prompts(model, 1, long_prompt_len, seed=99)[0], max_new_tokens=2, stop_at_eos=False)
    reports = s.run()
    itl = np.array([x for r in running for x in r.itl_s]) * 1e3
    return dict(chunk_size=chunk_size, long_prompt_len=long_prompt_len, itl_p50_ms=float(np.median(itl)),
                itl_p99_ms=float(np.percentile(itl, 99)), itl_max_ms=float(itl.max()),
                long_prompt_ttft_ms=1e3 * long_req.ttft_s,
                padded_tokens=sum(r.padded_tokens for r in reports),
                forward_tokens=sum(r.forward_tokens for r in reports))


def chunked_prefill_repeats(model: Model, long_prompt_len: int, chunk_size: int, decoders: int = 4,
                            new_tokens: int = 16, repeats: int = 3) -> list[dict]:
    """`chunked_prefill_run` whole and chunked, `repeats` times interleaved (a busy second slows both alike): per
    case the median of each timing, and `itl_max_spread`, the range of the worst gap over its median."""
    runs: dict = {None: [], chunk_size: []}
    for _ in range(max(1, int(repeats))):
        for c in runs:
            runs[c].append(chunked_prefill_run(model, long_prompt_len, c, decoders=decoders, new_tokens=new_tokens))
    out = []
    for c, rs in runs.items():
        row = dict(rs[0])
        for k in ("itl_p50_ms", "itl_p99_ms", "itl_max_ms", "long_prompt_ttft_ms"):
            row[k] = float(np.median([r[k] for r in rs]))
        worst = [r["itl_max_ms"] for r in rs]
        row["itl_max_spread"] = (max(worst) - min(worst)) / row["itl_max_ms"] if row["itl_max_ms"] > 0 else 0.0
        row["repeats"] = len(rs)
        out.append(row)
    return out


def prefix_cache_run(model: Model, system_len: int, question_len: int = 8, prefix_caching: bool = True) -> dict:
    """Two requests sharing a system prompt, one after the other; what the second one had to prefill."""
    system = random_prompts(model, 1, system_len, seed=11)[0]
    first, second = (system + q for q in random_prompts(model, 2, question_len, seed=12))
    s = Scheduler(model, block_size=16, max_batch=2, prefix_caching=prefix_caching)
    s.submit(first, max_new_tokens=1, stop_at_eos=False)
    s.run()
    before = s.prefill_tokens_computed
    req = s.submit(second, max_new_tokens=1, stop_at_eos=False)
    s.run()
    return dict(prefix_caching=prefix_caching, prompt_tokens=len(second),
                prefill_tokens=s.prefill_tokens_computed - before, cached_tokens=req.prefix_cached_tokens,
                ttft_ms=1e3 * req.ttft_s)


def speculative_run(target: Model, draft: "Model | PromptLookup", prompt: Sequence[int], max_new_tokens: int = 24,
                    draft_tokens: int = 4) -> dict:
    """Plain greedy and speculative decoding of the same prompt, timed back to back. The inputs of the
    formula's prediction are measured here: α, and the draft's cost per step as a fraction c of a target step."""
    t0 = time.perf_counter()
    plain = list(target.generate(prompt, max_new_tokens=max_new_tokens, stop_at_eos=False))
    plain_s = time.perf_counter() - t0
    step_s = float(np.mean([t.seconds for t in plain[1:]])) if len(plain) > 1 else float("nan")
    res = speculative_generate(target, draft, prompt, max_new_tokens=max_new_tokens, draft_tokens=draft_tokens,
                               stop_at_eos=False)
    return dict(draft_layers=draft.config.num_layers if isinstance(draft, Model) else 0, draft_tokens=draft_tokens,
                identical=res.token_ids == [t.token_id for t in plain],
                acceptance_rate=res.acceptance_rate, alpha=res.alpha, tokens_per_pass=res.tokens_per_pass,
                draft_cost_ratio=(res.draft_seconds / res.draft_steps) / step_s if res.draft_steps else float("nan"),
                verify_cost_ratio=(res.verify_seconds / res.rounds) / step_s if res.rounds else float("nan"),
                plain_s=plain_s, speculative_s=res.seconds, speedup_measured=plain_s / res.seconds)


def kv_layers_run(model: Model, tokens: int, chunk_size: int = 512, seed: int = 0) -> dict:
    """Prefill `tokens` random token ids and report the cache each layer holds: the measurement beside the
    calculators' per-kind formula (a sliding-window layer keeps its last W positions, a full layer all)."""
    ids = random_prompts(model, 1, tokens, seed)[0]
    cache = model.new_cache(1, tokens)
    t0 = time.perf_counter()
    model.prefill(ids, cache, chunk_size=chunk_size)
    return dict(tokens=tokens, bytes_per_layer=cache.bytes_per_layer(), bytes_used=cache.bytes_used(),
                positions_held=[int(cache.held(li)[0]) for li in range(model.config.num_layers)],
                seconds=time.perf_counter() - t0)
