"""Reading the store for ``timelines.analysis.pods`` and its HTTP side: the pod phases API and
page, with the events list's filters and access rules.

Only evidence about pods is read, through the ``event_object`` index (incident, resource, …):
the incident's successful requests on pods that say something of a phase and its Events about
pods, plus its controllers' ``SuccessfulCreate``/``SuccessfulDelete`` Events. Status writes,
creates, bindings and deletes are read with their stored bodies; decompressing those is most of
the work (a chunk of 500 bodies per few of them), so what every such row of the incident says
(``pods.Fact``) is read once per data version, at the end of an ingest (``warm``) or by the first
query, and stored (``IncidentPodFacts``, kept in the process too). A query then reads the ids of
the rows it matches, selects their facts and assembles those pods only; its answer is cached,
and the unfiltered one stored beside the facts (a namespace or name query narrows it).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import time
from collections import defaultdict
from collections.abc import Iterable
from contextlib import contextmanager
from urllib.parse import urlencode

import numpy as np
import orjson
import zstandard
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.db import IntegrityError
from django.db.models import Q
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError

from hindsight.schema import FILTERED
from incidents.access import get_visible_incident, visible_incidents
from incidents.models import Incident, IncidentGone, writing

from ..models import BodyChunk, Event, IncidentPodFacts
from ..reads.filters import EventFilterSet
from ..reads.queries import BadQuery
from ..store import aggregate
from . import filtered, pods

CACHE_SECONDS = 7 * 24 * 3600  # keys name the data version: this only frees memory
FORMAT = b"hindsight pod facts 3\n"  # the first bytes of a stored ``KnownFacts``
CHUNKS_PER_QUERY = 100  # body chunks fetched at once (about 100 × 100 kB compressed)
MAX_WITH = 8  # incidents drawn beside this one on the page
# Filters that select whole pods, so that their answer is a part of the unfiltered one.
POD_FILTERS = frozenset({"namespace", "name", "resource"})
# Filters of rows that the prepared facts answer themselves (``KnownFacts.where``).
COLUMN_FILTERS = frozenset({"kind", "since", "until"})
_ROW_FIELDS = ("id", "kind", "verb", "subresource", "code", "resource", "namespace", "name",
               "object_uid", "received", "reason", "severity", "count", "message", "body_chunk",
               "body_index", "node", "completed")


def _successful_writes() -> Q:
    """Requests on pods that may say something of a phase."""
    return Q(kind="audit", code__gte=200, code__lt=300) & (
        Q(verb="create", subresource__in=("", "binding", "eviction"))
        | Q(verb="delete", subresource="")
        | Q(verb__in=("patch", "update"), subresource="status"))


def pod_phases(incident: Incident, params: QueryDict) -> bytes:
    """The pods of the incident's evidence that matches the events filters in ``params``, as
    the API answers them, JSON (cached per data version and query). ``resource`` and ``name``
    select pods, not rows: a controller's Event names its pod in its message, and a generated
    pod's name is only in the body of its create request."""
    version = aggregate.data_version(incident.pk)
    query = sorted((name, sorted(v for v in values if v.strip())) for name, values in
                   params.lists() if name in EventFilterSet.base_filters)
    query = [(name, values) for name, values in query if values]
    key = None
    if version is not None:
        digest = hashlib.sha256(repr((version, query)).encode()).hexdigest()[:40]
        key = f"hindsight:pods:{incident.pk}:{digest}"
        body = cache.get(key)
        if body is not None:
            return body
    if query and version is not None and {name for name, _ in query} <= POD_FILTERS:
        # A namespace or name selects whole pods: those of the unfiltered answer.
        body = _narrowed(pod_phases(incident, QueryDict()), dict(query))
    elif not query and version is not None:  # the unfiltered answer is stored with the facts
        body = _stored_answer(incident.pk, version)
        if body is None:
            with _no_collection():
                body = orjson.dumps(_compute(incident, params, version))
            IncidentPodFacts.objects.filter(incident_id=incident.pk, version=version).update(
                unfiltered=zstandard.compress(body, 3))
    else:
        with _no_collection():
            body = orjson.dumps(_compute(incident, params, version))
    if key is not None:
        cache.set(key, body, CACHE_SECONDS)
    return body


