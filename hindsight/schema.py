"""OpenAPI descriptions that drf-spectacular cannot infer: the token authentication, and the
views of ``timelines.web.api`` that are functions or build their queryset from the URL, described
here so that their module stays about events. Imported by ``hindsight.urls``; an extension whose
view is gone matches nothing."""

from __future__ import annotations

import django_filters
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema

from timelines.figures.lanes import NONE
from timelines.reads.filters import EventFilterSet, IntAnyOf


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "incidents.auth.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token <key>` (or `Bearer <key>`); make a key with "
                               "`manage.py create_api_token`"}


def event_filter_parameters() -> list[OpenApiParameter]:
    """The query parameters of ``EventFilterSet``: a repeated parameter ORs its values."""
    parameters = []
    for name, field in EventFilterSet.base_filters.items():
        if isinstance(field, django_filters.IsoDateTimeFilter):
            kind = OpenApiTypes.DATETIME
        elif isinstance(field, IntAnyOf):
            kind = OpenApiTypes.INT
        else:
            kind = OpenApiTypes.STR
        help_text = field.extra.get("help_text") or ""
        none = f"{NONE}: the events without one" if field.extra.get("keeps_none") else ""
        parameters.append(OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=(
            help_text if kind == OpenApiTypes.DATETIME else
            "; ".join(p for p in (help_text, "repeat to match any of several", none) if p))))
    return parameters


INCIDENT_PK = OpenApiParameter("incident_pk", OpenApiTypes.INT, OpenApiParameter.PATH,
                               description="the incident's id")
FILTERED = [INCIDENT_PK, *event_filter_parameters()]


class IncidentEventList(OpenApiViewExtension):
    target_class = "timelines.web.api.IncidentEventViewSet"

    def view_replacement(self):
        from timelines.models import Event

        class Described(self.target_class):
            def get_queryset(self):
                if getattr(self, "swagger_fake_view", False):  # no incident in the URL here
                    return Event.objects.none()
                return super().get_queryset()

        # the filters by hand: django-filter's introspection cannot type the custom ones
        return extend_schema(parameters=FILTERED, filters=False)(Described)


class IncidentFigure(OpenApiViewExtension):
    target_class = "timelines.web.api.incident_figure"

    def view_replacement(self):
        class Described(self.target_class):
            @extend_schema(
                parameters=[*FILTERED,
                            OpenApiParameter("lanes", str, enum=["object", "actor", "user_agent",
                                                                 "source"]),
                            OpenApiParameter("colour", str, enum=["verb", "outcome"])],
                responses=OpenApiResponse(OpenApiTypes.OBJECT, "a Plotly figure (JSON)"))
            def get(self, request, *args, **kwargs):
                pass  # pragma: no cover - only described

        return Described


class IncidentEventsCsv(OpenApiViewExtension):
    target_class = "timelines.web.api.incident_events_csv"

    def view_replacement(self):
        class Described(self.target_class):
            @extend_schema(parameters=FILTERED,
                           responses={(200, "text/csv"): OpenApiResponse(
                               OpenApiTypes.STR, "the filtered events as CSV, in time order")})
            def get(self, request, *args, **kwargs):
                pass  # pragma: no cover - only described

        return Described


class IncidentEventsJson(OpenApiViewExtension):
    target_class = "timelines.web.api.incident_events_json"

    def view_replacement(self):
        class Described(self.target_class):
            @extend_schema(parameters=FILTERED, responses=OpenApiResponse(
                {"type": "array", "items": {"type": "object"}},
                "the filtered events with the CSV's columns, in time order"))
            def get(self, request, *args, **kwargs):
                pass  # pragma: no cover - only described

        return Described


class IncidentEventStep(OpenApiViewExtension):
    target_class = "timelines.web.api.incident_event_step"

    def view_replacement(self):
        class Described(self.target_class):
            @extend_schema(
                parameters=[*FILTERED,
                            OpenApiParameter("from", int, description="the event to step from"),
                            OpenApiParameter("direction", str, enum=["next", "previous"])],
                responses=OpenApiResponse(
                    {"type": "object", "properties": {"event": {"type": "object",
                                                                "nullable": True}}},
                    "the neighbouring event, or null"))
            def get(self, request, *args, **kwargs):
                pass  # pragma: no cover - only described

        return Described


_VALUE = {"type": "object", "properties": {
    "value": {"nullable": True, "description": "a string, or for code an integer (null: none)"},
    "count": {"type": "integer"},
    "errors": {"type": "integer", "description": "of those, events that answered 400 or more"}}}
_VALUES = {"type": "array", "items": _VALUE}


class IncidentFacets(OpenApiViewExtension):
    target_class = "timelines.web.overview_api.incident_facets"

    def view_replacement(self):
        from timelines.reads.facets import FACET_FIELDS  # numpy: only when the schema is made

        class Described(self.target_class):
            @extend_schema(
                parameters=[*FILTERED,
                            OpenApiParameter("field", str, required=True,
                                             enum=list(FACET_FIELDS)),
                            OpenApiParameter("limit", int, description="at most 1000; "
                                                                       "default 20"),
                            OpenApiParameter("contains", str, description="only values holding "
                                                                          "this text, any case")],
                responses=OpenApiResponse(
                    {"type": "object", "properties": {
                        "field": {"type": "string"}, "values": _VALUES,
                        "total": {"type": "integer", "description": "events matching"},
                        "distinct": {"type": "integer"}}},
                    "the field's values among the filtered events, most frequent first"))
            def get(self, request, *args, **kwargs):
                pass  # pragma: no cover - only described

        return Described


class IncidentOverview(OpenApiViewExtension):
    target_class = "timelines.web.overview_api.incident_overview"

    def view_replacement(self):
        facet = {"type": "object", "properties": {"values": _VALUES,
                                                  "distinct": {"type": "integer"}}}

        class Described(self.target_class):
            @extend_schema(
                parameters=[*FILTERED,
                            OpenApiParameter("top", int, description="values per field, at "
                                                                     "most 100; default 8")],
                responses=OpenApiResponse(
                    {"type": "object", "properties": {
                        "total": {"type": "integer"},
                        "range": {"type": "array", "items": {"type": "string"},
                                  "nullable": True},
                        "histogram": {"type": "object", "nullable": True, "properties": {
                            "start": {"type": "string"}, "end": {"type": "string"},
                            "bin_ms": {"type": "number"}, "bins": {"type": "integer"},
                            "by": {"type": "string"},
                            "series": {"type": "array", "items": {
                                "type": "object", "properties": {
                                    "name": {"type": "string"},
                                    "counts": {"type": "array",
                                               "items": {"type": "integer"}}}}}}},
                        "facets": {"type": "object", "additionalProperties": facet},
                        "window": {"type": "object", "nullable": True, "properties": {
                            "since": {"type": "string"}, "until": {"type": "string"},
                            "events": {"type": "integer"}, "outside": {"type": "integer"},
                            "reason": {"type": "string"}}}}},
                    "counts, histogram, top values and a suggested window"))
            def get(self, request, *args, **kwargs):
                pass  # pragma: no cover - only described

        return Described
