"""Fault bench: `python -m engine serve` probed the way trusted servers are (bad inputs, a huge prompt next to live
streams, clients that hang up or send slowly), on loopback only; it starts its own server and stops it.

    python bench/bench_faults.py                 # 2 rounds: ~2 minutes on a quiet 2-core machine, 5 on a busy one
    python bench/bench_faults.py --json out.json

Figures (acceptance of issue 29 in brackets):
  corpus        every bad request of CORPUS: how many got a 500, how many an error body that is not OpenAI's JSON
                error shape  [0 and 0]
  huge prompt   a 20 MB prompt (and 40 MB, and a 7 MB one under the body limit) sent while 4 streams decode: its
                answer time [413/400 in < 1 s] and the 4 streams' worst inter-token gap, minus the same streams'
                worst gap without it (rounds alternate)  [< 250 ms]
  clients       20 streams that hang up after 2 tokens, 5 senders that send their body slowly and 5 that stop half
                way: all answered or dropped, and afterwards no request left and every KV block free
  RSS           the server's resident memory after each round of all the above (the first round touches the KV
                pool's pages; a leak grows it round after round)  [last within 10% of the first]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.process import EngineServerProcess  # noqa: E402

TIMEOUT_S = 60.0
STREAM_TOKENS = 32


# ============================================================================================ raw HTTP
def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = TIMEOUT_S) -> tuple[int, bytes, float]:
    """Send `head` + `body` on a fresh socket (the body from a thread, so an early answer is seen at once);
    -> (status, response body, seconds to the status line). Status 0: the connection ended without an answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.perf_counter()

    def send():
        try:
            s.sendall(head + body)
        except OSError:                    # the server answered and closed before taking all of it: fine
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    data, first = b"", None
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            if first is None:
                first = time.perf_counter() - t0
            data += chunk
        header, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(ln.split(b":", 1)[1]) for ln in header.split(b"\r\n")
                       if ln.lower().startswith(b"content-length:")), None)
        while length is not None and len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    except OSError:
        header, rest = data, b""
    finally:
        s.close()
    try:
        status = int(header.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    return status, rest, first if first is not None else float("nan")


def http_head(method: str, path: str, port: int, length: int | None, extra: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
             "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post(port: int, body: bytes, path: str = "/v1/completions", extra: dict | None = None):
    return raw_request(port, http_head("POST", path, port, len(body), extra), body)


# ============================================================================================ the corpus
def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def corpus() -> list[tuple[str, str, bytes]]:
    """(name, path, body) of bad requests: the findings of issue 29 and the usual malformed inputs."""
    j = lambda o: json.dumps(o).encode()                                   # noqa: E731
    comp, chat = "/v1/completions", "/v1/chat/completions"
    cases = [
        ("surrogate in prompt", comp, j({"prompt": "Hi \ud800", "max_tokens": 2})),
        ("surrogate in chat content", chat, j({"messages": [{"role": "user", "content": "\udfff"}]})),
        ("surrogate in model name", comp, j({"model": "m\ud800", "prompt": "Hi"})),
        ("surrogate in a key", comp, j({"prompt": "Hi", "\ud800": 1})),
        ("JSON nested 100,000 deep", comp, deep(100_000)),
        ("JSON nested 1,000 deep in a field", comp, b'{"prompt": "Hi", "x": ' + deep(1000) + b"}"),
        ("empty body", comp, b""), ("truncated JSON", comp, b'{"prompt": '), ("not UTF-8", comp, b"\xff\xfe\xfd"),
        ("a list body", comp, b"[1, 2]"), ("a string body", comp, b'"hello"'), ("null", comp, b"null"),
        ("5,000-digit number", comp, b'{"prompt": "Hi", "max_tokens": 1' + b"0" * 5000 + b"}"),
        ("NaN temperature", comp, b'{"prompt": "Hi", "temperature": NaN}'),
        ("huge integer temperature", comp, j({"prompt": "Hi", "temperature": 10 ** 400})),
        ("Infinity top_p", comp, b'{"prompt": "Hi", "top_p": Infinity}'),
        ("negative max_tokens", comp, j({"prompt": "Hi", "max_tokens": -1})),
        ("max_tokens 1e30", comp, j({"prompt": "Hi", "max_tokens": 10 ** 30})),
        ("string max_tokens", comp, j({"prompt": "Hi", "max_tokens": "5"})),
        ("prompt a dict", comp, j({"prompt": {"a": 1}})), ("prompt ids out of range", comp, j({"prompt": [10 ** 9]})),
        ("prompt of booleans", comp, j({"prompt": [True, False]})), ("no prompt", comp, j({"max_tokens": 2})),
        ("empty prompt", comp, j({"prompt": ""})), ("empty id list", comp, j({"prompt": []})),
        ("a batch of prompts", comp, j({"prompt": ["a", "b"]})), ("stop not strings", comp, j({"prompt": "Hi", "stop": [1]})),
        ("stop empty string", comp, j({"prompt": "Hi", "stop": [""]})),
        ("model a list", comp, j({"prompt": "Hi", "model": ["x"]})), ("unknown model", comp, j({"prompt": "Hi", "model": "gpt-9"})),
        ("stream a string", comp, j({"prompt": "Hi", "stream": "yes"})),
        ("stream_options a string", comp, j({"prompt": "Hi", "stream_options": "yes"})),
        ("user a number", comp, j({"prompt": "Hi", "user": 7})), ("tools", chat, j({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})),
        ("messages a string", chat, j({"messages": "hi"})), ("messages empty", chat, j({"messages": []})),
        ("message without content", chat, j({"messages": [{"role": "user"}]})),
        ("message role a number", chat, j({"messages": [{"role": 1, "content": "x"}]})),
        ("content parts not text", chat, j({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
        ("a context-length prompt", comp, j({"prompt": [1] * 9000, "max_tokens": 8})),
        ("8 MB of spaces (over the body limit)", comp, j({"prompt": " " * (9 * 2 ** 20)})),
        ("5 MB prompt (under the body limit)", comp, j({"prompt": "ab " * (5 * 2 ** 20 // 3)})),
    ]
    return cases


def is_openai_error(body: bytes) -> bool:
    try:
        e = json.loads(body)["error"]
        return isinstance(e, dict) and {"message", "type", "param", "code"} <= set(e) and bool(e["message"])
    except (ValueError, KeyError, TypeError):
        return False


def run_corpus(port: int) -> dict:
    statuses, bad_bodies, five_hundreds = {}, [], []
    routes = [("GET", "/v1/nothing", b""), ("DELETE", "/v1/completions", b""), ("GET", "/v1/completions", b"")]
    for name, path, body in corpus():
        status, resp, _ = post(port, body, path)
        statuses[name] = status
        if status >= 500 or status == 0:
            five_hundreds.append(name)
        if status >= 400 and not is_openai_error(resp):
            bad_bodies.append(name)
    for method, path, body in routes:
        status, resp, _ = raw_request(port, http_head(method, path, port, len(body)), body)
        statuses[f"{method} {path}"] = status
        if status >= 400 and not is_openai_error(resp):
            bad_bodies.append(f"{method} {path}")
    return {"requests": len(statuses), "status_500_or_none": five_hundreds, "non_json_error_bodies": bad_bodies,
            "statuses": statuses}


# ============================================================================================ streams
def stream(port: int, prompt: str, tokens: int, arrivals: list[float], hang_up_after: int | None = None) -> None:
    """One streaming completion; the arrival time of every event with text goes into `arrivals`."""
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    try:
        s.sendall(http_head("POST", "/v1/completions", port, len(body)) + body)
        f = s.makefile("rb")
        for line in f:
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
                if hang_up_after is not None and len(arrivals) >= hang_up_after:
                    return
            elif line.startswith(b"data: [DONE]"):
                return
    except OSError:
        pass
    finally:
        s.close()


def worst_gap(arrivals: list[list[float]], start: float = 0.0) -> float:
    gaps = [b - a for xs in arrivals for a, b in zip(xs, xs[1:]) if a >= start]
    return max(gaps) if gaps else float("nan")


def streams_with(port: int, fault=None, n: int = 4) -> dict:
    """n streams; once each has its first tokens, run `fault()` (if any) and time it; their worst gap after that,
    and the worst gap that overlaps the time the fault was being answered."""
    arrivals = [[] for _ in range(n)]
    threads = [threading.Thread(target=stream, args=(port, f"Story {i}: once upon a time", STREAM_TOKENS, arrivals[i]),
                                daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + TIMEOUT_S
    while min(len(a) for a in arrivals) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.perf_counter()
    out = {}
    if fault is not None:
        out = fault()
    answered = time.perf_counter()
    for t in threads:
        t.join(TIMEOUT_S)
    out["worst_gap_s"] = worst_gap(arrivals, start)
    overlapping = [b - a for xs in arrivals for a, b in zip(xs, xs[1:]) if b >= start and a <= answered]
    out["gap_during_s"] = max(overlapping, default=float("nan"))
    out["tokens"] = sum(len(a) for a in arrivals)
    return out


def huge_prompt(port: int, megabytes: float) -> dict:
    body = json.dumps({"prompt": "x" * int(megabytes * 1e6), "max_tokens": 8}).encode()
    status, resp, seconds = post(port, body)
    return {"status": status, "answer_s": seconds, "json": is_openai_error(resp)}


SIZES_MB = (20.0, 40.0, 7.0)


def run_huge(port: int) -> dict:
    """Alternately: 4 streams alone, 4 streams + a 20 MB prompt (then 40 MB, then 7 MB, under the body limit)."""
    alone, faulted = [], []
    for mb in SIZES_MB:
        alone.append(streams_with(port)["worst_gap_s"])
        faulted.append({"megabytes": mb, **streams_with(port, lambda: huge_prompt(port, mb))})
    return {"alone_worst_gap_s": alone, "with_prompt": faulted}


# ============================================================================================ rude clients
def slow_sender(port: int, finish: bool, results: list) -> None:
    body = json.dumps({"prompt": "Hello there", "max_tokens": 4}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    try:
        s.sendall(http_head("POST", "/v1/completions", port, len(body)))
        for i in range(0, len(body) if finish else len(body) // 2, 4):
            s.sendall(body[i:i + 4])
            time.sleep(0.05)
        if not finish:
            results.append("dropped")
            return
        results.append(s.recv(65536).split(b" ", 2)[1].decode())
    except OSError as e:
        results.append(f"error {e}")
    finally:
        s.close()


def run_rude_clients(port: int) -> dict:
    results: list = []
    threads = [threading.Thread(target=stream, args=(port, f"Tale {i}", 400, [], 2), daemon=True) for i in range(20)]
    threads += [threading.Thread(target=slow_sender, args=(port, i < 5, results), daemon=True) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    deadline = time.monotonic() + 30
    while True:                                  # hung-up requests are cancelled and their blocks freed
        with_batch = json.loads(raw_request(port, http_head("GET", "/v1/batch", port, None))[1])
        if (not with_batch["requests"] and with_batch["free_blocks"] == with_batch["num_blocks"]) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {"slow_senders": sorted(results), "requests_left": len(with_batch["requests"]),
            "blocks_free": with_batch["free_blocks"], "blocks": with_batch["num_blocks"]}


# ============================================================================================ main
def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def one_round(port: int) -> dict:
    out = {}
    for name, part in (("corpus", run_corpus), ("huge_prompt", run_huge), ("rude_clients", run_rude_clients)):
        t0 = time.perf_counter()
        out[name] = part(port)
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def merge(rounds: list[dict]) -> dict:
    """The rounds' figures together: corpus failures of any round, every huge-prompt run, the last state."""
    c = {"requests": sum(r["corpus"]["requests"] for r in rounds),
         "status_500_or_none": sorted({n for r in rounds for n in r["corpus"]["status_500_or_none"]}),
         "non_json_error_bodies": sorted({n for r in rounds for n in r["corpus"]["non_json_error_bodies"]})}
    alone = [g for r in rounds for g in r["huge_prompt"]["alone_worst_gap_s"]]
    faulted = [f for r in rounds for f in r["huge_prompt"]["with_prompt"]]
    base = statistics.median(alone)
    h = {"alone_worst_gap_s": alone, "with_prompt": faulted, "baseline_worst_gap_s": base,
         "worst_gap_increase_s": statistics.median(f["worst_gap_s"] for f in faulted) - base,
         "slowest_answer_s": max(f["answer_s"] for f in faulted)}
    return {"corpus": c, "huge_prompt": h, "rude_clients": rounds[-1]["rude_clients"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of the whole probe (default 2, at least 2); RSS "
                                                         "is compared between the end of the first and of the last")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--blas-threads", default="1", help="BLAS threads of the server (default 1: on a busy machine "
                                                       "more threads fight over the cores; '' keeps the default)")
    args = p.parse_args(argv)
    if args.blas_threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = args.blas_threads            # the server child inherits them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))        # `timeout`, Ctrl-C: the server is stopped too
    rounds, rss = [], []
    with EngineServerProcess() as srv:
        port, pid = srv.port, srv.proc.pid
        for i in range(max(2, args.rounds)):
            t0 = time.perf_counter()
            rounds.append(one_round(port))
            rss.append(rss_bytes(pid))
            print(f"round {i + 1}: {time.perf_counter() - t0:.0f} s, server RSS {rss[-1] / 1e6:.0f} MB", flush=True)
        healthy = srv.healthy()
    out = {**merge(rounds), "rss_mb_per_round": [r / 1e6 for r in rss], "health_after": healthy}
    rss0, rss1 = rss[0], rss[-1]
    c, h, rude = out["corpus"], out["huge_prompt"], out["rude_clients"]
    checks = {
        "corpus: no 500": not c["status_500_or_none"],
        "corpus: every error body is OpenAI's JSON shape": not c["non_json_error_bodies"],
        "huge prompt answered 413/400 in < 1 s": all(f["status"] in (400, 413) and f["answer_s"] < 1.0
                                                     for f in h["with_prompt"]),
        "streams' worst gap grows < 250 ms": h["worst_gap_increase_s"] < 0.25,
        "rude clients: no request left, every block free": rude["requests_left"] == 0
                                                           and rude["blocks_free"] == rude["blocks"],
        "RSS after the last round within 10% of the first": abs(rss1 - rss0) <= 0.10 * rss0,
    }
    print(f"corpus: {c['requests']} bad requests, {len(c['status_500_or_none'])} answered 500 (or not at all), "
          f"{len(c['non_json_error_bodies'])} with a non-JSON error body {c['non_json_error_bodies'] or ''}")
    for f in h["with_prompt"]:
        print(f"  {f['megabytes']:g} MB prompt: {f['status']} in {f['answer_s'] * 1000:.0f} ms; 4 streams' worst gap "
              f"{f['worst_gap_s'] * 1000:.0f} ms (while it was answered {f['gap_during_s'] * 1000:.0f} ms)")
    print(f"  streams alone, worst gap per round: {', '.join(f'{g * 1000:.0f}' for g in h['alone_worst_gap_s'])} ms "
          f"(median {h['baseline_worst_gap_s'] * 1000:.0f}); median increase with the prompt "
          f"{h['worst_gap_increase_s'] * 1000:+.0f} ms")
    print(f"rude clients: slow senders {rude['slow_senders']}; afterwards {rude['requests_left']} requests, "
          f"{rude['blocks_free']}/{rude['blocks']} blocks free")
    print(f"RSS after each round: {', '.join(f'{r:.0f}' for r in out['rss_mb_per_round'])} MB "
          f"(last vs first {(rss1 / rss0 - 1) * 100:+.1f}%)")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    out["checks"] = checks
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
