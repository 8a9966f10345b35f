"""The deployment's step: step(n decode rows, p prompt tokens) -> ms on its busiest GPU, the one step model
every command prices work with (`throughput`, `serve_at`, `latency`, the planner's screening, the disaggregated
sizing). A step on the busiest GPU carries n decode rows (each at the time-weighted mean context of a decoding
sequence) and p prompt tokens, in min(n, pp) microbatches:
    GEMMs      max(weights read for n + p tokens (the experts they touch) / (bandwidth · MBU),
                   their FLOPs (n decode rows + p prompt tokens) / tp / (peak · MFU at the weights' precision)
                   + the busiest EP rank's extra expert FLOPs)
    attention  max(KV of the n rows / (bandwidth · MBU), its FLOPs / tp / (peak · MFU at attention's precision))
    step       max(m, pp) · (GEMMs + attention + collectives(n + p tokens), then the step and per-sequence host
               costs added, or overlapped where the stack has an overlap scheduler: `Efficiency.stage_ms`)
With a device profile (`specs.profiles`: kernels measured on that GPU and stack) the GEMMs and attention are
instead the sum of the step's ops, each priced from its measured table (`measured_step`), their datasheet
rooflines kept beside them (`measured_parts`), the TP all-reduces from its measured all-reduce table and wide
EP's dispatch and combine from its measured all-to-all table (DeepEP); the host's costs are the same.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from calculators import arch
from calculators.planning.measured_step import (MEASURED_GRID, derated, format_problem, measured_collectives,
                                                on_measured_grid, read_log_grid, step_grid_tables)
from calculators.sizing.latency import Efficiency, gemm_mfu, stage_with_host, step_weight_bytes
from calculators.sizing.roofline import forward_flops_split, gpu_time, step_peaks
from calculators.multi_gpu.tensor_parallel import (Mesh, _comm_per_stage_ms, _expert_flops_extra,
                                                   expert_imbalance_for, per_gpu_kv_bytes, per_gpu_weight_bytes,
                                                   stage_layers)
from specs.devices import Device, Link
from specs.model_config import ModelConfig
from specs.stacks import Stack

TOKEN_GRID = np.unique(np.round(np.geomspace(1, 1 << 20, 97))).astype(float)   # tokens per step: 1 .. 1M
LOG_GRID = np.log(TOKEN_GRID)

def step_tables(config: ModelConfig, mesh: Mesh, link: Link | None, stack: Stack, weight_dtype: str = "bf16",
                expert_imbalance: float | None = None, ratio: np.ndarray | None = None) -> dict:
    """The token-dependent parts of the deployment's step on TOKEN_GRID (tokens per microbatch), computed by the
    scalar calculators: `ratio` the share of the resident weights the tokens touch (the experts they reach),
    `extra` the busiest EP rank's expert FLOPs beyond the mean, `comm` the stage's collectives in ms. They do not
    depend on the KV precision, and `ratio` not on the weights' (a ratio of bytes) nor on the layout: pass it to
    reuse it for another layout."""
    c, g = config, TOKEN_GRID
    share = stage_layers(c, mesh.pp) / c.num_layers
    moe = arch.is_moe(c)
    if ratio is None:
        full = step_weight_bytes(c, weight_dtype, rows=1 << 30)
        ratio = np.array([step_weight_bytes(c, weight_dtype, rows=int(t)) / full for t in g]) if moe else \
            np.ones_like(g)
    imb = [expert_imbalance_for(c, mesh, t, expert_imbalance) for t in g]
    extra = np.array([_expert_flops_extra(c, mesh, t, i) * share for t, i in zip(g, imb)])
    comm = np.array([_comm_per_stage_ms(c, mesh, int(math.ceil(t)), link, stack, i, weight_dtype)
                     for t, i in zip(g, imb)])
    return dict(ratio=ratio, extra=extra, comm=comm, p2p=p2p_ms(c, mesh, link, g))


def p2p_ms(config: ModelConfig, mesh: Mesh, link: Link | None, tokens) -> np.ndarray:
    """A pipeline's sends between its stages for a microbatch of `tokens`: (pp − 1) × (the link's alpha + the
    [tokens, D] 16-bit activation over its bandwidth), in ms; 0 without pipeline parallelism."""
    t = np.asarray(tokens, dtype=float)
    if mesh.pp == 1 or link is None:
        return np.zeros_like(t)
    return (mesh.pp - 1) * (link.alpha_base_s + link.alpha_per_hop_s + t * config.hidden_size * 2.0 /
                            link.bytes_per_s) * 1e3


def step_terms(config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
               efficiency: Efficiency, decode_ctx: float, prompt_len: float) -> dict:
    """The token-independent numbers of the deployment's step on its busiest GPU: resident weights, KV bytes and
    FLOPs of one decode row (weight GEMMs and attention apart, `roofline.forward_flops_split`), FLOPs per prompt
    token, the bandwidth and the two peaks they run at (`roofline.step_peaks`), its fixed costs and whether the
    stack overlaps them with the GPU's work. `kv_token` and `attention_token`: what one more cached position adds
    to a decode row's KV read and attention FLOPs, kv_row(ctx + 1) − kv_row(ctx) (sliding layers past their
    window and a linear layer's state add nothing; MLA's absorbed products do not grow with the context)."""
    c = config
    share = stage_layers(c, mesh.pp) / c.num_layers
    ctx = max(1, int(round(decode_ctx)))
    P = max(1, int(round(prompt_len)))
    fr, fp = forward_flops_split(c, 1, ctx, 1), forward_flops_split(c, P, P, 1)
    kv_row = per_gpu_kv_bytes(c, mesh, ctx, 1, kv_dtype)
    pk = step_peaks(device, weight_dtype, kv_dtype)
    return dict(weights=per_gpu_weight_bytes(c, mesh, weight_dtype), kv_row=kv_row,
                kv_token=per_gpu_kv_bytes(c, mesh, ctx + 1, 1, kv_dtype) - kv_row,
                flops_row=fr["weights"] / mesh.tp * share, flops_prompt_token=fp["weights"] / P / mesh.tp * share,
                attention_row=fr["attention"] / mesh.tp * share,
                attention_token=(forward_flops_split(c, 1, ctx + 1, 1)["attention"] - fr["attention"]) / mesh.tp
                * share,
                attention_prompt_token=fp["attention"] / P / mesh.tp * share,
                peak=pk["weights"], peak_attention=pk["attention"],
                bandwidth=device.memory_bandwidth_bytes_per_s * efficiency.decode_mbu,
                decode_mfu=efficiency.decode_mfu, gemm_half_tokens=efficiency.gemm_half_tokens,
                step_overhead_ms=efficiency.step_overhead_ms, sequence_overhead_ms=efficiency.sequence_overhead_us / 1e3,
                overlap_host=float(bool(efficiency.overlap_host)),
                pp=float(mesh.pp), ep_per_tp=max(1.0, mesh.ep / mesh.tp))


def on_grid(table: np.ndarray, tokens) -> np.ndarray:
    """A TOKEN_GRID table read at `tokens`, linear in log tokens (np.interp). `table` is [G], or [K, G] with one
    row per candidate: then the last axis of `tokens` runs over the K candidates."""
    return read_log_grid(table, LOG_GRID, tokens)


def mixed_step(terms: dict, tables: dict):
    """The step(n decode rows, p prompt tokens) -> ms of the module docstring, from `step_terms` and
    `step_tables`. Every term may be an array over K candidates (the tables then [K, G]): n and p broadcast
    against them, the last axis running over the candidates. `step.parts(n, p)` gives every term (bytes,
    FLOPs, memory/compute/collective/fixed ms, passes, the step) of one microbatch's stage;
    `step.ms_per_context_token(n, p)` the step's growth per cached position its decode rows read
    (`context_slope`: the slot wait's dispersion in `steady_state.context_dispersion`)."""
    t, tb = terms, tables

    def parts(n, p) -> dict:
        """The step's terms at (n, p), on the busiest GPU per microbatch: the weight GEMMs (weights read, their
        FLOPs) and attention (the rows' KV read, its FLOPs) each on its own roofline, one after the other
        (`roofline.gpu_time`), the collectives, the host's fixed work (added, or overlapped where the stack
        does: `Efficiency.stage_ms`), the microbatch passes, and the step."""
        n, p = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(p, dtype=float))
        m = np.minimum(np.maximum(n, 1.0), t["pp"])
        rows, tok = n / m, (n + p) / m
        mfu = gemm_mfu(t["decode_mfu"], t["gemm_half_tokens"], tok)
        weight_bytes = t["weights"] * on_grid(tb["ratio"], tok * t["ep_per_tp"])
        kv_bytes = t["kv_row"] * rows
        gemm_flops = t["flops_row"] * rows + t["flops_prompt_token"] * p / m + on_grid(tb["extra"], tok)
        attention_flops = t["attention_row"] * rows + t["attention_prompt_token"] * p / m
        mem_w, mem_kv = weight_bytes / t["bandwidth"] * 1e3, kv_bytes / t["bandwidth"] * 1e3
        comp_w = gemm_flops / (t["peak"] * mfu) * 1e3
        comp_a = attention_flops / (t["peak_attention"] * mfu) * 1e3
        comm = on_grid(tb["comm"], tok)
        fixed, per_seq = t["step_overhead_ms"], rows * t["sequence_overhead_ms"]
        gpu = gpu_time(mem_w, comp_w, mem_kv, comp_a) + comm
        measured = {}
        if "measured" in tb:
            measured = measured_parts(tb["measured"], rows, p / m, tok, tb["prompt_len"])
            gpu = measured["measured_gpu_ms"] + comm
        stage = stage_with_host(gpu, fixed, per_seq, np.asarray(t["overlap_host"]) > 0)
        passes = np.maximum(m, t["pp"])
        return dict(weight_bytes=weight_bytes, kv_bytes=kv_bytes, bandwidth=t["bandwidth"], gemm_flops=gemm_flops,
                    attention_flops=attention_flops, gemm_flop_s=t["peak"] * mfu,
                    attention_flop_s=t["peak_attention"] * mfu, weights_memory_ms=mem_w, kv_memory_ms=mem_kv,
                    gemm_compute_ms=comp_w, attention_compute_ms=comp_a,
                    memory_ms=mem_w + mem_kv, compute_ms=comp_w + comp_a, comm_ms=comm,
                    fixed_ms=fixed * np.ones_like(rows),
                    sequences_ms=per_seq, gpu_ms=gpu, overlap_host=np.asarray(t["overlap_host"]) > 0, microbatches=m,
                    passes=passes, p2p_ms=on_grid(tb["p2p"], tok) if "p2p" in tb else 0.0,
                    step_ms=passes * stage + (on_grid(tb["p2p"], tok) if "p2p" in tb else 0.0), **measured)

    def step(n, p):
        return parts(n, p)["step_ms"]

    def ms_per_context_token(n, p):
        """∂step/∂(cached positions the n decode rows read), `context_slope` on this step's terms: one more
        position costs `kv_token` bytes at the bandwidth or `attention_token` FLOPs at attention's FLOP/s."""
        d = parts(n, p)
        return context_slope(d["passes"], d["microbatches"], d["kv_memory_ms"] >= d["attention_compute_ms"],
                             t["kv_token"] / t["bandwidth"] * 1e3, t["attention_token"] / d["attention_flop_s"] * 1e3,
                             d["overlap_host"] & (d["sequences_ms"] > d["gpu_ms"] + d["fixed_ms"]))
    step.parts = parts
    step.ms_per_context_token = ms_per_context_token
    return step


