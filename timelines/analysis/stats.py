"""Request time: who spends the apiserver's time, and how many requests each keeps in flight.

``stats`` answers ``GET /api/v1/incidents/{id}/stats/?by=…``: the incident's requests (events
of kind ``audit``) that match the events filters, grouped by one field (``BY``), each group as
``{"key", "requests", "total_ms", "p50_ms", "p95_ms", "max_ms", "errors"}``:

- ``requests`` counts every matching request, those that never completed included;
- ``total_ms``, ``p50_ms``, ``p95_ms`` and ``max_ms`` are over the *completed* requests' durations
  (``completed − received``, exact microseconds, given in milliseconds); the percentiles and
  the maximum are null for a group none of whose requests completed;
- ``errors`` counts the answers of 400 and more.

**Percentiles** are nearest-rank: the p-th percentile of n durations is the ⌈p·n⌉-th shortest
(the first when that is 0), always one of the measured durations, never an interpolation. It is
PostgreSQL's ``percentile_disc``, computed with the same float arithmetic (``rank_of``), so the
three ways of answering (column index, PostgreSQL, Python on SQLite) agree value for value.

Rows come sorted by ``total_ms`` descending, ties by key (``null`` last).

``in_flight`` answers ``…/stats/inflight/``: over equal time bins, the mean number of requests
in flight in each bin (the time requests spent in flight inside the bin, divided by its width:
a bin where 100 LIST calls each ran throughout shows 100), for the ``top`` keys with the most
time in flight and the rest summed. A request is in flight from ``received`` to ``completed``;
one that never completed, to the end of the chart (the last moment the selection knows).

Both are computed where the events are quickest to read, as facets are (``timelines.reads.facets``):
from the column index (each event's signature gives its key, ``duration.npy`` its duration),
else by the database (PostgreSQL's ``percentile_disc``; for the in-flight chart PostgreSQL sends
each key's times in one pass; on SQLite the rows are read and grouped in Python). The arithmetic
is the pure functions ``group_stats`` and ``in_flight`` over arrays. At 1,000,000 requests the
index answers in about 40 ms of CPU, PostgreSQL in 2-4 s (``bench/analysis``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

import numpy as np
from django.db import connection, transaction
from django.http import QueryDict

from incidents.models import Incident

from ..figures.build import Bins, microseconds, moment
from ..reads import facets
from ..reads.queries import BadQuery
from ..store import packed

# ``by`` → event column (the events filter of the same name filters on it)
BY = {"user": "username", "user_agent": "user_agent", "verb": "verb", "resource": "resource",
      "namespace": "namespace", "code": "code"}
PERCENTILES = (0.5, 0.95)
ERROR_CODE = facets.ERROR_CODE
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
INFLIGHT_BINS = 120
DEFAULT_TOP = 8
MAX_TOP = 50
OTHERS = "(others)"
_MICROSECONDS = "(extract(epoch FROM {}) * 1000000)::bigint"


def by_of(params: QueryDict) -> str:
    by = params.get("by", "user")
    if by not in BY:
        raise BadQuery({"by": f"one of {', '.join(BY)}"})
    return by


# --- pure functions -----------------------------------------------------------------------------

def rank_of(p: float, n: int) -> int:
    """The 0-based position of the p-th percentile among n sorted values, nearest-rank, as
    PostgreSQL's ``percentile_disc`` computes it: ``ceil(p * n)`` in double precision, from 1."""
    return max(math.ceil(float(p) * float(n)), 1) - 1


# Up to this many keys, each key's percentiles are selected (``np.partition``, linear) from its
# durations, grouped by a radix sort of the keys; beyond, one sort of every duration is quicker
# than a selection per key. A million requests under 12 users: about 75 ms instead of 160.
SELECT_KEYS = 2000


def _grouped(group: np.ndarray, duration: np.ndarray, count: int) -> tuple[np.ndarray, bool]:
    """``duration`` arranged by group (groups in order), and whether each group's durations are
    sorted too."""
    if count <= SELECT_KEYS:
        # numpy sorts integers of 16 bits or less by radix when asked for a stable sort
        return duration[np.argsort(group.astype(np.uint16), kind="stable")], False
    low, high = int(duration.min()), int(duration.max())
    span = high - low + 1
    if count * span < 2**62:  # one sort of a combined key
        return np.sort(group * span + (duration - low)) % span + low, True
    return duration[np.lexsort((duration, group))], True


