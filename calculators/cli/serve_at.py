"""`python -m calculators serve-at`: this layout at this rate, what TTFT, TPOT and ITL? (the steady state of a
loaded server, `calculators.planning.serve_at`).

    python -m calculators serve-at --model llama-3-70b --gpu h100 --gpus 8 --tp 4 --weight-dtype fp8 \\
        --rate 10 --prompt-tokens 2000 --output-tokens 500 --json
    python -m calculators serve-at --model llama-3.1-8b --gpu h100 --rate 20 --workload reasoning

Lengths: a fixed count, or a mean with --prompt-p99/--output-p99 (a lognormal through both), or a preset
(--workload chat|reasoning). A rate above capacity is an answer ("this layout serves at most X requests/s"),
printed with exit status 0; bad input prints one line and exits with status 2.
"""
from __future__ import annotations

from calculators.cli.common import (Parser, add_profile_arg, dtype_arg, load_gpu, load_model, nonneg_float, positive_int,
                                    profile_of, run_and_print)
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.accuracy import band
from calculators.planning.rank_wait import attention_dp_ranks
from calculators.planning.step import borrowed
from calculators.planning.serve_at import serve_at
from calculators.sizing.roofline import compute_precision_for
from calculators.serving.lengths import Lengths, preset, workload_names
from calculators.units import KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype, fmt_num
from specs.model_config import SpecError
from specs.stacks import list_stacks

COMMANDS = ("serve-at",)
SHOWN = ("capacity_requests_per_s", "utilisation", "in_flight_per_replica", "step_ms", "ttft_p50_ms", "ttft_p99_ms",
         "tpot_ms", "itl_p50_ms", "itl_p99_ms", "output_tok_s", "output_tok_s_per_gpu")


def build_parser():
    p = Parser(prog="python -m calculators serve-at", description="A deployment under a Poisson request rate: "
               "its steady state, TTFT/TPOT/ITL and whether the rate is above capacity.")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--model", required=True, help="preset name or a path to a Hugging Face config.json")
    p.add_argument("--gpu", "--device", dest="gpu", required=True, help="device name from specs/devices.json")
    p.add_argument("--gpus", type=positive_int, default=None, help="GPUs in all (default tp × pp × dp)")
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel degree (MoE); EP > TP = attention "
                   "data-parallel with experts spread over the replicas")
    p.add_argument("--dp", type=positive_int, default=None, help="data-parallel replicas (default gpus / (tp × pp))")
    p.add_argument("--rate", type=nonneg_float, required=True, help="requests per second, all replicas")
    p.add_argument("--prompt-tokens", type=positive_int, default=None, help="mean prompt length")
    p.add_argument("--prompt-p99", type=positive_int, default=None, help="p99 prompt length (lognormal)")
    p.add_argument("--output-tokens", type=positive_int, default=None, help="mean output length")
    p.add_argument("--output-p99", type=positive_int, default=None, help="p99 output length (lognormal)")
    p.add_argument("--workload", choices=workload_names(), default=None,
                   help="length preset: assumed (chat, reasoning) or an MLPerf dataset's measured lengths")
    p.add_argument("--weight-dtype", type=dtype_arg(WEIGHT_DTYPES), default="bf16")
    p.add_argument("--kv-dtype", type=dtype_arg(KV_DTYPES), default=None)
    p.add_argument("--stack", default=None, help=f"serving stack: {', '.join(list_stacks())} (default vllm), "
                   "or a named build of one (vllm@amd-mlperf-5.1)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None)
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None)
    p.add_argument("--no-chunked-prefill", action="store_true", help="whole prompts per step")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true")
    return p


def workload_lengths(args) -> tuple[Lengths, Lengths]:
    """The prompt and output distributions the arguments name (a preset, or means with optional p99s)."""
    if args.workload:
        w = preset(args.workload)
        I, O = w["prompt"], w["output"]
        if args.prompt_tokens or args.output_tokens:
            raise SpecError("give either --workload or --prompt-tokens/--output-tokens, not both")
        return I, O
    if not args.prompt_tokens or not args.output_tokens:
        raise SpecError("give --prompt-tokens and --output-tokens (means), or --workload "
                        f"({', '.join(workload_names())})")
    return (Lengths.from_mean_p99(args.prompt_tokens, args.prompt_p99),
            Lengths.from_mean_p99(args.output_tokens, args.output_p99))


def mesh_of(args) -> Mesh:
    gpus = args.gpus
    if args.dp is not None:
        per = args.tp * args.pp
        if gpus is not None and gpus != args.dp * per:
            fix = (f"with --gpus {gpus} and TP {args.tp} × PP {args.pp} DP is {gpus // per}" if gpus % per == 0 else
                   f"{gpus} GPUs are not a multiple of TP {args.tp} × PP {args.pp} = {per}")
            raise SpecError(f"--gpus {gpus} ≠ dp {args.dp} × tp {args.tp} × pp {args.pp} = {args.dp * per}: {fix} "
                            "(or leave --dp out)")
        gpus = args.dp * per
    return Mesh(tp=args.tp, pp=args.pp, ep=args.ep, gpus=gpus)


def run(args) -> dict:
    c, dev = load_model(args.model), load_gpu(args.gpu)
    I, O = workload_lengths(args)
    mesh = mesh_of(args)
    kd = args.kv_dtype or default_kv_dtype(args.weight_dtype)
    profile, pricing = profile_of(args, dev, c)
    r = serve_at(c, dev, mesh, args.rate, I, O, args.weight_dtype, kd, args.stack,
                 max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                 chunked_prefill=not args.no_chunked_prefill, profile=profile)
    return dict(command="serve-at", model=c.name, device=dev.name, tp=mesh.tp, pp=mesh.pp, ep=mesh.ep,
                weight_dtype=args.weight_dtype, kv_dtype=kd, **r, pricing=pricing,
                accuracy=band("under_rate", dev.vendor, compute_precision_for(args.weight_dtype), bool(c.num_experts),
                              measured=profile is not None, borrowed=borrowed(profile, dev),
                              wide_ep=attention_dp_ranks(mesh) > 1))


def render(out: dict) -> str:
    lines = [f"serve-at: {out['model']} on {out['gpus']} × {out['device']} (TP {out['tp']}, PP {out['pp']}, "
             f"EP {out['ep']}, {out['replicas']} replica(s)), {out['stack']}; prompt {out['prompt']}, output "
             f"{out['output']}", f"  {out['verdict']}"]
    for k in SHOWN:
        lines.append(f"  {k:<24} {fmt_num(out[k], 4)}")
        if k == "ttft_p50_ms" and out.get("ttft_mean_ms") is not None:     # whole prompts: the chain's mean too
            lines.append(f"  {'ttft_mean_ms':<24} {fmt_num(out['ttft_mean_ms'], 4)}")
        if k == "step_ms" and out.get("rank_wait_ms"):          # attention DP: the busiest rank's prompts
            lines.append(f"  {'rank_wait_ms':<24} {fmt_num(out['rank_wait_ms'], 4)}   (of the step: waiting for "
                         "the busiest attention rank's prompts)")
    lines.append(f"  priced from              {out['pricing']}")
    lines.append(f"  accuracy                 {out['accuracy']['text']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    return run_and_print(run, render, build_parser().parse_args(argv))
