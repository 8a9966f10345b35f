"""The home page's long-prompt case in a real browser: a 4,475-token prompt shows prefill progress chunk by chunk,
and the Stop button ends the run. Starts `streamlit run app.py` headless, drives Chromium over its DevTools
protocol, saves two screenshots (during prefill, after Stop) and prints what it saw.

    python tools/check_stop.py [--out /tmp/app-screenshots] [--tokens 4475]

Exit status 0 when progress was seen and the page said the run was stopped, 1 otherwise.
"""
from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.screenshot import (CHROMIUM_FLAGS, _READY_JS, _devtools_port, free_port, start_server,  # noqa: E402
                              stop_server, wait_healthy)

PARAGRAPH = ("The lighthouse keeper wrote every evening in a thick notebook: the colour of the sea, the ships that "
             "passed, the birds that rested on the rail, and the small repairs the lamp needed before the night. ")


def long_prompt(tokens: int) -> str:
    """Plain text that the default model reads (chat template included) as about `tokens` tokens."""
    from engine import load_model
    tok = load_model().tokenizer
    wrap = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": ""}])))
    ids = tok.encode(PARAGRAPH * (tokens // 20 + 2))[:tokens - wrap]
    return tok.decode(ids)


NETWORK_EVENTS = ("Network.requestWillBeSent", "Network.loadingFailed")   # kept once `Network.enable` is called


class Browser:
    def __init__(self, chromium: str, size: str = "1400,1800") -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="chromium-profile-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile.name}",
                                      f"--window-size={size}", "--remote-debugging-port=0",
                                      "--remote-allow-origins=*", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from websockets.sync.client import connect
        port = _devtools_port(Path(self.profile.name), self.proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t.get("type") == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=256 * 2**20, open_timeout=10).__enter__()
        self.n = 0
        self.events: list[dict] = []          # DevTools events seen while waiting for replies (Network.*, once enabled)
        w, h = (int(v) for v in size.split(","))
        self.call("Emulation.setDeviceMetricsOverride", width=w, height=h, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("method") in NETWORK_EVENTS and len(self.events) < 100_000:
                self.events.append(reply)
            if reply.get("id") == self.n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expression: str):
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"javascript failed: {reply['exceptionDetails'].get('exception', {}).get('description')}")
        return reply["result"].get("value")

    def wait_ready(self, budget_s: float = 120.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < budget_s:
            if self.js(_READY_JS) == "ready":
                return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError("the page did not finish")

    def click(self, label: str) -> bool:
        return bool(self.js(f"(() => {{ const b = [...document.querySelectorAll('button')].find(b => "
                            f"b.innerText.trim().endsWith({json.dumps(label)})); if (b) b.click(); return !!b; }})()"))

    def mouse_click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        """Click into the element, replace its text as a user would (select all, insert), click away to commit."""
        t0 = time.monotonic()
        while not self.js(f"!!document.querySelector({json.dumps(selector)})"):
            if time.monotonic() - t0 > 60:
                raise RuntimeError(f"no {selector} on the page")
            time.sleep(0.3)
        box = self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                      " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        self.mouse_click(*box)
        self.js(f"document.querySelector({json.dumps(selector)}).select()")
        self.call("Input.insertText", text=text)
        self.mouse_click(5, 5)                                   # blur: Streamlit commits a text area on blur

    def shot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.ws.close()
        stop_server(self.proc)
        self.profile.cleanup()


@contextmanager
def app_in_browser(chromium: str, size: str = "1400,1800", port: int | None = None):
    """`streamlit run app.py` on `port` (a free one if None) and a headless Chromium on its home page; both stopped
    after."""
    port = port or free_port()
    server = start_server(port, Path(tempfile.gettempdir()) / f"streamlit-browser-{port}.log")
    browser = None
    try:
        wait_healthy(port, server)
        browser = Browser(chromium, size)
        browser.call("Network.enable")                          # every request the page makes, from the first
        browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
        print(f"home page drawn in {browser.wait_ready(300):.1f} s")
        yield browser
    finally:
        if browser is not None:
            browser.close()
        stop_server(server)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "app-screenshots")
    p.add_argument("--tokens", type=int, default=4475)
    p.add_argument("--port", type=int, default=None, help="the app's port (default: a free one)")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = p.parse_args()
    text = long_prompt(args.tokens)
    with app_in_browser(args.chromium, port=args.port) as browser:
        browser.type_into("textarea", text)
        time.sleep(1.5)
        browser.wait_ready()
        if not browser.click("Generate"):
            raise RuntimeError("no Generate button")
        seen: list[str] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and len(set(seen)) < 3:
            words = browser.js("(() => { const p = document.querySelector('[data-testid=\"stProgress\"]'); "
                               "return p ? p.innerText : ''; })()") or ""
            if words and (not seen or seen[-1] != words):
                seen.append(words)
                print(f"{time.monotonic() - t0:5.1f} s  progress: {words.strip()}")
            time.sleep(0.3)
        eta = browser.js("(() => [...document.querySelectorAll('[data-testid=\"stAlertContentInfo\"]')]"
                         ".map(e => e.innerText).find(t => t.includes('This prompt is')) || '')()")
        print(f"predicted wait shown before Generate: {eta.strip() or 'none'}")
        browser.shot(args.out / "home_prefill_progress.png")
        t_stop = time.monotonic()
        if not browser.click("Stop"):
            raise RuntimeError("no Stop button while generating")
        browser.wait_ready()
        took = time.monotonic() - t_stop
        body = browser.js("document.body.innerText") or ""
        stopped = "stopped with the Stop button" in body
        browser.shot(args.out / "home_after_stop.png")
        print(f"Stop clicked after {t_stop - t0:.1f} s; page idle again {took:.1f} s later; "
              f"'stopped with the Stop button' shown: {stopped}")
        print(f"screenshots: {args.out / 'home_prefill_progress.png'}, {args.out / 'home_after_stop.png'}")
        return 0 if seen and stopped else 1


if __name__ == "__main__":
    raise SystemExit(main())
