"""A teacher's walkthrough in a real browser: every page at 1366×768 (a projector), with large text off and on, first
as drawn and again after pressing its main (primary) button; the Walkthrough step by step (Next, eleven times).
It reports what a class would notice first:

- on the first screen (the page at its top, 1366×768): the key chart (or, on a page without one, the first
  metric) starting below 768 px; the Next button off screen while the chart is on it; a metric value wrapped onto
  two lines; text a class should never read: a raw identifier (itl_p50_ms), a file path, `None`, a Python repr
  ({'a': 1}, [1, 2]) or an integer of 4+ digits without separators (tools/walk_checks.py, tested on fixtures);
- a lesson of the README's lesson plans that the sidebar hides behind "View more";
- a button or widget label cut by its column ("← B." for "← Back");

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

    python tools/walkthrough.py [--out /tmp/walkthrough] [--full] [--port 18200] [--text normal|large|both]
                                [--plan | / /Walkthrough /Class ...]

(--plan: the pages of the README's two lesson plans, Home first.)

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
from tools.walk_checks import (fold_problems, lesson_plan_paths, metric_problems, sidebar_problems,  # noqa: E402
                               text_problems)

WIDTH, HEIGHT = 1366, 768
SIZE = f"{WIDTH},{HEIGHT}"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
LARGE_TEXT_LABEL = "Large text"
WALKTHROUGH_STEPS = 11

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
  main.querySelectorAll('button, [data-testid="stCheckbox"] label, [data-testid="stWidgetLabel"]').forEach(b => {
    // "← B." for "← Back", "Chat temp…": a button's or a widget's label cut by its column
    const cut = [b, ...b.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1
      && getComputedStyle(e).overflowX !== 'visible' && e.innerText.trim());
    if (cut && b.getClientRects().length) out.push('label cut: ' + b.innerText.trim().replace(/\s+/g, ' ').slice(0, 60));
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

# What the first screen shows (the page scrolled to its top, 1366×768): where the step's heading, the key (first)
# chart and the Next button lie; every visible text a class reads (code spans, icons and inputs left out); each
# metric value's height against its first line. tools/walk_checks.py judges it.
_SCREEN_JS = r"""(() => {
  for (const e of [document.scrollingElement, ...document.querySelectorAll('[data-testid="stMain"], '
                   + '[data-testid="stAppViewContainer"], [data-testid="stAppScrollToBottomContainer"]')])
    if (e) e.scrollTop = 0;
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const side = document.querySelector('[data-testid="stSidebar"]');
  const rect = e => e ? e.getBoundingClientRect() : null;
  const chart = main.querySelector('[data-testid="stPlotlyChart"]');
  const heading = main.querySelector('h2') || main.querySelector('h1');
  const next = [...main.querySelectorAll('button')].find(b => b.innerText.trim().endsWith('Next'));
  const metric = main.querySelector('[data-testid="stMetric"]');      // the key figure of a page without a chart
  const c = rect(chart || metric), h = rect(heading), n = rect(next);
  const texts = [];
  const skip = 'code, pre, script, style, textarea, input, svg, [data-testid="stIconMaterial"], '
    + '[data-testid="stHeaderActionElements"], .material-symbols-rounded, [translate="no"], '
    + '[style*="monospace"]';                              // token chips: a piece and its id, the lesson's data
  for (const root of [main, side].filter(Boolean)) {
    const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    let t;
    while ((t = w.nextNode())) {
      const s = t.textContent.trim(), p = t.parentElement;
      if (!s || !p || p.closest(skip) || !p.getClientRects().length) continue;
      const d = p.closest('details');                      // a closed expander's text is not on the screen
      if (d && !d.open) continue;
      const r = document.createRange();
      r.selectNodeContents(t);
      if (![...r.getClientRects()].some(x => x.width > 0 && x.height > 0)) continue;
      if (getComputedStyle(p).visibility === 'hidden') continue;
      texts.push(s);
    }
  }
  main.querySelectorAll('[data-testid="stPlotlyChart"] .infolayer text[class$="title"]').forEach(t => {
    if (t.textContent.trim()) texts.push(t.textContent.trim()); });
  const metrics = [...main.querySelectorAll('[data-testid="stMetricValue"]')].map(m => {
    const lines = [];                                      // the text's line boxes only: a range over the whole
    const tw = document.createTreeWalker(m, NodeFilter.SHOW_TEXT);   // value also returns its inner boxes, as
    let tn;                                                // tall as every line ("2 / 1 / 1 /" + "1" read as one)
    while ((tn = tw.nextNode())) {
      const r = document.createRange();
      r.selectNodeContents(tn);
      lines.push(...[...r.getClientRects()].filter(x => x.height > 0));
    }
    return {text: m.innerText.trim(), height: lines.length ? Math.max(...lines.map(x => x.bottom))
            - Math.min(...lines.map(x => x.top)) : 0, line_px: lines.length ? lines[0].height : 0};
  });
  const links = {};
  if (side) side.querySelectorAll('a[data-testid="stSidebarNavLink"]').forEach(a => {
    links[a.pathname] = a.getClientRects().length > 0; });
  return {geom: {heading_top: h && h.top, heading_text: heading ? heading.innerText.trim() : '',
                 chart_top: c && c.top, chart_bottom: c && c.bottom, key: chart ? 'chart' : 'metric', next_top: n && n.top, next_bottom: n && n.bottom},
          texts, metrics, links};
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
    """Click the page's sidebar link (behind "View more" only if the sidebar hides it: `screen` reports that)."""
    click = (f"(() => {{ const a = [...document.querySelectorAll('a')].find(a => a.pathname === {path!r}); "
             "if (a) a.click(); return !!a; })()")
    found = browser.js(click)
    if not found:
        browser.js("[...document.querySelectorAll('button')].find(b => /^View \\d+ more/.test(b.innerText))?.click()")
        time.sleep(0.5)
        found = browser.js(click)
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


def screen(browser: Browser) -> tuple[list[str], dict]:
    """The first screen's problems (tools/walk_checks.py) and its measured geometry (heading, key chart, Next)."""
    seen = browser.js(_SCREEN_JS)
    geom = seen["geom"]
    found = fold_problems(geom, HEIGHT) + metric_problems(seen["metrics"])
    found += sorted({p for t in seen["texts"] for p in text_problems(t)})
    return found, {**geom, "links": seen["links"]}


def geometry_words(geom: dict) -> str:
    def px(v):
        return "-" if v is None else f"{v:.0f}"
    return (f"heading {px(geom['heading_top'])} px, chart {px(geom['chart_top'])}-{px(geom['chart_bottom'])} px, "
            f"Next {px(geom['next_top'])}-{px(geom['next_bottom'])} px")


def walk_steps(browser: Browser, out: Path | None, name: str, size: str, log=print) -> list[Problem]:
    """Every Walkthrough step from the first, pressing Next: each step's first screen checked and shot."""
    for _ in range(WALKTHROUGH_STEPS):                                  # back to step 1 (the step is remembered)
        if (browser.js("document.querySelector('[data-testid=\"stMain\"] h2')?.innerText || ''")
                .startswith("1.")):
            break
        browser.click("Back")
        time.sleep(0.8)
        browser.wait_ready(600)
    found = []
    for k in range(1, WALKTHROUGH_STEPS + 1):
        wait_charts(browser)
        probs, geom = screen(browser)
        log(f"    step {k}: {geometry_words(geom)}")
        found += [Problem("/Walkthrough", f"{size}, step {k}", w) for w in probs]
        if out is not None:
            browser.shot(out / f"{name}_step{k:02d}.png")
        if k < WALKTHROUGH_STEPS:
            browser.click("Next")
            time.sleep(0.8)
            browser.wait_ready(600)
    return found


def walk(browser: Browser, paths: list[str], out: Path | None, full: bool = False, log=print,
         sizes: tuple[bool, ...] = (False, True)) -> list[Problem]:
    """Every page in `paths`, large text off then on (`sizes`); the problems found (empty = a clean walk)."""
    problems = [Problem("/", "home page", w) for w in network_problems(browser.events)]
    checked = len(browser.events)
    plan = plan_paths()
    for large in sizes:
        set_large_text(browser, large)
        size = "large text" if large else "normal text"
        links = screen(browser)[1]["links"]
        problems += [Problem("sidebar", size, w) for w in sidebar_problems(links, [p for p in plan if p != "/"])]
        for path in paths:
            t0 = time.monotonic()
            open_page(browser, path)
            name = (path.strip("/") or "Home") + ("_large" if large else "")
            shot = (lambda suffix: None if out is None else out / f"{name}{suffix}.png")
            first, geom = screen(browser)
            log(f"{path} ({size}) first screen: {geometry_words(geom)}")
            found = [Problem(path, f"{size}, first screen", w) for w in first]
            found += [Problem(path, f"{size}, as drawn", w) for w in look(browser, shot(""), full)]
            if path == "/Walkthrough":
                found += walk_steps(browser, out, name, size, log)
                pressed = None
            else:
                pressed = browser.js(_PRIMARY_JS)
            if pressed:
                time.sleep(1.0)
                browser.wait_ready(600)
                wait_charts(browser)
                first, geom = screen(browser)
                log(f"{path} ({size}) after {pressed!r}: {geometry_words(geom)}")
                found += [Problem(path, f"{size}, after {pressed!r}, first screen", w) for w in first]
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


def plan_paths() -> list[str]:
    """URL paths of the README's two lesson plans, Home ("/") first."""
    return lesson_plan_paths((ROOT / "README.md").read_text(), ROOT / "pages")


def run(paths: list[str] | None = None, out: Path | None = None, full: bool = False,
        chromium: str | None = None, log=print, sizes: tuple[bool, ...] = (False, True),
        port: int | None = None) -> list[Problem]:
    chromium = chromium or shutil.which("chromium") or "/usr/bin/chromium"
    with app_in_browser(chromium, SIZE, port) as browser:
        return walk(browser, paths or ["/"] + page_paths(), out, full, log, sizes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="URL paths (default: Home and every page)")
    p.add_argument("--plan", action="store_true", help="the README's lesson-plan pages, Home first")
    p.add_argument("--port", type=int, default=None, help="the app's port (default: a free one)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "walkthrough")
    p.add_argument("--full", action="store_true", help="whole-page screenshots instead of the 1366×768 view")
    p.add_argument("--chromium", default=None)
    p.add_argument("--text", choices=("both", "normal", "large"), default="both", help="text sizes to walk")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))      # a plain kill still stops the server and Chromium
    sizes = {"both": (False, True), "normal": (False,), "large": (True,)}[args.text]
    paths = args.paths or (plan_paths() if args.plan else None)
    problems = run(paths, args.out, args.full, args.chromium, sizes=sizes, port=args.port)
    print(f"\n{len(problems)} problem(s); screenshots in {args.out}")
    for pr in problems:
        print(f"  {pr}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
