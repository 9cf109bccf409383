"""A time point of an object's state that an audit log of the same incident also holds is linked
to the request (issue 19: "a time point that audit logs also hold is linked to it, not shown as a
second fact").

A ``Created`` state row (the object's ``creationTimestamp``) is the create request that made the
object; a ``DeletionRequested`` row (``deletionTimestamp``, which is the request's time plus the
grace period) is its delete request. The request matches when it is of the same object (its uid,
else resource, namespace and name; a create of a ``generateName`` object names it only in its
response body, read then) and its time is within ``TOLERANCE`` of the state row's (object times
have whole seconds). The state row's annotations then carry ``request`` (the request's event id)
and ``request_audit_id`` (its auditID), and the event detail (``GET /api/v1/events/{id}/``) shows
the request as ``request`` (computed there from the same rule while the link is not stored yet).

It runs after each upload is ready (``registry``), over the whole incident, so the link is made
whichever file arrives first; a linked row is not looked at again.
"""

from __future__ import annotations

import re
from datetime import timedelta

from ..models import Event

TOLERANCE = timedelta(seconds=2)
VERBS = {"Created": "create", "DeletionRequested": "delete"}
_GRACE = re.compile(r"grace period (\d+) s")


def link_state_to_requests(incident_id: int) -> int:
    """Link the incident's ``Created``/``DeletionRequested`` state rows to their requests;
    returns how many were linked."""
    requests = list(Event.objects.filter(
        incident_id=incident_id, kind=Event.Kind.AUDIT, verb__in=VERBS.values(),
        subresource="").exclude(code__gte=300).only(
        "id", "audit_id", "verb", "resource", "namespace", "name", "object_uid", "received",
        "body_chunk", "body_index"))
    if not requests:
        return 0
    states = list(Event.objects.filter(
        incident_id=incident_id, kind=Event.Kind.STATE, reason__in=tuple(VERBS)).exclude(
        annotations__has_key="request").only(
        "id", "reason", "resource", "namespace", "name", "object_uid", "received", "message",
        "annotations"))
    if not states:
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
    linked = 0
    for state in states:
        verb = VERBS[state.reason]
        near = [*by_uid.get((verb, state.object_uid), ()),
                *by_name.get((verb, state.resource, state.namespace, state.name), ()),
                *nameless.get((verb, state.resource, state.namespace), ())]
        request = _pick(state, near)
        if request is None:
            continue
        annotations = {**state.annotations, "request": request.pk,
                       "request_audit_id": request.audit_id}
        Event.objects.filter(incident_id=incident_id, pk=state.pk).update(
            annotations=annotations)
        linked += 1
    return linked


def request_of(event: Event) -> Event | None:
    """The request a state row is linked to; computed here when the link is not stored yet (the
    analysis has not run), so the event detail answers the same either way."""
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
