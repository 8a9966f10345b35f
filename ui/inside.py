"""What the "Inside the model" pages share: the teacher's prompt (the same box as the home page, so the prompt typed
there is the one every page and the Walkthrough explain), its token ids, and results computed once per session
and per input (kept in st.session_state, never in a process-wide cache: one class never sees another's run).

    from ui.inside import teacher_prompt, session_cached
    prompt = teacher_prompt(model)          # Prompt(text, ids, pieces, use_chat) or None (the reason is on screen)
    logits = session_cached("logits", (model.source, tuple(prompt.ids)), lambda: model.logits(prompt.ids))
"""
from __future__ import annotations

import html
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import streamlit as st

from engine import Model
from specs.model_config import SpecError
from ui.generation import DEFAULT_PROMPT, PROMPT_KEY, model_prompt, prompt_ids
from ui.widgets import float_field, int_field, parse_number, remember, set_remembered, show_error

CHAT_KEY = "inside.chat"                  # checkbox: wrap the prompt in the chat template
RESULTS_KEY = "_inside.results"           # OrderedDict[(name, key)] -> value, this session only
MAX_RESULTS = 32                          # a session keeps at most this many computed results (bounded memory)


@dataclass(frozen=True)
class Prompt:
    text: str                 # what the teacher typed
    model_text: str           # what the model reads (after the chat template)
    ids: tuple[int, ...]
    use_chat: bool

    def last_word_position(self, model: Model) -> int:
        """The position of the last token the user typed (not the chat template's closing markers)."""
        from engine.instruments.readout import subsequence_end
        if model.tokenizer is None or not self.use_chat:
            return len(self.ids) - 1
        end = subsequence_end(self.ids, model.tokenizer.encode(self.text.strip(), add_bos=False))
        return len(self.ids) - 1 if end is None else end


def teacher_prompt(model: Model | None, *, where: Any = None, height: int = 90) -> Prompt | None:
    """The prompt box shared by the home page and every "Inside the model" page. Returns the prompt with its ids,
    or None after a clear message (no model, empty prompt, not token ids, longer than the context window)."""
    box = where if where is not None else st
    if model is None:
        box.info("Pick a model in the sidebar to look inside it.")
        return None
    tok = model.tokenizer
    if model.random_weights:
        box.warning(f"{model.name}: random weights. Shapes, sizes and timings are real; the words, attention "
                    "patterns and probabilities are not.", icon=":material/casino:")
    store = remember(PROMPT_KEY, DEFAULT_PROMPT)
    text = box.text_area("Prompt", key=PROMPT_KEY, on_change=store, height=height,
                         help="The same prompt as on the home page: change it here or there.")
    has_template = tok is not None and tok.has_chat_template
    store_chat = remember(CHAT_KEY, True)
    use_chat = box.checkbox("Chat template", key=CHAT_KEY, on_change=store_chat, disabled=not has_template,
                            help="Wrap the prompt in the model's chat template, as a chat app does."
                            if has_template else "This model has no chat template: its text is read as typed.")
    use_chat = bool(use_chat and has_template)
    if tok is None:
        box.caption(f"{model.name} has no tokenizer: type the prompt as token ids separated by spaces "
                    f"(0 to {model.config.vocab_size - 1}).")
    try:
        ids = prompt_ids(model, text, use_chat)
        model.check_prompt(ids)
        if min(ids) < 0 or max(ids) >= model.config.vocab_size:
            raise SpecError(f"token ids must be between 0 and {model.config.vocab_size - 1}")
    except SpecError as e:
        show_error(e, where)
        return None
    return Prompt(text=text, model_text=model_prompt(model, text, use_chat), ids=tuple(ids), use_chat=use_chat)


