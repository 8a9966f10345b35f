"""A client of any OpenAI-compatible server (ours, vLLM, SGLang, TGI, llama.cpp's server): check it, stream a reply,
read its live state from its metrics endpoint.

    cfg = BackendConfig.from_env()            # INFERENCE_LAB_BACKEND_URL / _MODEL / _API_KEY, or None
    info = probe(cfg)                         # BackendError with one clear message when it cannot be used
    for piece in stream_reply(cfg, prompt="Hello", max_tokens=16):
        piece.text, piece.token_id, piece.arrived, piece.finish_reason
    state = read_state(cfg)                   # engine kind, requests running/waiting, KV usage, TTFT/ITL means

The `openai` package speaks the HTTP API (server-sent events included); prometheus_client parses metrics text.
Every failure is a `BackendError` whose message says what is wrong and what to change: no traceback reaches a page.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from engine.errors import ModelError

ENV_URL = "INFERENCE_LAB_BACKEND_URL"
ENV_MODEL = "INFERENCE_LAB_BACKEND_MODEL"
ENV_API_KEY = "INFERENCE_LAB_BACKEND_API_KEY"
TIMEOUT_S = 10.0                 # connecting and non-streaming calls
STREAM_TIMEOUT_S = 600.0         # a long reply on a busy CPU server
ENGINE_PREFIXES = (("vllm:", "vLLM"), ("sglang:", "SGLang"), ("tgi_", "TGI (Text Generation Inference)"),
                   ("llamacpp:", "llama.cpp server"))
OURS = "inference-lab"           # /v1/models owned_by of `python -m engine serve`


class BackendError(ModelError):
    """A server that cannot be used as asked (unreachable, not OpenAI-compatible, unknown model, ...)."""


DEFAULT_RETRY_AFTER_S = 2


class BackendBusy(BackendError):
    """A refusal for now, not for ever (HTTP 429, or a cap of the app's own): `retry_after_s` says when to try
    again (the server's Retry-After header where it sent one), and the message says it too."""

    def __init__(self, message: str, retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        self.retry_after_s = max(1, int(retry_after_s))
        when = f"try again in {self.retry_after_s} s"
        super().__init__(message.replace("try again in a moment", when) if "try again in a moment" in message
                         else f"{message.rstrip('. ')}; {when}")


def _retry_after(err) -> int:
    """Seconds from a response's Retry-After header (delta-seconds form); the default where absent or a date."""
    response = getattr(err, "response", None)
    text = str(getattr(response, "headers", {}).get("retry-after", "") or "").strip()
    return int(text) if text.isdigit() else DEFAULT_RETRY_AFTER_S


@dataclass(frozen=True)
class BackendConfig:
    url: str                      # base URL, e.g. http://gpu-box:8000 (with or without /v1)
    model: str | None = None      # None: the first model the server lists
    api_key: str | None = None

    @property
    def root(self) -> str:
        u = self.url.strip().rstrip("/")
        return u[:-3] if u.endswith("/v1") else u

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "BackendConfig | None":
        env = os.environ if env is None else env
        url = env.get(ENV_URL, "").strip()
        if not url:
            return None
        return cls(url=url, model=env.get(ENV_MODEL, "").strip() or None,
                   api_key=env.get(ENV_API_KEY, "").strip() or None)

    def checked(self) -> "BackendConfig":
        from urllib.parse import urlparse
        u = urlparse(self.root)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise BackendError(f"{self.url!r} is not a server address; write it as http://HOST:PORT "
                               f"(for example http://127.0.0.1:8000)")
        return self


@dataclass(frozen=True)
class BackendInfo:
    config: BackendConfig
    model: str                    # the model name requests will use
    models: tuple[str, ...]
    engine: str                   # "ours", "vLLM", "SGLang", ... or "unknown"
    max_model_len: int | None = None


def _client(cfg: BackendConfig, timeout: float = TIMEOUT_S):
    """One client (one connection pool) per server and timeout, shared by every session's requests: building a
    client costs a TLS context and a connection pool, which thirty sessions pressing Generate at once would pay
    thirty times."""
    return _shared_client(cfg.base_url, cfg.api_key or "none", timeout)


_CLIENT_LOCK = threading.Lock()


@functools.lru_cache(maxsize=16)
def _cached_client(base_url: str, api_key: str, timeout: float):
    import openai
    return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)


def _shared_client(base_url: str, api_key: str, timeout: float):
    """The cached client, built under a lock: sessions asking at once for a server none has used would otherwise
    each build one, the cache keep the last, and the others be collected; the SDK closes a collected client's
    connection pool, the sockets of the replies being read through it included ('Bad file descriptor')."""
    with _CLIENT_LOCK:
        return _cached_client(base_url, api_key, timeout)



def _explain(err: Exception, cfg: BackendConfig) -> BackendError:
    """One sentence per way a server can fail us."""
    import openai
    where = cfg.root
    if isinstance(err, BackendError):
        return err
    if isinstance(err, openai.APITimeoutError):
        return BackendError(f"{where} did not answer within {TIMEOUT_S:.0f} s; is it overloaded or still starting?")
    if isinstance(err, openai.APIConnectionError):
        return BackendError(f"cannot reach {where}: nothing answers there (check the address and port, and that "
                            f"the server is running)")
    if isinstance(err, openai.AuthenticationError):
        return BackendError(f"{where} refused the API key (HTTP 401); set the right key ({ENV_API_KEY})")
    if isinstance(err, openai.NotFoundError):
        msg = _error_message(err)
        if "model" in msg.lower():
            return BackendError(f"{where}: {msg}")
        return BackendError(f"{where} is not an OpenAI-compatible server (no {cfg.base_url}/models or "
                            f"/completions endpoint: HTTP 404)")
    if isinstance(err, openai.APIStatusError) and err.status_code == 429:
        return BackendBusy(f"{where} is busy (HTTP 429): {_error_message(err)}", _retry_after(err))
    if isinstance(err, openai.APIStatusError):
        return BackendError(f"{where} answered HTTP {err.status_code}: {_error_message(err)}")
    if isinstance(err, (ValueError, TypeError, KeyError, AttributeError)):
        return BackendError(f"{where} is not an OpenAI-compatible server (its answer is not what the OpenAI API "
                            f"returns: {type(err).__name__})")
    return BackendError(f"{where}: {type(err).__name__}: {err}")


def _error_message(err) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        e = body.get("error", body)
        if isinstance(e, dict) and e.get("message"):
            return str(e["message"])
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(getattr(err, "message", err))


def probe(cfg: BackendConfig) -> BackendInfo:
    """List the server's models and pick ours; BackendError (one clear message) when it cannot be used."""
    cfg = cfg.checked()
    try:
        page = _client(cfg).models.list()
        cards = list(page.data)
        names = tuple(str(c.id) for c in cards)
    except Exception as e:
        raise _explain(e, cfg) from None
    if not names:
        raise BackendError(f"{cfg.root} lists no models at {cfg.base_url}/models; it is not serving any model")
    model = cfg.model or names[0]
    if model not in names:
        raise BackendError(f"{cfg.root} does not serve a model named {model!r}; it serves: {', '.join(names)}")
    card = cards[names.index(model)]
    extra = getattr(card, "model_extra", None) or {}
    owner = str(getattr(card, "owned_by", "") or "")
    engine = "ours" if owner == OURS else {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp server"}.get(
        owner.lower(), "unknown")
    ctx = extra.get("max_model_len")
    return BackendInfo(cfg, model, names, engine, int(ctx) if isinstance(ctx, int) else None)


# ============================================================================================ streaming
@dataclass
class Piece:
    """One streamed chunk: its text, its token id when the server sends ids, when it arrived (perf_counter)."""
    text: str
    token_id: int | None
    arrived: float
    finish_reason: str | None = None


def _own_socket(response):
    """A duplicate of the streaming response's socket (a second descriptor of the same connection), taken while the
    reply is fresh, or None. Shutting it down hangs up the connection even where the HTTP library has meanwhile
    closed its own socket object under a thread still blocked reading it (seen with three streams opened at once:
    the object's descriptor read -1, and neither the reader nor the server learnt of the hang-up; the cause was a
    second client built in a race and collected, which `_shared_client` and the reply's own reference now rule
    out)."""
    try:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        return sock.dup() if sock is not None and sock.fileno() >= 0 else None
    except Exception:
        return None


class ReplyStream:
    """Iterate for `Piece`s; `close()` (or a set `stop` event) hangs up, and the server frees the request."""

    def __init__(self, cfg: BackendConfig, model: str, *, prompt: str | Sequence[int] | None = None,
                 messages: list[dict] | None = None, max_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, user: str | None = None,
                 stop: threading.Event | None = None) -> None:
        self.cfg, self.model, self.stop = cfg, model, stop
        self.started = time.perf_counter()
        extra = {"return_token_ids": True}
        if top_k:
            extra["top_k"] = int(top_k)
        common = dict(model=model, max_tokens=int(max_tokens), temperature=float(temperature), top_p=float(top_p),
                      stream=True, extra_body=extra)
        if seed is not None:
            common["seed"] = int(seed)
        if user:
            common["user"] = user
        client = _client(cfg, STREAM_TIMEOUT_S)
        self._chat = messages is not None
        try:        # the raw response: events are read with json.loads, not built into pydantic models per token
            if self._chat:
                raw = client.chat.completions.with_raw_response.create(messages=messages, **common)
            else:
                raw = client.completions.with_raw_response.create(prompt=prompt, **common)
        except Exception as e:
            raise _explain(e, cfg) from None
        self._response = raw.http_response
        self._client = client        # held while the reply is read: a client the cache evicts and the collector
                                     # takes closes its connections, this reply's socket included
        self._hangup = _own_socket(self._response)
        self.closed = False
        self.finished = False                 # the reply was read to its end
        if stop is not None:
            _stop_watcher.add(self)

    def close(self) -> None:
        """Hang up now: shut the connection's socket first, so a thread blocked reading it wakes at once and the
        server sees the hang-up even while it has no token to send (a request waiting in line)."""
        if not self.closed:
            self.closed = True
            own, self._hangup = self._hangup, None
            try:
                import socket
                if own is not None and not self.finished and not self._response.is_closed:
                    own.shutdown(socket.SHUT_RDWR)   # a finished reply's connection went back to the pool: never
            except Exception:                        # shut it
                pass
            finally:
                if own is not None:
                    own.close()                      # our duplicate only: the connection's own socket stays open
            try:
                self._response.close()
            except Exception:
                pass
            self._client = None

    def __iter__(self) -> Iterator[Piece]:
        try:
            for event in self._events():
                choices = event.get("choices") or []
                if not choices:
                    continue
                c = choices[0]
                text = ((c.get("delta") or {}).get("content") or "") if self._chat else (c.get("text") or "")
                ids = c.get("token_ids") or []
                now = time.perf_counter()
                finish = c.get("finish_reason")
                if not ids:
                    if text or finish:
                        yield Piece(text, None, now, finish)
                    continue
                for i, tid in enumerate(ids):        # several ids in one chunk: text goes with the last
                    last = i == len(ids) - 1
                    yield Piece(text if last else "", int(tid), now, finish if last else None)
            self.finished = True
        except Exception as e:
            if self.closed:
                return
            raise _explain(e, self.cfg) from None
        finally:
            self.close()

    def _events(self) -> Iterator[dict]:
        """The server-sent events' JSON objects, until [DONE]; an error event is a BackendError."""
        import json
        for line in self._response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError:
                raise BackendError(f"{self.cfg.root} sent an event that is not JSON: {data[:80]!r}") from None
            if not isinstance(event, dict):
                raise BackendError(f"{self.cfg.root} sent an event that is not a JSON object: {data[:80]!r}")
            if event.get("error"):
                err = event["error"]
                raise BackendError(f"{self.cfg.root}: {err.get('message', err) if isinstance(err, dict) else err}")
            yield event


class _StopWatcher:
    """One thread hangs up every stream whose stop event is set, checking them all STOP_POLL_S apart, and ends
    when none is left: thirty streams no longer keep thirty threads waking ten times a second each (every wake-up
    takes the GIL from the threads drawing replies)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: set[ReplyStream] = set()
        self._thread: threading.Thread | None = None

    def add(self, stream: ReplyStream) -> None:
        with self._lock:
            self._streams.add(stream)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reply-stop-watcher", daemon=True)
                self._thread.start()

    def watching(self) -> int:
        with self._lock:
            return len(self._streams)

    def _run(self) -> None:
        while True:
            time.sleep(STOP_POLL_S)
            with self._lock:
                due = [s for s in self._streams if s.stop.is_set() and not s.closed]
                self._streams = {s for s in self._streams if not s.closed and s not in due}
                done = not self._streams
                if done:
                    self._thread = None             # a later add() starts a new watcher
            for s in due:
                s.close()
            if done:
                return


STOP_POLL_S = 0.1
_stop_watcher = _StopWatcher()


# ============================================================================================ live state
@dataclass
class ServerState:
    """What a server's metrics say right now (None where it does not publish the number)."""
    engine: str
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None                 # fraction of the KV cache in use
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    mean_ttft_s: float | None = None
    mean_itl_s: float | None = None
    generation_tokens: float | None = None
    names: tuple[str, ...] = field(default=())    # every metric family seen


VLLM_GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
               "kv_usage": "vllm:kv_cache_usage_perc", "prefix_queries": "vllm:prefix_cache_queries",
               "prefix_hits": "vllm:prefix_cache_hits", "generation_tokens": "vllm:generation_tokens"}


def parse_metrics(text: str, engine_hint: str = "unknown") -> ServerState:
    """Prometheus text -> ServerState; vLLM's names (which ours share) are read, other engines are named.
    BackendError when the text is not Prometheus exposition format."""
    from prometheus_client.parser import text_string_to_metric_families
    sums: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:
        raise BackendError(f"the metrics endpoint did not return Prometheus text ({type(e).__name__}); "
                           f"the live view needs /metrics in Prometheus format") from None
    if not families:
        raise BackendError("the metrics endpoint returned no metrics in Prometheus format")
    for fam in families:
        for s in fam.samples:
            sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    names = tuple(sorted({f.name for f in families}))
    engine = engine_hint if engine_hint not in ("unknown", "") else next(
        (label for prefix, label in ENGINE_PREFIXES if any(n.startswith(prefix) for n in names)), "unknown")

    def get(name: str) -> float | None:
        for n in (name, name + "_total"):
            if n in sums:
                return sums[n]
        return None

    def mean(hist: str) -> float | None:
        s, c = sums.get(hist + "_sum"), sums.get(hist + "_count")
        return s / c if s is not None and c else None

    state = ServerState(engine=engine, names=names,
                        mean_ttft_s=mean("vllm:time_to_first_token_seconds"),
                        mean_itl_s=mean("vllm:inter_token_latency_seconds"))
    for attr, name in VLLM_GAUGES.items():
        setattr(state, attr, get(name))
    return state


@functools.lru_cache(maxsize=16)
def _http(root: str, api_key: str):
    """One HTTP client per server for its metrics and live batch, shared by every session: the Class page reads
    them every second or two, and a new client builds a TLS context each time (measured: 2 s of the app's CPU
    during a 30-session class). It keeps no cookies: a cookie one session's read received would go out with
    every other session's reads."""
    import http.cookiejar

    import httpx2
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return httpx2.Client(timeout=TIMEOUT_S, headers=headers, cookies=no_cookies)


def _get(cfg: BackendConfig, path: str, what: str) -> str:
    import httpx2
    try:
        r = _http(cfg.root, cfg.api_key or "").get(cfg.root + path)
    except httpx2.TimeoutException:
        raise BackendError(f"{cfg.root}{path} did not answer within {TIMEOUT_S:.0f} s") from None
    except httpx2.HTTPError:
        raise BackendError(f"cannot reach {cfg.root} for {what} (nothing answers there)") from None
    if r.status_code == 404:
        raise BackendError(f"{cfg.root} has no {path} endpoint, so its {what} cannot be shown "
                           f"(vLLM, SGLang and our server publish it; llama.cpp needs --metrics)")
    if r.status_code != 200:
        raise BackendError(f"{cfg.root}{path} answered HTTP {r.status_code}")
    return r.text


def read_state(cfg: BackendConfig, engine_hint: str = "unknown") -> ServerState:
    return parse_metrics(_get(cfg, "/metrics", "metrics"), engine_hint)


def read_live_batch(cfg: BackendConfig):
    """Our server's /v1/batch as a `server.worker.WorkerSnapshot` (BackendError for other servers)."""
    import json

    from server.live_batch import snapshot_from_json
    text = _get(cfg, "/v1/batch", "live batch")
    try:
        return snapshot_from_json(json.loads(text), time.perf_counter())
    except (ValueError, KeyError, TypeError) as e:
        raise BackendError(f"{cfg.root}/v1/batch is not this app's live-batch document ({e})") from None


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


# ============================================================================================ simulated students
SIMULATED_PROMPTS = ("Write a story about a dragon.", "Explain photosynthesis simply.", "Give me three tips for "
                     "learning to code.", "Describe the moon to a child.", "Write a short poem about rain.")
MAX_SIMULATED = 64                # students one click may add
SIMULATED_SHARE = 0.5             # simulated students take at most this share of a server's places (batch + line)


class SimulatedStudents:
    """Simulated students' requests in flight, per server: capped, and the first to give way. A real student
    refused for a full server takes a simulated student's place (`make_room`), so simulated load never costs a
    real student a 429."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, list] = {}           # server root -> its simulated ReplyStreams (None: starting)

    def running(self, cfg: BackendConfig) -> int:
        with self._lock:
            return len(self._streams.get(cfg.root, ()))

    def start(self, cfg: BackendConfig, model: str, n: int, cap: int, max_tokens: int = 64) -> int:
        """Send `n` streaming requests at once, as `n` students pressing Generate, keeping at most `cap` in flight
        on this server. Returns how many started; BackendBusy (with Retry-After) when none may. Daemon threads:
        the caller never waits."""
        if not 1 <= n <= MAX_SIMULATED:
            raise BackendError(f"the number of simulated students must be between 1 and {MAX_SIMULATED}, got {n}")
        with self._lock:
            mine = self._streams.setdefault(cfg.root, [])
            room = max(0, int(cap) - len(mine))
            slots = [_Slot() for _ in range(min(n, room))]
            mine.extend(slots)
        if not slots:
            raise BackendBusy(f"{cap} simulated students are already running on {cfg.root} (at most "
                              f"{SIMULATED_SHARE:.0%} of its places, so real students always find one)", 5)
        for i, slot in enumerate(slots):
            threading.Thread(target=self._one_student, args=(cfg, model, i, max_tokens, slot), daemon=True,
                             name=f"simulated-student-{i}").start()
        return len(slots)

    def make_room(self, cfg: BackendConfig) -> bool:
        """Hang up the newest simulated request on this server (the server frees its place); False if none."""
        with self._lock:
            mine = self._streams.get(cfg.root) or []
            slot = mine.pop() if mine else None
        if slot is None:
            return False
        slot.cancel()
        return True

    def _one_student(self, cfg: BackendConfig, model: str, i: int, max_tokens: int, slot: "_Slot") -> None:
        try:
            if slot.cancelled:
                return
            slot.stream = ReplyStream(cfg, model, prompt=SIMULATED_PROMPTS[i % len(SIMULATED_PROMPTS)],
                                      max_tokens=max_tokens, temperature=0.7, seed=i)
            if slot.cancelled:
                slot.stream.close()
            for _ in slot.stream:
                pass
        except BackendError:
            pass                  # a simulated student that fails just leaves; the page shows the server's state
        finally:
            with self._lock:
                mine = self._streams.get(cfg.root, [])
                if slot in mine:
                    mine.remove(slot)


class _Slot:
    """One simulated student's place: its stream once sent; `cancel()` hangs it up (or stops it being sent)."""

    def __init__(self) -> None:
        self.stream: ReplyStream | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.stream is not None:
            self.stream.close()


_simulated = SimulatedStudents()


def simulate_students(cfg: BackendConfig, model: str, n: int, max_tokens: int = 64,
                      cap: int = 2 * MAX_SIMULATED) -> int:
    """`SimulatedStudents.start` on the process's one registry (the teacher check is the caller's:
    ui.server.add_simulated_students)."""
    return _simulated.start(cfg, model, n, cap, max_tokens)


def simulated_running(cfg: BackendConfig) -> int:
    return _simulated.running(cfg)


def make_room_for_a_student(cfg: BackendConfig) -> bool:
    return _simulated.make_room(cfg)
