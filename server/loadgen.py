"""A load generator for any OpenAI-compatible server (ours, vLLM, SGLang, TGI, llama.cpp's server): a sweep over
concurrency levels or request rates, each request streamed by server-sent events and timed at the client.

Per request (perf_counter clock, taken when a chunk is parsed), as vLLM's `bench serve` counts them:
    TTFT  = first token chunk (one with `choices`, its text possibly empty) − request sent
    ITL   = the gaps between successive token chunks (a chunk carrying k tokens is one gap)
    TPOT  = (last token chunk − first) / (output tokens − 1)
    E2E   = last token chunk − request sent
Token counts come from the server's `usage` (asked for with `stream_options.include_usage`); a server that sends
none is counted by text chunks, and the result says so. Per level: output tokens/s = output tokens of completed
requests / (last end − first send).

Load: `concurrency` c keeps c requests in flight (a new one is sent when one ends, N in all); `rate` r sends N
requests at Poisson times of mean rate r (seeded), however many are in flight. Prompts are random common words,
different for every request from the first word on (so no prefix cache serves them), sized with two probe
requests to the server's own tokenizer: prompt tokens = a + b·words.

Bounded: at most `MAX_REQUESTS_PER_LEVEL` requests per level, `MAX_IN_FLIGHT` at once, a time limit per request
and per level; Stop (a threading.Event) ends the sweep at once and keeps what was measured.
"""
from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import httpx2
import numpy as np

from specs.model_config import SpecError

MODES = ("concurrency", "rate")
APIS = ("completions", "chat")
MAX_REQUESTS_PER_LEVEL = 10_000
MAX_IN_FLIGHT = 512
MAX_LEVELS = 32
HEARTBEAT_S = 1.0                # progress is reported at least this often while requests run
PROBE_WORDS = (16, 64)
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education "
         "river garden window summer winter music paper table light voice letter market field road island forest "
         "bridge doctor engine signal valley planet ocean mountain village circle square bottle ticket camera").split()


class LoadError(SpecError):
    """A problem with the target or the sweep that the user can fix: one line, no traceback."""


# ============================================================================================ inputs
@dataclass(frozen=True)
class Target:
    """Where to send requests: the server's base URL (with or without /v1), the served model name, an optional
    API key, and the API (`completions` = /v1/completions, `chat` = /v1/chat/completions)."""
    url: str
    model: str
    api_key: str | None = None
    api: str = "completions"

    def __post_init__(self):
        object.__setattr__(self, "url", base_url(self.url))
        if not isinstance(self.model, str) or not self.model.strip():
            raise LoadError("give the model name the server serves (its /v1/models lists them)")
        object.__setattr__(self, "model", self.model.strip())
        if self.api not in APIS:
            raise LoadError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")

    @property
    def endpoint(self) -> str:
        return f"{self.url}/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def base_url(url: str) -> str:
    """'localhost:8000', 'http://h:8000/', 'http://h:8000/v1' -> 'http://h:8000/v1'."""
    u = (url or "").strip()
    if not u:
        raise LoadError("give the server's URL, e.g. http://127.0.0.1:8000")
    if "://" not in u:
        u = "http://" + u
    scheme = u.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise LoadError(f"the URL must start with http:// or https://, got {url!r}")
    try:
        parsed = httpx2.URL(u)
    except Exception:
        raise LoadError(f"not a URL: {url!r}") from None
    if not parsed.host:
        raise LoadError(f"the URL has no host: {url!r}")
    u = u.rstrip("/")
    for suffix in ("/chat/completions", "/completions", "/models"):
        if u.endswith("/v1" + suffix):
            u = u[: -len(suffix)]
    return u if u.endswith("/v1") else u + "/v1"


