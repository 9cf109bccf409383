"""Database-side queries behind the timeline figure: how many events a view holds (cheaply),
their time range, the Gantt's rows, their counts per lane and time bin for the heatmap, and the
data version that figure cache keys name.

On PostgreSQL the heatmap is one ``GROUP BY`` lane × ``date_bin`` over the filtered events, one
row per lane back (its bins and counts as arrays), then ranked and folded in Python: a few
thousand rows, whatever the number of events. Object and actor lanes
read only the ``event_object`` and ``event_actor`` indexes (index-only scans) for every event with
a resource (or a user); events without one visit the table for their ``kind``, which names their
lane, unless the incident holds requests only (``requests_only``). SQLite, the embedded mode,
counts in Python over every matching row: slower, same answer (``figures.build.count_lanes`` is also
what the PostgreSQL query is tested against).

Over a million events this still takes about a second on two busy cores (bench/README.md):
which is why large incidents get a column index (``timelines.store.columns``) and the figure
endpoint caches heatmaps under ``figure_cache_key``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta

from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.models import BigIntegerField, Count, Func, Max, Min, Q, QuerySet

from incidents.models import Upload

from ..figures.build import (
    HEATMAP_BINS,
    HEATMAP_LANES,
    Bins,
    LaneCounts,
    Span,
    count_lanes,
    fold_lanes,
    microseconds,
)
from ..figures.lanes import LANE_SQL

# Formats whose parsers yield requests only (kind audit). An incident whose uploads are all of
# these (or bundles, or files no parser took, which hold no events) needs no event's ``kind``
# to name its lanes: "(audit)". Then object and actor lanes are counted from their index alone,
# about a third faster than reading the table for the kind of every event without a resource.
# An allowlist: a format added later falls back to reading the kind.
REQUEST_FORMATS = frozenset({"audit", "gke-audit", "eks-cloudwatch", "aks-diagnostics",
                             "otlp-audit", "legacy-audit"})
_SPAN_COLUMNS = ("kind", "received", "resource", "namespace", "name", "username", "user_agent",
                 "source")


class _EpochMicroseconds(Func):
    """A timestamp as integer microseconds since the epoch (PostgreSQL): exact, and an integer
    loads several times faster than psycopg parses a timestamp's text."""

    template = "(extract(epoch FROM %(expressions)s) * 1000000)::bigint"
    output_field = BigIntegerField()


def span_rows(queryset: QuerySet, fields: Sequence[str]) -> Iterable[tuple]:
    """``queryset.values_list(*fields)``, but ``received`` and ``completed`` as integer
    microseconds since the epoch (what ``figures.build.Bar`` holds), and quick for the Gantt's
    thousands of rows. On PostgreSQL the database turns the times into integers (psycopg parses
    a timestamp's text several times slower than an integer's) and the rows come straight from
    the cursor, without the ORM's work per row: 18,000 rows in 60 ms instead of 110."""
    times = {f: f"_{f}_us" for f in fields if f in ("received", "completed")}
    if connection.vendor != "postgresql":
        return _rows_in_microseconds(queryset.values_list(*fields), [
            i for i, f in enumerate(fields) if f in times])
    rows = queryset.annotate(**{alias: _EpochMicroseconds(f) for f, alias in times.items()})
    try:
        sql, params = rows.values_list(*(times.get(f, f) for f in fields)).query.sql_with_params()
    except EmptyResultSet:  # a filter that matches nothing by construction (queryset.none())
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _rows_in_microseconds(rows: Iterable[tuple], at: Sequence[int]) -> Iterator[tuple]:
    for row in rows:
        row = list(row)
        for i in at:
            if row[i] is not None:
                row[i] = microseconds(row[i])
        yield tuple(row)


def more_than(queryset: QuerySet, limit: int) -> bool:
    """Whether the queryset holds more than ``limit`` rows, reading at most ``limit + 1`` of them
    (``SELECT count(*) FROM (… LIMIT limit + 1)``) rather than counting them all."""
    return queryset.order_by().values("pk")[:limit + 1].count() > limit


def time_range(queryset: QuerySet) -> tuple[datetime | None, datetime | None]:
    """(first, last) ``received`` of the queryset's events, (None, None) when it has none."""
    bounds = queryset.order_by().aggregate(first=Min("received"), last=Max("received"))
    return bounds["first"], bounds["last"]


def requests_only(incident_id: int) -> bool:
    """Whether every event of the incident is a request (kind audit), judged by the formats of
    its uploads (see ``REQUEST_FORMATS``)."""
    formats = set(Upload.objects.filter(incident_id=incident_id).order_by()
                  .values_list("format", flat=True).distinct())
    return formats <= REQUEST_FORMATS | {"bundle", ""}


