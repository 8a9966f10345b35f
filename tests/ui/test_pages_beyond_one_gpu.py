"""Pages 41-43 (Parallelism, Capacity planner, Calibration) and the shared multi-GPU sidebar on the sizing pages,
driven headless: main interaction, a bad input -> a message (never an exception)."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.model_source import CUSTOM
from helpers_apptest import REFERENCE, in_datacentre, run_script

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


def page(name: str, **state) -> AppTest:
    return run_script(str(next((ROOT / "pages").glob(f"{name}*.py"))), TIMEOUT, **state)


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def test_parallelism_page_shows_tp_floors_bubble_and_the_mesh_view():
    at = page("41_", **in_datacentre(REFERENCE))
    assert not at.exception and not texts(at.error)
    tp = at.dataframe[0].value                     # TinyLlama fp16 on A100 (chosen): 003's TP floors
    assert [round(v, 2) for v in tp["every weight read once (ms)"][:3]] == [1.41, 0.71, 0.35]
    # each TP and PP degree priced as `latency --tp/--pp` prices it, and saying what priced it: the closed form here
    # (the tests' default), the command's default profile with the sidebar's switch on
    assert any("python -m calculators latency" in c and "--tp N" in c and "closed form" in c for c in texts(at.caption))
    assert any("--pp N" in c for c in texts(at.caption))
    assert not [c for c in texts(at.caption) if "{" in c]                     # every caption's fields filled in
    assert (tp["ITL (ms)"] > 0).all() and tp["speed-up vs TP 1"][0] == 1
    at.sidebar.toggle(key="par.measured").set_value(True).run()
    assert not at.exception and not texts(at.error)
    assert any("python -m calculators latency" in c and "--tp N" in c for c in texts(at.caption))
    bubble = next(d.value for d in at.dataframe if "bubble (%)" in d.value.columns)
    assert [round(v) for v in bubble["bubble (%)"]] == [75, 43, 16, 4]
    at.text_input(key="par.mesh.cols").set_value(str(3)).run()      # 3 columns cannot split 32 heads
    assert not at.exception and any("do not divide" in e for e in texts(at.error))


def test_parallelism_page_draws_the_busiest_attention_rank_for_an_moe_model():
    """DeepSeek-R1 on 8 H200s: the expert-parallel section adds attention DP's wait: one line per rank count, the
    busiest rank's prompts never below the mean, and the sentence quotes 8 ranks at 0.1 prompts a rank a step."""
    from ui.model_source import PRESET_KEY
    from ui.world import DEVICE_KEY
    at = page("41_", **in_datacentre({PRESET_KEY: "DeepSeek-R1", DEVICE_KEY: "H200"}))
    assert not at.exception and not texts(at.error)
    fig = next(c for c in at.get("plotly_chart") if "slowest rank" in c.proto.spec)
    import json
    lines = {t["name"]: t["y"] for t in json.loads(fig.proto.spec)["data"]}
    assert "1 rank (the mean)" in lines and "busiest of 8 ranks" in lines
    assert all(b >= m for b, m in zip(lines["busiest of 8 ranks"], lines["1 rank (the mean)"]))
    assert any("with 8 attention ranks some rank prefills in 55% of them" in c for c in texts(at.caption))


def test_capacity_planner_ranks_plans_and_explains_no_feasible_plan():
    at = page("42_")
    assert not at.exception and not texts(at.error)
    assert any(m.label == "Binding constraint" for m in at.metric)
    assert any(m.label == "Output tokens/s" for m in at.metric)                 # maximum throughput section
    what_if = next(d.value for d in at.dataframe if "what if" in d.value.columns)
    assert list(what_if["what if"]) == ["as entered", "rate × 2", "prompts × 2"]
    at.selectbox(key="plan.stack").set_value("nccl").run()
    assert not at.exception and not texts(at.error)
    next(t for t in at.text_input if t.key.startswith("plan.tput.ep.")).set_value(str(2)).run()  # EP, dense model
    assert any("needs a mixture-of-experts model" in e for e in texts(at.error))
    at.text_input(key="plan.rate").set_value(str(0.0)).run()
    assert not at.exception and any("No feasible plan" in w and "rate" in w for w in texts(at.warning))
    at.text_input(key="plan.rate").set_value(str(1.0)).run()
    at.text_input(key="plan.itl").set_value(str(0.001)).run()
    assert any("No feasible plan" in w and "itl" in w for w in texts(at.warning))
    # the lengths of an MLPerf dataset (same page, one load): picking one fills the four length fields
    at.text_input(key="plan.itl").set_value(str(50.0))
    _fills_the_lengths_from_an_mlperf_dataset(at)


def test_calibration_page_fits_the_example_and_rejects_a_bad_csv():
    at = page("43_")
    assert not at.exception and not texts(at.error)
    assert any(m.label == "Decode MBU (fitted)" for m in at.metric)
    # the published data-centre table: the HELD-OUT rows' median and worst error shown (fit rows are not accuracy)
    med = next(m.value for m in at.metric if m.label == "Held-out rows: median |error|")
    worst = next(m.value for m in at.metric if m.label == "Held-out rows: worst |error|")
    from calculators.planning.accuracy import band
    held = [r for r in __import__("calculators.planning.accuracy", fromlist=["table"]).table()
            if r["split"] == "test" and r["group"] == "all"][0]
    assert med == f"{100 * held['median_abs_error']:.1f}%" and worst == f"{100 * held['worst_abs_error']:.1f}%"
    assert float(med.rstrip("%")) <= 12 and band("max_throughput")["n"] > 0
    at.text_area(key="cal.text").set_value("a,b\n1,2\n").run()
    assert not at.exception and any("lacks" in e for e in texts(at.error))


