"""HTTP side of ``timelines.analysis.insights``: the stored findings of an incident, their
recomputation, and a root-cause sequence started from one of them."""

from __future__ import annotations

import orjson
from django.http import Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from incidents import notes
from incidents.access import can_write, get_visible_incident
from incidents.models import writing
from incidents.notes import Sequence, SequenceStep
from incidents.notes_api import sequence_output, sequences_with_steps

from ..models import Event
from . import insights

READ_ONLY = "You may read this incident but not change it."


def _answer(found: list[dict], row, kinds: list[str] | None = None) -> HttpResponse:
    if kinds:
        found = [item for item in found if item["kind"] in kinds]
    response = HttpResponse(orjson.dumps(found), content_type="application/json")
    if row is not None:
        response["X-Insights-Version"] = row.version
        response["X-Insights-Computed-At"] = row.computed_at.isoformat()
    return response


@extend_schema(
    summary="The incident's insights",
    description=(
        "`GET`: the findings of the incident's current data version, computed once (when its "
        "uploads finish, or by the first read) and stored: `[{\"id\", \"kind\", \"title\", "
        "\"severity\", \"explanation\", \"events\": [event ids], \"event_count\", …}]`, the "
        "most severe first. Kinds: `list-without-resource-version`, `slow-request`, "
        "`deletion`, `recreated-object`, `error-burst`, `conflicting-writers`, "
        "`audit-coverage`, `detection` (a Falco rule's matches on one object, with `rule`, "
        "`priority`, `output`, `source`, `tags`); on bundles `container-restarts`, `oom-kill`, "
        "`unschedulable`, `mount-failure`, `probe-failure`, `image-pull`, `sandbox-failure`, "
        "`eviction`, `stuck-pending`, `stuck-terminating`, `node-condition`, `operator-condition`, "
        "`workload-unavailable`, `repeated-event`, `warning-burst`, `log-errors`, each with "
        "`start`/`end` (RFC 3339), `objects` ([{\"resource\", \"namespace\", \"name\"}]), "
        "`capture` and `age_s`. `kind` (repeated ORs) keeps those kinds. "
        "`POST` (writers): compute them again now."),
    request=None,
    parameters=[OpenApiParameter("kind", str, many=True, description="keep these kinds only")],
    responses={200: OpenApiResponse({"type": "array", "items": {
        "type": "object", "required": ["kind", "title", "severity", "events"], "properties": {
            "id": {"type": "integer"}, "kind": {"type": "string"},
            "title": {"type": "string"}, "severity": {"type": "string"},
            "explanation": {"type": "string"},
            "events": {"type": "array", "items": {"type": "integer"}},
            "event_count": {"type": "integer"}}}})},
)
@api_view(["GET", "POST"])
def insights_api(request, incident_pk: int):
    incident = get_visible_incident(request.user, incident_pk)
    if request.method == "POST":
        if not can_write(request.user, incident):
            raise PermissionDenied(READ_ONLY)
        row = insights.refresh(incident.pk)
        if row is not None:
            return _answer(row.insights, row, request.query_params.getlist("kind"))
    return _answer(*insights.current(incident.pk), request.query_params.getlist("kind"))


@extend_schema(
    summary="A root-cause sequence from an insight",
    description=(
        "A new sequence of the incident titled after the insight (or `title`), its steps the "
        "insight's events in time order, the first noting the insight's explanation; 201 with "
        "the sequence. `number` is the insight's `id` in the current list. Writers only."),
    request=inline_serializer("InsightSequence", {"title": serializers.CharField(
        required=False, max_length=300)}),
    responses={201: OpenApiResponse(OpenApiTypes.OBJECT)},
)
@api_view(["POST"])
def insight_sequence_api(request, incident_pk: int, number: int):
    incident = get_visible_incident(request.user, incident_pk)
    if not can_write(request.user, incident):
        raise PermissionDenied(READ_ONLY)
    found, _ = insights.current(incident.pk)
    item = next((i for i in found if i.get("id") == number), None)
    if item is None:
        raise Http404("No such insight (the list changes with every upload: read it again).")
    title = str(request.data.get("title") or item["title"])[:300]
    times = list(Event.objects.filter(incident_id=incident.pk, pk__in=item["events"]).order_by(
        "received", "id").values_list("pk", "received")[:notes.MAX_STEPS])
    if not times:
        raise ValidationError({"events": ["This insight names no event to make steps of."]})
    steps = [SequenceStep(event_id=pk, at=at) for pk, at in times]
    steps[0].note = item["explanation"]
    with writing(incident.pk):
        sequence = Sequence.objects.create(incident=incident, author=request.user, title=title)
        sequence.replace_steps(steps)
    sequence = sequences_with_steps(Sequence.objects.filter(pk=sequence.pk)).get()
    return Response(sequence_output([sequence], {"request": request})[0],
                    status=status.HTTP_201_CREATED)