def _stored_answer(incident_id: int, version: str) -> bytes | None:
    stored = (IncidentPodFacts.objects.filter(incident_id=incident_id, version=version)
              .values_list("unfiltered", flat=True).first())
    return zstandard.decompress(bytes(stored)) if stored is not None else None


def _narrowed(body: bytes, query: dict[str, list[str]]) -> bytes:
    if "resource" in query and "pods" not in query["resource"]:
        return b"[]"
    namespaces = set(query.get("namespace", ()))
    names = set(query.get("name", ()))
    return orjson.dumps([pod for pod in orjson.loads(body)
                         if (not namespaces or pod["namespace"] in namespaces)
                         and (not names or pod["name"] in names)])


def _evidence() -> Q:
    """Rows about pods that say something of one: its Events, its state in bundles (snapshots
    and their time points), and requests that may tell a phase (read with their bodies when
    ``pods.wants_body``)."""
    return Q(kind__in=["event", "state"]) | _successful_writes()


def _controllers(events):
    return events.filter(resource__in=pods.CONTROLLERS, kind="event",
                         reason__in=pods.CONTROLLER_REASONS)


def _compute(incident: Incident, params: QueryDict, version: str | None) -> list[dict]:
    """The answer to ``params``: the facts of the matching rows (``_evidence`` about pods and
    controllers' Events), assembled into pods. With a data version they are those prepared for
    the whole incident (``incident_facts``), selected by their events' kind and time for the
    filters ``kind``, ``since`` and ``until``, else by the ids of the matching rows (a query
    reads ids, no other column and no body); without one (an upload is running) they are read
    from the rows and bodies this query selects (``facts_from_rows``), as when preparing."""
    resources = [r for r in params.getlist("resource") if r.strip()]
    names = {n.strip() for n in params.getlist("name") if n.strip()}
    rest = params.copy()
    rest.pop("resource", None)
    rest.pop("name", None)
    events = filtered(incident, rest)  # raises BadQuery
    if resources and "pods" not in resources:
        return []
    if version is not None and not names:
        window = _kind_and_window(rest)
        if window is not None:  # no row to read
            return [pod.as_json() for pod in pods.assemble(
                incident_facts(incident.pk, version).where(*window))]
    about_pods = events.filter(resource="pods")
    if names:
        # a create of a generated name is read whatever its pod's name turns out to be
        about_pods = about_pods.filter(Q(name__in=names) | Q(name="", verb="create"))
    selected = [about_pods.filter(_evidence()).order_by(), _controllers(events).order_by()]
    if version is None:  # an upload is running: read what this query needs, keep nothing
        facts = [fact for _, fact in facts_from_rows(
            [row for rows in selected for row in aggregate.span_rows(rows, _ROW_FIELDS)])]
    else:
        known = incident_facts(incident.pk, version)
        ids = np.fromiter((row[0] for rows in selected
                           for row in aggregate.span_rows(rows, ("id",))), dtype=np.int64)
        facts = known.select(ids)
    if names:
        facts = [f for f in facts if f.name in names]
    return [pod.as_json() for pod in pods.assemble(facts)]


def _kind_and_window(params: QueryDict) -> tuple[list[str], int | None, int | None] | None:
    """The values of ``kind``, ``since`` and ``until`` (µs) when no other events filter is
    given (``KnownFacts.where`` answers those), else None."""
    given = {name for name, values in params.lists() if name in EventFilterSet.base_filters
             and any(v.strip() for v in values)}
    if not given <= COLUMN_FILTERS:
        return None
    filterset = EventFilterSet(params, queryset=Event.objects.none())
    if not filterset.is_valid():
        return None
    data = filterset.form.cleaned_data
    bounds = []
    for name in ("since", "until"):
        moment = data.get(name)
        if moment is not None and moment.tzinfo is None:
            return None
        bounds.append(None if moment is None else pods.microseconds(moment))
    return list(data.get("kind") or []), *bounds


