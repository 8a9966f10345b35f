"""KV allocation under load (calculators/serving/kv_allocation.py): 003 Details 15-16's numbers where they apply, the
first-fit walk-through, and the invariants (no over-commit, paged waste ≤ block_size − 1 per sequence, no request
lost or run twice)."""
import numpy as np
import pytest

from calculators.serving.kv_allocation import POLICIES, FirstFitPool, compare_allocators, simulate_kv_allocation
from calculators.serving.paging import REFERENCE_WALKTHROUGH, blocks_needed, contiguous_walkthrough, empty_slots
from calculators.serving.workload import Workload, synthetic_workload
from specs.model_config import SpecError

PER_TOKEN_45MB = 45e6 / 2048                   # the text's "45 MB / 2,048 tokens"


def workload(arrivals, prompts, outputs) -> Workload:
    return Workload(np.array(arrivals, float), np.array(prompts), np.array(outputs))


def last_step_of(r, request):
    return r.timeline["step"] == r.finish_step[request]


# ------------------------------------------------------------------------------------------ 003's numbers
def test_first_fit_pool_replays_the_walkthrough_660_MB_free_but_only_the_tail_holds_200():
    pool = FirstFitPool(1000)
    for ev in REFERENCE_WALKTHROUGH:
        pool.alloc(ev[1], ev[2]) if ev[0] == "alloc" else pool.free(ev[1])
    # the same events through paging.contiguous_walkthrough (an independent first-fit, merging holes)
    assert pool.layout() == contiguous_walkthrough(1000, REFERENCE_WALKTHROUGH, coalesce=True)[-1]["layout"]
    assert pool.layout() == [("D", 60), (None, 190), ("C", 80), ("E", 200), (None, 470)]
    assert sum(pool.holes()) == 660
    assert pool.alloc("F", 200) == 530                       # only the 470 MB tail takes F
    assert pool.alloc("G", 300) is None and sum(pool.holes()) == 460      # 460 free, no 300 hole


def test_a_50_token_request_reserving_2048_slots_wastes_97_5_percent_paged_leaves_14_empty_slots():
    w = workload([0.0], [10], [40])                          # 10-token prompt + 40 generated = 50 positions
    res = simulate_kv_allocation(w, "reserve", 4096, step_s=0.01, max_tokens=2048)
    end = last_step_of(res, 0)
    used, alloc = res.timeline["used"][end][0], res.timeline["allocated"][end][0]
    assert (used, alloc) == (50, 2048)
    assert round(alloc * PER_TOKEN_45MB / 1e6) == 45 and round(used * PER_TOKEN_45MB / 1e6, 1) == 1.1
    assert 97.5 <= 100 * (alloc - used) / alloc < 97.6
    paged = simulate_kv_allocation(w, "paged", 4096, step_s=0.01, block_size=16)
    end = last_step_of(paged, 0)
    assert paged.timeline["allocated"][end][0] == 16 * blocks_needed(50, 16) == 64
    assert paged.timeline["allocated"][end][0] - paged.timeline["used"][end][0] == empty_slots(50, 16) == 14


def test_50_sequences_of_500_tokens_reserve_2_25_GB_paged_at_most_used_plus_15_slots_each():
    w = workload([0.0] * 50, [490] * 50, [10] * 50)          # all 50 hold 500 positions at their last step
    res = compare_allocators(w, 200_000, step_s=0.01, block_size=16, max_tokens=2048)
    peak = {p: int(res[p].timeline["allocated"].max()) for p in POLICIES}
    assert peak["reserve"] * PER_TOKEN_45MB == pytest.approx(2.25e9)
    used = int(res["paged"].timeline["used"].max())
    assert used == 50 * 500 and round(used * PER_TOKEN_45MB / 1e6, -1) == 550
    assert peak["paged"] == 50 * 16 * blocks_needed(500, 16)               # 32 blocks each: 12 empty slots
    assert peak["paged"] - used <= 50 * 15                                  # the text's worst case, ≈ 17 MB
    assert round((peak["reserve"] - peak["paged"]) * PER_TOKEN_45MB / 1e9, 1) == 1.7   # ≈ 1.7 GB freed