def session_cached(name: str, key: Any, compute: Callable[[], Any]) -> Any:
    """`compute()` once per session for (name, key); later reruns reuse it. At most MAX_RESULTS results are kept
    per session (the oldest dropped first), so a long lesson does not grow memory without bound."""
    ss = st.session_state
    store: OrderedDict = ss.setdefault(RESULTS_KEY, OrderedDict())
    k = (name, key)
    if k in store:
        store.move_to_end(k)
        return store[k]
    value = compute()
    store[k] = value
    while len(store) > MAX_RESULTS:
        store.popitem(last=False)
    return value


def index_field(label: str, count: int, *, key: str, default: int = 0, where: Any = None,
                help: str | None = None) -> int | None:
    """A layer/head/position number in [0, count - 1]; out of range or not a whole number -> st.error, None."""
    return int_field(label, min(default, count - 1), 0, count - 1, key=key, where=where, help=help)


_PALETTE = ["#fde68a", "#bfdbfe", "#bbf7d0", "#fecaca", "#ddd6fe", "#fed7aa", "#a5f3fc", "#f5d0fe"]


def pieces_html(rows: list[dict]) -> str:
    """The prompt as coloured chips: the piece on top, its id under it; special tokens dark."""
    chips = []
    for r in rows:
        dark = r["special"]
        bg = "#334155" if dark else _PALETTE[r["position"] % len(_PALETTE)]
        fg = "#f8fafc" if dark else "#111827"
        chips.append(
            f'<span style="display:inline-block;margin:2px;padding:2px 6px;border-radius:6px;background:{bg};'
            f'color:{fg};font-family:monospace;font-size:1.05em;text-align:center;line-height:1.25">'
            f'{html.escape(r["piece"]) or "&nbsp;"}<br><span style="font-size:0.72em;opacity:0.8">'
            f'{r["token_id"]}</span></span>')
    return '<div style="line-height:2.6">' + "".join(chips) + "</div>"


def piece_label(i: int, piece: str) -> str:
    """Axis label of a token: its position and its piece ("3 ▁story"); made unique by the position."""
    return f"{i} {piece}"


# ============================================================================================ one forward pass
@dataclass(frozen=True)
class Readout:
    """What the Embeddings page reads from one forward pass over the prompt (last position only: small)."""
    last_logits: np.ndarray          # [V]   logits of the next token after the prompt
    last_resid: np.ndarray           # [L, D] residual stream after each layer at the last position


def prompt_readout(model: Model, prompt: Prompt) -> Readout:
    """A forward pass over the prompt keeping only the last position (logits and each layer's residual stream):
    a few MB whatever the prompt's length, in chunks with a progress bar. Once per session and prompt."""
    def compute() -> Readout:
        from engine import Hooks
        from ui.generation import PREFILL_CHUNK, progress_text
        last: dict[str, np.ndarray] = {}
        ids = np.asarray(prompt.ids, np.int64)
        cache = model.new_cache(1, ids.size)
        slot = st.empty()
        for s in range(0, ids.size, PREFILL_CHUNK):                  # the last chunk's last row is the prompt's
            hooks = Hooks().add("blocks.*.hook_resid_post",
                                lambda name, x: last.__setitem__(name, np.array(x[0, -1])))
            logits = model.forward(ids[None, s:s + PREFILL_CHUNK], cache, hooks=hooks)[0]      # [V]
            if ids.size > PREFILL_CHUNK:
                frac, words = progress_text(min(s + PREFILL_CHUNK, ids.size), ids.size, "prefill")
                slot.progress(frac, text=words)
        slot.empty()
        resid = np.stack([last[f"blocks.{li}.hook_resid_post"] for li in range(model.config.num_layers)])
        return Readout(last_logits=np.array(logits), last_resid=resid)
    return session_cached("readout", (model.source, prompt.ids), compute)


