from django.contrib import admin
from django.http import HttpResponse
from django.utils import timezone

from .access import slot_message, slot_owner, stream_slot_ids
from .models import ApiToken, Incident, Membership, Team, Upload
from .notes import Annotation, Sequence, SequenceStep
from .sharing import IncidentGrant, ShareLink


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    inlines = [MembershipInline]
    search_fields = ["name"]


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = ["title", "team", "created_by", "created_at"]
    list_filter = ["team"]
    search_fields = ["title"]

    def get_queryset(self, request):
        # A stream's slot incidents are no one's (incidents.access): they go with their stream.
        return super().get_queryset(request).exclude(pk__in=stream_slot_ids())

    def delete_view(self, request, object_id, extra_context=None):
        segment = slot_owner(object_id)
        if segment is not None:
            return HttpResponse(slot_message(segment), status=409,
                                content_type="text/plain; charset=utf-8")
        return super().delete_view(request, object_id, extra_context)


@admin.register(Upload)
class UploadAdmin(admin.ModelAdmin):
    list_display = ["name", "incident", "status", "event_count", "skipped_lines", "redacted",
                    "created_at"]
    list_filter = ["status"]
    readonly_fields = ["bytes_read", "bytes_total", "event_count", "new_events", "skipped_lines",
                       "redacted", "errors", "message", "attempts", "claimed_by", "started_at",
                       "finished_at", "heartbeat_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "scope", "created_at", "expires_at", "last_used_at"]
    readonly_fields = ["prefix", "key_hash", "last_used_at"]


class SequenceStepInline(admin.TabularInline):
    model = SequenceStep
    extra = 0
    fields = ["position", "event_id", "annotation", "at", "note"]
    raw_id_fields = ["annotation"]


@admin.register(Sequence)
class SequenceAdmin(admin.ModelAdmin):
    list_display = ["title", "incident", "author", "created_at", "updated_at"]
    search_fields = ["title"]
    raw_id_fields = ["incident", "author"]
    inlines = [SequenceStepInline]


@admin.register(Annotation)
class AnnotationAdmin(admin.ModelAdmin):
    list_display = ["__str__", "incident", "event_id", "start", "end", "starred", "author"]
    list_filter = ["starred"]
    search_fields = ["note"]
    raw_id_fields = ["incident", "author"]


@admin.register(IncidentGrant)
class IncidentGrantAdmin(admin.ModelAdmin):
    list_display = ["incident", "team", "role", "granted_by", "created_at"]
    list_filter = ["role", "team"]
    raw_id_fields = ["incident"]


@admin.register(ShareLink)
class ShareLinkAdmin(admin.ModelAdmin):
    list_display = ["prefix", "incident", "label", "created_by", "created_at", "expires_at",
                    "revoked_at", "use_count", "last_used_at"]
    readonly_fields = ["prefix", "key_hash", "use_count", "last_used_at"]
    raw_id_fields = ["incident"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected links")
    def revoke(self, request, queryset) -> None:
        queryset.filter(revoked_at=None).update(revoked_at=timezone.now())
