from __future__ import annotations

from rest_framework import serializers

from .models import Event


class EventSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="username")
    groups = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = Event
        fields = ["id", "audit_id", "verb", "user", "impersonated_user", "groups", "user_agent",
                  "source_ip", "resource", "subresource", "namespace", "name", "api_group",
                  "api_version", "object_uid", "resource_version", "code", "level", "stage",
                  "request_uri", "received", "completed", "duration_ms", "annotations",
                  "source", "line", "upload"]


class EventDetailSerializer(EventSerializer):
    body = serializers.SerializerMethodField(help_text="the stored audit event, redacted")

    class Meta(EventSerializer.Meta):
        fields = [*EventSerializer.Meta.fields, "incident", "body"]

    def get_body(self, event: Event) -> dict | None:
        return event.body()
