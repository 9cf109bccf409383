"""REST API of the incident page's first view: facets and the overview strip
(``timelines.reads.overview``), with the events list's filters and access rules."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError

from incidents.access import get_visible_incident

from ..reads.queries import BadQuery


@api_view(["GET"])
def incident_facets(request, incident_pk: int):
    """The values of one field (``field``) among the incident's events that match the filters,
    most frequent first (ties by value), at most ``limit`` (default 20, at most 1000):
    ``{"field", "values": [{"value", "count", "errors"}], "total", "distinct"}``. ``errors``:
    how many of a value's events answered 400 or more. ``contains``: only values holding that
    text, in any case. ``total`` counts the matching events, ``distinct`` the values
    (``contains`` applied). An event without the field counts under ``""`` (``null`` for
    ``code``); ``group`` counts each event once under each of its groups."""
    incident = get_visible_incident(request.user, incident_pk)
    from ..reads.overview import facets_json  # numpy: loaded by the processes that count

    try:
        body = facets_json(incident, request.query_params)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    return HttpResponse(body, content_type="application/json")


@api_view(["GET"])
def incident_overview(request, incident_pk: int):
    """The overview strip of the incident's events that match the filters: ``total``,
    ``range`` ([first, last] ``received`` or null), ``histogram`` (at most 120 equal bins by
    outcome for requests, by kind for other evidence; null without events), ``facets`` (the
    ``top`` values, default 8, of user, user_agent, verb, resource, namespace, code, kind,
    reason, component, node and source) and
    ``window`` (a suggested first window of the events matching the filters without
    ``since``/``until``, or null: ``timelines.reads.overview.suggest_window``)."""
    incident = get_visible_incident(request.user, incident_pk)
    from ..reads.overview import overview_json

    try:
        body = overview_json(incident, request.query_params)
    except BadQuery as exc:
        raise ValidationError(exc.errors) from None
    return HttpResponse(body, content_type="application/json")
