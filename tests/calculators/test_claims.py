"""Claims from data (issue 35): each claim function is fed numbers on both sides of its condition and its sentence
flips; the expected words come from the numbers fed, never from the function under test."""
from __future__ import annotations

from calculators.claims import (cheaper_claim, decode_beat_claim, itl_target_claim, logit_lens_claim, plan_claim, plural,
                               token_count_claim,
                               roofline_side_claim)


# ------------------------------------------------------------------------------------------ decode beat
def test_decode_beat_claim_says_steady_only_when_the_steps_are_within_the_band():
    steady = [40.0, 41.0, 39.5, 40.2, 40.8, 39.9, 40.1, 40.4]            # all within 39.5-41 ms
    words = decode_beat_claim(steady)
    assert words.startswith("**A steady beat:**") and "Not a steady" not in words
    assert "within 1.5× of each other" in words and "3× the median of 40.2 ms" in words   # the test it made
    assert "(the slowest: 41.0 ms)" in words
    ragged = [38, 40, 810, 45, 300, 39, 600, 41]                          # issue 28: 38 to 810 ms
    words = decode_beat_claim(ragged, busy=True)
    assert words.startswith("**Not a steady beat on this run:**") and "38.0 to 810 ms" in words
    assert "more than 1.5× apart" in words and "took over 3× the median" in words
    assert "busy" in words
    assert "busy" not in decode_beat_claim(ragged, busy=False)


def test_decode_beat_claim_one_slow_step_past_three_medians_breaks_the_beat():
    steps = [40.0] * 9 + [130.0]                                          # 130 > 3 × 40, the band itself is flat
    words = decode_beat_claim(steps)
    assert "Not a steady beat" in words and "the slowest, 130 ms, took over 3×" in words and "apart" not in words
    assert "A steady beat" in decode_beat_claim([40.0] * 9 + [110.0])    # 110 < 3 × 40, 90th pct ≤ 1.5 × 10th
    assert decode_beat_claim([40.0]) == "Too few decode steps to say how steady they were."


# ------------------------------------------------------------------------------------------ logit lens
def test_logit_lens_claim_forms_late_only_when_the_final_pick_leads_in_the_second_half():
    late = logit_lens_claim(["a", "b", "c", "d", "e", "Paris", "Paris"], [0.9, 0.3, 0.2, 0.2, 0.3, 0.4, 0.6])
    assert "forms in the later layers" in late and "leads from layer 5 of 0 to 6 on" in late
    early = logit_lens_claim(["x", "Paris", "Paris", "Paris", "Paris", "Paris", "Paris"], [0.2] * 6 + [0.6])
    assert "forms in the later layers" not in early and "leads from layer 1 of 0 to 6" in early and "early" in early
    last = logit_lens_claim(["a", "b", "c", "Paris"], [0.9, 0.5, 0.4, 0.3])
    assert "appears only at the last layer (3)" in last and "forms in the later layers" in last
    same = logit_lens_claim(["Paris"] * 4, [0.1, 0.2, 0.3, 0.4])
    assert "leads at every layer (0 to 3)" in same and "nothing forms late" in same


def test_logit_lens_claim_says_an_early_confident_layer_is_not_the_answer():
    # the run: layer 0 at 99%, the last layer at 25%
    words = logit_lens_claim(["the"] + ["x"] * 28 + ["Paris"], [0.99] + [0.1] * 28 + [0.25])
    assert "Layer 0 is the most confident (99% on `the`)" in words and "last layer (25%)" in words
    assert "Confidence is not correctness" in words
    calm = logit_lens_claim(["a", "b", "Paris"], [0.1, 0.2, 0.8])      # the last layer is the surest
    assert "most confident" not in calm and "Confidence is not correctness" in calm


# ------------------------------------------------------------------------------------------ roofline
def test_roofline_side_claim_says_far_only_when_the_intensity_is_four_times_below_the_ridge():
    ridge = 3.46
    near = roofline_side_claim("decode", [("q_proj", 1.0), ("attn_scores", 3.0)], ridge)   # the 3 vs 3.46
    assert "all 2 ops sit left of the ridge (3.46 FLOP/B)" in near and "near the ridge" in near
    assert "far to the left" not in near.replace("not far to the left", "")
    far = roofline_side_claim("decode", [("q_proj", 0.5), ("attn_scores", 0.8)], ridge)     # 0.8 × 4 < 3.46
    assert "far to the left" in far and "4.3× below it" in far
    mixed = roofline_side_claim("prefill", [("q_proj", 300.0), ("rope", 0.2)], ridge)
    assert "1 of 2 ops sit right of the ridge" in mixed and "(q_proj)" in mixed and "(rope)" in mixed
    right = roofline_side_claim("prefill", [("q_proj", 300.0), ("o_proj", 20.0)], ridge)
    assert "all 2 ops sit right of the ridge (3.46 FLOP/B) far to the right" in right


