from __future__ import annotations

from rest_framework import serializers

from .models import Event


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

    class Meta(EventSerializer.Meta):
        fields = [*EventSerializer.Meta.fields, "incident", "body"]

    def get_body(self, event: Event) -> dict | None:
        return event.body()
