"""Deleting an incident: the incident at once, its evidence in the background.

An incident of a million events holds a million rows of ``timelines_event`` and a few thousand
body chunks. Dropping the partition of a bulk-loaded incident is quick, but deleting the rows of
one in the DEFAULT partition takes seconds, and a DETACH waits for every query running on the
event table (and holds up every query that comes after it). So the request does only what is
quick whatever the storage (``delete_incident``):

- lock the incident's row, delete its small rows (uploads, a bundle's files among them, in one
  statement; annotations, sequences, grants, share links) and the incident itself, and write an
  ``IncidentPurge`` row naming what is left: all in one transaction. From its commit the incident
  answers 404 everywhere, its evidence with it, because every read of events goes through a
  visible incident;
- on commit, queue ``purge_incident`` (a Celery task; without a broker, a thread).

``purge_incident`` then drops the incident's partition and a leftover load table (waiting at most
``LOCK_TIMEOUT`` for the event table's lock, else retried later), deletes its rows of the
DEFAULT partition and its body chunks, removes the uploaded files still on disk and the column
index, and deletes the ``IncidentPurge`` row last.

Why this is sound:

- Nothing is written for the incident after its deletion commits: every batch of the writer
  holds the incident's row (``incidents.models.hold_incident``), so an ingest still running
  stops at its next batch with ``IncidentGone`` and the purge sees every event there is. Run
  once, it is complete.
- Incident ids are never reused (PostgreSQL sequences never go back; on SQLite Django's
  ``AutoField`` is ``AUTOINCREMENT``), so a purge can only ever meet rows of the deleted
  incident, and nothing cached under its id can be served to another one.
- The purge is idempotent (deleting what is already gone deletes nothing) and its row outlives
  it until it has finished. A purge that was lost (the broker lost the message, the worker died,
  every retry failed) is found by ``requeue_lost``, which the beat runs every few minutes
  (``tasks.requeue_lost_purges``; in the embedded default the incident list runs it): a look at
  the few rows of ``IncidentPurge``, not a scan of the event table for orphans.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from incidents.access import slot_message, slot_owner
from incidents.models import Incident, Upload

from ..models import BodyChunk, Event, IncidentPurge
from .bulk import drop_incident_partition
from .bundle import work_dir

log = logging.getLogger(__name__)

# How long the purge waits for the event table's lock to drop a partition: every query on the
# table queues behind a waiting DETACH, so it gives up soon and is retried.
LOCK_TIMEOUT = "1s"
# A purge still listed this long after it was queued is taken to be lost and queued again.
LOST_AFTER = timedelta(minutes=10)
UPLOAD_FOLDER = re.compile(r"[0-9a-f]{32}")


class SlotIncident(ValueError):
    """The incident holds a stream's slot: not deleted on its own."""


def delete_incident(incident: Incident) -> bool:
    """Delete the incident and its small rows now; queue the purge of its evidence on commit.
    Returns False if it was gone already. Quick whatever the number of events: see the module
    docstring."""
    with transaction.atomic():
        # First the row lock: a batch being written finishes, and no later one starts (see
        # incidents.models.hold_incident); concurrent writes to it fail rather than the deletion.
        locked = Incident.objects.select_for_update().filter(pk=incident.pk).first()
        if locked is None:
            return False
        segment = slot_owner(locked.pk)
        if segment is not None:  # goes with its stream only (streams.store.delete_stream)
            raise SlotIncident(slot_message(segment))
        record_deletion(locked)
        # One statement, rather than the collector fetching every row: a bundle may hold
        # 100,000 files (their foreign keys to each other are checked at commit).
        Upload.objects.filter(incident=locked)._raw_delete(Upload.objects.db)
        locked.delete()  # annotations, sequences, grants and share links go with it
    return True


def record_deletion(incident: Incident) -> None:
    """Write the ``IncidentPurge`` row of an incident being deleted (inside the deleting
    transaction) and queue its purge on commit; once per incident. Connected to the incident's
    ``pre_delete`` (``timelines.apps``), so that any deletion, the admin's too, leaves nothing
    behind."""
    if IncidentPurge.objects.filter(pk=incident.pk).exists():
        return
    top = Upload.objects.filter(incident_id=incident.pk, parent=None)
    IncidentPurge.objects.create(
        incident_id=incident.pk,
        # Hindsight's own copies only: ``manage.py ingest`` reads files in place (not copies).
        files=[path for path in top.filter(path_is_copy=True).exclude(path="")
               .values_list("path", flat=True)],
        uploads=list(top.values_list("pk", flat=True)))
    enqueue_purge(incident.pk)


