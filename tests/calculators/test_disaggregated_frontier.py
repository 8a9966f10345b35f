"""Disaggregated prefill/decode sizing against a worked example; the frontier's Pareto front against a brute-force
dominance check; near-duplicates collapsed."""
import math
import random

import pytest

from calculators.multi_gpu.tensor_parallel import Mesh
from calculators.planning.disaggregated import kv_handoff_ms, size_disaggregated
from calculators.planning.frontier import collapse_near_duplicates, pareto_front
from calculators.planning.request_latency import request_latency
from specs.devices import load_device, load_link
from specs.model_config import SpecError
from specs.presets import load_preset

L70, H100 = load_preset("llama-3-70b"), load_device("h100")


def test_kv_handoff_is_the_prompts_kv_over_the_network():
    # Llama-3-70B FP8 KV: 80 layers × 2 × 8 heads × 128 × 1 B = 163,840 B per token; 2,000 tokens = 327.7 MB over
    # 2 NDR NICs (50 GB/s each a direction) + 6.6 us
    ms = kv_handoff_ms(L70, 2000, "fp8", load_link("ib_ndr"), senders=2)
    assert ms == pytest.approx((6.6e-6 + 2000 * 163840 / (2 * 50e9)) * 1e3)


def test_worked_example_sizes_each_pool():
    # 10 requests/s of 2,000 in / 300 out, ITL target 40 ms, FP8 70B: prefill on TP 4, decode on TP 2 (H100s)
    r = size_disaggregated(L70, H100, Mesh(tp=4), H100, Mesh(tp=2), 10.0, 2000, 300, 40.0, "fp8", "fp8")
    pre = request_latency(L70, H100, Mesh(tp=4), 2000, 300, 1, "fp8", "fp8")["ttft_ms"]     # the deployment's step
    # worked: instances = ceil(rate × prefill / 1000 / 0.8); utilisation = rate × prefill / 1000 / instances
    n_pre = math.ceil(10 * pre / 1000 / 0.8)
    rho = 10 * pre / 1000 / n_pre
    assert r["prefill_instances"] == n_pre and r["prefill_gpus"] == 4 * n_pre
    hand = (6.6e-6 + 2000 * 163840 / (4 * 50e9)) * 1e3
    assert r["ttft_p99_ms"] == pytest.approx(pre + max(0, math.log(100 * rho)) * pre / (1 - rho) + hand)
    B, itl = r["decode_batch"], r["itl_ms"]
    # the decode batch is the largest whose ITL meets 40 ms: B meets it, B + 1 does not (or memory binds)
    assert itl <= 40.0
    nxt = request_latency(L70, H100, Mesh(tp=2), 2000, 300, B + 1, "fp8", "fp8")
    assert nxt["itl_ms"] > 40.0 or B == r["decode_batch"]
    # Little's law: rate × O × ITL / 1000 sequences in flight, B per instance
    assert r["decode_instances"] == math.ceil(10 * 300 * itl / 1000 / B)
    assert r["total_gpus"] == r["prefill_gpus"] + r["decode_gpus"]


def test_impossible_itl_is_one_message():
    with pytest.raises(SpecError, match="cannot meet an ITL of 1 ms"):
        size_disaggregated(L70, H100, Mesh(tp=4), H100, Mesh(tp=2), 1.0, 1000, 100, 1.0, "fp8", "fp8")


def _dominated(p, pts, x, y):
    return any(q[x] <= p[x] and q[y] <= p[y] and (q[x] < p[x] or q[y] < p[y]) for q in pts)


def test_pareto_front_equals_brute_force_dominance():
    rng = random.Random(1)
    pts = [dict(cost=rng.uniform(1, 10), ttft=rng.uniform(1, 10), device="d", gpus=1, batch_cap=1)
           for _ in range(300)]
    front = pareto_front(pts, "ttft", "cost")
    brute = sorted((p for p in pts if not _dominated(p, pts, "ttft", "cost")), key=lambda p: p["ttft"])
    assert front == brute


def test_a_plan_that_ties_on_one_axis_and_is_worse_on_the_other_is_dropped():
    """Ties are common (plans priced per whole GPU share a cost; a latency floor is shared): a plan as cheap as
    another but slower, or as fast but dearer, is dominated. Named cases, then a grid of small integers (every
    value tied many times, no two plans equal on both) against the brute-force dominance loop."""
    pts = [dict(cost=2.0, ttft=100.0), dict(cost=2.0, ttft=150.0),        # same cost, slower: dropped
           dict(cost=3.0, ttft=100.0),                                     # same latency, dearer: dropped
           dict(cost=1.0, ttft=300.0)]
    assert pareto_front(pts, "ttft", "cost") == [pts[0], pts[3]]
    rng = random.Random(2)
    grid = list({(rng.randint(1, 6), rng.randint(1, 6)) for _ in range(60)})
    pts = [dict(cost=float(c), ttft=float(t)) for c, t in grid]
    front = pareto_front(pts, "ttft", "cost")
    brute = sorted((p for p in pts if not _dominated(p, pts, "ttft", "cost")), key=lambda p: p["ttft"])
    assert front == brute


def test_near_duplicates_collapse_to_the_smallest_deployment():
    pts = [dict(cost=1.000, ttft=100.0, device="H100", gpus=8, batch_cap=64),
           dict(cost=1.005, ttft=100.5, device="H100", gpus=4, batch_cap=64),
           dict(cost=1.000, ttft=100.0, device="B200", gpus=4, batch_cap=64),
           dict(cost=2.0, ttft=50.0, device="H100", gpus=8, batch_cap=8)]
    out = collapse_near_duplicates(pts, "ttft", "cost")
    h100 = [p for p in out if p["device"] == "H100" and p["cost"] < 1.5]
    assert len(out) == 3 and len(h100) == 1 and h100[0]["gpus"] == 4 and h100[0]["represents"] == 2


def test_worked_example_where_each_pool_needs_several_instances():
    """40 requests/s of 2,000 in / 300 out, ITL 40 ms, FP8 70B on H100s (prefill TP 4, decode TP 2): worked by hand
    from the prefill time and the decode step the scalar calculators give, each pool needs several instances."""
    rate, P, O = 40.0, 2000, 300
    r = size_disaggregated(L70, H100, Mesh(tp=4), H100, Mesh(tp=2), rate, P, O, 40.0, "fp8", "fp8")
    pre = request_latency(L70, H100, Mesh(tp=4), P, O, 1, "fp8", "fp8")["ttft_ms"]
    n_pre = math.ceil(rate * pre / 1000 / 0.8)                     # utilisation kept at or below 80%
    B = r["decode_batch"]
    itl = request_latency(L70, H100, Mesh(tp=2), P, O, B, "fp8", "fp8")["itl_ms"]
    n_dec = math.ceil(rate * O * itl / 1000 / B)                   # sequences in flight / sequences per instance
    assert (r["prefill_instances"], r["decode_instances"]) == (n_pre, n_dec)
    assert n_pre >= 2 and n_dec >= 2
    assert r["total_gpus"] == 4 * n_pre + 2 * n_dec
    price = H100.price_usd_per_hour
    assert r["usd_per_million_tokens"] == pytest.approx(r["total_gpus"] * price / (rate * (P + O) * 3600) * 1e6)
