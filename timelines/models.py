"""The event store.

One ``Event`` row per request, with a column for everything users filter on. The full redacted
event (request and response objects included) lives in ``BodyChunk``: a few hundred events'
JSON lines compressed together, referenced by ``(body_chunk, body_index)``. Keeping bodies out of
the row keeps the row narrow, which is what makes bulk ingest fast (see README, Architecture).

``timelines.ingest`` is the only writer of both tables.
"""

from __future__ import annotations

import zlib

import orjson
import zstandard
from django.db import models
from django.utils import timezone

from incidents.models import Incident, Upload

from .fields import StringListField

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class BodyChunk(models.Model):
    # No database-level foreign keys, like the events they hold: a deleted incident's chunks are
    # removed with its events, in the background (``timelines.ingest.purge``).
    incident = models.ForeignKey(Incident, on_delete=models.DO_NOTHING, db_constraint=False,
                                 related_name="+")
    upload = models.ForeignKey(Upload, null=True, on_delete=models.DO_NOTHING,
                               db_constraint=False, related_name="+")
    # Compressed JSON lines, one redacted event per line: zstd (``pack``), or zlib in chunks
    # written before zstd (which compresses these ~6x faster and ~2.5x smaller).
    data = models.BinaryField()

    def __str__(self) -> str:
        return f"body chunk {self.pk} of incident {self.incident_id}"

    @staticmethod
    def pack(lines: bytes) -> bytes:
        """``lines`` (joined by newlines) as stored in ``data``."""
        return zstandard.compress(lines, 1)

    def lines(self) -> list[bytes]:
        data = bytes(self.data)
        if data.startswith(ZSTD_MAGIC):
            return zstandard.decompress(data).split(b"\n")
        return zlib.decompress(data).split(b"\n")


class Event(models.Model):
    """One piece of evidence on the timeline: a request, a Kubernetes Event, a log line, a span."""

    class Kind(models.TextChoices):
        AUDIT = "audit"
        EVENT = "event"
        LOG = "log"
        TRACE = "trace"
        STATE = "state"  # a time point of an object's state, or its snapshot at capture

    # No database-level foreign keys on the hot table: a per-row RI check would cost ingest speed
    # and a deleted incident's events are purged in bulk (``timelines.ingest.purge``).
    # No index of their own either: every index of the table leads with the incident, and no
    # query selects events by upload (each index costs bulk loads time, see ingest.bulk).
    incident = models.ForeignKey(Incident, on_delete=models.DO_NOTHING, db_constraint=False,
                                 db_index=False, related_name="events")
    upload = models.ForeignKey(Upload, null=True, on_delete=models.DO_NOTHING,
                               db_constraint=False, db_index=False, related_name="+")
    kind = models.TextField(choices=Kind.choices, default=Kind.AUDIT)
    # With ``received``, the identity within the incident: the auditID for requests, a key the
    # parser derives for other kinds.
    audit_id = models.TextField()
    received = models.DateTimeField()
    completed = models.DateTimeField(null=True)  # None: the request never completed (open span)
    duration_ms = models.FloatField(null=True)
    verb = models.TextField(default="")
    username = models.TextField(default="")
    groups = StringListField(default=list)
    impersonated_user = models.TextField(default="")
    user_agent = models.TextField(default="")
    source_ip = models.TextField(default="")
    resource = models.TextField(default="")
    subresource = models.TextField(default="")
    namespace = models.TextField(default="")
    name = models.TextField(default="")
    api_group = models.TextField(default="")
    api_version = models.TextField(default="")
    object_uid = models.TextField(default="")
    resource_version = models.TextField(default="")
    code = models.IntegerField(null=True)
    level = models.TextField(default="")
    stage = models.TextField(default="")  # the last stage seen
    request_uri = models.TextField(default="")
    annotations = models.JSONField(default=dict)
    source = models.TextField(default="")  # file the final stage came from
    line = models.IntegerField(default=0)  # and its line there
    message = models.TextField(default="")
    reason = models.TextField(default="")
    severity = models.TextField(default="")
    component = models.TextField(default="")
    node = models.TextField(default="")
    count = models.IntegerField(null=True)
    body_chunk = models.BigIntegerField(null=True)
    body_index = models.IntegerField(default=0)

    class Meta:
        # The request identity leads with ``received``: logs arrive in time order, so inserts land
        # near the index's right edge instead of at random places (an auditID-first index made
        # ingest several times slower), and the same index serves time windows and the cursor.
        constraints = [
            models.UniqueConstraint(fields=["incident", "received", "audit_id"],
                                    name="event_request_identity"),
        ]
        # On PostgreSQL these two are each partition's own, not the partitioned table's (migration
        # 0010): a bulk load builds them after its first answer (``ingest.bulk``). Django's view
        # is the same; an operation that drops or renames them by these names would not be.
        indexes = [
            models.Index(fields=["incident", "resource", "namespace", "name", "received"],
                         name="event_object"),
            models.Index(fields=["incident", "username", "received"], name="event_actor"),
        ]

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}/{self.name} by {self.username}"

    @property
    def source_tail(self) -> str:
        """The end of ``source`` that tells a file apart (its last two path parts), "…/"
        before it when shortened: a bundle's paths run to a hundred characters and more."""
        parts = self.source.rsplit("/", 2)
        return self.source if len(parts) < 3 else "…/" + "/".join(parts[1:])

    def body(self) -> dict | None:
        """The stored (redacted) audit event, or None if the body is not available."""
        if self.body_chunk is None:
            return None
        chunk = BodyChunk.objects.filter(pk=self.body_chunk).only("data").first()
        if chunk is None:
            return None
        lines = chunk.lines()
        if self.body_index >= len(lines):
            return None
        return orjson.loads(lines[self.body_index])


