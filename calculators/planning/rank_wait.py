"""Attention data parallel waits for its busiest rank.

With attention data-parallel and experts spread over the EP group (attention DP, `Mesh.ep > Mesh.tp`), the R = ep /
tp attention ranks of a group meet in every MoE layer: a step ends when the slowest rank does. Each rank runs its
own requests' attention and dense layers, so a rank that takes a new prompt this step holds the R − 1 others
waiting while it prefills it. TensorRT-LLM's ADP balance blog (docs/source/blogs/tech_blog/
blog10_ADP_Balance_Strategy.md: "the execution time for the Attention module in any given iteration is bounded by
the rank with the highest workload") measured DeepSeek-V3 on 8 GB200 at attention DP 8, EP 8: the default
round-robin placement ran at 25,664 output tokens/s where the same iterations at their mean load would have run
39,552, a mean balance ratio (mean tokens / busiest rank's) of 54%.

The mean-load step (`step.step_cost` of one rank) prices the experts right (they see every rank's tokens: the sum)
but the ranks' own work at the mean. Under random arrivals this module adds the expected wait:

    K ~ Poisson(R·μ)   the group's new prompts in a step, dealt round-robin from a random rank (the default
                       scheduler: requests sorted by tokens, dealt to the ranks in turn), so the busiest rank takes
                       ⌈K/R⌉ and a given rank ⌈K/R⌉ with probability (K mod R)/R, else ⌊K/R⌋
    μ = n / (O − 1)    prompts a rank takes per step in the steady state: as many as its n decode rows finish
    T(j) = min(j·I, C) the prompt tokens j prompts of mean length I put in a step under the budget C
    wait(n) = s · E[step(n, T(⌈K/R⌉)) − step(n, T(own))]
            = s · Σ_j Σ_{r=1..R−1} P(K = jR + r) · (1 − r/R) · (step(n, T(j + 1)) − step(n, T(j)))
    s                  the rank's own share of a prompt token's FLOPs: everything but the routed experts
                       (`local_share`); the experts' part of a step is the group's, priced at the sum already.

An offline run of fixed lengths starts and finishes its requests on every rank in the same steps (lockstep: no
wait); a Poisson stream, or lengths that vary, deals them at random. Requests' decode rows stay balanced (a rank
takes new requests when it has fewest), so only the prompts wait. The step functions returned keep the wrapped
step's interface (`parts` gains `rank_wait_ms`, included in `step_ms`).
"""
from __future__ import annotations

import math

import numpy as np

from calculators import arch
from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.measured_step import read_log_grid
from calculators.sizing.roofline import step_ops
from specs.model_config import ModelConfig

ROWS_GRID = np.unique(np.round(np.geomspace(1, 1 << 17, 72)))      # decode rows per rank the wait is tabled at
LOG_ROWS = np.log(ROWS_GRID)
MAX_LEVELS = 64                                                    # prompts the busiest rank may take in a step
ROUTED = ("experts_gate_up", "experts_silu_mul", "experts_down")


def attention_dp_ranks(mesh: Mesh) -> int:
    """The attention ranks whose MoE layers run together: ep / tp with attention DP (EP across replicas), else 1."""
    return mesh.ep // mesh.tp if mesh.ep > mesh.tp else 1


def local_share(config: ModelConfig, prompt_tokens: float) -> float:
    """The share of a prompt's FLOPs its own rank runs: all but the routed experts' (`roofline.step_ops` of one
    prompt of `prompt_tokens`); 1 for a dense model."""
    if not arch.is_moe(config):
        return 1.0
    P = max(1, int(round(prompt_tokens)))
    ops = step_ops(config, P, P)
    total = sum(o.flops * o.count for o in ops)
    routed = sum(o.flops * o.count for o in ops if o.name in ROUTED)
    return 1.0 - routed / total if total > 0 else 1.0


def _poisson_pmf(mean, upto: int) -> np.ndarray:
    """P(K = k) for k = 0..upto−1 of Poisson(mean), `mean` any shape: [..., upto]."""
    m = np.asarray(mean, dtype=float)[..., None]
    k = np.arange(upto, dtype=float)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, upto, dtype=float)))])
    with np.errstate(divide="ignore"):
        logp = k * np.log(m) - m - log_fact
    return np.where(m > 0, np.exp(logp), (k == 0).astype(float))


def busiest_rank_weights(mean_prompts, ranks: int, levels: int) -> np.ndarray:
    """w[..., j] = Σ_{r=1..R−1} P(K = jR + r)·(1 − r/R), j = 0..levels−1, K ~ Poisson(R·mean_prompts): the weight
    of the step between j and j + 1 prompts in E[busiest rank's step − a given rank's step] (module docstring).
    `mean_prompts` any shape, R one whole number of ranks."""
    R = int(ranks)
    mu = np.asarray(mean_prompts, dtype=float)
    out = np.zeros(mu.shape + (levels,))
    if R < 2:
        return out
    pmf = _poisson_pmf(R * mu, levels * R)
    share = 1.0 - np.arange(1, R) / R                                # (1 − r/R), r = 1..R−1
    for j in range(levels):
        out[..., j] = pmf[..., j * R + 1:(j + 1) * R] @ share
    return out


