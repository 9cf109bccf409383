"""REST API for annotations and root-cause sequences (``/api/v1/``).

Reads are for whoever can see the incident; writes for whoever may upload to it (403 for the
others who can see it). An incident someone cannot see answers 404 on every route, never a hint
that it exists. Events are named by id and must belong to the annotation's or sequence's
incident (400 otherwise, whether the id exists elsewhere or not).

Step positions are 1-based in the API (``position`` out, and in when inserting); the table keeps
them 0-based.
"""

from __future__ import annotations

import django_filters
from django.db import connection, transaction
from django.db.models import Prefetch, Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, permissions, renderers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.settings import api_settings

from timelines.models import Event
from timelines.reads.filters import RFC3339Filter, ValueListField

from . import notes
from .access import can_write, get_visible_incident, visible_incidents
from .markdown import render_markdown
from .models import Incident, writing
from .notes import Annotation, Sequence, SequenceStep

MAX_NOTE = 20_000


class IncidentWrite(permissions.BasePermission):
    """Safe methods pass (the querysets already hide what the user cannot see); writes need
    ``access.can_write`` (editors, admins, superusers) on the incident of the URL for
    incident-scoped routes, of the object else."""

    message = "You may read this incident but not change it."

    def has_permission(self, request, view) -> bool:
        if request.method in permissions.SAFE_METHODS or "incident_pk" not in view.kwargs:
            return True
        return can_write(request.user, view.get_incident())  # 404 when invisible

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in permissions.SAFE_METHODS or can_write(request.user, obj.incident)


class IncidentScoped:
    """For routes under ``incidents/{incident_pk}/``: the incident, 404 unless visible."""

    def get_incident(self) -> Incident:
        if not hasattr(self, "_incident"):
            self._incident = get_visible_incident(self.request.user, self.kwargs["incident_pk"])
        return self._incident


PERMISSIONS = [*api_settings.DEFAULT_PERMISSION_CLASSES, IncidentWrite]


# --- annotations -------------------------------------------------------------------------------

class AnnotationSerializer(serializers.ModelSerializer):
    event = serializers.IntegerField(
        source="event_id", required=False, allow_null=True,
        help_text="id of the annotated event (same incident); start and end are then its "
                  "received and completed times. Null or absent for a time range.")
    note = serializers.CharField(required=False, allow_blank=True, max_length=MAX_NOTE,
                                 trim_whitespace=False, help_text="Markdown source")
    note_html = serializers.SerializerMethodField(help_text="the note rendered and sanitized")
    label = serializers.SerializerMethodField(help_text="plain first line of the note (markers)")
    tags = serializers.ListField(
        child=serializers.CharField(allow_blank=True), required=False,
        help_text=f"normalized: stripped, lower-case, unique; at most {notes.MAX_TAGS} of at "
                  f"most {notes.MAX_TAG_LENGTH} characters")
    author = serializers.SerializerMethodField(help_text="username of the author")

    class Meta:
        model = Annotation
        fields = ["id", "incident", "event", "start", "end", "note", "note_html", "label", "tags",
                  "starred", "author", "created_at", "updated_at"]
        read_only_fields = ["id", "incident", "created_at", "updated_at"]
        extra_kwargs = {"start": {"required": False}, "end": {"required": False}}

    def get_note_html(self, annotation: Annotation) -> str:
        return render_markdown(annotation.note)

    def get_label(self, annotation: Annotation) -> str:
        return notes.note_label(annotation.note)

    def get_author(self, annotation: Annotation) -> str | None:
        return annotation.author.username if annotation.author else None

    def validate_tags(self, value: list[str]) -> list[str]:
        tags = notes.normalize_tags(value)
        if len(tags) > notes.MAX_TAGS:
            raise ValidationError(f"At most {notes.MAX_TAGS} tags.")
        long = [t for t in tags if len(t) > notes.MAX_TAG_LENGTH]
        if long:
            raise ValidationError(f"At most {notes.MAX_TAG_LENGTH} characters: {long[0]!r}.")
        return tags

    def validate(self, attrs: dict) -> dict:
        instance = self.instance
        incident = instance.incident if instance else self.context["incident"]
        event_id = attrs["event_id"] if "event_id" in attrs else getattr(instance, "event_id",
                                                                          None)
        if event_id is not None:
            if "start" in attrs or "end" in attrs:
                raise ValidationError({"start": "An annotation on an event takes its times from "
                                                "the event: give 'event' or 'start'/'end'."})
            if "event_id" in attrs:
                times = Event.objects.filter(incident_id=incident.pk, pk=event_id).values_list(
                    "received", "completed").first()
                if times is None:
                    raise ValidationError({"event": f"Event {event_id} is not in this incident."})
                attrs["start"], attrs["end"] = times
            return attrs
        start = attrs.get("start", getattr(instance, "start", None))
        end = attrs.get("end", getattr(instance, "end", None))
        if start is None:
            raise ValidationError({"start": "Give 'event', or a time range: 'start' and "
                                            "optionally 'end'."})
        if end is not None and end < start:
            raise ValidationError({"end": "'end' must not be before 'start'."})
        return attrs


