"""The app as a small serving system: who is this session, the engine server it generates on, the heavy-job queue.

Generation never runs in the Streamlit process. Every session's Generate is an HTTP request to an engine server:
- by default the embedded one, `python -m engine serve` started here as a child process on 127.0.0.1 (one per
  model, shared by every session, stopped when the app stops), so thirty students' requests are decoded in one
  batch in a process of its own, away from the sessions' script threads;
- or any OpenAI-compatible server the teacher names (vLLM, SGLang, TGI, llama.cpp's server, ours elsewhere):
  environment `INFERENCE_LAB_BACKEND_URL` / `_MODEL` / `_API_KEY`, or the setting on the Class page.

    from ui.server import generate
    stream = generate(model, ids, max_new_tokens=64, stop=stop_event)
    for tok in stream:
        ...                                    # engine.Generated, this session's own tokens only
"""
from __future__ import annotations

import atexit
import hashlib
import hmac
import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import streamlit as st

from calculators.sizing.kv_cache import kv_bytes_per_token
from engine import Generated, Model
from server.backend import (MAX_SIMULATED, SIMULATED_SHARE, BackendBusy, BackendConfig, BackendError, BackendInfo,
                            ReplyStream, make_room_for_a_student, probe, read_live_batch, simulate_students)
from server.classroom import TeacherSessions
from server.jobs import JobQueue
from server.process import EngineServerProcess, ServerStartError
from server.registry import process_wide

HEAVY_JOBS_AT_ONCE = 1             # 2 cores: one heavy job at a time already uses both
HEAVY_JOBS_WAITING = 8
ROOM_WAIT_S = 1.0                  # how long a simulated student's freed place may take before another is asked
BUSY_RETRY_S = 3.0                 # a Generate refused for a full server (or its own request still being freed)
#                                   tries again this long, making room by hanging up simulated students first


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


# ============================================================================================ engine servers
class EmbeddedServers:
    """One `python -m engine serve` child process per model source, started on first use, stopped with the app."""

    def __init__(self) -> None:
        self._servers: dict[str, EngineServerProcess] = {}
        self._lock = threading.Lock()
        atexit.register(self.close)

    def server(self, source: str) -> EngineServerProcess:
        with self._lock:
            srv = self._servers.get(source)
            if srv is not None and srv.alive():
                return srv
            srv = EngineServerProcess(model=source, served_model_name="engine",
                                      extra_args=("--exit-with-parent",))
            try:
                srv.start()
            except ServerStartError as e:
                srv.stop()
                raise BackendError(f"the app's engine server for {source} could not start: {e}") from None
            self._servers[source] = srv
            return srv

    def running(self) -> list[tuple[str, EngineServerProcess]]:
        with self._lock:
            return [(k, s) for k, s in self._servers.items() if s.alive()]

    def drop(self, source: str) -> None:
        with self._lock:
            srv = self._servers.pop(source, None)
        if srv is not None:
            srv.stop()

    def close(self) -> None:
        for source in [k for k, _ in self.running()]:
            self.drop(source)


@process_wide
def embedded_servers() -> EmbeddedServers:
    """The app's engine servers: process-wide, out of any browser's reach (not an st.cache_resource, which a
    "clear cache" message from any browser empties for everyone: server.registry)."""
    return EmbeddedServers()


class ClassBackend:
    """The process-wide choice of where the class generates: None = the embedded engine server. Set from the
    environment at start, or by the teacher on the Class page (every session then generates there)."""

    def __init__(self) -> None:
        self.info: BackendInfo | None = None
        self.error: str | None = None
        cfg = BackendConfig.from_env()
        if cfg is not None:
            self.use(cfg)

    def use(self, cfg: BackendConfig | None) -> None:
        """Switch to `cfg` (None: back to the embedded engine); on failure keep the embedded engine and say why."""
        if cfg is None:
            self.info, self.error = None, None
            return
        try:
            self.info, self.error = probe(cfg), None
        except BackendError as e:
            self.info, self.error = None, f"{e}. The class keeps generating on the app's own engine."


