"""Reading the store for ``timelines.analysis.pods`` and its HTTP side: the pod phases API and
page, with the events list's filters and access rules.

Only evidence about pods is read, through the ``event_object`` index (incident, resource, …):
the incident's successful requests on pods that say something of a phase and its Events about
pods, plus its controllers' ``SuccessfulCreate``/``SuccessfulDelete`` Events. Status writes,
creates, bindings and deletes are read with their stored bodies; decompressing those is most of
the work (a chunk of 500 bodies per few of them), so what each body says (``pods.Fact``) is kept
per data version in the cache, for every such request of the incident, and the answer of each
query too: a query after the first reads rows and no body.
"""

from __future__ import annotations

import gc
import hashlib
from collections import defaultdict
from collections.abc import Iterable
from contextlib import contextmanager
from urllib.parse import urlencode

import orjson
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.db.models import Q
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError

from hindsight.schema import FILTERED
from incidents.access import get_visible_incident, visible_incidents
from incidents.models import Incident

from .. import aggregate
from ..filters import EventFilterSet
from ..models import BodyChunk, Event
from ..queries import BadQuery
from . import filtered, pods

CACHE_SECONDS = 7 * 24 * 3600  # keys name the data version: this only frees memory
CHUNKS_PER_QUERY = 100  # body chunks fetched at once (about 100 × 100 kB compressed)
MAX_WITH = 8  # incidents drawn beside this one on the page
# Filters that select whole pods, so that their answer is a part of the unfiltered one.
POD_FILTERS = frozenset({"namespace", "name", "resource"})
_ROW_FIELDS = ("id", "kind", "verb", "subresource", "code", "resource", "namespace", "name",
               "object_uid", "received", "reason", "severity", "count", "message", "body_chunk",
               "body_index")


def _successful_writes() -> Q:
    """Requests on pods that may say something of a phase."""
    return Q(kind="audit", code__gte=200, code__lt=300) & (
        Q(verb="create", subresource__in=("", "binding", "eviction"))
        | Q(verb="delete", subresource="")
        | Q(verb__in=("patch", "update"), subresource="status"))


def _with_body() -> Q:
    return Q(kind="audit", code__gte=200, code__lt=300, body_chunk__isnull=False) & (
        Q(verb="create", subresource__in=("", "binding")) | Q(verb="delete", subresource="")
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
    else:
        with _no_collection():
            body = orjson.dumps(_compute(incident, params, version))
    if key is not None:
        cache.set(key, body, CACHE_SECONDS)
    return body


def _narrowed(body: bytes, query: dict[str, list[str]]) -> bytes:
    if "resource" in query and "pods" not in query["resource"]:
        return b"[]"
    namespaces = set(query.get("namespace", ()))
    names = set(query.get("name", ()))
    return orjson.dumps([pod for pod in orjson.loads(body)
                         if (not namespaces or pod["namespace"] in namespaces)
                         and (not names or pod["name"] in names)])


def _compute(incident: Incident, params: QueryDict, version: str | None) -> list[dict]:
    resources = [r for r in params.getlist("resource") if r.strip()]
    names = {n.strip() for n in params.getlist("name") if n.strip()}
    rest = params.copy()
    rest.pop("resource", None)
    rest.pop("name", None)
    events = filtered(incident, rest)  # raises BadQuery
    if resources and "pods" not in resources:
        return []
    about_pods = events.filter(resource="pods")
    if names:
        # a create of a generated name is read whatever its pod's name turns out to be
        about_pods = about_pods.filter(Q(name__in=names) | Q(name="", verb="create"))
    # Rows whose columns say it all: Events, and requests whose body is not read.
    plain = about_pods.filter(Q(kind="event") | _successful_writes() & (
        Q(body_chunk__isnull=True) | Q(subresource="eviction")))
    controllers = events.filter(resource__in=pods.CONTROLLERS, kind="event",
                                reason__in=pods.CONTROLLER_REASONS)
    facts: list[pods.Fact] = []
    for row in [*aggregate.span_rows(plain.order_by(), _ROW_FIELDS),
                *aggregate.span_rows(controllers.order_by(), _ROW_FIELDS)]:
        facts.extend(_facts_of_row(row))
    # Requests read with their bodies: what those say is kept per data version, so only their
    # ids are selected here.
    with_body = about_pods.filter(_with_body()).order_by()
    ids = list(with_body.values_list("pk", flat=True))
    if ids:
        if version is None:  # an upload is running: read what this query needs, keep nothing
            known = _read_facts(aggregate.span_rows(with_body, _ROW_FIELDS))
        else:
            known = incident_body_facts(incident.pk, version)
        for pk in ids:
            facts.extend(pods.Fact(*f) for f in known.get(pk, ()))
    if names:
        facts = [f for f in facts if f.name in names]
    return [pod.as_json() for pod in pods.assemble(facts)]


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
     severity, count, message, _chunk, _index) = row
    if kind == "event":
        return pods.facts_of_event(resource, reason, severity, namespace, name, uid, received,
                                   count, message)
    return pods.facts_of_request(verb, subresource, namespace, name, uid, received, None)