def levels_for(mean_prompts_max: float, ranks_min: float, prompt_tokens: float, chunk: float) -> int:
    """How many prompt counts of the busiest rank matter: up to the budget's (T saturates at C), and past the
    Poisson tail of R·μ no further."""
    lam = max(0.0, mean_prompts_max) * max(1.0, ranks_min)
    tail = lam + 10 * math.sqrt(lam) + 10
    cap = math.ceil(chunk / max(prompt_tokens, 1.0)) if math.isfinite(chunk) else math.inf
    return int(max(1, min(MAX_LEVELS, cap, math.ceil(tail / max(1.0, ranks_min)) + 1)))


def with_rank_wait(step, ranks, share, prompt_tokens: float, decode_tokens: float, chunk: float = math.inf,
                   max_rows: float = float(ROWS_GRID[-1])):
    """`step` (step(n, p) -> ms of one rank at the mean load, `step.mixed_step`'s interface) plus the wait for the
    busiest rank, wait(n) of the module docstring, tabled on ROWS_GRID up to `max_rows` and read linearly in log
    rows. `ranks` and `share` are numbers, or arrays over the K candidates of a stacked step (its last axis);
    ranks 1 everywhere returns `step` itself."""
    R = np.asarray(ranks, dtype=float)
    if not np.any(R > 1):
        return step
    S = np.asarray(share, dtype=float)
    stacked = R.ndim == 1
    I, O = max(float(prompt_tokens), 1.0), max(float(decode_tokens), 1.0)
    rows = ROWS_GRID[:max(2, int(np.searchsorted(ROWS_GRID, 2 * max(max_rows, 1.0))) + 1)]
    n = rows[:, None] if stacked else rows
    mu = rows / O
    L = levels_for(float(np.max(mu)), float(np.min(R[R > 1])), I, chunk)
    distinct, which = np.unique(R, return_inverse=True)             # a few rank counts among many candidates
    w = np.stack([busiest_rank_weights(mu, int(r), L) for r in distinct], axis=1)[:, which.ravel(), :]
    w = w if stacked else w[:, 0, :]                               # [G(, K), L]
    shape = np.broadcast_shapes(n.shape, R.shape)
    steps = [np.asarray(step(n, np.full(shape, min(j * I, chunk))), dtype=float) for j in range(L + 1)]
    wait = S * sum(w[..., j] * (steps[j + 1] - steps[j]) for j in range(L))
    table = np.asarray(wait).T if stacked else np.asarray(wait)     # [K, G] or [G]
    return waiting_step(step, table, np.log(rows))


def waiting_step(step, table, log_rows):
    """`step` plus the wait tabled on the rows whose logs are `log_rows` (`with_rank_wait`'s table, [G], or [K, G]
    for a stacked step: a subset of its candidates takes the rows of that subset). The step function returned has
    `step`'s interface; `rank_wait(n)` reads the wait, `table` and `log_rows` are kept for such subsets."""
    def rank_wait(n_rows):
        return read_log_grid(table, log_rows, np.asarray(n_rows, dtype=float))

    def waited(n_rows, p):
        return step(n_rows, p) + rank_wait(n_rows)

    def parts(n_rows, p) -> dict:
        d = dict(step.parts(n_rows, p))
        d["rank_wait_ms"] = rank_wait(np.broadcast_to(np.asarray(n_rows, dtype=float), np.shape(d["step_ms"])))
        d["step_ms"] = d["step_ms"] + d["rank_wait_ms"]
        return d
    waited.parts = parts
    waited.ms_per_context_token = step.ms_per_context_token
    waited.rank_wait, waited.table, waited.log_rows = rank_wait, table, log_rows
    return waited


def rank_wait_words(wait_ms: float, step_ms: float, ranks: int) -> str:
    """The wait in a sentence a page shows beside the step ('' where there is none)."""
    if ranks < 2 or not wait_ms > 0 or not math.isfinite(step_ms):
        return ""
    return (f" Of each {step_ms:,.0f} ms step, {wait_ms:,.1f} ms is spent waiting for the busiest of the {ranks} "
            "attention ranks: a new request's prompt is prefilled on one rank, and every MoE layer waits for it.")


def busiest_rank_prompts(mean_prompts, ranks: int) -> np.ndarray:
    """E[⌈K/R⌉], K ~ Poisson(R·μ): the prompts the busiest of R attention ranks prefills in a step when each
    takes μ a step on average, dealt round-robin (module docstring) = μ + Σ_j w_j; μ itself for one rank."""
    mu = np.asarray(mean_prompts, dtype=float)
    if int(ranks) < 2:
        return mu.copy()
    levels = levels_for(float(np.max(mu)) if mu.size else 0.0, int(ranks), 1.0, math.inf)
    return mu + busiest_rank_weights(mu, int(ranks), levels).sum(axis=-1)


def busiest_rank_claim(mean_prompts: float, ranks: int) -> str:
    """The lesson's sentence: how often a step carries a prompt on one rank, and somewhere among `ranks`."""
    alone, some = 1 - math.exp(-mean_prompts), 1 - math.exp(-ranks * mean_prompts)
    busiest = float(busiest_rank_prompts(mean_prompts, ranks))
    return (f"At {mean_prompts:g} new prompts per rank per step, one rank alone prefills in {alone:.0%} of its "
            f"steps; with {ranks} attention ranks some rank prefills in {some:.0%} of them, and every rank's step "
            f"waits for it: the busiest rank prefills {busiest:.2f} prompts a step where the mean is "
            f"{mean_prompts:g} ({busiest / mean_prompts:.1f}×).")
