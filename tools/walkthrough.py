"""A teacher's walkthrough in a real browser: every page at 1366×768 (a projector), with large text off and on, first
as drawn and again after pressing its main (primary) button. It reports what a class would notice first:

- an error box or a traceback on the page;
- a metric whose value is cut ("25.3 / 180…") or runs out of its column;
- a chart with nothing drawn in it;
- a table wider than the page (its last columns hidden behind a scroll bar);
- a chart title (or an axis or colour-bar title) cut by the chart's edge or lying under its legend;
- a source named by a bare code ("003 Detail 18", "reference 001") instead of in words;
- a request to any host but this machine (a font, an icon, a script: a classroom without internet loses it), or
  a request that failed.

(Whether a headline number matches the same quantity in its page's table is checked by the AppTest-level test,
tests/ui/test_walkthrough.py: Streamlit draws tables on a canvas, out of a browser script's reach.)

    python tools/walkthrough.py [--out /tmp/walkthrough] [--full] [/Walkthrough /Capacity_planner ...]

Starts `streamlit run app.py` headless on a free port, drives Chromium over its DevTools protocol, saves one
screenshot per page, text size and state, prints every problem and exits with status 1 when there was any.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.check_stop import Browser, app_in_browser  # noqa: E402
from tools.shoot_pages import wait_charts  # noqa: E402

WIDTH, HEIGHT = 1366, 768
SIZE = f"{WIDTH},{HEIGHT}"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
LARGE_TEXT_LABEL = "Large text"

_PROBLEMS_JS = r"""(() => {
  const out = [];
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const scope = [main, document.querySelector('[data-testid="stSidebar"]')].filter(Boolean);
  for (const root of scope) {
    root.querySelectorAll('[data-testid="stAlertContentError"]').forEach(e =>
      out.push('error box: ' + e.innerText.trim().slice(0, 160)));
    root.querySelectorAll('[data-testid="stException"]').forEach(e =>
      out.push('traceback: ' + e.innerText.trim().slice(0, 160)));
  }
  main.querySelectorAll('[data-testid="stMetricValue"]').forEach(m => {
    const col = m.closest('[data-testid="stColumn"]') || m.closest('[data-testid="stMetric"]');
    const right = col ? col.getBoundingClientRect().right : Infinity;
    const cut = [m, ...m.querySelectorAll('*')].some(e =>
      e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible');
    const spills = [m, ...m.querySelectorAll('*')].some(e => e.getBoundingClientRect().right > right + 1);
    if (cut || spills) out.push('metric value cut: ' + m.innerText.trim().slice(0, 80));
  });
  main.querySelectorAll('[data-testid="stPlotlyChart"]').forEach((b, i) => {
    const gd = b.querySelector('.js-plotly-plot');
    const title = gd && gd.layout && gd.layout.title ? (gd.layout.title.text || gd.layout.title) : '';
    const marks = b.querySelectorAll('.cartesianlayer .plot path, .cartesianlayer .plot image, '
      + '.cartesianlayer .plot text, .pielayer path, .polarlayer .plot path, .imagelayer image');
    const filled = v => v && (v.length > 0 || (v.bdata && v.bdata.length > 0));
    const drawn = [...marks].some(e => e.tagName !== 'path' || (e.getAttribute('d') || '').length > 2)
      || (gd && gd.data && gd.data.some(t => ['x', 'y', 'z', 'values', 'base'].some(k => filled(t[k]))));
    if (!drawn) out.push('empty chart #' + (i + 1) + (title ? ' "' + String(title).slice(0, 60) + '"' : ''));
  });
  const meets = (a, b) => a.left < b.right - 2 && b.left < a.right - 2 && a.top < b.bottom - 2
    && b.top < a.bottom - 2;                              // overlap by more than 2 px (a touch is no harm)
  main.querySelectorAll('[data-testid="stPlotlyChart"]').forEach(b => {
    const svg = b.querySelector('svg.main-svg');
    if (!svg) return;
    const s = svg.getBoundingClientRect(), c = b.getBoundingClientRect();
    const box = {left: Math.max(s.left, c.left), right: Math.min(s.right, c.right), top: Math.max(s.top, c.top),
                 bottom: Math.min(s.bottom, c.bottom)};
    const legend = b.querySelector('.infolayer .legend');
    const lr = legend ? legend.getBoundingClientRect() : null;
    // the chart's title, each axis's title (xtitle, x2title, ...) and a colour bar's title (cbtitle)
    b.querySelectorAll('.infolayer text[class$="title"]').forEach(t => {
      const text = t.textContent.trim(), r = t.getBoundingClientRect();
      if (!text || r.width === 0) return;
      const out_ = r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1;
      const under = lr && lr.width > 0 && !legend.contains(t) && meets(r, lr);
      if (out_ || under) out.push('chart title cut: "' + text.slice(0, 60) + '"'
        + (out_ ? ' runs past the chart\'s edge' : ' lies under the legend'));
    });
  });
  main.querySelectorAll('[data-testid="stPageLink"] a, [data-testid="stPageLink-NavLink"]').forEach(a => {
    const cut = [a, ...a.querySelectorAll('*')].some(e =>
      e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible');
    if (cut) out.push('link text cut: ' + a.innerText.trim().slice(0, 80));
  });
  const side = document.querySelector('[data-testid="stSidebar"]');
  if (side) {
    const edge = side.getBoundingClientRect().right;
    side.querySelectorAll('[data-testid="stSidebarNavLink"]').forEach(a => {
      const range = document.createRange();
      range.selectNodeContents(a);
      const r = range.getBoundingClientRect();
      if (r.width > 0 && r.right > edge + 1) out.push('sidebar link cut by the sidebar edge: ' + a.innerText.trim().slice(0, 60));
    });
  }
  main.querySelectorAll('[data-testid="stDataFrame"]').forEach((d, i) => {
    const s = d.querySelector('.dvn-scroller');            // the grid's scroll box (tables are drawn on a canvas)
    if (s && s.clientWidth > 0 && s.scrollWidth > s.clientWidth + 8)
      out.push('table #' + (i + 1) + ' cut: ' + (s.scrollWidth - s.clientWidth) + ' px of its columns past the page');
  });
  const code = main.innerText.match(/\b00\d Details? \d+|\breference 00\d\b/);
  if (code) out.push('source named by a code: "' + code[0] + '"');
  return out;
})()"""

_PRIMARY_JS = """(() => {
  const b = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stBaseButton-primary"]')]
      .find(b => !b.disabled);
  if (!b) return null;
  const label = b.innerText.trim();
  b.click();
  return label;
})()"""


def network_problems(events: list[dict]) -> list[str]:
    """Requests to another machine, and requests that failed, among DevTools Network events (`Browser.events`).
    A request the page itself cancelled (a navigation away, a closed websocket) is no failure."""
    urls, out = {}, []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            urls[p.get("requestId")] = url
            host = urlsplit(url).hostname or ""
            if urlsplit(url).scheme in ("http", "https", "ws", "wss") and host not in LOCAL_HOSTS + ("::1",):
                out.append("request to another host: " + url[:160])
        elif e.get("method") == "Network.loadingFailed" and not p.get("canceled"):
            out.append(f"failed request ({p.get('errorText', '?')}): " + urls.get(p.get("requestId"), "?")[:160])
    return out


@dataclass(frozen=True)
class Problem:
    page: str
    state: str              # "normal text" / "large text", "as drawn" / "after <button>"
    what: str

    def __str__(self) -> str:
        return f"{self.page} ({self.state}): {self.what}"


def page_paths() -> list[str]:
    """URL paths of the app's pages, as Streamlit names them from pages/NN_Name.py."""
    return ["/" + p.stem.split("_", 1)[1] for p in sorted((ROOT / "pages").glob("[0-9]*_*.py"))]


def open_page(browser: Browser, path: str) -> None:
    browser.js("[...document.querySelectorAll('button')].find(b => /^View \\d+ more/.test(b.innerText))?.click()")
    time.sleep(0.5)
    found = browser.js(f"(() => {{ const a = [...document.querySelectorAll('a')].find(a => a.pathname === "
                       f"{path!r}); if (a) a.click(); return !!a; }})()")
    if not found:
        raise RuntimeError(f"no link to {path} in the sidebar")
    time.sleep(1.0)
    browser.wait_ready(600)
    wait_charts(browser)


def set_large_text(browser: Browser, on: bool) -> None:
    state = browser.js(f"(() => {{ const l = [...document.querySelectorAll('label')].find(l => "
                       f"l.innerText.includes({LARGE_TEXT_LABEL!r})); return l ? l.querySelector('input').checked "
                       f": null; }})()")
    if state is None:
        raise RuntimeError("no large-text switch in the sidebar")
    if bool(state) != on:
        browser.js(f"[...document.querySelectorAll('label')].find(l => l.innerText.includes({LARGE_TEXT_LABEL!r}))"
                   ".querySelector('input').click()")
        time.sleep(1.0)
        browser.wait_ready(300)


def tall(browser: Browser, on: bool) -> None:
    """A viewport as tall as the page (every chart is drawn, nothing scrolled away), or back to 1366×768."""
    h = browser.js(f"Math.max({HEIGHT}, document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight || {HEIGHT})") \
        if on else HEIGHT
    browser.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=int(min(h, 16000)), deviceScaleFactor=1,
                 mobile=False)
    time.sleep(0.8)
    if on:
        wait_charts(browser)


def look(browser: Browser, path: Path | None, full: bool) -> list[str]:
    """The page's problems, checked with every chart drawn; a screenshot (1366×768, or the whole page)."""
    if path is not None and not full:
        browser.shot(path)
    tall(browser, True)
    found = browser.js(_PROBLEMS_JS)
    if path is not None and full:
        browser.shot(path)
    tall(browser, False)
    return found


def walk(browser: Browser, paths: list[str], out: Path | None, full: bool = False, log=print,
         sizes: tuple[bool, ...] = (False, True)) -> list[Problem]:
    """Every page in `paths`, large text off then on (`sizes`); the problems found (empty = a clean walk)."""
    problems = [Problem("/", "home page", w) for w in network_problems(browser.events)]
    checked = len(browser.events)
    for large in sizes:
        set_large_text(browser, large)
        size = "large text" if large else "normal text"
        for path in paths:
            t0 = time.monotonic()
            open_page(browser, path)
            name = path.strip("/") + ("_large" if large else "")
            shot = (lambda suffix: None if out is None else out / f"{name}{suffix}.png")
            found = [Problem(path, f"{size}, as drawn", w) for w in look(browser, shot(""), full)]
            pressed = browser.js(_PRIMARY_JS)
            if pressed:
                time.sleep(1.0)
                browser.wait_ready(600)
                wait_charts(browser)
                found += [Problem(path, f"{size}, after {pressed!r}", w)
                          for w in look(browser, shot("_pressed"), full)]
            found += [Problem(path, size, w) for w in network_problems(browser.events[checked:])]
            checked = len(browser.events)
            log(f"{path} ({size}): {len(found)} problem(s), {time.monotonic() - t0:.1f} s"
                + (f", pressed {pressed!r}" if pressed else ""))
            for p in found:
                log(f"    {p.what}")
            problems += found
    return problems


def run(paths: list[str] | None = None, out: Path | None = None, full: bool = False,
        chromium: str | None = None, log=print, sizes: tuple[bool, ...] = (False, True)) -> list[Problem]:
    chromium = chromium or shutil.which("chromium") or "/usr/bin/chromium"
    with app_in_browser(chromium, SIZE) as browser:
        return walk(browser, paths or page_paths(), out, full, log, sizes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="URL paths (default: every page)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "walkthrough")
    p.add_argument("--full", action="store_true", help="whole-page screenshots instead of the 1366×768 view")
    p.add_argument("--chromium", default=None)
    p.add_argument("--text", choices=("both", "normal", "large"), default="both", help="text sizes to walk")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))      # a plain kill still stops the server and Chromium
    sizes = {"both": (False, True), "normal": (False,), "large": (True,)}[args.text]
    problems = run(args.paths or None, args.out, args.full, args.chromium, sizes=sizes)
    print(f"\n{len(problems)} problem(s); screenshots in {args.out}")
    for pr in problems:
        print(f"  {pr}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
