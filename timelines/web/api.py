"""REST API for events (``/api/v1/``)."""

from __future__ import annotations

import csv
import gzip
import re
from dataclasses import dataclass
from datetime import datetime

import orjson
from django.db.models import Q
from django.http import HttpResponse, StreamingHttpResponse
from django.utils.cache import patch_vary_headers
from django.utils.dateparse import parse_datetime
from rest_framework import mixins, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response

from incidents.access import get_visible_incident, visible_incidents

from ..figures.build import COLOURS, microseconds, moment
from ..figures.lanes import GROUPS
from ..models import Event
from ..reads.diff import NoVersion, diff, object_version
from ..reads.filters import EventFilterSet
from ..reads.queries import BadQuery, figure_json
from ..store import aggregate, columns
from .serializers import LIST_COLUMNS, EventDetailSerializer, EventSerializer, event_rows

# Figure answers from this size on go gzipped to a client that accepts it: an 18,000-bar Gantt's
# 2.5 MB become 0.65 MB in 17 ms at level 1 (level 6 is about 4 times slower for a sixth less).
# They hold no secret beside text the client chose (BREACH).
GZIP_MIN_BYTES = 64 * 1024
_ACCEPTS_GZIP = re.compile(r"\bgzip\b")


class EventCursorPagination(CursorPagination):
    ordering = ("received", "id")
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


class IncidentEventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Events of one incident, filtered (see ``EventFilterSet``), in time order, by cursor."""

    serializer_class = EventSerializer
    filterset_class = EventFilterSet
    pagination_class = EventCursorPagination

    def get_queryset(self):
        incident = get_visible_incident(self.request.user, self.kwargs["incident_pk"])
        return Event.objects.filter(incident=incident)

    def list(self, request, *args, **kwargs):
        """The page as ``EventSerializer`` gives it, from plain rows (``event_rows``), read
        only where the column index says the page's events are (``narrowed``)."""
        cursor = self.paginator.decode_cursor(request)  # 404 for a bad one, as the paginator
        offset, reverse, position = cursor if cursor is not None else (0, False, None)
        queryset = narrowed(int(self.kwargs["incident_pk"]), request.query_params,
                            self.filter_queryset(self.get_queryset()),
                            rows=offset + self.paginator.get_page_size(request) + 1,
                            position=position, reverse=reverse)
        page = self.paginate_queryset(queryset.values(*LIST_COLUMNS))
        return self.get_paginated_response(event_rows(page))


_LAST = 2 ** 62  # µs beyond any event: ``before`` it reaches back from the incident's end


@dataclass
class IndexQuery:
    """A query of the events list in the column index's terms (``index_query``)."""

    index: columns.ColumnIndex
    filters: dict[str, list]  # parameter → cleaned values; ``q``: terms folded as the index
    since: datetime | None
    until: datetime | None

    @property
    def text(self) -> bool:
        return "q" in self.filters

    def reach(self, *, rows: int, after: int | None = None, before: int | None = None):
        return self.index.reach(self.filters, self.since, self.until, count=rows, after=after,
                                before=before)

    def ids(self, first: int, last: int) -> list[int]:
        return self.index.ids(self.filters, first, last).tolist()


def index_query(incident_id: int, params, queryset) -> IndexQuery | None:
    """``params`` as the incident's column index can answer it, or None when it cannot: it is
    not at the current data version, or does not hold every filter given (``group``,
    ``audit_id``, ``id``; a ``q`` term holding a control character it uses as a separator), or
    only ``since``/``until`` are given, which the database's ``(incident, received)`` index
    serves as well."""
    given = {n: v for n, v in params.lists() if n in EventFilterSet.base_filters and any(v)}
    if not any(name in columns.FILTER_COLUMNS or name == "q" for name in given) \
            or not columns.ColumnIndex.serves(given):
        return None
    version = aggregate.data_version(incident_id)
    index = columns.load(incident_id, version) if version is not None else None
    if index is None:
        return None
    filterset = EventFilterSet(params, queryset=queryset)
    if not filterset.is_valid():  # the filter backend has refused it already
        return None
    data = filterset.form.cleaned_data
    filters = index.filters(data, given)
    if filters is None:
        return None
    return IndexQuery(index, filters, data.get("since"), data.get("until"))


