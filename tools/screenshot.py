"""Screenshots of the running app, for developers: starts `streamlit run app.py` headless on localhost, waits for
it, captures each page with headless Chromium, then stops the server.

    python tools/screenshot.py                          # the home page -> /tmp/app-screenshots/home.png
    python tools/screenshot.py / /KV_cache --out shots  # several pages (URL paths as Streamlit names them)

    python tools/screenshot.py / --click Generate       # press a button first, shoot the result

A screenshot shows the page as first drawn unless --click says otherwise. Chromium is `/usr/bin/chromium` unless --chromium.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log_path: Path) -> subprocess.Popen:
    """`streamlit run app.py` in the repository root, output to `log_path`."""
    env = {**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    log = open(log_path, "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    url = f"http://127.0.0.1:{port}/_stcore/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"streamlit did not answer on port {port} within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]

# Streamlit draws the page with JavaScript over a websocket after the HTML has loaded, so Chromium's own
# `--screenshot` (taken at the load event; `--virtual-time-budget` does not wait for websocket traffic) shows a
# blank page. Instead we drive Chromium over its DevTools protocol and wait until the app says it is done.
_READY_JS = """(() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return "no-app";
  const state = app.getAttribute("data-test-script-state");
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  const blocks = document.querySelectorAll('[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]');
  return (state === "notRunning" && !running && blocks.length > 0) ? "ready" : "state:" + state;
})()"""


def screenshot(chromium: str, url: str, out: Path, budget_ms: int, size: str = "1400,2000",
               settle_s: float = 1.0, click: tuple[str, ...] = ()) -> None:
    """One PNG of `url` once the Streamlit script has finished (each wait at most `budget_ms`), with a throwaway
    profile; `click`: labels of buttons to press first, in order (each followed by a wait)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in size.split(","))
    with tempfile.TemporaryDirectory(prefix="chromium-profile-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                                 "--remote-debugging-port=0", "--remote-allow-origins=*", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = _devtools_port(Path(profile), proc)
            png = _capture(port, url, width, height, budget_ms / 1000, settle_s, list(click))
        finally:
            stop_server(proc)          # same terminate-then-kill as for the Streamlit server
    out.write_bytes(png)


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """Chromium writes the port it chose for --remote-debugging-port=0 into <profile>/DevToolsActivePort."""
    deadline = time.monotonic() + timeout_s
    f = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with status {proc.returncode}")
        if f.is_file() and f.read_text().strip():
            return int(f.read_text().split()[0])
        time.sleep(0.1)
    raise RuntimeError("chromium did not open its DevTools port")


def _capture(port: int, url: str, width: int, height: int, budget_s: float, settle_s: float,
             click: list[str]) -> bytes:
    import base64
    import json
    from websockets.sync.client import connect           # websockets ships with streamlit

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
        page = next(t for t in json.loads(r.read()) if t.get("type") == "page")
    with connect(page["webSocketDebuggerUrl"], max_size=256 * 2**20, open_timeout=10) as ws:
        counter = [0]

        def call(method: str, **params) -> dict:
            counter[0] += 1
            ws.send(json.dumps({"id": counter[0], "method": method, "params": params}))
            while True:                                   # skip events until our reply arrives
                reply = json.loads(ws.recv(timeout=30))
                if reply.get("id") == counter[0]:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})

        call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        def wait_until_done(what: str) -> None:
            deadline, ready_since, state = time.monotonic() + budget_s, None, ""
            while time.monotonic() < deadline:
                state = call("Runtime.evaluate", expression=_READY_JS, returnByValue=True)["result"].get("value")
                if state == "ready":
                    ready_since = ready_since or time.monotonic()
                    if time.monotonic() - ready_since >= settle_s:    # still done after a moment: nothing reran
                        return
                else:
                    ready_since = None
                time.sleep(0.2)
            print(f"warning: {what} not finished after {budget_s:.0f} s ({state}); capturing anyway", file=sys.stderr)

        call("Page.navigate", url=url)
        wait_until_done(url)
        for label in click:
            js = (f"(() => {{ const b = [...document.querySelectorAll('button')]"
                  f".find(b => b.innerText.trim().endsWith({json.dumps(label)})); if (b) b.click(); return !!b; }})()")
            if not call("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value"):
                print(f"warning: no button {label!r} on {url}", file=sys.stderr)
            time.sleep(0.5)
            wait_until_done(f"{url} after clicking {label!r}")
        shot = call("Page.captureScreenshot", format="png")
    return base64.b64decode(shot["data"])


def out_name(path: str) -> str:
    stem = path.strip("/").replace("/", "_")
    return (stem or "home") + ".png"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", default=["/"], help="URL paths of pages, e.g. / or /KV_cache")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "app-screenshots",
                   help="folder for the PNG files (default: /tmp/app-screenshots)")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--budget-ms", type=int, default=60000, help="longest wait for a page to finish drawing")
    p.add_argument("--size", default="1400,2000", help="window size WIDTH,HEIGHT")
    p.add_argument("--click", action="append", default=[], metavar="LABEL",
                   help="press the button with this text before the screenshot (repeatable)")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = p.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"error: chromium not found at {args.chromium}", file=sys.stderr)
        return 2
    port = args.port or free_port()
    log_path = Path(tempfile.gettempdir()) / f"streamlit-screenshot-{port}.log"
    proc = start_server(port, log_path)
    try:
        wait_healthy(port, proc)
        for path in args.paths:
            url = f"http://127.0.0.1:{port}/{path.lstrip('/')}"
            out = args.out / out_name(path)
            screenshot(args.chromium, url, out, args.budget_ms, args.size, click=tuple(args.click))
            print(out)
    except (RuntimeError, OSError, StopIteration) as e:
        print(f"error: {e}\n--- server log ({log_path}) ---\n{log_path.read_text(errors='replace')[-3000:]}",
              file=sys.stderr)
        return 1
    finally:
        stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
