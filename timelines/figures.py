"""Plotly figure builders: arrays in, figure dict out. No ORM, no request.

``build_gantt_figure`` draws each piece of evidence as a bar from its start to its end on one
lane per object (or actor, user agent, source file), coloured by verb or outcome. Bars are
WebGL line segments (``scattergl``): SVG shapes take tens of seconds for 100k spans, WebGL a few.
Spans that never ended are drawn to the window's end, dotted. On object lanes each object's
lifespan (create to delete) runs beneath its requests, with a marker per successful mutation.

Beyond ``MAX_SPANS`` events the caller draws ``build_heatmap_figure`` instead: counts per lane and
time bin (``LaneCounts``), which the database computes (``timelines.aggregate``) or
``count_lanes`` here for the embedded SQLite mode and tests. The most active ``HEATMAP_LANES``
lanes are drawn, the others summed into one ``OTHER_LANES`` row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

MAX_SPANS = 20_000
HEATMAP_BINS = 200
HEATMAP_LANES = 50
OTHER_LANES = "(other lanes)"
GROUPS = ("object", "actor", "user_agent", "source")
COLOURS = ("verb", "outcome")
VERB_COLOURS = {
    "get": "#94a3b8", "list": "#64748b", "watch": "#cbd5e1", "create": "#16a34a",
    "update": "#2563eb", "patch": "#7c3aed", "delete": "#dc2626", "deletecollection": "#991b1b",
}
OUTCOME_COLOURS = {"2xx": "#16a34a", "3xx": "#0891b2", "4xx": "#d97706", "5xx": "#dc2626",
                   "open": "#64748b", "other": "#94a3b8"}
KIND_COLOURS = {"event": "#0ea5e9", "log": "#a3a3a3", "trace": "#f59e0b"}
# (legend name, marker symbol, colour) of a successful mutation on an object lane
MUTATIONS = {
    "create": ("created", "triangle-up", "#15803d"),
    "update": ("updated", "square", "#1d4ed8"),
    "patch": ("patched", "diamond", "#6d28d9"),
    "delete": ("deleted", "x", "#b91c1c"),
}
LIFESPAN_COLOUR = "rgba(100, 116, 139, 0.35)"
# White for none, then light to dark blue, with most of the range spent on small counts: a lane
# of 40 events must stay visible next to one of 40,000 (the colour bar gives the numbers).
HEATMAP_COLOURSCALE = [[0, "#ffffff"], [1e-9, "#eff6ff"], [0.01, "#bfdbfe"], [0.05, "#60a5fa"],
                       [0.25, "#2563eb"], [1, "#172554"]]
# The shortest bar is this share of the window (about 2 px of a 1,000 px plot): a 1 ms request
# in a 30 min window would otherwise be narrower than a pixel and not drawn at all. The hover
# text gives the true duration.
MIN_BAR_SHARE = 1 / 500
MIN_BAR = timedelta(milliseconds=1)  # when the window itself has no length (one instant)
MICROSECOND = timedelta(microseconds=1)


class Span(NamedTuple):
    """What the figure needs of one event (a named tuple: a Gantt makes 20,000 of them, and a
    frozen dataclass takes several times longer to make)."""

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
    subresource: str = ""


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


def _succeeded(span: Span) -> bool:
    return span.kind == "audit" and span.code is not None and 200 <= span.code < 300


def _is_object(span: Span) -> bool:
    return span.kind == "audit" and bool(span.resource) and bool(span.name)


def object_lifespans(spans: Iterable[Span], window_start: datetime, window_end: datetime,
                     lanes: Sequence[str] | None = None,
                     ) -> dict[str, list[tuple[datetime, datetime]]]:
    """When each object of the evidence existed within the window, by object lane.

    An object is a lane of audit requests naming one (resource and name) with at least one
    successful (2xx) request. A life runs from a successful create of the object itself (not of
    a subresource such as ``pods/eviction``) to the last successful delete before the next
    create: a pod's graceful deletion answers 200 twice, and the second one is when it goes.
    A life whose create is not in the evidence starts at ``window_start``, one not deleted runs
    to ``window_end``. Times are those of the responses (when the change took effect).
    ``lanes``: each span's object lane, when the caller has them already.
    """
    changes: dict[str, list[tuple[datetime, str]]] = {}
    for index, span in enumerate(spans):
        if not _is_object(span) or not _succeeded(span):
            continue
        lane = lanes[index] if lanes is not None else lane_of(span, "object")
        lane_changes = changes.setdefault(lane, [])
        if span.verb in ("create", "delete") and not span.subresource:
            lane_changes.append((span.end or span.start, span.verb))
    lives: dict[str, list[tuple[datetime, datetime]]] = {}
    for lane, lane_changes in changes.items():
        lane_changes.sort()
        intervals = []
        begin: datetime | None = None
        deleted: datetime | None = None
        for moment, verb in lane_changes:
            if verb == "delete":
                begin = begin or window_start
                deleted = moment
            elif begin is None:
                begin = moment
            elif deleted is not None:  # deleted, then made again under the same name
                intervals.append((begin, deleted))
                begin, deleted = moment, None
        intervals.append((begin or window_start, deleted or window_end))
        lives[lane] = intervals
    return lives


def _min_bar(window_start: datetime | None, window_end: datetime | None) -> timedelta:
    if window_start is None or window_end is None or window_end <= window_start:
        return MIN_BAR
    return max((window_end - window_start) * MIN_BAR_SHARE, MICROSECOND)


def build_gantt_figure(spans: Iterable[Span], *, group: str = "object", colour: str = "verb",
                       window_start: datetime | None = None,
                       window_end: datetime | None = None) -> dict:
    """A Plotly figure dict: one WebGL line trace per colour (open spans in their own, dotted),
    lanes on the y axis in order of first appearance, time on the x axis from ``window_start``
    (default: the first start) to ``window_end`` (default: the last end). Bars are at least
    ``MIN_BAR_SHARE`` of the window long. On object lanes, lifespans (see ``object_lifespans``)
    come first, so that the requests are drawn over them, and markers of successful mutations
    last, over the requests. ``customdata`` of every bar point and marker is the event id."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
    if colour not in COLOURS:
        raise ValueError(f"colour must be one of {COLOURS}, not {colour!r}")
    spans = list(spans)
    first = min((s.start for s in spans), default=None)
    last = max((s.start for s in spans), default=None)
    window_start = window_start or first
    window_end = window_end or max((s.end or s.start for s in spans), default=None)
    shortest = _min_bar(window_start, window_end)
    lanes: dict[str, int] = {}
    span_lanes = []  # each span's lane, for the lifespans
    traces: dict[tuple[str, bool], dict] = {}
    for span in spans:
        name = lane_of(span, group)
        span_lanes.append(name)
        lane = lanes.setdefault(name, len(lanes))
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
        end = span.end or window_end or span.start
        if end - span.start < shortest:
            end = span.start + shortest
        # x, y: start, end, gap — one segment per span in a single trace
        trace["x"].extend((span.start.isoformat(), end.isoformat(), None))
        trace["y"].extend((lane, lane, None))
        trace["text"].extend((span.label, span.label, None))
        trace["customdata"].extend((span.id, span.id, None))
    data = list(traces.values())
    if group == "object" and spans:
        lives, markers = _lifecycle_traces(spans, span_lanes, lanes, window_start, window_end,
                                           shortest)
        data = [*lives, *data, *markers]  # lifespans beneath the requests, markers over them
    names = list(lanes)
    layout = {
        "height": _height(len(names)),
        "margin": {"l": 260, "r": 20, "t": 20, "b": 40},
        "xaxis": {"type": "date", "title": {"text": "time (UTC)"}},
        "yaxis": {"tickmode": "array", "tickvals": list(range(len(names))),
                  "ticktext": names, "autorange": "reversed", "automargin": True},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        "hovermode": "closest",
        "dragmode": "zoom",
    }
    if window_start is not None and window_end is not None and window_end > window_start:
        layout["xaxis"]["range"] = [window_start.isoformat(), window_end.isoformat()]
    return {
        "data": data,
        "layout": layout,
        "meta": {"mode": "gantt", "spans": len(spans), "lanes": len(names), "total": len(spans),
                 "range": _range(first, last)},
    }


