"""A stream's events: its ring of hourly slots, written through the one writer of events.

- ``create_stream``: the stream, its slots (one hidden incident each) and, on PostgreSQL, its
  partition of ``timelines_event`` (``FOR VALUES IN`` the slots' incidents, itself
  ``PARTITION BY LIST (incident_id)``, one table per slot). Made once: attaching a partition
  scans the DEFAULT partition under a lock, which is affordable per stream, not per hour.
- ``write_batch``: one webhook batch into the slots of its events' hours, each slot's rows in a
  transaction that is durable when it commits (``synchronous_commit`` on, whatever the writer
  sets for file ingest): the receiver answers 200 only after. The store's merge rule on
  ``(incident, received, auditID)`` makes a batch sent twice add nothing and lets a request's
  stages arrive in different batches.
- ``empty_segment``: a slot's events dropped as a whole (TRUNCATE of its table; its body
  chunks, one row per 500 events, deleted by incident).
- ``apply_retention``: slots older than ``retention_hours`` before the newest event, then the
  oldest slots while the stream holds more than ``retention_gb``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, Max, Min, Sum

from incidents.models import Incident
from timelines.detections.models import DetectionMatch
from timelines.ingest.store import write_rows
from timelines.models import BodyChunk, Event
from timelines.parsers import Row

from .models import SEGMENT_SECONDS, Segment, Stream

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# A batch that completes requests stored by an earlier one replaces their rows, and the body
# chunks no row points at any more are deleted (``store._delete_orphan_chunks``): without this
# index, finding whether any row still points at a chunk read the whole slot, for every batch
# (at 800,000 requests in one hour's slot, under 1,300 events/s where 60,000 took 6,400).
CHUNK_INDEX = "CREATE INDEX IF NOT EXISTS {slot}_chunk ON {slot} (body_chunk)"


def stream_table(stream_id: int) -> str:
    return f"streams_event_{int(stream_id)}"


def slot_table(stream_id: int, slot: int) -> str:
    return f"streams_event_{int(stream_id)}_{int(slot)}"


def hour_of(when: datetime) -> datetime:
    seconds = int((when - EPOCH).total_seconds()) // SEGMENT_SECONDS * SEGMENT_SECONDS
    return EPOCH + timedelta(seconds=seconds)


def slot_of(hour: datetime, slots: int) -> int:
    return int((hour - EPOCH).total_seconds()) // SEGMENT_SECONDS % slots


# --- creating --------------------------------------------------------------------------------

def create_stream(name: str, team, *, retention_hours: int = 24,
                  retention_gb: float | None = None, created_by=None) -> tuple[Stream, str]:
    """Make a stream with its ring; returns it and its bearer token (only its hash is kept)."""
    if retention_hours < 1 or retention_hours > 24 * 366:
        raise ValueError(f"retention_hours must be 1 to {24 * 366}, not {retention_hours}")
    if retention_gb is not None and retention_gb <= 0:
        raise ValueError(f"retention_gb must be positive, not {retention_gb}")
    token = Stream.new_token()
    from .models import hash_token

    with transaction.atomic():
        stream = Stream.objects.create(
            name=name, team=team, token_hash=hash_token(token), token_prefix=token[:12],
            retention_hours=retention_hours, retention_gb=retention_gb,
            slot_count=retention_hours + 1, created_by=created_by)
        segments = []
        for slot in range(stream.slots):
            incident = Incident.objects.create(
                title=f"stream {name} (#{stream.pk}), slot {slot}", team=None,
                key=f"stream:{stream.pk}:{slot}")
            segments.append(Segment.objects.create(stream=stream, slot=slot, incident=incident))
        if connection.vendor == "postgresql":
            ids = ", ".join(str(s.incident_id) for s in segments)
            table = stream_table(stream.pk)
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE TABLE {table} PARTITION OF timelines_event"
                               f" FOR VALUES IN ({ids}) PARTITION BY LIST (incident_id)")
                for segment in segments:
                    slot = slot_table(stream.pk, segment.slot)
                    cursor.execute(f"CREATE TABLE {slot} PARTITION OF {table}"
                                   f" FOR VALUES IN ({segment.incident_id})")
                    # Reads of a stream name its slots' incidents as a list, so the indexes
                    # that lead with the incident cannot give them time order: without this
                    # one, the first page of the events list and the oldest and newest event
                    # read every event of the stream (at 60,000 events: 55-69 ms and 51-56 ms;
                    # with it 0.6-4 ms and 0.9-1 ms), a day of a busy one hundreds of millions.
                    cursor.execute(f"CREATE INDEX {slot}_time ON {slot} (received, id)")
                    cursor.execute(CHUNK_INDEX.format(slot=slot))
    return stream, token


def delete_stream(stream: Stream) -> None:
    """The stream, its events and its slots' incidents. Cut incidents stay."""
    segments = list(stream.segments.all())
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {stream_table(stream.pk)}")
        else:
            Event.objects.filter(incident_id__in=[s.incident_id for s in segments]).delete()
        BodyChunk.objects.filter(incident_id__in=[s.incident_id for s in segments]).delete()
        incidents = [s.incident_id for s in segments]
        stream.delete()
        Incident.objects.filter(pk__in=incidents).delete()