def layer_attention(model: Model, prompt: Prompt, layer: int, max_tokens: int) -> dict[str, np.ndarray]:
    """Layer `layer`'s attention over the first `max_tokens` prompt tokens (pattern, scores, q, k), once per
    session, prompt and layer. Longer prompts are cut for display: a heatmap of more rows cannot be read."""
    ids = list(prompt.ids)[:max_tokens]

    def compute() -> dict[str, np.ndarray]:
        from engine import run_with_cache
        names = tuple(f"blocks.{layer}.attn.{n}" for n in ("hook_pattern", "hook_scores", "hook_q", "hook_k"))
        _, acts = run_with_cache(model, ids, names=names, layers=[layer])
        return {n.rsplit(".", 1)[1]: np.array(acts[n]) for n in names}
    return session_cached("attention", (model.source, tuple(ids), layer), compute)


def all_attention(model: Model, prompt: Prompt, max_tokens: int) -> np.ndarray:
    """Every layer's attention weights over the first `max_tokens` prompt tokens from one engine run
    (`blocks.*.attn.hook_pattern`), once per session and prompt.   -> [L, h, T, T] float32 (SmolLM2-135M, 96
    tokens: 10 MB)"""
    ids = list(prompt.ids)[:max_tokens]

    def compute() -> np.ndarray:
        from engine import run_with_cache
        names = tuple(f"blocks.{li}.attn.hook_pattern" for li in range(model.config.num_layers))
        _, acts = run_with_cache(model, ids, names=names)
        return np.stack([np.asarray(acts[n], np.float32) for n in names])
    return session_cached("all_attention", (model.source, tuple(ids)), compute)


