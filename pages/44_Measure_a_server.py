"""Measure a server: a load sweep against any OpenAI-compatible endpoint (ours, vLLM, ...), TTFT / ITL /
end-to-end percentiles and throughput per level (or the result files of guidellm, `vllm bench serve`, AIPerf or
SGLang bench_serving, imported), next to the calculators' prediction for the same model, device
and load, then the efficiencies fitted to the sweep and how much closer they bring the prediction.

Measured: `server.loadgen` (imported: `calculators.planning.load_test_import`, `ui.load_import`). Predicted and
fitted: `calculators.planning.measured_sweep` (on `calculators.planning.calibration`; imported runs:
`calculators.planning.load_test_compare`).
"""
from __future__ import annotations

import inspect

import streamlit as st

import calculators.planning.load_test_compare as compare_module
import calculators.planning.measured_sweep as sweep_module
from calculators.planning.measured_sweep import compare_sweep, level_from_summary
from calculators.units import KV_DTYPES, WEIGHT_DTYPES, default_kv_dtype
from ui import formula_expander, setup_page
from ui.load_import import import_view
from ui.measure import RESULT_KEY, run_sweep, show_comparison, show_measured, target_and_plan
from ui.model_source import choice_field, sizing_inputs
from ui.widgets import once_per_input

COMPARE_KEY = "measure.compare"       # (inputs, compare_sweep result) of this session's last result
RUN, IMPORT = "Run a load sweep here", "Import result files (guidellm, vLLM, AIPerf, SGLang)"


def prediction_inputs():
    """Sidebar: the served model's architecture, the device it runs on, and its precisions."""
    chosen = sizing_inputs()
    wd = choice_field("Weight precision (served)", WEIGHT_DTYPES, "bf16", key="measure.wd", where=st.sidebar)
    kd = choice_field("KV precision", KV_DTYPES, default_kv_dtype(wd), key="measure.kd", where=st.sidebar)
    return None if chosen is None else (*chosen, wd, kd)


def levels_of(result) -> list:
    return [level_from_summary(r) for r in result.rows_with_arrivals() if r.get("completed")]


def main() -> None:
    setup_page("Measure a server", icon=":material/speed:")
    st.title("Measure a server")
    st.markdown("Send a load to a real server, one level at a time, and time every streamed token at the client. "
                "Then put the calculators' prediction for the same model, device and load beside it, fit the "
                "efficiencies (decode MBU, prefill MFU, a fixed cost per step) to what was measured, and see how "
                "much closer the fitted model gets. Choose the served model's architecture and the device it runs "
                "on in the sidebar (*This machine* for a server on this computer).")
    predict = prediction_inputs()
    source = choice_field("Measurements", (RUN, IMPORT), RUN, key="measure.source", horizontal=True,
                          help="Run a sweep against a server from this page, or bring the result files of a load "
                               "test you ran with another tool.")
    if source == IMPORT:
        import_view(predict)
        formula_expander("How imported runs are predicted and fitted", inspect.getdoc(compare_module))
        return
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
    cmp = once_per_input(COMPARE_KEY, key, lambda: compare_sweep(config, device, levels_of(result), wd, kd),
                         "Predicting every level and fitting MBU, MFU and the overhead ...")
    if cmp is None:
        return
    st.subheader(f"Predicted: {config.name} on {device.name}, {wd} weights")
    show_comparison(cmp, result.plan.mode)
    formula_expander("How the prediction and the fit are made", inspect.getdoc(sweep_module))


main()
