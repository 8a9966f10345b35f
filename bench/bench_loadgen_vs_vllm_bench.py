"""Our load generator (`server.loadgen`, what `python -m server measure` and the Measure-a-server page run) next to
an established one, vLLM's `vllm bench serve`, on the same server, same concurrency, same prompt and output
lengths (random prompts, ignore_eos), rounds interleaved (which goes first alternates): TTFT, ITL p50/p99 and
output tokens/s of each, and ours ÷ theirs (median over rounds, with the range).

    VLLM_PYTHON=/path/to/vllm-venv/bin/python VLLM_MODEL_DIR=/path/to/smollm2-f32-hf \
        .venv/bin/python bench/bench_loadgen_vs_vllm_bench.py --concurrency 1,4,8 --requests 16 --rounds 2
    VLLM_URL=http://127.0.0.1:8000 ...          # a vLLM already running (tools/vllm_server.py), not started here
    ... --fake-ttft-ms 200 --fake-itl-ms 20     # both against the tests' fake server: the truth is the script

`vllm bench serve` runs with VLLM_PYTHON (it needs vLLM and the model's tokenizer); our generator sizes its prompts
with two probe requests to the server instead.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.loadgen import SweepPlan, Target, measure                      # noqa: E402
from tools.vllm_server import vllm_paths, vllm_server                      # noqa: E402

METRICS = (("ttft_p50_ms", "median_ttft_ms"), ("ttft_p99_ms", "p99_ttft_ms"), ("itl_p50_ms", "median_itl_ms"),
           ("itl_p99_ms", "p99_itl_ms"), ("e2e_p50_ms", "median_e2el_ms"), ("output_tok_s", "output_throughput"))


def ours(url: str, model: str, c: int, args, seed: int) -> dict:
    res = measure(Target(url, model), SweepPlan((c,), requests=args.requests, prompt_tokens=args.prompt_tokens,
                                                output_tokens=args.output_tokens, seed=seed))
    if res.error:
        raise SystemExit(f"our sweep failed: {res.error}")
    row = res.rows()[0]
    return {k: row[k] for k, _ in METRICS} | dict(prompt_tokens=row["mean_prompt_tokens"],
                                                  output_tokens=row["mean_output_tokens"])


def theirs(python: Path, url: str, model: str, tokenizer: Path, c: int, args, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cmd = [str(python), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
               "--base-url", url, "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer),
               "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
               "--random-output-len", str(args.output_tokens), "--random-range-ratio", "0",
               "--num-prompts", str(args.requests), "--max-concurrency", str(c), "--request-rate", "inf",
               "--ignore-eos", "--num-warmups", "0", "--seed", str(seed), "--disable-tqdm",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--result-dir", d, "--result-filename", "r.json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                           env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))
        if p.returncode != 0:
            raise SystemExit(f"vllm bench serve failed ({p.returncode}):\n{p.stderr[-3000:]}")
        r = json.loads((Path(d) / "r.json").read_text())
    n = max(r["completed"], 1)
    return {ours_k: r[k] for ours_k, k in METRICS} | dict(prompt_tokens=r["total_input_tokens"] / n,
                                                         output_tokens=r["total_output_tokens"] / n)


FAKE = """
import sys, time
sys.path.insert(0, {tests!r})
from helpers_fake_openai import FakeOpenAIServer, Script
with FakeOpenAIServer(Script(ttft_s={ttft}, itl_s={itl}, model="smollm2", prompt_fixed=0)) as srv:
    print(srv.url, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def fake_server(args):
    """The tests' scripted server in its own process (so it shares no GIL with the client measuring it)."""
    code = FAKE.format(tests=str(ROOT / "tests"), ttft=args.fake_ttft_ms / 1e3, itl=args.fake_itl_ms / 1e3)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip(), "smollm2"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def fmt_range(v: list[float]) -> str:
    return f"{np.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None, help="write every measurement to this file")
    ap.add_argument("--fake-ttft-ms", type=float, default=None, help="measure the tests' scripted fake server")
    ap.add_argument("--fake-itl-ms", type=float, default=20.0)
    args = ap.parse_args()
    python, tok = vllm_paths()                   # vllm bench serve's python, and the tokenizer it needs
    levels = [int(x) for x in args.concurrency.split(",")]
    runs: dict = {c: {"ours": [], "vllm": []} for c in levels}
    with (fake_server(args) if args.fake_ttft_ms is not None else vllm_server()) as (url, model):
        measure(Target(url, model), SweepPlan((1,), requests=2, prompt_tokens=16, output_tokens=4))    # warm up
        for rnd in range(args.rounds):
            for c in levels:
                order = ("ours", "vllm") if (rnd + c) % 2 == 0 else ("vllm", "ours")
                for who in order:
                    r = ours(url, model, c, args, rnd) if who == "ours" else \
                        theirs(python, url, model, tok, c, args, rnd)
                    runs[c][who].append(r)
                    print(f"round {rnd} c={c} {who}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()),
                          flush=True)
    print(f"\n{args.requests} requests per level, prompt {args.prompt_tokens} / output {args.output_tokens} "
          f"tokens, {args.rounds} rounds; ours ÷ vLLM bench: median (range)")
    print("| c | metric | ours (median) | vllm bench serve (median) | ours ÷ theirs |")
    print("|---:|---|---:|---:|---:|")
    for c in levels:
        for k, _ in METRICS + (("prompt_tokens", None), ("output_tokens", None)):
            a = [r[k] for r in runs[c]["ours"]]
            b = [r[k] for r in runs[c]["vllm"]]
            ratio = [x / y for x, y in zip(a, b) if y]
            print(f"| {c} | {k} | {np.median(a):.1f} | {np.median(b):.1f} | {fmt_range(ratio) if ratio else '-'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
