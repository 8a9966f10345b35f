"""Issue 18, a teacher's and a planner's walkthrough: each thing found there, driven headless on its page. Every
test names the bug that makes it fail."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from helpers_apptest import REFERENCE, errors, in_datacentre, run_script
from ui.model_source import PRESET_KEY
from ui.world import CLASS

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def page(prefix: str, **state) -> AppTest:
    return run_script(str(next((ROOT / "pages").glob(f"{prefix}*.py"))), TIMEOUT, **state)


def specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def text(at: AppTest, *kinds: str) -> str:
    kinds = kinds or ("markdown", "caption", "info", "warning", "success")
    return "\n".join(str(e.value) for k in kinds for e in at.get(k))


# ------------------------------------------------------------------------------------------ Walkthrough
def test_walkthrough_step_6_bars_are_the_models_probabilities_shown_in_step_5():
    """Step 6 plotted the greedy sampler's probability (100% for every token) while step 5 gave the same first
    token the model's own, e.g. 25%."""
    at = page("01_", **{"walk.step": "5"})
    assert not errors(at) and not at.exception
    five = next(s for s in specs(at) if s["data"][0]["type"] == "bar")["data"][0]
    at.text_input(key="walk.step").set_value("6").run()
    six = next(s for s in specs(at) if s["data"][0]["type"] == "bar")["data"][0]
    first_pick = five["y"][0]                        # temperature 0: the first token is step 5's favourite
    assert six["y"][0] == pytest.approx(first_pick, rel=1e-6)
    assert max(six["y"]) < 0.99                      # a random model is never sure; the sampler's odds were 1.0


def test_walkthrough_reply_cut_by_the_token_limit_says_so_and_the_colour_strip_has_a_scale():
    at = page("01_", **{"walk.step": "1"})
    assert "…" in text(at, "markdown") and "New tokens to generate" in text(at, "caption")
    at.text_input(key="walk.step").set_value("3").run()
    strip = specs(at)[0]["data"][0]
    assert strip["type"] == "heatmap" and strip["showscale"] is True
    assert "blue below zero" in text(at, "caption")


def test_attention_page_explains_the_sink_and_the_rope_rings():
    at = page("13_")
    words = text(at, "caption")
    assert "attention sink" in words and "How to read it" in words


# ------------------------------------------------------------------------------------------ Capacity planner
def test_planner_plans_despite_an_invalid_sidebar_tp_and_says_what_it_set_aside():
    """A TP of 8 (set on Parallelism) does not divide Qwen2.5-7B's 28 heads: the page went blank with "Choose a
    model (and a valid memory budget)", though it chooses TP itself."""
    at = page("42_", **{PRESET_KEY: "Qwen2.5-7B"})
    at.text_input(key="mg.gpus").set_value("8").run()
    at.text_input(key="mg.tp").set_value("8").run()
    assert not errors(at) and not at.exception
    assert "Cheapest plan" in metrics(at)
    said = text(at, "caption")
    assert "Set aside here" in said and "TP 8" in said and "cannot take" in said


def test_planner_headline_is_short_labelled_input_and_output_and_matches_its_table():
    """The headline read "$ per 1M tokens" (input and output blended) and "25.3 / 180…" (cut)."""
    at = page("42_")
    m = metrics(at)
    assert {"$ per 1M output tokens", "$ per 1M input tokens", "TTFT p99", "Mean ITL at the load"} <= set(m)
    head = list(m)[:list(m).index("TTFT p99") + 1]               # the headline's metrics (the sections follow)
    assert all(len(m[k]) <= 14 for k in head if k != "Cheapest plan"), m
    table = next(d.value for d in at.dataframe if "usd_per_million_output_tokens" in d.value.columns)
    assert m["$ per 1M output tokens"] == f"${table['usd_per_million_output_tokens'].iloc[0]:.3f}"
    assert m["$ per 1M input tokens"] == f"${table['usd_per_million_input_tokens'].iloc[0]:.3f}"
    assert m["TTFT p99"] == f"{table['ttft_p99_ms'].iloc[0]:,.0f} ms"
    assert m["Mean ITL at the load"] == f"{table['itl_at_load_ms'].iloc[0]:.1f} ms"     # the load's ITL, not decode alone


def test_planner_names_the_quality_cost_of_fp8_and_int4_plans():
    at = page("42_")
    shown = set(next(d.value for d in at.dataframe if "weight_dtype" in d.value.columns)["weight_dtype"].head(15))
    notes = text(at, "info")
    for wd in shown - {"bf16"}:
        assert f"**{wd} weights**" in notes and "arXiv:2411.02355" in notes


