"""Reading the event store for the timeline figure: the one function that turns an incident and
a query (filters, ``lanes``, ``colour``) into figure JSON, used by the figure endpoint and by
``warm_overview`` after an ingest.

Heatmaps (views of more than ``MAX_SPANS`` events) are counted from the incident's column index
(``timelines.store.columns``, built after its uploads finish: 20–40 ms for a million events) or, for
a query the index cannot serve, by the database (about a second for a million events). Either
way they are cached as JSON bytes under the incident's data version and the query, and the
unfiltered overview is counted ahead of the first page view (bench/README.md, Figure
benchmark). A Gantt is built from the rows of its window each time, with a star on each of
them that a Falco rule matched (``detections.marks``: one more indexed query).
"""

from __future__ import annotations

import logging
from datetime import datetime

import orjson
from django.conf import settings
from django.core.cache import cache
from django.http import QueryDict

from incidents.models import Incident

from ..detections.marks import detection_marks
from ..figures.build import MAX_SPANS, build_gantt_figure, build_heatmap_figure, moment
from ..models import Event
from ..store import aggregate
from .filters import EventFilterSet

log = logging.getLogger(__name__)

FIGURE_CACHE_SECONDS = 7 * 24 * 3600  # keys name the data version: this only frees memory
VIEW_PARAMS = ("lanes", "colour")  # of the query, what is not a filter
# The views warmed after an ingest: the page's default (object lanes, no filter) first.
OVERVIEW_LANES = ("object", "actor")
# A row of these, times in microseconds (aggregate.span_rows), is a figures.Bar as it is.
SPAN_FIELDS = ("id", "kind", "received", "completed", "verb", "code", "resource", "namespace",
                "name", "username", "user_agent", "source", "reason", "subresource")


class BadQuery(ValueError):
    """The query's filters do not validate; ``errors`` says how."""

    def __init__(self, errors) -> None:
        super().__init__(str(errors))
        self.errors = errors


def figure_json(incident: Incident, params: QueryDict, *, group: str = "object",
                colour: str = "verb") -> bytes:
    """The figure of the incident's events filtered by ``params`` (EventFilterSet), as JSON
    bytes: a Gantt up to ``MAX_SPANS`` events, a heatmap counted by the database beyond (cached;
    a hit is served without counting or serialising again)."""
    filterset = EventFilterSet(params, queryset=Event.objects.filter(incident=incident))
    if not filterset.is_valid():
        raise BadQuery(filterset.errors)
    queryset = filterset.qs.order_by("received", "id")
    query = [(name, values) for name, values in params.lists() if name not in VIEW_PARAMS]
    version = aggregate.data_version(incident.pk)
    # A heatmap has no colours: its key leaves colour out.
    key = aggregate.figure_cache_key(incident.pk, version, group, query)
    body = cache.get(key) if key is not None else None
    if body is not None:
        return body
    since = filterset.form.cleaned_data.get("since")
    until = filterset.form.cleaned_data.get("until")
    from ..store import (
        columns,  # numpy: imported by the processes that draw, not by every ingest job
    )

    index = columns.load(incident.pk, version) if version is not None else None
    filters = index.filters(filterset.form.cleaned_data, [n for n, v in query if any(v)]) \
        if index is not None else None
    if filters is not None:
        window = index.select(filters, since, until)
        large = window.count > MAX_SPANS
        counts = index.lane_counts(window, group, since=since, until=until) if large else None
        if not large:  # a Gantt: read only its events (none, or those the index found)
            queryset = _gantt_rows(queryset, index, window, text="q" in filters)
    else:
        large = aggregate.more_than(queryset, MAX_SPANS)
        counts = aggregate.lane_counts(queryset, group, since=since, until=until,
                                       requests_only=aggregate.requests_only(incident.pk),
                                       ) if large else None
    if large:
        body = orjson.dumps(build_heatmap_figure(counts) if counts else build_gantt_figure([]))
        if key is not None:
            cache.set(key, body, FIGURE_CACHE_SECONDS)
        return body
    bars = list(aggregate.span_rows(queryset, SPAN_FIELDS))
    # orjson: an 18,000-bar Gantt in 5 ms, DRF's JSON renderer takes 40
    return orjson.dumps(build_gantt_figure(
        bars, group=group, colour=colour, window_start=since, window_end=until,
        detections=detection_marks([incident.pk], incident.team_id, bars)))


def _gantt_rows(queryset, index, window, *, text: bool):
    """The events of a Gantt the column index selected (``window``, at most ``MAX_SPANS``):
    none without a query when it found none, else those received from its first to its last,
    and with the text filter ``q`` those of its ids (the database would test the text of every
    event of the span: a rare term's Gantt took 0.5 s at 1M events, a term no event holds as
    long)."""
    if window.count == 0:
        return queryset.none()
    times = index.times(window)
    queryset = queryset.filter(received__range=(moment(times[0]), moment(times[-1])))
    return queryset.filter(id__in=index.selected(index.id, window).tolist()) if text else queryset


def build_column_index(incident_id: int) -> bool:
    """Build a large incident's column index once its uploads have finished
    (``timelines.store.columns``: any later heatmap, filtered or not, is counted from it in
    milliseconds); returns whether it did. Does nothing while an upload of the incident is
    still being read, for a small incident (its Gantt is quick) or one deleted meanwhile."""
    incident = _large_and_settled(incident_id)
    version = aggregate.data_version(incident_id) if incident is not None else None
    if version is None:
        return False
    from ..store import columns

    try:
        columns.build(incident_id, version)
    except (columns.UnusualValues, OSError) as exc:
        # the database keeps counting: slower, the same answer (OSError: a full or read-only
        # HINDSIGHT_COLUMNS_DIR must not fail an ingest that has succeeded)
        log.warning("no column index for incident %s: %s", incident_id, exc)
        return False
    return True


def warm_overview(incident_id: int, *, cache_figures: bool = True) -> int:
    """Prepare a large incident's figures once its uploads have finished: its column index
    (``build_column_index``, unless built already) and, with ``cache_figures``, the unfiltered
    heatmaps (``OVERVIEW_LANES``) counted and cached so that the first page view is served from
    the cache. Does nothing while an upload of the incident is still being read, for a small
    incident (its Gantt is quick and not cached) or for an incident deleted meanwhile. Returns
    how many views it counted."""
    incident = _large_and_settled(incident_id)
    if incident is None:
        return 0
    build_column_index(incident_id)  # nothing to do if built already
    if not cache_figures:
        return 0
    for group in OVERVIEW_LANES:
        figure_json(incident, QueryDict(), group=group)
    log.info("counted the overview of incident %s", incident_id)
    return len(OVERVIEW_LANES)


def _large_and_settled(incident_id: int) -> Incident | None:
    """The incident, if every upload of it has been read and it holds more events than the
    Gantt draws one by one."""
    incident = Incident.objects.filter(pk=incident_id).first()
    if incident is None or incident.uploads.filter(finished_at=None).exists():
        return None
    if not aggregate.more_than(Event.objects.filter(incident=incident), MAX_SPANS):
        return None
    return incident


def shared_cache() -> bool:
    """Whether other processes see this process's cache (not the in-process default)."""
    return "locmem" not in settings.CACHES["default"]["BACKEND"].lower()


def window_of(params: QueryDict) -> tuple[datetime | None, datetime | None]:
    """``since`` and ``until`` of a query's filters (None where absent or invalid)."""
    form = EventFilterSet(params, queryset=Event.objects.none()).form
    form.is_valid()
    return form.cleaned_data.get("since"), form.cleaned_data.get("until")
