"""Plotly figure builders: arrays in, figure dict out. No ORM, no request.

``build_gantt_figure`` draws each piece of evidence as a bar from its start to its end on one
lane per object (or actor, user agent, source file: what a lane is, ``timelines.figures.lanes``),
coloured by verb or outcome. Bars are WebGL line segments (``scattergl``): SVG shapes take tens
of seconds for 100k spans, WebGL a few.
Spans that never ended are drawn to the window's end, dotted. On object lanes each object's
lifespan (create to delete) runs beneath its requests, with a marker per successful mutation.
Requests a Falco rule matched (``timelines.detections``) get a star over their start, coloured
by the severity of the most severe rule.
It draws ``Bar``s (times in integer microseconds; ``Span``s are turned into bars) and keeps its
JSON small (x as epoch milliseconds; hover texts as numbers into a table of strings, which the
page joins): 20,000 bars in well under 200 ms.

Beyond ``MAX_SPANS`` events the caller draws ``build_heatmap_figure`` instead: counts per lane and
time bin (``LaneCounts``), which the database computes (``timelines.store.aggregate``) or
``count_lanes`` here for the embedded SQLite mode and tests. The most active ``HEATMAP_LANES``
lanes are drawn, the others summed into one ``OTHER_LANES`` row.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import NamedTuple

from .lanes import GROUPS, OTHER_LANES, lane_name, lane_of, short_labels

MAX_SPANS = 20_000
HEATMAP_BINS = 200
HEATMAP_LANES = 50
COLOURS = ("verb", "outcome")
VERB_COLOURS = {
    "get": "#94a3b8", "list": "#64748b", "watch": "#cbd5e1", "create": "#16a34a",
    "update": "#2563eb", "patch": "#7c3aed", "delete": "#dc2626", "deletecollection": "#991b1b",
}
OUTCOME_COLOURS = {"2xx": "#16a34a", "3xx": "#0891b2", "4xx": "#d97706", "5xx": "#dc2626",
                   "open": "#64748b", "other": "#94a3b8"}
KIND_COLOURS = {"event": "#0ea5e9", "log": "#a3a3a3", "trace": "#f59e0b", "state": "#8b5cf6"}
# (legend name, marker symbol, colour) of a successful mutation on an object lane
MUTATIONS = {
    "create": ("created", "triangle-up", "#15803d"),
    "update": ("updated", "square", "#1d4ed8"),
    "patch": ("patched", "diamond", "#6d28d9"),
    "delete": ("deleted", "x", "#b91c1c"),
}
LIFESPAN_COLOUR = "rgba(100, 116, 139, 0.35)"
# (legend name, colour, outline) of the star on a detected request, by the severity of its most
# severe rule. The outline, a dark shade of the colour, keeps a star apart from the bar beneath
# it whatever the bar's colour (a critical star on a red delete bar); stars crowded together
# stay of their colour, where a black outline made a black blot of them.
DETECTIONS = {
    "critical": ("detected: critical", "#dc2626", "#7f1d1d"),
    "warning": ("detected: warning", "#f97316", "#9a3412"),
    "info": ("detected: info", "#facc15", "#a16207"),
}
# A star sits about this many pixels above its bar's middle, still in its lane: on it, it would
# hide the mutation marker at the end of a short request.
DETECTION_LIFT_PX = 6
# Light to dark blue over the decimal logarithm of a cell's count (an empty cell is not drawn):
# a lane of 5 events per cell stays visible beside one of 7,000, where a linear scale washed it
# to white. A single event is already a colour of its own, not a shade of white.
HEATMAP_COLOURSCALE = [[0, "#bfdbfe"], [0.35, "#60a5fa"], [0.65, "#2563eb"], [1, "#172554"]]
# The figure shows at most this many lanes at once (about 18 px each); the page pages through
# more with the y range (static/js/timeline.js), so that labels never print over each other.
LANES_PER_PAGE = 40
LANE_PX = 18
FRAME_PX = 150  # of a figure's height, what is not lanes: margins, time axis, legend
MIN_HEIGHT = 260
# The shortest bar is this share of the window (about 2 px of a 1,000 px plot): a 1 ms request
# in a 30 min window would otherwise be narrower than a pixel and not drawn at all. The hover
# text gives the true duration.
MIN_BAR_SHARE = 1 / 500
MIN_BAR = timedelta(milliseconds=1)  # when the window itself has no length (one instant)
EDGE_SHARE = 0.015  # the margin on each side of a Gantt drawn without a window
MICROSECOND = timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Span(NamedTuple):
    """What the figure needs of one event (a named tuple: a Gantt makes 20,000 of them, and a
    frozen dataclass takes several times longer to make). The heatmap counts spans; the Gantt
    draws them as ``Bar``s."""

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
    reason: str = ""  # of an Event (BackOff, …): part of the hover text
    subresource: str = ""


class Bar(NamedTuple):
    """One event as the Gantt draws it: ``Span``'s fields in ``Span``'s order, but the times
    in integer microseconds since the epoch, which is what the x axis needs (milliseconds:
    ``start / 1000``). Making a datetime per time and an ISO string per bar end took a third
    of a 20,000-bar figure's time. The Gantt reads bars by position, so a database row of
    these fields in this order is a bar as it is (``timelines.reads.queries``)."""

    id: int
    kind: str
    start: int
    end: int | None
    verb: str
    code: int | None
    resource: str
    namespace: str
    name: str
    user: str
    user_agent: str
    source: str
    reason: str = ""
    subresource: str = ""

    @classmethod
    def of(cls, span: Span) -> Bar:
        end = None if span.end is None else microseconds(span.end)
        return cls(span.id, span.kind, microseconds(span.start), end, *span[4:])


def microseconds(moment: datetime) -> int:
    """Microseconds since the epoch: exact, where ``timestamp()`` is a float of seconds."""
    return (moment - EPOCH) // MICROSECOND


def moment(micros: int) -> datetime:
    """The instant ``micros`` microseconds after the epoch (``microseconds``' inverse)."""
    return EPOCH + timedelta(microseconds=int(micros))


def _colour(kind: str, verb: str, code: int | None, is_open: bool,
            colour: str) -> tuple[str, str]:
    if kind != "audit":
        return kind, KIND_COLOURS.get(kind, "#a3a3a3")
    if colour == "outcome":
        if is_open:
            bucket = "open"
        elif code is None:
            bucket = "other"
        else:
            bucket = f"{code // 100}xx" if 200 <= code < 600 else "other"
        return bucket, OUTCOME_COLOURS[bucket]
    return verb or "(none)", VERB_COLOURS.get(verb, "#0f766e")


def _mutated(kind: str, code: int | None, resource: str, name: str) -> bool:
    """Whether a request succeeded (2xx) on one named object: the requests that make, change
    or end its life."""
    return (kind == "audit" and code is not None and 200 <= code < 300 and bool(resource)
            and bool(name))


def object_lifespans(bars: Iterable[Bar], window_start: int, window_end: int,
                     lanes: Sequence[str] | None = None) -> dict[str, list[tuple[int, int]]]:
    """When each object of the evidence existed within the window, by object lane; times (of
    the bars, the window and the answer) in microseconds since the epoch.

    An object is a lane of audit requests naming one (resource and name) with at least one
    successful (2xx) request. A life runs from a successful create of the object itself (not of
    a subresource such as ``pods/eviction``) to the last successful delete before the next
    create: a pod's graceful deletion answers 200 twice, and the second one is when it goes.
    A life whose create is not in the evidence starts at ``window_start``, one not deleted runs
    to ``window_end``. Times are those of the responses (when the change took effect).
    ``lanes``: each bar's object lane, when the caller has them already.
    """
    changes: dict[str, list[tuple[int, str]]] = {}
    for index, bar in enumerate(bars):
        (_, kind, start, end, verb, code, resource, namespace, name, user, agent, source, _,
         subresource) = bar
        if not _mutated(kind, code, resource, name):
            continue
        lane = lanes[index] if lanes is not None else lane_name(
            "object", kind, resource, namespace, name, user, agent, source)
        lane_changes = changes.setdefault(lane, [])
        if verb in ("create", "delete") and not subresource:
            lane_changes.append((start if end is None else end, verb))
    lives: dict[str, list[tuple[int, int]]] = {}
    for lane, lane_changes in changes.items():
        lane_changes.sort()
        intervals = []
        begin: int | None = None
        deleted: int | None = None
        for moment, verb in lane_changes:
            if verb == "delete":
                begin = window_start if begin is None else begin
                deleted = moment
            elif begin is None:
                begin = moment
            elif deleted is not None:  # deleted, then made again under the same name
                intervals.append((begin, deleted))
                begin, deleted = moment, None
        intervals.append((window_start if begin is None else begin,
                          window_end if deleted is None else deleted))
        lives[lane] = intervals
    return lives


def _min_bar(window_start: int | None, window_end: int | None) -> int:
    """The shortest bar, in microseconds."""
    if window_start is None or window_end is None or window_end <= window_start:
        return MIN_BAR // MICROSECOND
    window = timedelta(microseconds=window_end - window_start)
    return max(window * MIN_BAR_SHARE, MICROSECOND) // MICROSECOND


def build_gantt_figure(spans: Iterable[Span | Bar], *, group: str = "object",
                       colour: str = "verb", window_start: datetime | None = None,
                       window_end: datetime | None = None,
                       detections: Mapping[int, Sequence[tuple[str, str, str]]] | None = None,
                       ) -> dict:
    """A Plotly figure dict: one WebGL line trace per colour (open spans in their own, dotted),
    lanes on the y axis in order of first appearance, time on the x axis from ``window_start``
    (default: the first start) to ``window_end`` (default: the last end). Bars are at least
    ``MIN_BAR_SHARE`` of the window long. On object lanes, lifespans (see ``object_lifespans``)
    come first, so that the requests are drawn over them, and markers of successful mutations
    last, over the requests. A bar's hover text is its start (UTC clock time), kind, verb,
    code and reason, object (and subresource), user and true duration.

    Compact: x values are epoch milliseconds (numbers, exact to the microsecond, where an ISO
    string took twice the room and most of the time), and each bar, a segment of three points
    (start, end, gap), has no hover text but four label parts (what, object, user: numbers into
    the figure's ``labels``, a table of strings; its duration in microseconds, -1 if open),
    which the page joins into the text (static/js/hover.js; ``hover_texts`` here): making
    20,000 texts took a third of the figure's time, and sending them half its bytes.
    ``customdata`` of every bar point and marker is the event id. ``spans``: Spans (datetimes)
    or Bars (microseconds), which are quicker.

    ``detections``: event id → ``(rule, priority, severity)`` of the Falco rules that matched
    it, the most severe first (``detections.marks``). Each drawn event among them gets a star
    at its start, ``DETECTION_LIFT_PX`` above its bar, in one marker trace per severity of its
    first rule (``DETECTIONS``), drawn last; its hover text names the rules and priorities.
    ``meta["detected"]``: how many drawn events are marked."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {tuple(GROUPS)}, not {group!r}")
    if colour not in COLOURS:
        raise ValueError(f"colour must be one of {COLOURS}, not {colour!r}")
    bars = [Bar.of(s) if isinstance(s[2], datetime) else s for s in spans]
    starts = [bar[2] for bar in bars]
    first = min(starts, default=None)
    last = max(starts, default=None)
    left = microseconds(window_start) if window_start is not None else first
    if window_end is not None:
        right = microseconds(window_end)
    else:
        right = max((bar[2] if bar[3] is None else bar[3] for bar in bars), default=None)
    shortest = _min_bar(left, right)
    lanes: dict[str, int] = {}
    traces: dict[tuple[str, bool, str], dict] = {}
    columns: dict[tuple, tuple[list, list, list, list]] = {}  # by kind, verb or code, open
    by_verb = colour == "verb"
    object_lanes = group == "object"
    changes, change_lanes = [], []  # what lifespans and markers are made of, and its lanes
    # Hover texts travel as numbers into one table of strings (``labels``), which the page
    # joins (``hover_texts``): what was done, to which object, by whom repeat across bars.
    strings: dict[str, int] = {}
    whats: dict[tuple, int] = {}
    things: dict[tuple, int] = {}
    users: dict[str, int] = {}
    detected = []  # (bar, lane, what, thing, who) of the bars a rule matched
    for bar in bars:
        (pk, kind, start, end, verb, code, resource, namespace, name, user, agent, source,
         reason, subresource) = bar
        label = lane_name(group, kind, resource, namespace, name, user, agent, source)
        if object_lanes and _mutated(kind, code, resource, name):
            changes.append(bar)
            change_lanes.append(label)
        lane = lanes.get(label)
        if lane is None:
            lane = lanes[label] = len(lanes)
        key = (kind, verb if by_verb else code, end is None)
        column = columns.get(key)
        if column is None:
            column = columns[key] = _bar_trace(traces, kind, *_colour(
                kind, verb, code, end is None, colour), end is None)
        what = whats.get((verb, code, reason))
        if what is None:
            what = whats[verb, code, reason] = _string(strings, " ".join(
                filter(None, (verb, code and str(code), reason))))
        thing = things.get((resource, namespace, name, subresource))
        if thing is None:
            thing = "/".join(filter(None, (resource, namespace, name)))
            thing = things[resource, namespace, name, subresource] = _string(
                strings, f"{thing} ({subresource})" if subresource else thing)
        who = users.get(user)
        if who is None:
            who = users[user] = _string(strings, user)
        if detections and pk in detections:
            detected.append((bar, lane, what, thing, who))
        xs, ys, parts, ids = column
        stop = right if end is None else end
        if stop - start < shortest:
            stop = start + shortest  # wider than it lasted: the hover text says how long
        # one segment per bar in a single trace: start, end, gap
        xs += (start / 1000, stop / 1000, None)
        ys += (lane, lane, None)
        parts += (what, thing, who, -1 if end is None else end - start)
        ids += (pk, pk, None)
    data = list(traces.values())
    if changes:
        lives, markers = _lifecycle_traces(changes, change_lanes, lanes, left, right, shortest,
                                           strings)
        data = [*lives, *data, *markers]  # lifespans beneath the requests, markers over them
    names = list(lanes)
    if detected:
        # the lift in lanes: a lane is LANE_PX high, or more when a few lanes fill MIN_HEIGHT
        shown = min(len(names), LANES_PER_PAGE)
        lift = DETECTION_LIFT_PX * shown / (_height(shown) - FRAME_PX)
        data += _detection_traces(detected, detections, strings, lift)
    layout = _layout(names, yaxis={"tickmode": "array", "tickvals": list(range(len(names))),
                                   "ticktext": short_labels(names)})
    layout["hovermode"] = "closest"
    if left is not None and right is not None and right > left:
        # A side the caller did not fix gets a margin: the first and last events would
        # otherwise sit on the plot's edge, their markers half under the lane labels.
        margin = (right - left) * EDGE_SHARE
        layout["xaxis"]["range"] = [
            (window_start or moment(round(left - margin))).isoformat(),
            (window_end or moment(round(right + margin))).isoformat()]
    return {
        "data": data,
        "layout": layout,
        "labels": list(strings),
        "lanes": names,
        "meta": {"mode": "gantt", "spans": len(bars), "lanes": len(names), "total": len(bars),
                 "lanes_per_page": LANES_PER_PAGE, "detected": len(detected),
                 "range": None if first is None else _range(moment(first), moment(last))},
    }


def _layout(names: list[str], *, yaxis: dict) -> dict:
    """The layout both figures share: the first ``LANES_PER_PAGE`` lanes shown, top down (the
    page pages through the others), ``LANE_PX`` each; labels sized by plotly
    (``automargin``), so that the plot keeps the rest of the width; the legend under the time
    axis, where it covers neither the lanes nor the markers the page draws above the plot
    (annotations, sequence steps)."""
    shown = min(len(names), LANES_PER_PAGE)
    return {
        "height": _height(shown),
        "margin": {"l": 8, "r": 16, "t": 28, "b": 8},
        "xaxis": {"type": "date", "automargin": True,
                  "title": {"text": "time (UTC)", "standoff": 6}},
        "yaxis": {**yaxis, "range": [max(shown, 1) - 0.5, -0.5], "autorange": False,
                  "automargin": True, "zeroline": False},
        "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom",
                   "x": 0, "xanchor": "left"},
        "dragmode": "zoom",
    }


def _bar_trace(traces: dict[tuple[str, bool, str], dict], kind: str, name: str, hue: str,
               is_open: bool) -> tuple[list, list, list, list]:
    """The x, y, label parts and customdata lists of the trace of a colour (made on first
    use; a trace holds one kind of evidence, named in its hover texts)."""
    trace = traces.get((name, is_open, kind))
    if trace is None:
        trace = traces[(name, is_open, kind)] = {
            "type": "scattergl", "mode": "lines",
            "name": name + (" (open)" if is_open and name != "open" else ""),
            "legendgroup": name, "x": [], "y": [], "customdata": [],
            "labels": {"form": "bar", "kind": kind, "parts": []},
            "hoverinfo": "text", "connectgaps": False,
            "line": {"color": hue, "width": 8, "dash": "dot" if is_open else "solid"},
        }
    return trace["x"], trace["y"], trace["labels"]["parts"], trace["customdata"]


def _lifecycle_traces(changes: list[Bar], change_lanes: list[str], lanes: dict[str, int],
                      window_start: int, window_end: int,
                      shortest: int, strings: dict[str, int]) -> tuple[list[dict], list[dict]]:
    """The lifespan bars (one trace, if any) and one marker trace per mutation verb, of the
    successful requests on named objects (``_mutated``) and their lanes. The markers' hover
    texts are label parts into ``strings``, as the bars' are."""
    lives = object_lifespans(changes, window_start, window_end, change_lanes)
    # no customdata: a lifespan is no event, clicking it opens nothing
    bars_x, bars_y, bars_text = [], [], []
    for lane, intervals in lives.items():
        row = lanes[lane]
        for begin, end in intervals:
            bars_x += (begin / 1000, max(end, begin + shortest) / 1000, None)
            bars_y += (row, row, None)
            bars_text += (f"{lane} exists {clock_time(begin)} – {clock_time(end)}", None, None)
    markers: dict[str, dict] = {}
    columns: dict[str, tuple[list, list, list, list]] = {}
    for (pk, _, start, end, verb, _, _, _, _, user, _, _, _,
         subresource), lane in zip(changes, change_lanes, strict=True):
        column = columns.get(verb)
        if column is None:
            if verb not in MUTATIONS:
                continue
            legend, symbol, hue = MUTATIONS[verb]
            trace = markers[verb] = {
                "type": "scattergl", "mode": "markers", "name": legend, "x": [], "y": [],
                "customdata": [], "labels": {"form": "marker", "parts": []},
                "hoverinfo": "text",
                "marker": {"symbol": symbol, "color": hue, "size": 9,
                           "line": {"color": hue, "width": 1}},
            }
            column = columns[verb] = (trace["x"], trace["y"], trace["labels"]["parts"],
                                      trace["customdata"])
        xs, ys, parts, ids = column
        moment = start if end is None else end
        xs.append(moment / 1000)
        ys.append(lanes[lane])
        parts += (_string(strings, f"{verb} ({subresource})" if subresource else verb),
                  _string(strings, user or "(unknown)"))
        ids.append(pk)
    lifespans = {"type": "scattergl", "mode": "lines", "name": "lifespan", "x": bars_x,
                 "y": bars_y, "text": bars_text, "hoverinfo": "text", "connectgaps": False,
                 "line": {"color": LIFESPAN_COLOUR, "width": 3}}
    return ([lifespans] if bars_x else []), [markers[v] for v in MUTATIONS if v in markers]


def _detection_traces(detected: list[tuple[Bar, int, int, int, int]],
                      detections: Mapping[int, Sequence[tuple[str, str, str]]],
                      strings: dict[str, int], lift: float) -> list[dict]:
    """One star marker trace per severity (``DETECTIONS``' order) of the detected bars
    (``(bar, lane, what, thing, who)``, the last three label numbers of the bar's text), each
    ``lift`` lanes above its bar. A star's label parts are ``[rules, what, thing, who]``:
    ``rules`` the rules that matched, each with its priority, as one string
    (``hover_texts``)."""
    traces: dict[str, dict] = {}
    for bar, lane, what, thing, who in detected:
        matched = detections[bar[0]]
        severity = matched[0][2] if matched[0][2] in DETECTIONS else "info"
        trace = traces.get(severity)
        if trace is None:
            name, hue, outline = DETECTIONS[severity]
            trace = traces[severity] = {
                "type": "scattergl", "mode": "markers", "name": name,
                "legendgroup": "detected", "x": [], "y": [], "customdata": [],
                "labels": {"form": "detection", "parts": []}, "hoverinfo": "text",
                "marker": {"symbol": "star", "color": hue, "size": 13,
                           "line": {"color": outline, "width": 1}},
            }
        rules = ", ".join(f"{rule} ({priority})" if priority else rule
                          for rule, priority, _ in matched)
        trace["x"].append(bar[2] / 1000)
        trace["y"].append(lane - lift)
        trace["labels"]["parts"] += (_string(strings, rules), what, thing, who)
        trace["customdata"].append(bar[0])
    return [traces[severity] for severity in DETECTIONS if severity in traces]


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
        raise ValueError(f"group must be one of {tuple(GROUPS)}, not {group!r}")
    per_lane: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for span in spans:
        per_lane[lane_of(span, group)][bins.index(span.start)] += 1
    return fold_lanes(((lane, list(cells), list(cells.values()))
                       for lane, cells in per_lane.items()),
                      bins, first=first, last=last, max_lanes=max_lanes)


def build_heatmap_figure(counts: LaneCounts) -> dict:
    """A lane × time heatmap of ``counts``, for windows with more events than bars can carry.
    ``customdata`` holds the counts (``z[row][bin]``, what the hover text says); ``z`` their
    decimal logarithm, rounded to 0.001 (None for an empty cell, which is not drawn), which the
    colour scale and its bar (labelled in counts: 1, 10, 100 …) follow. Compact: the x axis is
    ``x0`` (centre of the first bin) plus ``dx`` milliseconds per bin, not one time string per
    bin."""
    bins = counts.bins
    width_ms = bins.width / timedelta(milliseconds=1)
    end = bins.start + bins.width * bins.count
    busiest = max((n for row in counts.z for n in row), default=0)
    decades = range(int(math.log10(busiest)) + 1 if busiest else 1)
    layout = _layout(counts.lanes, yaxis={
        "type": "category", "tickmode": "array", "tickvals": counts.lanes,
        "ticktext": short_labels(counts.lanes)})
    layout["xaxis"]["range"] = [bins.start.isoformat(), end.isoformat()]
    return {
        "data": [{"type": "heatmap", "x0": (bins.start + bins.width / 2).isoformat(),
                  "dx": width_ms, "y": counts.lanes, "customdata": counts.z,
                  "z": [[round(math.log10(n), 3) if n else None for n in row]
                        for row in counts.z],
                  "colorscale": HEATMAP_COLOURSCALE, "zmin": 0,
                  "zmax": max(math.log10(busiest), 1) if busiest else 1,
                  "hoverongaps": False,
                  "colorbar": {"title": {"text": "events", "side": "top"}, "thickness": 10,
                               "len": 0.8, "outlinewidth": 0, "tickvals": list(decades),
                               "ticktext": [f"{10 ** d:,}" for d in decades]},
                  "hovertemplate": "%{y}<br>%{x}<br>%{customdata} events<extra></extra>"}],
        "layout": layout,
        "lanes": counts.lanes,
        "meta": {"mode": "heatmap", "spans": counts.total, "total": counts.total,
                 "lanes_per_page": LANES_PER_PAGE,
                 "lanes": counts.distinct_lanes, "lanes_shown": len(counts.lanes),
                 "other_lanes": counts.folded, "bins": bins.count, "bin_ms": width_ms,
                 "range": _range(counts.first, counts.last)},
    }


def _string(strings: dict[str, int], text: str) -> int:
    """The number of ``text`` in a figure's table of label strings (added if new)."""
    number = strings.get(text)
    if number is None:
        number = strings[text] = len(strings)
    return number


def hover_texts(figure: dict) -> list[list[str | None]]:
    """Each trace's hover texts, one per point, as the page makes them from the figure's
    ``labels`` (static/js/hover.js ``hoverTexts``; a browser test compares the two):

    - a bar (three points: start, end, gap) from its parts ``[what, object, user, took]``:
      ``"HH:MM:SS.ffffff kind what object user (took)"``, took in milliseconds to the
      microsecond, or ``open``; on both its ends;
    - a mutation marker from ``[what, user]``: ``"what by user at HH:MM:SS.ffffff"``;
    - a detection's star from ``[rules, what, object, user]``:
      ``"⚑ rules: what object by user at HH:MM:SS.ffffff"``;
    - a trace without labels (lifespans) keeps its ``text``, each bar's on both its ends."""
    strings = figure.get("labels", [])
    texts = []
    for trace in figure["data"]:
        labels = trace.get("labels")
        x = trace.get("x", [])
        if labels is None:
            text = list(trace.get("text", [None] * len(x)))
            for i in range(1, len(text)):
                if text[i] is None and trace["y"][i] is not None and trace["y"][i - 1] is not None:
                    text[i] = text[i - 1]
            texts.append(text)
            continue
        parts = labels["parts"]
        text: list[str | None] = [None] * len(x)
        if labels["form"] == "bar":
            for bar in range(len(parts) // 4):
                what, thing, user, took = parts[bar * 4:bar * 4 + 4]
                took_text = "open" if took < 0 else f"{took / 1000:.3f} ms"
                start = round(x[bar * 3] * 1000)
                text[bar * 3] = text[bar * 3 + 1] = (
                    f"{clock_time(start)} {labels['kind']} {strings[what]} {strings[thing]} "
                    f"{strings[user]} ({took_text})")
        elif labels["form"] == "detection":
            for point in range(len(x)):
                rules, what, thing, user = parts[point * 4:point * 4 + 4]
                text[point] = (f"⚑ {strings[rules]}: {strings[what]} {strings[thing]} by "
                               f"{strings[user]} at {clock_time(round(x[point] * 1000))}")
        else:
            for point in range(len(x)):
                what, user = parts[point * 2:point * 2 + 2]
                text[point] = (f"{strings[what]} by {strings[user]} at "
                               f"{clock_time(round(x[point] * 1000))}")
        texts.append(text)
    return texts


def clock_time(micros: int) -> str:
    """HH:MM:SS.ffffff (UTC) of a time in microseconds since the epoch, for hover text: made
    20,000 times over, so its seconds' part is remembered."""
    seconds, fraction = divmod(micros, 1_000_000)
    return f"{_clock(seconds % 86_400)}.{fraction:06}"


@cache  # of at most 86,400 keys, the seconds of a day
def _clock(second: int) -> str:
    minutes, second = divmod(second, 60)
    return f"{minutes // 60:02}:{minutes % 60:02}:{second:02}"


def _height(lanes: int) -> int:
    """The figure's height for ``lanes`` lanes shown: ``LANE_PX`` each, plus the room of the
    top margin (markers), the time axis, its title and the legend."""
    return max(MIN_HEIGHT, FRAME_PX + LANE_PX * lanes)


def _range(first: datetime | None, last: datetime | None) -> list[str] | None:
    if first is None or last is None:
        return None
    return [first.isoformat(), last.isoformat()]