def lane_counts(queryset: QuerySet, group: str, *, since: datetime | None = None,
                until: datetime | None = None, bins: int = HEATMAP_BINS,
                max_lanes: int | None = None, requests_only: bool = False) -> LaneCounts | None:
    """Events of the queryset per lane (``lanes.lane_name``, here ``lanes.LANE_SQL``) and time
    bin of ``received``; the ``max_lanes`` most active lanes, the rest summed into
    ``OTHER_LANES``. The bins cover ``since``..``until`` where given, else the events' own
    range. None if there is no event. ``max_lanes`` defaults to ``HEATMAP_LANES``.
    ``requests_only``: the caller knows every event is of kind audit (``requests_only()``),
    which makes the count cheaper."""
    if group not in LANE_SQL:
        raise ValueError(f"unknown grouping {group!r}")
    max_lanes = HEATMAP_LANES if max_lanes is None else max_lanes
    first, last = time_range(queryset)
    if first is None or last is None:
        return None
    edges = Bins.spanning(min(since or first, first), max(until or last, last), bins)
    if connection.vendor == "postgresql":
        return _lane_counts_postgres(queryset, group, edges, first, last, max_lanes,
                                     requests_only)
    rows = queryset.order_by().values_list(*_SPAN_COLUMNS).iterator(chunk_size=5000)
    spans = (Span(0, kind, received, None, "", None, resource, namespace, name, user, agent,
                  source, "") for kind, received, resource, namespace, name, user, agent, source
             in rows)
    return count_lanes(spans, group, edges, first=first, last=last, max_lanes=max_lanes)


def _lane_counts_postgres(queryset: QuerySet, group: str, edges: Bins, first: datetime,
                          last: datetime, max_lanes: int, requests_only: bool) -> LaneCounts:
    parts, has_own, other_parts = LANE_SQL[group]
    if requests_only and has_own is not None:
        # one pass over the index: events without the lane's column are all "(audit)"
        parts = (f"CASE WHEN {has_own} THEN {parts[0]} ELSE '(audit)' END", *parts[1:])
        has_own = other_parts = None
    inner, inner_params = queryset.order_by().values(*_SPAN_COLUMNS).query.sql_with_params()

    def branch(lane_parts, condition):
        where = f" WHERE {condition}" if condition else ""
        return (f"SELECT {lane_parts[0]} AS l1, {lane_parts[1]} AS l2, {lane_parts[2]} AS l3,"
                f" date_bin(%s, received, %s) AS bin, count(*) AS n"
                f" FROM ({inner}) e{where} GROUP BY 1, 2, 3, 4",
                [edges.width, edges.start, *inner_params])

    cells, params = branch(parts, has_own)
    if other_parts is not None:
        others, other_params = branch(other_parts, f"NOT ({has_own})")
        cells, params = f"{cells} UNION ALL {others}", params + other_params
    # One row per lane with its bins (as indexes: bin - start is a whole number of widths) and
    # counts; ranking and folding the lanes is figures.fold_lanes. Measured on 1M events in
    # 6,300 lanes: 100 ms more than the GROUP BY alone, where ranking and folding in SQL (joins
    # of 240,000 cells on the lane's name) took 400 ms more.
    sql = (f"SELECT l1, l2, l3,"
           f" array_agg((round(date_part('epoch', bin - %s) * 1000000)::bigint / %s)::int),"
           f" array_agg(n) FROM ({cells}) c GROUP BY l1, l2, l3")
    width_us = edges.width // timedelta(microseconds=1)
    with transaction.atomic(), connection.cursor() as cursor:
        # JIT compilation costs more than it saves on a query that runs once, and the hash
        # table of many lanes × bins must not spill to disk (4 MB default work_mem).
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(sql, [edges.start, width_us, *params])
        rows = cursor.fetchall()
    lanes = (("/".join(p for p in (l1, l2, l3) if p), columns, counts)
             for l1, l2, l3, columns, counts in rows)
    return fold_lanes(lanes, edges, first=first, last=last, max_lanes=max_lanes)


def data_version(incident_id: int) -> str | None:
    """A name for the state of an incident's evidence that changes with every finished upload
    (count and latest ``finished_at``), for cache keys; None while an upload is being read,
    when the evidence is changing under any answer (not while the analyses run behind a
    ``ready`` upload: its events are all there)."""
    state = Upload.objects.filter(incident_id=incident_id).aggregate(
        finished=Count("pk", filter=Q(finished_at__isnull=False)), latest=Max("finished_at"),
        running=Count("pk", filter=Q(status=Upload.Status.RUNNING,
                                     stage=Upload.Stage.READING)))
    if state["running"]:
        return None
    latest = state["latest"].isoformat() if state["latest"] else "-"
    return f"{state['finished']}.{latest}"


def figure_cache_key(incident_id: int, version: str | None, group: str,
                     query: Iterable[tuple[str, list[str]]]) -> str | None:
    """The cache key of an incident's figure for a lanes grouping and the other query
    parameters (name, values): it names the incident's data version (``data_version``), so a
    finished upload makes a new key and old entries just expire. None while the evidence is
    changing (``version`` None)."""
    if version is None:
        return None
    normal = sorted((name, sorted(values)) for name, values in query)
    digest = hashlib.sha256(repr((version, group, normal)).encode()).hexdigest()[:40]
    return f"hindsight:figure:{incident_id}:{digest}"
