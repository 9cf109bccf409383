"""One object's history: every request, Kubernetes Event, state and log line about it, in time
order, and which of them hold a version of the object that can be diffed with the one before.

An object is ``(resource, namespace, name)``, as an audit ``objectRef`` names it (the namespace
is empty for a cluster-scoped object). What belongs to its history:

- requests (kind ``audit``) whose resource, namespace and name are the object's, on the object
  itself or on a subresource of it (``pods/status``, ``pods/binding``, ``pods/log``…);
- Kubernetes Events (kind ``event``) whose involved object it is: the Events parser stores the
  involvedObject as the row's resource (the kind's plural), namespace and name;
- a bundle's object state (kind ``state``: its snapshots, which hold versions, and the time
  points read from them: conditions, container starts and ends);
- a pod's own log lines (kind ``log``: a bundle's pod logs carry their pod as their object);
- log lines and apiserver traces (kinds ``log`` and ``trace``) whose message names it. The rule
  is textual: a namespaced object is named by ``namespace/name`` (klog's ``pod="ns/name"``,
  ``object="ns/name"``, ``lease ns/name``), a cluster-scoped one by its name in double quotes
  (``node="kind-worker"``, ``clusterroles "some-reader"``); either must stand alone (not part of a
  longer name such as ``ns/name-2`` or ``ns/name.v2``; a full stop after it may end a
  sentence). A trace also counts when its request URI addresses the object. Text does not
  say which kind of object it means: a pod and a service of the same namespace and name share
  their log lines.

A version is what ``timelines.reads.diff.object_version`` finds in a request's stored body (the
response object, else a whole request object); each version is diffed against the previous one
with ``GET /api/v1/events/{id}/diff/?against={previous}``.
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import orjson
from django.db.models import Q, QuerySet

from ..models import BodyChunk, Event
from ..reads.diff import NoVersion, object_version

MAX_EVENTS = 2000  # of one object's history; the answer says when there were more
# the columns the history lists (``received``/``completed`` as datetimes)
FIELDS = ("id", "kind", "received", "completed", "duration_ms", "verb", "username", "code",
          "subresource", "level", "reason", "message", "request_uri", "source", "line",
          "component", "body_chunk", "body_index")
MESSAGE_CHARS = 500  # of a log line's or an Event's message, in the answer


@dataclass(frozen=True)
class ObjectKey:
    resource: str
    namespace: str
    name: str

    def as_dict(self) -> dict[str, str]:
        return {"resource": self.resource, "namespace": self.namespace, "name": self.name}

    @cached_property
    def mention(self) -> re.Pattern:
        """How a log line names the object (see the module docstring): ``namespace/name`` with
        no name character or slash on either side, or ``"name"`` (the quotes bound it)."""
        if not self.namespace:
            return re.compile(re.escape(f'"{self.name}"'))
        # a dot may end a sentence ("lease ns/name..."), not a name ("ns/name.v2")
        return re.compile(r"(?<![\w.\-/])" + re.escape(f"{self.namespace}/{self.name}")
                          + r"(?![\w\-/]|\.[\w\-])")

    def paths(self) -> list[str]:
        """The request URI paths that address the object (core and named API groups)."""
        tail = f"/{self.resource}/{self.name}"
        return [f"/namespaces/{self.namespace}{tail}" if self.namespace else tail]


def object_of(event: Event) -> ObjectKey | None:
    """The object an event is about, or None (a log line, a list, a collection)."""
    if not event.resource or not event.name:
        return None
    return ObjectKey(event.resource, event.namespace, event.name)


def history_events(events: QuerySet, key: ObjectKey, *, text: bool = True) -> list[QuerySet]:
    """The events of ``events`` (one incident's, already filtered) that the module docstring's
    rule may count as about ``key``, as querysets in time order: the requests, Events, object
    state and a pod's own log lines on the object (the ``event_object`` index finds them), and
    with ``text`` the other log lines and traces that may name it (a substring match over their
    text: ``mentions`` keeps the exact ones).
    Two queries, not one with OR, which would read every event of the incident."""
    on = Q(resource=key.resource, namespace=key.namespace, name=key.name)
    found = [events.filter(on).order_by("received", "id")]
    if text:
        needle = f"{key.namespace}/{key.name}" if key.namespace else f'"{key.name}"'
        in_text = Q(kind__in=[Event.Kind.LOG, Event.Kind.TRACE], message__contains=needle)
        for path in key.paths():
            in_text |= Q(kind=Event.Kind.TRACE, request_uri__contains=path)
        found.append(events.filter(in_text).exclude(on).order_by("received", "id"))
    return found


def mentions(key: ObjectKey, kind: str, message: str, request_uri: str) -> bool:
    """Whether a log line or trace names the object (the module docstring's rule)."""
    if kind not in (Event.Kind.LOG, Event.Kind.TRACE):
        return True
    if key.mention.search(message):
        return True
    if kind == Event.Kind.TRACE:
        path = request_uri.split("?", 1)[0]
        return any(path.endswith(p) or f"{p}/" in path for p in key.paths())
    return False


def object_history(events: QuerySet, key: ObjectKey, *, limit: int = MAX_EVENTS,
                   text: bool = True) -> dict:
    """The history of ``key`` among ``events``: ``{"object", "events", "versions",
    "truncated"}``. Each event is a dict of ``FIELDS`` (``user`` for ``username``, times in RFC
    3339) plus ``version`` (whether it holds an object version), ``version_note`` (why not, for a
    request that holds none) and ``previous_version`` (the id of the last event before it that
    holds one, for a version; else null). The first ``limit`` events in time order. ``text``:
    look for log lines and traces too (an incident of requests only has none)."""
    rows = []
    truncated = False
    on_object, *in_text = history_events(events, key, text=text)
    # the candidates in text are read as they come: many may not name the object after all
    # (the rows on the object belong whatever their text: a pod's own log lines)
    found = [({**row, "on": True} for row in on_object.values(*FIELDS)[:limit + 1]),
             *(queryset.values(*FIELDS).iterator(chunk_size=500) for queryset in in_text)]
    for row in heapq.merge(*found, key=lambda row: (row["received"], row["id"])):
        if not row.get("on") and not mentions(key, row["kind"], row["message"],
                                               row["request_uri"]):
            continue
        if len(rows) == limit:
            truncated = True
            break
        rows.append(row)
    notes = _versions(rows)
    previous = None
    answer = []
    for row in rows:
        note = notes.get(row["id"])
        holds = (row["kind"] == Event.Kind.AUDIT and note is None
                 or row["kind"] == Event.Kind.STATE and row["reason"] == "Snapshot")
        answer.append({
            "id": row["id"], "kind": row["kind"],
            "received": row["received"].isoformat().replace("+00:00", "Z"),
            "completed": (row["completed"].isoformat().replace("+00:00", "Z")
                          if row["completed"] else None),
            "duration_ms": row["duration_ms"], "verb": row["verb"], "user": row["username"],
            "code": row["code"], "subresource": row["subresource"], "level": row["level"],
            "reason": row["reason"], "message": row["message"][:MESSAGE_CHARS],
            "source": row["source"], "line": row["line"], "component": row["component"],
            "version": holds,
            "version_note": note if row["kind"] == Event.Kind.AUDIT else None,
            "previous_version": previous if holds else None,
        })
        if holds:
            previous = row["id"]
    return {"object": key.as_dict(), "events": answer,
            "versions": sum(1 for e in answer if e["version"]), "truncated": truncated}


def _versions(rows: list[dict]) -> dict[int, str]:
    """Why each request of ``rows`` holds no object version (absent: it holds one), reading each
    body chunk once. Requests at Metadata level are answered without reading their body."""
    notes: dict[int, str] = {}
    wanted: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        if row["kind"] != Event.Kind.AUDIT:
            continue
        if row["level"] in ("Metadata", "None"):
            notes[row["id"]] = (f"the audit level is {row['level']}: requests and responses "
                                f"were not recorded")
        elif row["body_chunk"] is None:
            notes[row["id"]] = "the event's stored body is not available"
        else:
            wanted[row["body_chunk"]].append(row)
    for chunk in BodyChunk.objects.filter(pk__in=list(wanted)).only("data").iterator():
        lines = chunk.lines()
        for row in wanted.pop(chunk.pk):
            try:
                body = (orjson.loads(lines[row["body_index"]])
                        if row["body_index"] < len(lines) else None)
                object_version(body)
            except NoVersion as exc:
                notes[row["id"]] = str(exc)
    for missing in wanted.values():
        for row in missing:
            notes[row["id"]] = "the event's stored body is not available"
    return notes
