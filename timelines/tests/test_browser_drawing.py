"""Where the timeline draws the evidence, read from the pixels of the page as the user sees it.

A figure can hold the right data and still be drawn wrong: a plotly.js bundle built with another
regl-line2d put every WebGL line of the Gantt on the plot's bottom edge while its markers stayed
on their lanes, and tests of the figure's data could not tell. Here the markers are hidden, the
plot is photographed with its traces and without them, and what the traces drew must lie on the
rows of the lanes that hold spans (rows from plotly's own axis, ``l2p``) and start where each
lane's first span starts: for the Gantt and the heatmap, with the plotly.js that
scripts/assets.sh builds and with the plotly package's full plotly.min.js.
"""

from __future__ import annotations

import io
from datetime import datetime

import numpy as np
import pytest
from PIL import Image

from timelines.reads import queries

pytestmark = pytest.mark.django_db(transaction=True)

BUNDLES = {"built": "plotly/plotly-timeline.min.js", "full": "plotly/plotly.min.js"}
# A pixel the traces changed: any channel moved by more than this (anti-aliasing of the same
# page drawn twice moves none).
INK = 8


@pytest.fixture(params=sorted(BUNDLES))
def plotly_js(request, settings) -> str:
    """Each plotly.js the page may load; the one setup builds must be there."""
    if request.param == "built":
        built = settings.BASE_DIR / "assets" / "dist" / "plotly-timeline.min.js"
        if not built.is_file():
            pytest.fail(f"{built} is missing: scripts/assets.sh builds it", pytrace=False)
    settings.PLOTLY_JS = BUNDLES[request.param]
    return settings.PLOTLY_JS


def _figure(client, user, incident, **query) -> dict:
    client.force_login(user)
    answer = client.get(f"/api/v1/incidents/{incident.pk}/figure/", query)
    assert answer.status_code == 200
    return answer.json()


def _open(open_page, user, incident, query: str = ""):
    page = open_page(user, f"/incidents/{incident.pk}/{query}")
    page.wait_for_function("Number(document.getElementById('gantt').dataset.drawn || 0) >= 1")
    return page


def _ink(page) -> tuple[np.ndarray, dict]:
    """The pixels of the plot area that the figure's traces draw, markers left out: a
    screenshot of the plot with its line and heatmap traces, minus one without any trace (the
    axes held at their ranges). Returns the mask (rows × columns of the plot area) and the
    plot's axes as functions of plotly (``axes["y"](lane)``, ``axes["x"](ms)``: pixels from the
    plot area's top and left)."""
    box = page.locator("#gantt")
    plot = page.evaluate("""async () => {
        const gd = document.getElementById('gantt');
        const size = Object.assign({}, gd._fullLayout._size);
        // The plot area stays where it is when the traces are hidden: the y axis keeps its
        // range (the x range is the window's), the margins their size, and the legend and
        // colour bar, which would go with the traces, are not shown in either picture; nor
        // the grid, which a heatmap's cells cover.
        await Plotly.relayout(gd, {
            'yaxis.range': gd._fullLayout.yaxis.range.slice(), 'yaxis.automargin': false,
            'xaxis.automargin': false, 'margin.l': size.l, 'margin.r': size.r,
            'margin.t': size.t, 'margin.b': size.b, showlegend: false,
            'xaxis.showgrid': false, 'yaxis.showgrid': false, 'xaxis.zeroline': false,
            'yaxis.zeroline': false});
        const markers = gd.data.flatMap((t, i) => /markers/.test(t.mode || '') ? [i] : []);
        if (markers.length) await Plotly.restyle(gd, {visible: false}, markers);
        const heatmaps = gd.data.flatMap((t, i) => t.type === 'heatmap' ? [i] : []);
        if (heatmaps.length) await Plotly.restyle(gd, {showscale: false}, heatmaps);
        const now = gd._fullLayout._size;
        if (now.l !== size.l || now.t !== size.t || now.w !== size.w || now.h !== size.h) {
            throw new Error('the plot area moved: ' + JSON.stringify([size, now]));
        }
        return {l: size.l, t: size.t, w: size.w, h: size.h}; }""")
    shown = box.screenshot(animations="disabled")
    page.evaluate("() => Plotly.restyle(document.getElementById('gantt'), {visible: false})")
    empty = box.screenshot(animations="disabled")
    page.evaluate("() => Plotly.restyle(document.getElementById('gantt'), {visible: true})")
    before, after = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
                     for png in (shown, empty))
    assert before.shape == after.shape
    changed = np.abs(before - after).max(axis=2) > INK
    left, top = round(plot["l"]), round(plot["t"])
    return changed[top:top + round(plot["h"]), left:left + round(plot["w"])], plot


