"""The 2-D mesh command of `python -m calculators`: a model on a Tenstorrent Galaxy (32 Wormhole chips, 8 × 4),
the layout of reference 001 (`calculators.multi_gpu.mesh2d`).

    python -m calculators mesh --model llama-3-70b --prompt-tokens 128 --output-tokens 128 --batch 32 --json
    python -m calculators mesh --topology galaxy-wormhole-6u --prompt-tokens 8192 --batch 1

JSON: the plan (weight/KV bytes per chip, fits, max_users_by_kv, ttft_ms, itl_ms, output_tok_s, request_ms, each
with its formula under `formulas`), the weight shards, and one layer's collectives for the prompt's prefill and for a
decode step, with a per-axis summary. Bad input prints one line and exits with status 2.
"""
from __future__ import annotations

import argparse

from calculators.cli.common import Parser, load_model, nonneg_float, positive_int, run_and_print
from calculators.multi_gpu.mesh2d import (galaxy_plan, galaxy_summary_text, layer_collectives, per_axis_summary,
                                          weight_shards)
from calculators.units import fmt_num
from specs.topologies import list_topologies

COMMANDS = ("mesh",)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m calculators mesh", description="A model on a 2-D device mesh (Tenstorrent Galaxy): "
               "per-chip weights and KV, the collectives along each mesh axis, TTFT and ITL.")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--model", default="llama-3-70b", help="preset or config.json (default llama-3-70b, as in 001)")
    p.add_argument("--topology", "--mesh", dest="topology", default="galaxy-wormhole-4u",
                   help=f"mesh from specs/topologies.json: {', '.join(list_topologies())} (default the 4U Galaxy)")
    p.add_argument("--prompt-tokens", type=positive_int, default=128, help="input tokens per request (default 128)")
    p.add_argument("--output-tokens", type=positive_int, default=128, help="output tokens per request (default 128)")
    p.add_argument("--batch", type=positive_int, default=32, help="users decoded together, 1-32 (default 32)")
    p.add_argument("--mlp", choices=("bfp4", "bfp8"), default="bfp4",
                   help="w1/w3 storage: bfp4 (tt-metal's 70B default) or bfp8")
    p.add_argument("--usable-fraction", type=nonneg_float, default=0.9,
                   help="share of each chip's memory the model may fill (default 0.9)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def run(args) -> dict:
    c = load_model(args.model)
    bfp4 = args.mlp == "bfp4"
    plan = galaxy_plan(c, args.prompt_tokens, args.output_tokens, args.batch, args.topology, bfp4,
                       args.usable_fraction)
    pre = layer_collectives(c, args.prompt_tokens, "prefill", args.topology)
    dec = layer_collectives(c, args.batch, "decode", args.topology)
    return dict(command="mesh", **plan, weight_shards=weight_shards(c, args.topology, bfp4),
                prefill_collectives_per_layer=pre, decode_collectives_per_layer=dec,
                prefill_per_axis=per_axis_summary(pre), decode_per_axis=per_axis_summary(dec))


def render(out: dict) -> str:
    lines = [galaxy_summary_text(out), "  collectives per layer (one chip):"]
    for phase in ("prefill", "decode"):
        for a in out[f"{phase}_per_axis"]:
            lines.append(f"    {phase:<7} axis {a['axis']} ({a['devices']} chips): {a['collectives']} ops, "
                         f"{fmt_num(a['bytes_sent_per_chip'] / 1e6, 4)} MB sent, {fmt_num(a['ms'] * 1e3, 4)} µs")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    return run_and_print(run, render, build_parser().parse_args(argv))
