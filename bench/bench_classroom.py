"""The classroom load test: start the real app server and drive N real sessions at once, each pressing Generate on
the home page with the default model (prompt "Write a story", 64 new tokens, greedy).

Each session is a light client speaking Streamlit's own protocol over the `/_stcore/stream` websocket (protobuf
`BackMsg` up, `ForwardMsg` down), as the browser does: it runs the page, finds the Generate button's widget id,
clicks it, and watches its reply arrive element by element. Traffic goes to 127.0.0.1 only; the server is stopped
at the end.

Reported: whether every session received its whole reply (the app's "N tokens after …" caption, no error
element, no traceback), the server's peak RSS, p50/p99 TTFT and ITL as each client saw them (and as the server
measured them for each session), and aggregate tokens/s next to one session alone; then the app's own engine server
(the `python -m engine serve` child the app started) driven directly by N concurrent OpenAI-client requests with the
same prompt, and the ratio app / direct (the web tier's cost), all measured in one run: by default three rounds
of (class, then direct), the ratio being the median of the rounds' ratios.

    .venv/bin/python bench/bench_classroom.py --sessions 30
    .venv/bin/python bench/bench_classroom.py --sessions 4 --close-one     # one student closes mid-reply
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamlit.proto.BackMsg_pb2 import BackMsg                      # noqa: E402
from streamlit.proto.ClientState_pb2 import ClientState               # noqa: E402
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg                 # noqa: E402
from streamlit.proto.WidgetStates_pb2 import WidgetState, WidgetStates  # noqa: E402

from tools.screenshot import free_port, start_server, stop_server, wait_healthy  # noqa: E402

GENERATE_LABEL = "Generate"
MAX_NEW_LABEL = "Max new tokens"
LONG_REPLY = 4000                # new tokens asked by the session that closes mid-reply
CLASS_PAGE = "Class"
DONE_CAPTION = re.compile(r"^(\d+) tokens after a ([\d,]+)-token prompt · ([^·]+)")
CURSOR = "▌"
REPLY_HEAD = "**Reply**"
ERROR_FORMAT = 1                 # streamlit.proto.Alert.Format.ERROR


# ============================================================================================ one client
@dataclass
class Reply:
    """What one session saw after pressing Generate."""
    clicked_at: float = 0.0
    updates: list[float] = field(default_factory=list)   # arrival time of each update of the reply's text
    text: str = ""
    tokens: int | None = None      # from the app's caption "N tokens after a M-token prompt · reason"
    reason: str = ""
    finished_at: float | None = None
    errors: list[str] = field(default_factory=list)
    server_ttft_ms: float | None = None
    server_itl_ms: float | None = None
    closed_early: bool = False

    @property
    def ttft_s(self) -> float | None:
        return self.updates[0] - self.clicked_at if self.updates else None

    @property
    def itl_s(self) -> float | None:
        """Mean time between tokens as this client saw them: (last update − first) / (tokens − 1). Streamlit may
        merge updates of one element sent in quick succession, so counting updates would undercount tokens."""
        if not self.updates or not self.tokens or self.tokens < 2:
            return None
        return (self.updates[-1] - self.updates[0]) / (self.tokens - 1)

    @property
    def complete(self) -> bool:
        return self.tokens is not None and not self.errors and "stopped" not in self.reason


def _ms(text: str) -> float | None:
    """A time as the page shows it: "123" under a label that carries the unit, or "123 ms"."""
    m = re.match(r"([\d,.]+)( ms)?$", text.strip())
    return float(m.group(1).replace(",", "")) if m else None


class Client:
    """One browser tab, as far as the server can tell."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws = None
        self.elements: dict[tuple[int, ...], object] = {}
        self.page_hash = ""
        self.pages: dict[str, str] = {}          # url path name -> page script hash
        self.auto_rerun: tuple[str, float] | None = None   # (fragment id, seconds) of an st.fragment(run_every)

    async def __aenter__(self) -> "Client":
        from websockets.asyncio.client import connect
        self.ws = await connect(self.url, subprotocols=["streamlit"], max_size=None, open_timeout=30,
                                ping_interval=None)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def rerun(self, widgets: list[WidgetState] = (), page_hash: str | None = None,
                    fragment_id: str = "") -> None:
        state = ClientState(query_string="", widget_states=WidgetStates(widgets=list(widgets)),
                            page_script_hash=self.page_hash if page_hash is None else page_hash,
                            fragment_id=fragment_id, is_auto_rerun=bool(fragment_id))
        await self.ws.send(BackMsg(rerun_script=state).SerializeToString())

    async def messages(self, timeout_s: float):
        """ForwardMsgs until a script run finishes (yielded too) or `timeout_s` passes (TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no end of script run in time")
            msg = ForwardMsg()
            msg.ParseFromString(await asyncio.wait_for(self.ws.recv(), left))
            kind = msg.WhichOneof("type")
            if kind == "new_session":
                self.elements.clear()
            elif kind == "navigation":
                self.page_hash = msg.navigation.page_script_hash
                self.pages = {p.url_pathname: p.page_script_hash for p in msg.navigation.app_pages}
            elif kind == "auto_rerun":
                self.auto_rerun = (msg.auto_rerun.fragment_id, msg.auto_rerun.interval)
            elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                self.elements[tuple(msg.metadata.delta_path)] = msg.delta.new_element
            yield msg
            if kind == "script_finished" and msg.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                return

    async def run_page(self, timeout_s: float, page_hash: str | None = None,
                       widgets: list[WidgetState] = ()) -> None:
        self.elements.clear()
        await self.rerun(widgets, page_hash)
        async for _ in self.messages(timeout_s):
            pass

    def find(self, kind: str) -> list[object]:
        return [getattr(e, kind) for e in self.elements.values() if e.WhichOneof("type") == kind]

    def errors(self) -> list[str]:
        out = [a.body for a in self.find("alert") if a.format == ERROR_FORMAT]
        out += [f"{x.type}: {x.message}" for x in self.find("exception")]
        return out

    def button_id(self, label: str) -> str:
        ids = [b.id for b in self.find("button") if b.label == label]
        if not ids:
            raise RuntimeError(f"no {label!r} button on the page; errors: {self.errors()}")
        return ids[0]

    def metrics(self) -> dict[str, str]:
        return {m.label: m.body for m in self.find("metric")}


async def student(url: str, ready: list[int], start: asyncio.Event, timeout_s: float,
                  close_after: int | None = None, max_new_tokens: int | None = None) -> Reply:
    """Open the app, wait for the class to be ready, press Generate, read the reply to its end."""
    reply = Reply()
    async with Client(url) as c:
        await c.run_page(timeout_s)
        button = c.button_id(GENERATE_LABEL)
        widgets = [WidgetState(id=button, trigger_value=True)]
        if max_new_tokens is not None:                   # typed into the "Max new tokens" box, as a user would
            box = next(n.id for n in c.find("text_input") if n.label == MAX_NEW_LABEL)   # number fields are text
            widgets.append(WidgetState(id=box, string_value=str(max_new_tokens)))
        ready[0] += 1
        await start.wait()
        reply.clicked_at = time.perf_counter()
        c.elements.clear()
        await c.rerun(widgets)
        slot = None
        async for msg in c.messages(timeout_s):
            if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
                continue
            el, path = msg.delta.new_element, tuple(msg.metadata.delta_path)
            if el.WhichOneof("type") != "markdown":
                continue
            md = el.markdown
            if md.body.startswith(REPLY_HEAD) and (slot is None or path == slot):
                slot = path                          # one paragraph, "**Reply** (model): text", redrawn per token
                reply.updates.append(time.perf_counter())
                reply.text = md.body.split("): ", 1)[-1].removesuffix(CURSOR).rstrip()
                if close_after is not None and len(reply.updates) >= close_after:
                    reply.closed_early = True
                    return reply                     # the browser tab closes mid-reply
        reply.finished_at = time.perf_counter()
        for md in c.find("markdown"):
            m = DONE_CAPTION.match(md.body)
            if m:
                reply.tokens, reply.reason = int(m.group(1)), m.group(3).strip()
        reply.errors = c.errors()
        metrics = c.metrics()
        reply.server_ttft_ms = _ms(metrics.get("TTFT (ms)", metrics.get("TTFT", "")))
        reply.server_itl_ms = _ms(metrics.get("Mean ITL (ms)", metrics.get("Mean ITL", "")))
    return reply


async def class_page_blocks(url: str, timeout_s: float) -> tuple[int, int, int]:
    """(free blocks, total blocks, requests listed) as the Class page shows them right now."""
    async with Client(url) as c:
        await c.run_page(timeout_s)
        await c.run_page(timeout_s, page_hash=c.pages.get(CLASS_PAGE))
        metrics = c.metrics()
        label = next((k for k in metrics if k.startswith("Free KV blocks (of ")), None)
        if label is None:
            raise RuntimeError(f"the Class page shows no block count; errors: {c.errors()}")
        total = int(re.sub(r"\D", "", label))                  # "Free KV blocks (of 1,024)"
        free = int(metrics[label].replace(",", ""))
        in_batch = sum(int(metrics.get(k, "0").replace(",", "")) for k in ("Requests running now",
                                                                           "Waiting in line now"))
        return free, total, in_batch


async def class_watcher(url: str, stop: asyncio.Event, timeout_s: float, opened: asyncio.Event | None = None) -> dict:
    """The teacher's tab: the Class page (open before the class clicks: `opened` is set once it is drawn), its
    live fragment re-run as the browser does (st.fragment(run_every)), while the class generates. Returns how
    often it refreshed, the largest batch it showed, and any errors."""
    seen = dict(refreshes=0, largest_batch=0, errors=[])
    async with Client(url) as c:
        try:
            await c.run_page(timeout_s)
            await c.run_page(timeout_s, page_hash=c.pages.get(CLASS_PAGE))
        finally:
            if opened is not None:
                opened.set()
        seen["errors"] += c.errors()
        if c.auto_rerun is None:
            seen["errors"].append("the Class page has no live fragment")
            return seen
        fragment, interval = c.auto_rerun
        while not stop.is_set():
            await asyncio.sleep(interval)
            await c.rerun(fragment_id=fragment)
            async for _ in c.messages(timeout_s):
                pass
            seen["refreshes"] += 1
            batch = c.metrics().get("Requests running now", "0").replace(",", "")
            seen["largest_batch"] = max(seen["largest_batch"], int(batch) if batch.isdigit() else 0)
            seen["errors"] += [e for e in c.errors() if e not in seen["errors"]]
    return seen


# ============================================================================================ the server
class RssSampler(threading.Thread):
    """Peak resident memory of a process, sampled from /proc every `every_s` seconds."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak, self._halt = pid, every_s, 0, threading.Event()

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def run(self) -> None:
        while not self._halt.wait(self.every_s):
            self.peak = max(self.peak, self.rss())

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return max(self.peak, self.rss())


