"""Cutting an incident from a stream: the chosen events copied into a new incident of the
stream's team, through the one writer of events, so that it is like any other incident
(insights, sharing, annotations, compare) and the stream's retention never touches it.

Each event is made again from its stored (redacted) body by the audit parser, as an upload's
would be, keeping the stream's ``source`` and line; the bodies are packed anew for the
incident (its own body chunks: deleting either never touches the other's)."""

from __future__ import annotations

import orjson
from django.conf import settings
from django.db import transaction

from incidents.models import Incident
from timelines.ingest.store import write_rows
from timelines.models import BodyChunk
from timelines.parsers import Redactor, Report
from timelines.parsers.audit import NativeEvents

from .models import Stream

BATCH = 2000


def cut_incident(stream: Stream, queryset, title: str, user) -> Incident:
    """A new incident holding the events of ``queryset`` (events of the stream)."""
    with transaction.atomic():
        incident = Incident.objects.create(title=title, team=stream.team, created_by=user)
        redactor = Redactor(settings.REDACT_EXTRA_PATHS, enabled=settings.REDACT)
        batch = []
        chunk_id, lines = None, []
        for source, line, chunk, index in queryset.order_by("body_chunk", "body_index") \
                .values_list("source", "line", "body_chunk", "body_index").iterator(2000):
            if chunk is None:
                continue
            if chunk != chunk_id:
                found = BodyChunk.objects.filter(pk=chunk).first()
                chunk_id, lines = chunk, (found.lines() if found else [])
            if index >= len(lines):
                continue
            report = Report(source)
            parsed = NativeEvents(report, redactor)
            rows = [*parsed.feed(orjson.loads(lines[index]), line, lines[index]), *parsed.flush()]
            batch.extend(rows)
            if len(batch) >= BATCH:
                write_rows(incident.pk, None, batch)
                batch = []
        if batch:
            write_rows(incident.pk, None, batch)
    return incident