def group_stats(group: np.ndarray, duration: np.ndarray, done: np.ndarray, failed: np.ndarray,
                keys: Sequence) -> list[dict]:
    """The rows of ``stats`` from one entry per request: its group (an index into ``keys``),
    its duration in µs (read only where ``done``: it completed) and whether it ``failed`` (code
    400 or more). Groups without requests are left out."""
    count = len(keys)
    requests = np.bincount(group, minlength=count)
    errors = np.bincount(group[failed], minlength=count)
    finished = np.asarray(group[done], dtype=np.int64)
    lengths, is_sorted = (_grouped(finished, np.asarray(duration[done], dtype=np.int64), count)
                          if finished.size else (finished, True))
    completed = np.bincount(finished, minlength=count)
    ends = np.cumsum(completed)
    starts = ends - completed
    rows = []
    for g in np.flatnonzero(requests).tolist():
        n, start, end = int(completed[g]), int(starts[g]), int(ends[g])
        row = {"key": keys[g], "requests": int(requests[g])}
        if n:
            part = lengths[start:end]
            row["total_ms"] = int(part.sum()) / 1000  # int64: exact
            ranks = [rank_of(p, n) for p in PERCENTILES] + [n - 1]
            if not is_sorted:
                part = np.partition(part, sorted(set(ranks)))
            for p, rank in zip(PERCENTILES, ranks, strict=False):
                row[f"p{round(p * 100)}_ms"] = int(part[rank]) / 1000
            row["max_ms"] = int(part[n - 1]) / 1000
        else:
            row["total_ms"] = 0.0
            row.update({f"p{round(p * 100)}_ms": None for p in PERCENTILES}, max_ms=None)
        row["errors"] = int(errors[g])
        rows.append(row)
    return ordered(rows)


def ordered(rows: list[dict]) -> list[dict]:
    """Most total time first, ties by key (``null`` last)."""
    return sorted(rows, key=lambda r: (-r["total_ms"], r["key"] is None,
                                       r["key"] if r["key"] is not None else 0))


def in_flight(group: np.ndarray, received: np.ndarray, completed: np.ndarray, keys: Sequence,
              *, bins: int = INFLIGHT_BINS, top: int = DEFAULT_TOP) -> dict | None:
    """The mean number of requests in flight per time bin, per key: ``group`` (index into
    ``keys``), ``received`` and ``completed`` (µs; a request that never completed has its
    ``completed`` set by the caller to the chart's end). ``top`` keys with the most time in
    flight (ties by key), the others summed under ``OTHERS``. None without requests."""
    if group.size == 0:
        return None
    received = np.asarray(received, dtype=np.int64)
    completed = np.maximum(np.asarray(completed, dtype=np.int64), received)
    first, last = int(received.min()), int(completed.max())
    edges = Bins.spanning(moment(first), moment(last), bins)
    width = edges.width // timedelta(microseconds=1)
    start_bin = (received - first) // width
    end_bin = (completed - first) // width
    count = len(keys)
    size = count * edges.count
    # µs in flight per (key, bin): a request inside one bin gives that bin its duration; one
    # that spans bins gives its first and last bins their parts and each bin between a width
    same = start_bin == end_bin
    cell_start = group * edges.count + start_bin
    cell_end = group * edges.count + end_bin
    time = np.zeros(size)
    time += np.bincount(cell_start[same], weights=(completed - received)[same], minlength=size)
    spans = ~same
    time += np.bincount(cell_start[spans], minlength=size,
                        weights=(first + (start_bin + 1) * width - received)[spans])
    time += np.bincount(cell_end[spans], minlength=size,
                        weights=(completed - first - end_bin * width)[spans])
    # the whole bins between: +1 after the first bin, −1 at the last, summed along each key
    steps = np.bincount(cell_start[spans] + 1, minlength=size + 1)[:size] \
        - np.bincount(cell_end[spans], minlength=size + 1)[:size]
    time += np.cumsum(steps.reshape(count, edges.count), axis=1).reshape(size) * width
    time = time.reshape(count, edges.count)
    totals = time.sum(axis=1)
    requests = np.bincount(group, minlength=count)
    ranked = sorted(np.flatnonzero(requests).tolist(),
                    key=lambda g: (-totals[g], keys[g] is None,
                                   keys[g] if keys[g] is not None else 0))
    shown, rest = ranked[:top], ranked[top:]
    series = [{"key": keys[g], "requests": int(requests[g]),
               "mean": _rounded(time[g] / width)} for g in shown]
    if rest:
        series.append({"key": OTHERS, "requests": int(requests[rest].sum()),
                       "mean": _rounded(time[rest].sum(axis=0) / width), "keys": len(rest)})
    return {"start": edges.start.isoformat(), "width_ms": width / 1000, "bins": edges.count,
            "series": series}