class BlasSampler(threading.Thread):
    """The engine server's BLAS thread count and the other work it saw, read from its /metrics every `every_s`
    seconds: whether the class and the direct run got the same threads (the ratio's likeliest confounder)."""

    def __init__(self, port: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s, self._halt = f"http://127.0.0.1:{port}/metrics", every_s, threading.Event()
        self.samples: list[tuple[float, float]] = []          # (threads, others' cores)

    def run(self) -> None:
        import urllib.request
        while not self._halt.wait(self.every_s):
            try:
                text = urllib.request.urlopen(self.url, timeout=2).read().decode()
            except OSError:
                continue
            got = {}
            for line in text.splitlines():
                for name in ("inference_lab_blas_threads", "inference_lab_cpu_others_busy_cores"):
                    if line.startswith(name + "{") or line.startswith(name + " "):
                        try:
                            got[name] = float(line.rsplit(" ", 1)[1])
                        except ValueError:
                            pass
            if "inference_lab_blas_threads" in got:
                self.samples.append((got["inference_lab_blas_threads"],
                                     got.get("inference_lab_cpu_others_busy_cores", float("nan"))))

    def stop(self) -> dict:
        self._halt.set()
        self.join(timeout=5)
        t = np.array([s[0] for s in self.samples]) if self.samples else np.array([np.nan])
        o = np.array([s[1] for s in self.samples]) if self.samples else np.array([np.nan])
        return dict(samples=len(self.samples), mean_threads=float(np.nanmean(t)),
                    one_thread_share=float(np.mean(t == 1)), others_busy_mean=float(np.nanmean(o)))


def cpu_seconds(pid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used so far, from /proc (zeros if it is gone)."""
    import os
    if pid is None:
        return 0.0, 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_used(pids: dict[str, int | None], before: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    return {k: tuple(a - b for a, b in zip(cpu_seconds(pid), before[k])) for k, pid in pids.items()}


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q / 100 * len(v) + 0.5)) - 1))] if v else float("nan")


async def drive(url: str, n: int, timeout_s: float, close_one: bool = False,
                max_new_tokens: int | None = None, watch: bool = False) -> tuple[list[Reply], float, dict | None]:
    """N students load the page; when all have, they press Generate together (while, with `watch`, the teacher's
    tab shows the Class page)."""
    start, ready, done = asyncio.Event(), [0], asyncio.Event()
    closer = LONG_REPLY if close_one else None        # the tab that closes asks for a long reply: if closing did
    tasks = [asyncio.create_task(                     # not cancel it, it would still hold blocks afterwards
        student(url, ready, start, timeout_s, close_after=3, max_new_tokens=closer) if i == 0 and close_one else
        student(url, ready, start, timeout_s, max_new_tokens=max_new_tokens)) for i in range(n)]
    opened = asyncio.Event()
    watcher = asyncio.create_task(class_watcher(url, done, timeout_s, opened)) if watch else None
    deadline = time.monotonic() + timeout_s
    while ((ready[0] < n or (watcher is not None and not opened.is_set() and not watcher.done()))
           and time.monotonic() < deadline and not any(t.done() for t in tasks)):
        await asyncio.sleep(0.05)
    start.set()
    replies = await asyncio.gather(*tasks)
    done.set()
    seen = await watcher if watcher is not None else None
    t_end = max((r.finished_at or r.clicked_at) for r in replies)
    t_start = min(r.clicked_at for r in replies)
    return list(replies), t_end - t_start, seen


def summarize(replies: list[Reply], wall_s: float) -> dict:
    served = [r for r in replies if not r.closed_early]
    tokens = sum(r.tokens or 0 for r in served)
    ttft = [r.ttft_s * 1e3 for r in served if r.ttft_s is not None]
    itl = [r.itl_s * 1e3 for r in served if r.itl_s is not None]
    s_ttft = [r.server_ttft_ms for r in served if r.server_ttft_ms is not None]
    s_itl = [r.server_itl_ms for r in served if r.server_itl_ms is not None]
    return dict(sessions=len(replies), complete=sum(r.complete for r in served), closed_early=len(replies) -
                len(served), errors=[e for r in served for e in r.errors], tokens=tokens, wall_s=wall_s,
                aggregate_tokens_per_s=tokens / wall_s if wall_s > 0 else float("nan"),
                ttft_ms_p50=pct(ttft, 50), ttft_ms_p99=pct(ttft, 99), itl_ms_p50=pct(itl, 50),
                itl_ms_p99=pct(itl, 99), server_ttft_ms_p50=pct(s_ttft, 50), server_ttft_ms_p99=pct(s_ttft, 99),
                server_itl_ms_p50=pct(s_itl, 50), server_itl_ms_p99=pct(s_itl, 99),
                same_text=len({r.text for r in served}) == 1, **timeline(served))


def timeline(replies: list[Reply]) -> dict:
    """Where the wall time goes, from the first click: until the last session saw its first token (the start:
    every session's script runs up to its request), the streaming, and from the last token to the last session's
    figures on screen (the end: every session draws its metrics and token table)."""
    if not replies or not all(r.updates for r in replies):
        return {}
    t0 = min(r.clicked_at for r in replies)
    last_first = max(r.updates[0] for r in replies)
    last_token = max(r.updates[-1] for r in replies)
    last_done = max(r.finished_at or r.updates[-1] for r in replies)
    return dict(start_s=last_first - t0, streaming_s=last_token - last_first, end_s=last_done - last_token)


# ============================================================================================ the server, directly
def engine_server_of(app_pid: int) -> tuple[int, int] | None:
    """(pid, port) of the app's embedded `python -m engine serve` child, read from /proc (None if none runs)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == app_pid and b"engine" in args and b"serve" in args and b"--port" in args:
            return int(d.name), int(args[args.index(b"--port") + 1])
    return None


async def direct(port: int, n: int, max_new_tokens: int, timeout_s: float) -> dict:
    """The same engine server driven directly: n concurrent streaming requests with the app's prompt ("Write a
    story" in the chat template, greedy, the same max new tokens), aggregate tokens/s over the wall time."""
    import openai
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=timeout_s,
                                max_retries=0)

    async def one() -> tuple[float, list[float], int]:
        t0, arrivals, count = time.perf_counter(), [], 0
        stream = await client.chat.completions.create(
            model="engine", messages=[{"role": "user", "content": "Write a story"}], max_tokens=max_new_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.perf_counter())
            if chunk.usage is not None:
                count = chunk.usage.completion_tokens
        return t0, arrivals, count

    t0 = time.perf_counter()
    results = await asyncio.gather(*[one() for _ in range(n)])
    wall = time.perf_counter() - t0
    await client.close()
    tokens = sum(r[2] for r in results)
    ttft = [(r[1][0] - r[0]) * 1e3 for r in results if r[1]]
    itl = [(r[1][-1] - r[1][0]) / (r[2] - 1) * 1e3 for r in results if len(r[1]) > 1 and r[2] > 1]
    return dict(requests=n, tokens=tokens, wall_s=wall, aggregate_tokens_per_s=tokens / wall,
                ttft_ms_p50=pct(ttft, 50), ttft_ms_p99=pct(ttft, 99), itl_ms_p50=pct(itl, 50),
                itl_ms_p99=pct(itl, 99))


def run(n: int, timeout_s: float = 600.0, close_one: bool = False, max_new_tokens: int | None = None,
        warm_up: bool = True, log_dir: Path | None = None, direct_too: bool = True, rounds: int = 1) -> dict:
    """Start the app; one session alone (after a warm-up run that also loads the model, unless `warm_up` is
    False), then `rounds` times: N sessions at once, then the engine server directly; then a look at the Class
    page; stop the app. Details are the first round's; app / direct is the median of the rounds' ratios (one
    direct run alone moved by ±15% between runs on this shared machine). Returns the figures."""
    port = free_port()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="classroom-"))
    proc = start_server(port, log_dir / "streamlit.log")
    sampler = RssSampler(proc.pid)
    try:
        wait_healthy(port, proc, timeout_s=120)
        sampler.start()
        url = f"ws://127.0.0.1:{port}/_stcore/stream"
        alone, alone_s, _ = asyncio.run(drive(url, 1, timeout_s, max_new_tokens=max_new_tokens))  # loads the model
        if warm_up:
            alone, alone_s, _ = asyncio.run(drive(url, 1, timeout_s, max_new_tokens=max_new_tokens))  # model warm
        engine = engine_server_of(proc.pid)
        engine_sampler = RssSampler(engine[0]) if engine else None
        if engine_sampler is not None:
            engine_sampler.start()
        pids = dict(app=proc.pid, engine_server=engine[0] if engine else None)
        if direct_too and engine and warm_up:                    # the server's first class-size batch costs more
            asyncio.run(direct(engine[1], n, 8, timeout_s))      # (first touch of its larger buffers) in whichever
        per_round, blas_rounds = [], []                          # phase meets it: warm both. (class, direct) tok/s
        for r in range(rounds):                                  # the class, then the same server directly
            cpu0, procs0 = time.process_time(), {k: cpu_seconds(p) for k, p in pids.items()}
            blas = BlasSampler(engine[1]) if engine else None
            if blas is not None:
                blas.start()
            got = asyncio.run(drive(url, n, timeout_s, close_one, max_new_tokens, watch=True))
            class_blas = blas.stop() if blas is not None else None
            cpu = (time.process_time() - cpu0, cpu_used(pids, procs0))   # this bench's clients, the processes
            if r == 0:
                (many, many_s, watched), (clients_cpu_s, class_cpu) = got, cpu
            cpu0, procs0 = time.process_time(), {k: cpu_seconds(p) for k, p in pids.items()}
            blas = BlasSampler(engine[1]) if engine and direct_too else None
            if blas is not None:
                blas.start()
            went = (asyncio.run(direct(engine[1], n, max_new_tokens or 64, timeout_s))
                    if direct_too and engine else None)                # the same server, no app in between
            direct_blas = blas.stop() if blas is not None else None
            blas_rounds.append(dict(class_=class_blas, direct=direct_blas))
            if r == 0:
                straight, direct_cpu_s, direct_cpu = went, time.process_time() - cpu0, cpu_used(pids, procs0)
            per_round.append((summarize(got[0], got[1])["aggregate_tokens_per_s"],
                              went["aggregate_tokens_per_s"] if went else float("nan")))
        free, total, listed = asyncio.run(class_page_blocks(url, timeout_s))
    finally:
        peak = sampler.stop() if sampler.is_alive() else sampler.rss()
        engine_peak = engine_sampler.stop() if engine_sampler is not None else 0
        stop_server(proc)
    one, load = summarize(alone, alone_s), summarize(many, many_s)
    return dict(one_session=one, class_=load, class_page=watched, server_peak_rss_bytes=peak, free_blocks_after=free,
                clients_cpu_s=clients_cpu_s, direct_clients_cpu_s=direct_cpu_s, class_cpu=class_cpu,
                direct_cpu=direct_cpu,
                total_blocks=total, requests_left=listed, log=str(log_dir / "streamlit.log"),
                speedup_vs_one=load["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"],
                engine_server_peak_rss_bytes=engine_peak, direct=straight,
                rounds=per_round, blas=blas_rounds, app_vs_direct=float(np.median([a / b for a, b in per_round])))