def _pixels(page, axis: str, values: list[float]) -> list[float]:
    """Where plotly draws each value on an axis, in pixels from the plot area's edge."""
    return page.evaluate(f"""(values) => {{
        const ax = document.getElementById('gantt')._fullLayout.{axis}axis;
        return values.map(v => ax.l2p(ax.d2l(v))); }}""", values)


def _assert_on_lanes(ink: np.ndarray, rows: dict[str, float], starts: dict[str, float],
                     reach: float, slack: dict[str, float] | None = None) -> None:
    """Every lane in ``rows`` (name → pixel row) has ink on its row, its first inked column
    where its first span starts (within 6 px, plus the lane's ``slack``: a dotted line may
    begin with a gap), and the traces drew nothing farther than ``reach`` pixels from the rows
    of those lanes."""
    assert ink.any(), "the traces drew nothing"
    for lane, row in rows.items():
        band = ink[max(0, round(row) - 3):round(row) + 4]
        assert band.sum() >= 3, f"nothing drawn on the row of lane {lane!r} (y {row:.0f} px)"
        first = int(np.flatnonzero(band.any(axis=0))[0])
        assert abs(first - starts[lane]) <= 6 + (slack or {}).get(lane, 0), (
            f"lane {lane!r} drawn from x {first} px, its first span starts at "
            f"{starts[lane]:.0f} px")
    near = np.zeros(ink.shape[0], dtype=bool)
    for row in rows.values():
        near[max(0, round(row - reach)):round(row + reach) + 1] = True
    astray = int(ink[~near].sum())
    assert astray <= 0.02 * ink.sum(), (
        f"{astray} of {int(ink.sum())} drawn pixels are off the lanes that hold spans, on "
        f"rows {sorted(set(np.flatnonzero(ink[~near].any(axis=1)).tolist()))[:10]}…")


def test_the_gantt_draws_each_span_on_its_lane(plotly_js, open_page, client, owner, incident,
                                               falco):
    figure = _figure(client, owner, incident, lanes="object", colour="verb")
    page = _open(open_page, owner, incident)
    assert page.get_attribute("#plotly-js", "src").endswith(plotly_js)
    assert page.get_attribute("#gantt", "data-mode") == "gantt"

    names = figure["layout"]["yaxis"]["ticktext"]
    first_start: dict[int, float] = {}  # lane → earliest x of a line (bar or lifespan) on it
    dotted: dict[int, float] = {}  # lane → the dot period of its earliest line, if dotted
    widest = 0
    for trace in figure["data"]:
        if trace["mode"] != "lines":
            continue
        line = trace["line"]
        widest = max(widest, line["width"])
        period = 2 * line["width"] if line.get("dash") == "dot" else 0
        for x, y in zip(trace["x"][::3], trace["y"][::3], strict=True):
            if x < first_start.get(y, x + 1):
                first_start[y], dotted[y] = x, period
    lanes = sorted(first_start)
    assert len(lanes) >= 10
    ys = _pixels(page, "y", lanes)
    window = figure["layout"]["xaxis"]["range"]
    xs = _pixels(page, "x", [max(first_start[lane], _ms(window[0])) for lane in lanes])
    ink, _ = _ink(page)

    _assert_on_lanes(ink, {names[n]: y for n, y in zip(lanes, ys, strict=True)},
                     {names[n]: x for n, x in zip(lanes, xs, strict=True)},
                     reach=widest / 2 + 1, slack={names[n]: dotted[n] for n in lanes})


def test_the_heatmap_draws_each_count_on_its_lane(plotly_js, open_page, client, owner, incident,
                                                  falco, monkeypatch):
    monkeypatch.setattr(queries, "MAX_SPANS", 10)  # 38 events: a heatmap
    figure = _figure(client, owner, incident, lanes="object")
    page = _open(open_page, owner, incident)
    assert page.get_attribute("#gantt", "data-mode") == "heatmap"

    (trace,) = figure["data"]
    counts = trace.get("customdata") or trace["z"]
    names = trace["y"]
    first_bin = {names[row]: next(i for i, n in enumerate(cells) if n)
                 for row, cells in enumerate(counts) if any(cells)}
    assert len(first_bin) >= 10
    rows = dict(zip(names, _pixels(page, "y", names), strict=True))
    x0 = _ms(trace["x0"])
    starts = _pixels(page, "x", [x0 + (first_bin[name] - 0.5) * trace["dx"]
                                 for name in first_bin])
    ink, _ = _ink(page)

    _assert_on_lanes(ink, {name: rows[name] for name in first_bin},
                     dict(zip(first_bin, starts, strict=True)),
                     reach=abs(rows[names[1]] - rows[names[0]]) / 2 + 1)  # cells fill lanes


def _ms(when: str | float) -> float:
    """Epoch milliseconds of an ISO 8601 time (or of a number, which is one already)."""
    if isinstance(when, (int, float)):
        return float(when)
    return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() * 1000
