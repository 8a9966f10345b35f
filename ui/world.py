"""Which world the sizing and serving lessons show (issue 28, "One world").

The inside-the-model pages run the engine's default model, SmolLM2-135M, on this computer. The sizing and serving
pages open on the same model and the same machine ("this class's machine"), so a number such as the KV bytes per
token carries over from one lesson to the next. One switch moves a session to "data-centre scale" (a large preset on
a datasheet GPU) and back.

The switch is this session's own (one student's choice never changes another's) and is remembered across pages. It
sets the defaults of `ui.model_source.model_source` and `device_picker`: a session starts on its world's preset and
device, and a flip moves both widgets to the new world's defaults; the student can still pick anything afterwards.
`model_source` draws the switch (at the top of its sidebar section) and one line on the page naming the world.

    from ui.world import current_world, world_switch
    world = world_switch()          # the switch and the page's one line; returns this session's World
    current_world().preset          # its default preset (a name in specs/models), .device its default device

Names only: architecture and device numbers stay in specs/ (a test checks the class preset against the engine's
default model, counted).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from ui.machine import THIS_MACHINE
from ui.widgets import remember, remembered_value, set_remembered

# the model and device pickers' session keys (`ui.model_source`), which a flip of the switch sets
PRESET = "Preset"                           # the model source radio's "a preset" choice
SOURCE_KEY = "size.source"                  # radio: preset / engine model / config.json
PRESET_KEY = "size.preset"                  # selectbox of presets
DEVICE_KEY = "device"                       # selectbox of devices (device_picker's default key)
WORLD_KEY = "world"                            # radio: CLASS.label / DATACENTRE.label (per session, remembered)
WORLD_LABEL = "Lessons show"


@dataclass(frozen=True)
class World:
    key: str                                   # short name, for keys and tests
    label: str                                 # the switch's option
    preset: str                                # default model: a preset name in specs/models
    device: str                                # default device: a name in specs/devices.json, or THIS_MACHINE
    line: str                                  # the page's one line naming the world
    weight_dtype: str = "bf16"                 # default weight precision of its sizing pages (the engine: fp32)


CLASS = World(
    "class", "This class's machine (SmolLM2-135M on this computer)", "SmolLM2-135M-Instruct", THIS_MACHINE,
    "Showing **this class's machine**: SmolLM2-135M, the model the inside-the-model pages ran, on this computer "
    "(its measured bandwidth); the engine keeps K, V and weights in float32, so fp32 precisions match its counts. "
    "Switch to data-centre scale at the top of the sidebar.", weight_dtype="fp32")
DATACENTRE = World(
    "datacentre", "Data-centre scale (a chosen preset and GPU)", "Llama-3.1-70B", "H100 SXM",
    "Showing **data-centre scale**: a preset on a datasheet GPU (default Llama-3.1-70B on an H100 SXM). Switch "
    "back to this class's machine at the top of the sidebar.")
WORLDS = (CLASS, DATACENTRE)
DEFAULT_WORLD = CLASS


def _by_label(label: Any) -> World | None:
    return next((w for w in WORLDS if w.label == label), None)


def current_world() -> World:
    """This session's world (the class's machine until the student flips the switch); reads, never writes."""
    return _by_label(remembered_value(WORLD_KEY)) or DEFAULT_WORLD


def world_weight_dtype(key: str, device, gpu_default: str = "bf16") -> tuple[str, str]:
    """(default, widget key) of a page's weight precision for the device it sizes: fp32 on this computer (the class's
    machine: the engine computes and keeps its weights in float32, so the sizes and floors are the engine's own),
    `gpu_default` on a datasheet GPU. Each keeps its own choice (`key` + ".engine" or ".gpu"), so moving between
    this machine and a GPU lands on that one's precision."""
    if getattr(device, "kind", None) == "measured" or getattr(device, "name", "") == THIS_MACHINE:
        return CLASS.weight_dtype, f"{key}.engine"
    return gpu_default, f"{key}.gpu"


def _apply(world: World) -> None:
    """The new world's defaults, here and on every page: its preset as the model to size and its device."""
    set_remembered(SOURCE_KEY, PRESET)
    set_remembered(PRESET_KEY, world.preset)
    set_remembered(DEVICE_KEY, world.device)


def _flipped() -> None:
    set_remembered(WORLD_KEY, st.session_state[WORLD_KEY])
    _apply(current_world())


def world_switch(where: Any = None, *, fixed: World | None = None, why: str = "") -> World:
    """The switch (in `where`, the sidebar by default) and the page's one line; returns the world the page shows.

    `fixed`: a page that works at one scale whatever the switch says (the Capacity planner plans rented GPUs);
    when the switch says otherwise, the line says so, with `why`.
    """
    box = where if where is not None else st.sidebar
    remember(WORLD_KEY, DEFAULT_WORLD.label)                  # the choice kept across pages
    if _by_label(st.session_state.get(WORLD_KEY)) is None:     # a stale or hand-set value: the default
        set_remembered(WORLD_KEY, DEFAULT_WORLD.label)
    world = current_world()
    box.radio(WORLD_LABEL, [w.label for w in WORLDS], key=WORLD_KEY, on_change=_flipped,
              help="This class's machine: the model the engine ran (SmolLM2-135M) on this computer, so the numbers "
                   "match the inside-the-model pages. Data-centre scale: a large preset on a datasheet GPU. Both "
                   "set only the defaults below; pick any model or device afterwards. Your choice only.")
    if fixed is not None and fixed != world:
        st.markdown(f"This page always works at **{fixed.label.split(' (')[0].lower()}**{': ' + why if why else ''}"
                    f" (the switch says “{world.label}”; it applies on the other pages).")
        return fixed
    st.markdown(world.line)
    return world
