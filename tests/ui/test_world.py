"""Issue 28, "One world": the sizing and serving pages open on the model and machine the class just ran (SmolLM2-135M
on this computer); one switch per session moves them to data-centre scale, remembered across pages, never shared
between sessions. Plus the class preset = the engine's default model, counted."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from calculators.sizing.kv_cache import kv_bytes_per_token
from specs.devices import list_devices
from specs.presets import load_preset
from ui.machine import machine_history
from ui.model_picker import CHOICE_KEY
from ui.model_source import DEVICE_KEY, PRESET_KEY, THIS_MACHINE
from ui.world import CLASS, DATACENTRE, WORLD_KEY, WORLDS
from helpers_apptest import SMALL_RANDOM, errors, run_script

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
KV_PAGE = str(ROOT / "pages" / "22_KV_cache_and_attention_variants.py")
PLANNER = str(ROOT / "pages" / "42_Capacity_planner.py")


def said(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption") for e in at.get(kind))


def test_the_worlds_name_a_preset_and_a_device_that_exist():
    for w in WORLDS:
        load_preset(w.preset)
        assert w.device == THIS_MACHINE or w.device in list_devices(), w


def test_a_sizing_page_opens_on_the_class_machine_and_a_flip_stays_in_its_session():
    at = run_script(KV_PAGE, 120)
    assert not errors(at) and not at.exception
    assert at.sidebar.radio(key=WORLD_KEY).value == CLASS.label
    assert (at.session_state[PRESET_KEY], at.session_state[DEVICE_KEY]) == (CLASS.preset, THIS_MACHINE)
    assert "Showing **this class's machine**" in said(at) and "Sized on paper: **SmolLM2-135M-Instruct**" in said(at)

    at.sidebar.radio(key=WORLD_KEY).set_value(DATACENTRE.label).run()
    assert not errors(at) and not at.exception
    assert (at.session_state[PRESET_KEY], at.session_state[DEVICE_KEY]) == (DATACENTRE.preset, DATACENTRE.device)
    assert "Showing **data-centre scale**" in said(at) and f"Sized on paper: **{DATACENTRE.preset}**" in said(at)
    at.sidebar.selectbox(key=PRESET_KEY).set_value("TinyLlama-1.1B").run()      # the world sets defaults only
    assert at.session_state[PRESET_KEY] == "TinyLlama-1.1B"
    assert at.sidebar.radio(key=WORLD_KEY).value == DATACENTRE.label

    other = run_script(KV_PAGE, 120)                                           # a second student: still the class
    assert other.sidebar.radio(key=WORLD_KEY).value == CLASS.label
    assert (other.session_state[PRESET_KEY], other.session_state[DEVICE_KEY]) == (CLASS.preset, THIS_MACHINE)


def test_the_switch_is_remembered_across_pages():
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state[CHOICE_KEY] = SMALL_RANDOM
    at.run()
    at.switch_page("pages/21_Model_anatomy.py").run()
    at.sidebar.radio(key=WORLD_KEY).set_value(DATACENTRE.label).run()
    for page in ("pages/11_Tokens.py", "pages/23_Roofline.py", "pages/31_Batching.py"):   # 11 draws no switch
        at.switch_page(page).run()
        assert not at.exception, page
    assert at.sidebar.radio(key=WORLD_KEY).value == DATACENTRE.label
    assert (at.session_state[PRESET_KEY], at.session_state[DEVICE_KEY]) == (DATACENTRE.preset, DATACENTRE.device)
    assert "Showing **data-centre scale**" in said(at)


def test_the_planner_works_at_data_centre_scale_and_says_so_in_the_class_world():
    at = run_script(PLANNER, 120)
    assert not errors(at) and not at.exception
    assert at.sidebar.radio(key=WORLD_KEY).value == CLASS.label
    assert "This page always works at **data-centre scale**" in said(at)
    assert f"Sized on paper: **{DATACENTRE.preset}**" in said(at)
    assert PRESET_KEY not in at.session_state or at.session_state[PRESET_KEY] == CLASS.preset  # others' choice kept
    at.sidebar.radio(key=WORLD_KEY).set_value(DATACENTRE.label).run()
    assert "Showing **data-centre scale**" in said(at) and "always works" not in said(at)
    assert at.session_state[PRESET_KEY] == DATACENTRE.preset


def test_this_machine_on_a_page_load_measures_once_and_quickly(monkeypatch):
    """No measurement yet: the first load takes a quick one and says so; reruns and other sessions reuse it."""
    import ui.machine as machine
    budgets = []
    real = machine.measure_this_machine
    monkeypatch.setattr(machine, "measure_this_machine", lambda seconds_budget: budgets.append(seconds_budget) or
                        real(seconds_budget=0.05))
    machine_history.reset()
    try:
        at = run_script(KV_PAGE, 120)
        at.run()
        run_script(KV_PAGE, 120)
        assert budgets == [machine.QUICK_SECONDS]
        assert "a quick" in " ".join(c.value for c in at.sidebar.caption)
    finally:
        machine_history.reset()


def test_the_class_preset_is_the_engine_default_model_counted(default_model):
    """The class world's preset has the engine default model's architecture, and its KV bytes per token (at the
    engine's float32) equal what the engine's cache counts: 2 · 30 layers · 3 KV heads · 64 · 4 B = 46,080."""
    preset, engine = load_preset(CLASS.preset), default_model.config
    fields = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
              "tie_word_embeddings")
    assert {f: getattr(preset, f) for f in fields} == {f: getattr(engine, f) for f in fields}
    cache, tokens = default_model.new_cache(1, 64), 20
    default_model.prefill(list(range(10, 10 + tokens)), cache)
    assert cache.bytes_used() / tokens == kv_bytes_per_token(preset, 4) == 46_080


def test_parallelism_works_at_data_centre_scale_whatever_the_switch_says():
    """This computer has no links between GPUs, so in the class world the page said only "choose an interconnect":
    it now sizes the data-centre preset on its GPU, says why, and leaves the switch (and other pages) as they were."""
    at = run_script(str(ROOT / "pages" / "41_Parallelism.py"), 120)
    assert not at.exception and not errors(at)
    assert at.sidebar.radio(key=WORLD_KEY).value == CLASS.label
    assert "This page always works at **data-centre scale**" in said(at) and "links between them" in said(at)
    assert f"Sized on paper: **{DATACENTRE.preset}**" in said(at)
    assert at.dataframe, "the tensor-parallel table is drawn"
    assert not any("lists no interconnect" in i.value for i in at.info)
    assert PRESET_KEY not in at.session_state                            # the class world's own choice untouched