def _rounded(values: np.ndarray) -> list[float]:
    return np.round(values, 3).tolist()


# --- selections ---------------------------------------------------------------------------------

def _index_columns(selection: facets.IndexSelection, column: str):
    """(group, received, duration, done, failed, keys) of the selected requests in the index."""
    index, window = selection.index, selection.window
    signature = index.selected(index.signature, window)
    kinds, of_kind = index.field("kind")
    is_request = np.array([k == "audit" for k in kinds], dtype=bool)[of_kind]
    keys, of_key = index.field(column)
    codes, of_code = index.field("code")
    failed = np.array([c is not None and c >= ERROR_CODE for c in codes], dtype=bool)[of_code]
    if not is_request.all():
        chosen = is_request[signature]
        signature = signature[chosen]
        take = lambda events: index.selected(events, window)[chosen]  # noqa: E731
    else:
        take = lambda events: index.selected(events, window)  # noqa: E731
    return (of_key[signature].astype(np.int64), take(index.received), take(index.duration),
            ~index.open[signature], failed[signature], keys)


def _database_rows(queryset, column: str) -> tuple[np.ndarray, ...]:
    """The same as ``_index_columns`` read from the database, row by row (SQLite)."""
    keys: dict = {}
    group, received, duration, done, failed = [], [], [], [], []
    for key, start, end, code in queryset.filter(kind="audit").values_list(
            column, "received", "completed", "code").iterator(chunk_size=5000):
        group.append(keys.setdefault(key, len(keys)))
        begin = microseconds(start)
        received.append(begin)
        duration.append(0 if end is None else microseconds(end) - begin)
        done.append(end is not None)
        failed.append(code is not None and code >= ERROR_CODE)
    return (np.array(group, dtype=np.int64), np.array(received, dtype=np.int64),
            np.array(duration, dtype=np.int64), np.array(done, dtype=bool),
            np.array(failed, dtype=bool), list(keys))


def _postgres_rows(queryset, column: str) -> tuple[np.ndarray, ...]:
    """``_database_rows`` from PostgreSQL in one pass: per key, the times and durations of its
    requests as big-endian int64s (duration −1: never completed), with their codes (0: none),
    as the column index is built (``columns._postgres_columns``)."""
    inner, params = queryset.filter(kind="audit").values(
        *dict.fromkeys([column, "received", "completed", "code"])).query.sql_with_params()
    quoted = connection.ops.quote_name(column)
    start, end = _MICROSECONDS.format("received"), _MICROSECONDS.format("completed")
    sql = (f"SELECT {quoted}, string_agg(int8send({start}) || int8send(CASE WHEN completed IS"
           f" NULL THEN -1 ELSE {end} - {start} END) || int4send(coalesce(code, 0)), ''::bytea)"
           f" FROM ({inner}) e GROUP BY {quoted}")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("SET LOCAL work_mem = '128MB'")
        result = packed.fetch(sql, params)
    keys = [key for key, _ in result]
    record = np.dtype([("received", ">i8"), ("duration", ">i8"), ("code", ">i4")])
    parts = [np.frombuffer(data, dtype=record) for _, data in result]
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=record)
    group = np.repeat(np.arange(len(parts), dtype=np.int64), [len(x) for x in parts])
    duration = rows["duration"].astype(np.int64)
    done = duration >= 0
    return (group, rows["received"].astype(np.int64), np.where(done, duration, 0), done,
            rows["code"].astype(np.int64) >= ERROR_CODE, keys)


