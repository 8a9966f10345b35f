"""Serving commands of `python -m calculators`: simulate, batching, kv-alloc, queue (each with --json).

    python -m calculators simulate --model tinyllama --gpu a100 --requests 2000 --rate 50 --max-batch 32 --json
    python -m calculators simulate --trace requests.csv --policy static
    python -m calculators batching --model tinyllama --gpu a100 --tokens 300 --batches 1,8,32,128
    python -m calculators kv-alloc --requests 300 --rate 20 --pool-tokens 12000 --block-size 16
    python -m calculators queue --max-batch 1 --loads 0.3,0.5,0.7,0.9 --output-dist fixed

JSON keys are listed in docs/planner.md ("Serving simulators"). Bad input prints one line and exits with status 2.
"""
from __future__ import annotations

import argparse

from calculators.serving.batching import batch_curve, compute_critical_batch, kv_critical_batch, step_model_for
from calculators.serving.kv_allocation import POLICIES as ALLOC_POLICIES, compare_allocators
from calculators.cli.common import Parser, dtype_arg, load_gpu, load_model, positive_int, run_and_print
from calculators.sizing.latency import Efficiency
from calculators.serving.serving_sim import simulate
from calculators.serving.slo import goodput, load_sweep
from calculators.units import KV_DTYPES, WEIGHT_DTYPES
from calculators.serving.workload import ARRIVAL_KINDS, LENGTH_KINDS, load_trace, synthetic_workload

COMMANDS = ("simulate", "batching", "kv-alloc", "queue")