@extend_schema_field(OpenApiTypes.STR)
class ValuesFilter(django_filters.Filter):
    field_class = ValueListField  # every value of a repeated parameter


class AnnotationFilterSet(django_filters.rest_framework.FilterSet):
    tag = ValuesFilter(method="filter_tag", help_text="repeat to match any of several tags")
    starred = django_filters.rest_framework.BooleanFilter()
    event = django_filters.NumberFilter(field_name="event_id")
    since = RFC3339Filter(method="filter_since", help_text="RFC 3339; ending at or after")
    until = RFC3339Filter(field_name="start", lookup_expr="lte",
                          help_text="RFC 3339; starting at or before")
    q = django_filters.CharFilter(field_name="note", lookup_expr="icontains",
                                  help_text="text in the note")

    class Meta:
        model = Annotation
        fields: list[str] = []

    def filter_tag(self, queryset, name, value):
        wanted = notes.normalize_tags(value)
        if not wanted:
            return queryset
        if connection.vendor == "postgresql":
            condition = Q()
            for tag in wanted:
                condition |= Q(tags__contains=[tag])
            return queryset.filter(condition)
        # SQLite (the embedded default) has no JSON containment; an incident's notes are few.
        ids = [pk for pk, tags in queryset.values_list("pk", "tags") if set(tags) & set(wanted)]
        return queryset.filter(pk__in=ids)

    def filter_since(self, queryset, name, value):
        # A range overlapping the window counts, not only one that starts inside it.
        return queryset.alias(last=Coalesce("end", "start")).filter(last__gte=value)


class AnnotationPagination(CursorPagination):
    ordering = ("start", "id")
    page_size = 500
    page_size_query_param = "page_size"
    max_page_size = 2000


class IncidentAnnotationViewSet(IncidentScoped, mixins.ListModelMixin, mixins.CreateModelMixin,
                                viewsets.GenericViewSet):
    """``GET``: the incident's annotations in ``(start, id)`` order, by cursor (``{"results",
    "next", "previous"}``), filtered by ``tag`` (repeatable, any of), ``starred``, ``event``,
    ``since``/``until`` (RFC 3339; annotations overlapping the window) and ``q`` (text in the
    note). ``POST``: a new annotation, on an ``event`` or on a time range ``start``/``end``
    (``end`` optional, not before ``start``); 201."""

    serializer_class = AnnotationSerializer
    filterset_class = AnnotationFilterSet
    pagination_class = AnnotationPagination
    permission_classes = PERMISSIONS

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no incident
            return Annotation.objects.none()
        return Annotation.objects.filter(incident=self.get_incident()).select_related("author")

    def get_serializer_context(self) -> dict:
        context = super().get_serializer_context()
        if "incident_pk" in self.kwargs:
            context["incident"] = self.get_incident()
        return context

    def perform_create(self, serializer) -> None:
        incident = self.get_incident()
        with writing(incident.pk):
            serializer.save(incident=incident, author=self.request.user)


