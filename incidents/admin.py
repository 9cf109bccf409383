from django.contrib import admin

from .models import ApiToken, Incident, Membership, Team, Upload


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


@admin.register(Upload)
class UploadAdmin(admin.ModelAdmin):
    list_display = ["name", "incident", "status", "events", "skipped_lines", "redacted",
                    "created_at"]
    list_filter = ["status"]
    readonly_fields = ["bytes_read", "bytes_total", "events", "new_events", "skipped_lines",
                       "redacted", "errors", "message", "attempts", "claimed_by", "started_at",
                       "finished_at", "heartbeat_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "scope", "created_at", "expires_at", "last_used_at"]
    readonly_fields = ["prefix", "key_hash", "last_used_at"]
