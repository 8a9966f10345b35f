"""The planner's search is cached once per server (ui/planner_cache.py): a second session opening the Capacity
planner on the same inputs searches nothing, the page's "what if" table reuses the page's own search for its "as
entered" row, a changed input searches again, a search that fails is not stored, and a session that changes its
result changes nobody else's."""
from __future__ import annotations

from pathlib import Path

import pytest

import ui.planner_cache as pc
from helpers_apptest import run_script

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "42_Capacity_planner.py")


@pytest.fixture
def searches(monkeypatch):
    """The request rates of the searches that really ran (cache misses), in order; the cache starts empty."""
    pc._cached.clear()
    seen = []
    real = pc.plan

    def counting(config, devices, wl, space, efficiency, **kw):
        seen.append(wl.requests_per_s)
        return real(config, devices, wl, space, efficiency, **kw)
    monkeypatch.setattr(pc, "plan", counting)
    yield seen
    pc._cached.clear()


def test_sessions_on_the_same_inputs_share_one_search(searches):
    at = run_script(PAGE, 120)
    assert not at.exception
    rate = float(at.text_input(key="plan.rate").value)
    assert searches == [rate, 2 * rate, rate]       # the page's (its "as entered" row shares it), rate × 2, prompts × 2
    searches.clear()
    again = run_script(PAGE, 120)                           # another browser session, same defaults
    assert not again.exception and searches == []
    assert [m.value for m in again.metric] == [m.value for m in at.metric]
    at.text_input(key="plan.rate").set_value(str(2 * rate)).run()
    # twice the rate is the first run's "rate × 2" (cached): only its own "rate × 2" and "prompts × 2" are searched
    assert not at.exception and searches == [4 * rate, 2 * rate]


def test_a_failed_search_is_not_stored_and_a_result_is_each_callers_own():
    from calculators.planning.planner import SearchSpace, Workload
    from specs.devices import load_device
    from specs.model_config import SpecError
    from specs.presets import load_preset
    pc._cached.clear()
    c, devs = load_preset("llama-3.1-8b"), [load_device("H100 SXM")]
    wl = Workload(requests_per_s=1.0, prompt_tokens=1000, output_tokens=100, ttft_p99_ms=2000, itl_ms=50)
    space = SearchSpace(gpu_counts=(1,), tp=(1,), pp=(1,), batch_caps=(32,), weight_dtypes=("bf16",),
                        kv_dtypes=("bf16",))
    first = pc.cached_plan(c, devs, wl, space, stack="vllm", profile=None)
    first.feasible_order = first.feasible_order[:0]                 # one session mangles its copy
    second = pc.cached_plan(c, devs, wl, space, profile=None, stack="vllm")     # keywords in another order
    assert len(second.feasible_order) > 0
    with pytest.raises(SpecError):
        pc.cached_plan(c, devs, wl, space, stack="no-such-stack")
    with pytest.raises(SpecError):                                  # raised again, not served from the cache
        pc.cached_plan(c, devs, wl, space, stack="no-such-stack")
    pc._cached.clear()
