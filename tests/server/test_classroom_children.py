"""The app's engine-server children never outlive the app (issue 29: "each clear + Generate starts a new
engine-server child while the old one runs on, unreachable"; a killed app must not leave them either).

A parent process starts its child exactly as the app does (`ui.server.EmbeddedServers().server(source)`), prints
the child's pid, and is then killed with SIGKILL (no atexit, no signal handler runs): the child must be gone within
a deadline, both once it serves and while it is still starting."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers_checkpoints import tiny_config, write_hf_checkpoint

ROOT = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 15.0            # the watch polls each second, then a graceful stop of at most TIED_GRACE_S


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


PARENT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    if {ready}:
        from ui.server import EmbeddedServers
        srv = EmbeddedServers().server({model!r})          # the app's very call: started, serving
    else:
        from server.process import EngineServerProcess
        srv = EngineServerProcess(model={model!r}).start(wait=False)   # killed while the child still starts
    print(srv.proc.pid, flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    write_hf_checkpoint(folder, tiny_config(), seed=1)
    return str(folder)


@pytest.mark.parametrize("ready", [True, False], ids=["serving", "starting"])
def test_killing_the_app_process_ends_its_engine_child(tiny_folder, ready):
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(root=str(ROOT), model=tiny_folder, ready=ready)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        line = parent.stdout.readline()                    # the parent prints once its child exists
        assert line.strip().isdigit(), f"the parent printed {line!r}"
        child = int(line)
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)                 # nothing of the parent's runs any more
        parent.wait(10)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), f"the engine child {child} outlived its killed parent by {GONE_WITHIN_S:g} s"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)                 # the test fails above; leave nothing behind


def test_stopping_a_child_closes_its_lifeline(tiny_folder):
    """stop() ends the child and closes the pipe's write end (no descriptor leaks per start/stop)."""
    from server.process import EngineServerProcess
    srv = EngineServerProcess(model=tiny_folder).start(wait=False)
    fd = srv._lifeline
    assert fd is not None and os.fstat(fd)
    srv.stop()
    assert srv.proc.poll() is not None and srv._lifeline is None


def test_a_picked_port_another_process_took_is_picked_again_and_its_answers_are_not_taken(tiny_folder, monkeypatch):
    """Between picking a free port and the child binding it, another process may take the port (a parallel test
    worker's server did, once). Its /health answers 200, but without this child's pid: the launcher does not take
    it for its own; the child exits (address in use) and the launcher picks another port. A port the caller gave
    is never changed: the same clash is one clear error."""
    import http.server
    import threading
    from server import process

    class Foreign(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass
    foreign = http.server.HTTPServer(("127.0.0.1", 0), Foreign)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    taken = foreign.server_address[1]
    try:
        picks = iter([taken, process.free_port()])
        monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": next(picks))
        with process.EngineServerProcess(model=tiny_folder) as srv:
            assert srv.port != taken and srv.healthy()
        with pytest.raises(process.ServerStartError, match="address already in use"):
            with process.EngineServerProcess(model=tiny_folder, port=taken):
                pass
    finally:
        foreign.shutdown()