# The facts of the last few incidents' bodies in this process: decoding them from the shared
# cache costs more than the rest of a query.
_KNOWN: dict[tuple[int, str], dict[int, list[list]]] = {}
KNOWN_INCIDENTS = 4


def incident_body_facts(incident_id: int, version: str) -> dict[int, list[list]]:
    """What the stored body of each of the incident's requests on pods says (those that
    ``_with_body``), by event id, each fact as the list of a ``pods.Fact``'s fields (a query
    makes Facts of those it selects only), for the data version ``version``: kept in this
    process and in the shared cache, read from the bodies by the first query that needs
    them."""
    known = _KNOWN.get((incident_id, version))
    if known is not None:
        return known
    digest = hashlib.sha256(version.encode()).hexdigest()[:20]
    key = f"hindsight:pod-facts:{incident_id}:{digest}"
    stored = cache.get(key)
    if stored is not None:
        known = {int(pk): facts for pk, facts in orjson.loads(stored).items()}
    else:
        everything = (Event.objects.filter(incident_id=incident_id, resource="pods")
                      .filter(_with_body()).order_by())
        known = _read_facts(aggregate.span_rows(everything, _ROW_FIELDS))
        cache.set(key, orjson.dumps(known, option=orjson.OPT_NON_STR_KEYS), CACHE_SECONDS)
    while len(_KNOWN) >= KNOWN_INCIDENTS:
        _KNOWN.pop(next(iter(_KNOWN)))
    _KNOWN[(incident_id, version)] = known
    return known


def forget() -> None:
    """Drop the facts this process keeps (``incident_body_facts``), as a new process starts."""
    _KNOWN.clear()


def warm(incident_id: int) -> None:
    """Read the stored bodies of the incident's requests on pods once (``incident_body_facts``)
    and count the unfiltered pods, so that the first visit of the pod phases does neither; for
    the end of an ingest."""
    version = aggregate.data_version(incident_id)
    incident = Incident.objects.filter(pk=incident_id).first()
    if version is not None and incident is not None:
        with _no_collection():
            incident_body_facts(incident_id, version)
        pod_phases(incident, QueryDict())


def _read_facts(rows: Iterable[tuple]) -> dict[int, list[list]]:
    """Facts of requests (rows of ``_ROW_FIELDS``, ``received`` in µs) read with their bodies,
    each chunk decompressed once."""
    by_chunk: dict[int, list[tuple]] = defaultdict(list)
    for row in rows:
        by_chunk[row[14]].append(row)
    answer: dict[int, list[list]] = {}
    chunk_ids = sorted(by_chunk)
    for start in range(0, len(chunk_ids), CHUNKS_PER_QUERY):
        batch = chunk_ids[start:start + CHUNKS_PER_QUERY]
        for chunk_id, data in BodyChunk.objects.filter(pk__in=batch).values_list("pk", "data"):
            lines = BodyChunk(data=data).lines()
            for row in by_chunk.pop(chunk_id):
                index = row[15]
                body = orjson.loads(lines[index]) if index < len(lines) else None
                answer[row[0]] = _request_facts(row, body)
    for rows_left in by_chunk.values():  # chunks gone (a purge under way): columns only
        for row in rows_left:
            answer[row[0]] = _request_facts(row, None)
    return answer


def _request_facts(row: tuple, body: dict | None) -> list[list]:
    return [list(f) for f in pods.facts_of_request(row[2], row[3], row[6], row[7], row[8],
                                                   row[9], body)]


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