def narrowed(incident_id: int, params, queryset, *, rows: int, position: str | None = None,
             reverse: bool = False):
    """``queryset``, the incident's events filtered by ``params``, narrowed for a page of the
    cursor pagination with the incident's column index (``index_query``). The page reads the
    first ``rows`` matching events received after ``position`` (the cursor's, exclusive;
    before it when ``reverse``): no query at all when there is none, else ``received`` between
    the first and the last of them (inclusive, so those rows stay, in the same order, whatever
    their ties). Without it a value that no index of the table leads with (namespace, code,
    name, verb …), absent, rare or only late in the incident, walks the incident in time order
    until the page is full. With the text filter ``q`` the rows are also read by the ids the
    index found: the database would otherwise test the text of every event of the span.
    Unchanged where the index cannot serve."""
    point = None
    if reverse and position is None:  # not a cursor the paginator writes
        return queryset
    if position is not None:  # as the paginator wrote it: str() of an event's received
        try:
            instant = parse_datetime(position)
        except ValueError:
            instant = None
        if instant is None or instant.tzinfo is None:
            return queryset  # not one of ours: the paginator answers it as it can
        point = microseconds(instant)
    query = index_query(incident_id, params, queryset)
    if query is None:
        return queryset
    span = query.reach(rows=rows, after=None if reverse else point,
                       before=point if reverse else None)
    if span is None:
        return queryset.none()
    queryset = queryset.filter(received__gte=moment(span[0]), received__lte=moment(span[1]))
    return queryset.filter(id__in=query.ids(*span)) if query.text else queryset


