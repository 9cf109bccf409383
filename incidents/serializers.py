from __future__ import annotations

from django.db.models import Count
from rest_framework import serializers
from rest_framework.reverse import reverse

from .models import Incident, Upload


def absolute(request, url: str) -> str:
    if request is not None:
        return request.build_absolute_uri(url)
    from django.conf import settings

    return settings.SITE_URL + url


class IncidentSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    team = serializers.CharField(source="team.name", default=None)

    class Meta:
        model = Incident
        fields = ["id", "title", "team", "created_at", "url"]

    def get_url(self, incident: Incident) -> str:
        return absolute(self.context.get("request"), incident.get_absolute_url())


class UploadSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="this upload's status URL")
    incident = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    files = serializers.SerializerMethodField(help_text="a bundle's files, by status")

    class Meta:
        model = Upload
        fields = ["id", "name", "format", "status", "progress", "bytes_read", "bytes_total",
                  "events", "new_events", "skipped_lines", "redacted", "errors", "message",
                  "notes", "attempts", "created_at", "started_at", "finished_at", "url",
                  "incident", "parent", "files"]

    def get_url(self, upload: Upload) -> str:
        request = self.context.get("request")
        return reverse("api:upload-detail", args=[upload.pk], request=request)

    def get_incident(self, upload: Upload) -> dict:
        url = absolute(self.context.get("request"), upload.incident.get_absolute_url())
        return {"id": upload.incident_id, "title": upload.incident.title, "url": url}

    def get_progress(self, upload: Upload) -> float:
        return round(upload.progress, 4)

    def get_files(self, upload: Upload) -> dict | None:
        """For a bundle: how many of its files are in each status, and where to list them."""
        if upload.format != "bundle":
            return None
        counts = dict(upload.files.values_list("status").annotate(n=Count("pk")))
        request = self.context.get("request")
        return {"total": sum(counts.values()), "by_status": counts,
                "url": reverse("api:upload-files", args=[upload.pk], request=request)}