def measured_parts(grid: dict, rows, prompt_tokens, tokens, prompt_len: float) -> dict:
    """A microbatch's GPU work from measured kernels (`measured_step.step_grid_tables` on MEASURED_GRID): the weight
    GEMMs and experts at all its tokens, decode attention at its rows, prefill attention at its prompt tokens,
    the LM head at the sequences that sample, the small kernels; each beside its datasheet roofline."""
    has_rows, has_prompt = rows > 0, prompt_tokens > 0
    sequences = rows + prompt_tokens / prompt_len
    out = {}
    for key, at, on in (("gemm", tokens, None), ("decode_attn", rows, has_rows),
                        ("prefill_attn", prompt_tokens, has_prompt), ("lm_head", np.maximum(sequences, 1.0), None),
                        ("elementwise", tokens, None)):
        for suffix in ("", "_ideal"):
            v = on_measured_grid(grid[key + suffix], at)
            out[f"measured_{key}{suffix}_ms"] = v if on is None else np.where(on, v, 0.0)
    out["measured_gpu_ms"] = sum(out[f"measured_{k}_ms"] for k in ("gemm", "decode_attn", "prefill_attn", "lm_head",
                                                                  "elementwise"))
    out["roofline_gpu_ms"] = sum(out[f"measured_{k}_ideal_ms"] for k in ("gemm", "decode_attn", "prefill_attn",
                                                                        "lm_head", "elementwise"))
    return out


def context_slope(passes, microbatches, kv_binds, kv_ms_per_position, attention_ms_per_position, hidden):
    """β = ∂step/∂A in ms per cached position, A the positions the n decode rows read in all (the step's
    `ms_per_context_token`, which `steady_state.context_dispersion` uses): each of the m microbatches holds A/m
    of them and the step runs `passes` of its stage, so
        β = passes/m · (KV bytes per position / bandwidth          where the KV read binds attention's roofline,
                        attention FLOPs per position / its FLOP/s   where its FLOPs do)
    and 0 where the host's per-sequence work overlaps the GPU's and is the longer (`hidden`:
    `latency.stage_with_host`)."""
    per = np.where(kv_binds, kv_ms_per_position, attention_ms_per_position)
    return np.where(hidden, 0.0, passes / microbatches * per)


def borrowed(profile, device: Device) -> bool:
    """Whether `profile` was measured on another device than `device` (the nearest profiled one); False for the
    closed form (no profile)."""
    return profile is not None and profile.device != device.name


def measured_efficiency(efficiency: Efficiency, stack: Stack, profile, device: Device) -> tuple:
    """With measured kernels the host's work per step is the stack's `measured_host` fit (the fitted MBU and MFU
    are not used), and a borrowed profile's compute-bound and memory-bound work are slowed by the fit's factors
    for the device's vendor (`derated`): (efficiency, (compute scale, memory scale)). The efficiency as given
    where the stack has no such fit."""
    host = stack.measured_host(device.vendor)
    if host is None:
        return efficiency, (1.0, 1.0)
    e = replace(efficiency, step_overhead_ms=host["step_overhead_ms"],
                sequence_overhead_us=host["sequence_overhead_us"])
    if not borrowed(profile, device):
        return e, (1.0, 1.0)
    return e, (host["borrowed_compute_scale"], host["borrowed_memory_scale"])


def step_cost(config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
              efficiency: Efficiency, link: Link | None, stack: Stack, decode_ctx: float, prompt_len: float,
              expert_imbalance: float | None = None, profile=None):
    """The deployment's mixed step, step(n decode rows, p prompt tokens) -> ms, vectorised (see the module
    docstring). The token-dependent parts (experts touched, collectives, expert imbalance) are computed by the
    scalar calculators on a log grid of tokens per microbatch and interpolated. With a device `profile`
    (`specs.profiles`), the GPU's work is priced op by op from measured kernels on the same grid
    (`measured_step.step_grid_tables`), and its TP all-reduces from the profile's measured all-reduce table
    (`measured_step.measured_collectives`), and a wide-EP mesh's all-to-alls from its measured all-to-all table
    where it has one; the host's work stays as above."""
    return mixed_step(*step_inputs(config, device, mesh, weight_dtype, kv_dtype, efficiency, link, stack, decode_ctx,
                                   prompt_len, expert_imbalance, profile))


def step_inputs(config: ModelConfig, device: Device, mesh: Mesh, weight_dtype: str, kv_dtype: str,
                efficiency: Efficiency, link: Link | None, stack: Stack, decode_ctx: float, prompt_len: float,
                expert_imbalance: float | None = None, profile=None, tables: dict | None = None) -> tuple:
    """`step_cost`'s (terms, tables) before `mixed_step` joins them: for a caller that stacks the steps of many
    candidates (the planner's wide-EP search). `tables`: this layout's `step_tables`, when the caller has them."""
    tables = dict(tables) if tables is not None else step_tables(config, mesh, link, stack, weight_dtype,
                                                                  expert_imbalance)
    if format_problem(profile, weight_dtype):            # INT4's weight-only kernels: the closed form prices them
        profile = None
    if profile is not None:
        efficiency, scale = measured_efficiency(efficiency, stack, profile, device)
        grid = step_grid_tables(profile, config, derated(device, *scale), mesh, weight_dtype, kv_dtype, decode_ctx,
                                prompt_len, MEASURED_GRID)
        if scale != (1.0, 1.0):              # the rooflines shown beside the ops stay the datasheet's
            ideal = step_grid_tables(profile, config, device, mesh, weight_dtype, kv_dtype, decode_ctx, prompt_len,
                                     MEASURED_GRID)
            grid.update({k: v for k, v in ideal.items() if k.endswith("_ideal")})
        tables["measured"] = grid
        tables["prompt_len"] = max(1.0, float(prompt_len))
        comm = measured_collectives(profile, config, mesh, link, stack, TOKEN_GRID, tables["comm"], weight_dtype,
                                    expert_imbalance)
        if comm is not None:
            tables["comm"] = comm
    return step_terms(config, device, mesh, weight_dtype, kv_dtype, efficiency, decode_ctx, prompt_len), tables


def pricing_words(profile, weight_dtype: str | None = None) -> str:
    """What a step was priced from, in words a JSON reader and a page show beside every number (a profile that
    has no GEMMs for `weight_dtype` did not price it: `step_inputs` took the closed form)."""
    problem = format_problem(profile, weight_dtype) if weight_dtype is not None else None
    if profile is None or problem:
        return ("closed form: datasheet rooflines at the stack's fitted efficiencies (specs/stacks.json); no kernels "
                "measured on this device and stack were used" + (f" ({problem})" if problem else ""))
    src = getattr(profile, "source", None) or {}
    origin = f"{src.get('kind', 'profile')} {src.get('version', '')}".strip()
    return (f"measured kernels: profile {profile.name} ({profile.stack} {profile.stack_version} on {profile.device}; "
            f"{origin}), each op interpolated in log space, the datasheet roofline beside it; collectives and host "
            f"work from specs/stacks.json")
