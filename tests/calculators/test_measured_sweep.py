"""A measured sweep next to the calculators: the per-level prediction against the step model stepped by hand,
the linear overhead fit against data made from known efficiencies (a second formula: latency.decode_step_ms and
prefill_ms), the simulator-refined fit recovering the efficiencies a sweep was simulated with, and a minimiser
checked on a function whose minimum is known."""
from __future__ import annotations

import numpy as np
import pytest

from calculators.serving.batching import step_model_for
from calculators.planning.calibration import Measurement, calibrate
from calculators.sizing.latency import IDEAL, Efficiency, decode_step_ms, prefill_ms
from calculators.planning.measured_sweep import SweepLevel, compare_sweep, level_from_summary, nelder_mead, \
    predict_level
from specs.devices import load_device
from specs.model_config import SpecError
from specs.presets import load_preset

TINY, A100 = load_preset("tinyllama"), load_device("a100")
EFF = Efficiency(decode_mbu=0.5, prefill_mfu=0.4)


def level(mode="concurrency", lv=1, n=2, p=200, o=10, **measured):
    m = dict(ttft_ms=1.0, itl_ms=1.0, e2e_ms=1.0, output_tok_s=1.0) | measured
    return SweepLevel(mode, lv, n, p, o, **m)


def test_concurrency_1_is_one_request_at_a_time_timed_from_when_it_was_sent():
    m = step_model_for(TINY, A100, "fp16", None, EFF, 3.0)
    P, O = 200, 10
    ttft = m.prefill_ms(P)
    steps = [m.decode_step_ms(1, P + k) for k in range(O - 1)]          # context P, P+1, ... cached positions
    got = predict_level(TINY, A100, level(lv=1, n=2, p=P, o=O), "fp16", None, EFF, 3.0)
    assert got["ttft_ms"] == pytest.approx(ttft)                        # the 2nd request's wait is not in it
    assert got["itl_ms"] == pytest.approx(np.mean(steps))
    assert got["e2e_ms"] == pytest.approx(ttft + sum(steps))
    assert got["output_tok_s"] == pytest.approx(2 * O / (2 * (ttft + sum(steps)) / 1e3))


def test_concurrency_2_prefills_both_prompts_in_one_step_then_decodes_them_together():
    m = step_model_for(TINY, A100, "fp16", None, EFF, 0.0)
    P, O = 100, 6
    ttft = m.step_ms(2 * P, 0, 2 * P * (P + 1) / 2)
    steps = [m.decode_step_ms(2, 2 * (P + k)) for k in range(O - 1)]
    got = predict_level(TINY, A100, level(lv=2, n=2, p=P, o=O), "fp16", None, EFF, 0.0)
    assert got["ttft_ms"] == pytest.approx(ttft)
    assert got["itl_ms"] == pytest.approx(np.mean(steps))
    assert got["output_tok_s"] == pytest.approx(2 * O / ((ttft + sum(steps)) / 1e3))


def test_a_rate_level_uses_the_send_times_given():
    lv = level("rate", 1.0, 2, 100, 5, arrival_s=(10.0, 20.0))           # far apart: each alone
    alone = predict_level(TINY, A100, level(lv=1, n=1, p=100, o=5), "fp16", None, EFF)
    got = predict_level(TINY, A100, lv, "fp16", None, EFF)
    assert got["ttft_ms"] == pytest.approx(alone["ttft_ms"]) and got["e2e_ms"] == pytest.approx(alone["e2e_ms"])
    assert got["output_tok_s"] == pytest.approx(10 / (10 + alone["e2e_ms"] / 1e3))


def synthetic(mbu, mfu, overhead_ms, shapes):
    """Measurements made with latency.py's own formulas at known efficiencies, plus a fixed cost per step."""
    out = []
    for P, O, B in shapes:
        ctx = P + (O - 1) // 2 + 1
        itl = decode_step_ms(TINY, A100, ctx, B, "fp16", efficiency=IDEAL)["memory_ms"] / mbu + overhead_ms
        ttft = prefill_ms(TINY, A100, P, 1, "fp16", efficiency=IDEAL)["compute_ms"] / mfu + overhead_ms
        out.append(Measurement(P, O, B, ttft, itl))
    return out


SHAPES = [(128, 64, 1), (512, 64, 4), (1024, 128, 16), (256, 32, 32)]


