"""ui/narration.py: the sentences the pages build from their own numbers."""


def test_the_steady_state_gap_is_said_from_the_numbers_shown():
    """The Queueing page's caption about the dotted curve: within 20% says so; a larger gap names the first load
    past it and the worst one with its sign; a load the closed form cannot solve is said too (it used to blame
    the run's length whatever the numbers)."""
    from ui.narration import steady_state_gap_words
    close = steady_state_gap_words([0.1, 0.5], [100.0, 200.0], [110.0, 170.0])
    assert "within 20%" in close and "parts" not in close
    far = steady_state_gap_words([0.1, 0.5, 0.7, 0.9], [300.0, 610.0, 1424.0, 3045.0], [251.0, 605.0, 854.0, 1267.0])
    assert "from load 0.7" in far and "at 0.9 it is 58% below" in far
    above = steady_state_gap_words([0.5], [100.0], [150.0])
    assert "50% above" in above
    unsolved = steady_state_gap_words([0.5, 0.95], [100.0, 900.0], [105.0, float("nan")])
    assert "within 20%" in unsolved and "From load 0.95 it finds no steady state" in unsolved
