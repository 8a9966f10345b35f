"""The Parallelism page's tensor- and pipeline-parallel lessons on the deployment's step (`calculators.planning.step`,
through `request_latency`): a row per TP or PP degree whose ITL is the one `python -m calculators latency --tp N`
(or `--pp N`) reports for the same model, GPU, context, batch, precisions, stack and pricing, and the decode step
cut into parts that add up to that ITL (`decode_step_segments`):
    closed form   reading weights + KV | compute beyond the reads | collectives | host work | stage-to-stage sends
    measured      weight GEMMs | attention | LM head + small kernels | collectives | host work | sends
Each roofline pair (weights, then KV / attention) takes max(memory, compute) = memory + max(compute − memory, 0), so
the first two parts are the GPU's time exactly, not an upper bound; the host work is what the step adds beyond the
GPU's (its fixed cost, the per-sequence work where it is not hidden); each part is counted once per microbatch pass.
"""
from __future__ import annotations

import numpy as np

from calculators.multi_gpu.parallel import tp_bandwidth_floor_ms
from calculators.multi_gpu.pipeline import layers_per_stage
from calculators.multi_gpu.tensor_parallel import Mesh, mesh_problem, per_gpu_memory, per_gpu_weight_bytes
from calculators.planning.request_latency import request_latency
from calculators.sizing.memory import resident_weight_bytes
from specs.devices import Device, Link
from specs.model_config import ModelConfig
from specs.stacks import Stack

# (key, label) of each part of a decode step, in the order a stacked bar draws them
CLOSED_FORM_PARTS = (("memory_ms", "reading weights + KV"), ("compute_ms", "compute beyond the reads"))
MEASURED_PARTS = (("gemm_ms", "weight GEMMs (measured)"), ("attention_ms", "attention (measured)"),
                  ("other_kernels_ms", "LM head + small kernels (measured)"))
SHARED_PARTS = (("allreduce_ms", "all-reduces"), ("host_ms", "host work"), ("p2p_ms", "stage-to-stage sends"))


def decode_step_segments(parts: dict) -> dict:
    """A step's `parts` (`step.parts(n, p)` as floats) cut into the ms of the parts its time is made of, in
    drawing order; they add up to parts["step_ms"]:
        closed form   memory = weights read + KV read (at the bandwidth × MBU)
                      compute = max(GEMM compute − weights read, 0) + max(attention compute − KV read, 0)
        measured      the GEMMs, the attention and the other kernels as their tables priced them
        both          all-reduces = the stage's collectives; host = the stage − its GPU work (`stage_with_host`);
                      each × the microbatch passes; sends = the pipeline's point-to-point transfers."""
    passes, p2p = float(parts["passes"]), float(parts.get("p2p_ms", 0.0))
    stage = (float(parts["step_ms"]) - p2p) / passes
    if "measured_gpu_ms" in parts:
        gpu = {"gemm_ms": parts["measured_gemm_ms"],
               "attention_ms": parts["measured_decode_attn_ms"] + parts["measured_prefill_attn_ms"],
               "other_kernels_ms": parts["measured_lm_head_ms"] + parts["measured_elementwise_ms"]}
    else:
        gpu = {"memory_ms": parts["weights_memory_ms"] + parts["kv_memory_ms"],
               "compute_ms": max(parts["gemm_compute_ms"] - parts["weights_memory_ms"], 0.0)
               + max(parts["attention_compute_ms"] - parts["kv_memory_ms"], 0.0)}
    out = {k: passes * float(v) for k, v in gpu.items()}
    out.update(allreduce_ms=passes * float(parts["comm_ms"]), host_ms=passes * (stage - float(parts["gpu_ms"])),
               p2p_ms=p2p)
    return out


def segment_labels(segments: dict) -> list[tuple[str, str]]:
    """(key, label) of `segments`' parts in drawing order (`decode_step_segments`)."""
    return [(k, name) for k, name in CLOSED_FORM_PARTS + MEASURED_PARTS + SHARED_PARTS if k in segments]


def latency_flags(context_tokens: int, batch: int, weight_dtype: str, kv_dtype: str, axis: str,
                  output_tokens: int = 1) -> str:
    """The `python -m calculators latency` flags that price the same work as a row of `tp_step_scaling` (axis
    "tp") or `pp_step_scaling` ("pp"), its degree left as N."""
    return (f"--weight-dtype {weight_dtype} --kv-dtype {kv_dtype} --tokens {context_tokens} --output-tokens "
            f"{output_tokens} --batch {batch} --{axis} N")


def _floats(parts: dict) -> dict:
    return {k: float(np.asarray(v)) for k, v in parts.items()}


