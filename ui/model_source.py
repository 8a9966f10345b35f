"""What the theory pages size: a MODEL (a preset, the engine's loaded model, or any Hugging Face config.json) and a
DEVICE (a datasheet entry, your own numbers, or this machine measured with NumPy). Both live in the sidebar and
keep their choice across pages.

    from ui.model_source import model_source, device_picker
    config = model_source()        # specs.model_config.ModelConfig, or None (the reason is on screen)
    device = device_picker()       # specs.devices.Device, or None

Nothing here computes a cost: a config is parsed by `specs.hf_config.parse_hf_config`, a device comes from
`specs.devices`; every problem becomes one st.error (never a traceback).
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import streamlit as st

from calculators.units import fmt_bytes, fmt_num, uploaded_text
from specs.devices import Device, list_devices, load_device
from specs.model_config import ModelConfig, SpecError
from specs.presets import list_presets, load_preset
from ui.machine import THIS_MACHINE, machine_controls, measured_machine
from ui.widgets import remember, show_error
from ui.world import DEVICE_KEY, PRESET, PRESET_KEY, SOURCE_KEY, World, current_world, world_switch

if TYPE_CHECKING:
    from ui.multi_gpu import MultiGPU
from specs.hf_config import parse_hf_config

# ============================================================================================ keys and labels
ENGINE, CONFIG_JSON = "Engine model (loaded)", "Hugging Face config.json"
SOURCES = (PRESET, ENGINE, CONFIG_JSON)
UPLOAD, PASTE, LOCAL, HUB = "Upload", "Paste", "Local path", "Hub repo id"
CONFIG_MODES = (UPLOAD, PASTE, LOCAL, HUB)
REFERENCE_PRESET = "TinyLlama-1.1B"         # the reference text's running example (its numbers are quoted for it)

MODE_KEY = "size.config_mode"               # radio: where the config.json comes from
UPLOAD_KEY = "size.upload"                  # file_uploader
UPLOADED_KEY = "size.uploaded"              # (file name, text) of the last upload (survives page switches)
PASTE_KEY = "size.paste"                    # text_area
PATH_KEY = "size.path"                      # text_input: a config.json or a folder holding one
REPO_KEY = "size.repo"                      # text_input: owner/name on the Hugging Face Hub
HUB_CACHE_KEY = "size.hub_results"          # repo -> ("ok", text) | ("error", message): never fetched twice

CUSTOM = "Custom device…"
REFERENCE_DEVICE = "A100 SXM 40GB"          # the reference text's GPU
MAX_CONFIG_BYTES = 2_000_000                # a config.json is a few KB; anything this big is the wrong file

UNITS_NOTE = ("Units: **GB = 10⁹ bytes** and MB = 10⁶ bytes (decimal, like vendors' bandwidth figures); "
              "**GiB = 2³⁰ bytes** (binary). Datasheet capacities such as \"80 GB\" are read as GiB "
              "(80 GiB = 85.9 GB), as `nvidia-smi` reports them.")

_NOT_GIVEN: Any = object()


# ============================================================================================ parsing
def parse_config_text(text: str | bytes, name: str = "config.json") -> ModelConfig:
    """A `ModelConfig` from the text of a Hugging Face config.json; SpecError says what is wrong with it."""
    text = uploaded_text(text, name, MAX_CONFIG_BYTES, "a Hugging Face config.json (a few KB)")
    if not text.strip():
        raise SpecError(f"{name} is empty; paste or upload the contents of a Hugging Face config.json")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{name} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{name} holds a JSON {type(cfg).__name__}, but a config.json is one object "
                        "{\"model_type\": ..., \"hidden_size\": ..., ...}")
    label = str(cfg.get("_name_or_path") or "").strip().rstrip("/").split("/")[-1] or name
    try:
        return parse_hf_config(cfg, name=label)
    except SpecError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as e:   # a key of an unexpected type
        raise SpecError(f"could not read {name}: {type(e).__name__}: {e}") from None


def read_config_path(path: str) -> tuple[str, str]:
    """(name, text) of a config.json given as a file or as the folder holding it (in classroom mode only inside
    the allowed folder)."""
    from server.classroom import current_policy
    p = Path(os.path.expanduser(path.strip()))
    current_policy().check_local_path(p)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise SpecError(f"{p} does not exist; give the path of a config.json or of the folder holding one")
    if not p.is_file():
        raise SpecError(f"{p} is not a file")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise SpecError(f"{p} is {p.stat().st_size:,} bytes: too large to be a config.json")
    try:
        return p.parent.name or p.name, p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read {p}: {e}") from None


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """A quick TCP check of the Hub's host, so an offline machine answers in seconds, not after retries."""
    from huggingface_hub import constants
    if getattr(constants, "HF_HUB_OFFLINE", False):
        return False
    url = urlparse(getattr(constants, "ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def fetch_hub_config(repo: str) -> str:
    """The text of `repo`'s config.json: from the local Hugging Face cache, else downloaded. SpecError if the id
    is malformed, the repo is missing or gated, or the machine is offline (with what to do instead)."""
    from engine.load.hub import _hub_error, is_repo_id
    from huggingface_hub import hf_hub_download

    from server.classroom import current_policy
    repo = repo.strip()
    if not is_repo_id(repo):
        raise SpecError(f"{repo!r} is not a Hugging Face repository id; expected 'owner/name', "
                        "e.g. TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    current_policy().check_hub_repo(repo)
    try:
        return Path(hf_hub_download(repo, "config.json", local_files_only=True)).read_text(encoding="utf-8-sig")
    except Exception:                                    # not cached yet: go to the network
        pass
    if not _hub_reachable():
        raise SpecError(f"this machine is offline (huggingface.co cannot be reached, or HF_HUB_OFFLINE is set), "
                        f"so {repo}'s config.json cannot be fetched. Download it elsewhere and upload or paste "
                        f"it instead, or pick a preset")
    try:
        path = hf_hub_download(repo, "config.json", etag_timeout=10)
    except Exception as e:
        raise _hub_error(repo, e) from None
    return Path(path).read_text(encoding="utf-8-sig")


# ============================================================================================ the model widget
def model_source(where: Any = None, *, engine: Any = _NOT_GIVEN, header: str = "Model to size",
                 world: World | None = None, why: str = "") -> ModelConfig | None:
    """Sidebar section: the world switch (`ui.world`), then the model the page sizes, defaulting to the world's
    preset. Returns its `ModelConfig`, or None after saying why.

    `engine`: the page's engine model when the page already drew `ui.model_picker` (None if none is loaded);
    left out, choosing "Engine model" draws the picker itself.
    `world`: a page that works at one scale whatever the switch says (with `why`); while the switch says
    otherwise, its model choice is kept under keys of its own, so the other pages' choice is left alone.
    """
    box = where if where is not None else st.sidebar
    ss = st.session_state
    shown = world_switch(box, fixed=world, why=why)
    own = "" if shown == current_world() else f"{shown.key}."
    source_key, preset_key = own + SOURCE_KEY, own + PRESET_KEY
    box.header(header)
    store = remember(source_key, PRESET)
    if ss.get(source_key) not in SOURCES:
        ss[source_key] = PRESET
    source = box.radio("Source", SOURCES, key=source_key, on_change=store,
                       help="A preset from specs/models, the model the engine has loaded, or any decoder-only "
                            "model's config.json from the Hugging Face Hub.")
    if source == PRESET:
        presets = list_presets()
        default = shown.preset if shown.preset in presets else presets[0]
        store = remember(preset_key, default)
        if ss.get(preset_key) not in presets:
            ss[preset_key] = default
        name = box.selectbox("Preset", presets, key=preset_key, on_change=store)
        try:
            config = load_preset(name)
        except SpecError as e:
            show_error(e, box)
            return None
    elif source == ENGINE:
        if engine is _NOT_GIVEN:
            from ui.model_picker import model_picker
            engine = model_picker()
        if engine is None:
            box.info("Load a model in the sidebar's model picker to size it here.")
            return None
        config = engine.config
    else:
        config = _config_json(box)
    if config is not None:
        box.caption(model_caption(config))
        st.caption(f"Sized on paper: **{config.name}** ({'the engine model' if source == ENGINE else source.lower()}"
                   "), picked in the sidebar under “Model to size”, on datasheet numbers. The engine's own model, "
                   "running on this computer, is a separate choice (“Model”).")
    return config


def attention_label(c: ModelConfig, short: bool = False) -> str:
    """The attention variant in words: 'GQA-8', 'MHA', 'MQA', 'MLA', with '+ sliding window' or the hybrid mix
    (unless `short`)."""
    from calculators import arch
    if c.kv_lora_rank:
        base = "MLA"
    elif c.num_kv_heads == c.num_heads:
        base = "MHA"
    elif c.num_kv_heads == 1:
        base = "MQA"
    else:
        base = f"GQA-{c.num_kv_heads}"
    if short:
        return base
    try:
        n = arch.kind_counts(c)
    except SpecError:
        return base
    full, swa, lin = n[arch.FULL], n[arch.SLIDING], n[arch.LINEAR]
    if lin:
        return f"{base} + linear attention ({lin} linear : {full} full layers)"
    if swa and not full:
        return f"{base} + sliding window {c.sliding_window:,}"
    if swa:
        return f"{base} + sliding window {c.sliding_window:,} ({swa} local : {full} global layers)"
    return base


def model_caption(c: ModelConfig) -> str:
    """One line naming the architecture numbers a reader checks first."""
    heads = f"{c.num_heads} query / {c.num_kv_heads} KV heads × {c.head_dim}"
    extra = [attention_label(c)]
    if c.num_experts:
        extra.append(f"MoE {c.num_experts_per_tok} of {c.num_experts} experts")
    return (f"**{c.name}**: {c.num_layers} layers, D = {c.hidden_size:,}, {heads}, F = {c.intermediate_size:,}, "
            f"V = {c.vocab_size:,}, context {c.max_position_embeddings:,} ({', '.join(extra)})")


def _config_json(box: Any) -> ModelConfig | None:
    ss = st.session_state
    store = remember(MODE_KEY, PASTE)
    if ss.get(MODE_KEY) not in CONFIG_MODES:
        ss[MODE_KEY] = PASTE
    mode = box.radio("config.json from", CONFIG_MODES, key=MODE_KEY, on_change=store, horizontal=True)
    try:
        if mode == UPLOAD:
            f = box.file_uploader("config.json", type=["json"], key=UPLOAD_KEY,
                                  help="The config.json of a decoder-only model (Llama, Mistral, Qwen, Gemma, "
                                       "DeepSeek, OPT/GPT-2 ...).")
            if f is not None:
                ss[UPLOADED_KEY] = (f.name, f.getvalue())
            kept = ss.get(UPLOADED_KEY)
            if kept is None:
                box.info("Upload a config.json to size that model.")
                return None
            if f is None:
                box.caption(f"Using {kept[0]}, uploaded earlier.")
            return parse_config_text(kept[1], kept[0])
        if mode == PASTE:
            store = remember(PASTE_KEY, "")
            text = box.text_area("config.json contents", key=PASTE_KEY, on_change=store, height=160,
                                 placeholder='{"model_type": "llama", "hidden_size": 2048, ...}',
                                 help="Paste the whole file; press Ctrl+Enter to apply.")
            if not text.strip():
                box.info("Paste a config.json to size that model.")
                return None
            return parse_config_text(text, "the pasted config.json")
        if mode == LOCAL:
            store = remember(PATH_KEY, "")
            path = box.text_input("Path to config.json (or its folder)", key=PATH_KEY, on_change=store,
                                  placeholder="~/models/TinyLlama-1.1B/config.json")
            if not path.strip():
                box.info("Type a path and press Enter.")
                return None
            name, text = read_config_path(path)
            return parse_config_text(text, name)
        return _hub_config(box)
    except SpecError as e:
        show_error(e, box)
        return None


def _hub_config(box: Any) -> ModelConfig | None:
    ss = st.session_state
    store = remember(REPO_KEY, "")
    repo = box.text_input("Hugging Face repo id", key=REPO_KEY, on_change=store,
                          placeholder="TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                          help="Fetches only config.json (a few KB) with huggingface_hub; press Enter.").strip()
    if not repo:
        box.info("Type a repo id (owner/name) and press Enter.")
        return None
    results = ss.setdefault(HUB_CACHE_KEY, {})
    if repo not in results:
        with box.spinner(f"Fetching {repo}/config.json …"):
            try:
                results[repo] = ("ok", fetch_hub_config(repo))
            except SpecError as e:
                results[repo] = ("error", str(e))
    status, payload = results[repo]
    if status == "error":
        show_error(payload, box)
        if box.button("Try again", key="size.hub_retry"):
            results.pop(repo, None)
            st.rerun()
        return None
    return parse_config_text(payload, f"{repo}/config.json")


# ============================================================================================ devices
def device_caption(d: Device) -> str:
    """Capacity, bandwidth, peak and price of a device, as printed on its datasheet (or measured)."""
    peaks = ", ".join(f"{p} {fmt_num(v / 1e12, 3)}" for p, v in d.peak_flops.items() if p in ("bf16", "fp16", "fp32",
                                                                                              "fp8", "int8"))
    price = f" · ${d.price_usd_per_hour:g}/h (assumed)" if d.price_usd_per_hour else ""
    return (f"**{d.name}**: {fmt_bytes(d.memory_bytes)} ({fmt_bytes(d.memory_bytes, binary=True)}) · "
            f"{fmt_num(d.memory_bandwidth_gb_s, 4)} GB/s · peak TFLOP/s {peaks}{price}")


def device_picker(where: Any = None, *, key: str = DEVICE_KEY, label: str = "Device", header: str | None = "Device",
                  default: str | None = None) -> Device | None:
    """Sidebar section: a datasheet device, this machine (measured), or a custom one. Returns it or None.
    `default`: left out, the device of this session's world (`ui.world`); the world switch moves `DEVICE_KEY`.
    "This machine" reuses the measurement this session pinned (a quick one if none exists yet), never a new one
    on a rerun."""
    box = where if where is not None else st.sidebar
    ss = st.session_state
    if header:
        box.header(header)
    options = [*list_devices(), THIS_MACHINE, CUSTOM]
    default = current_world().device if default is None else default
    default = default if default in options else options[0]
    store = remember(key, default)
    if ss.get(key) not in options:
        ss[key] = default
    choice = box.selectbox(label, options, key=key, on_change=store,
                           help="Datasheet numbers from specs/devices.json (dense peaks; prices are assumptions); "
                                "this machine as measured with NumPy; or your own numbers.")
    if choice == THIS_MACHINE:
        device = measured_machine(quick=True)
        machine_controls(box, key)
    elif choice == CUSTOM:
        device = _custom_device(box, key)
    else:
        device = load_device(choice)
    if device is not None:
        box.caption(device_caption(device))
        if device.source:
            box.caption(f"Source: {device.source}")
    return device


def _custom_device(box: Any, key: str) -> Device | None:
    """Your own device: every precision's peak, interconnect and price (`ui.multi_gpu.custom_device_form`)."""
    from ui.multi_gpu import custom_device_form
    return custom_device_form(box, key)


def device_multiselect(key: str, default: list[str], label: str = "Devices to compare",
                       where: Any = None) -> list[Device]:
    """Several datasheet devices (for comparison charts)."""
    box = where if where is not None else st
    names = list_devices()
    store = remember(key, [d for d in default if d in names])
    ss = st.session_state
    ss[key] = [d for d in ss.get(key, []) if d in names]
    chosen = box.multiselect(label, names, key=key, on_change=store)
    return [load_device(n) for n in chosen]


# ============================================================================================ small pickers
def choice_field(label: str, options: tuple[str, ...] | list[str], default: str, *, key: str, where: Any = None,
                 help: str | None = None, horizontal: bool = False) -> str:
    """A remembered selectbox (or horizontal radio) over fixed options, e.g. dtypes."""
    box = where if where is not None else st
    store = remember(key, default)
    if st.session_state.get(key) not in options:
        st.session_state[key] = default
    if horizontal:
        return box.radio(label, options, key=key, on_change=store, help=help, horizontal=True)
    return box.selectbox(label, options, key=key, on_change=store, help=help)


def units_note(where: Any = None) -> None:
    """The unit convention, on every page that shows memory."""
    (where if where is not None else st).caption(UNITS_NOTE)


def fmt_si(x: float, unit: str, digits: int = 3) -> str:
    """A number with an SI prefix for display: fmt_si(2.2e9, 'FLOP') -> '2.20 GFLOP' (decimal prefixes)."""
    for div, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{fmt_num(x / div, digits)} {prefix}{unit}"
    return f"{fmt_num(x, digits)} {unit}"


def table_height(rows: int, max_px: int = 740) -> int:
    """Pixel height that shows `rows` table rows without an inner scrollbar (up to `max_px`)."""
    return min(35 * (rows + 1) + 3, max_px)


def sizing_inputs(world: World | None = None, why: str = "") -> tuple[Any, Any] | None:
    """The sidebar pair every sizing page starts with: (model config, device), after the units note; or None
    (with a hint on the page) while either is missing or invalid. `world`, `why`: a page that works at one scale
    whatever the switch says (`model_source`); its device choice is then kept under keys of its own too."""
    config = model_source(world=world, why=why)
    own = world is not None and world != current_world()
    device = device_picker(key=f"{world.key}.{DEVICE_KEY}" if own else DEVICE_KEY,
                           default=world.device if world is not None else None)
    units_note()
    if config is None or device is None:
        st.info("Choose a model and a device in the sidebar.")
        return None
    return config, device


def sizing_with_gpus(world: World | None = None, why: str = "") -> "tuple[ModelConfig, Device, MultiGPU] | None":
    """`sizing_inputs` plus the multi-GPU sidebar (`ui.multi_gpu`): (model, device, layout), or None with the reason shown."""
    chosen = sizing_inputs(world, why)
    if chosen is None:
        return None
    config, device = chosen
    from ui.multi_gpu import multi_gpu_sidebar
    setup = multi_gpu_sidebar(config, device)
    return None if setup is None else (config, device, setup)