@process_wide
def class_backend() -> ClassBackend:
    return ClassBackend()


@process_wide
def teachers() -> TeacherSessions:
    """Which sessions hold the teacher's controls (server.classroom; every session outside classroom mode)."""
    return TeacherSessions()


def use_backend(cfg: BackendConfig | None) -> None:
    """Point the whole class at `cfg` (None: the app's engine). Teacher only, checked here for the calling
    session (ModelError otherwise), whatever the page showed."""
    teachers().require(session_id(), "change where the class generates")
    class_backend().use(cfg)


def start_engine_server(source: str) -> EngineServerProcess:
    """Start the class's engine server before anyone generates (teacher only, checked here)."""
    teachers().require(session_id(), "start the engine server")
    return embedded_servers().server(source)


def simulated_cap(cfg: BackendConfig, engine: str) -> int:
    """Simulated requests allowed in flight on a server: SIMULATED_SHARE of our engine server's places (its
    batch plus its line, read from /v1/batch); MAX_SIMULATED on a server whose capacity cannot be read."""
    if engine == "ours":
        try:
            snap = read_live_batch(cfg)
            return max(1, int(SIMULATED_SHARE * (snap.max_batch + snap.max_waiting)))
        except BackendError:
            pass
    return MAX_SIMULATED


def add_simulated_students(cfg: BackendConfig, model: str, n: int, engine: str = "ours",
                           max_tokens: int = 64) -> int:
    """Add `n` simulated students on the class's server. Teacher only (ModelError for any other session, checked
    here, on the server); capped by `simulated_cap`; BackendBusy with a retry time when the cap is reached."""
    teachers().require(session_id(), "add simulated students")
    return simulate_students(cfg, model, n, max_tokens=max_tokens, cap=simulated_cap(cfg, engine))


@dataclass(frozen=True)
class Target:
    """Where one request goes: the server's address and model name, and whether it is our engine serving the
    very model this app has loaded (then prompts go as token ids and the tokens come back with their ids)."""
    config: BackendConfig
    model: str
    engine: str
    embedded: bool


def target_for(model: Model) -> Target:
    external = class_backend().info
    if external is not None:
        return Target(external.config, external.model, external.engine, embedded=False)
    srv = embedded_servers().server(model.source or model.name)
    return Target(BackendConfig(srv.url), "engine", "ours", embedded=True)


def active_requests() -> int:
    """Requests the embedded engine servers are serving now (from their metrics; 0 where one does not answer)."""
    from server.backend import read_state
    total = 0
    for _, srv in embedded_servers().running():
        try:
            st_ = read_state(BackendConfig(srv.url), "ours")
            total += int((st_.running or 0) + (st_.waiting or 0))
        except BackendError:
            continue
    return total


@process_wide
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
def generate(model: Model, ids: Sequence[int], max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | None = None, chunk_size: int | None = None,
             stop: threading.Event | None = None,
             on_progress: Callable[[int, int, str], None] | None = None) -> "ServedStream":
    """Like `Model.generate` (same options, `stop`), but on the class's engine server over HTTP, batched with every
    other session's requests. `chunk_size` is the server's to choose, so it is accepted and not used.

    Raises BackendError (a ModelError, with the reason) when the server refuses or cannot be reached. The stream
    yields this session's tokens (engine.Generated); `stream.stop()`, setting `stop`, or the script being stopped
    hangs up, and the server cancels the request and frees its KV blocks."""
    target = target_for(model)
    prompt = list(ids) if target.embedded or model.tokenizer is None else model.tokenizer.decode(ids)
    sid = session_id()
    session_streams().hang_up(sid)                     # one request per session: a new Generate ends the old
    deadline = time.monotonic() + BUSY_RETRY_S
    room_asked_at = -math.inf
    while True:
        try:
            reply = ReplyStream(target.config, target.model, prompt=prompt, max_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                user=session_key(sid), stop=stop)
            break
        except BackendBusy:
            # a simulated student gives way (one per ROOM_WAIT_S: its place takes a moment to be freed); or this
            # session's previous request is still being freed
            if time.monotonic() - room_asked_at >= ROOM_WAIT_S and make_room_for_a_student(target.config):
                room_asked_at = time.monotonic()
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                raise
            time.sleep(0.1)
    stream = ServedStream(reply, model, len(ids), max_new_tokens, target)
    stream.on_progress = on_progress
    session_streams().hold(sid, stream)
    return stream