def _by_degree(config: ModelConfig, axis: str, degrees: tuple[int, ...], row) -> list[dict]:
    """One row per degree of `axis` ("tp" or "pp"): `row(mesh)`'s fields, or the layout's problem where it has one
    (`mesh_problem`: a TP that does not divide the heads, more stages than layers)."""
    rows = []
    for d in degrees:
        mesh = Mesh(**{axis: d})
        problem = mesh_problem(config, mesh)
        rows.append({axis: d, "problem": problem, **({} if problem else row(mesh))})
    return rows


def tp_step_scaling(config: ModelConfig, device: Device, tps: tuple[int, ...], context_tokens: int, batch: int = 1,
                    weight_dtype: str = "bf16", kv_dtype: str | None = None, link: Link | None = None,
                    stack: Stack | str | None = None, profile=None, output_tokens: int = 1,
                    **memory_kw) -> list[dict]:
    """One row per TP degree: per-GPU weights and KV and the fit verdict (`per_gpu_memory`), the weights-only floor
    per GPU (003's weights / tp / bandwidth), and the decode step of `batch` sequences as `latency --tokens
    context_tokens --output-tokens output_tokens --batch batch --tp N` prices it (`request_latency`: its ITL, the
    step at the reply's mean context), cut into `decode_step_segments`, its all-reduces' share and the speed-up over
    the first degree. Where the all-reduces and the host's fixed work stop shrinking while the reads do, more GPUs
    buy less and less."""
    floor_bytes = resident_weight_bytes(config, weight_dtype, None, memory_kw.get("embeddings_16bit", True))

    def row(mesh: Mesh) -> dict:
        mem = per_gpu_memory(config, device, mesh, context_tokens, batch, weight_dtype, kv_dtype, **memory_kw)
        r = request_latency(config, device, mesh, context_tokens, output_tokens, batch, weight_dtype, kv_dtype, stack,
                            link=link, profile=profile)
        seg = decode_step_segments(_floats(r["decode_parts"]))
        return dict(per_gpu_weight_bytes=mem["per_gpu_weight_bytes"], per_gpu_kv_bytes=mem["per_gpu_kv_bytes"],
                    fits=mem["fits"], weights_floor_ms=tp_bandwidth_floor_ms(
                        floor_bytes, device.memory_bandwidth_bytes_per_s, mesh.tp),
                    segments=seg, allreduce_ms=r["allreduce_ms_per_token"], host_ms=seg["host_ms"],
                    itl_ms=r["itl_ms"], comm_fraction=r["decode_comm_fraction"],
                    mean_context_tokens=r["mean_context_tokens"], priced_from=r["priced_from"], stack=r["stack"])
    rows = _by_degree(config, "tp", tps, row)
    base = next((r["itl_ms"] for r in rows if r["problem"] is None), None)
    for r in rows:
        if r["problem"] is None:
            r["speedup"] = base / r["itl_ms"]
    return rows


def pp_step_scaling(config: ModelConfig, device: Device, pps: tuple[int, ...], context_tokens: int, batch: int = 1,
                    weight_dtype: str = "bf16", kv_dtype: str | None = None, link: Link | None = None,
                    stack: Stack | str | None = None, profile=None, output_tokens: int = 1) -> list[dict]:
    """One row per PP degree, as `latency --pp N` prices it (`request_latency`): layers on the busiest stage,
    per-GPU weights, the ITL of `batch` sequences, the ITL and tokens/s of ONE request (it visits every stage in
    turn, each stage waiting for the one before: no faster than one GPU, plus the sends and each stage's host work),
    the tokens/s with pp sequences in flight (one per stage: the pipeline full) and the bubble of one request,
    1 − microbatches / passes = (pp − 1)/pp."""
    def row(mesh: Mesh) -> dict:
        def at(b):
            return request_latency(config, device, mesh, context_tokens, output_tokens, b, weight_dtype, kv_dtype,
                                   stack, link=link, profile=profile)
        one, full, r = at(1), at(mesh.pp), at(batch)
        d = one["decode_parts"]
        return dict(stage_layers=max(layers_per_stage(config.num_layers, mesh.pp)),
                    per_gpu_weight_bytes=per_gpu_weight_bytes(config, mesh, weight_dtype), itl_ms=r["itl_ms"],
                    tok_s=r["total_tok_s"], segments=decode_step_segments(_floats(r["decode_parts"])),
                    single_request_itl_ms=one["itl_ms"], tok_s_batch_1=one["total_tok_s"],
                    tok_s_pp_in_flight=full["total_tok_s"],
                    bubble_batch_1=1.0 - float(d["microbatches"]) / float(d["passes"]), priced_from=r["priced_from"])
    return _by_degree(config, "pp", pps, row)