@contextmanager
def _no_collection():
    """Python's cyclic garbage collector paused: these answers make no cycles, but hundreds of
    thousands of small objects (facts, rows) beside the process's kept facts, and each full
    collection walks them all (measured: a third to three quarters of a query's time)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _facts_of_row(row: tuple) -> list[pods.Fact]:
    (_pk, kind, verb, subresource, _code, resource, namespace, name, uid, received, reason,
     severity, count, message, _chunk, _index, node, completed) = row
    if kind == "state":
        return pods.facts_of_state(reason, namespace, name, uid, received, count, node,
                                   completed=completed, message=message)
    if kind == "event":
        return pods.facts_of_event(resource, reason, severity, namespace, name, uid, received,
                                   count, message)
    return pods.facts_of_request(verb, subresource, namespace, name, uid, received, None)


class KnownFacts:
    """Every fact of an incident's evidence about pods (``pods.Fact``) as columns, with the id
    of the event that gave it (``ids``), in the order ``pods.assemble`` takes them (namespace,
    name, time, …, event id): a query's facts are a selection, made into Facts only then, in
    that order. Strings are codes into ``strings``; ``values`` by position, where not None;
    ``kinds`` and ``received`` are those of the fact's event, for the filters that ``where``
    answers without the database."""

    TEXTS = ("namespace", "name", "uid", "field", "source")

    def __init__(self, ids: np.ndarray, codes: np.ndarray, at: np.ndarray, rank: np.ndarray,
                 kinds: np.ndarray, received: np.ndarray, strings: list[str],
                 values: dict[int, object]):
        self.ids, self.codes, self.at, self.rank = ids, codes, at, rank
        self.kinds, self.received = kinds, received
        self.strings = np.array(strings, dtype=object)
        self.values = values

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, tagged: list[tuple[tuple, pods.Fact]]) -> KnownFacts:
        """From ``(row, fact)`` pairs in event id order (``facts_from_rows``)."""
        tagged.sort(key=lambda t: (t[1].namespace, t[1].name, t[1].at, pods.ORDER[t[1].field],
                                   t[1].rank, t[0][0]))
        strings: dict[str, int] = {}
        code = functools.partial(_code, strings)
        count = len(tagged)
        codes = np.array([[code(getattr(f, name)) for name in cls.TEXTS] for _, f in tagged],
                         dtype=np.int32).reshape(count, len(cls.TEXTS))
        return cls(np.fromiter((row[0] for row, _ in tagged), dtype=np.int64, count=count),
                   codes, np.fromiter((f.at for _, f in tagged), dtype=np.int64, count=count),
                   np.fromiter((f.rank for _, f in tagged), dtype=np.int8, count=count),
                   np.fromiter((code(row[1]) for row, _ in tagged), dtype=np.int32,
                               count=count),
                   np.fromiter((row[9] for row, _ in tagged), dtype=np.int64, count=count),
                   list(strings),
                   {i: f.value for i, (_, f) in enumerate(tagged) if f.value is not None})

    def select(self, event_ids: np.ndarray) -> list[pods.Fact]:
        """The facts of these events, in the order above."""
        return self._facts(np.flatnonzero(np.isin(self.ids, event_ids)))

    def where(self, kinds: list[str], since: int | None, until: int | None) -> list[pods.Fact]:
        """The facts of events of one of these ``kinds`` (any when empty) received from
        ``since`` to ``until`` (µs, inclusive; None: unbounded): the events filters ``kind``,
        ``since`` and ``until``."""
        keep = np.ones(len(self), dtype=bool)
        if kinds:
            codes = [i for i, text in enumerate(self.strings.tolist()) if text in set(kinds)]
            keep &= np.isin(self.kinds, codes)
        if since is not None:
            keep &= self.received >= since
        if until is not None:
            keep &= self.received <= until
        return self._facts(np.flatnonzero(keep))

    def _facts(self, positions: np.ndarray) -> list[pods.Fact]:
        texts = [self.strings[self.codes[positions, i]].tolist()
                 for i in range(len(self.TEXTS))]
        values = self.values
        return list(map(pods.Fact._make, zip(
            *texts[:4], self.at[positions].tolist(), self.rank[positions].tolist(), texts[4],
            [values.get(i) for i in positions.tolist()], strict=True)))

    def pack(self) -> bytes:
        """The columns' bytes after a JSON header, zstd-compressed (``unpack``)."""
        header = orjson.dumps({"length": len(self), "strings": self.strings.tolist(),
                               "values": list(self.values.items())})
        return zstandard.compress(b"".join([
            FORMAT, len(header).to_bytes(8, "little"), header, self.ids.tobytes(),
            self.codes.tobytes(), self.at.tobytes(), self.rank.tobytes(),
            self.kinds.tobytes(), self.received.tobytes()]), 3)

    @classmethod
    def unpack(cls, data: bytes) -> KnownFacts | None:
        """None when ``data`` was written in another format (it is then written anew)."""
        data = zstandard.decompress(bytes(data))
        if not data.startswith(FORMAT):
            return None
        start = len(FORMAT) + 8
        size = int.from_bytes(data[len(FORMAT):start], "little")
        header = orjson.loads(data[start:start + size])
        count, offset = header["length"], start + size
        columns = []
        for dtype, shape in ((np.int64, (count,)), (np.int32, (count, len(cls.TEXTS))),
                             (np.int64, (count,)), (np.int8, (count,)), (np.int32, (count,)),
                             (np.int64, (count,))):
            items = int(np.prod(shape))
            columns.append(np.frombuffer(data, dtype=dtype, count=items, offset=offset)
                           .reshape(shape))
            offset += items * np.dtype(dtype).itemsize
        return cls(*columns, header["strings"], {i: v for i, v in header["values"]})


