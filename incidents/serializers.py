from __future__ import annotations

from datetime import timedelta

from django.db.models import Count
from django.http import QueryDict
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from .models import Incident, Team, Upload
from .notes import Sequence
from .sharing import IncidentGrant, ShareLink


def absolute(request, url: str) -> str:
    if request is not None:
        return request.build_absolute_uri(url)
    from django.conf import settings

    return settings.SITE_URL + url


class GrantSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    granted_by = serializers.CharField(source="granted_by.username", default=None, read_only=True)

    class Meta:
        model = IncidentGrant
        fields = ["id", "team", "role", "granted_by", "created_at"]


class GrantWriteSerializer(serializers.Serializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(),
                                        help_text="the team's name")
    role = serializers.ChoiceField(choices=IncidentGrant.Role.choices,
                                   default=IncidentGrant.Role.VIEWER)


class IncidentSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="the incident's page")
    team = serializers.CharField(source="team.name", default=None)
    grants = GrantSerializer(many=True, read_only=True,
                             help_text="other teams given access to it")

    class Meta:
        model = Incident
        fields = ["id", "title", "team", "key", "created_at", "url", "grants"]

    def get_url(self, incident: Incident) -> str:
        return absolute(self.context.get("request"), incident.get_absolute_url())


class IncidentUpdateSerializer(serializers.ModelSerializer):
    """What ``PATCH`` may change: the title, and the owning team (by name)."""

    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(),
                                        help_text="the name of the team to give it to")

    class Meta:
        model = Incident
        fields = ["title", "team"]

    def validate(self, attrs: dict) -> dict:
        incident = self.instance
        team = attrs.get("team")
        if team is not None and incident.key and team.pk != incident.team_id and (
                Incident.objects.filter(team=team, key=incident.key).exists()):
            raise serializers.ValidationError(
                {"team": f"Team {team.name!r} already has an incident with this incident_key."})
        return attrs


class UploadSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="this upload's status URL")
    incident = serializers.SerializerMethodField()
    incident_url = serializers.SerializerMethodField(help_text="the incident's page")
    progress = serializers.SerializerMethodField()
    files = serializers.SerializerMethodField(help_text="a bundle's files, by status")
    # the model's event_count; "events" is the API's name for it
    events = serializers.IntegerField(source="event_count", read_only=True,
                                      help_text="events read from the file")

    class Meta:
        model = Upload
        fields = ["id", "name", "format", "status", "stage", "analyses", "progress",
                  "bytes_read", "bytes_total",
                  "events", "new_events", "skipped_lines", "redacted", "errors", "message",
                  "notes", "attempts", "created_at", "started_at", "finished_at", "url",
                  "incident", "incident_id", "incident_url", "parent", "files"]

    def get_url(self, upload: Upload) -> str:
        request = self.context.get("request")
        return reverse("api:upload-detail", args=[upload.pk], request=request)

    @extend_schema_field({"type": "object", "properties": {
        "id": {"type": "integer"}, "title": {"type": "string"}, "url": {"type": "string"}}})
    def get_incident(self, upload: Upload) -> dict:
        url = absolute(self.context.get("request"), upload.incident.get_absolute_url())
        return {"id": upload.incident_id, "title": upload.incident.title, "url": url}

    def get_incident_url(self, upload: Upload) -> str:
        return absolute(self.context.get("request"), upload.incident.get_absolute_url())

    def get_progress(self, upload: Upload) -> float:
        return round(upload.progress, 4)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "total": {"type": "integer"},
        "by_status": {"type": "object", "additionalProperties": {"type": "integer"}},
        "url": {"type": "string"}}})
    def get_files(self, upload: Upload) -> dict | None:
        """For a bundle: how many of its files are in each status, and where to list them."""
        if upload.format != "bundle":
            return None
        counts = dict(upload.files.values_list("status").annotate(n=Count("pk")))
        request = self.context.get("request")
        return {"total": sum(counts.values()), "by_status": counts,
                "url": reverse("api:upload-files", args=[upload.pk], request=request)}