class EventViewSet(mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """One event with its stored (redacted) body."""

    serializer_class = EventDetailSerializer

    def get_queryset(self):
        return Event.objects.filter(incident__in=visible_incidents(self.request.user))

    @action(detail=True)
    def diff(self, request, pk=None):
        """What changed in the object from event ``against`` to this one:
        ``{"changes": [{"path", "before", "after"}], "folded": [paths]}``. Bookkeeping
        (resourceVersion, managedFields, …) is folded unless ``fold=false``. 422 with the reason
        when either event holds no object version (Metadata level, a patch body, an object the
        apiserver skipped as too big)."""
        event = self.get_object()
        against_id = request.query_params.get("against", "")
        if not against_id.isdigit():
            raise ValidationError({"against": "Give the id of the event to compare with."})
        against = self.get_queryset().filter(pk=int(against_id)).first()
        if against is None:
            raise NotFound("No such event.")
        try:
            before = object_version(against.body())
            after = object_version(event.body())
        except NoVersion as exc:
            return Response({"detail": f"No diff: {exc}."}, status=422)
        fold = request.query_params.get("fold", "true").lower() not in ("false", "0", "no")
        changes, folded = diff(before, after, fold=fold)
        return Response({"event": event.pk, "against": against.pk, "changes": changes,
                         "folded": folded})


def _filtered_events(request, incident_pk: int):
    """The incident (404 unless visible) and its events filtered by the query string, in time
    order (400 on a bad filter)."""
    incident = get_visible_incident(request.user, incident_pk)
    filterset = EventFilterSet(request.query_params,
                               queryset=Event.objects.filter(incident=incident))
    if not filterset.is_valid():
        raise ValidationError(filterset.errors)
    return incident, filterset.qs.order_by("received", "id")


def figure_options(params) -> tuple[str, str]:
    """The figure's grouping of lanes and colouring from ``lanes`` and ``colour`` (the incident's
    and a stream's figure); 400 for another value."""
    group = params.get("lanes", "object")
    colour = params.get("colour", "verb")
    if group not in GROUPS or colour not in COLOURS:
        raise ValidationError({"lanes": f"one of {', '.join(GROUPS)}",
                               "colour": f"one of {', '.join(COLOURS)}"})
    return group, colour


@api_view(["GET"])
def incident_figure(request, incident_pk: int):
    """The timeline figure of the incident's filtered events (Plotly JSON): a Gantt of WebGL
    bars up to ``MAX_SPANS`` events, a lane × time heatmap beyond (``timelines.reads.queries``).
    ``lanes`` = object, actor, user_agent or source (``group`` is taken: it filters by user
    group); ``colour`` = verb or outcome. ``since``/``until`` also set the drawn window, so a
    client zoomed into a window of at most ``MAX_SPANS`` events gets that window's Gantt.

    ``meta``: ``mode`` (gantt or heatmap), ``spans`` (events drawn or counted), ``lanes``
    (distinct lanes), ``total`` (events matching, always exact: nothing is truncated), ``range``
    ([first, last] ``received`` of the matching events, ISO 8601, or null); for a Gantt also
    ``detected`` (drawn requests a Falco rule matched, each starred: ``detections.marks``); for
    a heatmap ``lanes_shown`` (rows, the most active lanes plus one "(other lanes)" row if any),
    ``other_lanes`` (lanes summed into that row), ``bins`` and ``bin_ms``.

    Heatmaps are counted from the incident's column index (or the database), cached under the
    incident's data version and the query, and the unfiltered ones are counted right after each
    ingest. A Gantt's hover texts are numbers into the figure's ``labels`` (see
    ``figures.build.hover_texts``).
    Answers of ``GZIP_MIN_BYTES`` or more are gzipped when the client accepts it.
    """
    incident = get_visible_incident(request.user, incident_pk)
    group, colour = figure_options(request.query_params)
    try:
        body = figure_json(incident, request.query_params, group=group, colour=colour)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    response = HttpResponse(body, content_type="application/json")
    patch_vary_headers(response, ["Accept-Encoding"])
    if len(body) >= GZIP_MIN_BYTES and _ACCEPTS_GZIP.search(
            request.META.get("HTTP_ACCEPT_ENCODING", "")):
        response.content = gzip.compress(body, compresslevel=1, mtime=0)
        response["Content-Encoding"] = "gzip"
    return response


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


CSV_COLUMNS = ["received", "user", "verb", "code", "resource", "name", "subresource",
               "namespace", "kind", "reason", "message", "duration_ms", "completed",
               "impersonated_user", "user_agent", "source_ip", "audit_id", "source", "line", "id"]


class _Echo:
    def write(self, value: str) -> str:
        return value


def _exported(request, incident_pk: int):
    """``_filtered_events`` for an export: with the incident's column index, read only from the
    first match to the last, and nothing when no event matches."""
    incident, queryset = _filtered_events(request, incident_pk)
    query = index_query(incident.pk, request.query_params, queryset)
    if query is None:
        return incident, queryset
    first, last = query.reach(rows=1), query.reach(rows=1, before=_LAST)
    if first is None or last is None:
        return incident, queryset.none()
    return incident, queryset.filter(received__gte=moment(first[0]),
                                     received__lte=moment(last[1]))


@api_view(["GET"])
def incident_events_csv(request, incident_pk: int):
    """The incident's events as CSV, filtered like the events list, in time order; streamed.
    Read only where the column index finds the matches (``_exported``)."""
    incident, queryset = _exported(request, incident_pk)
    writer = csv.writer(_Echo())
    fields = [("username" if c == "user" else c) for c in CSV_COLUMNS]

    def rows():
        yield writer.writerow(CSV_COLUMNS)
        for values in queryset.values_list(*fields).iterator(chunk_size=2000):
            yield writer.writerow([_csv_cell(v) for v in values])

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="incident-{incident.pk}-events.csv"'
    return response


@api_view(["GET"])
def incident_events_json(request, incident_pk: int):
    """The incident's events as a JSON array of objects with the CSV's columns (``CSV_COLUMNS``),
    filtered like the events list, in time order; streamed row by row, never held whole; read
    only where the column index finds the matches (``_exported``)."""
    incident, queryset = _exported(request, incident_pk)
    fields = [("username" if c == "user" else c) for c in CSV_COLUMNS]

    def chunks():
        yield b"["
        separator = b"\n"
        for values in queryset.values_list(*fields).iterator(chunk_size=2000):
            yield separator + orjson.dumps(dict(zip(CSV_COLUMNS, values, strict=True)))
            separator = b",\n"
        yield b"\n]\n"

    response = StreamingHttpResponse(chunks(), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="incident-{incident.pk}-events.json"'
    return response


@api_view(["GET"])
def incident_event_step(request, incident_pk: int):
    """The neighbour of event ``from`` among the incident's filtered events in ``(received, id)``
    order: ``direction=next`` (the default) the first one after it, ``previous`` the last one
    before it; without ``from`` the first (or last) of all. ``{"event": {...}}``, ``null`` when
    there is none. One indexed query, whatever the distance: the incident page steps with it
    (j/k) and finds the next match (``q``). ``from`` itself need not match the filters."""
    incident, queryset = _filtered_events(request, incident_pk)
    direction = request.query_params.get("direction", "next")
    if direction not in ("next", "previous"):
        raise ValidationError({"direction": "next or previous"})
    origin = request.query_params.get("from", "")
    if origin:
        if not origin.isdigit():
            raise ValidationError({"from": "an event id"})
        anchor = (Event.objects.filter(incident=incident, pk=int(origin))
                  .values_list("received", "id").first())
        if anchor is None:
            raise NotFound("No such event in this incident.")
        received, pk = anchor
        if direction == "next":
            queryset = queryset.filter(Q(received__gt=received) | Q(received=received, id__gt=pk))
        else:
            queryset = queryset.filter(Q(received__lt=received) | Q(received=received, id__lt=pk))
    # The column index says how far the neighbour can be: the first match strictly after
    # (before) the anchor's time bounds it, an event at the anchor's own time with a greater
    # (smaller) id being the only nearer one; no match at all answers null without a query.
    # With the text filter ``q`` the candidates are also the ids the index found from the
    # anchor's time to that bound, so that the database tests no event's text.
    point = microseconds(received) if origin else None
    forward = direction == "next"
    query = index_query(incident.pk, request.query_params, queryset)
    if query is not None:
        span = query.reach(rows=1, after=point if forward else None,
                           before=None if forward else (point if origin else _LAST))
        if span is not None:
            bound = moment(span[0])
        elif origin:
            bound = received  # only events at the anchor's own time can follow it
        else:
            return Response({"event": None})
        queryset = queryset.filter(**{"received__lte" if forward else "received__gte": bound})
        if query.text:
            ends = [microseconds(bound)] + ([point] if origin else [])
            queryset = queryset.filter(id__in=query.ids(min(ends), max(ends)))
    if direction == "previous":
        queryset = queryset.order_by("-received", "-id")
    event = queryset.first()
    return Response({"event": EventSerializer(event).data if event is not None else None})
