"""Prefix caching: KV entries of a shared prompt prefix computed once and reused (003 Detail 20).

Causal attention makes the K/V of position i depend only on tokens 0..i, so a byte-identical prefix yields
byte-identical KV entries: a request only prefills the tokens after the cached prefix.
"""
from __future__ import annotations

from calculators.units import check_int, check_nonneg
from specs.model_config import SpecError


def prefix_kv_bytes(prefix_tokens: int, kv_bytes_per_token: float) -> float:
    """KV of the cached prefix: tokens × bytes per token (500 × 22 KB ≈ 11 MB for TinyLlama)."""
    return check_int("prefix_tokens", prefix_tokens, minimum=0) * check_nonneg("kv_bytes_per_token",
                                                                             kv_bytes_per_token)


def prefill_with_prefix_cache(prompt_tokens: int, cached_prefix_tokens: int) -> dict:
    """Tokens left to prefill and the fraction of prefill saved: 508-token prompt, 500 cached -> 8 (98% less)."""
    p = check_int("prompt_tokens", prompt_tokens)
    c = check_int("cached_prefix_tokens", cached_prefix_tokens, minimum=0)
    if c > p:
        raise SpecError(f"cached prefix ({c}) is longer than the prompt ({p})")
    return dict(tokens_to_prefill=p - c, fraction_saved=c / p, percent_saved=100.0 * c / p)


def redundant_prefill(requests: int, prefix_tokens: int, unique_tokens_per_request: float) -> dict:
    """Without a prefix cache every request re-prefills the shared prefix: 100 requests × 500 tokens = 50,000
    shared vs 100 × 20 = 2,000 unique tokens -> 96% of the prefill is redundant."""
    n = check_int("requests", requests)
    shared = n * check_int("prefix_tokens", prefix_tokens, minimum=0)
    unique = n * check_nonneg("unique_tokens_per_request", unique_tokens_per_request)
    total = shared + unique
    return dict(shared_tokens=shared, unique_tokens=unique,
                redundant_fraction=shared / total if total else 0.0)


def cacheable_blocks(prefix_tokens: int, block_size: int = 16) -> dict:
    """A prefix at paged-block granularity: full blocks (cached) and the partial last one (not shared, or it
    would need copy-on-write). 500 tokens, blocks of 16 -> 31 full blocks + 4 tokens in a 32nd."""
    t, b = check_int("prefix_tokens", prefix_tokens, minimum=0), check_int("block_size", block_size)
    return dict(full_blocks=t // b, partial_block_tokens=t % b, total_blocks=-(-t // b))


def prefix_prefill_ms(step_model, prompt_tokens: int, cached_prefix_tokens: int) -> dict:
    """Prefill time without and with the cached prefix on a `batching.StepModel`: the whole prompt, versus only
    the tokens after the prefix (which still attend to the cached ones: start position = the prefix)."""
    t = prefill_with_prefix_cache(prompt_tokens, cached_prefix_tokens)
    full = step_model.prefill_ms(prompt_tokens)
    rest = step_model.prefill_ms(t["tokens_to_prefill"], cached_prefix_tokens) if t["tokens_to_prefill"] else 0.0
    return dict(full_ms=full, cached_ms=rest, saved_ms=full - rest, saved_percent=100.0 * (full - rest) / full)


def prefix_cache_numbers(step_model, prefix_tokens: int, unique_tokens: int, requests: int,
                         block_size: int = 16) -> dict:
    """Every number of the prefix-caching lesson for a prompt = shared prefix + unique tail, on a step model:
    prompt tokens, prefix KV bytes, tokens left to prefill, redundancy over `requests`, cacheable blocks and the
    prefill time without and with the cache."""
    p = check_int("prefix_tokens", prefix_tokens, minimum=0) + check_int("unique_tokens", unique_tokens)
    return dict(prompt_tokens=p, prefix_kv_bytes=prefix_kv_bytes(prefix_tokens, step_model.kv_bytes_per_token),
                saved=prefill_with_prefix_cache(p, prefix_tokens),
                redundant=redundant_prefill(requests, prefix_tokens, unique_tokens),
                blocks=cacheable_blocks(prefix_tokens, block_size), times=prefix_prefill_ms(step_model, p,
                                                                                           prefix_tokens))