@dataclass(frozen=True)
class SweepPlan:
    """The load: `levels` are concurrencies (whole numbers) or request rates (requests/s), `requests` per level."""
    levels: tuple[float, ...]
    mode: str = "concurrency"
    requests: int = 16
    prompt_tokens: int = 128
    output_tokens: int = 64
    request_timeout_s: float = 300.0
    level_timeout_s: float = 600.0
    ignore_eos: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise LoadError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        levels = tuple(self.levels)
        if not levels:
            raise LoadError(f"give at least one {'concurrency' if self.mode == 'concurrency' else 'rate'}")
        if len(levels) > MAX_LEVELS:
            raise LoadError(f"at most {MAX_LEVELS} levels per sweep, got {len(levels)}")
        for x in levels:
            if not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
                raise LoadError(f"every level must be a positive number, got {x!r}")
            if self.mode == "concurrency" and (x != int(x) or x > MAX_IN_FLIGHT):
                raise LoadError(f"a concurrency must be a whole number from 1 to {MAX_IN_FLIGHT}, got {x!r}")
        object.__setattr__(self, "levels", tuple(int(x) if self.mode == "concurrency" else float(x) for x in levels))
        for name, lo, hi in (("requests", 1, MAX_REQUESTS_PER_LEVEL), ("prompt_tokens", 1, 1_000_000),
                             ("output_tokens", 1, 1_000_000)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise LoadError(f"{name.replace('_', ' ')} must be a whole number from {lo:,} to {hi:,}, got {v!r}")
        for name in ("request_timeout_s", "level_timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise LoadError(f"{name} must be a positive number of seconds, got {v!r}")


def parse_levels(text: str) -> tuple[float, ...]:
    """'1,4,8' or '1 4 8' -> (1.0, 4.0, 8.0); a clear message for anything else."""
    parts = [p for p in str(text).replace(",", " ").split() if p]
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise LoadError(f"levels must be numbers separated by commas, e.g. 1,4,8; got {text!r}") from None


# ============================================================================================ results
@dataclass
class RequestRecord:
    """One request as the client saw it (seconds on the sweep's clock, 0 = the level's start)."""
    level: float
    index: int
    sent_s: float
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)     # when each text chunk arrived
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    tokens_from: str = "usage"                            # "usage" or "chunks" (the server sent no usage)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None and self.first_token_s is not None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float:
        return self.chunk_s[-1] - self.sent_s

    @property
    def itl_s(self) -> list[float]:
        return list(np.diff(self.chunk_s)) if len(self.chunk_s) > 1 else []

    @property
    def tpot_s(self) -> float | None:
        n = self.output_tokens or 0
        return (self.chunk_s[-1] - self.first_token_s) / (n - 1) if n > 1 else None


def _pct(values, q) -> float | None:
    return float(np.percentile(values, q)) * 1e3 if len(values) else None


@dataclass
class LevelResult:
    """One level; `records` grows while it runs (a Stop keeps what was measured)."""
    mode: str
    level: float
    records: list[RequestRecord] = field(default_factory=list)
    stopped: bool = False

    @property
    def duration_s(self) -> float:
        """First request sent -> last request ended."""
        ends = [r.end_s for r in self.records if r.end_s is not None]
        return max(ends) - min(r.sent_s for r in self.records) if ends else 0.0

    def summary(self) -> dict:
        ok = [r for r in self.records if r.ok]
        ttft = [r.ttft_s for r in ok]
        e2e = [r.e2e_s for r in ok]
        itl = [g for r in ok for g in r.itl_s]
        tpot = [t for r in ok if (t := r.tpot_s) is not None]
        out_tok = sum(r.output_tokens or 0 for r in ok)
        in_tok = sum(r.prompt_tokens or 0 for r in ok)
        span = self.duration_s
        row: dict = dict(mode=self.mode, level=self.level, requests=len(self.records), completed=len(ok),
                   failed=sum(r.error is not None for r in self.records), duration_s=span,
                   mean_prompt_tokens=in_tok / len(ok) if ok else None,
                   mean_output_tokens=out_tok / len(ok) if ok else None,
                   output_tok_s=out_tok / span if span > 0 else None,
                   total_tok_s=(in_tok + out_tok) / span if span > 0 else None,
                   requests_per_s=len(ok) / span if span > 0 else None,
                   tokens_from="chunks" if any(r.tokens_from == "chunks" for r in ok) else "usage",
                   stopped=self.stopped)
        for name, vals in (("ttft", ttft), ("itl", itl), ("tpot", tpot), ("e2e", e2e)):
            row[f"{name}_mean_ms"] = float(np.mean(vals)) * 1e3 if vals else None
            for q in (50, 90, 99):
                row[f"{name}_p{q}_ms"] = _pct(vals, q)
        errs = [r.error for r in self.records if r.error]
        row["first_error"] = errs[0] if errs else None
        return row


@dataclass
class SweepResult:
    target: Target
    plan: SweepPlan
    levels: list[LevelResult] = field(default_factory=list)
    prompt_fit: dict | None = None              # tokens = a + b·words, from the probes
    error: str | None = None                    # why the sweep ended early (server died, ...)
    stopped: bool = False

    def rows(self) -> list[dict]:
        return [lv.summary() for lv in self.levels]

    def rows_with_arrivals(self) -> list[dict]:
        """`rows()` plus each level's `arrival_s`: when its completed requests were sent (for a rate's prediction)."""
        return [dict(lv.summary(), arrival_s=[r.sent_s for r in lv.records if r.ok]) for lv in self.levels]

    def stop_now(self) -> None:
        """Mark the sweep and its running level stopped (a Stop button's callback)."""
        self.stopped = True
        if self.levels and self.levels[-1].records and not self.levels[-1].stopped:
            self.levels[-1].stopped = True

    def to_json(self) -> dict:
        t = asdict(self.target)
        t.pop("api_key", None)
        return dict(target=t, plan=asdict(self.plan), prompt_fit=self.prompt_fit, error=self.error,
                    stopped=self.stopped, levels=self.rows())


# ============================================================================================ HTTP
def _describe(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:200]


def _error_message(resp_text: str, status: int) -> str:
    """The OpenAI error shape's message if there is one, else the start of the body."""
    try:
        d = json.loads(resp_text)
        if isinstance(d, dict):
            err = d.get("error", d)
            msg = err.get("message") if isinstance(err, dict) else err
            if msg:
                return f"HTTP {status}: {str(msg)[:300]}"
            if d.get("detail"):
                return f"HTTP {status}: {str(d['detail'])[:300]}"
    except (json.JSONDecodeError, AttributeError):
        pass
    return f"HTTP {status}: {resp_text.strip()[:200] or '(empty body)'}"


async def list_models(client: httpx2.AsyncClient, target: Target) -> list[str]:
    """GET /v1/models -> the served model ids; a LoadError saying what is wrong otherwise."""
    url = f"{target.url}/models"
    try:
        r = await client.get(url, headers=target.headers(), timeout=10.0)
    except httpx2.TimeoutException:
        raise LoadError(f"{target.url} did not answer within 10 s: is the server up and the address right?") from None
    except (httpx2.TransportError, OSError) as e:
        raise LoadError(f"cannot reach {target.url}: {_describe(e)}. Is the server running, and is the address "
                        "right?") from None
    if r.status_code in (401, 403):
        raise LoadError(f"{url} refused the request (HTTP {r.status_code}): give the server's API key")
    if r.status_code != 200:
        raise LoadError(f"{url} answered HTTP {r.status_code}: not an OpenAI-compatible server (it should list its "
                        "models at /v1/models)")
    try:
        data = r.json()
        ids = [m["id"] for m in data["data"]]
    except (ValueError, KeyError, TypeError):
        raise LoadError(f"{url} did not answer with an OpenAI model list (JSON with a 'data' list of models): not an "
                        "OpenAI-compatible server") from None
    return [str(i) for i in ids]


def _payload(target: Target, prompt: str, max_tokens: int, stream: bool, ignore_eos: bool,
             include_usage: bool = True) -> dict:
    body: dict = dict(model=target.model, max_tokens=max_tokens, temperature=0.0, stream=stream)
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True                       # vLLM/SGLang's name; servers without it ignore it
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


async def _probe_tokens(client: httpx2.AsyncClient, target: Target, words: int, seed: int) -> int:
    body = _payload(target, make_prompt(words, seed), 1, stream=False, ignore_eos=False)
    try:
        r = await client.post(target.endpoint, json=body, headers=target.headers(), timeout=120.0)
    except (httpx2.TransportError, OSError) as e:
        raise LoadError(f"cannot reach {target.endpoint}: {_describe(e)}") from None
    if r.status_code == 404 and target.model.lower() in r.text.lower():
        raise LoadError(f"the server does not serve a model named {target.model!r}: {_error_message(r.text, 404)}")
    if r.status_code != 200:
        raise LoadError(f"{target.endpoint} refused a one-token request: {_error_message(r.text, r.status_code)}")
    try:
        usage = r.json().get("usage") or {}
        return int(usage["prompt_tokens"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return 0


async def probe(client: httpx2.AsyncClient, target: Target) -> dict:
    """Check the server before any load: it lists models (OpenAI-compatible), serves `target.model`, answers a
    one-token request; and fit prompt tokens = a + b·words from two probes (b = 1.3, a = 0 when it reports no
    usage)."""
    ids = await list_models(client, target)
    if target.model not in ids:
        shown = ", ".join(ids[:8]) + (" ..." if len(ids) > 8 else "")
        raise LoadError(f"the server at {target.url} does not serve a model named {target.model!r}; it serves: "
                        f"{shown or '(none)'}")
    counts = [await _probe_tokens(client, target, w, 10_000 + i) for i, w in enumerate(PROBE_WORDS)]
    if min(counts) <= 0 or counts[1] <= counts[0]:
        return dict(tokens_per_word=1.3, fixed_tokens=0.0, from_usage=False)
    b = (counts[1] - counts[0]) / (PROBE_WORDS[1] - PROBE_WORDS[0])
    return dict(tokens_per_word=b, fixed_tokens=counts[0] - b * PROBE_WORDS[0], from_usage=True)


def make_prompt(words: int, seed: int) -> str:
    """`words` random common words (seeded): different prompts from the first word on."""
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=max(1, words)))


def words_for(prompt_tokens: int, fit: dict) -> int:
    return max(1, round((prompt_tokens - fit["fixed_tokens"]) / fit["tokens_per_word"]))


class _ServerGone(Exception):
    pass


async def _one_request(client: httpx2.AsyncClient, target: Target, plan: SweepPlan, prompt: str,
                       rec: RequestRecord, t0: float) -> None:
    """Send one streaming request and fill `rec` as chunks arrive."""
    body = _payload(target, prompt, plan.output_tokens, stream=True, ignore_eos=plan.ignore_eos)
    chunks = 0
    try:
        async with client.stream("POST", target.endpoint, json=body, headers=target.headers(),
                                 timeout=httpx2.Timeout(plan.request_timeout_s, connect=10.0)) as resp:
            if resp.status_code != 200:
                rec.error = _error_message((await resp.aread()).decode("utf-8", "replace"), resp.status_code)
                return
            async for sse in httpx2.EventSource(resp):
                now = time.perf_counter() - t0
                if sse.data.strip() == "[DONE]":
                    break
                try:
                    d = json.loads(sse.data)
                except json.JSONDecodeError:
                    rec.error = f"a chunk that is not JSON: {sse.data[:80]!r}"
                    return
                if isinstance(d, dict) and d.get("error"):
                    rec.error = _error_message(sse.data, 200)
                    return
                usage = d.get("usage") if isinstance(d, dict) else None
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
                    rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)
                if isinstance(d, dict) and d.get("choices"):     # a token chunk (its text may be empty)
                    chunks += 1
                    rec.chunk_s.append(now)
                    if rec.first_token_s is None:
                        rec.first_token_s = now
    except httpx2.TimeoutException:
        rec.error = f"no answer within {plan.request_timeout_s:g} s"
        return
    except httpx2.SSEError as e:
        rec.error = f"the answer is not a server-sent-event stream ({_describe(e)}): not an OpenAI-compatible server"
    except (httpx2.TransportError, OSError) as e:
        rec.error = f"connection lost: {_describe(e)}"
        raise _ServerGone(rec.error) from None
    finally:
        rec.end_s = time.perf_counter() - t0
    if rec.first_token_s is None and rec.error is None:
        rec.error = "the stream ended without any token"
    if rec.output_tokens is None:
        rec.output_tokens, rec.tokens_from = chunks, "chunks"


