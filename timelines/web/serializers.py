from __future__ import annotations

from rest_framework import serializers

from ..models import Event


class EventSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="username")
    groups = serializers.ListField(child=serializers.CharField())
    audit_id = serializers.SerializerMethodField(help_text="the request's auditID (audit only)")

    class Meta:
        model = Event
        fields = [
            "id", "kind", "audit_id", "verb", "user", "impersonated_user", "groups", "user_agent",
            "source_ip", "resource", "subresource", "namespace", "name", "api_group",
            "api_version", "object_uid", "resource_version", "code", "level", "stage",
            "request_uri", "received", "completed", "duration_ms", "annotations", "source", "line",
            "upload", "message", "reason", "severity", "component", "node", "count",
        ]

    def get_audit_id(self, event: Event) -> str | None:
        return event.audit_id if event.kind == Event.Kind.AUDIT else None


class EventDetailSerializer(EventSerializer):
    body = serializers.SerializerMethodField(help_text="the stored audit event, redacted")
    request = serializers.SerializerMethodField(
        help_text="state Created/DeletionRequested not yet folded into its request: the audit "
                  "request that made it, if the "
                  "incident holds it ({id, audit_id, verb, user, received})")

    also = serializers.SerializerMethodField(
        help_text="a create or delete request: the state time points of its object that it "
                  "carries (a bundle's snapshot said the same), e.g. \"Created at T from "
                  "snapshot FILE:LINE\"; the facts themselves in annotations.linked_state")

    class Meta(EventSerializer.Meta):
        fields = [*EventSerializer.Meta.fields, "incident", "body", "request", "also"]

    def get_also(self, event: Event) -> list[str]:
        from ..analysis.statelinks import carried_facts

        return carried_facts(event)

    def get_body(self, event: Event) -> dict | None:
        return event.body()

    def get_request(self, event: Event) -> dict | None:
        from ..analysis.statelinks import request_of

        request = request_of(event)
        if request is None:
            return None
        return {"id": request.pk, "audit_id": request.audit_id, "verb": request.verb,
                "user": request.username,
                "received": serializers.DateTimeField().to_representation(request.received)}


def _time(value, zone) -> str | None:
    """A time as ``serializers.DateTimeField`` gives it: ISO 8601 in the current time zone, UTC
    written ``Z``."""
    if value is None:
        return None
    text = value.astimezone(zone).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# ``EventSerializer``'s fields as columns of ``Event.objects.values()``
LIST_COLUMNS = tuple("username" if f == "user" else f for f in EventSerializer.Meta.fields)


def event_rows(rows) -> list[dict]:
    """``EventSerializer(many=True).data`` of rows of ``Event.objects.values(*LIST_COLUMNS)``,
    value for value, without a serializer field per value: 100 events in a fraction of the
    time (``timelines/tests/test_events_index.py`` compares the two on the fixtures)."""
    from django.utils import timezone

    zone = timezone.get_current_timezone()
    answer = []
    for row in rows:
        item = {field: row[column] for field, column in zip(EventSerializer.Meta.fields,
                                                             LIST_COLUMNS, strict=True)}
        if item["kind"] != Event.Kind.AUDIT:
            item["audit_id"] = None
        item["groups"] = [str(group) for group in item["groups"]]
        item["received"] = _time(item["received"], zone)
        item["completed"] = _time(item["completed"], zone)
        if item["duration_ms"] is not None:
            item["duration_ms"] = float(item["duration_ms"])
        answer.append(item)
    return answer
