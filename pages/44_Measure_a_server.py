"""Measure a server: a load sweep against any OpenAI-compatible endpoint (ours, vLLM, ...), TTFT / ITL /
end-to-end percentiles and throughput per level, next to the calculators' prediction for the same model, device
and load, then the efficiencies fitted to the sweep and how much closer they bring the prediction.

Measured: `server.loadgen`. Predicted and fitted: `calculators.planning.measured_sweep` (on `calculators.planning.calibration`).
"""
from __future__ import annotations

import inspect

import streamlit as st

import calculators.planning.measured_sweep as sweep_module
from calculators.planning.measured_sweep import compare_sweep, level_from_summary
from calculators.units import KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype
from specs.model_config import SpecError
from ui import formula_expander, setup_page, show_error
from ui.measure import RESULT_KEY, run_sweep, show_comparison, show_measured, target_and_plan
from ui.model_source import choice_field, sizing_inputs

COMPARE_KEY = "measure.compare"       # (inputs, compare_sweep result) of this session's last result


def prediction_inputs():
    """Sidebar: the served model's architecture, the device it runs on, and its precisions."""
    chosen = sizing_inputs()
    wd = choice_field("Weight precision (served)", WEIGHT_DTYPES, "bf16", key="measure.wd", where=st.sidebar)
    kd = choice_field("KV precision", KV_DTYPES, default_kv_dtype(wd), key="measure.kd", where=st.sidebar)
    return None if chosen is None else (*chosen, wd, kd)


def main() -> None:
    setup_page("Measure a server", icon=":material/speed:")
    st.title("Measure a server")
    st.markdown("Send a load to a real server, one level at a time, and time every streamed token at the client. "
                "Then put the calculators' prediction for the same model, device and load beside it, fit the "
                "efficiencies (decode MBU, prefill MFU, a fixed cost per step) to what was measured, and see how "
                "much closer the fitted model gets. Choose the served model's architecture and the device it runs "
                "on in the sidebar (*This machine* for a server on this computer).")
    predict = prediction_inputs()
    chosen = target_and_plan()
    if chosen is not None and st.button("Run the sweep", type="primary", icon=":material/play_arrow:"):
        run_sweep(*chosen)
    result = st.session_state.get(RESULT_KEY)
    if result is None:
        return
    df = show_measured(result)
    if df.empty or predict is None:
        return
    config, device, wd, kd = predict
    key = (id(result), len(df), repr(config), repr(device), wd, kd)       # the fit takes seconds: once per input
    cached = st.session_state.get(COMPARE_KEY)
    if cached is None or cached[0] != key:
        try:
            levels = [level_from_summary(r) for r in result.rows_with_arrivals() if r.get("completed")]
            with st.spinner("Predicting every level and fitting MBU, MFU and the overhead ..."):
                cached = (key, compare_sweep(config, device, levels, wd, kd))
        except SpecError as e:
            show_error(e)
            return
        st.session_state[COMPARE_KEY] = cached
    cmp = cached[1]
    st.subheader(f"Predicted: {config.name} on {device.name}, {wd} weights")
    show_comparison(cmp, result.plan.mode)
    formula_expander("How the prediction and the fit are made", inspect.getdoc(sweep_module))


main()