def test_the_overhead_fit_recovers_known_efficiencies_and_overhead():
    fit = calibrate(TINY, A100, synthetic(0.5, 0.4, 20.0, SHAPES), "fp16", fit_overhead=True)
    assert fit["decode_mbu"] == pytest.approx(0.5, rel=1e-3)
    assert fit["prefill_mfu"] == pytest.approx(0.4, rel=1e-3)
    assert fit["overhead_ms"] == pytest.approx(20.0, rel=1e-3)
    assert fit["itl_mean_abs_error_percent"] < 0.1 and fit["ttft_mean_abs_error_percent"] < 0.1
    plain = calibrate(TINY, A100, synthetic(0.5, 0.4, 20.0, SHAPES), "fp16")
    # without the joint fit, the ITL line still takes its own intercept (the step cost), but the TTFTs, which pay
    # the same 20 ms per step, have none: a worse fit
    assert plain["overhead_ms"] == 0.0 and plain["step_overhead_ms"] == pytest.approx(20.0, rel=1e-3)
    assert plain["ttft_mean_abs_error_percent"] > 1


def test_the_fit_keeps_efficiencies_at_most_1_and_the_overhead_non_negative():
    fit = calibrate(TINY, A100, synthetic(1.0, 1.0, 0.0, SHAPES[:2]) + [
        Measurement(2048, 64, 1, 1.0, 0.5)], "fp16", fit_overhead=True)     # faster than the roof
    assert fit["decode_mbu"] <= 1.0 and fit["prefill_mfu"] <= 1.0 and fit["overhead_ms"] >= 0.0


def test_compare_sweep_recovers_the_efficiencies_a_sweep_was_made_with():
    """Levels made by the simulator at MBU 0.3, MFU 0.2, 15 ms per step: the fit finds them again, every metric
    lands on its measurement, and the defaults were far off. The linear start (one prompt alone per TTFT row)
    misreads MFU when c prompts share a prefill step: the refinement on the simulator is what fixes it."""
    truth = dict(efficiency=Efficiency(decode_mbu=0.3, prefill_mfu=0.2), overhead_ms=15.0)
    levels = []
    for c in (1, 4, 16):
        pred = predict_level(TINY, A100, level(lv=c, n=32, p=256, o=64), "fp16", None, **truth)
        levels.append(level(lv=c, n=32, p=256, o=64, **pred))
    cmp = compare_sweep(TINY, A100, levels, "fp16")
    assert (cmp["decode_mbu"], cmp["prefill_mfu"], cmp["overhead_ms"]) == pytest.approx((0.3, 0.2, 15.0), rel=0.01)
    assert cmp["linear_fit"]["prefill_mfu"] < 0.15
    mae = cmp["mean_abs_error_percent"]
    for m in ("ttft_ms", "itl_ms", "e2e_ms", "output_tok_s"):
        assert mae[f"fitted_{m}"] < 1 < mae[f"predicted_{m}"]
    assert len(cmp["rows"]) == 3 and cmp["rows"][1]["batch"] == 4


def test_a_server_faster_than_the_device_roof_is_flagged_not_fitted_past_1():
    fast = [level(lv=1, n=4, p=64, o=16, ttft_ms=0.05, itl_ms=0.1, e2e_ms=1.6, output_tok_s=10_000.0)]
    cmp = compare_sweep(TINY, A100, fast, "fp16")           # an A100 needs 1.4 ms per TinyLlama token at best
    assert cmp["decode_mbu"] == 1.0 and any("decode MBU is at its bound of 1" in w for w in cmp["warnings"])
    assert compare_sweep(TINY, A100, [level(lv=1, n=4, p=64, o=16, ttft_ms=50.0, itl_ms=5.0, e2e_ms=125.0,
                                            output_tok_s=128.0)], "fp16")["warnings"] == []


def test_nelder_mead_finds_the_minimum_of_a_shifted_bowl():
    x = nelder_mead(lambda v: float((v[0] - 1.5) ** 2 + 3 * (v[1] + 0.5) ** 2), np.array([0.0, 0.0]), evaluations=200)
    assert x == pytest.approx([1.5, -0.5], abs=1e-3)


def test_a_level_without_completed_requests_or_with_bad_numbers_is_refused():
    with pytest.raises(SpecError, match="completed no request"):
        level_from_summary(dict(level=4, completed=0))
    with pytest.raises(SpecError):
        level(ttft_ms=-1.0)
    with pytest.raises(SpecError, match="no measured level"):
        compare_sweep(TINY, A100, [], "fp16")
