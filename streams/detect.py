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

from django.conf import settings
from django.db import connection

from .rounds import detect_batch

log = logging.getLogger(__name__)

TASK = "streams.tasks.detect_stream_batch"


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
    """One round of this process: in its child process, or here giving way to the receivers
    (also when the child cannot run it: the round's detections are not lost)."""
    if in_child():
        from .detector import DetectorGone, detector

        try:
            return detector().run(taken)
        except DetectorGone as exc:
            log.error("stream detector cannot run (%s); the round runs in this process", exc)
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