# --- writing ---------------------------------------------------------------------------------

@dataclass
class Written:
    events: int = 0  # rows given (one per request and batch)
    new: int = 0  # requests not stored before
    too_old: int = 0  # older than the hour their slot holds now: dropped
    # slot incident → (received, auditID) of the rows stored there (for ``streams.detect``)
    stored: dict = field(default_factory=dict)


def write_batch(stream: Stream, rows: Iterable[Row]) -> Written:
    """Store ``rows`` (one webhook batch, redacted) in the stream; durable on return."""
    by_hour: dict[datetime, list[Row]] = defaultdict(list)
    for row in rows:
        by_hour[hour_of(row.received)].append(row)
    written = Written()
    slots = {s.slot: s for s in stream.segments.all()}
    for hour in sorted(by_hour):
        hour_rows = by_hour[hour]
        written.events += len(hour_rows)
        segment = slots[slot_of(hour, stream.slots)]
        while True:
            outcome = _write_hour(segment, hour, hour_rows)
            if outcome is None:  # the slot holds an earlier hour (or none): take it, then write
                _take_slot(segment, hour)
                continue
            if outcome < 0:
                written.too_old += len(hour_rows)
            else:
                written.new += outcome
                written.stored.setdefault(segment.incident_id, []).extend(
                    (row.received.isoformat(), row.audit_id) for row in hour_rows)
            break
    return written


def _write_hour(segment: Segment, hour: datetime, rows: list[Row]) -> int | None:
    """Rows of one hour into its slot: how many were new; -1 when the slot holds a later hour
    (the rows are too old for the ring); None when it holds an earlier one or none."""
    with transaction.atomic():
        # KEY SHARE: writers of a slot do not wait for each other (the count's update below
        # waits only for another's commit), but do for the slot's taking (FOR UPDATE).
        lock = " FOR KEY SHARE" if connection.vendor == "postgresql" else ""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT start FROM {Segment._meta.db_table} WHERE id = %s{lock}",
                           [segment.pk])
            start = _aware(cursor.fetchone()[0])
        if start is None or start < hour:
            return None
        if start > hour:
            return -1
        # Not the straight COPY first: a batch nearly always completes requests that the batch
        # before it left open (RequestReceived), so the COPY would fail on them and be redone
        # as a merge.
        partition = (slot_table(segment.stream_id, segment.slot)
                     if connection.vendor == "postgresql" else None)
        new = write_rows(segment.incident_id, None, rows, optimistic=False, partition=partition)
        if connection.vendor == "postgresql":
            # The writer turns synchronous_commit off for files (an ingest can be re-run); an
            # acknowledged batch cannot: the apiserver has dropped it.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = on")
        if new:  # last: the slot's row stays locked from here to the commit
            Segment.objects.filter(pk=segment.pk).update(events=F("events") + new)
        return new