def _ints(s: str) -> list[int]:
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {s!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers of at least 1, got {s!r}")
    return v


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m calculators", description="Serving simulators and batching theory.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def common(sp, workload=True):
        sp.add_argument("--model", default="tinyllama", help="preset or path to a config.json (default tinyllama)")
        sp.add_argument("--gpu", "--device", dest="gpu", default="a100", help="device name (default a100)")
        sp.add_argument("--weight-dtype", type=dtype_arg(WEIGHT_DTYPES), default="bf16")
        sp.add_argument("--kv-dtype", type=dtype_arg(KV_DTYPES), default=None)
        sp.add_argument("--mbu", type=float, default=1.0, help="decode bandwidth utilisation (default 1 = ideal)")
        sp.add_argument("--mfu", type=float, default=1.0, help="compute utilisation (default 1 = ideal)")
        sp.add_argument("--overhead-ms", type=float, default=0.0, help="fixed cost per step (default 0)")
        sp.add_argument("--json", action="store_true", help="print JSON")
        if workload:
            sp.add_argument("--trace", default=None, help="CSV/JSONL with arrival_s,prompt_tokens,output_tokens")
            sp.add_argument("--requests", type=positive_int, default=1000)
            sp.add_argument("--rate", type=float, default=20.0, help="arrivals per second (default 20)")
            sp.add_argument("--arrivals", choices=ARRIVAL_KINDS, default="poisson")
            sp.add_argument("--burst-size", type=positive_int, default=8)
            sp.add_argument("--prompt-tokens", type=float, default=200, help="mean prompt length")
            sp.add_argument("--prompt-dist", choices=LENGTH_KINDS, default="fixed")
            sp.add_argument("--output-tokens", type=float, default=128, help="mean output length")
            sp.add_argument("--output-dist", choices=LENGTH_KINDS, default="exponential")
            sp.add_argument("--seed", type=int, default=0)

    s = sub.add_parser("simulate", help="static vs continuous batching on the same arrivals")
    common(s)
    s.add_argument("--policy", choices=("continuous", "static", "both"), default="both")
    s.add_argument("--max-batch", type=positive_int, default=32)
    s.add_argument("--chunk-tokens", type=positive_int, default=None, help="chunked prefill budget per step")
    s.add_argument("--kv-pool-tokens", type=positive_int, default=None, help="KV budget in token positions")
    s.add_argument("--batch-timeout", type=float, default=0.0, help="static: wait this long to fill a batch (s)")
    s.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    s.add_argument("--itl-slo-ms", type=float, default=None)
    b = sub.add_parser("batching", help="throughput and ITL vs batch; the critical batches")
    common(b, workload=False)
    b.add_argument("--tokens", type=positive_int, default=300, help="context per sequence (default 300)")
    b.add_argument("--batches", type=_ints, default=[1, 8, 32, 128, 256, 512])
    k = sub.add_parser("kv-alloc", help="reserve-for-max vs contiguous vs paged KV allocation")
    common(k)
    k.add_argument("--pool-tokens", type=positive_int, required=True, help="KV pool in token positions")
    k.add_argument("--block-size", type=positive_int, default=16)
    k.add_argument("--max-tokens", type=positive_int, default=None, help="reservation per request")
    k.add_argument("--grow-tokens", type=positive_int, default=16)
    k.add_argument("--max-batch", type=positive_int, default=None)
    q = sub.add_parser("queue", help="waits, p99 TTFT and goodput vs load (the simulator)")
    common(q)
    q.add_argument("--max-batch", type=positive_int, default=1)
    q.add_argument("--loads", type=_floats, default=[0.3, 0.5, 0.7, 0.9])
    q.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    q.add_argument("--itl-slo-ms", type=float, default=None)
    return p


def _step_model(a):
    c, dev = load_model(a.model), load_gpu(a.gpu)
    eff = Efficiency(decode_mbu=a.mbu, prefill_mfu=a.mfu)
    return c, step_model_for(c, dev, a.weight_dtype, a.kv_dtype, eff, a.overhead_ms)


def _workload(a, max_tokens):
    if a.trace:
        return load_trace(a.trace)
    return synthetic_workload(a.requests, a.rate, a.prompt_tokens, a.output_tokens, arrivals=a.arrivals,
                              burst_size=a.burst_size, prompt_kind=a.prompt_dist, output_kind=a.output_dist,
                              max_tokens=max_tokens, seed=a.seed)


def _finite(x: float) -> float | None:
    """JSON has no infinity: a critical batch that never comes is null."""
    return None if x == float("inf") else x


def run(a) -> dict:
    config, m = _step_model(a)
    out = dict(command=a.command, step_model=m.name, weight_bytes=m.weight_bytes,
               kv_bytes_per_token=m.kv_bytes_per_token)
    if a.command == "batching":
        out.update(context_tokens=a.tokens, rows=batch_curve(m, a.tokens, a.batches),
                   kv_critical_batch=_finite(kv_critical_batch(m, a.tokens)),
                   compute_critical_batch=_finite(compute_critical_batch(m, a.tokens)))
        return out
    w = _workload(a, config.max_position_embeddings)
    out["workload"] = w.source
    if a.command == "simulate":
        pols = ("continuous", "static") if a.policy == "both" else (a.policy,)
        for pol in pols:
            r = simulate(m, w, pol, a.max_batch, a.kv_pool_tokens, a.chunk_tokens if pol == "continuous" else None,
                         a.batch_timeout)
            out[pol] = {**r.summary(), **goodput(r, a.ttft_slo_ms, a.itl_slo_ms)}
    elif a.command == "kv-alloc":
        res = compare_allocators(w, a.pool_tokens, step_s=m.decode_step_ms(1, 0) / 1e3, block_size=a.block_size,
                                 max_tokens=a.max_tokens or config.max_position_embeddings,
                                 grow_tokens=a.grow_tokens, max_batch=a.max_batch)
        out.update({p: res[p].summary() for p in ALLOC_POLICIES})
    elif a.command == "queue":
        out["rows"] = load_sweep(m, a.loads, n=a.requests, prompt_mean=a.prompt_tokens, output_mean=a.output_tokens,
                                 max_batch=a.max_batch, prompt_kind=a.prompt_dist, output_kind=a.output_dist,
                                 ttft_slo_ms=a.ttft_slo_ms, tpot_slo_ms=a.itl_slo_ms, seed=a.seed)
    return out


def _render(out: dict) -> str:
    lines = [f"{out['command']}: {out['step_model']}"]
    for k, v in out.items():
        if k in ("command", "step_model"):
            continue
        if isinstance(v, dict):
            lines.append(f"  {k}:")
            lines += [f"    {kk:<26} {_short(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list):
            lines.append(f"  {k}:")
            lines += ["    " + ", ".join(f"{kk}={_short(vv)}" for kk, vv in row.items()) for row in v]
        else:
            lines.append(f"  {k:<28} {_short(v)}")
    return "\n".join(lines)


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv: list[str]) -> int:
    return run_and_print(run, _render, build_parser().parse_args(argv))