async def _run_level(client, target, plan, fit, lv: LevelResult, level_no, on_request, stop) -> None:
    """Run one level into `lv`. A broken connection is that request's error while the server still answers
    /v1/models; _LevelAborted once it does not. Re-raises what a callback raised."""
    level, n = lv.level, plan.requests
    t0 = time.perf_counter()
    gone: list[str] = []                 # connections that broke; `dead` once the server no longer answers
    dead: list[str] = []
    failed: list[BaseException] = []
    seeds = plan.seed * 1_000_003 + level_no * 100_003
    words = words_for(plan.prompt_tokens, fit)
    sem = asyncio.Semaphore(int(level) if plan.mode == "concurrency" else MAX_IN_FLIGHT)
    if plan.mode == "rate":
        gaps = np.random.default_rng(seeds).exponential(1.0 / level, size=n)
        send_at = np.cumsum(gaps) - gaps[0]
    else:
        send_at = np.zeros(n)

    async def worker(i: int):
        delay = send_at[i] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:
            if stop.is_set() or dead or failed:
                return
            rec = RequestRecord(level=level, index=i, sent_s=time.perf_counter() - t0)
            lv.records.append(rec)
            try:
                await _one_request(client, target, plan, make_prompt(words, seeds + i), rec, t0)
            except _ServerGone as e:
                gone.append(str(e))
            try:
                on_request(rec)
            except BaseException as e:          # e.g. Streamlit ending the run: stop everything, re-raise below
                failed.append(e)

    tasks = [asyncio.ensure_future(worker(i)) for i in range(n)]
    try:
        pending = set(tasks)
        deadline = t0 + plan.level_timeout_s
        beat = time.perf_counter()
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            if time.perf_counter() - beat >= HEARTBEAT_S:
                beat = time.perf_counter()
                on_request(None)
            if gone:                                  # one broken connection, or the server gone?
                if not await _still_up(client, target):
                    dead.append(gone[0])
                    break
                gone.clear()
            if stop.is_set() or time.perf_counter() > deadline or failed:
                lv.stopped = lv.stopped or bool(pending)
                break
        if gone and not dead and not failed and not await _still_up(client, target):   # the last requests broke
            dead.append(gone[0])                                   # after the loop's last look: ask once more
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    lv.records.sort(key=lambda r: r.index)
    if failed:
        raise failed[0]
    if dead:
        raise _LevelAborted(dead[0])


