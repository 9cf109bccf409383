"""The plotly.js the incident page loads can draw every figure the timeline makes.

scripts/assets.sh builds a plotly.js with only some trace types (assets/plotly-timeline.js). A
figure whose trace type the bundle lacks raises no error: plotly.js draws it as a ``scatter``.
So the trace types come from real figures (a Gantt on object lanes, with lifespans and mutation
markers, and a heatmap), and the page's plotly.js must know them and draw them as such.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.templatetags.static import static

from timelines.figures.build import (
    Bins,
    Span,
    build_gantt_figure,
    build_heatmap_figure,
    count_lanes,
)

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2024, 2, 1, 10, 0, tzinfo=UTC)


def _span(pk: int, seconds: float, verb: str, *, name: str = "web", kind: str = "audit",
          end: float | None = 0.5) -> Span:
    start = T0 + timedelta(seconds=seconds)
    return Span(pk, kind, start, None if end is None else start + timedelta(seconds=end), verb,
                201 if verb == "create" else 200, "deployments", "shop", name, "alice",
                "kubectl", "audit.log", f"{verb} {name}")


def _figures() -> list[dict]:
    spans = [_span(1, 0, "create"), _span(2, 5, "patch"), _span(3, 6, "get", name="api"),
             _span(4, 8, "watch", name="", end=None), _span(5, 9, "update"),
             _span(6, 12, "delete"), _span(7, 13, "", name="", kind="event")]
    gantt = build_gantt_figure(spans, group="object")
    # the object lanes' extra traces are there too, not only the requests' bars
    assert {"lifespan", "created", "deleted"} <= {trace["name"] for trace in gantt["data"]}
    first, last = spans[0].start, spans[-1].start
    heatmap = build_heatmap_figure(count_lanes(spans, "object", Bins.spanning(first, last),
                                               first=first, last=last))
    return [{"data": figure["data"], "layout": figure["layout"]} for figure in (gantt, heatmap)]


def test_the_page_s_plotly_js_draws_every_trace_type_of_the_figures(open_page, owner, incident,
                                                                     settings):
    figures = _figures()
    used = {trace["type"] for figure in figures for trace in figure["data"]}

    page = open_page(owner, f"/incidents/{incident.pk}/")
    page.wait_for_function("() => window.Plotly && window.Plotly.PlotSchema")

    assert page.get_attribute("#plotly-js", "src") == static(settings.PLOTLY_JS)
    known = set(page.evaluate("() => Object.keys(Plotly.PlotSchema.get().traces)"))
    assert used <= known, f"the page's plotly.js lacks {sorted(used - known)}"
    for figure in figures:
        drawn = page.evaluate("""async (figure) => {
            const div = document.body.appendChild(document.createElement('div'));
            await Plotly.newPlot(div, figure.data, figure.layout);
            const types = div._fullData.map(trace => trace.type);
            Plotly.purge(div);
            div.remove();
            return types; }""", figure)
        assert drawn == [trace["type"] for trace in figure["data"]]
