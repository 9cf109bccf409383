"""The incident page's first view: the facets of one field and the overview strip (counts, a
histogram by outcome, the top values of the main fields and a suggested first window), as cached
JSON. Counting is ``timelines.reads.facets``' (column index or database); the suggested window is
``suggest_window``, a pure function of the events' sorted times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.http import QueryDict

from incidents.models import Incident

from ..figures.build import Bins, microseconds, moment
from . import facets
from .facets import SERIES, bounded, rank
from .queries import window_of

HISTOGRAM_BINS = 120
# The request fields first, then those of other evidence (Events' reasons, log lines'
# components and nodes, the files they came from): an incident of Events and logs alone has no
# user or verb, and the page shows the lists that hold values.
OVERVIEW_FIELDS = ("user", "user_agent", "verb", "resource", "namespace", "code", "kind",
                   "reason", "component", "node", "source")
DEFAULT_TOP = 8
MAX_TOP = 100

# The suggested window (``suggest_window``).
GAP_SHARE = 0.05  # a gap longer than this share of the whole span splits the events …
MIN_GAP_US = 60_000_000  # … if it is also longer than a minute
# The largest part is kept alone only if it holds this share of the events: what is left out
# must be stragglers, not a phase of the incident (see ``suggest_window``).
KEEP_SHARE = 0.8
RUN_SHARE = 0.99  # the shortest run holding this share of the kept events …
RUN_MAX_SHARE = 0.5  # … becomes the window if it is shorter than this share of their span
PAD_SHARE = 0.02  # padding on each side, as a share of the window
MIN_PAD_US = 1_000  # so that a window of one instant still has a width


@dataclass(frozen=True)
class Suggestion:
    """A first window for the page: ``since``..``until`` (µs, both included), how many events
    fall inside and outside, and why (``gap``: events beyond a long gap left out; ``dense``:
    nearly all events within a small part of the span)."""

    since: int
    until: int
    events: int
    outside: int
    reason: str

    def as_json(self) -> dict:
        return {"since": moment(self.since).isoformat(), "until": moment(self.until).isoformat(),
                "events": self.events, "outside": self.outside, "reason": self.reason}


def suggest_window(times: np.ndarray) -> Suggestion | None:
    """The first window to show of events at ``times`` (µs, sorted), or None when the whole
    span is the right view.

    (a) The events are split at every gap longer than ``GAP_SHARE`` of their whole span and
    longer than ``MIN_GAP_US``; if the largest part holds ``KEEP_SHARE`` of the events, only it
    is kept. (Half, the first rule tried, hid the first 9 of the 37 requests of audit2rbac's
    demo log, its 403s, 26 minutes before a burst of 28: a phase of the incident, not
    stragglers. 80% keeps them, and still drops 3 stragglers beside 30 events, or the 2 lines
    of a must-gather's own timestamp two hours after its 165,551 events.) (b)
    Within what is kept, the shortest run of consecutive events holding ``RUN_SHARE`` of them
    (the earliest of equals), if shorter than ``RUN_MAX_SHARE`` of the kept span, is the window;
    otherwise the kept part is, if (a) left anything out. The window is padded by ``PAD_SHARE``
    of its length on each side (at least ``MIN_PAD_US``) within the events' span. None when it
    holds every event (or there are fewer than two instants). Linear in the events."""
    count = len(times)
    if count < 2 or times[-1] == times[0]:
        return None
    first, last = int(times[0]), int(times[-1])
    kept, reason = times, ""
    limit = max(GAP_SHARE * (last - first), MIN_GAP_US)
    cuts = np.flatnonzero(np.diff(times) > limit) + 1
    if cuts.size:
        starts = np.concatenate(([0], cuts))
        sizes = np.diff(np.concatenate((starts, [count])))
        largest = int(np.argmax(sizes))
        if sizes[largest] >= KEEP_SHARE * count:
            kept = times[starts[largest]:starts[largest] + sizes[largest]]
            reason = "gap"
    low, high = int(kept[0]), int(kept[-1])
    need = -(-round(RUN_SHARE * 1000) * len(kept) // 1000)  # ceiling, in integers
    if need < len(kept):
        lengths = kept[need - 1:] - kept[:len(kept) - need + 1]
        start = int(np.argmin(lengths))
        if lengths[start] < RUN_MAX_SHARE * (high - low):
            low, high = int(kept[start]), int(kept[start + need - 1])
            reason = reason or "dense"
    if not reason:
        return None
    pad = max(int(PAD_SHARE * (high - low)), MIN_PAD_US)
    since, until = max(first, low - pad), min(last, high + pad)
    inside = int(np.searchsorted(times, until, "right") - np.searchsorted(times, since, "left"))
    if inside == count:
        return None
    return Suggestion(since, until, inside, count - inside, reason)


def overview(incident: Incident, params: QueryDict, *, version: str | None) -> dict:
    """The overview answer (not cached; ``overview_json`` caches it)."""
    top = bounded(params, "top", DEFAULT_TOP, MAX_TOP)
    selection = facets.select(incident, params, version=version, fields=OVERVIEW_FIELDS)
    total = selection.total
    span = selection.range() if total else None
    histogram = None
    if span is not None:
        since, until = _window(params)
        start = min(span[0], since) if since is not None else span[0]
        end = max(span[1], until) if until is not None else span[1]
        bins = Bins.spanning(moment(start), moment(end), HISTOGRAM_BINS)
        counts = selection.histogram(bins)
        names = [n for n in SERIES if n in counts] + sorted(set(counts) - set(SERIES))
        histogram = {"start": bins.start.isoformat(),
                     "end": (bins.start + bins.width * bins.count).isoformat(),
                     "bin_ms": bins.width.total_seconds() * 1000, "bins": bins.count,
                     "by": "outcome",
                     "series": [{"name": n, "counts": counts[n]} for n in names]}
    values = selection.value_counts(OVERVIEW_FIELDS) if total else {}
    top_values = {}
    for field in OVERVIEW_FIELDS:
        shown, distinct = rank(values.get(field, []), limit=top)
        top_values[field] = {"values": shown, "distinct": distinct}
    # the suggested window is for the whole incident under the filters: since/until left out
    whole = selection
    if any(params.get(name) for name in ("since", "until")):
        whole = facets.select(incident, params, version=version, window=False)
    suggestion = suggest_window(whole.times()) if whole.total else None
    return {"total": total,
            "range": [moment(t).isoformat() for t in span] if span else None,
            "histogram": histogram, "facets": top_values,
            "window": suggestion.as_json() if suggestion else None}


def _window(params: QueryDict) -> tuple[int | None, int | None]:
    since, until = window_of(params)
    return (microseconds(since) if since else None, microseconds(until) if until else None)


def facets_json(incident: Incident, params: QueryDict) -> bytes:
    """``facets.facets`` as JSON bytes, cached under the data version and the query."""
    return facets.cached_json(incident, params, "facets", ("field", "limit", "contains"),
                              facets.facets)


def overview_json(incident: Incident, params: QueryDict) -> bytes:
    """``overview`` as JSON bytes, cached under the data version and the query."""
    return facets.cached_json(incident, params, "overview", ("top",), overview)