def _code(strings: dict[str, int], value: str) -> int:
    found = strings.get(value)
    if found is None:
        found = strings[value] = len(strings)
    return found


# The facts of the last few incidents in this process: reading them from their stored row costs
# more than the rest of a query.
_KNOWN: dict[tuple[int, str], KnownFacts] = {}
KNOWN_INCIDENTS = 4


def incident_facts(incident_id: int, version: str) -> KnownFacts:
    """Every fact of the incident's evidence about pods (its ``_evidence`` about pods and its
    controllers' Events) for the data version ``version``: kept in this process, else read
    from its stored row (``IncidentPodFacts``), else read from the rows and bodies and stored,
    replacing those of an older version."""
    known = _KNOWN.get((incident_id, version))
    if known is not None:
        return known
    stored = (IncidentPodFacts.objects.filter(incident_id=incident_id, version=version)
              .values_list("facts", flat=True).first())
    known = KnownFacts.unpack(stored) if stored is not None else None
    if known is None:
        started = time.perf_counter()
        everything = Event.objects.filter(incident_id=incident_id)
        rows = [*aggregate.span_rows(everything.filter(Q(resource="pods") & _evidence())
                                     .order_by(), _ROW_FIELDS),
                *aggregate.span_rows(_controllers(everything).order_by(), _ROW_FIELDS)]
        known = KnownFacts.of(facts_from_rows(rows))
        _store(incident_id, version, known, time.perf_counter() - started)
    while len(_KNOWN) >= KNOWN_INCIDENTS:
        _KNOWN.pop(next(iter(_KNOWN)))
    _KNOWN[(incident_id, version)] = known
    return known


def _store(incident_id: int, version: str, known: KnownFacts, seconds: float) -> None:
    try:
        with writing(incident_id):
            IncidentPodFacts.objects.update_or_create(incident_id=incident_id, defaults={
                "version": version, "facts": known.pack(), "unfiltered": None,
                "seconds": seconds, "computed_at": timezone.now()})
    except (IncidentGone, IntegrityError):  # deleted, or stored by another request meanwhile
        pass


def forget() -> None:
    """Drop the facts this process keeps (``incident_facts``), as a new process starts."""
    _KNOWN.clear()


def warm(incident_id: int) -> None:
    """Read and store the facts of the incident's evidence about pods once
    (``incident_facts``) and count the unfiltered pods, so that the first visit of the pod
    phases does neither; for the end of an ingest."""
    version = aggregate.data_version(incident_id)
    incident = Incident.objects.filter(pk=incident_id).first()
    if version is not None and incident is not None:
        with _no_collection():
            incident_facts(incident_id, version)
        pod_phases(incident, QueryDict())


def facts_from_rows(rows: Iterable[tuple]) -> list[tuple[tuple, pods.Fact]]:
    """``(row, fact)`` of each row of ``_ROW_FIELDS`` (``received`` in µs), in event id
    order; a successful request that ``pods.wants_body`` is read with its stored body, each
    chunk decompressed once."""
    tagged: list[tuple[tuple, list[pods.Fact]]] = []
    by_chunk: dict[int, list[tuple]] = defaultdict(list)
    for row in rows:
        if row[1] == "audit" and row[14] is not None and 200 <= (row[4] or 0) < 300 and \
                pods.wants_body(row[2], row[3]):
            by_chunk[row[14]].append(row)
        else:
            tagged.append((row, _facts_of_row(row)))
    chunk_ids = sorted(by_chunk)
    for start in range(0, len(chunk_ids), CHUNKS_PER_QUERY):
        batch = chunk_ids[start:start + CHUNKS_PER_QUERY]
        for chunk_id, data in BodyChunk.objects.filter(pk__in=batch).values_list("pk", "data"):
            lines = BodyChunk(data=data).lines()
            for row in by_chunk.pop(chunk_id):
                index = row[15]
                body = orjson.loads(lines[index]) if index < len(lines) else None
                tagged.append((row, _request_facts(row, body)))
    for rows_left in by_chunk.values():  # chunks gone (a purge under way): columns only
        for row in rows_left:
            tagged.append((row, _request_facts(row, None)))
    tagged.sort(key=lambda t: t[0][0])
    return [(row, fact) for row, facts in tagged for fact in facts]