# ------------------------------------------------------------------------------------------ capacity plan
PLAN = dict(per_gpu_needed_bytes=40e9, usable_bytes=80e9, itl_at_load_ms=27.0, ttft_p99_ms=500.0, utilisation=0.2,
            batch_cap=32, worst_ratio=0.54, binding="bandwidth", itl_kind="bandwidth")


def at_rate(itl=27.0, ttft=500.0, stable=True, util=0.91):
    return dict(tpot_ms=itl, ttft_p99_ms=ttft, stable=stable, utilisation=util, capacity_requests_per_s=1.1,
                verdict="serves 1 requests/s")


def test_plan_claim_meets_or_misses_from_the_evaluation_at_the_rate():
    meets = plan_claim(PLAN, 50.0, 2000.0, at_rate())
    assert meets.startswith("**It meets both targets at your rate:**") and "mean ITL 27.0 ms (target 50.0 ms" in meets
    assert "closest to is **ITL**: 54% of the ITL target" in meets                  # 27 / 50, named as such
    assert "The rate is 91% of this layout's capacity" in meets                      # the other percentage, named
    slow = plan_claim(PLAN, 50.0, 2000.0, at_rate(itl=66.0))
    assert slow.startswith("**It misses the targets") and "mean ITL 66.0 ms is above the 50.0 ms target" in slow
    late = plan_claim(PLAN, 50.0, 2000.0, at_rate(ttft=2500.0))
    assert "TTFT p99 2,500 ms is above the 2,000 ms target" in late and "meets" not in late
    unchecked = plan_claim(PLAN, 50.0, 2000.0, None, "a p99 request exceeds the context window")
    assert unchecked.startswith("**Not checked at your rate:** a p99 request") and "meets both" not in unchecked


def test_plan_claim_names_the_limit_the_planner_found_closest_and_what_its_percentage_is_of():
    full = {**PLAN, "per_gpu_needed_bytes": 70e9, "worst_ratio": 70e9 / 80e9, "binding": "memory"}
    assert "closest to is **memory**: 88% of the usable memory of one GPU" in plan_claim(full, 50.0, 2000.0, at_rate())
    budget = {**PLAN, "worst_ratio": 0.97, "binding": "queueing"}           # none of the four: the prefill budget
    assert "closest to is **prefill budget**: 97% of the prompt tokens a step may carry" in plan_claim(
        budget, 50.0, 2000.0, at_rate())


def test_itl_target_claim_names_the_mean_and_flags_a_p99_above_it():
    both = itl_target_claim(27.0, 66.0, 50.0)
    assert "is for the mean gap" in both and "27.0 ms meets it" in both and "p99 gap (66.0 ms" in both
    assert "misses it" in itl_target_claim(55.0, 66.0, 50.0)
    assert "Even the p99 gap (45.0 ms) is within it" in itl_target_claim(27.0, 45.0, 50.0)


def test_cheaper_claim_names_the_cheaper_design_with_its_own_price():
    assert cheaper_claim("disaggregated", 2.167, "co-located", 0.722) == (
        "**Co-located is cheaper here:** $0.722 per 1M tokens, against $2.167 disaggregated.")
    assert cheaper_claim("disaggregated", 0.5, "co-located", 0.722).startswith("**Disaggregated is cheaper here:** $0.500 ")
    assert "No price" in cheaper_claim("a", None, "b", 1.0)


def test_plural():
    assert plural(1, "replica") == "1 replica" and plural(3, "replica") == "3 replicas"


def test_token_count_claim_names_the_tokenizer_that_needed_fewer():
    more = token_count_claim("SmolLM2", 8, 49_152, "bytes", 32, 256)
    assert more.startswith("**SmolLM2** needs **8 tokens**") and "4.00× as many" in more and "larger vocabulary" in more
    flipped = token_count_claim("big", 10, 50_000, "small", 9, 1_000)
    assert flipped.startswith("**small** needs **9 tokens**") and "smaller vocabulary" in flipped
    assert token_count_claim("a", 5, 10, "b", 5, 20) == "Both cut this text into 5 tokens."