class AnnotationViewSet(mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                        mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """One annotation: ``GET``, ``PATCH`` (any writable field; ``"event": null`` turns an event
    annotation into a time range), ``DELETE`` (204; steps pointing at it keep their event and
    time)."""

    serializer_class = AnnotationSerializer
    permission_classes = PERMISSIONS
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return Annotation.objects.filter(
            incident__in=visible_incidents(self.request.user)
        ).select_related("author", "incident")

    def perform_update(self, serializer) -> None:
        with transaction.atomic():
            annotation = serializer.save(updated_at=timezone.now())
            # Steps keep a copy of the time (and event) they stand for: deltas are taken on it.
            SequenceStep.objects.filter(annotation=annotation).update(
                at=annotation.start, event_id=annotation.event_id)


# --- sequences ---------------------------------------------------------------------------------

class StepInputSerializer(serializers.Serializer):
    """One step as written: a new one on an ``event`` or an ``annotation`` (exactly one), or an
    existing one of the sequence kept by its ``id`` (with a new ``note`` if given)."""

    id = serializers.IntegerField(required=False, help_text="keep this step of the sequence")
    event = serializers.IntegerField(required=False, allow_null=True)
    annotation = serializers.IntegerField(required=False, allow_null=True)
    note = serializers.CharField(required=False, allow_blank=True, max_length=MAX_NOTE,
                                 trim_whitespace=False)

    def validate(self, attrs: dict) -> dict:
        given = [k for k in ("event", "annotation") if attrs.get(k) is not None]
        if "id" in attrs and given:
            raise ValidationError(f"A kept step (id) keeps its {given[0]}; drop 'id' to add a "
                                  f"new step.")
        if "id" not in attrs and len(given) != 1:
            raise ValidationError("Give exactly one of 'event' and 'annotation' (or the 'id' of "
                                  "a step to keep).")
        return attrs


class StepInsertSerializer(StepInputSerializer):
    id = None
    position = serializers.IntegerField(required=False, min_value=1, help_text="1-based")


class SequenceWriteSerializer(serializers.Serializer):
    title = serializers.CharField(max_length=300)
    steps = StepInputSerializer(many=True, max_length=notes.MAX_STEPS,
                                help_text="replaces all steps, in this order")


class StepSerializer(serializers.Serializer):
    """A step as read (the dicts built by ``step_data``)."""

    id = serializers.IntegerField()
    position = serializers.IntegerField(help_text="1-based")
    event = serializers.IntegerField(allow_null=True)
    annotation = serializers.IntegerField(allow_null=True)
    at = serializers.DateTimeField(help_text="time of the event (received) or annotation (start)")
    note = serializers.CharField()
    description = serializers.CharField(help_text="what the event shows, e.g. 'system:admin "
                                                  "DELETEs pods default/web-0 → 200'")
    delta_ms = serializers.FloatField(allow_null=True, help_text="from the previous step")
    offset_ms = serializers.FloatField(help_text="from the first step")
    delta = serializers.CharField(help_text="delta_ms for people: '+7 ms', '−3 ms', '+2 min 3 s'")


class SequenceSerializer(serializers.ModelSerializer):
    author = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()

    class Meta:
        model = Sequence
        fields = ["id", "incident", "title", "author", "created_at", "updated_at", "steps"]

    def get_author(self, sequence: Sequence) -> str | None:
        return sequence.author.username if sequence.author else None

    @extend_schema_field(StepSerializer(many=True))
    def get_steps(self, sequence: Sequence) -> list[dict]:
        data = notes.step_data(list(sequence.steps.all()), self.context.get("events", {}))
        return StepSerializer(data, many=True).data


class ReorderSerializer(serializers.Serializer):
    order = serializers.ListField(child=serializers.IntegerField(), max_length=notes.MAX_STEPS,
                                  help_text="every step id of the sequence once, in order")


def sequences_with_steps(queryset):
    return queryset.select_related("author").prefetch_related(
        Prefetch("steps", queryset=SequenceStep.objects.select_related("annotation")))


_DESCRIBED = ("kind", "verb", "username", "impersonated_user", "resource", "subresource",
              "namespace", "name", "code", "request_uri", "reason", "message", "severity",
              "component", "node")


def events_of(sequences: list[Sequence]) -> dict[int, Event]:
    """The events the sequences' steps point at, in one query."""
    ids = {s.event_id for q in sequences for s in q.steps.all() if s.event_id is not None}
    return {e.pk: e for e in Event.objects.filter(
        pk__in=ids, incident_id__in={q.incident_id for q in sequences}).only("id", *_DESCRIBED)}


def sequence_output(sequences, context: dict) -> list[dict]:
    """The API representation of sequences (with their steps)."""
    sequences = list(sequences)
    context = {**context, "events": events_of(sequences)}
    return SequenceSerializer(sequences, many=True, context=context).data


def sequence_response(view, pk: int, code=status.HTTP_200_OK) -> Response:
    sequence = sequences_with_steps(Sequence.objects.filter(pk=pk)).get()
    return Response(sequence_output([sequence], view.get_serializer_context())[0], status=code)


def resolve_steps(incident: Incident, items: list[dict],
                  existing: dict[int, SequenceStep]) -> list[SequenceStep]:
    """The steps that ``items`` (validated ``StepInputSerializer`` data) describe, in order:
    kept ones from ``existing`` and new, unsaved ones. 400 naming each item whose event,
    annotation or step is not in this incident or sequence."""
    event_ids = {i["event"] for i in items if i.get("event") is not None}
    annotation_ids = {i["annotation"] for i in items if i.get("annotation") is not None}
    times = dict(Event.objects.filter(incident_id=incident.pk, pk__in=event_ids)
                 .values_list("pk", "received"))
    annotations = {a.pk: a for a in Annotation.objects.filter(incident=incident,
                                                              pk__in=annotation_ids)}
    steps, errors = notes.build_steps(items, times, annotations, existing)
    if any(errors):  # keyed by index, like DRF's own errors of a list of objects
        raise ValidationError({"steps": {i: error for i, error in enumerate(errors) if error}})
    return steps


class SequencePagination(CursorPagination):
    ordering = ("created_at", "id")
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 500


class IncidentSequenceViewSet(IncidentScoped, mixins.ListModelMixin, mixins.CreateModelMixin,
                              viewsets.GenericViewSet):
    """``GET``: the incident's sequences, oldest first, by cursor, each with all its steps.
    ``POST`` ``{"title", "steps": [{"event"|"annotation", "note"}]}``: a new sequence; 201."""

    serializer_class = SequenceSerializer
    pagination_class = SequencePagination
    permission_classes = PERMISSIONS

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Sequence.objects.none()
        return sequences_with_steps(Sequence.objects.filter(incident=self.get_incident()))

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(sequence_output(page, self.get_serializer_context()))

    @extend_schema(request=SequenceWriteSerializer, responses={201: SequenceSerializer})
    def create(self, request, *args, **kwargs):
        incident = self.get_incident()
        written = SequenceWriteSerializer(data=request.data)
        written.is_valid(raise_exception=True)
        with writing(incident.pk):
            steps = resolve_steps(incident, written.validated_data["steps"], {})
            sequence = Sequence.objects.create(incident=incident, author=request.user,
                                               title=written.validated_data["title"])
            sequence.replace_steps(steps)
        return sequence_response(self, sequence.pk, status.HTTP_201_CREATED)


class MarkdownRenderer(renderers.BaseRenderer):
    media_type = "text/markdown"
    format = "md"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if isinstance(data, dict):  # an error answer
            data = str(data.get("detail", data)) + "\n"
        return data.encode(self.charset)


class SequenceViewSet(mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                      mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """One sequence: ``GET``; ``PUT`` ``{"title", "steps"}`` / ``PATCH`` (either) where
    ``steps`` replaces all steps in the given order (items ``{"id"}`` keep a step, ``{"event"}``
    or ``{"annotation"}`` add one: reorder, insert and remove in one call); ``DELETE`` (204).
    Step routes answer with the whole sequence, renumbered."""

    serializer_class = SequenceSerializer
    permission_classes = PERMISSIONS

    def get_queryset(self):
        # the incident with the sequence, in one query: its permission check must not load it
        # later, when it may have been deleted meanwhile
        return sequences_with_steps(Sequence.objects.filter(
            incident__in=visible_incidents(self.request.user)).select_related(
                "incident"))

    def retrieve(self, request, *args, **kwargs):
        return Response(sequence_output([self.get_object()], self.get_serializer_context())[0])

    @extend_schema(request=SequenceWriteSerializer, responses=SequenceSerializer)
    def update(self, request, *args, partial=False, **kwargs):
        sequence = self.get_object()
        written = SequenceWriteSerializer(data=request.data, partial=partial)
        written.is_valid(raise_exception=True)
        with notes.locked_sequence(sequence.pk) as (sequence, existing):
            if "title" in written.validated_data:
                sequence.title = written.validated_data["title"]
                sequence.save(update_fields=["title"])
            steps = existing
            if "steps" in written.validated_data:
                steps = resolve_steps(sequence.incident, written.validated_data["steps"],
                                      {s.pk: s for s in existing})
            sequence.replace_steps(steps)
        return sequence_response(self, sequence.pk)

    @extend_schema(request=SequenceWriteSerializer, responses=SequenceSerializer)
    def partial_update(self, request, *args, **kwargs):
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(request=StepInsertSerializer, responses={201: SequenceSerializer})
    @action(detail=True, methods=["post"], url_path="steps")
    def insert_step(self, request, pk=None):
        """Insert a step on an ``event`` or ``annotation`` at ``position`` (1-based; the end
        when absent); 201 with the sequence."""
        sequence = self.get_object()  # 404 or 403 before any 400
        given = StepInsertSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        with notes.locked_sequence(sequence.pk) as (sequence, steps):
            position = given.validated_data.get("position", len(steps) + 1)
            if position > len(steps) + 1:
                raise ValidationError({"position": [f"Between 1 and {len(steps) + 1}."]})
            if len(steps) >= notes.MAX_STEPS:
                raise ValidationError({"position": [f"At most {notes.MAX_STEPS} steps."]})
            try:
                [step] = resolve_steps(sequence.incident, [given.validated_data], {})
            except ValidationError as exc:
                raise ValidationError(exc.detail["steps"][0]) from None
            steps.insert(position - 1, step)
            sequence.replace_steps(steps)
        return sequence_response(self, sequence.pk, status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: SequenceSerializer})
    @action(detail=True, methods=["delete"], url_path=r"steps/(?P<step_id>[0-9]+)")
    def remove_step(self, request, pk=None, step_id=None):
        """Remove one step; 200 with the renumbered sequence (404 if it is not in it)."""
        with notes.locked_sequence(self.get_object().pk) as (sequence, steps):
            kept = [s for s in steps if s.pk != int(step_id)]
            if len(kept) == len(steps):
                raise NotFound("No such step in this sequence.")
            sequence.replace_steps(kept)
        return sequence_response(self, sequence.pk)

    @extend_schema(request=ReorderSerializer, responses=SequenceSerializer)
    @action(detail=True, methods=["post"])
    def reorder(self, request, pk=None):
        """``{"order": [step ids]}``: every step of the sequence once, in the new order."""
        sequence = self.get_object()
        given = ReorderSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        order = given.validated_data["order"]
        with notes.locked_sequence(sequence.pk) as (sequence, steps):
            by_id = {s.pk: s for s in steps}
            if len(order) != len(set(order)) or set(order) != set(by_id):
                raise ValidationError({"order": [f"Give each of the steps {sorted(by_id)} once."]})
            sequence.replace_steps([by_id[i] for i in order])
        return sequence_response(self, sequence.pk)

    @extend_schema(responses={(200, "text/markdown"): str, (200, "application/json"):
                              SequenceSerializer})
    @action(detail=True, renderer_classes=[MarkdownRenderer, renderers.JSONRenderer])
    def export(self, request, pk=None, **kwargs):
        """``export.md``: the sequence as Markdown (``# title``, then ``1. At <time>:
        <description> — <note>``, ``2. 7 ms later: …``); ``export.json``: the API
        representation. Both as downloads."""
        sequence = self.get_object()
        extension = request.accepted_renderer.format
        if extension == "md":
            steps = notes.step_data(list(sequence.steps.all()), events_of([sequence]))
            data = notes.sequence_markdown(sequence.title, steps)
        else:
            data = sequence_output([sequence], self.get_serializer_context())[0]
        disposition = f'attachment; filename="sequence-{pk}.{extension}"'
        return Response(data, headers={"Content-Disposition": disposition})