class IncidentPurge(models.Model):
    """A deleted incident whose evidence is still to be removed: its events and body chunks (which
    have no cascading foreign key), its partition, the uploaded files still on disk and its column
    index. Written in the transaction that deletes the incident, deleted by the purge that
    finishes (``timelines.ingest.purge``); a row that stays is a purge to run again."""

    incident_id = models.BigIntegerField(primary_key=True)  # the incident is gone: no foreign key
    deleted_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(default=timezone.now)  # when a purge was last asked for
    # Hindsight's own copies of uploaded files that may still be on disk (absolute paths), and
    # the top-level uploads, whose bundle work directories may exist (``ingest.bundle.work_dir``).
    files = models.JSONField(default=list, blank=True)
    uploads = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"purge of incident {self.incident_id}"


class IncidentInsights(models.Model):
    """An incident's findings (``timelines.analysis.insights``) for one data version
    (``aggregate.data_version``): computed once when its uploads finish, or by the first read
    of a version without them, and replaced when a new version computes them. Goes with the
    incident (a cascading foreign key: one small row, unlike the events)."""

    incident = models.OneToOneField(Incident, on_delete=models.CASCADE, related_name="+")
    version = models.TextField()
    computed_at = models.DateTimeField(default=timezone.now)
    seconds = models.FloatField(default=0)  # how long the computation took
    insights = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"insights of incident {self.incident_id} at {self.version}"


class IncidentPodFacts(models.Model):
    """What an incident's evidence about pods says (``timelines.analysis.pods_views``: every
    ``pods.Fact`` with the id of its event), for one data version: written when its uploads
    finish, or by the first pods query of a version without it, and replaced when a new version
    writes it; read when no process keeps them, so that no query reads the bodies again. Goes
    with the incident (a cascading foreign key). ``facts``: zstd-compressed columns
    (``pods_views.KnownFacts``)."""

    incident = models.OneToOneField(Incident, on_delete=models.CASCADE, related_name="+")
    version = models.TextField()
    computed_at = models.DateTimeField(default=timezone.now)
    seconds = models.FloatField(default=0)  # how long reading the evidence took
    facts = models.BinaryField()
    unfiltered = models.BinaryField(null=True)  # the unfiltered answer, zstd-compressed JSON

    def __str__(self) -> str:
        return f"pod facts of incident {self.incident_id} at {self.version}"
