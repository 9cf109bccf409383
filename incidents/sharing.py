"""Sharing an incident beyond its team: grants to other teams and read-only share links."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


class IncidentGrant(models.Model):
    """Another team given access to an incident."""

    class Role(models.TextChoices):
        VIEWER = "viewer"
        EDITOR = "editor"  # may also upload, annotate and share

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE,
                                 related_name="grants")
    team = models.ForeignKey("incidents.Team", on_delete=models.CASCADE,
                             related_name="granted_incidents")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["incident", "team"], name="one_grant")]

    def __str__(self) -> str:
        return f"{self.team} on incident {self.incident_id} ({self.role})"


def hash_link_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ShareLink(models.Model):
    """A read-only, revocable link to one incident (and optionally a saved view of it). Only the
    SHA-256 of its key is stored; the key (256 random bits) is in the URL shown once."""

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE,
                                 related_name="share_links")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)  # tells links apart in lists
    label = models.CharField(max_length=200, blank=True)
    # The saved view the link opens: the incident page's query (filters, window, lanes, colour,
    # selected event) and optionally a sequence id.
    view = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    use_count = models.PositiveBigIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"share link {self.prefix}… to incident {self.incident_id}"

    @classmethod
    def issue(cls, incident, user, *, label: str = "", view: dict | None = None,
              expires_at=None) -> tuple[ShareLink, str]:
        """Create a link; returns the row and its key, which is not stored anywhere."""
        key = secrets.token_urlsafe(32)
        link = cls.objects.create(incident=incident, key_hash=hash_link_key(key), prefix=key[:8],
                                  label=label, view=view or {}, created_by=user,
                                  expires_at=expires_at)
        return link, key

    @property
    def active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()