def _lifecycle_traces(spans: list[Span], span_lanes: list[str], lanes: dict[str, int],
                      window_start: datetime, window_end: datetime,
                      shortest: timedelta) -> tuple[list[dict], list[dict]]:
    """The lifespan bars (one trace, if any) and one marker trace per mutation verb."""
    lives = object_lifespans(spans, window_start, window_end, span_lanes)
    # no customdata: a lifespan is no event, clicking it opens nothing
    bars = {"type": "scattergl", "mode": "lines", "name": "lifespan", "x": [], "y": [],
            "text": [], "hoverinfo": "text", "connectgaps": False,
            "line": {"color": LIFESPAN_COLOUR, "width": 3}}
    for lane, intervals in lives.items():
        row = lanes[lane]
        for begin, end in intervals:
            text = f"{lane} exists {clock_time(begin)} – {clock_time(end)}"
            bars["x"].extend((begin.isoformat(), max(end, begin + shortest).isoformat(), None))
            bars["y"].extend((row, row, None))
            bars["text"].extend((text, text, None))
    markers: dict[str, dict] = {}
    for span, lane in zip(spans, span_lanes, strict=True):
        if span.verb not in MUTATIONS or not _is_object(span) or not _succeeded(span):
            continue
        trace = markers.get(span.verb)
        if trace is None:
            name, symbol, hue = MUTATIONS[span.verb]
            trace = markers[span.verb] = {
                "type": "scattergl", "mode": "markers", "name": name, "x": [], "y": [],
                "text": [], "customdata": [], "hoverinfo": "text",
                "marker": {"symbol": symbol, "color": hue, "size": 9,
                           "line": {"color": hue, "width": 1}},
            }
        moment = span.end or span.start
        what = span.verb + (f" ({span.subresource})" if span.subresource else "")
        trace["x"].append(moment.isoformat())
        trace["y"].append(lanes[lane])
        trace["text"].append(f"{what} by {span.user or '(unknown)'} at {clock_time(moment)}")
        trace["customdata"].append(span.id)
    return ([bars] if bars["x"] else []), [markers[v] for v in MUTATIONS if v in markers]


