"""Plotly figure builders: arrays in, figure dict out. No ORM, no request.

``build_gantt_figure`` draws each piece of evidence as a bar from its start to its end on one
lane per object (or actor, user agent, source file), coloured by verb or outcome. Bars are
WebGL line segments (``scattergl``): SVG shapes take tens of seconds for 100k spans, WebGL a few.
Spans that never ended are drawn to the window's end, dotted. Beyond ``MAX_SPANS`` the caller
should draw ``build_heatmap_figure`` (counts per lane and time bin) instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

MAX_SPANS = 20_000
GROUPS = ("object", "actor", "user_agent", "source")
COLOURS = ("verb", "outcome")
VERB_COLOURS = {
    "get": "#94a3b8", "list": "#64748b", "watch": "#cbd5e1", "create": "#16a34a",
    "update": "#2563eb", "patch": "#7c3aed", "delete": "#dc2626", "deletecollection": "#991b1b",
}
OUTCOME_COLOURS = {"2xx": "#16a34a", "3xx": "#0891b2", "4xx": "#d97706", "5xx": "#dc2626",
                   "open": "#64748b", "other": "#94a3b8"}
KIND_COLOURS = {"event": "#0ea5e9", "log": "#a3a3a3", "trace": "#f59e0b"}
MIN_BAR = timedelta(milliseconds=1)  # a zero-length request still shows


@dataclass(frozen=True)
class Span:
    """What the figure needs of one event."""

    id: int
    kind: str
    start: datetime
    end: datetime | None
    verb: str
    code: int | None
    resource: str
    namespace: str
    name: str
    user: str
    user_agent: str
    source: str
    label: str  # hover text


def lane_of(span: Span, group: str) -> str:
    if group == "actor":
        return span.user or f"({span.kind})"
    if group == "user_agent":
        return span.user_agent or "(none)"
    if group == "source":
        return span.source or "(none)"
    parts = [span.resource or f"({span.kind})"]
    if span.namespace:
        parts.append(span.namespace)
    if span.name:
        parts.append(span.name)
    return "/".join(parts)


def colour_of(span: Span, colour: str) -> tuple[str, str]:
    """(legend name, colour) of a span."""
    if span.kind != "audit":
        return span.kind, KIND_COLOURS.get(span.kind, "#a3a3a3")
    if colour == "outcome":
        if span.end is None:
            bucket = "open"
        elif span.code is None:
            bucket = "other"
        else:
            bucket = f"{span.code // 100}xx" if 200 <= span.code < 600 else "other"
        return bucket, OUTCOME_COLOURS[bucket]
    return span.verb or "(none)", VERB_COLOURS.get(span.verb, "#0f766e")


def build_gantt_figure(spans: Iterable[Span], *, group: str = "object", colour: str = "verb",
                       window_end: datetime | None = None) -> dict:
    """A Plotly figure dict: one WebGL line trace per colour (open spans in their own, dotted),
    lanes on the y axis in order of first appearance, time on the x axis."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
    if colour not in COLOURS:
        raise ValueError(f"colour must be one of {COLOURS}, not {colour!r}")
    spans = list(spans)
    end_of_window = window_end or max(
        (s.end or s.start for s in spans), default=None)
    lanes: dict[str, int] = {}
    traces: dict[tuple[str, bool], dict] = {}
    for span in spans:
        lane = lanes.setdefault(lane_of(span, group), len(lanes))
        name, hue = colour_of(span, colour)
        is_open = span.end is None
        trace = traces.get((name, is_open))
        if trace is None:
            trace = traces[(name, is_open)] = {
                "type": "scattergl", "mode": "lines",
                "name": name + (" (open)" if is_open and name != "open" else ""),
                "legendgroup": name, "x": [], "y": [], "text": [], "customdata": [],
                "hoverinfo": "text", "connectgaps": False,
                "line": {"color": hue, "width": 8, "dash": "dot" if is_open else "solid"},
            }
        end = span.end or end_of_window or span.start
        if end - span.start < MIN_BAR:
            end = span.start + MIN_BAR
        # x, y: start, end, gap — one segment per span in a single trace
        trace["x"].extend((span.start.isoformat(), end.isoformat(), None))
        trace["y"].extend((lane, lane, None))
        trace["text"].extend((span.label, span.label, None))
        trace["customdata"].extend((span.id, span.id, None))
    names = list(lanes)
    height = max(260, min(40 + 18 * len(names), 4000))
    return {
        "data": list(traces.values()),
        "layout": {
            "height": height,
            "margin": {"l": 260, "r": 20, "t": 20, "b": 40},
            "xaxis": {"type": "date", "title": {"text": "time (UTC)"}},
            "yaxis": {"tickmode": "array", "tickvals": list(range(len(names))),
                      "ticktext": names, "autorange": "reversed", "automargin": True},
            "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom"},
            "hovermode": "closest",
            "dragmode": "zoom",
        },
        "meta": {"spans": len(spans), "lanes": len(names), "mode": "gantt"},
    }


def build_heatmap_figure(spans: Iterable[Span], *, group: str = "object", bins: int = 200) -> dict:
    """Counts per lane and time bin, for windows with more spans than bars can carry."""
    spans = list(spans)
    if not spans:
        return build_gantt_figure([], group=group)
    first = min(s.start for s in spans)
    last = max(s.start for s in spans)
    width = max((last - first) / bins, timedelta(microseconds=1))
    lanes: dict[str, int] = {}
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for span in spans:
        lane = lanes.setdefault(lane_of(span, group), len(lanes))
        column = min(int((span.start - first) / width), bins - 1)
        counts[(lane, column)] += 1
    z = [[counts.get((lane, column), 0) or None for column in range(bins)]
         for lane in range(len(lanes))]
    x = [(first + width * (column + 0.5)).isoformat() for column in range(bins)]
    names = list(lanes)
    return {
        "data": [{"type": "heatmap", "x": x, "y": names, "z": z, "colorscale": "Blues",
                  "hovertemplate": "%{y}<br>%{x}<br>%{z} events<extra></extra>"}],
        "layout": {"height": max(260, min(40 + 18 * len(names), 4000)),
                   "margin": {"l": 260, "r": 20, "t": 20, "b": 40},
                   "xaxis": {"type": "date"}, "yaxis": {"autorange": "reversed",
                                                        "automargin": True}},
        "meta": {"spans": len(spans), "lanes": len(names), "mode": "heatmap"},
    }
