"""Efficiencies fitted to measurements, handed from the Measure-a-server page to the Capacity planner.

The session-state key FITTED_EFFICIENCY_KEY ("plan.fitted_efficiency") holds, after "Re-plan with these
efficiencies", a dict of plain values:
    efficiency     the `calculators.sizing.latency.Efficiency` fields (asdict) the planner should use
                   (`measured_sweep.efficiency_for_planner` of the fit)
    decode_mbu, prefill_mfu, overhead_ms, fitted    the fit itself and which of the three knobs were fitted
    model, device, weight_dtype, kv_dtype, stack, runs    what it was fitted to
The planner page reads it with one call, `planner_efficiency()`, passed as `plan(..., efficiency=...)`.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import streamlit as st

from calculators.sizing.latency import Efficiency
from specs.model_config import SpecError

FITTED_EFFICIENCY_KEY = "plan.fitted_efficiency"
PLANNER_PAGE = "pages/42_Capacity_planner.py"


def stored_fit(fit: dict, efficiency: Efficiency, **about: Any) -> dict:
    """The dict kept under FITTED_EFFICIENCY_KEY: the planner's Efficiency, the fit and what it was fitted to."""
    return dict(efficiency=asdict(efficiency), decode_mbu=float(fit["decode_mbu"]),
                prefill_mfu=float(fit["prefill_mfu"]), overhead_ms=float(fit["overhead_ms"]),
                fitted=list(fit.get("fitted_knobs", ())), **about)


def efficiency_of(stored: Any) -> Efficiency:
    """The Efficiency a stored fit carries; SpecError when the entry is not one."""
    if not isinstance(stored, dict) or not isinstance(stored.get("efficiency"), dict):
        raise SpecError("the stored fitted efficiencies are not in the expected form: fit them again on the "
                        "Measure-a-server page")
    try:
        return Efficiency(**{k: (v if isinstance(v, bool) else float(v)) for k, v in stored["efficiency"].items()})
    except (TypeError, ValueError) as e:
        raise SpecError(f"the stored fitted efficiencies are not valid ({e}): fit them again") from None


def _drop() -> None:
    st.session_state.pop(FITTED_EFFICIENCY_KEY, None)


def planner_efficiency(where: Any = None) -> Efficiency | None:
    """The planner page's hook: the fitted Efficiency when the session holds one (with a note saying what it was
    fitted to and a button to stop using it), else None (the stack's defaults)."""
    stored = st.session_state.get(FITTED_EFFICIENCY_KEY)
    if stored is None:
        return None
    box = where if where is not None else st
    try:
        eff = efficiency_of(stored)
    except SpecError as e:
        box.error(str(e), icon=":material/error:")
        return None
    box.info(f"Using the efficiencies fitted on the Measure-a-server page to {', '.join(stored.get('runs', []))} "
             f"({stored.get('model')} on {stored.get('device')}, {stored.get('weight_dtype')} weights): decode MBU "
             f"{eff.decode_mbu:.3f}, MFU {eff.decode_mfu:.3f}, overhead {eff.step_overhead_ms:.2f} ms per step. "
             "They replace the stack's defaults for every device and precision the planner tries.",
             icon=":material/tune:")
    box.button("Use the stack's defaults instead", key="plan.drop_fitted_efficiency", on_click=_drop)
    return eff
