"""One stop rule for every generating loop (engine/model/stopping.py)."""
import pytest

from engine.errors import ModelError
from engine.model.stopping import FinishReason, Status, check_max_new_tokens, finish_reason

EOS = frozenset({2})


@pytest.mark.parametrize("token, stop_at_eos, generated, cached, expected", [
    (2, True, 1, 5, "eos"),           # an end token ends the reply first, even at the last allowed token
    (2, True, 8, 48, "eos"),
    (2, False, 3, 5, None),           # ignored when the caller does not stop at EOS
    (7, True, 8, 5, "length"),        # the 8th of 8 tokens
    (7, True, 8, 48, "length"),       # length before context when both hold
    (7, True, 3, 48, "context"),      # the cache holds all 48 positions: no room for another token
    (7, True, 3, 47, None),
])
def test_the_stop_rule_and_its_order(token, stop_at_eos, generated, cached, expected):
    got = finish_reason(token, EOS, stop_at_eos, generated, max_new_tokens=8, cached_tokens=cached, context_tokens=48)
    assert got == expected


def test_reasons_and_states_read_as_their_words():
    assert FinishReason.SESSION_CLOSED == "session closed" and f"{FinishReason.EOS}" == "eos"
    assert FinishReason("cancelled") is FinishReason.CANCELLED and str(Status.PREFILL) == "prefill"


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3", None])
def test_max_new_tokens_must_be_a_whole_number_of_at_least_one(bad):
    with pytest.raises(ModelError, match="max_new_tokens must be a whole number"):
        check_max_new_tokens(bad)
