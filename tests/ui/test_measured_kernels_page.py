"""The Measured kernels page (pages/28_Measured_kernels.py) on a profile made by hand, in a folder of its own (no
aiconfigurator-core needed): its three charts with points past the table drawn dashed and hollow, the sentences
under them, the step's op table with a CSV; what it says with no profile installed and for a model no profile can
price; and the helpers it draws with (ticks that read "1k" and "16 MiB", the op table's total row)."""
from pathlib import Path

import numpy as np
import pytest

import ui.measured_kernels as mk
from helpers_apptest import chart_specs, errors, page_text, run_script, walkthrough_problems
from helpers_profiles import hand_made_h200_profile
from specs.profiles import save_profile

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "28_Measured_kernels.py")
NAME = "h200-vllm-0.0-test"


@pytest.fixture
def own_profiles(tmp_path, monkeypatch):
    save_profile(hand_made_h200_profile(NAME), tmp_path / f"{NAME}.json")
    monkeypatch.setattr(mk, "PROFILES_DIRECTORY", tmp_path)
    return tmp_path


def page(**state):
    return run_script(PAGE, 90, choice=None, **{"kernels.profile": NAME, **state})


def test_the_page_draws_the_profiles_curves_against_the_roofline(own_profiles):
    at = page()
    assert not at.exception and not errors(at) and walkthrough_problems(at) == []
    specs = chart_specs(at)
    assert len(specs) == 3                                   # GEMMs, decode attention, all-reduce
    text = page_text(at)
    assert f"Profile **{NAME}**: vLLM 0.0-test" in text and "4,800 GB/s memory bandwidth" in text
    assert "At 1 token the qkv projection GEMM streams its weights at 60% of the datasheet bandwidth" in text
    assert "At batch 32 and 1,024 cached positions decode attention streams the KV cache at 90%" in text
    assert "at batch 1 and 1,024 positions only 50%" not in text and "even batch 1" in text
    gemm = specs[0]
    dashed = [t for t in gemm["data"] if (t.get("line") or {}).get("dash") == "dash"]
    assert any(t["name"] == "LM head (extrapolated)" for t in dashed)     # 128,256 columns: past the table
    assert "16k" in gemm["layout"]["xaxis"]["ticktext"] and "1" in gemm["layout"]["xaxis"]["ticktext"]
    assert all(any(sh.get("y0") == 100 for sh in s["layout"]["shapes"]) for s in specs)   # the datasheet's 100%
    assert gemm["layout"]["yaxis"]["range"][0] == 0
    step = at.dataframe[0].value
    assert step["op"].tolist()[-1] == "all ops" and "decode attention" in step["op"].tolist()
    # 64 decode rows lie halfway (in log) between the measured m = 16 (60%) and 256 (80%)
    assert step.loc[step["op"] == "qkv projection", "% of datasheet"].item() == pytest.approx(100 * (0.6 * 0.8) ** 0.5)
    assert len(at.get("download_button")) == len(at.dataframe) == 2


def test_with_no_profile_installed_the_page_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(mk, "profile_names", lambda: [])
    at = page()
    assert not at.exception and not errors(at) and not chart_specs(at)
    assert "pip install -r requirements-profiles.txt" in at.info[0].value
    assert "python -m engine profile" in at.info[0].value


def test_a_model_no_profile_can_price_falls_back_to_the_closed_form(own_profiles):
    at = page(**{"kernels.model": "DeepSeek-V3"})
    assert not at.exception and not errors(at) and not chart_specs(at)
    assert "MLA" in at.info[0].value and "closed form" in at.info[0].value


def test_tick_labels_read_as_sizes_not_digits():
    assert [mk.count_text(v) for v in (1, 4, 1024, 16384, 131072, 1536)] == ["1", "4", "1k", "16k", "128k", "1,536"]
    assert [mk.bytes_text(v) for v in (256, 1024, 16 << 20, 1 << 30)] == ["256 B", "1 KiB", "16 MiB", "1 GiB"]
    assert mk.log_axis([1, 2, 4, 8], mk.count_text) == dict(type="log", tickvals=[1, 4], ticktext=["1", "4"])


def test_the_ridge_line_stands_between_the_last_bandwidth_bound_and_the_first_compute_bound_point():
    from calculators.planning.measured_curves import Curve
    x = np.array([1.0, 16, 256, 4096])
    turns = Curve("qkv", x, x, x, np.zeros(4, bool), np.array([False, False, True, True]))
    marks = mk.ridge_marks(turns)
    assert marks["shapes"][0]["x0"] == pytest.approx(64)                   # halfway (in log) from 16 to 256
    assert marks["annotations"][0]["x"] == pytest.approx(np.log10(64))     # an annotation takes the log
    assert mk.ridge_marks(Curve("qkv", x, x, x, np.zeros(4, bool), np.zeros(4, bool))) == {}


def test_the_default_profile_is_the_h200_on_vllm_when_installed():
    assert mk.default_profile(["a100-sxm-80gb-vllm-0.14.0@x", "h200-vllm-0.24.0@x"]) == "h200-vllm-0.24.0@x"
    assert mk.default_profile(["cpu-numpy-2.4.6"]) == "cpu-numpy-2.4.6"


