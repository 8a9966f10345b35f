"""Speculative decoding: tokens per target pass, speedup, and memory for draft + target.

003 Detail 19; Leviathan et al. 2022 (arXiv:2211.17192). With K draft tokens, each accepted with probability α
given that the previous ones were, the expected number of tokens one target pass yields (accepted + the bonus
or corrected token) is
    E[tokens] = 1 + α + α² + … + α^K = (1 − α^(K+1)) / (1 − α)
K = 4: α 0.8 -> 3.36 (≈ 3.4), 0.5 -> 1.94 (≈ 1.9), 0.2 -> 1.25 (≈ 1.2).
"""
from __future__ import annotations

from calculators.sizing.params import weight_bytes
from calculators.units import check_int, check_nonneg
from specs.model_config import SpecError


def expected_tokens_per_pass(acceptance: float, draft_tokens: int = 4) -> float:
    """(1 − α^(K+1)) / (1 − α); K + 1 when every draft is accepted (α = 1)."""
    if isinstance(acceptance, bool) or not isinstance(acceptance, (int, float)) or not 0 <= acceptance <= 1:
        raise SpecError(f"acceptance must be in [0, 1], got {acceptance!r}")
    k = check_int("draft_tokens", draft_tokens, minimum=0, limit=1024)
    if acceptance == 1:
        return float(k + 1)
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


def speculative_speedup(acceptance: float, draft_tokens: int = 4, draft_cost_ratio: float = 0.1) -> float:
    """Wall-clock speedup over plain decoding when a draft step costs `draft_cost_ratio` of a target step and a
    verification pass costs one target step (bandwidth-bound regime): E[tokens] / (1 + K·c) (Leviathan et al.)."""
    k = check_int("draft_tokens", draft_tokens, minimum=0, limit=1024)
    c = check_nonneg("draft_cost_ratio", draft_cost_ratio, limit=1e3)
    return expected_tokens_per_pass(acceptance, k) / (1 + k * c)


def speculative_memory_bytes(target_params: float, draft_params: float, dtype: str = "fp16") -> dict:
    """Weights of both models: 003: TinyLlama 2.2 GB + a 125M draft ≈ 250 MB ≈ 2.45 GB (plus both KV caches)."""
    t, d = weight_bytes(target_params, dtype), weight_bytes(draft_params, dtype)
    return dict(target_bytes=t, draft_bytes=d, total_bytes=t + d)
