"""Findings a reviewer would otherwise look for by eye: LISTs served from etcd, slow requests,
deletions, re-created objects, error bursts, conflicting writers and what the audit policy
captured.

Each kind has a query that selects or aggregates its few rows in the database (no pass over a
million rows in Python) and a pure function of those rows that makes its insights, tested on
plain rows. An insight is a dict::

    {"kind", "title", "severity": "critical"|"warning"|"info", "explanation": one line,
     "events": [event ids, time order, at most MAX_EVENTS], "event_count": how many in all,
     "filters": {parameter: [values]} (events-API filters naming them when they are more than
     the ids), …fields of its kind}

``compute`` runs every kind over one incident; ``timelines.analysis.store`` keeps the answer
per data version.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import IntegrityError, InterfaceError, OperationalError
from django.db.models import Case, Count, Max, Min, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Trunc
from django.utils import timezone

from incidents.models import IncidentGone, writing
from incidents.notes import format_duration, format_time

from ..detections.incident import detections
from ..models import Event, IncidentInsights
from ..store.aggregate import data_version
from . import columnar, deletions, findings
from .common import (
    MAX_EVENTS,
    MAX_GROUPS,
    STATUS_OK,
    WRITE_VERBS,
    find_bursts,
    insight,
    object_label,
    plural,
    requests_of,
    rfc3339,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

REQUEST_KINDS = ("list-without-resource-version", "slow-request", "deletion",
                 "recreated-object", "error-burst", "conflicting-writers", "audit-coverage",
                 "detection")
SEVERITIES = ("critical", "warning", "info")
SLOW_MS = 1000.0  # a request slower than this is a slow request
SLOW_CRITICAL_MS = 10_000.0
MAX_SLOW = 25  # slow requests told one by one (the rest in one more insight)
# long-running by design: their duration is the stream's, not the apiserver's work
STREAM_SUBRESOURCES = ("exec", "attach", "log", "portforward", "proxy")
TRACE_SLACK = timedelta(seconds=2)  # a trace starts this close to its request's received time
MAX_ACTORS = 10  # actors listed for LISTs served from etcd
ETCD_LIST_WARNING = 100  # LISTs of one actor from etcd that make a warning (or ETCD_MS_WARNING)
ETCD_MS_WARNING = 10_000.0
MAX_OBJECTS = 60  # objects with several writers looked at (the most written)
MIN_SWITCHES = 2  # A, B, A: two changes of writer
RESOURCE_VERSION_SET = r"[?&]resourceVersion=[^&]"


# --- list-without-resource-version ------------------------------------------------------------

def etcd_list_rows(events: QuerySet) -> list[dict]:
    """Per actor, the LISTs without a ``resourceVersion`` (or with an empty one): ``username``,
    ``count``, ``total_ms``, ``max_ms``, ``first``, ``last``, ``resources`` ([(resource, n)],
    most first), ``ids`` (the first MAX_EVENTS in time); the MAX_ACTORS actors of most time.
    One pass over the incident's LISTs, then the actor index for each actor's first ones."""
    lists = requests_of(events).filter(verb="list").exclude(
        request_uri__regex=RESOURCE_VERSION_SET)
    actors: dict[str, dict] = {}
    for row in lists.order_by().values("username", "resource").annotate(
            count=Count("id"), total_ms=Sum("duration_ms"), max_ms=Max("duration_ms"),
            first=Min("received"), last=Max("received")):
        actor = actors.setdefault(row["username"], {
            "username": row["username"], "count": 0, "total_ms": 0.0, "max_ms": None,
            "first": row["first"], "last": row["last"], "resources": []})
        actor["count"] += row["count"]
        actor["total_ms"] += row["total_ms"] or 0.0
        if row["max_ms"] is not None:
            actor["max_ms"] = max(actor["max_ms"] or 0.0, row["max_ms"])
        actor["first"] = min(actor["first"], row["first"])
        actor["last"] = max(actor["last"], row["last"])
        actor["resources"].append((row["resource"], row["count"]))
    ranked = sorted(actors.values(), key=lambda a: (-a["total_ms"], -a["count"],
                                                    a["username"]))[:MAX_ACTORS]
    for actor in ranked:
        actor["resources"].sort(key=lambda pair: (-pair[1], pair[0]))
        actor["ids"] = list(lists.filter(username=actor["username"]).order_by(
            "received", "id").values_list("id", flat=True)[:MAX_EVENTS])
    return ranked


def etcd_list_insights(actors: list[dict]) -> list[dict]:
    found = []
    for actor in actors:
        total = actor["total_ms"] or 0.0
        severity = "warning" if (actor["count"] >= ETCD_LIST_WARNING
                                 or total >= ETCD_MS_WARNING) else "info"
        what = ", ".join(f"{r or '(no resource)'} ({n:,})" for r, n in actor["resources"][:4])
        user = actor["username"] or "(unknown user)"
        found.append(insight(
            "list-without-resource-version",
            f"{user}: {plural(actor['count'], 'LIST')} served from etcd",
            severity,
            f"LIST calls without resourceVersion are read from etcd, not the watch cache: "
            f"{format_duration(total)} in all, the longest {format_duration(actor['max_ms'] or 0)}"
            f"; {what}",
            actor["ids"], event_count=actor["count"],
            user=actor["username"], count=actor["count"], total_ms=total,
            max_ms=actor["max_ms"], first=rfc3339(actor["first"]), last=rfc3339(actor["last"]),
            resources=[{"resource": r, "count": n} for r, n in actor["resources"]],
            filters={"user": [actor["username"]], "verb": ["list"]}))
    return found


# --- slow-request -------------------------------------------------------------------------------

_SLOW_FIELDS = ("id", "received", "duration_ms", "verb", "username", "user_agent", "resource",
                "subresource", "namespace", "name", "request_uri", "code", "annotations",
                "audit_id")


def slow_rows(events: QuerySet, threshold_ms: float = SLOW_MS) -> tuple[list[dict], int,
                                                                        list[dict]]:
    """(the slowest requests over ``threshold_ms``, at most MAX_SLOW + MAX_EVENTS, slowest
    first; how many there are; the apiserver traces that may be theirs)."""
    slow = requests_of(events).filter(duration_ms__gte=threshold_ms).exclude(
        verb__in=("watch", "connect")).exclude(subresource__in=STREAM_SUBRESOURCES).exclude(
        request_uri__regex=r"[?&]watch=(true|1)")
    rows = list(slow.order_by("-duration_ms", "id").values(*_SLOW_FIELDS)[
        :MAX_SLOW + MAX_EVENTS])
    if not rows:
        return [], 0, []
    count = len(rows) if len(rows) < MAX_SLOW + MAX_EVENTS else slow.count()
    traces = list(events.filter(kind=Event.Kind.TRACE,
                                duration_ms__gte=threshold_ms / 2).order_by("received").values(
        "id", "received", "duration_ms", "verb", "request_uri", "user_agent", "annotations",
        "message"))
    return rows, count, traces


def _path(uri: str) -> str:
    return uri.split("?", 1)[0]


def match_trace(request: dict, traces: list[dict]) -> dict | None:
    """The apiserver trace of a request: the one naming its auditID, else the nearest in time
    (within TRACE_SLACK) with the same verb and path, and the same user agent when both say."""
    best, best_score = None, None
    for trace in traces:
        extra = trace["annotations"] or {}
        if extra.get("audit-id") and extra["audit-id"] == request["audit_id"]:
            return trace
        if abs(trace["received"] - request["received"]) > TRACE_SLACK:
            continue
        if trace["verb"] and trace["verb"] != request["verb"]:
            continue
        if not trace["request_uri"] or _path(trace["request_uri"]) != _path(
                request["request_uri"]):
            continue
        if trace["user_agent"] and request["user_agent"] and (
                trace["user_agent"] != request["user_agent"]):
            continue
        score = (abs((trace["received"] - request["received"]).total_seconds()) * 1000
                 + abs((trace["duration_ms"] or 0) - (request["duration_ms"] or 0)))
        if best_score is None or score < best_score:
            best, best_score = trace, score
    return best


LATENCY_PREFIX = "apiserver.latency.k8s.io/"


def slow_insights(rows: list[dict], count: int, traces: list[dict],
                  threshold_ms: float = SLOW_MS) -> list[dict]:
    found = []
    for row in rows[:MAX_SLOW]:
        latency = {k[len(LATENCY_PREFIX):]: v for k, v in (row["annotations"] or {}).items()
                   if k.startswith(LATENCY_PREFIX)}
        trace = match_trace(row, traces)
        what = object_label(row["resource"], row["namespace"], row["name"], row["subresource"]) \
            or row["request_uri"]
        parts = [f"by {row['username'] or '(unknown user)'}"
                 + (f" ({row['user_agent']})" if row["user_agent"] else "")
                 + f" → {row['code'] if row['code'] is not None else 'no response'}"]
        if latency:
            parts.append("apiserver: " + ", ".join(f"{k} {v}" for k, v in latency.items()))
        steps = []
        if trace is not None:
            steps = [s for s in (trace["annotations"] or {}).get("steps", "").splitlines() if s]
            parts.append(f"trace {(trace['annotations'] or {}).get('trace', '')} of "
                         f"{format_duration(trace['duration_ms'] or 0)}"
                         + (f", {len(steps)} steps" if steps else ""))
        duration = row["duration_ms"] or 0.0
        found.append(insight(
            "slow-request",
            f"{(row['verb'] or 'request').upper()} {what} took {format_duration(duration)}",
            "critical" if duration >= SLOW_CRITICAL_MS else "warning",
            "; ".join(parts),
            [row["id"]] + ([trace["id"]] if trace else []),
            duration_ms=duration, user=row["username"], verb=row["verb"],
            at=rfc3339(row["received"]), latency=latency,
            trace=None if trace is None else {
                "event": trace["id"], "id": (trace["annotations"] or {}).get("trace", ""),
                "total_ms": trace["duration_ms"], "message": trace["message"],
                "steps": steps}))
    rest = rows[MAX_SLOW:]
    if rest:
        found.append(insight(
            "slow-request",
            f"{plural(count - MAX_SLOW, 'more request')} over {format_duration(threshold_ms)}",
            "warning",
            f"the slowest {MAX_SLOW} are listed one by one; these took "
            f"{format_duration(rest[-1]['duration_ms'] or 0)} to "
            f"{format_duration(rest[0]['duration_ms'] or 0)}",
            [r["id"] for r in sorted(rest, key=lambda r: (r["received"], r["id"]))],
            event_count=count - MAX_SLOW))
    return found


# --- error-burst --------------------------------------------------------------------------------

CATEGORIES = {"conflict": "409 conflicts", "throttled": "429 throttling",
              "server": "5xx server errors", "client": "4xx client errors"}
_CATEGORY_CODES = {"conflict": Q(code=409), "throttled": Q(code=429),
                   "server": Q(code__gte=500, code__lt=600),
                   "client": Q(code__gte=400, code__lt=500) & ~Q(code__in=(409, 429))}


def error_minutes(events: QuerySet, requests: columnar.Requests | None = None
                  ) -> tuple[list[tuple[str, datetime, int]], datetime | None, datetime | None]:
    """(errors per (category, minute), sorted; the incident's first and last request): one
    GROUP BY, or counted on the column index ``requests`` when given."""
    if requests is not None:
        return columnar.error_minutes(requests)
    requests = requests_of(events)
    bounds = requests.order_by().aggregate(first=Min("received"), last=Max("received"))
    category = Case(*(When(condition, then=Value(name))
                      for name, condition in _CATEGORY_CODES.items()), default=Value(""))
    rows = requests.filter(code__gte=400, code__lt=600).annotate(
        category=category, minute=Trunc("received", "minute")).order_by().values(
        "category", "minute").annotate(n=Count("id")).values_list("category", "minute", "n")
    return sorted(rows), bounds["first"], bounds["last"]


def burst_details(events: QuerySet, bursts: list[dict],
                  requests: columnar.Requests | None = None) -> list[dict]:
    """Each burst with its errors (``ids``, at most MAX_EVENTS), ``codes``, and its top
    ``users`` and ``resources`` (the most errors first, then by name, sorted here: one order
    whatever the database's collation); counted on the column index ``requests`` when given."""
    if requests is not None:
        return columnar.burst_details(requests, bursts, MAX_EVENTS)
    for burst in bursts:
        errors = requests_of(events).filter(_CATEGORY_CODES[burst["category"]],
                                       received__gte=burst["start"], received__lt=burst["end"])
        burst["ids"] = list(errors.order_by("received", "id").values_list("id", flat=True)[
            :MAX_EVENTS])
        burst["codes"] = dict(errors.order_by().values_list("code").annotate(n=Count("id")))
        for field, name in (("username", "users"), ("resource", "resources")):
            burst[name] = columnar.top(errors.order_by().values_list(field).annotate(
                n=Count("id")))
    return bursts


def burst_insights(bursts: list[dict]) -> list[dict]:
    found = []
    for burst in bursts:
        minutes = (burst["end"] - burst["start"]) / timedelta(minutes=1)
        users = ", ".join(f"{u or '(unknown)'} ({n:,})" for u, n in burst["users"])
        resources = ", ".join(f"{r or '(none)'} ({n:,})" for r, n in burst["resources"])
        severity = "critical" if burst["category"] in ("server", "throttled") else "warning"
        found.append(insight(
            "error-burst",
            f"{burst['count']:,} {CATEGORIES[burst['category']]} in {minutes:g} min from "
            f"{format_time(burst['start'])}",
            severity,
            f"mostly {users}; on {resources}"
            + (f"; {burst['baseline']:.1f}/min on average over the incident"
               if burst["baseline"] else ""),
            burst["ids"], event_count=burst["count"], category=burst["category"],
            since=rfc3339(burst["start"]), until=rfc3339(burst["end"] - timedelta(microseconds=1)),
            codes={str(k): v for k, v in burst["codes"].items()},
            filters={"code": [str(c) for c in sorted(burst["codes"])]}))
    return found


# --- conflicting-writers ------------------------------------------------------------------------

def _writes(events: QuerySet) -> QuerySet:
    return requests_of(events).filter(Q(code=409) | STATUS_OK, verb__in=WRITE_VERBS).exclude(
        name="")


def writes_per_writer(events: QuerySet) -> list[tuple[str, str, str, str, str, int]]:
    """(resource, subresource, namespace, name, username, writes) of the writes (create,
    update, patch, delete; answered 2xx or 409) of named objects: one hash aggregate (no sort
    for a distinct count)."""
    return list(_writes(events).order_by().values_list(
        "resource", "subresource", "namespace", "name", "username").annotate(n=Count("id")))


def writer_rows(events: QuerySet, requests: columnar.Requests | None = None) -> list[dict]:
    """The writes (create, update, patch, delete; answered 2xx or 409) of the objects that
    several actors wrote, at most MAX_OBJECTS objects (the most written first), in time order:
    ``id``, ``received``, ``username``, ``verb``, ``code``, and the object. The writes per
    object and writer counted on the column index ``requests`` when given."""
    writes = _writes(events)
    per_writer = (columnar.writes_per_writer(requests) if requests is not None
                  else writes_per_writer(events))
    writers: dict[tuple, list[int]] = defaultdict(list)
    for resource, subresource, namespace, name, _, n in per_writer:
        writers[(resource, subresource, namespace, name)].append(n)
    keys = set(sorted((k for k, counts in writers.items() if len(counts) >= 2),
                      key=lambda k: (-sum(writers[k]), k))[:MAX_OBJECTS])
    if not keys:
        return []
    # each object by its index (incident, resource, namespace, name, received)
    chosen = Q()
    for resource, subresource, namespace, name in keys:
        chosen |= Q(resource=resource, subresource=subresource, namespace=namespace, name=name)
    return list(writes.filter(chosen).order_by("received", "id").values(
        "id", "received", "username", "verb", "code", "resource", "subresource", "namespace",
        "name"))


def writer_insights(writes: list[dict]) -> list[dict]:
    """Objects whose writers alternate (A, B, A…: at least MIN_SWITCHES changes of writer, one
    writer coming back), the most switches first."""
    objects: dict[tuple, list[dict]] = defaultdict(list)
    for write in writes:
        objects[(write["resource"], write["subresource"], write["namespace"],
                 write["name"])].append(write)
    found = []
    for (resource, subresource, namespace, name), items in objects.items():
        runs = [items[0]["username"]]
        for write in items[1:]:
            if write["username"] != runs[-1]:
                runs.append(write["username"])
        switches = len(runs) - 1
        if switches < MIN_SWITCHES or len(set(runs)) == len(runs):
            continue
        writers = Counter(w["username"] for w in items)
        conflicts = sum(1 for w in items if w["code"] == 409)
        names = " and ".join(u or "(unknown)" for u, _ in writers.most_common(2))
        if len(writers) > 2:
            names += f" (+{len(writers) - 2})"
        found.append((switches, insight(
            "conflicting-writers",
            f"{names} alternately wrote {object_label(resource, namespace, name, subresource)}",
            "critical" if conflicts else "warning",
            f"{plural(len(items), 'write')}, the writer changing {switches} times between "
            f"{format_time(items[0]['received'])} and {format_time(items[-1]['received'])}"
            + (f"; {plural(conflicts, '409 conflict')}" if conflicts else ""),
            [w["id"] for w in items], resource=resource, subresource=subresource,
            namespace=namespace, name=name, switches=switches, conflicts=conflicts,
            writers=[{"user": u, "writes": n} for u, n in writers.most_common()],
            filters={"resource": [resource], "name": [name], "verb": list(WRITE_VERBS),
                     **({"namespace": [namespace]} if namespace else {})})))
    found.sort(key=lambda pair: -pair[0])
    return [item for _, item in found[:MAX_GROUPS]]


# --- audit-coverage -----------------------------------------------------------------------------

def coverage_rows(events: QuerySet, requests: columnar.Requests | None = None
                  ) -> list[tuple[str, str, str, bool, int]]:
    """(resource, level, stage, is a write, requests) over the incident's requests: one
    GROUP BY, or counted on the column index ``requests`` when given; sorted (the insight lists
    equal counts in the rows' order)."""
    if requests is not None:
        return sorted(columnar.coverage_rows(requests))
    write = Case(When(verb__in=WRITE_VERBS, then=Value(True)), default=Value(False))
    return sorted(requests_of(events).annotate(write=write).order_by().values_list(
        "resource", "level", "stage", "write").annotate(n=Count("id")))


BODY_LEVELS = ("Request", "RequestResponse")


def coverage_insights(rows: list[tuple[str, str, str, bool, int]]) -> list[dict]:
    if not rows:
        return []
    levels, stages = Counter(), Counter()
    resources: dict[str, Counter] = defaultdict(Counter)
    writes_without, writes = Counter(), Counter()
    for resource, level, stage, write, n in rows:
        levels[level or "(none)"] += n
        stages[stage or "(none)"] += n
        resources[resource][level or "(none)"] += n
        if write:
            writes[resource] += n
            if level not in BODY_LEVELS:
                writes_without[resource] += n
    total = sum(levels.values())
    undiffable = sorted(r for r in writes if r and writes_without[r] == writes[r])
    partly = sorted(r for r in writes if r and 0 < writes_without[r] < writes[r])
    share = ", ".join(f"{level} {n * 100 / total:.0f}%" for level, n in levels.most_common())
    explanation = f"{plural(total, 'request')}: {share}"
    if undiffable:
        explanation += ("; no bodies (Metadata level) for the writes of "
                        + ", ".join(undiffable[:8]) + ("…" if len(undiffable) > 8 else "")
                        + ": their changes cannot be diffed")
    elif not writes:
        explanation += "; no writes"
    else:
        explanation += "; every write has its body: changes can be diffed"
    if stages.get("RequestReceived"):
        explanation += (f"; {plural(stages['RequestReceived'], 'request')} never reached "
                        "ResponseComplete in these logs")
    body_writes = sum(writes.values()) - sum(writes_without.values())
    severity = "warning" if writes and body_writes * 2 < sum(writes.values()) else "info"
    return [insight(
        "audit-coverage", "What the audit policy captured", severity, explanation, [],
        levels=dict(levels.most_common()), stages=dict(stages.most_common()),
        resources=[{"resource": r, "levels": dict(c.most_common()),
                    "writes": writes[r], "writes_without_body": writes_without[r]}
                   for r, c in sorted(resources.items(), key=lambda kv: -sum(kv[1].values()))],
        undiffable=undiffable, partly_diffable=partly)]


# --- all of them --------------------------------------------------------------------------------

def kinds_of(events: QuerySet) -> Callable[[], set[str]]:
    """A function giving the kinds of ``events``, read once (one pass) when first asked."""
    return once(lambda: set(events.order_by().values_list("kind", flat=True).distinct()))


def steps(events: QuerySet, slow_ms: float = SLOW_MS, incident_id: int | None = None,
          indexed: Callable[[], columnar.Requests | None] | None = None
          ) -> list[tuple[str, Callable[[], list]]]:
    """(name, the function finding those insights) for every part of the computation; the
    Falco rules' detections (``timelines.detections``) when ``incident_id`` is given. The parts
    of a kind of evidence the incident does not hold (requests, Events, logs, object state)
    read nothing: each of their reads would be a pass over every event to find none (an audit
    log of 500,000 requests: ten of them, 1.3 s). ``indexed()``: the incident's requests in its
    column index, or None; the parts named in ``INDEXED`` count on it when it is there."""
    kinds = kinds_of(events)
    requests = once(indexed or (lambda: None))

    def of_requests(step: Callable[[], list]) -> Callable[[], list]:
        return lambda: step() if Event.Kind.AUDIT in kinds() else []

    return [
        ("list-without-resource-version",
         of_requests(lambda: etcd_list_insights(etcd_list_rows(events)))),
        ("slow-request", of_requests(lambda: slow_insights(*slow_rows(events, slow_ms),
                                                           threshold_ms=slow_ms))),
        *((name if name == "recreated-object" else "deletion: " + name, of_requests(step))
          for name, step in deletions.steps(events, requests)),
        ("error-burst", of_requests(lambda: burst_insights(burst_details(
            events, find_bursts(*error_minutes(events, requests())), requests())))),
        ("conflicting-writers", of_requests(lambda: writer_insights(
            writer_rows(events, requests())))),
        ("audit-coverage", of_requests(lambda: coverage_insights(
            coverage_rows(events, requests())))),
        *findings.steps(events, kinds),
        *((("detection", lambda: detections(incident_id, Event.Kind.AUDIT in kinds())),)
          if incident_id is not None else ()),
    ]


# The parts that count on the column index when the incident has one (``columnar``), and the
# detections, which read it: ``compute`` runs them after the others, so that behind the first
# answer, where the index is built beside the insights, it is there when they come.
INDEXED = frozenset({"deletion: finalizers", "deletion: by actor", "recreated-object",
                     "error-burst",
                     "conflicting-writers", "audit-coverage", "detection"})


def once(make: Callable[[], T]) -> Callable[[], T]:
    """``make``, called the first time only."""
    made: list[T] = []

    def get() -> T:
        if not made:
            made.append(make())
        return made[0]
    return get


def kinds_in_order() -> tuple[str, ...]:
    """Every kind: those of requests, then those of bundles (``findings.KINDS``)."""
    return REQUEST_KINDS + findings.KINDS


def compute(incident_id: int, *, slow_ms: float = SLOW_MS,
            timings: dict[str, float] | None = None, index: bool = True) -> list[dict]:
    """Every insight of the incident, the most severe first (kinds in ``kinds_in_order`` within a
    severity), each with its ``id``: its position in this list. ``timings``, when given, gets
    the seconds each step took. ``index``: False counts everything in the database, even when
    the incident has a column index (the answer is the same; tests compare them)."""
    parts = steps(Event.objects.filter(incident_id=incident_id), slow_ms, incident_id,
                  (lambda: columnar.of_incident(incident_id)) if index else None)
    made: dict[str, list] = {}
    # the parts that read the column index last (stable: in their order otherwise)
    for name, step in sorted(parts, key=lambda part: part[0] in INDEXED):
        started = time.perf_counter()
        made[name] = step()
        if timings is not None:
            timings[name] = time.perf_counter() - started
    found = [item for name, _ in parts for item in made[name]]  # in the parts' order
    kinds = kinds_in_order()
    found.sort(key=lambda i: (SEVERITIES.index(i["severity"]), kinds.index(i["kind"])))
    for number, item in enumerate(found):
        item["id"] = number
    return found


# --- stored once per data version ---------------------------------------------------------------

def refresh(incident_id: int) -> IncidentInsights | None:
    """Compute the incident's insights and store them under its data version, replacing those
    of an older one; None (nothing stored) while an upload runs, whose evidence is changing, or
    when the incident was deleted meanwhile."""
    version = data_version(incident_id)
    if version is None:
        return None
    started = time.perf_counter()
    timings: dict[str, float] = {}
    found = compute(incident_id, timings=timings)
    seconds = time.perf_counter() - started
    try:
        with writing(incident_id):
            row, _ = IncidentInsights.objects.update_or_create(
                incident_id=incident_id, defaults={
                    "version": version, "insights": found, "seconds": seconds,
                    "computed_at": timezone.now()})
    except IncidentGone:
        return None
    except IntegrityError:  # another request stored them at the same moment
        return IncidentInsights.objects.filter(incident_id=incident_id).first()
    log.info("insights of incident %s: %d in %.2f s (%s)", incident_id, len(found), seconds,
             ", ".join(f"{name} {took:.2f} s" for name, took in sorted(
                 timings.items(), key=lambda item: -item[1]) if took >= 0.1))
    return row


def current(incident_id: int) -> tuple[list[dict], IncidentInsights | None]:
    """The insights of the incident's current data version: the stored ones, else computed now
    (and stored). While an upload runs: the stored ones of the last version if any (the row
    says which), else computed without storing them."""
    row = IncidentInsights.objects.filter(incident_id=incident_id).first()
    version = data_version(incident_id)
    if row is not None and (row.version == version or version is None):
        return row.insights, row
    if version is None:
        return compute(incident_id), None
    row = refresh(incident_id)
    if row is None:  # a new upload started meanwhile
        return compute(incident_id), None
    return row.insights, row


def refresh_after_ingest(incident_id: int) -> None:
    """``refresh`` once an incident's uploads have finished (``tasks.finish_incident``). A
    failure here is logged and leaves the insights to the first read: it never fails an ingest
    that has succeeded. Database errors propagate (the worker's task retries them)."""
    try:
        refresh(incident_id)
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        log.exception("insights of incident %s could not be computed", incident_id)