def fmt_cpu(user_sys: tuple[float, float]) -> str:
    return f"{user_sys[0]:.1f} + {user_sys[1]:.1f} s"


def report(r: dict) -> str:
    one, cls = r["one_session"], r["class_"]
    lines = [
        f"sessions: {cls['sessions']} ({cls['closed_early']} closed mid-reply), whole replies: {cls['complete']} "
        f"of {cls['sessions'] - cls['closed_early']}, errors/tracebacks: {len(cls['errors'])}",
        f"peak RSS: app (Streamlit) {r['server_peak_rss_bytes'] / 2**20:,.0f} MiB, its engine server "
        f"{r['engine_server_peak_rss_bytes'] / 2**20:,.0f} MiB",
        f"KV blocks free after the class: {r['free_blocks_after']} of {r['total_blocks']} "
        f"(requests left in the batch: {r['requests_left']})",
        f"one session alone: {one['tokens']} tokens in {one['wall_s']:.2f} s = "
        f"{one['aggregate_tokens_per_s']:.1f} tokens/s; TTFT {one['ttft_ms_p50']:.0f} ms, ITL {one['itl_ms_p50']:.1f} ms",
        f"{cls['sessions']} sessions at once: {cls['tokens']} tokens in {cls['wall_s']:.2f} s = "
        f"{cls['aggregate_tokens_per_s']:.1f} tokens/s ({r['speedup_vs_one']:.2f}x one session alone)",
        f"TTFT as clients saw it: p50 {cls['ttft_ms_p50']:,.0f} ms, p99 {cls['ttft_ms_p99']:,.0f} ms "
        f"(server-measured p50 {cls['server_ttft_ms_p50']:,.0f}, p99 {cls['server_ttft_ms_p99']:,.0f})",
        f"ITL as clients saw it: p50 {cls['itl_ms_p50']:,.1f} ms, p99 {cls['itl_ms_p99']:,.1f} ms "
        f"(server-measured p50 {cls['server_itl_ms_p50']:,.1f}, p99 {cls['server_itl_ms_p99']:,.1f})",
        f"all replies identical (greedy, same prompt): {cls['same_text']}",
        *([f"from the first click: {cls['start_s']:.2f} s until every session had its first token, "
           f"{cls['streaming_s']:.2f} s more until the last token, then {cls['end_s']:.2f} s until every session "
           f"showed its figures"] if "start_s" in cls else []),
        *([f"the same engine server driven directly, {r['direct']['requests']} concurrent requests: "
           f"{r['direct']['tokens']} tokens in {r['direct']['wall_s']:.2f} s = "
           f"{r['direct']['aggregate_tokens_per_s']:.1f} tokens/s (TTFT p50 {r['direct']['ttft_ms_p50']:,.0f} ms, "
           f"ITL p50 {r['direct']['itl_ms_p50']:,.1f} ms)",
           *(["rounds (class tokens/s / direct tokens/s): " + ", ".join(
               f"{a:.1f} / {b:.1f} = {a / b * 100:.0f}%" for a, b in r["rounds"])] if len(r["rounds"]) > 1 else []),
           f"the app delivers {r['app_vs_direct'] * 100:.0f}% of the server's aggregate tokens/s"
           f"{' (median of the rounds)' if len(r['rounds']) > 1 else ''} (goal: >= 90%)"]
          if r.get("direct") else ["the engine server was not driven directly (not found)"]),
        f"this bench's own clients used {r['clients_cpu_s']:.1f} s of CPU during the class (websocket sessions "
        f"reading every screen update) and {r['direct_clients_cpu_s']:.1f} s driving the server directly: on "
        f"these same cores, where a real class's browsers run on the students' machines",
        *([f"CPU seconds (user + system) during the class: app {fmt_cpu(r['class_cpu']['app'])}, engine server "
           f"{fmt_cpu(r['class_cpu']['engine_server'])}; during the direct run: app "
           f"{fmt_cpu(r['direct_cpu']['app'])}, engine server {fmt_cpu(r['direct_cpu']['engine_server'])}"]
          if r.get("class_cpu") else []),
        *([f"engine BLAS threads, round {i + 1} (mean threads, share of samples at one thread, other work's "
           f"cores): class {b['class_']['mean_threads']:.2f}, {b['class_']['one_thread_share']:.0%}, "
           f"{b['class_']['others_busy_mean']:.2f}; direct {b['direct']['mean_threads']:.2f}, "
           f"{b['direct']['one_thread_share']:.0%}, {b['direct']['others_busy_mean']:.2f}"
           for i, b in enumerate(r.get("blas", [])) if b.get("class_") and b.get("direct")]),
        f"the Class page (teacher's tab) refreshed {r['class_page']['refreshes']} times during the class, showed up "
        f"to {r['class_page']['largest_batch']} requests in one batch, errors: {len(r['class_page']['errors'])}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for one phase")
    ap.add_argument("--close-one", action="store_true", help="one session closes its tab after 3 tokens")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="typed into the box (default: the app's, 64)")
    ap.add_argument("--rounds", type=int, default=3, help="class + direct pairs; the ratio is their median")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # `timeout`/kill: still stop the server (finally)
    try:
        import os
        load = f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    except OSError:
        load = ""
    r = run(args.sessions, args.timeout, args.close_one, args.max_new_tokens, rounds=max(1, args.rounds))
    print(json.dumps(r, indent=1, default=str) if args.json else report(r))
    if load:
        print(load)
    ok = r["class_"]["complete"] == r["class_"]["sessions"] - r["class_"]["closed_early"] and not r["class_"]["errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
