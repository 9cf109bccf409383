"""HTTP side of ``timelines.analysis.history``: the API and the object history page."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from hindsight.schema import FILTERED
from incidents.access import get_visible_incident

from ..models import Event
from ..reads.queries import BadQuery
from ..reads.related import related_objects
from ..store.aggregate import requests_only
from . import filtered
from .history import ObjectKey, object_history, object_of

# Parameters that choose the object, not filters (resource, namespace and name are filters of
# the events API too, where an empty namespace matches every namespace).
OBJECT_PARAMS = ("event", "resource", "namespace", "name")


def object_key(incident, params) -> ObjectKey:
    """The object ``params`` choose: that of ``event`` (an event id of the incident), or
    ``resource``, ``namespace`` (empty or absent: cluster-scoped) and ``name``; 400 otherwise."""
    event_id = params.get("event", "")
    if event_id:
        if not event_id.isdigit():
            raise ValidationError({"event": "an event id"})
        event = Event.objects.filter(incident=incident, pk=int(event_id)).only(
            "resource", "namespace", "name").first()
        if event is None:
            raise ValidationError({"event": f"event {event_id} is not an event of incident "
                                            f"{incident.pk}"})
        key = object_of(event)
        if key is None:
            raise ValidationError({"event": f"event {event_id} names no object (it has no "
                                            f"resource and name): choose an event of one"})
        return key
    resource, name = params.get("resource", ""), params.get("name", "")
    if not resource or not name:
        raise ValidationError({"detail": "Give event=<id> (the object of that event), or "
                                         "resource, name and, for a namespaced object, "
                                         "namespace."})
    return ObjectKey(resource, params.get("namespace", ""), name)


_EVENT = {"type": "object", "properties": {
    "id": {"type": "integer"}, "kind": {"type": "string"}, "received": {"type": "string"},
    "completed": {"type": "string", "nullable": True},
    "duration_ms": {"type": "number", "nullable": True}, "verb": {"type": "string"},
    "user": {"type": "string"}, "code": {"type": "integer", "nullable": True},
    "subresource": {"type": "string"}, "level": {"type": "string"},
    "reason": {"type": "string"}, "message": {"type": "string"}, "source": {"type": "string"},
    "line": {"type": "integer"}, "component": {"type": "string"},
    "version": {"type": "boolean", "description": "it holds a version of the object"},
    "version_note": {"type": "string", "nullable": True,
                     "description": "why a request holds no version"},
    "previous_version": {"type": "integer", "nullable": True,
                         "description": "the version before it, to diff against"}}}


@extend_schema(
    parameters=[*FILTERED,
                OpenApiParameter("event", int, description="the object of this event"),
                OpenApiParameter("resource", str, description="with name, instead of event"),
                OpenApiParameter("namespace", str, description="empty: cluster-scoped"),
                OpenApiParameter("name", str)],
    responses=OpenApiResponse({"type": "object", "properties": {
        "object": {"type": "object", "properties": {
            "resource": {"type": "string"}, "namespace": {"type": "string"},
            "name": {"type": "string"}}},
        "events": {"type": "array", "items": _EVENT}, "versions": {"type": "integer"},
        "truncated": {"type": "boolean"}}}, "the object's events in time order"))
@api_view(["GET"])
def history_api(request, incident_pk: int):
    """Everything about one object of the incident, in time order (``timelines.analysis
    .history``): ``?event=<id>`` (the object of that event) or ``?resource=&namespace=&name=``,
    plus any events filter (``kind``, ``user``, ``since``…) to narrow it.
    ``{"object": {"resource", "namespace", "name"}, "events": [{"id", "kind", "received",
    "verb", "user", "code", "subresource", "reason", "message", …, "version",
    "version_note", "previous_version"}], "versions", "truncated"}``: a ``version`` event holds
    an object version, diffable against ``previous_version`` with the events' diff endpoint."""
    incident = get_visible_incident(request.user, incident_pk)
    key = object_key(incident, request.query_params)
    params = request.query_params.copy()
    for name in OBJECT_PARAMS:
        params.pop(name, None)
    try:
        events = filtered(incident, params)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    return Response(object_history(events, key, text=not requests_only(incident.pk)))


@login_required
def history_page(request, pk: int):
    """The object history page: the list comes from ``history_api`` (static/js/history.js)."""
    incident = get_visible_incident(request.user, pk)
    return render(request, "analysis/history.html", {"incident": incident})


_OBJECT = {"type": "object", "properties": {
    "resource": {"type": "string"}, "namespace": {"type": "string"}, "name": {"type": "string"}}}


@extend_schema(
    parameters=[OpenApiParameter("event", int, description="the object of this event"),
                OpenApiParameter("resource", str, description="with name, instead of event"),
                OpenApiParameter("namespace", str, description="empty: cluster-scoped"),
                OpenApiParameter("name", str)],
    responses=OpenApiResponse({"type": "object", "properties": {
        "object": {"type": "object", "properties": {
            **_OBJECT["properties"], "uid": {"type": "string"}}},
        "related": {"type": "array", "items": {"type": "object", "properties": {
            **_OBJECT["properties"], "relation": {"type": "string", "description": (
                "owner, owned, node, claim, volume, service, endpoints, pod")}}}}}},
        "the objects related to the object"))
@api_view(["GET"])
def related_api(request, incident_pk: int):
    """The objects related to one object of the incident (``timelines.reads.related``), from its
    snapshots: ``?resource=&namespace=&name=`` (or ``?event=<id>``) →
    ``{"object": {"resource", "namespace", "name", "uid"}, "related": [{"resource",
    "namespace", "name", "relation"}]}``. Its owners up the chain, what it owns down the chain,
    and for it and what it owns: node, claims and their volumes, Services, Endpoints, pods. The
    events filter ``related=R/N/X`` selects the same objects."""
    incident = get_visible_incident(request.user, incident_pk)
    key = object_key(incident, request.query_params)
    events = Event.objects.filter(incident=incident)
    return Response(related_objects(events, (key.resource, key.namespace, key.name)))