def test_the_formats_offered_are_those_the_profile_measured():
    p = hand_made_h200_profile()
    assert mk.measured_formats(p, "gemm", "dtype", mk.WEIGHT_CHOICES) == ["bf16"]         # a CPU's: ["fp32"]
    assert mk.measured_formats(p, "context_attention", "kv_dtype", mk.KV_CHOICES) == list(mk.KV_CHOICES)


def test_an_moe_model_on_a_profile_with_deepep_tables_gets_the_exchange_charts():
    """DeepSeek-R1 on aiconfigurator-core's B200 TensorRT-LLM profile (skipped without it): a chart of NCCL's
    all-gather and reduce-scatter (TensorRT-LLM's wide-EP exchange, which the planner prices) and one of DeepEP's
    dispatch and combine by tokens per GPU against the link, each with its sentence under it."""
    from specs import aiconfigurator_source as aic
    if aic.package_dir() is None or not aic.readers_installed():
        pytest.skip("aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
    name = next(n for n in aic.shipped() if n[0] == "b200_sxm" and n[1] == "trtllm")
    at = run_script(PAGE, 180, choice=None, **{"kernels.profile": aic.profile_name(*name, aic.package_version()),
                                                "kernels.model": "DeepSeek-R1", "kernels.wd": "fp4"})
    assert not at.exception and not errors(at)
    heads = [h.value for h in at.subheader]
    assert "All-gather and reduce-scatter (wide EP's token exchange) by buffer size" in heads
    assert "Expert all-to-all (DeepEP) by tokens per GPU" in heads
    text = page_text(at)
    assert "TensorRT-LLM moves a wide-EP MoE layer's tokens this way by default" in text
    assert "At 1,024 tokens per GPU one MoE layer's dispatch" in text and "DeepEP is opt-in on this stack" in text


def test_the_op_table_says_where_the_profiles_fp8_kernel_is_slower_than_its_bf16_one(tmp_path, monkeypatch):
    """A hand-made profile whose fp8 GEMMs run at 10% of their roofline and bf16 ones at 50%: on Qwen3-30B-A3B in fp8
    the op table's note column says the bf16 kernel is faster for the qkv projection, and the router (bf16 in
    quantized checkpoints) says nothing."""
    from helpers_profiles import qwen3_moe_fp8_slow_profile
    name = "h200-trtllm-slow-fp8"
    profile, qwen = qwen3_moe_fp8_slow_profile(name)
    save_profile(profile, tmp_path / f"{name}.json")
    monkeypatch.setattr(mk, "PROFILES_DIRECTORY", tmp_path)
    at = run_script(PAGE, 90, choice=None, **{"kernels.profile": name, "kernels.model": qwen.name,
                                              "kernels.wd": "fp8", "kernels.kd": "fp8"})
    assert not at.exception and not errors(at)
    step = at.dataframe[0].value.set_index("op")
    assert step.loc["qkv projection", "note"].startswith("this profile's bf16 kernel is faster at this shape")
    assert step.loc["router", "note"] == "" and "(bf16)" in step.loc["router", "shape"]
    # the note column is in the CSV only; the page says it under the table, one warning per such op
    warned = [w.value for w in at.warning]
    assert any(w.startswith("qkv projection: this profile's bf16 kernel is faster") for w in warned)
    assert not any(w.startswith("router") for w in warned)


def test_an_aiconfigurator_profile_shows_the_planners_step_beside_aiconfigurators():
    """On the H200 TensorRT-LLM profile (the optional extra) the page prices the committed steps of that device and
    stack (bench/anchor_steps.csv): a chart of here ÷ aiconfigurator with 1.0 marked, the sentence from those
    ratios, and the table with its CSV; a profile measured here says why it has none."""
    from specs import aiconfigurator_source as aic
    if aic.package_dir() is None or not aic.readers_installed():
        pytest.skip("aiconfigurator-core is not installed (pip install -r requirements-profiles.txt)")
    name = next((n for n in mk.profile_names() if n.startswith("h200-trtllm-")), None)
    if name is None:
        pytest.skip("no H200 TensorRT-LLM profile")
    at = run_script(PAGE, 120, choice=None, **{"kernels.profile": name})
    assert not at.exception and not errors(at)
    table = next(d.value for d in at.dataframe if "here / aiconfigurator" in d.value.columns)
    assert len(table) > 10 and table["here / aiconfigurator"].between(0.8, 1.2).mean() > 0.9
    anchor = chart_specs(at)[-1]
    assert "aiconfigurator" in str(anchor["layout"]["yaxis"]["title"])
    assert any(sh.get("y0") == 1 for sh in anchor["layout"]["shapes"])
    assert f"the planner's GPU time is {table['here / aiconfigurator'].min():.2f}-" in page_text(at)


def test_a_profile_measured_here_has_no_aiconfigurator_steps_to_stand_beside(own_profiles):
    at = page()
    assert not at.exception and not errors(at)
    assert any("was not measured by aiconfigurator-core" in c.value for c in at.caption)
