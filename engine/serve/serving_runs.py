"""Real engine runs behind the serving lessons and bench/bench_scheduler.py: each function builds its own
Scheduler (nothing shared between callers), runs a small workload and returns measured numbers in a dict.

- `requests_run`: given prompts, all at once, greedy, EOS ignored -> tokens/s with prefill, decode tokens/s.
- `streams_run`: N concurrent greedy streams of random prompts -> decode tokens/s (weights read once per step).
- `batching_run`: `streams_run` and `plain_products_run` at 1, 2, 4 ... streams, each as a gain over one.
- `chunked_prefill_run`: a long prompt arrives while others decode -> the decoders' inter-token latency.
- `prefix_cache_run`: the same system prompt twice -> prefill tokens and TTFT of the second request.
- `speculative_run`: plain greedy vs speculative decoding on the same prompt -> α, draft cost, speedup.
- `plain_products_run`: one decode step's weight products alone for N rows, in plain NumPy -> the most any
  scheduler can gain from batching on this machine's BLAS.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from engine import threads as blas_threads
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


def _product_forms(rows: int) -> tuple:
    """Plain NumPy's ways to write a row block x [rows, in] times a weight matrix W [out, in]: one row, a matvec;
    more rows, x @ Wᵀ and W @ xᵀ (BLAS is faster one way or the other depending on how W lies in memory)."""
    if rows == 1:
        return (lambda W, x: W @ x[0],)
    return (lambda W, x: x @ W.T, lambda W, x: W @ x.T)


def _sweep(model: Model, mats: list, inputs: list, forms: list) -> list[float]:
    """Every matrix times its input once, in a step's order (so each comes from memory, as in a step), with the BLAS
    threads the engine would use for a pass of that many rows.   -> seconds per matrix"""
    blas_threads.tick(inputs[0].shape[0], model.weight_matrices)
    times = []
    for m, x, form in zip(mats, inputs, forms):
        t0 = time.perf_counter()
        form(m, x)
        times.append(time.perf_counter() - t0)
    return times


def _inputs(mats: list, rows: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rows)
    return [rng.standard_normal((rows, m.shape[1]), dtype=np.float32) for m in mats]


def fastest_forms(model: Model, rows: int) -> list:
    """Per matrix of `weight_matrices`, its faster form of `_product_forms` at `rows` rows (each form swept twice,
    the second sweep timed)."""
    mats = weight_matrices(model)
    candidates = _product_forms(rows)
    if len(candidates) == 1:
        return list(candidates) * len(mats)
    x = _inputs(mats, rows)
    timed = [[_sweep(model, mats, x, [f] * len(mats)) for _ in range(2)][1] for f in candidates]
    return [candidates[int(np.argmin(t))] for t in zip(*timed)]


def plain_products_run(model: Model, rows: int, pairs: int = 3, forms: list | None = None) -> dict:
    """One decode step's weight products and nothing else, in plain NumPy (not the engine's own `ops`, so no
    choice of the engine moves it), for `rows` rows against one row: what a step would cost with no attention, no
    scheduler and no per-sequence work. Each matrix of `weight_matrices` takes its faster form (`forms`, from
    `fastest_forms` unless given); then `pairs` sweeps of one row and of `rows` rows, side by side in alternating
    order, each pair giving
        ceiling = rows · t(1) / t(rows),
    the most batching can gain on this machine's BLAS (median over pairs, with its range)."""
    mats = weight_matrices(model)
    inputs = {n: _inputs(mats, n) for n in {1, rows}}
    forms = {1: fastest_forms(model, 1), rows: forms or fastest_forms(model, rows)}
    seconds: dict[int, list[float]] = {1: [], rows: []}
    for k in range(pairs):
        for n in ((1, rows) if k % 2 == 0 else (rows, 1)):
            seconds[n].append(sum(_sweep(model, mats, inputs[n], forms[n])))
    ms = 1e3 * float(np.median(seconds[rows]))
    flops = 2.0 * rows * sum(m.size for m in mats)
    return dict(rows=rows, products_ms=ms, one_row_ms=1e3 * float(np.median(seconds[1])), flops=flops,
                gflop_s=flops / ms / 1e6, threads=blas_threads.status().threads,
                **_median_and_range("ceiling", [rows * t1 / tn for t1, tn in zip(seconds[1], seconds[rows])]))


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


BATCHING_ROUNDS = 3   # `batching_run` measures every stream count this many times (median of the rounds' ratios)


