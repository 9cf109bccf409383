"""The one definition of event filters, used by the API, the incident page and (later) figures.

A repeated parameter ORs its values (``?verb=create&verb=delete``); different parameters AND.
"""

from __future__ import annotations

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Q

from .models import Event


class ValueListField(forms.Field):
    """All values of a repeated query parameter, empty ones dropped."""

    widget = forms.MultipleHiddenInput

    def __init__(self, *args, cast=str, **kwargs) -> None:
        self.cast = cast
        super().__init__(*args, **kwargs)

    def to_python(self, value) -> list:
        if value in (None, ""):
            return []
        values = value if isinstance(value, (list, tuple)) else [value]
        try:
            return [self.cast(v.strip()) for v in values if str(v).strip() != ""]
        except (TypeError, ValueError):
            raise ValidationError(f"{values!r}: expected {self.cast.__name__} values") from None


class AnyOf(django_filters.Filter):
    """Matches rows whose field equals any of the given values."""

    field_class = ValueListField

    def __init__(self, *args, lookup: str = "in", **kwargs) -> None:
        self.lookup = lookup
        super().__init__(*args, **kwargs)

    def filter(self, qs, value):
        if not value:
            return qs
        if self.lookup == "in":
            return qs.filter(**{f"{self.field_name}__in": value})
        condition = Q()
        for item in value:
            condition |= Q(**{f"{self.field_name}__{self.lookup}": item})
        return qs.filter(condition)


class IntAnyOf(AnyOf):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("cast", int)
        super().__init__(*args, **kwargs)


class EventFilterSet(django_filters.FilterSet):
    kind = AnyOf(help_text="audit, event, log or trace")
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
    since = django_filters.IsoDateTimeFilter(field_name="received", lookup_expr="gte",
                                             help_text="RFC 3339; received at or after")
    until = django_filters.IsoDateTimeFilter(field_name="received", lookup_expr="lte",
                                             help_text="RFC 3339; received at or before")

    class Meta:
        model = Event
        fields: list[str] = []
