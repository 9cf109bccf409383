"""The Falco rules (``timelines.detections``) over a stream's batches, as they arrive.

The receiver acknowledges a batch once it is stored; then (``enqueue``: on a Celery worker when
a broker is configured, else by one thread of this process, never delaying the 200, which runs
the rounds in a child process of its own on PostgreSQL, ``streams.detector``) the rules are
evaluated over the requests of that batch only, and their matches stored for the slot's
incident, which is what the stream's events filter ``detection=<rule>`` reads. A request whose
stages arrive in several batches is evaluated again with each, on its merged row. A slot
emptied meanwhile (retention, a later hour) takes its matches with it (``store._truncate``);
the slot's row is held while they are written, so none outlive it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

from timelines.detections.incident import copy_matches, evaluate, ruleset_of_team
from timelines.detections.models import DetectionEvent
from timelines.ingest.store import analyze
from timelines.models import Event

from .models import Segment
from .store import slot_table

log = logging.getLogger(__name__)

TASK = "streams.tasks.detect_stream_batch"
ADVISORY = 0x5D7  # advisory lock of a slot's matches: (ADVISORY << 40) + its incident


def enqueue(stored: dict) -> None:
    """Detect over a batch just stored (``Written.stored``): after the response is decided,
    never failing it (a broker down loses only that batch's detections, logged)."""
    if not stored:
        return
    stored = {str(incident_id): rows for incident_id, rows in stored.items()}
    if settings.CELERY_BROKER_URL:
        try:
            from celery import current_app

            current_app.send_task(TASK, args=[stored])
        except Exception:
            log.exception("detections of a stream batch not queued")
        return
    _enqueue_here(stored)


# Without a broker, one thread per web process evaluates what the batches stored since its last
# round, all at once: a thread per batch made as many evaluations at once as batches arrived
# (each a few queries and the rules), which under load took the receivers' CPU and interpreter
# (at 3 apiservers' pace: 4,100 events/s acknowledged, p50 240 ms, against 11,900 events/s and
# 61 ms with none), and queued on the slot's lock besides.
_pending: dict[str, list] = {}
_pending_lock = threading.Lock()
_drainer: threading.Thread | None = None


def _enqueue_here(stored: dict) -> None:
    global _drainer
    with _pending_lock:
        for incident_id, rows in stored.items():
            _pending.setdefault(incident_id, []).extend(rows)
        if _drainer is None:
            _drainer = threading.Thread(target=_drain, name="stream-detect", daemon=True)
            _drainer.start()


ROUND_REQUESTS = 8_000  # at most this many requests a round: the reads of one stay indexed

# Receivers first, where the round runs in the web process (``HINDSIGHT_STREAM_DETECTIONS=thread``,
# and SQLite). The round shares the web process's interpreter with the receivers' threads:
# two threads wanting it take turns (every 5 ms), so a batch received during a round took about
# twice its time (at 6,000 events/s: ack p50 112 ms, p99 285 ms, against 62 / 148 ms without
# detections). So the round gives way: after each WORK_SLICE of its work it waits while a batch
# is being received, up to GIVE_WAY seconds, and so runs in the time between batches, or about a
# tenth of the time under a load that never leaves any (bench/README.md, stream benchmark).
WORK_SLICE = 0.005
GIVE_WAY = 0.050
_receiving = 0
_receiving_lock = threading.Lock()
_idle = threading.Event()
_idle.set()


@contextmanager
def receiving():
    """Around a batch's reception in this process: the detection round gives way meanwhile."""
    global _receiving
    with _receiving_lock:
        _receiving += 1
        _idle.clear()
    try:
        yield
    finally:
        with _receiving_lock:
            _receiving -= 1
            if not _receiving:
                _idle.set()


class GiveWay:
    """Called between small pieces of a round's work (a body, a group of requests)."""

    __slots__ = ("since", "waited")

    def __init__(self) -> None:
        self.since = time.perf_counter()
        self.waited = 0.0  # seconds given to the receivers

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self.since < WORK_SLICE:
            return
        if not _idle.is_set():
            _idle.wait(GIVE_WAY)
            self.waited += time.perf_counter() - now
        self.since = time.perf_counter()


def _take(limit: int) -> dict[str, list]:
    """Up to ``limit`` of the pending requests, oldest batches first (under the lock)."""
    taken: dict[str, list] = {}
    room = limit
    for incident_id in list(_pending):
        if room <= 0:
            break
        rows = _pending[incident_id]
        taken[incident_id] = rows[:room]
        if len(rows) > room:
            _pending[incident_id] = rows[room:]  # keeps its place: oldest first
        else:
            del _pending[incident_id]
        room -= len(taken[incident_id])
    return taken


def _drain() -> None:
    global _drainer
    _lower_priority()
    try:
        while True:
            with _pending_lock:
                if not _pending:
                    _drainer = None
                    return
                taken = _take(ROUND_REQUESTS)
            try:
                run_round(taken)
            except Exception:
                log.exception("detections of stream batches failed")
    except BaseException:
        with _pending_lock:
            _drainer = None
        raise
    finally:
        connection.close()


def in_child() -> bool:
    """Whether this process's rounds run in its child process (``streams.detector``): on
    PostgreSQL unless ``HINDSIGHT_STREAM_DETECTIONS=thread``. SQLite has one writer, and the
    child's writes would wait for the receivers' (or the other way round)."""
    return settings.STREAM_DETECTIONS == "process" and connection.vendor == "postgresql"


def run_round(taken: dict) -> dict[str, int]:
    """One round of this process: in its child process, or here giving way to the receivers."""
    if in_child():
        from .detector import detector

        return detector().run(taken)
    return detect_batch(taken, pause=GiveWay())


def _lower_priority() -> None:
    """This thread, and no other of the process, below the receivers for the CPUs (Linux: a
    thread's nice value is its own)."""
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me)
                                                + DETECT_NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: the same priority
        pass


DETECT_NICE = 10


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
    cursor.execute(f"DELETE FROM {DetectionEvent._meta.db_table} d"
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
                DetectionEvent.objects.filter(incident_id=incident_id,
                                              event_id__in=ids).delete()
                DetectionEvent.objects.bulk_create(
                    DetectionEvent(incident_id=incident_id, rule=rule, event_id=event_id)
                    for rule, matched in found.ids.items() for event_id in matched
                    if event_id in alive)
        for rule, matched in found.ids.items():
            counts[rule] = counts.get(rule, 0) + len(matched)
    return counts
