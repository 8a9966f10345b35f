"""MoE across GPUs: all-to-all volumes against a loop over tokens and experts (bytes between ranks), imbalance against brute-force
routing, EP that does not divide the experts refused in one message, EP across data-parallel replicas."""
import dataclasses
import itertools
import math
import random

import pytest

from calculators.multi_gpu.moe import (all_to_all_bytes, dispatch_copies_per_token, moe_layer_comm_ms,
                                       routing_imbalance)
from calculators.multi_gpu.tensor_parallel import Mesh, check_mesh, decode_step_parallel, per_gpu_weight_bytes
from calculators.sizing.params import param_breakdown
from specs.devices import device_link, load_device
from specs.model_config import SpecError
from specs.presets import load_preset

QWEN30 = load_preset("qwen3-30b-a3b")      # 128 experts, 8 per token, hidden 2,048


def _remote_gpus_by_loop(E, k, ep):
    """Every k-subset of experts, equally likely: the mean number of distinct GPUs other than GPU 0 (the token's
    own) that hold at least one chosen expert (experts e live on GPU e // (E / ep))."""
    per = E // ep
    total = n = 0
    for chosen in itertools.combinations(range(E), k):
        total += len({e // per for e in chosen} - {0})
        n += 1
    return total / n


@pytest.mark.parametrize("E,k,ep", [(8, 2, 4), (8, 2, 2), (16, 4, 4), (12, 3, 6), (8, 1, 8)])
def test_deduplicated_copies_per_token_equal_a_loop_over_expert_choices(E, k, ep):
    assert dispatch_copies_per_token(E, k, ep) == pytest.approx(_remote_gpus_by_loop(E, k, ep), rel=1e-12)


def test_without_dedup_a_token_goes_once_per_remote_expert():
    # 8 of 128 experts over 8 GPUs: 7/8 of the 8 copies leave the GPU
    assert dispatch_copies_per_token(128, 8, 8, dedup=False) == pytest.approx(7.0)
    # dedup: 7 × (1 − C(112, 8)/C(128, 8)) remote GPUs, fewer than 7 copies
    d = dispatch_copies_per_token(128, 8, 8)
    assert d == pytest.approx(7 * (1 - math.comb(112, 8) / math.comb(128, 8))) and d < 7


def test_all_to_all_bytes_are_tokens_times_copies_times_hidden():
    # 64 tokens of Qwen3-30B-A3B (D 2,048, bf16) over EP 8 without dedup: 64 × 7 × 2,048 × 2 B
    assert all_to_all_bytes(64, QWEN30, 8, "bf16", dedup=False) == 64 * 7 * 2048 * 2


def _bytes_sent_by_loop(config, ep, dedup):
    """Every rank holds one token per k-subset of the experts (uniform routing, every choice once); loop over the
    ranks, their tokens and each token's experts, adding hidden × 2 bytes to the (source, destination) pair for
    every remote rank the token goes to (once per rank with dedup, once per expert without). Returns the byte
    matrix and the tokens per rank."""
    E, k, D = config.num_experts, config.num_experts_per_tok, config.hidden_size
    per = E // ep
    sent = [[0] * ep for _ in range(ep)]
    tokens = 0
    for src in range(ep):
        for chosen in itertools.combinations(range(E), k):
            tokens += src == 0
            ranks = [e // per for e in chosen]
            for dst in (set(ranks) if dedup else ranks):
                if dst != src:
                    sent[src][dst] += D * 2
    return sent, tokens


@pytest.mark.parametrize("E,k,ep", [(8, 2, 4), (12, 3, 3), (16, 2, 8)])
@pytest.mark.parametrize("dedup", [True, False])
def test_all_to_all_bytes_equal_a_loop_over_tokens_and_experts_counting_bytes_between_ranks(E, k, ep, dedup):
    """What one rank sends in a dispatch (and gets back in the combine) for its tokens: every rank the same, the
    (source, destination) matrix symmetric, and each rank's row total what `all_to_all_bytes` says."""
    cfg = dataclasses.replace(QWEN30, num_experts=E, num_experts_per_tok=k)
    sent, tokens = _bytes_sent_by_loop(cfg, ep, dedup)
    assert all(sent[a][b] == sent[b][a] for a in range(ep) for b in range(ep))
    for row in sent:
        assert sum(row) == pytest.approx(all_to_all_bytes(tokens, cfg, ep, "bf16", dedup=dedup), rel=1e-12)


def test_one_moe_layer_is_two_all_to_alls_of_those_bytes():
    link = device_link(load_device("h100"))
    b = 64 * 7 * 2048 * 2
    one = (6.6e-6 + 7 * 0.6e-6 + b / 450e9) * 1e3
    assert moe_layer_comm_ms(64, QWEN30, 8, link, dedup=False) == pytest.approx(2 * one)


def _brute_imbalance(T, E, k, ep, trials, seed=0):
    rng = random.Random(seed)
    per = E // ep
    ratios = []
    for _ in range(trials):
        load = [0] * ep
        for _ in range(T):
            for e in rng.sample(range(E), k):
                load[e // per] += 1
        ratios.append(max(load) / (T * k / ep))
    return sum(ratios) / trials


@pytest.mark.parametrize("T,E,k,ep", [(64, 128, 8, 8), (16, 64, 4, 4), (256, 32, 4, 8)])
def test_imbalance_matches_brute_force_routing(T, E, k, ep):
    # the normal approximation with Blom's expected maximum, against 300 routed batches: within 3%
    assert routing_imbalance(T, E, k, ep) == pytest.approx(_brute_imbalance(T, E, k, ep, 300), rel=0.03)


def test_imbalance_knob_sets_the_pace_and_must_be_at_least_one():
    """The busiest EP rank computes more; it also receives more where the stack runs DeepEP's all-to-all, not
    where the ranks all-gather every token (the stacks' default)."""
    from dataclasses import replace
    from specs.stacks import load_stack
    c, dev = QWEN30, load_device("h100")
    deepep = replace(load_stack("vllm"), doc={**load_stack("vllm").doc, "moe_dp_comm": "all_to_all"})
    for stack, comm_moves in ((None, False), (deepep, True)):
        even = decode_step_parallel(c, dev, Mesh(tp=1, ep=8, gpus=8), 1000, 256, "fp8", stack=stack,
                                    expert_imbalance=1.0)
        skew = decode_step_parallel(c, dev, Mesh(tp=1, ep=8, gpus=8), 1000, 256, "fp8", stack=stack,
                                    expert_imbalance=2.0)
        assert skew["compute_ms"] > even["compute_ms"]
        assert (skew["comm_ms_per_stage"] > even["comm_ms_per_stage"]) == comm_moves
    with pytest.raises(SpecError, match="at least 1"):
        decode_step_parallel(c, dev, Mesh(tp=1, ep=8, gpus=8), 1000, 8, "fp8", expert_imbalance=0.5)


def test_ep_that_does_not_divide_the_experts_is_one_clear_message():
    with pytest.raises(SpecError, match="EP 6 does not divide Qwen3-30B-A3B's 128 experts: choose EP among 1, 2, 4"):
        check_mesh(QWEN30, Mesh(tp=1, ep=6, gpus=6))
    with pytest.raises(SpecError, match="needs a mixture-of-experts model"):
        check_mesh(load_preset("llama-3-8b"), Mesh(tp=2, ep=2))
    with pytest.raises(SpecError, match="not a multiple of EP 8"):
        check_mesh(QWEN30, Mesh(tp=2, ep=8, gpus=6))


def test_ep_across_replicas_splits_routed_experts_ep_ways_and_the_rest_tp_ways():
    b = param_breakdown(QWEN30)
    w = per_gpu_weight_bytes(QWEN30, Mesh(tp=1, ep=8, gpus=8), "bf16")
    one = per_gpu_weight_bytes(QWEN30, Mesh(), "bf16")
    assert w == pytest.approx(one - b.experts_routed * 2 * (1 - 1 / 8))


def test_shared_experts_and_interleaved_moe_layers_are_counted():
    mav = load_preset("llama-4-maverick")       # MoE every 2nd layer, one shared expert each
    b = param_breakdown(mav)
    assert mav.moe_layer_step == 2 and mav.num_shared_experts == 1
    assert b.experts_routed == 24 * 128 * 3 * 5120 * 8192
