"""Counting an incident's filtered events by value and by time, for the incident page's facets
(``GET /api/v1/incidents/{id}/facets/``) and its overview strip (``timelines.reads.overview``).

A *selection* is the incident's events that match a query (``EventFilterSet``: the same filters
as the events list, ``since``/``until`` and ``q`` included), counted where it is quickest:

- from the incident's **column index** (``timelines.store.columns``) when it has one at the current
  data version and it holds every filter of the query. Each event there is its time and the
  number of its *signature* (the combination of its filterable fields), so counting the values
  of a field is one ``bincount`` of the selected events' signatures, then a sum per value over
  the signatures (tens of thousands, not a million); a time histogram is one ``bincount`` of
  bin × series.
- otherwise by the **database**: on PostgreSQL one ``GROUP BY GROUPING SETS`` for any number of
  fields (one pass over the events), ``unnest`` for the list column ``groups``, a ``GROUP BY``
  bin × series for the histogram; on SQLite (the embedded default) through the ORM, and in
  Python where the ORM cannot group.

Both give the same answer, value for value (``timelines/tests/test_facets.py`` compares them).
Answers are cached as JSON bytes under the incident's data version and the query, as figures
are (``timelines.reads.queries``).

Empty values are values: an event without a user counts under the user ``""`` (without a code,
under ``null``), so that the counts of a field add up to ``total`` and the page can show how much
of the evidence has no such field, as ``(none)``; the filter value ``(none)`` selects those
events (``figures.lanes.NONE``). For ``group``, an event counts once under each of its groups
(``""`` when it has none).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import timedelta

import numpy as np
import orjson
from django.core.cache import cache
from django.db import connection, transaction
from django.http import QueryDict

from incidents.models import Incident

from ..figures.build import Bins, microseconds
from ..models import Event
from ..store import aggregate, columns, packed
from .filters import EventFilterSet
from .queries import BadQuery

# Facet name (as the filter parameter is named) → event column. Every filter the column index
# holds, plus ``group``, a list per event (counted by the database). Not ``audit_id``: one value
# per request. ``user`` is the authenticated user's name, as in the events filter.
FACET_FIELDS = {**columns.FILTER_COLUMNS, "group": "groups"}
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
CACHE_SECONDS = 7 * 24 * 3600  # keys name the data version: this only frees memory
ERROR_CODE = 400  # an answer of this code or above is an error (4xx, 5xx)

# The series of the overview's histogram: requests by outcome (as the figure's colour=outcome
# names them, ``figures.build._colour``), the other evidence by kind.
OUTCOMES = ("2xx", "3xx", "4xx", "5xx", "open", "other")
KINDS = ("event", "log", "trace")
SERIES = (*OUTCOMES, *KINDS)

Row = tuple[object, int, int]  # (value, events, of which errors)


def series_of(kind: str, code: int | None, is_open: bool) -> str:
    """The histogram series of an event: its outcome for a request (``open`` when it never
    completed; ``other`` without a code or outside 200-599), its kind otherwise."""
    if kind != "audit":
        return kind
    if is_open:
        return "open"
    if code is None or not 200 <= code < 600:
        return "other"
    return f"{code // 100}xx"


_SERIES_SQL = ("CASE WHEN kind <> 'audit' THEN kind WHEN completed IS NULL THEN 'open'"
               " WHEN code >= 200 AND code < 600 THEN (code / 100)::text || 'xx'"
               " ELSE 'other' END")
_MICROSECONDS_SQL = "(extract(epoch FROM received) * 1000000)::bigint"


# --- selections ---------------------------------------------------------------------------------

class IndexSelection:
    """The selected events of a column index (``ColumnIndex.select``)."""

    def __init__(self, index: columns.ColumnIndex, window: columns.Window) -> None:
        self.index, self.window = index, window
        self.total = window.count
        self._per_signature: np.ndarray | None = None
        self._times: np.ndarray | None = None

    def times(self) -> np.ndarray:
        """``received`` (µs) of the selected events, sorted."""
        if self._times is None:
            self._times = self.index.times(self.window)
        return self._times

    def range(self) -> tuple[int, int] | None:
        times = self.times()
        return (int(times[0]), int(times[-1])) if times.size else None

    def value_counts(self, fields: Sequence[str]) -> dict[str, list[Row]]:
        if self._per_signature is None:
            self._per_signature = self.index.signature_counts(self.window)
        events = self._per_signature.astype(np.float64)  # bincount weights: exact below 2**53
        codes, of_code = self.index.field("code")
        failed = np.array([c is not None and c >= ERROR_CODE for c in codes], dtype=bool)
        errors = events * failed[of_code]
        answer = {}
        for field in fields:
            values, of_value = self.index.field(FACET_FIELDS[field])
            counts = np.bincount(of_value, weights=events, minlength=len(values))
            failures = np.bincount(of_value, weights=errors, minlength=len(values))
            answer[field] = [(values[i], int(counts[i]), int(failures[i]))
                             for i in np.flatnonzero(counts).tolist()]
        return answer

    def histogram(self, bins: Bins) -> dict[str, list[int]]:
        names, series = self._signature_series()
        signature = self.index.selected(self.index.signature, self.window)
        column = (self.times() - microseconds(bins.start)) // (bins.width // timedelta(
            microseconds=1))
        cells = np.bincount(column * len(names) + series[signature],
                            minlength=bins.count * len(names)).reshape(bins.count, len(names))
        return {name: cells[:, i].tolist() for i, name in enumerate(names)
                if cells[:, i].any()}

    def _signature_series(self) -> tuple[list[str], np.ndarray]:
        """(series names, each signature's series number), from the few distinct kinds and
        codes rather than per signature."""
        kinds, of_kind = self.index.field("kind")
        codes, of_code = self.index.field("code")
        names = list(SERIES) + sorted(set(kinds) - set(SERIES) - {"audit"})
        number = {name: i for i, name in enumerate(names)}
        by_kind = np.array([number.get(k, -1) for k in kinds], dtype=np.int64)
        by_code = np.array([number[series_of("audit", c, False)] for c in codes], dtype=np.int64)
        is_audit = np.array([k == "audit" for k in kinds], dtype=bool)[of_kind]
        series = np.where(is_audit, np.where(self.index.open, number["open"], by_code[of_code]),
                          by_kind[of_kind])
        return names, series


class DatabaseSelection:
    """The selected events as a queryset: counted by PostgreSQL, or through the ORM on SQLite."""

    def __init__(self, queryset) -> None:
        self.queryset = queryset.order_by()
        self._total: int | None = None

    @property
    def total(self) -> int:
        if self._total is None:
            self._total = self.queryset.count()
        return self._total

    def times(self) -> np.ndarray:
        if connection.vendor != "postgresql":
            times = [microseconds(t) for t in self.queryset.values_list("received", flat=True)
                     .iterator(chunk_size=5000)]
            return np.sort(np.array(times, dtype=np.int64))
        # 8 bytes per event in one value: a million times in a fraction of a second
        inner, params = self.queryset.values("received").query.sql_with_params()
        ((data,),) = packed.fetch(f"SELECT string_agg(int8send({_MICROSECONDS_SQL}), ''::bytea)"
                                  f" FROM ({inner}) e", params)
        if data is None:
            return np.empty(0, dtype=np.int64)
        return np.sort(np.frombuffer(data, dtype=">i8").astype(np.int64))

    def range(self) -> tuple[int, int] | None:
        first, last = aggregate.time_range(self.queryset)
        if first is None or last is None:
            return None
        return microseconds(first), microseconds(last)

    def value_counts(self, fields: Sequence[str]) -> dict[str, list[Row]]:
        answer = {}
        plain = [f for f in fields if f != "group"]
        if "group" in fields:
            answer["group"] = self._group_counts()
        if plain and connection.vendor == "postgresql":
            answer.update(self._postgres_counts(plain))
        else:
            for field in plain:
                column = FACET_FIELDS[field]
                answer[field] = [(row[column], row["n"], row["errors"]) for row in (
                    self.queryset.values(column).annotate(
                        n=_count(), errors=_count(code__gte=ERROR_CODE)).order_by())]
        return {field: answer[field] for field in fields}

    def _postgres_counts(self, fields: Sequence[str]) -> dict[str, list[Row]]:
        """One pass over the events for every field: ``GROUPING SETS``, one per field; the
        ``GROUPING()`` bits of a row say which field it counts."""
        names = list(dict.fromkeys(FACET_FIELDS[f] for f in fields))
        inner, params = self.queryset.values(*dict.fromkeys([*names, "code"])).query \
            .sql_with_params()
        quoted = [connection.ops.quote_name(n) for n in names]
        sql = (f"SELECT GROUPING({', '.join(quoted)}), {', '.join(quoted)}, count(*),"
               f" count(*) FILTER (WHERE code >= %s) FROM ({inner}) e"
               f" GROUP BY GROUPING SETS ({', '.join(f'({q})' for q in quoted)})")
        by_column: dict[str, list[Row]] = {n: [] for n in names}
        bit = {len(names) - 1 - i: n for i, n in enumerate(names)}
        everything = (1 << len(names)) - 1
        for row in _run(sql, [ERROR_CODE, *params]):
            grouped = everything & ~row[0]  # the one bit that is 0
            column = bit[grouped.bit_length() - 1]
            by_column[column].append((row[1 + names.index(column)], row[-2], row[-1]))
        return {f: by_column[FACET_FIELDS[f]] for f in fields}

    def _group_counts(self) -> list[Row]:
        """Each event once under each of its groups, under "" when it has none."""
        if connection.vendor == "postgresql":
            inner, params = self.queryset.values("groups", "code").query.sql_with_params()
            sql = (f"SELECT g, count(*), count(*) FILTER (WHERE e.code >= %s) FROM ({inner}) e"
                   " CROSS JOIN LATERAL (SELECT DISTINCT x FROM unnest(CASE WHEN"
                   " cardinality(e.groups) > 0 THEN e.groups ELSE ARRAY['']::text[] END) x)"
                   " u(g) GROUP BY g")
            return [tuple(row) for row in _run(sql, [ERROR_CODE, *params])]
        counts: Counter = Counter()
        errors: Counter = Counter()
        for groups, code in self.queryset.values_list("groups", "code").iterator(
                chunk_size=5000):
            for group in set(groups or ()) or {""}:
                counts[group] += 1
                errors[group] += code is not None and code >= ERROR_CODE
        return [(group, n, errors[group]) for group, n in counts.items()]

    def histogram(self, bins: Bins) -> dict[str, list[int]]:
        width = bins.width // timedelta(microseconds=1)
        start = microseconds(bins.start)
        if connection.vendor == "postgresql":
            inner, params = self.queryset.values("received", "kind", "code", "completed") \
                .query.sql_with_params()
            rows = _run(f"SELECT ({_MICROSECONDS_SQL} - %s) / %s, {_SERIES_SQL}, count(*)"
                        f" FROM ({inner}) e GROUP BY 1, 2", [start, width, *params])
        else:
            cells: Counter = Counter(
                ((microseconds(received) - start) // width,
                 series_of(kind, code, completed is None))
                for received, kind, code, completed in self.queryset.values_list(
                    "received", "kind", "code", "completed").iterator(chunk_size=5000))
            rows = [(column, name, n) for (column, name), n in cells.items()]
        series: dict[str, list[int]] = {}
        for column, name, n in rows:
            series.setdefault(name, [0] * bins.count)[column] += n
        return series


def _count(**condition):
    from django.db.models import Count, Q

    return Count("pk", filter=Q(**condition)) if condition else Count("pk")


def _run(sql: str, params: Sequence) -> list[tuple]:
    with transaction.atomic(), connection.cursor() as cursor:
        # as for the heatmap (aggregate.lane_counts): JIT costs more than it saves on a query
        # run once, and the hash tables must not spill to disk
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(sql, params)
        return cursor.fetchall()


def select(incident: Incident, params: QueryDict, *, version: str | None,
           fields: Iterable[str] = (), window: bool = True):
    """The incident's events matching ``params`` (``EventFilterSet``; ``window=False`` leaves
    ``since``/``until`` out), from the column index at ``version`` when it holds every filter
    (and every field of ``fields`` that will be counted), else from the database. Raises
    ``BadQuery`` when the filters do not validate."""
    if not window:
        params = params.copy()
        for name in columns.WINDOW_PARAMS:
            params.pop(name, None)
    filterset = EventFilterSet(params, queryset=Event.objects.filter(incident=incident))
    if not filterset.is_valid():
        raise BadQuery(filterset.errors)
    given = {n: v for n, v in params.lists() if n in EventFilterSet.base_filters and any(v)}
    index = columns.load(incident.pk, version) if version is not None else None
    data = filterset.form.cleaned_data
    filters = index.filters(data, given) if index is not None and all(
        FACET_FIELDS[f] in columns.FILTER_COLUMNS.values() for f in fields) else None
    if filters is not None:
        return IndexSelection(index, index.select(filters, data.get("since"), data.get("until")))
    return DatabaseSelection(filterset.qs)


# --- answers ------------------------------------------------------------------------------------

def rank(rows: Iterable[Row], *, contains: str = "", limit: int) -> tuple[list[dict], int]:
    """(the ``limit`` most frequent values, ties by value (``null`` last), each as ``{"value",
    "count", "errors"}``; how many distinct values there are). ``contains`` keeps only the values
    holding that text, in any case (a code as its digits)."""
    needle = contains.casefold()
    kept = [row for row in rows if row[1] and (
        not needle or (row[0] is not None and needle in str(row[0]).casefold()))]
    kept.sort(key=lambda row: (-row[1], row[0] is None, row[0] if row[0] is not None else 0))
    return ([{"value": value, "count": count, "errors": errors}
             for value, count, errors in kept[:limit]], len(kept))


def bounded(params: QueryDict, name: str, default: int, most: int) -> int:
    """An integer parameter from 0 on, at most ``most`` (larger asks are cut to it)."""
    text = params.get(name, "")
    if text == "":
        return default
    if not text.isdigit():
        raise BadQuery({name: f"a whole number from 0 to {most}"})
    return min(int(text), most)


def query_of(params: QueryDict, own: Sequence[str]) -> list[tuple[str, list[str]]]:
    """What of the query names an answer: the filters and the endpoint's ``own`` parameters
    (not the page's ``lanes``, ``colour``, ``event`` … that come along)."""
    return [(name, values) for name, values in params.lists()
            if name in EventFilterSet.base_filters or name in own]


def cache_key(incident_id: int, version: str | None, answer: str,
              query: Iterable[tuple[str, list[str]]]) -> str | None:
    """The cache key of an ``answer`` ("facets", "overview") for a query: it names the data
    version (``aggregate.data_version``), as ``aggregate.figure_cache_key`` does. None while
    an upload runs."""
    if version is None:
        return None
    normal = sorted((name, sorted(values)) for name, values in query)
    digest = hashlib.sha256(repr((version, answer, normal)).encode()).hexdigest()[:40]
    return f"hindsight:{answer}:{incident_id}:{digest}"


def cached_json(incident: Incident, params: QueryDict, answer: str, own: Sequence[str],
                make) -> bytes:
    """``make(incident, params, version=…)`` as JSON bytes, cached under the incident's data
    version, the ``answer``'s name and the query (its filters and ``own`` parameters); not
    cached while an upload runs. The facets, the overview and the request time statistics are
    cached this way."""
    version = aggregate.data_version(incident.pk)
    key = cache_key(incident.pk, version, answer, query_of(params, own))
    body = cache.get(key) if key is not None else None
    if body is None:
        body = orjson.dumps(make(incident, params, version=version))
        if key is not None:
            cache.set(key, body, CACHE_SECONDS)
    return body


def facets(incident: Incident, params: QueryDict, *, version: str | None) -> dict:
    """The facets answer (not cached; ``overview.facets_json`` caches it)."""
    field = params.get("field", "")
    if field not in FACET_FIELDS:
        raise BadQuery({"field": f"one of {', '.join(FACET_FIELDS)}"})
    limit = bounded(params, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    selection = select(incident, params, version=version, fields=[field])
    values, distinct = rank(selection.value_counts([field])[field],
                            contains=params.get("contains", ""), limit=limit)
    return {"field": field, "values": values, "total": selection.total, "distinct": distinct}