class _LevelAborted(Exception):
    pass


async def _still_up(client, target) -> bool:
    """Whether the server answers /v1/models on a NEW connection: a kept-alive one can still be served by a server
    that has stopped listening (the handler of an open connection lives on), which would hide its death."""
    tls = {} if target.url.startswith("https://") else dict(verify=False)
    try:
        async with httpx2.AsyncClient(limits=httpx2.Limits(max_keepalive_connections=0), trust_env=False,
                                      **tls) as fresh:
            await list_models(fresh, target)
        return True
    except LoadError:
        return False


async def run_sweep(target: Target, plan: SweepPlan, on_progress: Callable[[int, int, str], None] | None = None,
                    stop: threading.Event | None = None, result: SweepResult | None = None) -> SweepResult:
    """Probe the server, then run every level in turn, filling `result` (a new one by default) as it goes.
    Problems before any load raise LoadError; a server that stops answering mid-sweep ends the sweep with
    `result.error` set and the finished levels kept."""
    stop = stop or threading.Event()
    result = result if result is not None else SweepResult(target, plan)
    total = plan.requests * len(plan.levels)
    done = [0]
    unit = "concurrency" if plan.mode == "concurrency" else "req/s"
    limits = httpx2.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT)
    tls = {} if target.url.startswith("https://") else dict(verify=False)   # plain HTTP: no TLS context to build
    async with httpx2.AsyncClient(limits=limits, trust_env=False, **tls) as client:
        result.prompt_fit = await probe(client, target)
        for k, level in enumerate(plan.levels):
            if stop.is_set():
                result.stopped = True
                break
            label = f"{unit} {level:g}"

            def on_request(rec, label=label):
                """After each request ends (rec), and once a second while none does (None): the progress bar,
                which is also where a Streamlit page's Stop ends the run."""
                done[0] += rec is not None
                if on_progress:
                    on_progress(done[0], total, label)

            if on_progress:
                on_progress(done[0], total, label)
            lv = LevelResult(plan.mode, level)
            result.levels.append(lv)
            try:
                await _run_level(client, target, plan, result.prompt_fit, lv, k, on_request, stop)
            except _LevelAborted as e:
                result.error = (f"the server at {target.url} stopped answering during {label} after "
                                f"{sum(r.ok for r in lv.records)} of {plan.requests} requests ({e}); the "
                                "levels before it are kept")
                break
            if lv.stopped:
                result.stopped = True
                break
    return result


def measure(target: Target, plan: SweepPlan, on_progress=None, stop: threading.Event | None = None,
            result: SweepResult | None = None) -> SweepResult:
    """`run_sweep` from synchronous code (a CLI, a Streamlit script thread)."""
    return asyncio.run(run_sweep(target, plan, on_progress, stop, result))