def test_planner_says_why_a_named_layout_was_rejected():
    at = page("42_")
    for key, value in (("plan.ask.device", "H200"), ("plan.ask.gpus", 2), ("plan.ask.tp", 2), ("plan.ask.pp", 1),
                       ("plan.ask.cap", 64), ("plan.ask.wd", "bf16"), ("plan.ask.kd", "bf16")):
        at.selectbox(key=key).set_value(value)
    at.run()
    verdict = text(at, "warning", "success")
    assert "2 × H200, TP 2 PP 1, batch cap 64, bf16/bf16" in verdict          # the plan named as the planner names it
    assert "rejected" in verdict or "feasible" in verdict


# ------------------------------------------------------------------------------------------ defaults that teach
def test_chunked_prefill_headline_is_the_simulated_worst_gap_of_its_table():
    """The headline said 2.44 ms (the linear bound) while the table and chart said 1.55 ms, no bumps."""
    at = page("35_", **REFERENCE)                  # the text's TinyLlama on an A100: millisecond gaps
    m = metrics(at)
    table = at.dataframe[0].value.set_index("prefill")
    whole = next(v for k, v in m.items() if k.startswith("Worst token gap, whole"))
    chunked = next(v for k, v in m.items() if k.startswith("Worst token gap,") and "chunks" in k)
    assert whole == f"{table.loc['whole prefill', 'itl_max_ms']:.3g} ms"
    row = next(i for i in table.index if i.startswith("chunks"))
    assert chunked == f"{table.loc[row, 'itl_max_ms']:.3g} ms"
    normal = float(m["Normal decode step"].split()[0])
    assert table.loc[row, "itl_max_ms"] > 1.2 * normal            # the default chunk shows a bump, smaller than
    assert table.loc[row, "itl_max_ms"] < 0.5 * table.loc["whole prefill", "itl_max_ms"]   # the whole stall


def test_paged_kv_page_says_how_contiguous_kept_up_when_the_lines_coincide():
    at = page("33_")
    words = text(at, "markdown")
    summary = next(d.value for d in at.dataframe if "relocations" in d.value.columns).set_index("policy")
    c, p = summary.loc["contiguous"], summary.loc["paged"]
    coincide = c["steps"] == p["steps"] and c["max_batch"] == p["max_batch"]     # the two lines lie on each other
    # (the run depends on this machine's speed; the table's column is float where a policy has no relocations)
    assert (f"{int(c['relocations']):,} relocations" in words) == coincide


def test_queueing_defaults_make_goodput_and_throughput_part_and_say_where():
    """With the old targets goodput equalled throughput at every load and the best cap tied 8-64 unexplained."""
    at = page("37_")
    batched = next(d.value for d in at.dataframe if "goodput_tok_s" in d.value.columns and "load" in d.value.columns)
    assert (batched["goodput_tok_s"] < 0.99 * batched["throughput_tok_s"]).any()
    assert "Goodput leaves throughput from load" in text(at, "markdown")
    assert "Best cap for goodput here" in text(at, "markdown")


def test_queueing_rho_field_offers_only_what_it_accepts():
    """The ρ box allowed 0-10 and then refused ρ ≥ 1."""
    at = page("37_")
    at.text_input(key="queue.rho").set_value("1.5").run()
    assert any("between 0.01 and 0.99" in e for e in errors(at))


# ------------------------------------------------------------------------------------------ coherence
def test_sizing_and_engine_pages_say_which_model_they_use():
    at = page("22_")
    assert f"Sized on paper: **{CLASS.preset}**" in text(at, "caption")        # the class's own model (ui/world.py)
    at = page("11_")
    assert "Runs on this computer:" in text(at, "caption")


def test_mesh_view_explains_mla_instead_of_an_error():
    at = page("41_", **in_datacentre({**REFERENCE, PRESET_KEY: "DeepSeek-V2"}))      # on a GPU with links
    assert not errors(at) and not at.exception
    assert "multi-head latent attention" in text(at, "info")


def test_moe_tp_table_does_not_call_the_resident_weights_a_floor():
    at = page("41_", **in_datacentre({**REFERENCE, PRESET_KEY: "Mixtral-8x7B"}))
    tp = at.dataframe[0].value
    assert "weights-only floor (ms)" not in tp.columns and "every weight read once (ms)" in tp.columns
    assert "mixture of experts" in text(at, "caption")
