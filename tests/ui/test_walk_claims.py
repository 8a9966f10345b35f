"""The Walkthrough's sentences about its numbers (ui.walk_claims) flip with the numbers: a steady beat only when
every decode step is near the median, a binding limit only when it is nearly used up."""
from __future__ import annotations

from ui.walk_claims import binding_sentence, decode_beat_sentence, decode_spread


def test_even_decode_steps_are_called_a_steady_beat_with_the_spread_tested():
    s = decode_beat_sentence(120.0, [36, 35, 37, 36, 38, 34])
    assert "at a steady beat" in s and "34 to 38 ms" in s and "±25%" in s and "not at a steady" not in s
    assert "**120 ms**" in s and "**36 ms**" in s


def test_a_slow_first_decode_step_is_not_a_steady_beat():
    s = decode_beat_sentence(120.0, [90, 36, 35, 37, 36, 38])       # the Walkthrough's run: the first step 90 ms
    assert "not at a steady beat" in s and "35 to 90 ms" in s and "slowest (the first one: a warm-up) 2.5× the median" in s
    assert "at a steady beat: all" not in s


def test_the_steady_test_flips_at_its_threshold():
    assert decode_spread([100, 100, 124])[3] == 0.24
    assert "at a steady beat" in decode_beat_sentence(10, [100, 100, 124])
    assert "not at a steady beat" in decode_beat_sentence(10, [100, 100, 126])
    assert "not at a steady beat" in decode_beat_sentence(10, [100, 100, 74])     # a step too fast counts too
    assert "fastest" in decode_beat_sentence(10, [100, 100, 74])


def test_too_few_decode_steps_make_no_claim_about_the_beat():
    assert "steady" not in decode_beat_sentence(10, []) and "no decode step" in decode_beat_sentence(10, [])
    s = decode_beat_sentence(10, [30, 90])
    assert "too few to call the beat steady or not" in s and "at a steady beat" not in s


def test_a_limit_nearly_used_up_binds_and_one_far_from_it_does_not():
    near = binding_sentence("memory", 0.92, 1)
    assert near.startswith("what limits it: GPU memory") and "92%" in near and "nothing binds" not in near
    far = binding_sentence("memory", 0.05, 1)
    assert far.startswith("nothing binds: one GPU (the smallest plan) meets every target") and "5%" in far
    assert "what limits it" not in far
    assert "these 4 GPUs meet" in binding_sentence("bandwidth", 0.3, 4)
    assert "what limits it" in binding_sentence("bandwidth", 0.70, 4)
    assert "nothing binds" in binding_sentence("bandwidth", 0.69, 4)
