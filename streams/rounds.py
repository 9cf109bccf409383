"""A detection round: the Falco rules (``timelines.detections``) over some of a stream's requests,
their matches replacing those of these requests (``detect_batch``). Run where ``streams.detect``
sends it: a Celery worker, the web process's child (``streams.detector``) or its thread."""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction

from timelines.detections.incident import copy_matches, evaluate, ruleset_of_team
from timelines.detections.models import DetectionMatch
from timelines.ingest.store import analyze
from timelines.models import Event

from .models import Segment
from .store import slot_table

ADVISORY = 0x5D7  # advisory lock of a slot's matches: (ADVISORY << 40) + its incident


# A slot's table fills by the million within its hour, faster than autovacuum's ANALYZE keeps
# up (seen: 1,250,000 rows, never analyzed): planning by its empty statistics, the reads of a
# round by id went through another index and tested each of the slot's rows against the round's
# ids (10.6 s for 8,000 ids, 8 ms with statistics). So a round first analyzes its slot whenever
# the slot has doubled since (in this process), off the acknowledgments' path.
ANALYZE_FROM = 5_000
_analyzed: dict[int, int] = {}  # slot incident → its requests when this process analyzed it


def analyze_if_grown(segment: Segment) -> bool:
    if connection.vendor != "postgresql":
        return False
    seen = _analyzed.get(segment.incident_id, 0)
    if segment.events < seen:  # emptied and taken again since
        seen = 0
    if segment.events < max(ANALYZE_FROM, 2 * seen):
        _analyzed[segment.incident_id] = seen
        return False
    analyze(slot_table(segment.stream_id, segment.slot))
    _analyzed[segment.incident_id] = segment.events
    return True


def _ids_of(segment: Segment, keys: list) -> list[int]:
    """The ids of the slot's rows of these (received, auditID) keys: on PostgreSQL one join
    with the keys as two arrays, on the slot's table (a list of 8,000 keys as as many
    parameters cost the round more than its rules)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT e.id FROM {slot_table(segment.stream_id, segment.slot)} e"
                " JOIN unnest(%s::text[], %s::text[]) AS k(received, audit_id)"
                " ON e.received = k.received::timestamptz AND e.audit_id = k.audit_id"
                " WHERE e.incident_id = %s",
                [[r for r, _ in keys], [a for _, a in keys], segment.incident_id])
            return [row[0] for row in cursor.fetchall()]
    wanted = {(datetime.fromisoformat(received), audit_id) for received, audit_id in keys}
    return [pk for pk, received, audit_id in Event.objects.filter(
        incident_id=segment.incident_id, audit_id__in={a for _, a in wanted},
        received__gte=min(r for r, _ in wanted), received__lte=max(r for r, _ in wanted),
    ).values_list("id", "received", "audit_id") if (received, audit_id) in wanted]


def _replace_matches(cursor, segment: Segment, ids: list[int], matched: dict) -> None:
    """PostgreSQL: the matches of the requests ``ids`` replaced by those of ``matched`` whose
    rows are still there, each list of ids one array parameter, probed on the matches'
    ``(incident, event_id, rule)`` index and the slot's primary key (as an ``IN`` list of
    8,000 on the former ``(incident, rule, event_id)`` index, one delete tested each of the
    slot's matches against every id: minutes at 700,000)."""
    cursor.execute(f"SELECT id FROM {slot_table(segment.stream_id, segment.slot)}"
                   " WHERE incident_id = %s AND id = ANY(%s)", [segment.incident_id, ids])
    alive = {row[0] for row in cursor.fetchall()}
    # a join with the ids, probing the index per id whatever the table's statistics say: as
    # ``event_id = ANY(ids)``, unanalyzed matches (autovacuum off, or behind) were read whole
    # and each tested against the 8,000 ids (15 s a round at 400,000 matches)
    cursor.execute(f"DELETE FROM {DetectionMatch._meta.db_table} d"
                   " USING unnest(%s::bigint[]) AS k(event_id)"
                   " WHERE d.incident_id = %s AND d.event_id = k.event_id",
                   [ids, segment.incident_id])
    copy_matches(cursor, segment.incident_id,
                 {rule: [i for i in found if i in alive] for rule, found in matched.items()})


def detect_batch(stored: dict, pause=None) -> dict[str, int]:
    """The rules over the requests of ``stored`` (slot incident → [(received, auditID)]); their
    matches replace those of these requests. Returns matches per rule. ``pause``: called between
    small pieces of the work (``GiveWay``)."""
    pause = pause or (lambda: None)
    counts: dict[str, int] = {}
    for incident_id, keys in stored.items():
        incident_id = int(incident_id)
        if not keys:
            continue
        segment = Segment.objects.select_related("stream").filter(
            incident_id=incident_id).first()
        if segment is None:  # the stream was deleted meanwhile
            continue
        analyze_if_grown(segment)
        ids = _ids_of(segment, keys)
        if not ids:  # emptied meanwhile
            continue
        pause()
        found = evaluate(incident_id, ruleset_of_team(segment.stream.team_id), event_ids=ids,
                         pause=pause)
        pause()
        with transaction.atomic():
            # Hold the slot against its emptying (FOR UPDATE there): matches of events that
            # are gone are never written.
            postgres = connection.vendor == "postgresql"
            lock = " FOR KEY SHARE" if postgres else ""
            with connection.cursor() as cursor:
                if lock:  # and one writer of a slot's matches at a time (no duplicates)
                    cursor.execute("SELECT pg_advisory_xact_lock(%s)",
                                   [(ADVISORY << 40) + incident_id])
                cursor.execute(f"SELECT 1 FROM {Segment._meta.db_table} WHERE id = %s{lock}",
                               [segment.pk])
                if cursor.fetchone() is None:
                    continue
                if postgres:
                    _replace_matches(cursor, segment, ids, found.ids)
            if not postgres:
                alive = set(Event.objects.filter(incident_id=incident_id, pk__in=ids)
                            .values_list("id", flat=True))
                DetectionMatch.objects.filter(incident_id=incident_id,
                                              event_id__in=ids).delete()
                DetectionMatch.objects.bulk_create(
                    DetectionMatch(incident_id=incident_id, rule=rule, event_id=event_id)
                    for rule, matched in found.ids.items() for event_id in dict.fromkeys(matched)
                    if event_id in alive)
        for rule, matched in found.ids.items():
            counts[rule] = counts.get(rule, 0) + len(matched)
    return counts
