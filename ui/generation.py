"""The generation box: a prompt, sampling options, a Generate button, the reply streamed token by token, then its
timings (from the engine's per-token counters) and a table of the generated tokens.

Generation goes to the class's engine server over HTTP (`ui.server.generate`: the app's embedded
`python -m engine serve`, or the OpenAI-compatible server the teacher chose): this session's request is batched
with every other session's, its tokens stream back here, and TTFT/ITL are this session's own, measured at this
client under whatever load the server has.

    from ui.generation import generation_box
    generation_box(model)
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from engine import Generated, Model
from engine.model.generate import generation_summary
from specs.model_config import SpecError
from ui import server
from ui.metrics import metric_row
from ui.prefill_eta import prefill_eta_words
from ui.widgets import df_with_download, float_field, formula_expander, int_field, remember, show_error

PROMPT_KEY = "prompt"
DEFAULT_PROMPT = "Write a story"
RESULT_KEY = "last_generation"
STOP_EVENT_KEY = "_gen.stop_event"     # the running generation's threading.Event (set by the Stop button)
PREFILL_CHUNK = 256                    # prompt tokens per prefill pass of a page's own run (ui.inside): progress between chunks
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~$])")


@dataclass
class GenerationResult:
    """What one Generate click produced; kept in st.session_state so reruns still show it."""
    model_source: str
    model_name: str
    prompt_tokens: int
    prompt_text: str = ""             # the prompt as the model sees it (after the chat template)
    tokens: list[Generated] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    error: str | None = None
    stopped: bool = False             # the Stop button (or a rerun) ended it early
    load_note: str = ""               # the server load the timings were measured under

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)

    @property
    def finish_reason(self) -> str | None:
        if self.stopped:
            return "stopped"
        return self.tokens[-1].finish_reason if self.tokens else None


# ============================================================================================ prompt
def model_prompt(model: Model, prompt: str, use_chat: bool) -> str:
    """The prompt text the model will see: the user's text, or the chat template wrapped around it."""
    tok = model.tokenizer
    if tok is None or not use_chat:
        return prompt
    return tok.apply_chat_template([{"role": "user", "content": prompt}])


def prompt_ids(model: Model, prompt: str, use_chat: bool) -> list[int]:
    """Token ids of the prompt: through the chat template when asked; typed ids when the model has no tokenizer.
    Raises SpecError with a message for the user."""
    if not prompt.strip():
        raise SpecError("The prompt is empty: type something for the model to continue.")
    tok = model.tokenizer
    if tok is None:
        try:
            return [int(t) for t in re.split(r"[\s,]+", prompt.strip())]
        except ValueError:
            raise SpecError(f"{model.name} has no tokenizer: type the prompt as token ids (whole numbers "
                            f"between 0 and {model.config.vocab_size - 1} separated by spaces), e.g. 1 2 3") from None
    return model.encode_prompt(model_prompt(model, prompt, use_chat))


def escape_markdown(text: str) -> str:
    """Show generated text literally (a reply may contain `#`, `*` or `<`), keeping its line breaks."""
    return _MD_SPECIAL.sub(r"\\\1", text).replace("\n", "  \n")


