"""The planner's measured-kernel step beside aiconfigurator's own composition of the same kernels, on the same work.

Both read aiconfigurator-core's databases (TensorRT-LLM on H100, H200, B200 and GB200; vLLM and SGLang on H100, H200
and B200), so a difference between them is a
difference in how each step is assembled from the kernels (which ops, which kernel of several, which table of a
quantized format, the collectives), not in the measurements. aiconfigurator is the anchor the issue names (its
databases reach single-digit errors against real runs); the project prices its steps op by op the same way, and
this bench says where the two agree and where they do not.

Each case is a deployment (model, GPU, TP, attention DP, EP, weight and KV formats) and a step:
    decode   `rows` decode rows per attention rank at context isl + osl / 2: aiconfigurator's
             `EngineHandle.decode_step_latency(rows, isl, osl)`
    prefill  one prompt of `tokens` tokens per attention rank: `predict_prefill_latency(1, tokens)`
and the project's `step.step_cost(...).parts(rows, tokens)` GPU time (measured ops + collectives, no host work:
aiconfigurator's step has none). Needs the optional extra (pip install -r requirements-profiles.txt):

    python bench/bench_anchor_steps.py            # the table, the ratios and their summary
    python bench/bench_anchor_steps.py --write    # also rewrites bench/anchor_steps.csv (aiconfigurator's side)
    python bench/bench_anchor_steps.py --rows     # also aiconfigurator's own estimate of the DeepSeek-R1 blog runs

`--rows`: TensorRT-LLM's DeepSeek-R1 blog runs (bench/published_serving.csv, attention DP 8 × EP 8, fixed lengths, a
stated batch per rank, every rank in lockstep) priced end to end by aiconfigurator as a static batch of that size
(`run_static`), beside the planner's committed prediction and the published figure.

tests/calculators/test_anchor_steps.py prices the committed cases again and checks the ratios.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.planning.anchor_steps import anchor_summary, step_gpu_ms, step_group  # noqa: E402

# aiconfigurator's name for each preset (its bundled model_configs)
AIC_MODELS = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
              "llama-3.1-405b": "meta-llama/Meta-Llama-3.1-405B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
              "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B", "deepseek-r1": "deepseek-ai/DeepSeek-R1"}
# (stack, preset, GPU, TP, attention DP, EP, weights, KV, decode rows, prompt tokens, isl, osl): the held-out rows'
# deployments (dense TP 1-8, MoE TP 8 × EP 8, DeepSeek-R1 attention DP 8 × EP 8) over their batch range on
# TensorRT-LLM, and the planner's default stack (vLLM) and SGLang on dense and MoE models
FIELDS = ("stack", "model", "device", "tp", "adp", "ep", "weights", "kv", "decode", "prefill", "isl", "osl")
DENSE = ((1, 32, 256), (128, 2048, 8192), 1000, 1000)        # decode rows, prompt tokens, isl, osl
WIDE = ((1, 256, 2048), (128, 2048), 1000, 1000)
CASES = [dict(zip(FIELDS, c)) for c in [
    ("trtllm", "llama-3.1-8b", "h200", 1, 1, 1, "bf16", "bf16", *DENSE),
    ("trtllm", "llama-3.1-8b", "h100", 1, 1, 1, "fp8", "fp8", *DENSE),
    ("trtllm", "llama-3.1-70b", "h100", 2, 1, 1, "fp8", "fp8", *DENSE),
    ("trtllm", "llama-3.1-70b", "h200", 4, 1, 1, "fp8", "fp8", *DENSE[:2], 467, 256),
    ("trtllm", "llama-3.1-70b", "b200", 1, 1, 1, "fp4", "fp8", *DENSE),
    ("trtllm", "llama-3.1-405b", "h200", 8, 1, 1, "fp8", "fp8", *DENSE[:2], 9428, 685),
    ("trtllm", "qwen3-235b-a22b", "h100", 8, 1, 8, "fp8", "fp8", (1, 256, 1024), *WIDE[1:]),
    ("trtllm", "qwen3-235b-a22b", "h200", 8, 1, 8, "fp8", "fp8", *WIDE),
    ("trtllm", "qwen3-235b-a22b", "b200", 8, 1, 8, "fp4", "fp8", *WIDE),
    ("trtllm", "deepseek-r1", "h200", 1, 8, 8, "fp8", "bf16", (1, 32, 128), (128, 1024), 1024, 2048),
    ("trtllm", "deepseek-r1", "b200", 1, 8, 8, "fp4", "fp8", (1, 128, 512, 896), (128, 1024), 1042, 2048),
    ("trtllm", "deepseek-r1", "gb200", 1, 8, 8, "fp4", "fp8", (1, 128, 512), (128, 1024), 804, 3736),
    ("vllm", "llama-3.1-8b", "h200", 1, 1, 1, "bf16", "bf16", *DENSE),
    ("vllm", "llama-3.1-8b", "b200", 1, 1, 1, "bf16", "bf16", *DENSE),
    ("vllm", "llama-3.1-70b", "h100", 2, 1, 1, "fp8", "fp8", *DENSE),
    ("vllm", "llama-3.1-405b", "h200", 8, 1, 1, "fp8", "fp8", *DENSE),
    ("vllm", "qwen3-30b-a3b", "h200", 1, 1, 1, "bf16", "bf16", *DENSE),
    ("vllm", "qwen3-235b-a22b", "h200", 8, 1, 8, "fp8", "fp8", *DENSE),
    ("sglang", "llama-3.1-8b", "h200", 1, 1, 1, "bf16", "bf16", *DENSE),
    ("sglang", "llama-3.1-70b", "h100", 2, 1, 1, "fp8", "bf16", *DENSE),
    ("sglang", "qwen3-30b-a3b", "h200", 1, 1, 1, "bf16", "bf16", *DENSE),
]]


def our_gpu_ms(case: dict, kind: str, size: int) -> float:
    return step_gpu_ms(case["model"], case["device"], case["tp"], case["adp"], case["ep"], case["weights"],
                       case["kv"], kind, size, case["isl"], case["osl"], stack=case["stack"])


OUT = Path(__file__).with_name("anchor_steps.csv")
AIC_DTYPE = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}   # a 16-bit KV cache: bf16
SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200"}
COLUMNS = ("stack", "model", "aic_model", "device", "tp", "adp", "ep", "weights", "kv", "kind", "size", "isl", "osl",
           "aic_ms", "source")


def aic_handle(case: dict):
    """aiconfigurator's engine for the case's deployment (the case's stack, its default database version). DeepSeek's
    FP8 checkpoint is block-scaled (fp8_block); attention runs in FP8 on TensorRT-LLM with an FP8 KV cache, in bf16
    otherwise (DeepSeek-R1's MLA too: the B200 tables have no FP8 MLA context rows; vLLM's and SGLang's tables have
    no FP8 context attention)."""
    from aiconfigurator_core.sdk.engine import EngineHandle
    w = AIC_DTYPE[case["weights"]]
    if case["model"].startswith("deepseek") and case["weights"] == "fp8":
        w = "fp8_block"
    kw = dict(tp_size=case["tp"], attention_dp_size=case["adp"], gemm_quant_mode=w,
              kvcache_quant_mode=AIC_DTYPE[case["kv"]],
              fmha_quant_mode="fp8" if case["stack"] == "trtllm" and case["kv"] == "fp8"
              and not case["model"].startswith("deepseek") else "bfloat16")
    if case["ep"] > 1 or case["model"].startswith("qwen3-30b"):
        kw.update(moe_tp_size=case["tp"] * case["adp"] // case["ep"], moe_ep_size=case["ep"], moe_quant_mode=w)
    return EngineHandle.compile(AIC_MODELS[case["model"]], SYSTEMS[case["device"]], case["stack"], **kw)


def aic_ms(handle, case: dict, kind: str, size: int) -> float:
    if kind == "decode":
        return float(handle.decode_step_latency(size, case["isl"], case["osl"]))
    return float(handle.predict_prefill_latency(1, size))


def blog_rows() -> None:
    """aiconfigurator's `run_static` of each DeepSeek-R1 blog run: 8 ranks × its batch × OSL tokens in the batch's
    total time, against the published throughput and the planner's committed prediction."""
    from calculators.planning.accuracy import committed_predictions
    from calculators.planning.published import load_rows
    pred = committed_predictions("measured kernels")                    # {row: (predicted, error)}
    print("\n| row | GPU | batch a rank | ISL / OSL | published tok/s | aiconfigurator (run_static) | here |")
    print("|---:|---|---:|---|---:|---:|---:|")
    for i, row in enumerate(load_rows(), 1):
        if not row["source"].startswith("TensorRT-LLM blog") or row["model"] != "deepseek-r1":
            continue
        h = aic_handle(dict(stack="trtllm", model="deepseek-r1", device=row["device"], tp=1, adp=8, ep=8,
                            weights=row["weights"], kv=row["kv"]))
        b, isl, osl = int(row["max_num_seqs"]), int(row["prompt_tokens"]), int(row["output_tokens"])
        total_ms = h.run_static(batch_size=b, isl=isl, osl=osl)[2]
        theirs, pub = 8 * b * osl / (total_ms / 1e3), float(row["published"])
        print(f"| {i} | {row['device'].upper()} | {b} | {isl} / {osl} | {pub:,.0f} | {theirs:,.0f} "
              f"({theirs / pub - 1:+.0%}) | {pred[i][0]:,.0f} ({pred[i][1]:+.0%}) |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite bench/anchor_steps.csv from aiconfigurator")
    ap.add_argument("--rows", action="store_true", help="also aiconfigurator's own estimate of the DeepSeek-R1 "
                                                        "blog runs")
    args = ap.parse_args()
    try:
        version = importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        print("aiconfigurator-core is not installed: pip install -r requirements-profiles.txt")
        return 0
    source = f"aiconfigurator-core {version}, EngineHandle (the stack's default database), {datetime.date.today()}"
    rows, compared = [], []
    print("| stack | model | GPU | layout | weights | step | rows or tokens | aiconfigurator ms | here ms | "
          "here / it |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|")
    for case in CASES:
        handle = aic_handle(case)
        for kind, sizes in (("decode", case["decode"]), ("prefill", case["prefill"])):
            for size in sizes:
                theirs = aic_ms(handle, case, kind, size)
                ours = our_gpu_ms(case, kind, size)
                step = dict(case, kind=kind, size=size)
                compared.append(dict(group=step_group(step), ratio=ours / theirs))
                layout = f"TP {case['tp']}" + (f" × ADP {case['adp']}" if case["adp"] > 1 else "") + \
                    (f", EP {case['ep']}" if case["ep"] > 1 else "")
                print(f"| {case['stack']} | {case['model']} | {case['device'].upper()} | {layout} | "
                      f"{case['weights']} | {kind} | {size:,} | {theirs:.2f} | {ours:.2f} | {ours / theirs:.2f} |")
                kept = {k: case[k] for k in COLUMNS if k in case}
                rows.append(dict(kept, aic_model=AIC_MODELS[case["model"]], kind=kind, size=size,
                                 aic_ms=f"{theirs:.4f}", source=source))
    print()
    for g in anchor_summary(compared):
        print(f"{g['group']:24s} {g['steps']:3d} steps: here / aiconfigurator {g['lowest']:.2f}-{g['highest']:.2f}, "
              f"median |1 - ratio| {g['median_abs_gap']:.1%}, worst {g['worst_abs_gap']:.1%}")
    if args.rows:
        blog_rows()
    if args.write:
        with OUT.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        print(f"\nwrote {OUT} ({len(rows)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
