"""HTTP side of ``timelines.analysis.stats``: the request time API and the statistics page, with
the events list's filters and access rules."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError

from hindsight.schema import FILTERED
from incidents.access import get_visible_incident

from ..reads.filters import EventFilterSet
from ..reads.queries import BadQuery

BY_LABELS = {"user": "User", "user_agent": "User agent", "verb": "Verb", "resource": "Resource",
             "namespace": "Namespace", "code": "Code"}
_BY = OpenApiParameter("by", str, enum=list(BY_LABELS), description="default user")
_MS = {"type": "number", "nullable": True}
_ROW = {"type": "object", "properties": {
    "key": {"nullable": True, "description": "a string, or for code an integer (null: none)"},
    "requests": {"type": "integer"}, "total_ms": {"type": "number"}, "p50_ms": _MS,
    "p95_ms": _MS, "max_ms": _MS,
    "errors": {"type": "integer", "description": "requests that answered 400 or more"}}}


@extend_schema(
    parameters=[*FILTERED, _BY, OpenApiParameter("limit", int, description="at most 10,000; "
                                                                              "default 1000")],
    responses=OpenApiResponse({"type": "object", "properties": {
        "by": {"type": "string"}, "results": {"type": "array", "items": _ROW},
        "keys": {"type": "integer"}, "requests": {"type": "integer"},
        "next": {"type": "string", "nullable": True}}},
        "request time per key, most total time first"))
@api_view(["GET"])
def stats_api(request, incident_pk: int):
    """Request time of the incident's requests (kind audit) that match the events filters,
    grouped by ``by`` (user, user_agent, verb, resource, namespace or code; default user):
    ``{"by", "results": [{"key", "requests", "total_ms", "p50_ms", "p95_ms", "max_ms",
    "errors"}], "keys", "requests", "next": null}``, most total time first (ties by key), at
    most ``limit`` rows (default 1000, at most 10,000). Times are over the completed requests
    (``completed − received``); ``requests`` counts the open ones too; ``errors``: answers of
    400 and more. Percentiles are nearest-rank (PostgreSQL's ``percentile_disc``)."""
    incident = get_visible_incident(request.user, incident_pk)
    from . import stats  # numpy: loaded by the processes that count

    try:
        body = stats.stats_json(incident, request.query_params)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    return HttpResponse(body, content_type="application/json")


@extend_schema(
    parameters=[*FILTERED, _BY,
                OpenApiParameter("top", int, description="keys drawn, at most 50; default 8"),
                OpenApiParameter("bins", int, description="at most 1000; default 120")],
    responses=OpenApiResponse({"type": "object", "properties": {
        "by": {"type": "string"}, "start": {"type": "string", "nullable": True},
        "width_ms": {"type": "number", "nullable": True}, "bins": {"type": "integer"},
        "series": {"type": "array", "items": {"type": "object", "properties": {
            "key": {"nullable": True}, "requests": {"type": "integer"},
            "mean": {"type": "array", "items": {"type": "number"}}}}}}},
        "mean requests in flight per time bin, per key"))
@api_view(["GET"])
def inflight_api(request, incident_pk: int):
    """Requests in flight over time, per ``by`` key, of the requests matching the filters:
    ``{"by", "start", "width_ms", "bins", "series": [{"key", "requests", "mean": [per bin]}]}``,
    ``mean`` being the time requests spent in flight in a bin over the bin's width. The ``top``
    keys (default 8, at most 50) with the most time in flight, the rest summed as
    ``(others)``; ``bins`` (default 120). An open request is in flight to the chart's end."""
    incident = get_visible_incident(request.user, incident_pk)
    from . import stats

    try:
        body = stats.inflight_json(incident, request.query_params)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    return HttpResponse(body, content_type="application/json")


@login_required
def stats_page(request, pk: int):
    """The table and charts of ``stats_api`` for the filters in the query string; each row links
    to the incident's timeline filtered to it."""
    incident = get_visible_incident(request.user, pk)
    from . import stats

    by = request.GET.get("by", "user")
    if by not in stats.BY:
        by = "user"
    filters = [(name, value) for name in EventFilterSet.base_filters
               for value in request.GET.getlist(name) if value != ""]
    query = urlencode(filters)
    incident_url = reverse("incidents:detail", args=[pk])
    return render(request, "analysis/stats.html", {
        "incident": incident,
        "by": by,
        "by_choices": list(BY_LABELS.items()),
        "filters": filters,
        "filters_query": query,
        "back_url": f"{incident_url}?{query}#timeline" if query else f"{incident_url}#timeline",
        "incident_url": incident_url,
        "stats_url": reverse("incident-stats", args=[pk]),
        "inflight_url": reverse("incident-stats-inflight", args=[pk]),
    })
