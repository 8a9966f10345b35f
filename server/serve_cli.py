"""`python -m engine serve`: load a model, start its engine worker, serve the OpenAI API with uvicorn.

    python -m engine serve                                    # the default model on http://127.0.0.1:8000
    python -m engine serve --model path/to/folder --port 8011 --served-model-name smollm2

It prints one line "serving MODEL on http://HOST:PORT" once it accepts requests (GET /health answers 200) and stops
on Ctrl-C or SIGTERM, cancelling every request (their KV blocks are freed).
"""
from __future__ import annotations

import argparse
import sys

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_SERVED_NAME = "smollm2"     # the bundled SmolLM2-135M-Instruct


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="smollm2 (default, offline) | path/to/model.gguf | HF folder | owner/repo | random:<preset>")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default 127.0.0.1: this machine "
                                                        "only; 0.0.0.0 for a class on the network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as 'model' (default: smollm2 for the default model, else the source)")
    p.add_argument("--max-batch", type=int, default=None, help="requests decoded together (default 32)")
    p.add_argument("--max-waiting", type=int, default=None, help="requests allowed to wait in line (default 64)")
    p.add_argument("--kv-budget-mb", type=float, default=None, help="KV pool size in MB (default 256)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default warning)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the process that started this one ends (the app's embedded server)")


def served_name(source: str | None, given: str | None) -> str:
    if given:
        return given
    from engine.load.loading import DEFAULT_NAMES
    return DEFAULT_SERVED_NAME if (source or "").strip().lower() in DEFAULT_NAMES else str(source)


def run(args) -> int:
    import uvicorn

    from engine import load_model
    from engine import threads as blas_threads
    from engine.errors import ModelError
    from server.openai_api import create_app
    from server.worker import EngineWorker

    if not 0 < args.port < 65536:
        print(f"error: --port must be between 1 and 65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        model = load_model(args.model)
        options = {k: v for k, v in (("max_batch", args.max_batch), ("max_waiting", args.max_waiting)) if v}
        if args.kv_budget_mb:
            options["kv_budget_bytes"] = args.kv_budget_mb * 1e6
        worker = EngineWorker(model, **options)
        blas_threads.prepare(model.weight_matrices)     # threads sized to the free cores before the first request
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = served_name(args.model, args.served_model_name)
    app = create_app(worker, name)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    _announce_when_started(server, name, args.host, args.port)
    if args.exit_with_parent:
        _exit_with_parent(server)
    try:
        server.run()
    finally:
        worker.close()
    return 0 if server.started else 2


def _exit_with_parent(server, every_s: float = 2.0) -> None:
    """Ask uvicorn to shut down once the parent process is gone (we are re-parented: getppid changes)."""
    import os
    import threading
    import time
    parent = os.getppid()

    def watch() -> None:
        while not server.should_exit:
            if os.getppid() != parent:
                server.should_exit = True
                return
            time.sleep(every_s)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _announce_when_started(server, name: str, host: str, port: int) -> None:
    """Print the one ready line after uvicorn has bound the socket (its startup hook)."""
    original = server.startup

    async def startup(sockets=None):
        await original(sockets=sockets)
        if server.started:
            print(f"serving {name} on http://{host}:{port}", flush=True)

    server.startup = startup
