"""The Class page's teacher tools: where the class generates (the app's engine or any OpenAI-compatible server),
how students join (the address and its QR code), simulated students, and another server's live state."""
from __future__ import annotations

import numpy as np
import streamlit as st

from engine.errors import ModelError
from server.backend import (ENV_API_KEY, ENV_MODEL, ENV_URL, MAX_SIMULATED, BackendConfig, BackendError, ServerState,
                            read_state)
from server.classroom import ENV_TEACHER_KEY, current_policy

URL_KEY, MODEL_KEY, KEY_KEY = "class.backend.url", "class.backend.model", "class.backend.key"
JOIN_KEY = "class.join.url"
SIM_KEY = "class.sim.n"
TEACHER_KEY_FIELD = "class.teacher.key"


def is_teacher() -> bool:
    from ui.server import session_id, teachers
    return teachers().is_teacher(session_id())


def teacher_box() -> None:
    """Sidebar, classroom mode only: the teacher types the key (INFERENCE_LAB_TEACHER_KEY) to unlock the
    teacher's controls for this browser session. The server checks the session on every teacher action."""
    from ui.server import session_id, teachers
    if not current_policy().enabled:
        return
    st.header("Teacher")
    if is_teacher():
        st.caption("This browser holds the teacher's controls.")
        if st.button("Lock the teacher's controls", key="class.teacher.lock"):
            teachers().lock(session_id())
            st.rerun()
        return
    if current_policy().teacher_key is None:
        st.caption(f"Classroom mode: the teacher's controls are off (start the app with {ENV_TEACHER_KEY} set to "
                   "use them from a browser).")
        return
    key = st.text_input("Teacher key", type="password", key=TEACHER_KEY_FIELD)
    if st.button("Unlock the teacher's controls", key="class.teacher.unlock", disabled=not key):
        try:
            teachers().unlock(session_id(), key)
            st.rerun()
        except ModelError as e:
            st.error(str(e), icon=":material/error:")


def backend_settings(backend) -> None:
    """Sidebar: the server the whole class generates on (process-wide: every session follows the teacher)."""
    st.header("Where the class generates")
    info = backend.info
    st.caption(f"Now: {'the app’s own engine server (NumPy, this machine)' if info is None else f'{info.engine} at {info.config.root}, model {info.model}'}. "
               f"Environment: {ENV_URL}, {ENV_MODEL}, {ENV_API_KEY}.")
    if not is_teacher():        # the setting is everyone's: in a class, only the teacher may change it
        st.caption("Classroom mode: set by the teacher (the environment variables above, or the teacher's "
                   "controls once unlocked with the teacher key); it cannot be changed from a browser without it.")
        return
    url = st.text_input("OpenAI-compatible server URL", key=URL_KEY, placeholder="http://gpu-box:8000",
                        help="vLLM, SGLang, TGI, llama.cpp's server, or `python -m engine serve` elsewhere. "
                             "Empty = the app's own engine.")
    model = st.text_input("Model name (empty: the first the server lists)", key=MODEL_KEY)
    key = st.text_input("API key (optional)", key=KEY_KEY, type="password")
    c = st.columns(2)
    from ui.server import use_backend
    try:
        if c[0].button("Use this server", key="class.backend.use", disabled=not url.strip()):
            use_backend(BackendConfig(url.strip(), model.strip() or None, key.strip() or None))
        if c[1].button("Use the app's engine", key="class.backend.reset", disabled=info is None):
            use_backend(None)
    except ModelError as e:
        st.error(str(e), icon=":material/error:")
    if backend.error:
        st.error(backend.error, icon=":material/error:")
    st.caption("The inside-the-model pages always run this app's NumPy engine: they need its hooks.")


def join_box() -> None:
    """The address students type, and a QR code of it."""
    import segno
    guess = _app_url()
    with st.expander("How students join", expanded=False):
        url = st.text_input("Address students open", value=guess, key=JOIN_KEY,
                            help="This page's own address; on a class network write this machine's address as the "
                                 "students see it (e.g. http://192.168.1.20:8501), and start the app with "
                                 "--server.address 0.0.0.0.")
        if url.strip():
            st.markdown(f"Open **{url.strip()}** and press Generate on the home page.")
            st.image(segno.make(url.strip(), error="m").svg_data_uri(scale=8), width=260)


def _app_url() -> str:
    try:
        return str(st.context.url or "").split("?")[0].rsplit("/", 1)[0] or "http://localhost:8501"
    except Exception:
        return "http://localhost:8501"


def simulated_students(cfg: BackendConfig, model: str, engine: str = "ours") -> None:
    """Add N simulated students' requests to the class's server, to show batching before the class arrives
    (the teacher's only; `ui.server.add_simulated_students` checks the session again on the server)."""
    from ui.server import add_simulated_students
    if not is_teacher():
        return
    c = st.columns([1, 2])
    n = c[0].number_input("Simulated students", 1, MAX_SIMULATED, 8, key=SIM_KEY)
    if c[1].button(f"Add {int(n)} simulated students", key="class.sim.add", icon=":material/group_add:",
                   help="Each sends one streaming request (64 tokens) to the class's server, as a student pressing "
                        "Generate would."):
        try:
            started = add_simulated_students(cfg, model, int(n), engine)
            st.toast(f"{started} simulated students sent their requests")
        except ModelError as e:
            st.error(str(e), icon=":material/error:")


def _fmt(x: float | None, unit: str = "", scale: float = 1.0, digits: str = ",.1f") -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x * scale:{digits}}{unit}"


def other_server_view(info) -> None:
    """Live state of a server that is not ours, from its Prometheus metrics (vLLM's names; others named)."""
    try:
        state: ServerState = read_state(info.config, "unknown" if info.engine == "unknown" else info.engine)
    except BackendError as e:
        st.warning(f"{e}. Generation still goes to {info.config.root}.")
        return
    st.markdown(f"**{state.engine}** at {info.config.root}, serving `{info.model}`.")
    m = st.columns(5)
    m[0].metric("Requests running", _fmt(state.running, digits=",.0f"))
    m[1].metric("Waiting", _fmt(state.waiting, digits=",.0f"))
    m[2].metric("KV cache in use", _fmt(state.kv_usage, " %", 100.0))
    m[3].metric("Mean TTFT", _fmt(state.mean_ttft_s, " ms", 1e3), help="since the server started")
    m[4].metric("Mean ITL", _fmt(state.mean_itl_s, " ms", 1e3), help="since the server started")
    if state.prefix_queries:
        st.caption(f"Prefix cache: {_fmt(state.prefix_hits, digits=',.0f')} of "
                   f"{_fmt(state.prefix_queries, digits=',.0f')} prompt tokens served from cache.")
    if state.running is None:
        st.caption(f"This server's metrics do not use vLLM's names; found {len(state.names)} metric families "
                   f"(e.g. {', '.join(state.names[:4])}).")
    st.caption("Block tables and step times are shown for the app's own engine only (its /v1/batch endpoint); "
               "other servers publish counters and gauges.")
