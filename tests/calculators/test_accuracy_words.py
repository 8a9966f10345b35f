"""A published-table group's value read as words on the page (the JSON and CSV keep the identifiers)."""
from calculators.planning.accuracy import REGIME_WORDS, group_value_words


def test_regimes_read_as_words_and_other_groups_stay():
    assert group_value_words("max_throughput") == REGIME_WORDS["max_throughput"] == "maximum throughput"
    assert group_value_words("under_rate, MoE") == "under a rate, MoE"
    assert group_value_words("NVIDIA") == "NVIDIA" and group_value_words("fp8") == "fp8"