def test_latency_page_on_an_8_gpu_node_shows_allreduce_and_the_fit_verdict():
    at = page("24_", **REFERENCE)
    at.selectbox(key="mg.node").set_value("8-GPU node (HGX/DGX)").run()
    assert not at.exception
    assert any(m.label == "All-reduce per token" for m in at.metric)
    assert any("Fits" in s and "8 × A100" in s for s in texts(at.success))
    # priced as the latency command prices it, and saying so: the closed form here (the tests' default), the
    # command's default profile with the switch on (the closed form again where no profile is installed)
    assert any("Priced as `python -m calculators latency`" in c and "closed form" in c for c in texts(at.caption))
    at.toggle(key="lat.measured").set_value(True).run()
    assert not at.exception and not texts(at.error)
    assert any("Priced as `python -m calculators latency`" in c for c in texts(at.caption))
    at.text_input(key="mg.tp").set_value(str(3)).run()                # 3 does not divide TinyLlama's 32 heads
    assert not at.exception and any("does not divide" in e for e in texts(at.sidebar.error))


def test_latency_page_warns_when_the_setup_does_not_fit():
    at = page("24_", **{"size.preset": "DeepSeek-V2"})
    assert not at.exception
    assert any("Does NOT fit" in w and "short" in w for w in texts(at.warning))


def test_custom_device_takes_fp8_peak_interconnect_and_price():
    at = page("24_", device=CUSTOM)
    assert not at.exception and not texts(at.error)
    at.text_input(key="device.custom.tflops.fp8").set_value(str(-1.0)).run()
    assert not at.exception and any("between" in e for e in texts(at.sidebar.error))


def test_kv_page_on_an_8_gpu_node_sizes_the_busiest_gpu():
    one = page("22_", **REFERENCE)
    eight = page("22_", **REFERENCE, **{"mg.node": "8-GPU node (HGX/DGX)", "mg.gpus": 8, "mg.tp": 8})
    assert not one.exception and not eight.exception

    def needed(at):
        number, unit = next(m.value for m in at.metric if m.label == "Needed per GPU").split()
        return float(number.replace(",", "")) * {"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    assert any("8 × A100" in s for s in texts(eight.success))
    assert needed(eight) < needed(one)                         # the weights and KV are split eight ways


def test_capacity_planner_shows_a_wide_ep_plan_for_deepseek_r1_on_h200():
    """DeepSeek-R1 on H200 at 8 requests/s (tests/calculators/test_planner_wide_ep.py): the cheapest plan runs
    attention data-parallel with the experts over all 8 GPUs, and the page says so."""
    from ui.model_source import PRESET_KEY
    from ui.world import DATACENTRE
    at = page("42_", **{f"{DATACENTRE.key}.{PRESET_KEY}": "DeepSeek-R1", "plan.devices": ["H200"], "plan.wds": ["fp8"],
                        "plan.kds": ["fp8"], "plan.rate": "8", "plan.prompt": "1000", "plan.p99": "1000",
                        "plan.output": "2000", "plan.out99": "2000", "plan.ttft": "3000", "plan.itl": "150"})
    assert not at.exception and not texts(at.error)
    assert any("8 × H200" in m.value and "DP 8 attention, EP 8" in m.value for m in at.markdown)
    # one server instance: its 8 attention ranks are not 8 copies of the model
    assert [m.value for m in at.metric if m.label == "Replicas"] == ["1"]
    # and the step at the rate says how much of it waits for the busiest rank's prompts
    assert any("waiting for the busiest of the 8 attention ranks" in c.value for c in at.caption)


def _fills_the_lengths_from_an_mlperf_dataset(at):
    """(Run inside the planner test above, on its page.) Picking MLPerf's Llama-3.1-405B dataset fills the four
    length fields with its measured means and p99s (from the docs' dataset table: prompts 9,428.64 / 18,956,
    reference answers 684.68 / p99 of the file), says where they come from, and plans without an error; a length
    edited afterwards is no longer called the dataset's."""
    from specs.workloads import mlperf_dataset
    at.selectbox(key="plan.dataset").set_value("llama3.1-405b").run()
    assert not at.exception and not texts(at.error)
    got = {k: at.text_input(key=k).value for k in ("plan.prompt", "plan.p99", "plan.output", "plan.out99")}
    o = mlperf_dataset("llama3.1-405b")["output"]["samples"]
    assert got == {"plan.prompt": "9429", "plan.p99": "18956", "plan.output": "685", "plan.out99": str(round(o["p99"]))}
    assert any("8,313 samples" in c.value for c in at.caption)
    at.text_input(key="plan.prompt").set_value("5000").run()
    assert any("no longer llama3.1-405b's" in c.value for c in at.caption)
