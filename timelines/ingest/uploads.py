"""Making an upload: the row the user follows, and where its file lies.

Two ways in, one place: ``create_upload`` for a file sent to the server (the API and the
incident page: moved into a folder of its own under ``UPLOAD_DIR``, deleted with the upload),
``create_local_upload`` for a file read where it lies (``manage.py ingest``, tests: never
copied, never deleted). Neither starts the ingest: the caller queues it
(``timelines.tasks.enqueue_ingest``, in the same transaction) or runs it (``ingest_upload``).

And the end of an upload whose worker was lost: ``requeue_stale``, the sweep the beat runs,
gives it to a new worker or fails it after ``UPLOAD_MAX_ATTEMPTS``; ``lost_too_often``, the
same limit for a task delivered again after its worker died.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError
from django.db.models import Q
from django.utils import timezone

from incidents.models import Incident, IncidentGone, Upload, writing

from .bundle import finish_bundle
from .pipeline import fail_upload

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def create_upload(incident: Incident, received, user, *, idempotency_key: str = "") -> Upload:
    """An upload row for a file received by the server (a Django ``UploadedFile``: streamed to
    a temporary file, or in memory when small), moved into a new folder of the upload
    directory (named by a UUID; ``purge`` removes it with the incident). If the row cannot be
    made (a repeated ``idempotency_key``: ``IntegrityError``; ``IncidentGone``: the incident
    was deleted meanwhile), the file is removed again and the error raised."""
    name = Path(received.name or "upload").name[:200] or "upload"
    folder = Path(settings.UPLOAD_DIR) / uuid.uuid4().hex
    try:
        with writing(incident.pk):
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / (SAFE_NAME.sub("_", name) or "upload")
            if hasattr(received, "temporary_file_path"):
                shutil.move(received.temporary_file_path(), target)
            else:
                with target.open("wb") as out:
                    for chunk in received.chunks():
                        out.write(chunk)
            return Upload.objects.create(incident=incident, name=name, path=str(target),
                                         path_is_copy=True, uploaded_by=user,
                                         bytes_total=target.stat().st_size,
                                         idempotency_key=idempotency_key)
    except (IntegrityError, IncidentGone):
        shutil.rmtree(folder, ignore_errors=True)
        raise


def create_local_upload(incident: Incident, path: str | os.PathLike, user=None) -> Upload:
    """An upload row for a file read in place (not copied, not deleted afterwards)."""
    path = Path(path)
    return Upload.objects.create(incident=incident, name=path.name, path=str(path.resolve()),
                                 path_is_copy=False, uploaded_by=user,
                                 bytes_total=path.stat().st_size if path.is_file() else 0)


def requeue_stale(enqueue: Callable[[int], None],
                  complete: Callable[[int], None] | None = None) -> int:
    """Give uploads whose worker was lost (no heartbeat for ``UPLOAD_STALE_SECONDS``) to a new
    worker (``enqueue(upload_id)``), or fail them after ``UPLOAD_MAX_ATTEMPTS``, so that none
    stays ``running`` forever; and start again (``complete(incident_id)``) the analyses of
    incidents whose ``ready`` uploads stopped beating (``analysis.registry``). Returns how many
    were requeued or failed."""
    stale = timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS)
    count = 0
    if complete is not None:
        waiting = Upload.objects.filter(status=Upload.Status.RUNNING, stage=Upload.Stage.READY,
                                        heartbeat_at__lt=stale)
        for incident_id in set(waiting.values_list("incident_id", flat=True)):
            # its lost run's claim given up (analysis.registry._claim)
            if waiting.filter(incident_id=incident_id).update(heartbeat_at=timezone.now(),
                                                              analyses={}):
                count += 1
                complete(incident_id)
    # An unpacked bundle is not lost while its files are being ingested: its files are watched
    # one by one, and the last to finish closes it; close any whose closing was missed.
    for bundle_id in Upload.objects.filter(status=Upload.Status.RUNNING, format="bundle",
                                           stage=Upload.Stage.READING, heartbeat_at__lt=stale,
                                           ).values_list("pk", flat=True):
        count += finish_bundle(bundle_id, file_finished=False)
    # A bundle's waiting files are not lost while the bundle moves (its heartbeat is fresh as
    # long as files finish): they are queued behind each other, not missing from the queue.
    waiting_too_long = Q(status=Upload.Status.PENDING, created_at__lt=stale, heartbeat_at=None) & (
        Q(parent=None) | Q(parent__heartbeat_at__lt=stale))
    # (A file read into a bulk load waits, read, for the load's end: not lost.)
    lost = Upload.objects.filter(
        Q(status=Upload.Status.RUNNING, stage=Upload.Stage.READING, finished_at=None)
        & (Q(heartbeat_at__lt=stale) | Q(heartbeat_at=None))
        | waiting_too_long
    ).exclude(format="bundle")
    for upload in lost.only("pk", "attempts", "status"):
        count += 1
        if upload.attempts >= settings.UPLOAD_MAX_ATTEMPTS:
            _fail_lost(upload.pk, upload.attempts)
            continue
        Upload.objects.filter(pk=upload.pk, status=upload.status).update(
            status=Upload.Status.PENDING, claimed_by="", heartbeat_at=timezone.now())
        enqueue(upload.pk)
    return count


def lost_too_often(upload_id: int, claimant: str | None) -> bool:
    """True, and the upload failed, if a task's earlier runs (``claimant``: its id) claimed it
    ``UPLOAD_MAX_ATTEMPTS`` times and none ended: still ``running``, claimed by this task, with
    the heartbeat that a run clears when it ends in an error to retry."""
    lost = Upload.objects.filter(
        pk=upload_id, status=Upload.Status.RUNNING, stage=Upload.Stage.READING,
        claimed_by=claimant or "-",
        heartbeat_at__isnull=False, attempts__gte=settings.UPLOAD_MAX_ATTEMPTS,
    ).values_list("attempts", flat=True).first()
    if lost is None:
        return False
    _fail_lost(upload_id, lost)
    return True


def _fail_lost(upload_id: int, attempts: int) -> None:
    fail_upload(upload_id, f"the ingest worker was lost {attempts} times; "
                           "the events stored so far are kept")
