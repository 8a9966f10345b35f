"""`python -m server measure`: a load sweep against any OpenAI-compatible server, printed as a table or JSON, and
(with --predict-model) the calculators' prediction for the same load, the fitted efficiencies and how much
closer they get.

    python -m server measure --url http://127.0.0.1:8000 --model smollm2 --concurrency 1,4,8 --requests 16 \
        --prompt-tokens 128 --output-tokens 64 [--api chat] [--rate 0.5,1,2] [--json]
        [--predict-model smollm2-135m --gpu this-machine --weight-dtype fp32]

A problem the user can fix (unreachable URL, not an OpenAI server, unknown model, bad numbers) prints one line on
stderr and exits with status 2; a server that dies mid-sweep prints the levels measured and the reason (exit 1).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading

from server.loadgen import APIS, LoadError, SweepPlan, Target, measure, parse_levels
from specs.model_config import SpecError

SHOWN = (("level", "{:g}"), ("completed", "{}"), ("ttft_p50_ms", "{:.1f}"), ("ttft_p99_ms", "{:.1f}"),
         ("itl_p50_ms", "{:.1f}"), ("itl_p99_ms", "{:.1f}"), ("e2e_p50_ms", "{:.0f}"), ("e2e_p99_ms", "{:.0f}"),
         ("output_tok_s", "{:.1f}"))


class _Parser(argparse.ArgumentParser):
    def error(self, message):                      # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def add_measure_parser(sub) -> None:
    m = sub.add_parser("measure", help="load-test an OpenAI-compatible server (TTFT, ITL, latency, tokens/s)")
    m.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000 (with or without /v1)")
    m.add_argument("--model", required=True, help="the served model name (as /v1/models lists it)")
    m.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    m.add_argument("--api", choices=APIS, default="completions", help="/v1/completions (default) or chat")
    load = m.add_mutually_exclusive_group()
    load.add_argument("--concurrency", default=None, help="concurrency levels, e.g. 1,4,8 (default 1,4)")
    load.add_argument("--rate", default=None, help="request rates in requests/s, e.g. 0.5,1,2 (Poisson arrivals)")
    m.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    m.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default 128)")
    m.add_argument("--output-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    m.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request (default 300)")
    m.add_argument("--level-timeout", type=float, default=600.0, help="seconds per level (default 600)")
    m.add_argument("--seed", type=int, default=0)
    p = m.add_argument_group("prediction (optional): the calculators for the same load, then the fitted model")
    p.add_argument("--predict-model", default=None, help="preset or config.json of the served model")
    p.add_argument("--gpu", default="this-machine", help="device preset, or this-machine (measured; default)")
    p.add_argument("--weight-dtype", default="bf16", help="the served weights' precision (default bf16)")
    p.add_argument("--kv-dtype", default=None, help="KV cache precision (default: follows the weights)")
    p.add_argument("--overhead-ms", type=float, default=0.0, help="per-step overhead of the default prediction")
    p.add_argument("--server-max-batch", type=int, default=256, help="the server's running-request cap (rate)")
    m.add_argument("--json", action="store_true", help="print one JSON object")


def _plan(args) -> SweepPlan:
    mode = "rate" if args.rate is not None else "concurrency"
    levels = parse_levels(args.rate if args.rate is not None else (args.concurrency or "1,4"))
    return SweepPlan(levels=levels, mode=mode, requests=args.requests, prompt_tokens=args.prompt_tokens,
                     output_tokens=args.output_tokens, request_timeout_s=args.request_timeout,
                     level_timeout_s=args.level_timeout, seed=args.seed)


def _prediction(args, rows: list[dict]) -> dict | None:
    if not args.predict_model:
        return None
    from calculators.cli.common import load_gpu, load_model
    from calculators.planning.measured_sweep import compare_sweep, level_from_summary
    from calculators.units import dtype_name
    levels = [level_from_summary(r) for r in rows if r.get("completed")]
    cmp = compare_sweep(load_model(args.predict_model), load_gpu(args.gpu), levels, dtype_name(args.weight_dtype),
                        dtype_name(args.kv_dtype) if args.kv_dtype else None, overhead_ms=args.overhead_ms,
                        server_max_batch=args.server_max_batch)
    return cmp


def _progress(done: int, total: int, label: str) -> None:
    if sys.stderr.isatty():
        print(f"\r[{done}/{total}] {label}".ljust(60), end="", file=sys.stderr, flush=True)


def _print_table(result, pred) -> None:
    t = result.target
    print(f"{t.model} at {t.url} ({t.api}), {result.plan.mode} sweep, {result.plan.requests} requests per level, "
          f"prompt {result.plan.prompt_tokens} / output {result.plan.output_tokens} tokens asked")
    print("  ".join(f"{k:>12}" for k, _ in SHOWN))
    for row in result.rows():
        print("  ".join(f"{('-' if row[k] is None else f.format(row[k])):>12}" for k, f in SHOWN))
    if pred:
        for w in pred["warnings"]:
            print(f"warning: {w}")
        mae = pred["mean_abs_error_percent"]
        print(f"fitted: decode MBU {pred['decode_mbu']:.3f}, prefill MFU {pred['prefill_mfu']:.3f}, overhead "
              f"{pred['overhead_ms']:.2f} ms per step")
        for m in ("ttft_ms", "itl_ms", "e2e_ms", "output_tok_s"):
            print(f"  {m:>13}: mean |error| {mae['predicted_' + m]:7.1f}% default -> {mae['fitted_' + m]:7.1f}% "
                  "fitted")


def run_measure(args) -> int:
    target = Target(args.url, args.model, args.api_key, args.api)
    plan = _plan(args)
    stop = threading.Event()
    try:
        result = measure(target, plan, on_progress=_progress, stop=stop)
    except KeyboardInterrupt:
        stop.set()
        print("\nstopped", file=sys.stderr)
        return 1
    if sys.stderr.isatty():
        print(file=sys.stderr)
    pred = _prediction(args, result.rows()) if result.levels else None
    if args.json:
        out = result.to_json()
        if pred is not None:
            out["prediction"] = pred
        print(json.dumps(out, indent=2, default=str))
    else:
        _print_table(result, pred)
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    p = _Parser(prog="python -m server", description="Clients of real serving stacks.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_measure_parser(sub)
    args = p.parse_args(argv)
    try:
        return run_measure(args)
    except (LoadError, SpecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
