"""The app as a small serving system: who is this session, the shared engine workers, the heavy-job queue.

Process-wide (shared by every browser session, `st.cache_resource`): one engine worker per loaded model (the
batch everybody's requests join) and one queue for heavy one-off jobs. Per session: the requests it submitted,
its prompts and results (in `st.session_state`), never visible to another session.

    from ui.server import generate
    stream = generate(model, ids, max_new_tokens=64, stop=stop_event, on_progress=show_progress)
    stream.on_wait = show_place                # told "busy: you are #k in line" while the request waits
    for tok in stream:
        ...                                    # engine.Generated, this session's own tokens only
"""
from __future__ import annotations

import threading
from typing import Callable, Iterator, Sequence

import streamlit as st

from engine import Generated, Model
from server.jobs import JobQueue
from server.worker import GenerationHandle, WorkerRegistry

HEAVY_JOBS_AT_ONCE = 1             # 2 cores: one heavy job at a time already uses both
HEAVY_JOBS_WAITING = 8


# ============================================================================================ sessions
def session_id() -> str:
    """This browser session's id (Streamlit's); "local" outside a Streamlit run (scripts, bare tests)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "local"


def session_alive(sid: str) -> bool:
    """Is the browser session `sid` still connected? True where Streamlit's runtime cannot tell (scripts, AppTest)."""
    from streamlit import runtime
    if sid == "local" or not runtime.exists():
        return True
    try:
        return runtime.get_instance().is_active_session(sid)
    except Exception:                              # a probe that fails says nothing: keep the request
        return True


# ============================================================================================ shared stores
@st.cache_resource(show_spinner=False)
def workers() -> WorkerRegistry:
    """One engine worker per loaded model, shared by every session (the class's server)."""
    return WorkerRegistry()


@st.cache_resource(show_spinner=False)
def heavy_jobs() -> JobQueue:
    """The bounded queue every heavy one-off job goes through (quantization, profiling, model loads)."""
    return JobQueue(max_running=HEAVY_JOBS_AT_ONCE, max_waiting=HEAVY_JOBS_WAITING)


def heavy_job(label: str, memory_bytes: float = 0.0, where=None):
    """`with heavy_job("quantization measurement", 0.5e9):` runs the body when its turn comes, showing
    "busy: you are #k in line" meanwhile; raises server.jobs.JobRefused (a ModelError) when it cannot start."""
    slot = (where if where is not None else st).empty()

    def on_wait(k: int) -> None:
        slot.info(f"busy: you are #{k} in line for {label} (heavy jobs run one at a time on this server)",
                  icon=":material/hourglass_top:")

    return _cleared(heavy_jobs().slot(label, memory_bytes, on_wait=on_wait), slot)


class _cleared:
    """Enter a context manager, and empty the waiting message once the job starts (or fails)."""

    def __init__(self, cm, slot) -> None:
        self.cm, self.slot = cm, slot

    def __enter__(self):
        try:
            return self.cm.__enter__()
        finally:
            self.slot.empty()

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


# ============================================================================================ generation
def submit(model: Model, ids: Sequence[int], *, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, seed: int | None = None) -> GenerationHandle:
    """This session's request into the model's shared worker. Raises server.worker.Busy or ModelError (with the
    reason) before any work."""
    sid = session_id()
    return workers().worker(model).submit(sid, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                          top_k=top_k, top_p=top_p, seed=seed, alive=lambda: session_alive(sid))


def generate(model: Model, ids: Sequence[int], max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | None = None, chunk_size: int | None = None,
             stop: threading.Event | None = None,
             on_progress: Callable[[int, int, str], None] | None = None) -> "ServedStream":
    """Like `Model.generate` (same options, `stop` and `on_progress`), but batched with every other session's
    requests by the model's engine worker. `chunk_size` is the worker's to choose (its prefill chunk bounds every
    step for everyone), so it is accepted and not used.

    Checks and admission happen here, before anything streams (server.worker.Busy / ModelError, with the reason).
    The returned stream yields this session's tokens (engine.Generated); `stream.stop()`, setting `stop`, or the
    script being stopped (the browser closing, a rerun) cancels the request and frees its KV blocks."""
    handle = submit(model, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    seed=seed)
    stream = ServedStream(handle, stop)
    stream.on_progress = on_progress
    return stream


class ServedStream:
    """One session's reply from the shared worker: iterate for tokens; `on_wait(message)` is told "busy: you are
    #k in line" while the request waits for a place in the batch."""

    def __init__(self, handle: GenerationHandle, stop: threading.Event | None = None) -> None:
        self.handle, self.stop_event = handle, stop
        self.on_wait: Callable[[str], None] | None = None
        self.on_progress: Callable[[int, int, str], None] | None = None

    def stop(self) -> None:
        self.handle.stop()

    def load_note(self) -> str:
        """The load this reply was measured under, in words."""
        n = self.handle.largest_batch
        return (f"measured for your request under the server's load at the time: up to {n} requests decoded in "
                f"the same batch" if n > 1 else "measured for your request; it was decoded alone (no other load)")

    def __iter__(self) -> Iterator[Generated]:
        handle, stop = self.handle, self.stop_event
        wait_cb = (lambda k: self.on_wait(handle.busy_message() or "")) if self.on_wait is not None else None
        try:
            if stop is not None:
                threading.Thread(target=_stop_when_set, args=(handle, stop), daemon=True).start()
            yield from handle.tokens(on_wait=wait_cb, on_progress=self.on_progress)
        finally:                              # stopped, rerun, browser gone: the blocks go back to the pool
            if not handle.done.is_set():
                handle.stop()


def _stop_when_set(handle: GenerationHandle, stop: threading.Event) -> None:
    while not handle.done.is_set():
        if stop.wait(0.1):
            handle.stop()
            return
