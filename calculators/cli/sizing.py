"""Sizing commands of `python -m calculators`: memory|floor|roofline|latency|plan --model M --gpu G [...] [--json].

--model takes a preset name (see `specs/models/`) or a path to a Hugging Face config.json; --gpu a device name
from `specs/devices.json` or "this-machine" (measured for about a second). Bad input prints one line on stderr
and exits with status 2.
"""
from __future__ import annotations

import argparse
import math

from calculators import explain as ex
from calculators.sizing.kv_cache import kv_bytes_per_token, kv_cache_bytes
from calculators.sizing.latency import IDEAL, bandwidth_floor_ms, decode_step_bytes, generation_latency
from calculators.sizing.memory import DEFAULT_GPU_MEMORY_UTILIZATION, max_batch, max_context, memory_budget
from calculators.sizing.params import param_breakdown, weight_bytes
from calculators.sizing.roofline import roofline
from calculators.cli.common import (Parser, add_profile_arg, dtype_arg, load_gpu, load_model, nonneg_float, positive_int,
                                    profile_of, run_and_print)
from calculators.units import KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype, fmt_bytes, fmt_count, \
    fmt_num
from specs.devices import Device, list_devices
from specs.model_config import ModelConfig, SpecError
from specs.presets import list_presets

COMMANDS = ("memory", "floor", "roofline", "latency", "plan")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m calculators", description="Size LLM inference: memory, bandwidth floor, "
                "roofline and latency from a model config and a device datasheet.")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--model", default="tinyllama",
                   help=f"preset ({', '.join(list_presets())}) or path to a config.json (default tinyllama)")
    p.add_argument("--gpu", "--device", dest="gpu", default="a100",
                   help=f"device ({', '.join(list_devices())}) or this-machine (default a100)")
    p.add_argument("--tokens", type=positive_int, default=None,
                   help="context / prompt tokens per sequence (default: 2,048 or the model's context if smaller)")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences in the batch (default 1)")
    p.add_argument("--weight-dtype", type=dtype_arg(WEIGHT_DTYPES), default="bf16")
    p.add_argument("--kv-dtype", type=dtype_arg(KV_DTYPES), default=None,
                   help="default: the weight dtype if 16/32-bit float, else bf16")
    p.add_argument("--output-tokens", type=positive_int, default=200, help="tokens generated (latency)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode", help="roofline step (default decode)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_parallel_args(p)
    add_plan_args(p)
    add_profile_arg(p)
    return p


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """--gpus/--tp/--pp/--ep and the memory budget, for memory, floor and latency (calculators.multi_gpu.tensor_parallel)."""
    g = p.add_argument_group("multi-GPU (memory, floor, latency)")
    g.add_argument("--gpus", type=positive_int, default=None, help="GPUs in all (default tp × pp; the rest are "
                   "data-parallel replicas)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel stages (default 1)")
    g.add_argument("--ep", type=positive_int, default=1, help="expert-parallel degree, MoE only (default 1)")
    g.add_argument("--stack", default=None, help="serving stack: vllm (default), sglang, trtllm, llamacpp, nccl, or a "
                   "named build of one (vllm@amd-mlperf-5.1); sets the all-reduce algorithm, the efficiencies and the "
                   "fixed step cost (specs/stacks.json)")
    g.add_argument("--gpu-memory-utilization", type=nonneg_float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help=f"vLLM's meaning: fraction of each GPU's memory the server may use (default "
                        f"{DEFAULT_GPU_MEMORY_UTILIZATION})")
    g.add_argument("--quantize-embeddings", action="store_true", help="store the embedding and LM head at the "
                   "weight precision too (default: 16-bit, as FP8/INT4 checkpoints ship them)")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """The workload and targets of `plan` (calculators.planning.planner). --gpu may list several devices, comma-separated."""
    g = p.add_argument_group("plan", description="plan searches device × GPUs × TP × PP × batch cap × weight and "
                             "KV precision; for an MoE model also EP = TP, and attention TP t × DP d with the experts "
                             "over all t·d GPUs (wide EP: the ep and dp columns), each ranked by $ per 1M tokens at "
                             "the rate")
    g.add_argument("--rate", type=nonneg_float, default=1.0, help="requests per second (default 1)")
    g.add_argument("--prompt-tokens", type=positive_int, default=None, help="mean prompt (default --tokens)")
    g.add_argument("--prompt-p99", type=positive_int, default=None, help="p99 prompt length (default the mean)")
    g.add_argument("--ttft-ms", type=nonneg_float, default=2000.0, help="TTFT p99 target in ms (default 2000)")
    g.add_argument("--itl-ms", type=nonneg_float, default=50.0, help="ITL target in ms (default 50)")
    g.add_argument("--top", type=positive_int, default=10, help="plans to print (default 10)")
    g.add_argument("--launch", action="store_true", help="add the command lines that start the first plan on "
                   "vLLM, SGLang and TensorRT-LLM, with what they cannot carry")


def run(args) -> dict:
    if args.command == "plan":
        return run_plan(args)
    c, dev = load_model(args.model), load_gpu(args.gpu)
    tokens = args.tokens or min(2048, c.max_position_embeddings)
    wd, kd, B = args.weight_dtype, args.kv_dtype or default_kv_dtype(args.weight_dtype), args.batch
    pb = param_breakdown(c)
    out = dict(command=args.command, model=c.name, device=dev.name, tokens=tokens, batch=B, weight_dtype=wd,
               kv_dtype=kd, params=pb.total, weight_bytes=weight_bytes(c, wd),
               kv_bytes_per_token=kv_bytes_per_token(c, kd), kv_bytes=kv_cache_bytes(c, tokens, B, kd))
    if pb.active != pb.total:
        out["active_params"] = pb.active
    formulas = {"weight_bytes": ex.explain_weight_bytes(c, wd).formula,
                "kv_bytes_per_token": ex.explain_kv_bytes_per_token(c, kd).formula,
                "kv_bytes": ex.explain_kv_cache_bytes(c, tokens, B, kd).formula}
    if args.command == "memory":
        kw = dict(usable_fraction=args.gpu_memory_utilization, embeddings_16bit=not args.quantize_embeddings)
        m = memory_budget(c, dev, tokens, B, wd, kd, **kw)
        out.update(resident_weight_bytes=m["weights_bytes"], activation_bytes=m["activation_bytes"], total_bytes=m["total_bytes"],
                   device_bytes=m["device_bytes"], fits=m["fits"], headroom_bytes=m["headroom_bytes"],
                   max_batch=max_batch(c, dev, tokens, wd, kd, **kw), max_context=max_context(c, dev, B, wd, kd, **kw))
    if args.command in ("floor", "latency"):
        out["fits_in_memory"] = memory_budget(c, dev, tokens, B, wd, kd, usable_fraction=args.gpu_memory_utilization,
                                              embeddings_16bit=not args.quantize_embeddings)["fits"]
        by = decode_step_bytes(c, tokens, B, wd, kd)
        floor = bandwidth_floor_ms(by["total"], dev.memory_bandwidth_bytes_per_s)
        out.update(step_bytes=by["total"], bandwidth_floor_ms=floor, total_tok_s_at_floor=B / floor * 1e3)
        if dev.price_usd_per_hour is not None:
            out["usd_per_million_tokens_at_floor"] = dev.price_usd_per_hour / (B / floor * 1e3 * 3600) * 1e6
        formulas["bandwidth_floor_ms"] = ex.explain_decode_floor(c, dev, tokens, B, wd, kd).formula
    if args.command == "latency":
        out.update(latency_fields(args, c, dev, tokens, B, wd, kd))
        formulas["ttft_ms"] = ("step(0 decode rows, batch × prompt tokens): the deployment's step "
                               "(calculators.planning.step), priced from " + out["pricing"])
        formulas["itl_ms"] = (f"step(batch decode rows at context {out['mean_context_tokens']:,}, 0 prompt tokens), "
                              "the same step")
        formulas["total_ms"] = ex.explain_total_latency(out["ttft_ms"], out["itl_ms"], args.output_tokens).formula
    if args.command == "roofline":
        new = tokens if args.phase == "prefill" else 1
        rf = roofline(c, dev, new, tokens, B, wd, kd)
        first = next(iter(rf["layers"]))
        out.update(phase=args.phase, new_tokens=new, context_tokens=tokens, precision=rf["precision"],
                   ridge_flop_per_byte=rf["ridge_flop_per_byte"], totals=rf["totals"], layer=first,
                   layer_rows=rf["layers"][first])
        formulas["ridge_flop_per_byte"] = ex.explain_ridge_point(dev, rf["precision"]).formula
    if args.command in ("memory", "floor", "latency"):
        out.update(parallel_fields(args, c, dev, tokens, B, wd, kd))
    out["formulas"] = formulas
    return out


def latency_fields(args, c: ModelConfig, dev: Device, tokens: int, B: int, wd: str, kd: str) -> dict:
    """`latency`: TTFT, ITL and total on the layout's step (`request_latency`, the step `throughput`, `serve-at`
    and `plan` use), priced from measured kernels where a profile covers this device and stack; the datasheet
    roofline (ideal) beside it, and the measured error of this regime."""
    from calculators.multi_gpu.tensor_parallel import Mesh
    from calculators.planning.accuracy import band
    from calculators.planning.step import borrowed
    from calculators.planning.request_latency import request_latency
    from calculators.sizing.roofline import compute_precision_for
    mesh = Mesh(tp=args.tp, pp=args.pp, ep=args.ep, gpus=args.gpus)
    profile, pricing = profile_of(args, dev, c)
    r = request_latency(c, dev, mesh, tokens, args.output_tokens, B, wd, kd, args.stack, profile=profile)
    ideal = generation_latency(c, dev, tokens, args.output_tokens, B, wd, kd, IDEAL)["ideal"]
    tps = r["total_tok_s"]
    price = dev.price_usd_per_hour
    return dict(output_tokens=args.output_tokens, ttft_ms=r["ttft_ms"], itl_ms=r["itl_ms"], total_ms=r["total_ms"],
                per_stream_tok_s=r["per_stream_tok_s"], total_tok_s=tps,
                usd_per_million_tokens=None if price is None else price * mesh.total_gpus / (tps * 3600) * 1e6,
                ideal_ttft_ms=ideal["ttft_ms"] / mesh.tp, ideal_itl_ms=ideal["itl_ms"] / mesh.tp,
                ideal_total_ms=ideal["total_ms"] / mesh.tp, mean_context_tokens=r["mean_context_tokens"],
                efficiency=r["efficiency"], stack=r["stack"], pricing=pricing,
                accuracy=band("static" if B > 1 else "batch1", dev.vendor, compute_precision_for(wd),
                              bool(c.num_experts), measured=profile is not None,
                              borrowed=borrowed(profile, dev))["text"])


def parallel_fields(args, c: ModelConfig, dev: Device, tokens: int, B: int, wd: str, kd: str) -> dict:
    """Per-GPU memory and the TP/PP communication for --gpus/--tp/--pp/--ep (one GPU when none is given): the
    collectives of the deployment's step (`request_latency.step_collectives`), the ones `latency`'s ITL and TTFT
    include."""
    from calculators.multi_gpu.tensor_parallel import Mesh, decode_step_parallel, fit_verdict, max_batch_per_replica
    from calculators.planning.request_latency import step_collectives
    mesh = Mesh(tp=args.tp, pp=args.pp, ep=args.ep, gpus=args.gpus)
    from specs.stacks import load_stack
    kw = dict(usable_fraction=args.gpu_memory_utilization, embeddings_16bit=not args.quantize_embeddings,
              moe_dp_comm=load_stack(args.stack).moe_dp_comm)
    v = fit_verdict(c, dev, mesh, tokens, B, wd, kd, **kw)
    mem = v["memory"]
    out = dict(gpus=mesh.total_gpus, tp=mesh.tp, pp=mesh.pp, ep=mesh.ep, replicas=mesh.replicas,
               gpu_memory_utilization=args.gpu_memory_utilization,
               per_gpu_weight_bytes=mem["per_gpu_weight_bytes"], per_gpu_kv_bytes=mem["per_gpu_kv_bytes"],
               per_gpu_activation_bytes=mem["per_gpu_activation_bytes"], overhead_bytes=mem["overhead_bytes"],
               a2a_buffer_bytes=mem["a2a_buffer_bytes"], per_gpu_needed_bytes=mem["per_gpu_needed_bytes"], usable_bytes=mem["usable_bytes"],
               fits=mem["fits"], fit_verdict=v["text"])
    if mesh.gpus_per_replica == 1:
        if args.command == "memory":
            return out
    else:
        out["max_batch_per_replica"] = max_batch_per_replica(c, dev, mesh, tokens, wd, kd, **kw)
    floor = decode_step_parallel(c, dev, mesh, tokens, B, wd, kd, embeddings_16bit=kw["embeddings_16bit"],
                                 stack=args.stack)                                       # IDEAL: the floor
    out.update(per_gpu_bandwidth_floor_ms=floor["memory_ms"],      # the step's own, as `latency` prices it
               **step_collectives(c, dev, mesh, tokens, B, wd, kd, args.stack))
    if args.command in ("floor", "latency"):
        out["fits_in_memory"] = mem["fits"]
    return out


def run_plan(args) -> dict:
    """`plan`: ranked plans with their binding constraint, or the reason none is feasible."""
    from calculators.planning.planner import SearchSpace, Workload, plan, plan_rows, rejected_rows
    c = load_model(args.model)
    devices = [load_gpu(g) for g in args.gpu.split(",") if g.strip()]
    prompt = args.prompt_tokens or args.tokens or min(2048, c.max_position_embeddings)
    out = dict(command="plan", model=c.name, device=", ".join(d.name for d in devices), rate=args.rate,
               prompt_tokens=prompt, output_tokens=args.output_tokens, ttft_p99_ms=args.ttft_ms,
               itl_ms=args.itl_ms)
    try:
        wl = Workload(args.rate, prompt, args.output_tokens, args.ttft_ms, args.itl_ms, args.prompt_p99).check()
        profile = None if args.profile == "none" else args.profile
        res = plan(c, devices, wl, SearchSpace(), usable_fraction=args.gpu_memory_utilization,
                   embeddings_16bit=not args.quantize_embeddings, stack=args.stack, profile=profile)
    except SpecError as e:
        out.update(candidates=0, plans=[], no_feasible_plan=f"no feasible plan: {e}")
        return out
    out.update(candidates=res.n_candidates, plans=plan_rows(res, args.top), rejected_by_reason=res.reasons,
               nearest_rejected=rejected_rows(res, 5), no_feasible_plan=res.no_plan_reason(),
               pricing=[n for n in res.notes if "priced from" in n] or ["closed form (asked for)"])
    from calculators.planning.accuracy import band
    from calculators.sizing.roofline import compute_precision_for
    for r in out["plans"]:                # each figure with the held-out error of its regime (a rate: under_rate)
        words = [n for n in out["pricing"] if n.startswith(f"{r['device']}: priced from measured")]
        r["accuracy"] = band("under_rate", next(d.vendor for d in devices if d.name == r["device"]),
                             compute_precision_for(r["weight_dtype"]), bool(c.num_experts), measured=bool(words),
                             borrowed=any("nothing measured on" in n for n in words), wide_ep=r.get("dp", 1) > 1)
    if getattr(args, "launch", False) and out["plans"]:
        out["launch"] = launch_for_plan(out["plans"][0], args.model, (args.prompt_p99 or prompt) + args.output_tokens,
                                        args.gpu_memory_utilization)
    return out


def launch_for_plan(row: dict, model: str, max_model_len: int, gpu_memory_utilization: float) -> dict:
    """`plan --launch`: each stack's command for the first plan (or the reason there is none)."""
    from calculators.planning.launch import launch_commands, plan_from_row
    try:
        cmds = launch_commands(plan_from_row(row, model, max_model_len, gpu_memory_utilization))
    except SpecError as e:
        return dict(error=str(e))
    return {stack: cmd.to_dict() for stack, cmd in cmds.items()}


def render_plan(out: dict) -> str:
    from calculators.planning.planner import layout_words
    lines = [f"plan: {out['model']} on {out['device']}, {out['rate']:g} req/s, prompt {out['prompt_tokens']:,}, "
             f"output {out['output_tokens']:,}, TTFT p99 <= {out['ttft_p99_ms']:g} ms, ITL <= {out['itl_ms']:g} ms"]
    if out["no_feasible_plan"]:
        lines.append(f"  {out['no_feasible_plan']}")
    lines += [f"  {n}" for n in out.get("pricing", [])]
    for i, r in enumerate(out["plans"], 1):
        lines.append(f"  {i:>2}. {r['gpus']} × {r['device']} {layout_words(r)} batch<= {r['batch_cap']} "
                     f"{r['weight_dtype']}/{r['kv_dtype']} KV: ${r['usd_per_million_input_tokens']:.3f}/1M input, "
                     f"${r['usd_per_million_output_tokens']:.3f}/1M output (${r['usd_per_million_tokens']:.3f} blended), "
                     f"ITL at the load {r['itl_at_load_ms']:.1f} ms, TTFT p99 {r['ttft_p99_ms']:.0f} ms, "
                     f"{r['concurrency_per_replica']:.0f} in flight per replica"
                     + (f", {r['rank_wait_ms']:.1f} ms of each step waiting for the busiest attention rank's prompts"
                        if r.get("dp", 1) > 1 and r.get("rank_wait_ms") else "") + f"; binding: {r['binding']}")
        if i == 1:
            lines.append(f"      accuracy: {r['accuracy']['text']}")
    for stack, cmd in (out.get("launch") or {}).items():
        if stack == "error":
            lines.append(f"  launch: {cmd}")
            continue
        lines.append(f"  launch on {stack}:" + ("" if cmd["supported"] else " (not supported on this device)"))
        lines += ["    " + ln for ln in cmd["shell"].splitlines()]
        lines += [f"    note: {n}" for n in cmd["notes"]]
    for r in out.get("nearest_rejected", []):
        lines.append(f"  rejected: {r['gpus']} × {r['device']} {layout_words(r)} batch<= {r['batch_cap']} "
                     f"{r['weight_dtype']}/{r['kv_dtype']}: {r['why']}")
    return "\n".join(lines)


def _fmt(key: str, v) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return "n/a" if v is None else str(v)
    if key == "device_bytes":
        return f"{fmt_bytes(v)} ({fmt_bytes(v, binary=True)})"
    if "bytes" in key:
        return fmt_bytes(v)
    if "flops" in key:
        return fmt_count(v) + "FLOP"
    if key.endswith("_ms") or "_ms_" in key:
        return f"{fmt_num(v, 3)} ms"
    if key in ("params", "active_params"):
        return fmt_count(v)
    if isinstance(v, float) and math.isfinite(v):
        return fmt_num(v, 4)
    return str(v)


def render(out: dict) -> str:
    if out["command"] == "plan":
        return render_plan(out)
    lines = []
    skip = {"formulas", "layer_rows", "totals", "efficiency", "command"}
    width = max(len(k) for k in out)
    lines.append(f"{out['command']}: {out['model']} on {out['device']}")
    for k, v in out.items():
        if k not in skip:
            lines.append(f"  {k:<{width}}  {_fmt(k, v)}")
    if "totals" in out:
        lines.append("  step totals:")
        for k, v in out["totals"].items():
            lines.append(f"    {k:<24}  {_fmt(k, v)}")
        lines.append(f"  one {out['layer']} layer (per-op roofline):")
        lines.append(f"    {'op':<20} {'FLOPs':>10} {'bytes':>10} {'FLOP/B':>8} {'time':>10}  bound")
        for r in out["layer_rows"]:
            moved = fmt_bytes(r["bytes_read"] + r["bytes_written"])
            lines.append(f"    {r['name']:<20} {fmt_count(r['flops']):>10} {moved:>10} "
                         f"{fmt_num(r['intensity_flop_per_byte'], 3):>8} {fmt_num(r['time_us'], 3) + ' us':>10}"
                         f"  {r['bound']}")
    lines.append("  formulas:")
    for k, f in out["formulas"].items():
        lines.append(f"    {k}: {f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return run_and_print(run, render, args, failed=lambda out: bool(out.get("no_feasible_plan")))
