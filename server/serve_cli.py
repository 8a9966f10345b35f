"""`python -m engine serve`: load a model, start its engine worker, serve the OpenAI API with uvicorn.

    python -m engine serve                                    # the default model on http://127.0.0.1:8000
    python -m engine serve --model path/to/folder --port 8011 --served-model-name smollm2
    INFERENCE_LAB_API_KEY=secret python -m engine serve --host 0.0.0.0      # a class on the network: keyed

Access (server/api_guard.py): with a key (--api-key, or the environment variable INFERENCE_LAB_API_KEY, which
keeps it out of the process list) every /v1 route, /tokenize and /detokenize need `Authorization: Bearer KEY`;
/metrics too with --protect-metrics. Host names other than IP literals, localhost and this machine's name, and
cross-site browser requests (an Origin header from another site), are refused unless --allowed-hosts /
--allowed-origins name them. Bodies over --max-body-mb are refused (413).

It prints one line "serving MODEL on http://HOST:PORT" once it accepts requests (GET /health answers 200) and stops
on Ctrl-C or SIGTERM, cancelling every request (their KV blocks are freed).
"""
from __future__ import annotations

import argparse
import sys

from server.api_guard import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES

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
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize (default: the "
                        f"environment variable {API_KEY_ENV}; no key when neither is set)")
    p.add_argument("--protect-metrics", action="store_true", help="/metrics needs the API key too")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host names accepted besides IP addresses, localhost and this machine's "
                        "name (e.g. lab.school.example); * accepts any (no DNS-rebinding protection)")
    p.add_argument("--allowed-origins", default=None,
                   help="comma-separated web origins whose pages may call this server (e.g. "
                        "https://lab.school.example); * accepts any. Default: none (same-origin only)")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                   help=f"largest request body in MiB (default {DEFAULT_MAX_BODY_BYTES / 2**20:g}); larger: 413")
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
    from server.api_guard import Access, api_key_from, split_list
    from server.openai_api import create_app
    from server.worker import EngineWorker

    if not 0 < args.port < 65536:
        print(f"error: --port must be between 1 and 65535, got {args.port}", file=sys.stderr)
        return 2
    if not 0 < args.max_body_mb <= 1024:
        print(f"error: --max-body-mb must be between 0 and 1024, got {args.max_body_mb}", file=sys.stderr)
        return 2
    access = Access(api_key=api_key_from(args.api_key), protect_metrics=args.protect_metrics,
                    allowed_hosts=split_list(args.allowed_hosts), allowed_origins=split_list(args.allowed_origins))
    if args.host not in ("127.0.0.1", "localhost", "::1") and not access.api_key:
        print(f"warning: listening on {args.host} without an API key: anyone who can reach this port can use it "
              f"(set --api-key or {API_KEY_ENV})", file=sys.stderr)
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
    app = create_app(worker, name, access=access, max_body_bytes=int(args.max_body_mb * 2**20))
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
