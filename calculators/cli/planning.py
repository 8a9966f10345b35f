"""Planning commands of `python -m calculators`: throughput (the maximum throughput of a deployment).

    python -m calculators throughput --model llama-3-70b --gpu h100 --gpus 8 --tp 2 --weight-dtype fp8 \\
        --kv-dtype fp8 --prompt-tokens 1000 --output-tokens 1000 --stack trtllm --json

Every request queued at once, fixed lengths (what `trtllm-bench throughput` and `vllm bench throughput` report):
output_tok_s, total_tok_s, max_batch, step_ms and what binds (the batch: KV memory or the stack's scheduler
limits; the step: bandwidth, compute or communication). Bad input prints one line and exits with status 2.
"""
from __future__ import annotations

import argparse

from calculators.cli.common import (Parser, add_profile_arg, dtype_arg, load_gpu, load_model, nonneg_float, nonneg_int,
                                    positive_int, profile_of, run_and_print)
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.accuracy import band
from calculators.planning.rank_wait import attention_dp_ranks
from calculators.planning.step import borrowed
from calculators.planning.throughput import max_throughput
from calculators.planning.trtllm_bench import trtllm_bench_caps
from calculators.sizing.roofline import compute_precision_for
from calculators.units import KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype, fmt_num
from specs.devices import GiB
from specs.model_config import SpecError
from specs.stacks import list_stacks, load_stack

COMMANDS = ("throughput", "ops")
CAPS_RULES = ("stack", "trtllm-bench", "vllm-bench")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m calculators throughput", description="Maximum throughput of a deployment: every "
               "request queued, fixed prompt and output lengths.")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--model", required=True, help="preset name or a path to a Hugging Face config.json")
    p.add_argument("--gpu", "--device", dest="gpu", required=True, help="device name from specs/devices.json")
    p.add_argument("--gpus", type=positive_int, default=None, help="GPUs in all (default tp × pp; the rest are "
                   "data-parallel replicas)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel stages (default 1)")
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel degree, MoE only (default 1)")
    p.add_argument("--weight-dtype", type=dtype_arg(WEIGHT_DTYPES), default="bf16")
    p.add_argument("--kv-dtype", type=dtype_arg(KV_DTYPES), default=None, help="default: the weights' float format")
    p.add_argument("--prompt-tokens", type=positive_int, required=True, help="input tokens per request")
    p.add_argument("--output-tokens", type=positive_int, required=True, help="output tokens per request")
    p.add_argument("--stack", default=None, help=f"serving stack: {', '.join(list_stacks())} (default vllm), "
                   "or a named build of one (vllm@amd-mlperf-5.1)")
    p.add_argument("--gpu-memory-utilization", type=nonneg_float, default=None,
                   help="fraction of each GPU the server may use (default: the stack's, 0.9 for vLLM)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="scheduler cap on sequences "
                   "(default: the stack's)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="scheduler cap on tokens per step (default: the stack's)")
    p.add_argument("--caps", choices=CAPS_RULES, default="stack",
                   help="where the scheduler caps come from when not given: the stack's server defaults (stack), "
                        "the upper bounds `trtllm-bench throughput` picks for itself from the lengths and the "
                        "memory (trtllm-bench; its KV fraction is --gpu-memory-utilization, default 0.9), or the "
                        "defaults of vLLM's LLM class that `vllm bench throughput` runs (vllm-bench: 16,384 "
                        "tokens a step on a GPU of 70 GiB or more, not an A100, where the server takes 8,192)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def scheduler_caps(args, c, dev, mesh, kd) -> dict:
    """The caps given on the command line; the rest from `--caps` (the stack's defaults: none passed)."""
    given = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    if args.caps == "trtllm-bench":
        if load_stack(args.stack).key != "trtllm":
            raise SpecError("--caps trtllm-bench are the caps TensorRT-LLM's benchmark picks: use it with --stack "
                            "trtllm")
        rule = trtllm_bench_caps(c, dev, mesh.tp, mesh.pp, args.prompt_tokens, args.output_tokens,
                                 args.weight_dtype, kd, args.gpu_memory_utilization or 0.9)
        given = {k: v if v is not None else rule[k] for k, v in given.items()}
    elif args.caps == "vllm-bench":
        stack = load_stack(args.stack)
        if stack.offline_tool != "vllm-bench":
            raise SpecError("--caps vllm-bench are the defaults of the LLM class `vllm bench throughput` runs: use "
                            "it with --stack vllm")
        seqs, tokens = stack.offline_limits(dev.memory_bytes / GiB, dev.name)
        given = dict(max_num_seqs=given["max_num_seqs"] or seqs,
                     max_num_batched_tokens=given["max_num_batched_tokens"] or tokens)
    return given


def run(args) -> dict:
    c, dev = load_model(args.model), load_gpu(args.gpu)
    mesh = Mesh(tp=args.tp, pp=args.pp, ep=args.ep, gpus=args.gpus)
    kd = args.kv_dtype or default_kv_dtype(args.weight_dtype)
    profile, pricing = profile_of(args, dev, c)
    r = max_throughput(c, dev, mesh, args.prompt_tokens, args.output_tokens, args.weight_dtype, kd, args.stack,
                       args.gpu_memory_utilization, **scheduler_caps(args, c, dev, mesh, kd), profile=profile)
    return dict(command="throughput", model=c.name, device=dev.name, tp=mesh.tp, pp=mesh.pp, ep=mesh.ep,
                weight_dtype=args.weight_dtype, kv_dtype=kd, prompt_tokens=args.prompt_tokens,
                output_tokens=args.output_tokens, **r, pricing=pricing, caps_from=args.caps,
                accuracy=band("max_throughput", dev.vendor, compute_precision_for(args.weight_dtype),
                              bool(c.num_experts), measured=profile is not None,
                              borrowed=borrowed(profile, dev), wide_ep=attention_dp_ranks(mesh) > 1))


def render(out: dict) -> str:
    lines = [f"throughput: {out['model']} on {out['gpus']} × {out['device']} (TP {out['tp']}, PP {out['pp']}, "
             f"EP {out['ep']}), {out['stack']}, {out['prompt_tokens']:,} in / {out['output_tokens']:,} out"]
    for k in ("output_tok_s", "total_tok_s", "requests_per_s", "output_tok_s_per_gpu", "max_batch", "step_ms",
              "memory_ms", "compute_ms", "comm_ms", "overhead_ms"):
        lines.append(f"  {k:<22} {fmt_num(out[k], 4)}")
    lines.append(f"  binds                  {out['binds']}")
    lines.append(f"  priced from            {out['pricing']}")
    lines.append(f"  accuracy               {out['accuracy']['text']}")
    rule = {"trtllm-bench": " (scheduler caps: trtllm-bench's own upper bounds)",
            "vllm-bench": " (scheduler caps: the defaults of vLLM's LLM class, as in vllm bench throughput)"
            }.get(out.get("caps_from"), "")
    lines.append("  batch caps             " + ", ".join(f"{k} {v:,}" for k, v in out["batch_caps"].items()) + rule)
    return "\n".join(lines)


def build_ops_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m calculators ops", description="Every op of one serving step, its datasheet roofline "
               "beside its time measured on the GPU and stack (a device profile), and the step they add up to.")
    p.add_argument("command", choices=("ops",))
    p.add_argument("--model", required=True, help="preset name or a path to a Hugging Face config.json")
    p.add_argument("--gpu", "--device", dest="gpu", required=True, help="device name from specs/devices.json")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel degree, MoE only (default 1)")
    p.add_argument("--gpus", type=positive_int, default=None,
                   help="GPUs in all (default max(tp, ep): with EP above TP, one EP group of attention data-parallel "
                        "replicas, each priced as one replica's step)")
    p.add_argument("--weight-dtype", type=dtype_arg(WEIGHT_DTYPES), default="bf16")
    p.add_argument("--kv-dtype", type=dtype_arg(KV_DTYPES), default=None, help="default: the weights' float format")
    p.add_argument("--decode-rows", type=nonneg_int, default=1, help="sequences decoding one token (default 1)")
    p.add_argument("--context", type=positive_int, default=1024, help="cached tokens each decode row reads")
    p.add_argument("--prompt-tokens", type=nonneg_int, default=0, help="prompt tokens the step prefills")
    p.add_argument("--prompt-len", type=positive_int, default=None, help="tokens per prompt (default: all one)")
    p.add_argument("--stack", default=None, help=f"serving stack: {', '.join(list_stacks())} (default vllm), "
                   "or a named build of one (vllm@amd-mlperf-5.1)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def run_ops(args) -> dict:
    from calculators.planning.measured_step import step_ops_table
    from calculators.planning.step import measured_efficiency, step_cost
    from calculators.planning.throughput import deployment_defaults
    from specs.stacks import load_stack
    c, dev = load_model(args.model), load_gpu(args.gpu)
    mesh = Mesh(tp=args.tp, ep=args.ep, gpus=args.gpus or max(args.tp, args.ep))
    s = load_stack(args.stack)
    profile, pricing = profile_of(args, dev, c)
    if profile is None:
        raise SpecError(f"no op-by-op table without measured kernels ({pricing}); name a profile with --profile")
    kd, _, eff, lk = deployment_defaults(dev, mesh, args.weight_dtype, args.kv_dtype, s, None, None, None, c)
    plen = args.prompt_len or max(args.prompt_tokens, 1)
    _, scale = measured_efficiency(eff, s, profile, dev)
    ops = step_ops_table(profile, c, dev, mesh, args.weight_dtype, kd, args.decode_rows, args.context,
                         args.prompt_tokens, plen, compute_scale=scale[0], memory_scale=scale[1])
    cost = step_cost(c, dev, mesh, args.weight_dtype, kd, eff, lk, s, args.context, plen, profile=profile)
    parts = {k: float(v) for k, v in cost.parts(args.decode_rows, args.prompt_tokens).items()}
    return dict(command="ops", model=c.name, device=dev.name, tp=mesh.tp, ep=mesh.ep, gpus=mesh.total_gpus,
                weight_dtype=args.weight_dtype,
                kv_dtype=kd, decode_rows=args.decode_rows, context=args.context, prompt_tokens=args.prompt_tokens,
                prompt_len=plen, stack=s.name, pricing=pricing, ops=ops,
                ops_measured_ms=sum(o["measured_ms"] for o in ops), ops_roofline_ms=sum(o["ideal_ms"] for o in ops),
                comm_ms=parts["comm_ms"], host_ms=parts["step_ms"] / parts["passes"] - parts["gpu_ms"],
                step_ms=parts["step_ms"])


def render_ops(out: dict) -> str:
    dp = f", attention DP {out['gpus'] // out['tp']} over {out['gpus']} GPUs" if out["ep"] > out["tp"] else ""
    lines = [f"ops: {out['model']} on {out['device']} (TP {out['tp']}, EP {out['ep']}{dp}), {out['stack']}, "
             f"{out['decode_rows']:,} decode rows at {out['context']:,} tokens + {out['prompt_tokens']:,} prompt "
             f"tokens", f"  priced from: {out['pricing']}",
             f"  {'op':<34} {'shape':<58} {'roofline':>10} {'measured':>10} {'of datasheet':>12}"]
    for o in out["ops"]:
        mark = " (extrapolated)" if o["extrapolated"] else ""
        lines.append(f"  {o['op']:<34} {o['shape'][:58]:<58} {fmt_num(o['ideal_ms'], 3) + ' ms':>10} "
                     f"{fmt_num(o['measured_ms'], 3) + ' ms':>10} {100 * o['efficiency']:>11.0f}%{mark}")
    lines.append(f"  {'all ops':<34} {'':<58} {fmt_num(out['ops_roofline_ms'], 3) + ' ms':>10} "
                 f"{fmt_num(out['ops_measured_ms'], 3) + ' ms':>10} "
                 f"{100 * out['ops_roofline_ms'] / out['ops_measured_ms']:>11.0f}%")
    lines.append(f"  + collectives {fmt_num(out['comm_ms'], 3)} ms, host {fmt_num(out['host_ms'], 3)} ms "
                 f"= step {fmt_num(out['step_ms'], 4)} ms")
    lines += [f"  note, {o['op']}: {o['note']}" for o in out["ops"] if o.get("note")]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "ops":
        return run_and_print(run_ops, render_ops, build_ops_parser().parse_args(argv))
    return run_and_print(run, render, build_parser().parse_args(argv))