def purge_incident(incident_id: int) -> dict[str, int] | None:
    """Remove what the deleted incident left (see the module docstring), then its
    ``IncidentPurge`` row. Returns what was removed (``events``, ``chunks``, ``partition`` 1 or 0,
    ``files``), or None if there is no such row (purged already). Idempotent; database errors
    propagate for the caller to retry, with the row kept."""
    purge = IncidentPurge.objects.filter(pk=incident_id).first()
    if purge is None:
        return None
    if Incident.objects.filter(pk=incident_id).exists():
        # Cannot happen (the row is written in the transaction that deletes the incident, and
        # ids are never reused); never delete the evidence of an incident that exists.
        log.error("purge of incident %s refused: the incident exists", incident_id)
        IncidentPurge.objects.filter(pk=incident_id).delete()
        return None
    done = {"events": 0, "chunks": 0, "partition": 0, "files": 0}
    if connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            done["partition"] = int(drop_incident_partition(incident_id))
    with transaction.atomic():
        done["events"] = Event.objects.filter(incident_id=incident_id)._raw_delete(
            Event.objects.db)
        done["chunks"] = BodyChunk.objects.filter(incident_id=incident_id)._raw_delete(
            BodyChunk.objects.db)
        from ..detections.models import DetectionMatch  # which Falco rules matched its events

        DetectionMatch.objects.filter(incident_id=incident_id)._raw_delete(
            DetectionMatch.objects.db)
    done["files"] = _remove_files(purge)
    from ..store import columns  # numpy only where it is used (see timelines.reads.queries)

    columns.discard(incident_id)
    IncidentPurge.objects.filter(pk=incident_id).delete()
    log.info("purged incident %s: %s", incident_id, done)
    return done


# The Celery task that runs ``purge_incident`` (``timelines.tasks``), queued by name: the tasks
# import the ingest package, which must not import them back.
PURGE_TASK = "timelines.tasks.purge_incident_task"


def enqueue_purge(incident_id: int) -> None:
    """Purge a deleted incident's evidence once the current transaction commits: on a Celery
    worker when a broker is configured, else in a thread of this process."""
    if settings.CELERY_BROKER_URL:
        from celery import current_app

        transaction.on_commit(lambda: current_app.send_task(PURGE_TASK, args=[incident_id]))
        return
    transaction.on_commit(lambda: _start_purge_thread(incident_id))


def _start_purge_thread(incident_id: int) -> None:
    def run() -> None:
        try:
            purge_incident(incident_id)
        except Exception:  # the IncidentPurge row stays: requeue_lost runs it again
            log.exception("purge of incident %s failed", incident_id)
        finally:
            connection.close()

    threading.Thread(target=run, name=f"purge-{incident_id}", daemon=True).start()


def requeue_lost(enqueue: Callable[[int], None]) -> int:
    """``enqueue(incident_id)`` each purge queued more than ``LOST_AFTER`` ago and still listed;
    returns how many. A compare-and-set on ``queued_at`` keeps two sweeps from queuing one twice.
    """
    count = 0
    now = timezone.now()
    for incident_id, queued_at in IncidentPurge.objects.filter(
            queued_at__lt=now - LOST_AFTER).values_list("pk", "queued_at"):
        if IncidentPurge.objects.filter(pk=incident_id, queued_at=queued_at).update(
                queued_at=now):
            enqueue(incident_id)
            count += 1
    return count


def _remove_files(purge: IncidentPurge) -> int:
    """Remove the uploaded files and bundle work directories still on disk; returns how many
    there were. The bundle work directories are found here, in the process that unpacks them."""
    removed = 0
    for name in purge.files:
        path = Path(name)
        if path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
        # Each upload has a folder of its own, named by a UUID (ingest.uploads.create_upload):
        # remove it too if nothing else is in it.
        if UPLOAD_FOLDER.fullmatch(path.parent.name):
            try:
                path.parent.rmdir()
            except OSError:
                pass
    for upload_id in purge.uploads:
        folder = work_dir(Upload(pk=upload_id))
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed
