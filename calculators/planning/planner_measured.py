"""The planner's candidates priced from measured kernels: for every distinct (device, TP, PP, EP, weights, KV)
of a search whose device has a profile, the step's measured parts on MEASURED_GRID (`measured_step.step_grid_tables`),
flattened into one array with each candidate's offset, so the vectorised search reads them as it reads its
collectives (`planner._MixedStep`). The same tables as `step.step_cost` with that profile, so a plan's step
equals `serve-at`'s on the same layout.
"""
from __future__ import annotations

import numpy as np

from calculators.multi_gpu.tensor_parallel import Mesh, mesh_problem, stage_layers
from calculators.planning.measured_step import (MEASURED_GRID, MEASURED_LOG_GRID, attention_layers, derated,
                                                linear_layers, linear_prefill_op, prefill_attention_op,
                                                profile_support, step_grid_tables)
from calculators.planning.step import measured_efficiency
from calculators.sizing.latency import Efficiency
from specs.model_config import ModelConfig, SpecError

PARTS = ("gemm", "decode_attn", "prefill_attn", "lm_head", "elementwise")


def prompt_attention_ms(profile, config: ModelConfig, device, mesh: Mesh, kv_dtype: str, prompt_tokens: int) -> float:
    """One prompt of `prompt_tokens` alone: its causal attention in every layer of the busiest stage, measured."""
    total = 0.0
    for window, count in attention_layers(config, mesh):
        t = min(prompt_tokens, window) if window else prompt_tokens
        total += count * prefill_attention_op(profile, device, config, mesh, float(t), kv_dtype).ms * \
            prompt_tokens / t
    lin = linear_layers(config, mesh)
    if lin:
        total += lin * linear_prefill_op(profile, device, config, mesh, float(prompt_tokens)).ms
    return total


def measured_layouts(profiles: list, config: ModelConfig, devices, di, tp, pp, ep, wdi, kdi, weight_dtypes,
                     kv_dtypes, decode_ctx: float, prompt_len: float, prompt_lens: tuple, stack) -> dict | None:
    """Per candidate: whether measured kernels price it (`on`), its offset into the flat tables (`at`), the flat
    tables of PARTS on MEASURED_GRID, each prompt length's attention alone (`prompt_attn[P]`), and the host's
    work per step that goes with measured kernels (`step_overhead_ms`, `sequence_overhead_ms`:
    `step.measured_efficiency`). None when no candidate's device has a profile or the model is not one a profile
    can price."""
    if profile_support(config) is not None or not any(p is not None for p in profiles):
        return None
    n = len(di)
    on, at = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.intp)
    flat = {k: [] for k in PARTS}
    prompt_attn = {P: np.zeros(n) for P in prompt_lens}
    host_step, host_seq = np.full(n, np.nan), np.full(n, np.nan)
    width = len(MEASURED_GRID)
    keys = np.stack([di, tp, pp, ep, wdi, kdi], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.ravel()
    for u, (d, t, q, e, w, k) in enumerate(uniq):
        prof = profiles[int(d)]
        mesh = Mesh(tp=int(t), pp=int(q), ep=int(e), gpus=int(t * q))
        if prof is None or mesh_problem(config, mesh) is not None:
            continue
        eff, scale = measured_efficiency(Efficiency(), stack, prof, devices[int(d)])
        try:
            g, pa = _one_stage(prof, config, derated(devices[int(d)], *scale), int(t), int(e), weight_dtypes[int(w)],
                               kv_dtypes[int(k)], decode_ctx, prompt_len, prompt_lens)
        except SpecError:                        # a format the profile has no table for: the closed form prices it
            continue
        layers = stage_layers(config, int(q)) / config.num_layers      # a pipeline stage runs its share of them
        g = {key: (v if key == "lm_head" else v * layers) for key, v in g.items()}
        pa = {P: v * layers for P, v in pa.items()}
        sel = inv == u
        on[sel] = True
        at[sel] = len(flat["gemm"]) * width
        for key in PARTS:
            flat[key].append(g[key])
        for P in prompt_lens:
            prompt_attn[P][sel] = pa[P]
        if stack.measured_host(devices[int(d)].vendor) is not None:
            host_step[sel], host_seq[sel] = eff.step_overhead_ms, eff.sequence_overhead_us / 1e3
    if not on.any():
        return None
    return dict(on=on, at=at, flat={k: np.concatenate(v) for k, v in flat.items()}, prompt_attn=prompt_attn,
                step_overhead_ms=host_step, sequence_overhead_ms=host_seq)


_STAGES: dict = {}
STAGES_KEPT = 2048      # a long-running app answers many workloads: the oldest tables go first past this many


def _one_stage(profile, config: ModelConfig, device, tp: int, ep: int, weight_dtype: str, kv_dtype: str,
               decode_ctx: float, prompt_len: float, prompt_lens: tuple):
    """The measured tables of a whole model (PP 1) at TP `tp` × EP `ep`, and each prompt length's attention,
    computed once per process for the same question (a search asks it for every PP and batch cap, and a page
    asks the same search again)."""
    key = (id(profile), config.name, config.num_layers, config.hidden_size, device.name,
           tuple(sorted(device.peak_flops.items())), tp, ep, weight_dtype,
           kv_dtype, round(decode_ctx, 3), round(prompt_len, 3), tuple(prompt_lens))
    hit = _STAGES.get(key)
    if hit is None:
        mesh = Mesh(tp=tp, ep=ep, gpus=tp)
        g = step_grid_tables(profile, config, device, mesh, weight_dtype, kv_dtype, decode_ctx, prompt_len,
                             MEASURED_GRID)
        pa = {P: prompt_attention_ms(profile, config, device, mesh, kv_dtype, P) for P in prompt_lens}
        if len(_STAGES) >= STAGES_KEPT:
            del _STAGES[next(iter(_STAGES))]       # dicts keep insertion order: the oldest entry
        hit = _STAGES[key] = (profile, g, pa)
    return hit[1], hit[2]


def read(flat: np.ndarray, at: np.ndarray, tokens) -> np.ndarray:
    """A candidate's table (starting at `at` in `flat`) at `tokens` (≥ 1), linear in log tokens."""
    pos = np.interp(np.log(np.maximum(tokens, 1.0)), MEASURED_LOG_GRID, np.arange(len(MEASURED_LOG_GRID), dtype=float))
    i0 = np.minimum(pos.astype(np.intp), len(MEASURED_LOG_GRID) - 2)
    f = pos - i0
    i0 = i0 + at
    return flat.take(i0) * (1 - f) + flat.take(i0 + 1) * f


def gpu_ms(m: dict, rows, prompt_tokens, tokens, prompt_len: float, idx=None) -> np.ndarray:
    """The measured GPU work of a microbatch (`step.measured_parts`, read from the flat tables) for candidates
    `idx` (all when None): GEMMs at its tokens, decode attention at its rows, prefill attention at its prompt
    tokens, the LM head at the sequences that sample, the small kernels."""
    at = m["at"] if idx is None else m["at"][idx]
    rows, prompt_tokens, tokens = (np.asarray(x, dtype=float) for x in (rows, prompt_tokens, tokens))
    f = m["flat"]
    out = read(f["gemm"], at, tokens) + read(f["elementwise"], at, tokens)
    out = out + np.where(rows > 0, read(f["decode_attn"], at, rows), 0.0)
    out = out + np.where(prompt_tokens > 0, read(f["prefill_attn"], at, prompt_tokens), 0.0)
    return out + read(f["lm_head"], at, np.maximum(rows + prompt_tokens / prompt_len, 1.0))
