"""The Parallelism page's sentence on splitting further (`claims.tp_gain_claim`), fed both sides of its condition:
rows whose ITL stops falling, and rows that still fall, by less than the split."""
from calculators.claims import tp_gain_claim


def row(tp, itl, allreduce=0.5, host=2.0, problem=None):
    return dict(tp=tp, itl_ms=itl, allreduce_ms=allreduce, host_ms=host, problem=problem)


def test_the_first_degree_no_faster_than_the_one_before_is_named():
    text = tp_gain_claim([row(1, 40.0), row(2, 21.0), row(4, 12.0), row(8, 12.5, 1.5), row(16, 14.0)])
    assert text.startswith("Here TP 8 is no faster than TP 4 (12.5 ms against 12.0 ms)")
    assert "all-reduces (1.50 ms)" in text


def test_where_every_step_still_gains_the_last_gain_is_set_against_the_split():
    text = tp_gain_claim([row(1, 40.0), row(2, 21.0), row(4, 12.0, problem="TP 4 does not divide"),
                          row(8, 8.0)])
    assert "every step up still gains" in text and "TP 2 → 8 splits the reads 4× but cuts the ITL only 2.62×" in text
    assert "by less each time" not in text                         # gains 1.90×, then 2.62×: growing
    assert tp_gain_claim([row(1, 40.0)]) == ""


def test_by_less_each_time_only_when_every_gain_is_smaller_than_the_one_before():
    assert "by less each time" in tp_gain_claim([row(1, 40.0), row(2, 22.0), row(4, 14.0)])     # 1.82×, 1.57×
    assert "by less each time" not in tp_gain_claim([row(1, 40.0), row(2, 30.0), row(4, 14.0)])  # 1.33×, 2.14×