def _postgres_stats(queryset, column: str) -> list[dict]:
    """``stats`` rows counted by PostgreSQL in one ``GROUP BY``, the percentiles by
    ``percentile_disc`` (one sort per group for both)."""
    inner, params = queryset.filter(kind="audit").values(
        *dict.fromkeys([column, "received", "completed", "code"])).query.sql_with_params()
    quoted = connection.ops.quote_name(column)
    duration = (f"{_MICROSECONDS.format('completed')} - {_MICROSECONDS.format('received')}")
    sql = (f"SELECT k, count(*), count(*) FILTER (WHERE c >= %s), sum(d),"
           f" percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY d), max(d)"
           f" FROM (SELECT {quoted} AS k, code AS c, {duration} AS d FROM ({inner}) e) r"
           f" GROUP BY k")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(sql, [ERROR_CODE, list(PERCENTILES), *params])
        result = cursor.fetchall()
    rows = []
    for key, requests, errors, total, percentiles, longest in result:
        row = {"key": key, "requests": requests, "total_ms": int(total or 0) / 1000}
        for p, value in zip(PERCENTILES, percentiles or [None] * len(PERCENTILES), strict=True):
            row[f"p{round(p * 100)}_ms"] = None if value is None else int(value) / 1000
        row["max_ms"] = None if longest is None else int(longest) / 1000
        row["errors"] = errors
        rows.append(row)
    return ordered(rows)


def _columns_of(selection, column: str):
    if isinstance(selection, facets.IndexSelection):
        return _index_columns(selection, column)
    if connection.vendor == "postgresql":
        return _postgres_rows(selection.queryset, column)
    return _database_rows(selection.queryset, column)


# --- answers ------------------------------------------------------------------------------------

def stats(incident: Incident, params: QueryDict, *, version: str | None) -> dict:
    """The ``stats`` answer (not cached; ``stats_json`` caches it): ``{"by", "results",
    "keys", "requests", "next": null}``; ``keys`` counts the groups before ``limit``."""
    by = by_of(params)
    limit = facets.bounded(params, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    column = BY[by]
    selection = facets.select(incident, params, version=version, fields=[by])
    if isinstance(selection, facets.DatabaseSelection) and connection.vendor == "postgresql":
        rows = _postgres_stats(selection.queryset, column)
    else:
        group, _, duration, done, failed, keys = _columns_of(selection, column)
        rows = group_stats(group, duration, done, failed, keys)
    return {"by": by, "results": rows[:limit], "keys": len(rows),
            "requests": sum(r["requests"] for r in rows), "next": None}


def inflight(incident: Incident, params: QueryDict, *, version: str | None) -> dict:
    """The ``in_flight`` answer of the selected requests: ``{"by", "start", "width_ms",
    "bins", "series": [{"key", "requests", "mean": [per bin]}]}`` (no ``start`` … without
    requests)."""
    by = by_of(params)
    top = facets.bounded(params, "top", DEFAULT_TOP, MAX_TOP)
    bins = max(facets.bounded(params, "bins", INFLIGHT_BINS, 1000), 1)
    selection = facets.select(incident, params, version=version, fields=[by])
    group, received, duration, done, _, keys = _columns_of(selection, BY[by])
    completed = received + duration
    if group.size:  # an open request stays in flight to the end of what is known
        end = int(np.max(np.where(done, completed, received)))
        completed = np.where(done, completed, end)
    answer = in_flight(group, received, completed, keys, bins=bins, top=top) or {
        "start": None, "width_ms": None, "bins": 0, "series": []}
    return {"by": by, **answer}



def stats_json(incident: Incident, params: QueryDict) -> bytes:
    return facets.cached_json(incident, params, "stats", ("by", "limit"), stats)


def inflight_json(incident: Incident, params: QueryDict) -> bytes:
    return facets.cached_json(incident, params, "inflight", ("by", "top", "bins"), inflight)
