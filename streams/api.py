"""REST API of streams (``/api/v1/streams/``): list, create, one stream, its kubeconfig, its
events (every filter of the incident events list) and cutting an incident from it."""

from __future__ import annotations

from datetime import timedelta

import orjson
from django.conf import settings
from django.db import IntegrityError
from django.db.models import Max
from django.http import HttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from hindsight.schema import event_filter_parameters
from incidents.serializers import absolute
from timelines.detections.marks import detection_marks
from timelines.figures.build import COLOURS, MAX_SPANS, build_gantt_figure
from timelines.figures.lanes import GROUPS
from timelines.models import Event
from timelines.reads.filters import EventFilterSet
from timelines.reads.queries import SPAN_FIELDS
from timelines.store import aggregate
from timelines.web.api import EventCursorPagination, figure_options
from timelines.web.serializers import LIST_COLUMNS, EventSerializer, event_rows

from . import store
from .access import (
    can_administer,
    can_manage,
    get_visible_stream,
    stream_teams,
    visible_streams,
)
from .cut import cut_incident
from .kubeconfig import apiserver_flags, kubeconfig
from .models import Stream

STREAM_PK = OpenApiParameter("stream_pk", OpenApiTypes.INT, OpenApiParameter.PATH,
                             description="the stream's id")


class StreamSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    events = serializers.SerializerMethodField()
    oldest = serializers.SerializerMethodField()
    newest = serializers.SerializerMethodField()
    kubeconfig_url = serializers.SerializerMethodField()

    class Meta:
        model = Stream
        fields = ["id", "name", "team", "retention_hours", "retention_gb", "events", "oldest",
                  "newest", "kubeconfig_url"]

    def _summary(self, stream: Stream) -> dict:
        cache = self.context.setdefault("summaries", {})
        if stream.pk not in cache:
            cache[stream.pk] = store.summary(stream)
        return cache[stream.pk]

    def get_events(self, stream: Stream) -> int:
        return self._summary(stream)["events"]

    def get_oldest(self, stream: Stream) -> str | None:
        value = self._summary(stream)["oldest"]
        return serializers.DateTimeField().to_representation(value) if value else None

    def get_newest(self, stream: Stream) -> str | None:
        value = self._summary(stream)["newest"]
        return serializers.DateTimeField().to_representation(value) if value else None

    def get_kubeconfig_url(self, stream: Stream) -> str:
        return absolute(self.context.get("request"),
                        reverse("api:stream-kubeconfig", args=[stream.pk]))


class StreamCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    team = serializers.CharField(required=False, help_text="the team's name, if you are in several")
    retention_hours = serializers.IntegerField(min_value=1, max_value=24 * 366, default=24)
    retention_gb = serializers.FloatField(min_value=0.001, required=False, allow_null=True)


class CutSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    title = serializers.CharField(max_length=300)

    def validate(self, data):
        if data["until"] < data["since"]:
            raise ValidationError("until is before since")
        return data


class CutAnswerSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.URLField()


class StreamCreatedSerializer(StreamSerializer):
    token = serializers.CharField(help_text="the bearer token, shown only here")
    kubeconfig = serializers.CharField(help_text="for --audit-webhook-config-file")
    apiserver_flags = serializers.ListField(child=serializers.CharField())

    class Meta(StreamSerializer.Meta):
        fields = [*StreamSerializer.Meta.fields, "token", "kubeconfig", "apiserver_flags"]


class KubeconfigSerializer(serializers.Serializer):
    kubeconfig = serializers.CharField()
    apiserver_flags = serializers.ListField(child=serializers.CharField())


def receiver_url(request, stream: Stream) -> str:
    return absolute(request, reverse("stream-audit", args=[stream.pk]))


def _created(request, stream: Stream, token: str, context) -> dict:
    answer = dict(StreamSerializer(stream, context=context).data)
    answer["token"] = token
    answer["kubeconfig"] = kubeconfig(stream, receiver_url(request, stream), token)
    answer["apiserver_flags"] = apiserver_flags()
    return answer


class StreamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                    viewsets.GenericViewSet):
    """Streams of your teams. ``POST`` makes one (editors and admins of its team) and answers
    201 with the stream, its ``token`` (shown only here), the ``kubeconfig`` for
    ``--audit-webhook-config-file`` and the ``apiserver_flags`` to add. ``DELETE`` (admins of
    its team) drops it with its events; incidents cut from it stay."""

    serializer_class = StreamSerializer

    def get_queryset(self):
        return visible_streams(self.request.user).select_related("team")

    def get_serializer_class(self):
        return StreamCreateSerializer if self.action == "create" else StreamSerializer

    @extend_schema(request=StreamCreateSerializer, responses={201: StreamCreatedSerializer})
    def create(self, request, *args, **kwargs):
        data = StreamCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        teams = stream_teams(request.user)
        if values.get("team"):
            team = teams.filter(name=values["team"]).first()
            if team is None:
                raise PermissionDenied(f"You may not make streams for team {values['team']!r}.")
        else:
            found = list(teams[:2])
            if not found:
                raise PermissionDenied("Only editors and admins of a team may make its streams.")
            if len(found) != 1:
                raise ValidationError({"team": "name the team (you are an editor of "
                                               f"{len(found)} teams)"})
            team = found[0]
        try:
            stream, token = store.create_stream(
                values["name"], team, retention_hours=values["retention_hours"],
                retention_gb=values.get("retention_gb"), created_by=request.user)
        except IntegrityError:
            raise ValidationError({"name": "the team has a stream of that name"}) from None
        return Response(_created(request, stream, token, self.get_serializer_context()),
                        status=status.HTTP_201_CREATED)

    def perform_destroy(self, stream):
        if not can_administer(self.request.user, stream):
            raise PermissionDenied("Only admins of the stream's team may delete it.")
        store.delete_stream(stream)

    @extend_schema(request=None, responses=KubeconfigSerializer)
    @action(detail=True, methods=["get", "post"], url_path="kubeconfig")
    def kubeconfig(self, request, pk=None):
        """``GET``: the kubeconfig without its token (only its hash is kept). ``POST`` (editors):
        a new token, the old one stops working, and the kubeconfig with it."""
        stream = get_visible_stream(request.user, pk)
        token = "<the stream's token, shown when it was made>"
        if request.method == "POST":
            if not can_manage(request.user, stream):
                raise PermissionDenied("Only editors of the stream's team may change its token.")
            token = Stream.new_token()
            from .models import hash_token

            Stream.objects.filter(pk=stream.pk).update(token_hash=hash_token(token),
                                                       token_prefix=token[:12])
        return Response({"kubeconfig": kubeconfig(stream, receiver_url(request, stream), token),
                         "apiserver_flags": apiserver_flags()})


class StreamEventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Events of one stream, filtered as the incident events list (``EventFilterSet``), in time
    order, by cursor."""

    serializer_class = EventSerializer
    filterset_class = EventFilterSet
    pagination_class = EventCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no stream
            return Event.objects.none()
        stream = get_visible_stream(self.request.user, self.kwargs["stream_pk"])
        return store.events(stream)

    @extend_schema(parameters=[STREAM_PK, *event_filter_parameters()], filters=False)
    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset.values(*LIST_COLUMNS))
        return self.get_paginated_response(event_rows(page))


class StreamIncidentViewSet(viewsets.GenericViewSet):
    """``POST``: cut the stream's events received from ``since`` to ``until`` (both included),
    narrowed by any events filter given with them, into a new incident of the stream's team
    titled ``title``; answers 201 ``{"id", "url"}``. The incident is then like any other, and
    the stream's retention never touches it."""

    serializer_class = CutSerializer

    @extend_schema(parameters=[STREAM_PK], request=CutSerializer,
                   responses={201: CutAnswerSerializer})
    def create(self, request, stream_pk=None):
        stream = get_visible_stream(request.user, stream_pk)
        if not can_manage(request.user, stream):
            raise PermissionDenied("Only editors of the stream's team may cut incidents.")
        data = CutSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        filters = request.data.copy() if hasattr(request.data, "copy") else dict(request.data)
        for name in ("since", "until", "title"):
            filters.pop(name, None)
        filterset = EventFilterSet(_as_query(filters), queryset=store.events(stream))
        if not filterset.is_valid():
            raise ValidationError(filterset.errors)
        queryset = filterset.qs.filter(received__gte=values["since"],
                                       received__lte=values["until"])
        incident = cut_incident(stream, queryset, values["title"], request.user)
        return Response({"id": incident.pk,
                         "url": absolute(request, incident.get_absolute_url())},
                        status=status.HTTP_201_CREATED)


def _as_query(data):
    """Filters of a JSON or form body as a QueryDict-like mapping (a list is a repeated
    parameter)."""
    from django.http import QueryDict

    query = QueryDict(mutable=True)
    items = data.lists() if hasattr(data, "lists") else data.items()
    for name, value in items:
        for item in value if isinstance(value, list | tuple) else [value]:
            query.appendlist(name, str(item))
    return query


__all__ = ["StreamEventViewSet", "StreamIncidentViewSet", "StreamViewSet", "settings"]


TAIL_MINUTES = 5


@extend_schema(
    parameters=[STREAM_PK, *event_filter_parameters(),
                OpenApiParameter("minutes", int, description=f"the tail drawn without since: "
                                 f"this many minutes before the newest event ({TAIL_MINUTES})"),
                OpenApiParameter("lanes", str, enum=list(GROUPS)),
                OpenApiParameter("colour", str, enum=list(COLOURS))],
    responses=OpenApiResponse(OpenApiTypes.OBJECT, "a Plotly figure (JSON)"), filters=False)
@api_view(["GET"])
def stream_figure(request, stream_pk: int):
    """The live view's timeline: the incident page's Gantt (``timelines.figures.build``) of the
    stream's filtered events, from ``since`` (default: ``minutes`` before the newest matching
    event) to ``until``; at most ``MAX_SPANS`` events, the newest. Requests a Falco rule matched
    (``streams.detect``, as their batches arrive) are starred as on the incident's."""
    stream = get_visible_stream(request.user, stream_pk)
    group, colour = figure_options(request.query_params)
    try:
        minutes = min(60, max(1, int(request.query_params.get("minutes", TAIL_MINUTES))))
    except ValueError:
        raise ValidationError({"minutes": "a whole number of minutes"}) from None
    filterset = EventFilterSet(request.query_params, queryset=store.events(stream))
    if not filterset.is_valid():
        raise ValidationError(filterset.errors)
    queryset = filterset.qs
    since = filterset.form.cleaned_data.get("since")
    until = filterset.form.cleaned_data.get("until")
    if since is None:
        newest = queryset.aggregate(newest=Max("received"))["newest"]
        if newest is not None:
            since = newest - timedelta(minutes=minutes)
            queryset = queryset.filter(received__gte=since)
    newest_first = queryset.order_by("-received", "-id")[:MAX_SPANS]
    bars = list(aggregate.span_rows(newest_first, SPAN_FIELDS))
    marks = detection_marks(stream.segments.values("incident_id"), stream.team_id, bars)
    return HttpResponse(orjson.dumps(build_gantt_figure(bars, group=group, colour=colour,
                                                        window_start=since, window_end=until,
                                                        detections=marks)),
                        content_type="application/json")