# ============================================================================================ the box
def generation_box(model: Model | None) -> None:
    """Prompt + options + Generate; streams the reply into the page, then shows timings and the token table."""
    if model is None:
        st.info("Pick a model in the sidebar to generate text.")
        return
    tok, cfg = model.tokenizer, model.config
    store = remember(PROMPT_KEY, DEFAULT_PROMPT)
    prompt = st.text_area("Prompt", key=PROMPT_KEY, on_change=store, height=70,
                          help="Your text. With the chat template on, it becomes the user turn of a chat.")
    if tok is None:
        st.caption(f"{model.name} has no tokenizer: type token ids separated by spaces "
                   f"(0 to {cfg.vocab_size - 1}).")
    has_template = tok is not None and tok.has_chat_template
    # one row: the two options a lesson changes, the chat template, the rest of sampling behind a button, Generate
    cols = st.columns([1.1, 0.9, 1.1, 1.05, 0.9], vertical_alignment="bottom")
    max_new = int_field("Max new tokens", 64, 1, cfg.max_position_embeddings - 1, key="gen.max_new_tokens",
                        where=cols[0], help="Generation stops earlier at an end-of-sequence token.")
    temperature = float_field("Temperature", 0.0, 0.0, 100.0, key="gen.temperature", step=0.1, where=cols[1],
                              help="0 = greedy (always the most likely token).")
    use_chat = cols[2].checkbox("Chat template", value=has_template, disabled=not has_template,
                                key=f"chat_template.{model.source}",
                                help="Wrap the prompt in the model's chat template (as a chat app would)."
                                if has_template else "This model has no chat template: the prompt is continued as is.")
    more = cols[3].popover("More options", width="stretch", help="Top-k, top-p and the seed")
    top_k = int_field("Top-k", 0, 0, cfg.vocab_size, key="gen.top_k", where=more,
                      help="Keep only the k most likely tokens; 0 = off.")
    top_p = float_field("Top-p", 1.0, 0.01, 1.0, key="gen.top_p", step=0.05, where=more,
                        help="Keep the most likely tokens whose probabilities add up to p; 1 = off.")
    seed = int_field("Seed", 0, 0, 2**32 - 1, key="gen.seed", where=more,
                     help="Same seed, same options, same prompt: same reply (matters when temperature > 0).")
    options_ok = None not in (max_new, temperature, top_k, top_p, seed)
    clicked = cols[4].button("Generate", key="generate", type="primary", disabled=not options_ok,
                             icon=":material/play_arrow:", width="stretch")
    top = st.container()              # the last reply's metrics, above its text: on the first screen
    predicted = predicted_prefill(model, prompt, use_chat)
    eta = prefill_eta_words(*predicted) if predicted else ""
    if eta:
        st.info(eta, icon=":material/hourglass_top:")
    backend = server.class_backend().info
    if backend is not None:
        st.caption(f"Replies come from {backend.engine} at {backend.config.root} (model {backend.model}), the "
                   f"class's server; the inside-the-model pages still run this app's NumPy engine (they need its "
                   f"hooks).")
    if clicked:
        try:
            ids = prompt_ids(model, prompt, use_chat)
            model.check_prompt(ids)
            options = dict(max_new_tokens=max_new, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
            stop = threading.Event()
            stream = server.generate(model, ids, **options, stop=stop)    # the server chooses the prefill chunks
            # batched with everyone's requests by the engine server; refused here, before any work, when it cannot
        except SpecError as e:
            show_error(e)
            st.session_state.pop(RESULT_KEY, None)
            return
        result = GenerationResult(model_source=model.source, model_name=model.name, prompt_tokens=len(ids),
                                  prompt_text=model_prompt(model, prompt, use_chat))
        _stream_reply(model, ids, stream, result, stop, predicted[1] / 1e3 if eta else None)
    result = st.session_state.get(RESULT_KEY)
    if result is not None and result.model_source == model.source:
        if not clicked:                                   # one paragraph: the reply's first line stays on screen
            st.markdown(f"**Reply** ({result.model_name}): "
                        + (escape_markdown(result.text) or "*(the tokens generated decode to no visible text)*"))
        show_result(result, model, top)


LONG_PROMPT_CHARS = 4_000    # shorter prompts are read in well under a few seconds: not even tokenized here


def predicted_prefill(model: Model, prompt: str, use_chat: bool) -> tuple[int, float, float] | None:
    """For a prompt long enough to keep the class waiting: (its tokens, its predicted prefill ms on this machine as
    measured, that machine's FP32 FLOP/s) by `calculators.sizing.latency.prefill_ms` (float32, as the engine
    computes); None for a short prompt or one that cannot be read."""
    if len(prompt) < LONG_PROMPT_CHARS:
        return None
    from calculators.sizing.latency import prefill_ms
    from ui.machine import measured_machine
    try:
        n = len(prompt_ids(model, prompt, use_chat))
        device = measured_machine(quick=True)
        ms = prefill_ms(model.config, device, n, weight_dtype="fp32")["prefill_ms"]
    except (SpecError, ValueError, KeyError):
        return None
    return n, ms, device.peak_flops.get("fp32", float("nan"))


def request_stop() -> None:
    """The Stop button's callback: end the session's running generation after its current forward pass.

    Streamlit starts the rerun at once (fast reruns) while the old run may still be inside a forward pass: the
    event ends that run's loop, and the stored result is marked stopped now, so the rerun already says so."""
    stop = st.session_state.get(STOP_EVENT_KEY)
    if stop is not None:
        stop.set()
    result = st.session_state.get(RESULT_KEY)
    if result is not None:
        result.stopped = True


PROGRESS_STEPS = 16   # the decode bar moves in at most this many steps per reply: each move is a screen update
#                      sent to the browser, and a bar moved per token doubled what thirty streaming sessions send
#                      (bench/bench_classroom.py, 30 sessions: the app's share of the server 68-69% -> 72%)


def progress_due(done: int, total: int, steps: int = PROGRESS_STEPS) -> bool:
    """Should the bar move at token `done` of at most `total`? Every ⌈total / steps⌉-th token, and the last."""
    every = max(1, -(-total // steps))
    return done % every == 0 or done >= total


def progress_text(done: int, total: int, phase: str) -> tuple[float, str]:
    """(fraction, words) for the progress bar: prefill chunk by chunk, then decode token by token."""
    if phase == "prefill":
        return done / total, f"Prefill: {done:,} of {total:,} prompt tokens read"
    return done / total, f"Decode: {done:,} of at most {total:,} new tokens"


def _stream_reply(model: Model, ids: list[int], stream, result: GenerationResult,
                  stop: threading.Event, predicted_s: float | None = None) -> None:
    """Draw the reply as tokens arrive, with a Stop button and a progress bar: during a long prefill (`predicted_s`
    given) the seconds waited against the prediction, ticked every second (the server sends nothing until the first
    token), then per token.

    The result is stored in st.session_state as it grows, so a Stop click keeps the partial reply: the click sets
    the session's stop Event, and Streamlit also ends this run at its next screen update to start the rerun."""
    st.session_state[STOP_EVENT_KEY] = stop
    st.session_state[RESULT_KEY] = result
    stop_slot, bar_slot, slot = st.empty(), st.empty(), st.empty()
    head = f"**Reply** ({model.name}): "                 # the same paragraph the reruns draw (generation_box)
    stop_slot.button("Stop", key="gen.stop", on_click=request_stop, icon=":material/stop_circle:",
                     help="End the generation after the current forward pass; the reply so far is kept.")
    bar = bar_slot.progress(0.0, text=f"Prefill: reading {len(ids):,} prompt tokens")
    first = threading.Event()                                # set at the first token: the prefill is over
    if predicted_s is not None:
        _tick_prefill(bar, len(ids), predicted_s, first, stop)

    def on_progress(done: int, total: int, phase: str) -> None:
        first.set()
        if phase == "decode" and not progress_due(done, total):
            return                                           # the reply's own text shows each token
        frac, words = progress_text(done, total, phase)
        bar.progress(min(max(frac, 0.0), 1.0), text=words)

    stream.on_progress = on_progress
    stream.on_wait = lambda message: slot.info(message, icon=":material/hourglass_top:")
    try:
        for tok in stream:
            result.tokens.append(tok)
            slot.markdown(head + escape_markdown(result.text) + ("" if tok.finish_reason else " ▌"))
    except SpecError as e:                                   # e.g. a problem found mid-generation
        result.error = str(e)
        show_error(e)
    finally:                                                 # also when Streamlit ends this run for a Stop click
        first.set()
        last = result.tokens[-1].finish_reason if result.tokens else None
        result.stopped = (stop.is_set() or last in ("stopped", "cancelled", "session closed")
                          or (last is None and result.error is None))
        if model.tokenizer is not None and all(t.token_id >= 0 for t in result.tokens):
            result.pieces = model.tokenizer.token_strings([t.token_id for t in result.tokens])
        else:                                                # a server that sends text without token ids
            result.pieces = [t.text for t in result.tokens]
        st.session_state.pop(STOP_EVENT_KEY, None)
        result.load_note = stream.load_note()
    stop_slot.empty()
    bar_slot.empty()
    if not result.tokens:
        slot.empty()
    elif not result.text:
        slot.markdown(head + "*(the tokens generated decode to no visible text)*")


def _tick_prefill(bar, tokens: int, predicted_s: float, done: threading.Event, stop: threading.Event) -> None:
    """Move the bar once a second while a long prompt is read: the seconds waited against the prediction
    (`ui.prefill_eta.prefill_wait_words`), from a thread that carries this run's context (Streamlit sends an
    element's update only from a thread that has it); it ends at the first token, a Stop, or the run's end."""
    from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx
    from ui.prefill_eta import prefill_wait_words
    ctx = get_script_run_ctx()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(1.0) and not stop.is_set():
            waited = time.monotonic() - t0
            try:
                bar.progress(min(waited / predicted_s, 0.99), text=prefill_wait_words(waited, predicted_s, tokens))
            except Exception:                                # the run ended (rerun, Stop, page left): stop ticking
                return

    thread = threading.Thread(target=tick, name="prefill-progress", daemon=True)
    add_script_run_ctx(thread, ctx)
    thread.start()


def _ms(x: float) -> str:
    """A time for a metric whose label carries the unit ("TTFT (ms)"): a value that fits one line."""
    return "–" if not np.isfinite(x) else f"{x:,.1f}"


def show_result(result: GenerationResult, model: Model, metrics_at: Any = None) -> None:
    """Metrics (in `metrics_at`: above the reply on the home page), the formula behind them, and the token table
    (with CSV)."""
    if result.error and not result.tokens:
        return
    n = len(result.tokens)
    nums = generation_summary(result.tokens)
    reason = {"eos": "the model ended its reply", "length": "max new tokens reached",
              "context": "the context window is full",
              "stopped": "stopped with the Stop button", "cancelled": "stopped with the Stop button",
              "session closed": "stopped (the page was left)"}.get(result.finish_reason or "", "stopped")
    rate = nums["decode_tokens_per_s"]
    metric_row(where=metrics_at, items=[
        ("TTFT (ms)", _ms(nums["ttft_ms"]), "Time to first token: the prefill forward pass plus sampling the first token."),
        ("Mean ITL (ms)", _ms(nums["mean_itl_ms"]), "Mean inter-token latency: one decode step."),
        ("Tokens/s", "–" if not np.isfinite(rate) else f"{rate:,.1f}", "Decode speed: 1 / mean ITL."),
        ("KV cache (MiB)", f"{nums['kv_cache_bytes'] / 2**20:,.2f}",
         f"{nums['kv_cache_bytes']:,.0f} bytes of keys and values held after the last token."),
    ])
    st.caption(f"{n} tokens after a {result.prompt_tokens:,}-token prompt · {reason}"
               + (f" · timings {result.load_note}" if result.load_note else ""))
    if result.prompt_text:
        with st.expander(f"The prompt as the model sees it ({result.prompt_tokens:,} tokens)"):
            st.code(result.prompt_text, language=None, wrap_lines=True)
    cfg = model.config
    formula_expander(
        "Where these numbers come from",
        "Measured at this client for this request on the class's engine server (`ui.server`, over HTTP), which "
        "batches every session's requests; the clock runs while the whole batch computes, so the numbers include "
        "the load:\n\n"
        "- **TTFT** = from sending your request to its first token (waiting in line + prefill + the network).\n"
        "- **ITL** = time between two of your tokens: one decode step of the whole batch; the mean is over steps "
        "1…n−1.\n"
        "- **Tokens/s** = 1 / mean ITL.\n"
        "- **KV cache** = 2 (K and V) · L · tokens · h_kv · d_k · 4 bytes (float32) "
        f"= 2 · {cfg.num_layers} · tokens · {cfg.num_kv_heads} · {cfg.head_dim} · 4 "
        "(`engine.KVCache.bytes_used`).",
    )
    # The token table is drawn on demand: thirty sessions finishing at once each built it (an Arrow table and a CSV)
    # for a table most of them never open.
    if st.toggle(f"Show the {n} generated tokens (table and CSV)", key="gen.show_tokens"):
        pieces = result.pieces or [""] * n
        df = pd.DataFrame({
            "step": [t.step for t in result.tokens],
            "token id": [t.token_id for t in result.tokens],
            "piece": pieces,
            "latency (ms)": [round(t.seconds * 1e3, 3) for t in result.tokens],
        })
        df_with_download(df, "generated_tokens")
