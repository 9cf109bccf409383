"""A time point of an object's state that an audit log of the same incident also holds is one
fact, the request's (issue 19: "a time point that audit logs also hold is linked to it, not shown
as a second fact").

A ``Created`` state row (the object's ``creationTimestamp``) is the create request that made the
object; a ``DeletionRequested`` row (``deletionTimestamp``, which is the request's time plus the
grace period) is its delete request. The request matches when it is of the same object (its uid,
else resource, namespace and name; a create of a ``generateName`` object names it only in its
response body, read then) and its time is within ``TOLERANCE`` of the state row's (object times
have whole seconds).

``fold_state_into_requests`` then makes the request carry the state row: the row's fact goes
into the request's ``annotations[KEY]`` (a list: reason, time, message, severity, the snapshot's
file and line, the row's identity and annotations), annotations and sequence steps on the row
name the request, and the row is removed, as a row whose identity another upload holds is when a
year is settled (``ingest.years``). Lists, figures, counts, exports, the column index and
``?kind=state`` then hold the fact once, as the request; the request's detail
(``GET /api/v1/events/{id}/``) says ``also: Created at T from snapshot FILE:LINE``. It runs where
the years are settled, when every upload of the incident is stored and before the analyses
(``registry.prepare_reads``), over the whole incident, so the audit log and the bundle may arrive
in either order; the uploads that lost rows get a new ``finished_at`` (a new data version: the
column index and cached figures of the rows before are not used again) and ``new_events`` less
the rows folded. Until then a state row's detail shows its request as ``request``, computed by
``request_of``. Folding again changes nothing; a bundle ingested again is folded again.

Findings that a folded row gave (a deletion still pending at capture: stuck terminating) read the
fact from the request (``folded_rows``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from incidents.models import Annotation, SequenceStep, Upload

from ..models import BodyChunk, Event

TOLERANCE = timedelta(seconds=2)
VERBS = {"Created": "create", "DeletionRequested": "delete"}
KEY = "linked_state"  # in a request's annotations: the state facts it carries
STATE_FORMATS = ("k8s-events", "k8s-objects")  # the files whose parser makes state rows
_GRACE = re.compile(r"grace period (\d+) s")
_STATE_FIELDS = ("id", "reason", "resource", "namespace", "name", "object_uid", "received",
                 "completed", "message", "severity", "annotations", "audit_id", "source", "line",
                 "upload_id", "body_chunk")


def fold_state_into_requests(incident_id: int) -> int:
    """Fold the incident's ``Created``/``DeletionRequested`` state rows that an audit request
    also holds into that request; returns how many were folded."""
    # The state rows first: an incident of audit logs alone has none, and its create and delete
    # requests (a third of a synthetic million) are then not read on the way to the first answer.
    # Its uploads say so without a pass over its events (only Events and objects files hold
    # state; an incident without uploads, a stream's, is read).
    uploads = Upload.objects.filter(incident_id=incident_id)
    if uploads.exists() and not uploads.filter(format__in=STATE_FORMATS).exists():
        return 0
    states = list(Event.objects.filter(
        incident_id=incident_id, kind=Event.Kind.STATE, reason__in=tuple(VERBS)).only(
        *_STATE_FIELDS))
    if not states:
        return 0
    requests = list(Event.objects.filter(
        incident_id=incident_id, kind=Event.Kind.AUDIT, verb__in=VERBS.values(),
        subresource="").exclude(code__gte=300).only(
        "id", "audit_id", "verb", "resource", "namespace", "name", "object_uid", "received",
        "body_chunk", "body_index"))
    if not requests:
        return 0
    by_uid: dict[tuple[str, str], list[Event]] = {}
    by_name: dict[tuple[str, str, str, str], list[Event]] = {}
    nameless: dict[tuple[str, str, str], list[Event]] = {}
    for request in requests:
        if request.object_uid:
            by_uid.setdefault((request.verb, request.object_uid), []).append(request)
        if request.name:
            by_name.setdefault((request.verb, request.resource, request.namespace,
                                request.name), []).append(request)
        elif request.verb == "create":
            nameless.setdefault((request.verb, request.resource, request.namespace),
                                []).append(request)
    pairs = []
    for state in states:
        verb = VERBS[state.reason]
        near = [*by_uid.get((verb, state.object_uid), ()),
                *by_name.get((verb, state.resource, state.namespace, state.name), ()),
                *nameless.get((verb, state.resource, state.namespace), ())]
        request = _pick(state, near)
        if request is not None:
            pairs.append((state, request))
    folded = 0
    for state, request in pairs:
        folded += _fold(incident_id, state, request)
    return folded



def _fold(incident_id: int, state: Event, request: Event) -> int:
    """Move one state row's fact into its request, in one transaction; 0 when another call
    folded it meanwhile."""
    with transaction.atomic():
        gone = Event.objects.filter(incident_id=incident_id, pk=state.pk)._raw_delete(
            Event.objects.db)
        if not gone:
            return 0
        row = Event.objects.select_for_update().filter(
            incident_id=incident_id, pk=request.pk).only("annotations").first()
        if row is None:  # cannot be while the incident exists; keep the fact then
            transaction.set_rollback(True)
            return 0
        carried = list(row.annotations.get(KEY) or [])
        if not any(fact.get("audit_id") == state.audit_id for fact in carried):
            carried.append(_fact(state))
        Event.objects.filter(incident_id=incident_id, pk=request.pk).update(
            annotations={**row.annotations, KEY: carried})
        Annotation.objects.filter(event_id=state.pk).update(event_id=request.pk)
        SequenceStep.objects.filter(event_id=state.pk).update(event_id=request.pk)
        if state.body_chunk is not None and not Event.objects.filter(
                incident_id=incident_id, body_chunk=state.body_chunk).exists():
            BodyChunk.objects.filter(pk=state.body_chunk).delete()
        if state.upload_id is not None:
            upload = Upload.objects.filter(pk=state.upload_id)
            parent = upload.values_list("parent_id", flat=True).first()
            Upload.objects.filter(pk__in=[state.upload_id, *([parent] if parent else [])],
                                  new_events__gt=0).update(new_events=F("new_events") - 1)
            # a new data version: what was counted or indexed with the row is not used again
            upload.update(finished_at=timezone.now())
    return 1


def _fact(state: Event) -> dict:
    """What a request keeps of a state row folded into it."""
    return {"reason": state.reason, "received": state.received.isoformat(),
            "completed": state.completed.isoformat() if state.completed else None,
            "message": state.message, "severity": state.severity, "resource": state.resource,
            "namespace": state.namespace, "name": state.name, "object_uid": state.object_uid,
            "source": state.source, "line": state.line, "upload": state.upload_id,
            "audit_id": state.audit_id, "annotations": state.annotations}


def carried_facts(event: Event) -> list[str]:
    """The state facts a request carries, as its detail says them ("Created at T from snapshot
    FILE:LINE")."""
    if event.kind != Event.Kind.AUDIT:
        return []
    said = []
    for fact in event.annotations.get(KEY) or []:
        where = f"{fact.get('source')}:{fact.get('line')}" if fact.get("source") else "a bundle"
        text = f"{fact.get('reason')} at {fact.get('received')} from snapshot {where}"
        if fact.get("message"):
            text += f" ({fact['message']})"
        said.append(text)
    return said


def folded_rows(events, fields: tuple[str, ...]) -> list[dict]:
    """The state rows folded into the requests of ``events`` (a queryset of an incident's
    events), as ``events.values(*fields)`` gave them before: the request's id, the row's kind,
    times and fields, and its annotations with ``request``."""
    rows = []
    for pk, audit_id, kept in events.filter(
            kind=Event.Kind.AUDIT, annotations__has_key=KEY).values_list(
            "pk", "audit_id", "annotations"):
        for fact in kept.get(KEY) or []:
            row = {"id": pk, "kind": Event.Kind.STATE,
                   "received": datetime.fromisoformat(fact["received"]),
                   "completed": (datetime.fromisoformat(fact["completed"])
                                 if fact.get("completed") else None),
                   "code": None, "count": None, "node": "", "component": "",
                   "annotations": {**(fact.get("annotations") or {}), "request": pk,
                                   "request_audit_id": audit_id}}
            for name in ("reason", "message", "severity", "resource", "namespace", "name",
                         "source"):
                row[name] = fact.get(name, "")
            rows.append({name: row.get(name) for name in fields})
    return rows


def request_of(event: Event) -> Event | None:
    """The request a state row will be folded into, while it is not yet (the incident's
    uploads not all stored), so that its detail names the request from the first answer; a row
    linked by an earlier version names it in ``annotations.request``."""
    if event.kind != Event.Kind.STATE or event.reason not in VERBS:
        return None
    requests = Event.objects.filter(incident_id=event.incident_id, kind=Event.Kind.AUDIT)
    if isinstance(event.annotations.get("request"), int):
        return requests.filter(pk=event.annotations["request"]).first()
    when = _request_time(event)
    near = requests.filter(verb=VERBS[event.reason], subresource="", resource=event.resource,
                           namespace=event.namespace,
                           received__range=(when - TOLERANCE, when + TOLERANCE)).exclude(
        code__gte=300)
    return _pick(event, list(near))


def _request_time(state: Event):
    """When the request of a state row was made: a deletion's timestamp is the request's time
    plus the grace period."""
    grace = _GRACE.search(state.message) if state.reason == "DeletionRequested" else None
    return state.received - timedelta(seconds=int(grace.group(1)) if grace else 0)


def _pick(state: Event, candidates: list[Event]) -> Event | None:
    """The request among ``candidates`` (of the same verb, resource and namespace) that made the
    state row's fact: of the same object and the nearest in time within ``TOLERANCE``."""
    when = _request_time(state)
    found = {}
    for request in candidates:
        if abs(request.received - when) > TOLERANCE:
            continue
        # A uid in a create's objectRef is not the new object's (it has none before), so a
        # different one does not rule the request out: its name within the time does.
        if state.object_uid and request.object_uid == state.object_uid:
            same = True
        elif request.name:
            same = request.name == state.name
        else:
            same = request.verb == "create" and _response_names(request, state)
        if same:
            found[request.pk] = request
    if not found:
        return None
    return min(found.values(), key=lambda r: abs(r.received - when))


def _response_names(request: Event, state: Event) -> bool:
    """Whether a create request without a name in its objectRef made this object (the response
    body names it)."""
    body = request.body() or {}
    response = body.get("responseObject")
    meta = response.get("metadata") if isinstance(response, dict) else None
    if not isinstance(meta, dict):
        return False
    if state.object_uid and meta.get("uid"):
        return meta.get("uid") == state.object_uid
    return meta.get("name") == state.name