def paired_streams_run(model: Model, streams: int, prompt_len: int = 8, new_tokens: int = 8) -> dict:
    """One stream and `streams` streams decoding side by side: two Schedulers (random prompts of `prompt_len`
    tokens, `new_tokens` greedy tokens each), stepped in turn, the order flipped every step. Each decode-only step
    of the many is paired with the one's step next to it, which met the same moment of the machine:
        gain = streams · t_step(1) / t_step(streams), the median over pairs (with its range).
    -> gain, gain_min, gain_max, and each side's decode tokens/s and step time (medians)."""
    sides = {n: Scheduler(model, block_size=16, max_batch=n) for n in (1, streams)}
    for n, s in sides.items():
        for p in random_prompts(model, n, prompt_len, seed=n):
            s.submit(p, max_new_tokens=new_tokens, stop_at_eos=False)
    steps: dict[int, list[float]] = {1: [], streams: []}
    k = 0
    while any(s.has_work for s in sides.values()):
        for n in ((1, streams) if k % 2 == 0 else (streams, 1)):
            if sides[n].has_work:
                r = sides[n].step()
                if r.decoded and not r.prefilled:
                    steps[n].append(r.seconds)
        k += 1
    pairs = list(zip(steps[1], steps[streams]))
    if not pairs:
        raise ModelError("no decode step to measure: ask for at least 2 new tokens")
    one, many = (float(np.median(steps[n])) for n in (1, streams))
    return dict(streams=streams, decode_tokens_per_s=streams / many, decode_step_ms=1e3 * many,
                one_tokens_per_s=1 / one, one_step_ms=1e3 * one,
                **_median_and_range("gain", [streams * t1 / tn for t1, tn in pairs]))


def batching_run(model: Model, counts: Sequence[int], prompt_len: int = 8, new_tokens: int = 8,
                 rounds: int | None = None) -> list[dict]:
    """At each stream count n (the first must be 1): the scheduler's decode tokens/s against one stream's, step by
    step (`paired_streams_run`), and the step's weight products alone in plain NumPy at n rows against one row
    (`plain_products_run`):
        gain    = tokens/s(n) / tokens/s(1)              measured through the scheduler
        ceiling = n · t_products(1) / t_products(n)      the most batching can give on this machine's BLAS
        share   = gain / ceiling                         how much of that the scheduler reached
    A busy second on a shared machine slows whatever runs in it, so every ratio pairs runs made side by side, and
    the products of a round come right after its streams; each count is measured in every round, and the median
    over rounds is reported with the range."""
    counts = [int(n) for n in counts]
    if not counts or counts[0] != 1:
        raise ModelError("the stream counts must start at 1 (every gain is measured against one stream)")
    runs: dict[int, list[tuple[dict, dict]]] = {n: [] for n in counts[1:]}
    forms = {n: fastest_forms(model, n) for n in counts[1:]}
    ones = []
    for _ in range(rounds or BATCHING_ROUNDS):
        for n in counts[1:]:
            runs[n].append((paired_streams_run(model, n, prompt_len=prompt_len, new_tokens=new_tokens),
                            plain_products_run(model, n, forms=forms[n])))
        if len(counts) == 1:
            ones.append(streams_run(model, 1, prompt_len=prompt_len, new_tokens=new_tokens))
    ones += [dict(decode_tokens_per_s=pair["one_tokens_per_s"], decode_step_ms=pair["one_step_ms"])
             for rs in runs.values() for pair, _ in rs]
    rows = [dict(streams=1, decode_tokens_per_s=float(np.median([r["decode_tokens_per_s"] for r in ones])),
                 decode_step_ms=float(np.median([r["decode_step_ms"] for r in ones])),
                 **{k: 1.0 for k in ("gain", "gain_min", "gain_max", "ceiling", "ceiling_min", "ceiling_max",
                                     "share", "share_min", "share_max")})]
    for n in counts[1:]:
        gains = [pair["gain"] for pair, _ in runs[n]]
        ceilings = [products["ceiling"] for _, products in runs[n]]
        rows.append(dict(
            streams=n, decode_tokens_per_s=float(np.median([pair["decode_tokens_per_s"] for pair, _ in runs[n]])),
            decode_step_ms=float(np.median([pair["decode_step_ms"] for pair, _ in runs[n]])),
            **_median_and_range("gain", gains), **_median_and_range("ceiling", ceilings),
            **_median_and_range("share", [g / c for g, c in zip(gains, ceilings)])))
    flops_per_row = 2.0 * sum(m.size for m in weight_matrices(model))
    one_row = [p["one_row_ms"] for rs in runs.values() for _, p in rs]
    for r in rows:                                                   # the products' own time and speed
        n = r["streams"]
        ms = float(np.median((one_row if n == 1 else [p["products_ms"] for _, p in runs[n]]) or [np.nan]))
        r["weight_products_ms"], r["products_gflop_s"] = ms, n * flops_per_row / ms / 1e6
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