class UploadCreateSerializer(serializers.Serializer):
    """The multipart form of ``POST /api/v1/uploads/`` (documentation; the view reads it)."""

    file = serializers.FileField(help_text="the evidence: an audit log, a log or a bundle")
    incident_key = serializers.CharField(
        required=False, max_length=500,
        help_text="your own name for the incident (e.g. the CI job URL): uploads with the same "
                  "key in the same team go to the same incident, made the first time")
    title = serializers.CharField(required=False, max_length=300,
                                  help_text="title of a new incident")
    incident = serializers.CharField(required=False, max_length=300,
                                     help_text="title of a new incident (older name of title)")
    incident_id = serializers.IntegerField(required=False, help_text="an existing incident")
    team = serializers.CharField(required=False,
                                 help_text="team of a new incident, if you are in several")


class ShareView(serializers.Serializer):
    query = serializers.CharField(
        required=False, allow_blank=True, max_length=4000,
        help_text="the incident page's query string: filters, since/until, lanes, colour, event")
    sequence = serializers.IntegerField(required=False, allow_null=True,
                                        help_text="a sequence of the incident to open")

    def to_internal_value(self, data):
        if isinstance(data, dict) and set(data) - {"query", "sequence"}:
            raise serializers.ValidationError("Only 'query' and 'sequence' may be saved.")
        return super().to_internal_value(data)


class ShareLinkSerializer(serializers.ModelSerializer):
    """A share link as listed: never its key."""

    created_by = serializers.CharField(source="created_by.username", default=None,
                                       read_only=True)
    active = serializers.BooleanField(read_only=True)
    view = ShareView(read_only=True)

    class Meta:
        model = ShareLink
        fields = ["id", "prefix", "label", "view", "created_by", "created_at", "expires_at",
                  "revoked_at", "use_count", "last_used_at", "active"]


class ShareLinkCreateSerializer(serializers.Serializer):
    label = serializers.CharField(required=False, allow_blank=True, max_length=200)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    expires_in = serializers.IntegerField(required=False, min_value=1,
                                          help_text="seconds from now")
    view = ShareView(required=False)

    def validate(self, attrs: dict) -> dict:
        now = timezone.now()
        if "expires_in" in attrs:
            if attrs.get("expires_at"):
                raise serializers.ValidationError("Give expires_at or expires_in, not both.")
            attrs["expires_at"] = now + timedelta(seconds=attrs.pop("expires_in"))
        if attrs.get("expires_at") and attrs["expires_at"] <= now:
            raise serializers.ValidationError({"expires_at": "Must be in the future."})
        view = attrs.get("view") or {}
        saved = {}
        query = QueryDict(view.get("query", "").lstrip("?"), mutable=True)
        for name in ("after", "sequence", "partial"):  # a cursor is not a view; see sequence
            query.pop(name, None)
        if query:
            saved["query"] = query.urlencode()
        if view.get("sequence") is not None:
            incident = self.context["incident"]
            if not Sequence.objects.filter(pk=view["sequence"], incident=incident).exists():
                raise serializers.ValidationError(
                    {"view": {"sequence": "No such sequence in this incident."}})
            saved["sequence"] = view["sequence"]
        attrs["view"] = saved
        return attrs


class ShareLinkCreatedSerializer(serializers.ModelSerializer):
    """The answer to creating a link: the only time its URL (with the key) is shown."""

    url = serializers.SerializerMethodField(help_text="the link to send; shown only now")
    view = ShareView(read_only=True)

    class Meta:
        model = ShareLink
        fields = ["id", "url", "prefix", "label", "view", "expires_at", "created_at"]

    def get_url(self, link: ShareLink) -> str:
        return absolute(self.context.get("request"),
                        reverse("incidents:share", args=[self.context["key"]]))
