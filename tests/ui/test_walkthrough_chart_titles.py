"""The browser walk's check for a chart title cut by the chart's edge (issue 18, "truncated titles"), on a static
page of plotly charts drawn by the plotly.js the plotly package ships (no server, no network): an over-long title,
axis title or colour-bar title is reported, one under the legend is reported, titles that fit are not.

Needs Chromium (apt-get install chromium) and the websockets package; skips cleanly without them.
"""
from __future__ import annotations

import json
import shutil
import time

import pytest

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")

LONG = ("Time to first token and inter-token latency of every request at every arrival rate, measured on the "
        "class's server under its load at the time")
BARS = dict(type="bar", x=["a", "b", "c"], y=[1, 3, 2])


def chart(title: str = "", x_title: str = "", y_title: str = "", **layout) -> dict:
    return dict(data=[BARS], layout=dict(title=dict(text=title), xaxis=dict(title=dict(text=x_title)),
                                         yaxis=dict(title=dict(text=y_title)), width=420, height=300, **layout))


CASES = {                                       # id -> (figure, the problem the walk must report, or None)
    "fits": (chart("Latency per request", "requests", "ms"), None),
    "long title": (chart(LONG, "requests", "ms"), "chart title cut"),
    "long axis title": (chart("Latency", "requests", "time to first token of each request, in milliseconds, "
                                                    "measured at the client"), "chart title cut"),
    "long colour-bar title": (dict(data=[dict(type="heatmap", z=[[1, 2], [3, 4]],
                                              colorbar=dict(title=dict(text=LONG, side="right")))],
                                   layout=dict(width=420, height=300)), "chart title cut"),
    "under the legend": (dict(data=[dict(BARS, name="prefill"), dict(BARS, name="decode")],
                              layout=dict(title=dict(text="Latency per request", y=0.97, yref="container"),
                                          legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
                                          margin=dict(t=30), width=420, height=300)), "chart title cut"),
}


def page_html(figures: list[dict]) -> str:
    import plotly.offline
    divs = "".join(f'<div data-testid="stPlotlyChart"><div id="c{i}"></div></div>' for i in range(len(figures)))
    plots = ",".join(f"Plotly.newPlot('c{i}', {json.dumps(f['data'])}, {json.dumps(f['layout'])}, "
                     "{displayModeBar: false})" for i, f in enumerate(figures))
    return (f"<html><head><script>{plotly.offline.get_plotlyjs()}</script></head><body>{divs}<script>"
            f"Promise.all([{plots}]).then(() => {{ window.drawn = true; }});</script></body></html>")


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("websockets")
    from tools.check_stop import Browser
    b = Browser(shutil.which("chromium"), "1280,720")
    try:
        yield b
    finally:
        b.close()


def problems_on(browser, figure: dict, tmp_path) -> list[str]:
    from tools.walkthrough import _PROBLEMS_JS
    page = tmp_path / "charts.html"
    page.write_text(page_html([figure]))
    browser.call("Page.navigate", url=page.as_uri())
    t0 = time.monotonic()
    while not browser.js("window.drawn === true"):
        assert time.monotonic() - t0 < 30, "plotly.js did not draw the chart"
        time.sleep(0.1)
    return browser.js(_PROBLEMS_JS)


@pytest.mark.parametrize("case", list(CASES))
def test_walk_reports_a_chart_title_cut_by_the_edge_or_the_legend_and_nothing_else(browser, tmp_path, case):
    figure, expected = CASES[case]
    found = problems_on(browser, figure, tmp_path)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(expected), found
