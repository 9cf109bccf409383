"""The one definition of event filters, used by the API, the incident page and the figure.

A repeated parameter ORs its values (``?verb=create&verb=delete``); different parameters AND.
The one exception is the free-text ``q``: each repeated ``q`` must match (they AND), so a search
narrows as terms are added and "the current filters plus this text" is just one more ``q``.
"""

from __future__ import annotations

from datetime import UTC

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import ProhibitNullCharactersValidator
from django.db.models import Exists, OuterRef, Q
from django_filters.fields import IsoDateTimeField

from ..figures.lanes import NONE
from ..models import Event
from .related import parse_related, related_filter


class ValueListField(forms.Field):
    """All values of a repeated query parameter, empty ones dropped. A NUL in one is refused,
    as Django's own CharField refuses it: PostgreSQL text cannot hold one (a server error
    schemathesis found). ``NONE`` is kept as it is (not cast), where the field's filter takes
    it (``AnyOf``)."""

    widget = forms.MultipleHiddenInput

    def __init__(self, *args, cast=str, keeps_none: bool = False, **kwargs) -> None:
        self.cast = cast
        self.keeps_none = keeps_none
        super().__init__(*args, **kwargs)

    def to_python(self, value) -> list:
        if value in (None, ""):
            return []
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            ProhibitNullCharactersValidator()(item)
        try:
            return [v.strip() if self.keeps_none and v.strip() == NONE else self.cast(v.strip())
                    for v in values if str(v).strip() != ""]
        except (TypeError, ValueError):
            raise ValidationError(f"{values!r}: expected {self.cast.__name__} values") from None


class UtcDateTimeField(IsoDateTimeField):
    """An RFC 3339 time, moved to UTC: PostgreSQL refuses an offset past 15:59 (a server error
    schemathesis found with ``since=0121-09-05T10:05:44+20:19``), and a time that UTC cannot
    hold (year 1 with a positive offset) is a bad value, not a crash."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise ValidationError(f"{value!r}: out of range", code="invalid") from None


class RFC3339Filter(django_filters.IsoDateTimeFilter):
    """``IsoDateTimeFilter`` whose value is a UTC time (``UtcDateTimeField``): every time filter
    of the API is one."""

    field_class = UtcDateTimeField


class AnyOf(django_filters.Filter):
    """Matches rows whose field equals any of the given values; ``NONE`` matches the rows
    without one (an empty text, no code, no group)."""

    field_class = ValueListField

    def __init__(self, *args, lookup: str = "in", **kwargs) -> None:
        self.lookup = lookup
        kwargs.setdefault("keeps_none", True)
        super().__init__(*args, **kwargs)

    def filter(self, qs, value):
        if not value:
            return qs
        values = [item for item in value if item != NONE]
        if self.lookup == "in":
            condition = Q(**{f"{self.field_name}__in": values}) if values else Q(pk__in=[])
        else:
            condition = Q(pk__in=[])
            for item in values:
                condition |= Q(**{f"{self.field_name}__{self.lookup}": item})
        if len(values) < len(value):
            condition |= self.none()
        return qs.filter(condition)

    def none(self) -> Q:
        """The rows without a value of the field."""
        if self.lookup == "has":  # a list: an empty one
            return Q(**{self.field_name: []})
        return Q(**{self.field_name: ""})


class IntAnyOf(AnyOf):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("cast", int)
        super().__init__(*args, **kwargs)

    def none(self) -> Q:
        return Q(**{f"{self.field_name}__isnull": True})


class DetectedBy(AnyOf):
    """Requests that a Falco rule (``timelines.detections``) matched, by rule name."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, keeps_none=False, **kwargs)

    def filter(self, qs, value):
        if not value:
            return qs
        from ..detections.models import DetectionMatch

        return qs.filter(Exists(DetectionMatch.objects.filter(
            incident_id=OuterRef("incident_id"), rule__in=value, event_id=OuterRef("id"))))


class AllTextOf(django_filters.Filter):
    """Case-insensitive substring search over several text columns: an event matches a term when
    any of the columns contains it, and must match every term given."""

    field_class = ValueListField

    def __init__(self, *args, columns: tuple[str, ...], **kwargs) -> None:
        self.columns = columns
        super().__init__(*args, **kwargs)

    def filter(self, qs, value):
        for term in value or []:
            condition = Q()
            for column in self.columns:
                condition |= Q(**{f"{column}__icontains": term})
            qs = qs.filter(condition)
        return qs


class RelatedKeysField(ValueListField):
    """``R/N/X`` or ``R/X`` values as (resource, namespace, name); 400 for another shape."""

    def to_python(self, value) -> list:
        try:
            return [parse_related(item) for item in super().to_python(value)]
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


class RelatedTo(django_filters.Filter):
    """``related=R/N/X`` (``R/X`` for a cluster-scoped object): the object's events and those of
    everything related to it (``timelines.reads.related``); repeated, any of them."""

    field_class = RelatedKeysField

    def filter(self, qs, value):
        if not value:
            return qs
        # Relations are the incident's, whatever the other filters select.
        base = self.parent.queryset if self.parent is not None else qs
        return qs.filter(related_filter(base, value))


class EventFilterSet(django_filters.FilterSet):
    id = IntAnyOf(keeps_none=False, help_text="event ids (an insight's evidence)")
    kind = AnyOf(help_text="audit, event, log, trace or state")
    resource = AnyOf(help_text="objectRef.resource, whatever the subresource")
    subresource = AnyOf()
    name = AnyOf()
    namespace = AnyOf()
    user = AnyOf(field_name="username", help_text="the authenticated user.username")
    impersonated_user = AnyOf()
    group = AnyOf(field_name="groups", lookup="has")
    verb = AnyOf()
    code = IntAnyOf()
    source_ip = AnyOf()
    user_agent = AnyOf()
    audit_id = AnyOf()
    api_group = AnyOf()
    level = AnyOf()
    stage = AnyOf()
    source = AnyOf(help_text="file the event came from")
    reason = AnyOf(help_text="Event reason")
    severity = AnyOf()
    component = AnyOf()
    node = AnyOf()
    related = RelatedTo(help_text="resource/namespace/name (resource/name: cluster-scoped): "
                                  "the object and every object related to it")
    detection = DetectedBy(help_text="requests a Falco rule matched (the rule's name)")
    q = AllTextOf(columns=("request_uri", "message", "name"),
                  help_text="text in requestURI, message or name (any case); repeated q all match")
    since = RFC3339Filter(field_name="received", lookup_expr="gte",
                          help_text="RFC 3339; received at or after")
    until = RFC3339Filter(field_name="received", lookup_expr="lte",
                          help_text="RFC 3339; received at or before")

    class Meta:
        model = Event
        fields: list[str] = []
