"""A tiny, honest OpenAI-compatible server for tests (standard library only, 127.0.0.1, a free port): it streams
real server-sent-event chunks, one token per chunk, sleeping `ttft_s` before the first and `itl_s` between the
next ones (a request without `stream` is answered at once), so a client's measured TTFT and ITL can be checked against delays the test chose.

Prompt tokens = `prompt_fixed` + one per whitespace-separated word, or per id of a prompt given as token ids
(what `usage` reports). `die_after`: the
server shuts down for good once that many streaming requests have started (a server dying mid-sweep);
`drop_nth`: that one streaming request loses its connection halfway, the server keeps serving.
`models_status` / `models_body` replace the /v1/models answer (a server that is not OpenAI-compatible).
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Script:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    model: str = "fake-model"
    prompt_fixed: int = 3
    die_after: int | None = None
    drop_nth: int | None = None         # this streaming request (1 = the first) loses its connection mid-body
    models_status: int = 200
    models_body: str | None = None
    usage: bool = True
    sse: bool = True                    # False: a streaming request gets one JSON body (a server ignoring stream)
    started: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script
    owner: "FakeOpenAIServer"

    def log_message(self, *args):            # quiet
        pass

    def _json(self, status: int, obj) -> None:
        body = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(obj, str) else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _dead(self) -> bool:
        """A killed server answers nothing more, on any connection (a kept-alive one or one accepted just before the
        listening socket closed): the connection is dropped, as a dead process's would be."""
        if not self.owner.dead:
            return False
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def do_GET(self):
        s = self.script
        if self._dead():
            return
        if self.path.rstrip("/") == "/v1/models":
            if s.models_body is not None or s.models_status != 200:
                return self._json(s.models_status, s.models_body or "<html>nothing here</html>")
            return self._json(200, {"object": "list", "data": [{"id": s.model, "object": "model"}]})
        self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self):
        s = self.script
        if self._dead():
            return
        n = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(n))
        except json.JSONDecodeError:
            return self._json(400, {"error": {"message": "malformed JSON", "type": "invalid_request_error"}})
        chat = self.path.rstrip("/") == "/v1/chat/completions"
        if self.path.rstrip("/") not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        if req.get("model") != s.model:
            return self._json(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                              "type": "NotFoundError"}})
        text = req["messages"][-1]["content"] if chat else req["prompt"]
        prompt_tokens = s.prompt_fixed + (len(text) if isinstance(text, list) else len(str(text).split()))
        out = int(req.get("max_tokens") or 16)
        if not req.get("stream") or not s.sse:
            return self._json(200, {"choices": [{"index": 0, "text": " x" * out}],
                                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": out,
                                              "total_tokens": prompt_tokens + out}})
        with s.lock:
            s.started += 1
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
            dying = s.die_after is not None and s.started > s.die_after
            drop = s.started == s.drop_nth
        try:
            if dying:
                self.owner.kill()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._stream(chat, out, prompt_tokens, bool((req.get("stream_options") or {}).get("include_usage")),
                         drop)
        finally:
            with s.lock:
                s.in_flight -= 1

    def _stream(self, chat: bool, out: int, prompt_tokens: int, include_usage: bool, drop: bool = False) -> None:
        s = self.script
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(out):
            time.sleep(s.ttft_s if i == 0 else s.itl_s)
            if self.owner.dead or (drop and i == out // 2):     # the process is gone / this connection drops
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            piece = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            self._event({"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                         "choices": [{"index": 0, **piece, "finish_reason": "length" if i == out - 1 else None}]})
        if include_usage and s.usage:
            self._event({"id": "x", "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                             "completion_tokens": out,
                                                             "total_tokens": prompt_tokens + out}})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, obj) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (an empty one ends the body)."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):     # a client that hung up: nothing to report
        pass


class FakeOpenAIServer:
    """`with FakeOpenAIServer(Script(ttft_s=0.2)) as srv: srv.url` -> 'http://127.0.0.1:PORT'."""

    def __init__(self, script: Script | None = None):
        self.script = script or Script()
        handler = type("Handler", (_Handler,), {"script": self.script, "owner": self})
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.dead = False

    def __enter__(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def kill(self) -> None:
        """Stop listening and drop this connection (called from a handler thread: no join on serve_forever)."""
        if not self.dead:
            self.dead = True
            threading.Thread(target=self.httpd.shutdown, daemon=True).start()
            self.httpd.socket.close()

    def __exit__(self, *exc) -> None:
        if not self.dead:
            self.dead = True
            self.httpd.shutdown()
        self.httpd.server_close()