def _take_slot(segment: Segment, hour: datetime) -> None:
    """Give the slot to ``hour``, emptying it first, unless another writer already did or it
    holds a later hour meanwhile."""
    with transaction.atomic():
        current = Segment.objects.select_for_update().get(pk=segment.pk)
        if current.start is not None and current.start >= hour:
            return
        if current.start is not None:
            _truncate(current)
        Segment.objects.filter(pk=segment.pk).update(start=hour, events=0)


def _aware(value):
    if value is None or isinstance(value, datetime) and value.tzinfo is not None:
        return value
    if isinstance(value, str):  # SQLite hands the text back
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _truncate(segment: Segment) -> None:
    """Drop the slot's events as a whole. Inside the caller's transaction, which holds the
    segment's row."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {slot_table(segment.stream_id, segment.slot)}")
    else:
        Event.objects.filter(incident_id=segment.incident_id).delete()
    BodyChunk.objects.filter(incident_id=segment.incident_id).delete()
    DetectionMatch.objects.filter(incident_id=segment.incident_id).delete()


def empty_segment(segment: Segment) -> None:
    with transaction.atomic():
        current = Segment.objects.select_for_update().get(pk=segment.pk)
        if current.start is None:
            return
        _truncate(current)
        Segment.objects.filter(pk=segment.pk).update(start=None, events=0)


# --- reading ---------------------------------------------------------------------------------

def incident_ids(stream: Stream) -> list[int]:
    return list(stream.segments.values_list("incident_id", flat=True))


def events(stream: Stream):
    """The stream's events (a queryset over its slots' incidents)."""
    return Event.objects.filter(incident_id__in=incident_ids(stream))


def summary(stream: Stream) -> dict:
    """``events`` (the slots' counts), ``oldest`` and ``newest`` (received; each a walk down
    one index per slot) of the stream."""
    found = events(stream).aggregate(oldest=Min("received"), newest=Max("received"))
    found["events"] = stream.segments.aggregate(total=Sum("events"))["total"] or 0
    return found


def stored_bytes(segment: Segment) -> int:
    """What a slot takes on disk: its table with indexes and its body chunks."""
    total = 0
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_total_relation_size(%s)",
                           [slot_table(segment.stream_id, segment.slot)])
            total += cursor.fetchone()[0] or 0
            cursor.execute("SELECT coalesce(sum(pg_column_size(data)), 0) FROM timelines_bodychunk"
                           " WHERE incident_id = %s", [segment.incident_id])
        else:
            cursor.execute("SELECT coalesce(sum(length(data)), 0) FROM timelines_bodychunk"
                           " WHERE incident_id = %s", [segment.incident_id])
        total += cursor.fetchone()[0] or 0
    return int(total)


def apply_retention(stream: Stream) -> list[int]:
    """Empty the slots the stream no longer keeps; returns their numbers. By age: an hour
    ending more than ``retention_hours`` before the newest hour held. By size: the oldest
    hours, while the stream holds more than ``retention_gb``."""
    held = [s for s in stream.segments.all() if s.start is not None]
    if not held:
        return []
    newest = max(s.start for s in held)
    limit = newest - timedelta(hours=stream.retention_hours)
    dropped = []
    for segment in sorted(held, key=lambda s: s.start):
        if segment.start < limit:
            empty_segment(segment)
            dropped.append(segment.slot)
    if stream.retention_gb:
        kept = sorted((s for s in held if s.slot not in dropped), key=lambda s: s.start)
        sizes = {s.pk: stored_bytes(s) for s in kept}
        total = sum(sizes.values())
        budget = stream.retention_gb * 1024**3
        for segment in kept[:-1]:  # never the newest hour
            if total <= budget:
                break
            empty_segment(segment)
            total -= sizes[segment.pk]
            dropped.append(segment.slot)
    return dropped