_SECRET = secrets.token_bytes(32)


def session_key(sid: str) -> str:
    """The `user` this session's requests carry: derived from its Streamlit session id with a secret of this
    process, so no browser can name (or guess) another session's key and have its requests refused."""
    return "s-" + hmac.new(_SECRET, sid.encode(), hashlib.sha256).hexdigest()[:24]


class SessionStreams:
    """Each session's reply in flight (at most one): the app keys fairness on its own sessions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, "ServedStream"] = {}

    def hold(self, sid: str, stream: "ServedStream") -> None:
        with self._lock:
            old, self._streams[sid] = self._streams.get(sid), stream
        if old is not None and old is not stream:
            old.stop()

    def hang_up(self, sid: str) -> None:
        with self._lock:
            old = self._streams.pop(sid, None)
        if old is not None:
            old.stop()

    def release(self, sid: str, stream: "ServedStream") -> None:
        with self._lock:
            if self._streams.get(sid) is stream:
                del self._streams[sid]

    def count(self) -> int:
        with self._lock:
            return len(self._streams)


@process_wide
def session_streams() -> SessionStreams:
    return SessionStreams()


FINISH = {"stop": "eos", "length": "length"}


class ServedStream:
    """One session's reply from the engine server, as `engine.Generated` tokens: seconds are measured here, at the
    client (time to first token, then between tokens), under whatever load the server has."""

    def __init__(self, reply: ReplyStream, model: Model, prompt_len: int, max_new_tokens: int,
                 target: Target) -> None:
        self.reply, self.prompt_len, self.max_new_tokens, self.target = reply, prompt_len, max_new_tokens, target
        self.kv_per_token = int(kv_bytes_per_token(model.config, "fp32"))
        self.on_wait: Callable[[str], None] | None = None
        self.on_progress: Callable[[int, int, str], None] | None = None
        self.sid = session_id()

    def stop(self) -> None:
        self.reply.close()

    def load_note(self) -> str:
        where = "the app's engine server" if self.target.embedded else \
            f"{self.target.engine} at {self.target.config.root}"
        return f"measured at this client for your request on {where}, under its load at the time"

    def __iter__(self) -> Iterator[Generated]:
        if self.on_wait is not None:
            self.on_wait("waiting for the first token (prefill; other requests may be ahead in the batch)")
        last, step = self.reply.started, 0
        try:
            for piece in self.reply:
                if piece.token_id is None and not piece.text and piece.finish_reason:
                    break
                finish = FINISH.get(piece.finish_reason or "", piece.finish_reason) if piece.finish_reason else None
                text = "" if finish == "eos" and self.target.embedded and not piece.text else piece.text
                if self.on_progress is not None:
                    self.on_progress(step + 1, self.max_new_tokens, "decode")
                yield Generated(token_id=-1 if piece.token_id is None else piece.token_id, text=text, step=step,
                                seconds=piece.arrived - last,
                                kv_cache_bytes=(self.prompt_len + step) * self.kv_per_token, finish_reason=finish)
                last, step = piece.arrived, step + 1
        finally:                              # stopped, rerun, browser gone: hang up, the server frees the blocks
            self.reply.close()
            session_streams().release(self.sid, self)
