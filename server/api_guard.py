"""Who may call the engine server: an API key, and Host and Origin checks that keep web pages out.

- API key (`--api-key` or the environment variable INFERENCE_LAB_API_KEY, as vLLM's `--api-key`/VLLM_API_KEY):
  every /v1 route (/v1/batch included), /tokenize, /detokenize and /tokenizer_info need `Authorization: Bearer <key>`; /metrics
  too when `protect_metrics` is set; /health never (a load balancer's probe).
- Host: a page on evil.example whose DNS name is re-pointed at this machine (DNS rebinding) reaches the server
  with `Host: evil.example`. Allowed Host names: IP literals, localhost, this machine's own name, and those listed
  in `allowed_hosts` ("*" turns the check off). A rebinding attack always carries the attacker's name, never an IP.
- Origin: a browser marks every cross-site POST with `Origin:`; such a request is refused unless its origin is
  this server's own (same host and port as Host) or listed in `allowed_origins` ("*": any). Clients that are not
  browsers (openai, curl, lm-eval, the app) send no Origin and are not affected.

Refusals are JSON in OpenAI's error shape: 401 (no or wrong key), 403 (host or origin refused).
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

API_KEY_ENV = "INFERENCE_LAB_API_KEY"      # as vLLM's VLLM_API_KEY
DEFAULT_MAX_BODY_BYTES = 8 * 2**20         # request bodies larger than this are refused (413)
KEYED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class Access:
    api_key: str | None = None
    protect_metrics: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def needs_key(self, path: str) -> bool:
        if not self.api_key:
            return False
        return path == "/v1" or path.startswith(KEYED_PREFIXES) or (self.protect_metrics and path == "/metrics")


def api_key_from(flag: str | None) -> str | None:
    """The key from the flag, else from INFERENCE_LAB_API_KEY; None (no key) when neither is set or both empty."""
    key = flag if flag is not None else os.environ.get(API_KEY_ENV)
    return key or None


def split_list(value: str | None) -> tuple[str, ...]:
    """"a.example, b.example" -> ("a.example", "b.example")"""
    return tuple(v.strip().lower() for v in (value or "").split(",") if v.strip())


def _host_name(host_header: str) -> str:
    """'Example.org:8000' -> 'example.org'; '[::1]:8000' -> '::1'."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def machine_names() -> frozenset[str]:
    """This machine's own name (and its mDNS .local form), without a DNS lookup."""
    try:
        name = socket.gethostname().lower()
    except OSError:
        return frozenset()
    return frozenset({name, name.split(".")[0], f"{name.split('.')[0]}.local"}) if name else frozenset()


def error_body(status: int, message: str, kind: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}},
                      ensure_ascii=True).encode()


class AccessGuard:
    """ASGI middleware: refuse a request before any route sees it when its key, Host or Origin is wrong."""

    def __init__(self, app, access: Access) -> None:
        self.app, self.access = app, access
        self._names = LOOPBACK_NAMES | machine_names() | frozenset(access.allowed_hosts)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refusal = self.check(scope)
            if refusal is not None:
                status, body, extra = refusal
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                           *extra]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def check(self, scope) -> tuple[int, bytes, list] | None:
        headers = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = headers.get("host")
        if host is not None and not self.host_allowed(host):
            return 403, error_body(403, f"the Host header {host[:100]!r} is not allowed on this server; start it "
                                        f"with --allowed-hosts NAME to accept that name", "invalid_request_error",
                                   "host_not_allowed"), []
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            return 403, error_body(403, f"cross-site requests are refused (Origin {origin[:100]!r}); start the "
                                        f"server with --allowed-origins ORIGIN to accept that site",
                                   "invalid_request_error", "origin_not_allowed"), []
        if self.access.needs_key(scope.get("path", "")):
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                                                                      self.access.api_key.encode("utf-8")):
                what = "no API key was sent" if not auth else "the API key is not correct"
                return 401, error_body(401, f"{what}: send the header 'Authorization: Bearer <key>' with the "
                                            f"key this server was started with", "invalid_request_error",
                                       "invalid_api_key"), [(b"www-authenticate", b"Bearer")]
        return None

    def host_allowed(self, host_header: str) -> bool:
        if "*" in self.access.allowed_hosts:
            return True
        name = _host_name(host_header)
        return _is_ip(name) or name in self._names

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        allowed = self.access.allowed_origins
        o = origin.strip().lower().rstrip("/")
        if "*" in allowed or o in allowed:
            return True
        parts = urlsplit(o)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False                               # "null" (sandboxed frames, files) and other schemes
        return host_header is not None and parts.netloc == host_header.strip().lower()