def band_attention(model: Model, prompt: Prompt, layer: int, head: int, length: int) -> np.ndarray:
    """One head's attention over the prompt repeated to `length` tokens (past a sliding window), once per
    session.   -> [length, length]"""
    ids = (list(prompt.ids) * (length // max(1, len(prompt.ids)) + 1))[:length]

    def compute() -> np.ndarray:
        from engine import run_with_cache
        name = f"blocks.{layer}.attn.hook_pattern"
        _, acts = run_with_cache(model, ids, names=(name,), layers=[layer], heads=[head])
        return np.array(acts[name][0])
    return session_cached("band", (model.source, tuple(ids), layer, head), compute)


def kv_bytes_after(model: Model, prompt: Prompt, tokens: int) -> int:
    """The engine's own count of the KV cache's filled bytes after a forward pass over `tokens` tokens (the prompt
    repeated to that length), once per session."""
    ids = np.asarray((list(prompt.ids) * (tokens // max(1, len(prompt.ids)) + 1))[:tokens], np.int64)

    def compute() -> int:
        cache = model.new_cache(1, ids.size)
        model.forward(ids[None, :], cache)
        return int(cache.bytes_used())
    return session_cached("kv_bytes_after", (model.source, tuple(ids.tolist())), compute)


def pooled(z: np.ndarray, cells: int) -> np.ndarray:
    """Max over blocks of a square map, so a long map fits `cells` × `cells` and no non-zero weight disappears."""
    step = max(1, -(-z.shape[0] // cells))
    n = -(-z.shape[0] // step) * step
    padded = np.zeros((n, n), z.dtype)
    padded[:z.shape[0], :z.shape[1]] = z
    return padded.reshape(n // step, step, n // step, step).max(axis=(1, 3))


# ============================================================================================ the teacher's run
RUN_MAX_NEW_KEY = "inside.max_new_tokens"
RUN_TEMPERATURE_KEY = "inside.temperature"
DETAIL_TOKENS = 512              # prompts up to this long record attention rows and new K/V rows in every layer


def run_settings(model: Model, where: Any = None) -> tuple[int, float] | None:
    """Max new tokens and temperature of the teacher's run (the same on every page)."""
    box = where if where is not None else st
    cols = box.columns(2)
    max_new = int_field("New tokens to generate", 16, 1, min(512, model.config.max_position_embeddings - 1),
                        key=RUN_MAX_NEW_KEY, where=cols[0], help="The run stops earlier at an end-of-sequence token.")
    temperature = float_field("Temperature", 0.0, 0.0, 100.0, key=RUN_TEMPERATURE_KEY, where=cols[1],
                              help="0 = greedy (always the most likely token).")
    if max_new is None or temperature is None:
        return None
    return max_new, temperature


def teacher_run(model: Model, prompt: Prompt, max_new: int, temperature: float):
    """The prompt generated with a record of every step (token, probability, top-5, KV bytes per layer, time,
    attention rows of every layer and head, new K/V rows), once per session and input; a progress bar (prefill
    chunk by chunk, then token by token) while it runs."""
    def compute():
        from engine import record_generation
        from ui.generation import PREFILL_CHUNK, progress_text
        detail = len(prompt.ids) <= DETAIL_TOKENS
        layers = tuple(range(model.config.num_layers)) if detail else ()
        slot = st.empty()
        bar = slot.progress(0.0, text=f"Prefill: 0 of {len(prompt.ids):,} prompt tokens read")

        def on_progress(done: int, total: int, phase: str) -> None:
            frac, words = progress_text(done, total, phase)
            bar.progress(min(max(frac, 0.0), 1.0), text=words)

        rec = record_generation(model, list(prompt.ids), max_new_tokens=max_new, temperature=temperature, seed=0,
                                alternatives=5, attention_layers=layers, kv_layers=layers,
                                chunk_size=PREFILL_CHUNK, on_progress=on_progress)
        slot.empty()
        return rec
    return session_cached("run", (model.source, prompt.ids, max_new, temperature), compute)


def step_texts(model: Model, rec) -> list[str]:
    """The generated tokens as readable pieces (ids when the model has no tokenizer)."""
    ids = [s.token_id for s in rec.steps]
    return model.tokenizer.token_strings(ids) if model.tokenizer is not None else [f"#{i}" for i in ids]


def stepper(label: str, count: int, *, key: str, default: int = 0, first: int = 0, where: Any = None,
            widths: tuple[float, float, float] = (1, 1, 4)) -> int | None:
    """An index in [0, count − 1], typed as a number from `first` (1 for "Step 1 of 8") with Back / Next buttons
    beside it (`widths`: of Back, Next and the number's column). Stepping past either end says so and keeps the
    step the user was on."""
    box = where if where is not None else st
    note_key = key + ".note"
    last = first + count - 1

    def move(delta: int) -> None:
        v, problem = parse_number(label, st.session_state.get(key), integer=True)
        if problem or not first <= v <= last:
            return                                           # the box shows its own message
        if not first <= v + delta <= last:
            end = "last" if delta > 0 else "first"
            st.session_state[note_key] = (f"{label} {v} is the {end} one ({first} to {last}); "
                                          f"there is no {'next' if delta > 0 else 'earlier'} {label.lower()}.")
            return
        set_remembered(key, str(v + delta))

    cols = box.columns(list(widths))
    cols[0].button("Back", key=key + ".back", on_click=move, args=(-1,), icon=":material/arrow_back:",
                   width="stretch")
    cols[1].button("Next", key=key + ".next", on_click=move, args=(1,), icon=":material/arrow_forward:",
                   width="stretch", type="primary")
    note = st.session_state.pop(note_key, None)
    if note:
        box.warning(note, icon=":material/block:")
    v = int_field(label, first + min(default, count - 1), first, last, key=key, where=cols[2],
                  help=f"{first} to {last}")
    return None if v is None else v - first


def deeper_link(page_path: str, label: str) -> None:
    """A link to the page that goes deeper; as plain text when the page runs outside the app's navigation
    (a page file run on its own, as tests do, has no other pages to link to)."""
    from streamlit.errors import StreamlitAPIException
    try:
        st.page_link(page_path, label=label, icon=":material/arrow_forward:")
    except StreamlitAPIException:
        st.caption(f"→ {label}")
