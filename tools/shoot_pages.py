"""Screenshots of pages once every chart has drawn: like tools/screenshot.py, but it also waits until each plotly
chart on the page has rendered (on a busy machine they appear seconds after the script has finished), and it can
click buttons (e.g. "Next") between shots of the same page.

    python tools/shoot_pages.py /Walkthrough /Attention --out /tmp/app-screenshots [--large-text]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.check_stop import Browser, app_in_browser  # noqa: E402
from tools.screenshot import out_name  # noqa: E402

_CHARTS_DRAWN = """(() => {
  const boxes = document.querySelectorAll('[data-testid="stPlotlyChart"]').length;
  const drawn = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
      .filter(b => b.querySelector('.main-svg')).length;
  const waiting = document.querySelectorAll('[data-testid="stSkeleton"]').length;
  return [boxes + waiting, drawn];
})()"""


def wait_charts(browser: Browser, budget_s: float = 90.0) -> tuple[int, int]:
    t0 = time.monotonic()
    boxes, drawn = 0, 0
    while time.monotonic() - t0 < budget_s:
        boxes, drawn = browser.js(_CHARTS_DRAWN)
        if drawn >= boxes:
            time.sleep(1.0)
            return boxes, drawn
        time.sleep(0.5)
    return boxes, drawn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "app-screenshots")
    p.add_argument("--size", default="1400,3200")
    p.add_argument("--click", default="", help="a button label to press after the first shot of each page")
    p.add_argument("--times", type=int, default=0, help="how many times to press it (one shot after each)")
    p.add_argument("--large-text", action="store_true", help="switch the sidebar's large-text option on first")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = p.parse_args()
    with app_in_browser(args.chromium, args.size) as browser:
        if args.large_text:
            browser.js("[...document.querySelectorAll('label')].find(l => l.innerText.includes('Large text'))"
                       ".querySelector('input').click()")
            time.sleep(1.0)
            browser.wait_ready(300)
        for path in args.paths:
            # the sidebar lists about ten pages until its "View more" button is pressed
            browser.js("[...document.querySelectorAll('button')].find(b => /^View \\d+ more/.test(b.innerText))?.click()")
            time.sleep(0.5)
            browser.js(f"[...document.querySelectorAll('a')].find(a => a.pathname === {path!r}).click()")
            time.sleep(1.0)
            t = browser.wait_ready(600)
            boxes, drawn = wait_charts(browser)
            name = out_name(path)
            browser.shot(args.out / name)
            print(f"{args.out / name}: drawn in {t:.1f} s, {drawn}/{boxes} charts")
            for i in range(args.times):
                browser.click(args.click)
                time.sleep(1.0)
                browser.wait_ready(600)
                wait_charts(browser)
                shot = args.out / name.replace(".png", f"_{i + 2}.png")
                browser.shot(shot)
                print(shot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