# --- heatmap -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bins:
    """Equal time bins in whole microseconds; bin ``i`` holds times in
    ``[start + i * width, start + (i + 1) * width)``."""

    start: datetime
    width: timedelta
    count: int

    @classmethod
    def spanning(cls, first: datetime, last: datetime, count: int = HEATMAP_BINS) -> Bins:
        """At most ``count`` bins from ``first``, the last one holding ``last``."""
        length = last - first + MICROSECOND
        width = max(-(-length // count) // MICROSECOND, 1) * MICROSECOND  # ceiling, whole µs
        return cls(first, width, -(-length // width))

    def index(self, moment: datetime) -> int:
        return (moment - self.start) // self.width


@dataclass(frozen=True)
class LaneCounts:
    """Events per lane and time bin, ready to draw. ``lanes`` are the drawn rows, most active
    first (ties by name), then ``OTHER_LANES`` when lanes were folded; ``z[row][bin]``."""

    bins: Bins
    lanes: list[str]
    z: list[list[int]]
    total: int  # events counted
    distinct_lanes: int  # before folding
    folded: int  # lanes summed into the OTHER_LANES row
    first: datetime  # of the events counted
    last: datetime


def fold_lanes(lanes: Iterable[tuple[str, Sequence[int], Sequence[int]]], bins: Bins, *,
               first: datetime, last: datetime, max_lanes: int = HEATMAP_LANES) -> LaneCounts:
    """``LaneCounts`` from each lane's bins and its counts in them, ``(lane, [bin, …],
    [count, …])`` (a lane may come more than once: its counts add up). Keeps the ``max_lanes``
    most active lanes, ties by name, and sums the others into ``OTHER_LANES``."""
    merged: dict[str, tuple[list[int], list[int]]] = {}
    for lane, columns, counts in lanes:
        kept = merged.setdefault(lane, ([], []))
        kept[0].extend(columns)
        kept[1].extend(counts)
    totals = {lane: sum(counts) for lane, (_, counts) in merged.items()}
    ranked = sorted(merged, key=lambda lane: (-totals[lane], lane))
    shown, rest = ranked[:max_lanes], ranked[max_lanes:]
    z = []
    for group in ([[lane] for lane in shown] + ([rest] if rest else [])):
        row = [0] * bins.count
        for lane in group:
            for column, count in zip(*merged[lane], strict=True):
                row[column] += count
        z.append(row)
    names = shown + ([OTHER_LANES] if rest else [])
    return LaneCounts(bins, names, z, sum(totals.values()), len(ranked), len(rest), first, last)


def count_lanes(spans: Iterable[Span], group: str, bins: Bins, *, first: datetime,
                last: datetime, max_lanes: int = HEATMAP_LANES) -> LaneCounts:
    """Counts spans by lane and the bin of their start, in Python (the embedded SQLite mode and
    the reference the database's aggregate is tested against)."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
    per_lane: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for span in spans:
        per_lane[lane_of(span, group)][bins.index(span.start)] += 1
    return fold_lanes(((lane, list(cells), list(cells.values()))
                       for lane, cells in per_lane.items()),
                      bins, first=first, last=last, max_lanes=max_lanes)


def build_heatmap_figure(counts: LaneCounts) -> dict:
    """A lane × time heatmap of ``counts``, for windows with more events than bars can carry.
    Compact: the x axis is ``x0`` (centre of the first bin) plus ``dx`` milliseconds per bin,
    not one time string per bin."""
    bins = counts.bins
    width_ms = bins.width / timedelta(milliseconds=1)
    end = bins.start + bins.width * bins.count
    return {
        "data": [{"type": "heatmap", "x0": (bins.start + bins.width / 2).isoformat(),
                  "dx": width_ms, "y": counts.lanes, "z": counts.z,
                  "colorscale": HEATMAP_COLOURSCALE, "zmin": 0,
                  "hovertemplate": "%{y}<br>%{x}<br>%{z} events<extra></extra>"}],
        "layout": {"height": _height(len(counts.lanes)),
                   "margin": {"l": 260, "r": 20, "t": 20, "b": 40},
                   "xaxis": {"type": "date", "title": {"text": "time (UTC)"},
                             "range": [bins.start.isoformat(), end.isoformat()]},
                   "yaxis": {"type": "category", "autorange": "reversed", "automargin": True},
                   "dragmode": "zoom"},
        "meta": {"mode": "heatmap", "spans": counts.total, "total": counts.total,
                 "lanes": counts.distinct_lanes, "lanes_shown": len(counts.lanes),
                 "other_lanes": counts.folded, "bins": bins.count, "bin_ms": width_ms,
                 "range": _range(counts.first, counts.last)},
    }


def clock_time(moment: datetime) -> str:
    """HH:MM:SS.ffffff, for hover text (three times faster than strftime, which matters 20,000
    times over)."""
    return moment.time().isoformat("microseconds")


def _height(lanes: int) -> int:
    return max(260, min(40 + 18 * lanes, 4000))


def _range(first: datetime | None, last: datetime | None) -> list[str] | None:
    if first is None or last is None:
        return None
    return [first.isoformat(), last.isoformat()]
