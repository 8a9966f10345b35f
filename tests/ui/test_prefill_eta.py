"""A long prompt says before Generate how long its first word will take; a short one says nothing."""
from ui.prefill_eta import prefill_eta_words, prefill_wait_words


def test_a_prompt_predicted_to_take_seconds_says_how_long_and_from_what():
    s = prefill_eta_words(4_475, 11_800.0, 198e9)
    assert "4,475 tokens" in s and "at least about 12 s" in s and "198 GFLOP/s" in s and "counts the seconds against it" in s


def test_a_short_prompt_says_nothing_and_the_threshold_flips():
    assert prefill_eta_words(33, 300.0, 198e9) == ""
    assert prefill_eta_words(1_000, 2_999.0, 198e9) == ""
    assert prefill_eta_words(1_000, 3_000.0, 198e9) != ""
    assert prefill_eta_words(1_000, float("nan"), 198e9) == ""


def test_the_wait_is_counted_against_the_prediction_and_says_when_it_runs_past_it():
    assert prefill_wait_words(12.2, 20.0, 4_475) == \
        "Prefill: reading 4,475 prompt tokens, 12 s of at least about 20 s predicted"
    late = prefill_wait_words(31.0, 20.0, 4_475)
    assert "31 s, past the 20 s predicted" in late and "of at least" not in late