# ------------------------------------------------------------------------------------------ invariants
@pytest.fixture(scope="module")
def tight():
    w = synthetic_workload(250, 25, 200, 150, prompt_kind="uniform", output_kind="exponential", max_tokens=2048,
                           seed=2)
    return w, compare_allocators(w, 12_000, step_s=0.02, block_size=16, max_tokens=2048)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_finishes_exactly_once_and_the_pool_is_never_over_committed(tight, policy):
    w, res = tight
    r = res[policy]
    t = r.timeline
    assert np.all(r.finish_step >= r.admitted_step) and np.all(r.admitted_step >= r.arrival_step)
    assert r.admissions - r.preemptions == len(w)             # every preempted request came back once more
    assert np.all(t["allocated"] <= 12_000) and np.all(t["used"] <= t["allocated"])
    assert np.array_equal(t["free"], 12_000 - t["allocated"])


def test_paged_waste_is_at_most_block_size_minus_one_per_sequence(tight):
    _, res = tight
    r = res["paged"]
    t = r.timeline
    assert r.max_slack_per_sequence <= 15
    assert np.all(t["allocated"] - t["used"] <= 15 * t["running"])
    assert np.all(t["allocated"] % 16 == 0)


def test_reserve_for_max_caps_the_batch_at_pool_over_max_context(tight):
    _, res = tight
    assert res["reserve"].summary()["max_batch"] == 12_000 // 2048          # 5 slabs of 2,048
    assert res["reserve"].preemptions == 0


def test_paging_runs_a_bigger_batch_and_finishes_sooner_than_contiguous_and_reserve(tight):
    _, res = tight
    s = {p: res[p].summary() for p in POLICIES}
    assert s["paged"]["max_batch"] > 3 * s["reserve"]["max_batch"]
    assert s["paged"]["steps"] < s["contiguous"]["steps"] < s["reserve"]["steps"]
    assert s["contiguous"]["relocations"] > 0 and s["paged"]["relocations"] == 0
    assert s["reserve"]["mean_waste_fraction"] > 0.5 > 0.05 > s["paged"]["mean_waste_fraction"]


def test_contiguous_refuses_requests_that_total_free_memory_could_hold(tight):
    _, res = tight
    assert res["contiguous"].refused_by_fragmentation > 0
    t = res["contiguous"].timeline
    assert np.any(t["free"] > t["largest_hole"])              # free space split into several holes


def test_paged_block_tables_hold_distinct_blocks():
    w = synthetic_workload(40, 50, 100, 60, seed=4)
    r = simulate_kv_allocation(w, "paged", 4000, step_s=0.02, block_size=16)
    blocks = [b for table in r.block_tables.values() for b in table]
    assert blocks and len(blocks) == len(set(blocks)) and max(blocks) < 4000 // 16


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, message", [
    (dict(policy="paged", capacity_tokens=4000, block_size=0), "block size"),
    (dict(policy="paged", capacity_tokens=4000, block_size=-16), "block size"),
    (dict(policy="paged", capacity_tokens=100), "too small for one request"),
    (dict(policy="contiguous", capacity_tokens=0), "KV pool"),
    (dict(policy="reserve", capacity_tokens=1000, max_tokens=2048), "too small for one reservation"),
    (dict(policy="reserve", capacity_tokens=4000, max_tokens=100), "more than the 100 reserved"),
    (dict(policy="buddy", capacity_tokens=4000), "policy"),
    (dict(policy="paged", capacity_tokens=4000, step_s=0), "step time"),
])
def test_bad_sizes_are_clear_errors(kwargs, message):
    w = workload([0.0, 0.1], [100, 120], [50, 60])
    args = dict(step_s=0.01) | kwargs
    with pytest.raises(SpecError, match=message):
        simulate_kv_allocation(w, args.pop("policy"), args.pop("capacity_tokens"), **args)
