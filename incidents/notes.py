"""What people write on the evidence: annotations and root-cause sequences.

Events live in ``timelines`` and models depend one way (``timelines`` → ``incidents``), so an
annotation or a step names its event by id and keeps a copy of the event's time, which is what
ordering and deltas need.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Annotation(models.Model):
    """A note on one event or on a time range of an incident."""

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE,
                                 related_name="annotations")
    event_id = models.BigIntegerField(null=True, blank=True)  # timelines.Event, if on one event
    start = models.DateTimeField()  # the event's received time, or where the range starts
    end = models.DateTimeField(null=True, blank=True)  # where the range ends; None for a point
    note = models.TextField(blank=True)  # Markdown
    tags = models.JSONField(default=list, blank=True)
    starred = models.BooleanField(default=False)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                               on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["start", "id"]
        indexes = [models.Index(fields=["incident", "start"]),
                   models.Index(fields=["incident", "event_id"])]

    def __str__(self) -> str:
        return f"annotation {self.pk} on incident {self.incident_id}"


class Sequence(models.Model):
    """A root cause told as ordered steps on the evidence."""

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE,
                                 related_name="sequences")
    title = models.CharField(max_length=300)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                               on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.title


class SequenceStep(models.Model):
    sequence = models.ForeignKey(Sequence, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveIntegerField()  # 0-based order within the sequence
    event_id = models.BigIntegerField(null=True, blank=True)  # timelines.Event it points at
    annotation = models.ForeignKey(Annotation, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    at = models.DateTimeField()  # the time of that event or annotation: deltas are taken on it
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return f"step {self.position + 1} of {self.sequence_id}"
