"""Audit webhook streams: kube-apiserver posts its audit events here as they happen.

A stream keeps a rolling window of its events in a ring of ``Segment`` slots, one hour each.
Each slot stores its events as an incident of its own (hidden: no team), so that every write
goes through the one writer of events (``timelines.ingest.store``) and every read through the
usual filters. On PostgreSQL the stream's events are one partition of ``timelines_event`` (LIST
by incident, made when the stream is), itself partitioned by slot: retention empties a whole
slot (TRUNCATE), never rows one by one. See ``streams.store``.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from incidents.models import Incident, Team

SEGMENT_SECONDS = 3600  # one slot of the ring holds one hour of events


def hash_token(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Stream(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="streams")
    name = models.CharField(max_length=100)
    # Only the SHA-256 of the bearer token kube-apiserver sends; the token is shown once.
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=16)
    # The window kept: hours before the stream's newest event (slots = hours + 1), and at most
    # this many GB of stored events (None: no limit by size).
    retention_hours = models.PositiveIntegerField(default=24)
    retention_gb = models.FloatField(null=True, blank=True)
    # Slots of the ring (``retention_hours`` + 1 when made): fixed, as an event's slot is its
    # hour modulo this. A lower ``retention_hours`` later keeps less; a higher one no more.
    slot_count = models.PositiveIntegerField(default=25)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_stream_name")]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def new_token() -> str:
        return "hss_" + secrets.token_urlsafe(32)

    @property
    def slots(self) -> int:
        return self.slot_count


class Segment(models.Model):
    """One slot of a stream's ring: the events of one hour (``start``), held by ``incident``.
    The slot of an event is its hour modulo the ring's size; a slot is emptied (TRUNCATE) when
    a later hour takes it or retention drops it."""

    stream = models.ForeignKey(Stream, on_delete=models.CASCADE, related_name="segments")
    slot = models.PositiveIntegerField()
    incident = models.OneToOneField(Incident, on_delete=models.PROTECT, related_name="+")
    start = models.DateTimeField(null=True, blank=True)  # the hour held; None: empty
    # Requests stored in the slot, counted as they are written (a count(*) of a day of a busy
    # stream would read hundreds of millions of rows); zero again when the slot is emptied.
    events = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["stream", "slot"]
        constraints = [models.UniqueConstraint(fields=["stream", "slot"], name="one_slot")]

    def __str__(self) -> str:
        return f"slot {self.slot} of {self.stream}"
