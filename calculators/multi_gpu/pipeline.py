"""Pipeline parallelism: layers per stage, the bubble, stage-boundary transfers and latency with microbatches
(GPipe, Huang et al. 2018; 003 Detail 22).

A pipeline splits the layers into p stages on p devices. One request still visits every stage in turn, so its
latency is the whole model's time plus the sends between stages: PP adds memory (capacity) and, with enough
microbatches in flight, throughput, but never single-request speed. With m microbatches a pass takes
(m + p − 1) stage-times instead of m·p / p: the idle share is the bubble (p − 1)/(m + p − 1).
"""
from __future__ import annotations

from calculators.multi_gpu.parallel import pipeline_bubble_fraction
from calculators.units import check_int, check_nonneg
from specs.model_config import SpecError


def layers_per_stage(num_layers: int, stages: int) -> list[int]:
    """Balanced split of L layers over p stages, the first stages taking the remainder: 80 over 3 -> 27, 27, 26."""
    L, p = check_int("num_layers", num_layers), check_int("stages", stages)
    if p > L:
        raise SpecError(f"{p} stages for {L} layers: a stage needs at least one layer")
    return [L // p + (1 if i < L % p else 0) for i in range(p)]


def pipeline_pass_ms(stage_ms: float, stages: int, microbatches: int) -> float:
    """Time for m microbatches to pass p stages of `stage_ms` each: (m + p − 1) × stage_ms (GPipe schedule)."""
    p, m = check_int("stages", stages), check_int("microbatches", microbatches)
    return (m + p - 1) * check_nonneg("stage_ms", stage_ms)


def bubble_table(stages: int, microbatches: tuple[int, ...] = (1, 4, 16, 64)) -> list[dict]:
    """003 Detail 22's table: p = 4 stages, m = 1, 4, 16, 64 -> 75%, 43%, 16%, ≈ 4% idle."""
    return [dict(stages=stages, microbatches=m, bubble_percent=100 * pipeline_bubble_fraction(stages, m),
                 pass_stage_times=m + stages - 1) for m in microbatches]