def _request_facts(row: tuple, body: dict | None) -> list[pods.Fact]:
    return pods.facts_of_request(row[2], row[3], row[6], row[7], row[8], row[9], body)


# --- HTTP -------------------------------------------------------------------------------------

_TIME = {"type": "string", "format": "date-time", "nullable": True}
_MS = {"type": "number", "nullable": True}


@extend_schema(
    parameters=FILTERED,
    responses=OpenApiResponse({"type": "array", "items": {"type": "object", "properties": {
        "namespace": {"type": "string"}, "name": {"type": "string"},
        "uid": {"type": "string", "nullable": True}, "node": {"type": "string", "nullable": True},
        **{name: _TIME for name in pods.FIELDS},
        **{name: _MS for name, _, _ in pods.PHASES},
        "restarts": {"type": "integer", "nullable": True}, "warnings": {"type": "integer"},
        "sources": {"type": "object", "additionalProperties": {"type": "string"}}}}},
        "each pod's phases, in order of its first known time"),
    filters=False)
@api_view(["GET"])
def pods_api(request, incident_pk: int):
    """Each pod of the incident's evidence matching the events filters: ``namespace``, ``name``,
    ``uid``, ``node``, when it was ``created``, ``scheduled``, ``started`` (its first
    container), ``ready``, ``finished`` and ``deleted`` (RFC 3339, or null when the evidence
    does not say), the durations ``created_to_scheduled_ms``, ``scheduled_to_started_ms``,
    ``started_to_ready_ms``, ``created_to_ready_ms``, ``restarts``, ``warnings`` (Warning
    Events) and ``sources``: which evidence gave each time ("audit binding", "status Ready",
    "event Scheduled", …). ``name`` and ``resource`` select pods (a ``resource`` without
    ``pods`` selects none)."""
    incident = get_visible_incident(request.user, incident_pk)
    try:
        body = pod_phases(incident, request.query_params)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    return HttpResponse(body, content_type="application/json")


@login_required
def pods_page(request, pk: int):
    """The pods table and the distribution of their phase durations, for this incident and the
    incidents in ``with`` (each must be visible to the user: 404 otherwise), all under the
    filters in the query string."""
    incident = get_visible_incident(request.user, pk)
    runs = [incident]
    for value in request.GET.getlist("with"):
        if not value.strip().isdigit():
            raise Http404("No such incident.")
        if int(value) not in {run.pk for run in runs}:
            runs.append(get_visible_incident(request.user, int(value)))  # 404 if not visible
    runs = runs[:MAX_WITH + 1]
    with_ids = {run.pk for run in runs[1:]}
    filters = [(name, value) for name in EventFilterSet.base_filters
               for value in request.GET.getlist(name) if value != ""]
    query = urlencode(filters)
    incident_url = reverse("incidents:detail", args=[pk])
    choices = (visible_incidents(request.user).exclude(pk=incident.pk)
               .order_by("-created_at").only("pk", "title", "created_at")[:200])
    return render(request, "analysis/pods.html", {
        "incident": incident,
        "runs": [{"id": run.pk, "title": run.title,
                  "url": reverse("incident-pods", args=[run.pk]),
                  "page": reverse("incidents:detail", args=[run.pk])} for run in runs],
        "choices": [(c.pk, c.title, c.pk in with_ids) for c in choices],
        "filters": filters,
        "filter_values": {name: request.GET.get(name, "") for name in ("namespace", "name")},
        "other_filters": [(n, v) for n, v in filters if n not in ("namespace", "name")],
        "filters_query": query,
        "back_url": f"{incident_url}?{query}#timeline" if query else f"{incident_url}#timeline",
    })
