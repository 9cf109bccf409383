"""A diagnose bundle as uploads: one child upload per file inside, each ingested on its own.

``unpack_upload`` extracts the bundle safely (``ingest.unpacker``) into a work directory next to
the uploads and makes a child ``Upload`` for every file: ``pending`` for files a parser may read
(with the layout's hints: component, node, year), ``skipped`` for links and device files (refused
for safety: they hold no evidence of their own) and, set by the pipeline, for files that hold
nothing we read, ``failed`` for entries that could not be read (a name escaping the bundle, a
limit, a corrupt archive). The children
are independent uploads, so several workers share a large bundle. ``finish_bundle`` closes the
bundle when its last file has finished: counts summed, the first problems collected, the work
directory removed.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from incidents.models import Upload

from ..parsers.base import MAX_KEPT_ERRORS
from .unpacker import Limits, unpack

PROGRESS_SECONDS = 1.0
# Refusals of entries that are not files of their own: a link points at another file (or outside
# the bundle), a device has no content. Refused for safety, they lose no evidence: ``skipped``.
SKIPPED_REFUSALS = frozenset(("symlink", "hardlink", "device file"))


def work_dir(upload: Upload) -> Path:
    return Path(settings.UPLOAD_DIR) / f"bundle-{upload.pk}"


def remove_work_dir(upload: Upload) -> None:
    shutil.rmtree(work_dir(upload), ignore_errors=True)


def free_files(upload: Upload) -> dict:
    """Remove what Hindsight keeps on disk for ``upload``: a top-level upload's bundle work
    directory (also of one that failed before it was known as a bundle) and Hindsight's own copy
    of its file, which may hold secrets. Returns the row's fields that say the copy is gone.

    Every path that ends an upload calls this *before* it writes the outcome, so that an upload
    reported finished never still occupies the disk (the handles of the unpacked members and of
    the writer are closed by then: each is opened in a ``with`` of the code that raised)."""
    if upload.parent_id is None:
        remove_work_dir(upload)
    if upload.path_is_copy and upload.path:
        Path(upload.path).unlink(missing_ok=True)
        return {"path": ""}
    return {}


def unpack_upload(upload: Upload) -> list[int]:
    """Unpack a bundle upload into child uploads; returns the ids of those still to ingest.

    Run again for the same bundle (a redelivered task), it starts over from the archive: the
    children of the earlier attempt and their extracted files are removed first (their stored
    events stay, and the idempotent merge makes ingesting them again harmless).
    """
    workdir = work_dir(upload)
    upload.files.all().delete()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    limits = Limits(max_total_bytes=settings.BUNDLE_MAX_BYTES,
                    max_files=settings.BUNDLE_MAX_FILES,
                    max_ratio=settings.BUNDLE_MAX_RATIO)
    children = []
    total = 0
    for member in unpack(Path(upload.path), workdir, limits):
        child = Upload(
            incident_id=upload.incident_id, parent=upload, name=member.name[:1000],
            uploaded_by_id=upload.uploaded_by_id, path_is_copy=True,
            bytes_total=member.size, hints=_hints(member.hints),
        )
        if member.refused in SKIPPED_REFUSALS:
            child.status = Upload.Status.SKIPPED
            child.stage = Upload.Stage.COMPLETE
            child.message = f"{member.refused}, not extracted"
            child.finished_at = timezone.now()
        elif member.refused:
            child.status = Upload.Status.FAILED
            child.stage = Upload.Stage.COMPLETE
            child.message = f"{member.name}: {member.refused}"
            child.errors = [child.message]
            child.finished_at = timezone.now()
        else:
            child.path = str(member.path)
            total += member.size
        children.append(child)
    with transaction.atomic():
        Upload.objects.bulk_create(children, batch_size=1000)
        Upload.objects.filter(pk=upload.pk).update(
            format="bundle", bytes_total=total, bytes_read=0, heartbeat_at=timezone.now())
    return list(upload.files.filter(status=Upload.Status.PENDING)
                .order_by("pk").values_list("pk", flat=True))


def _hints(hints) -> dict:
    """ParseHints as JSON for the upload row."""
    stored = {k: v for k, v in dataclasses.asdict(hints).items() if v not in ("", None)}
    if stored.get("collected") is not None:
        stored["collected"] = stored["collected"].isoformat()
    return stored


def finish_bundle(bundle_id: int, *, file_finished: bool = True) -> bool:
    """Close the bundle if all its files have finished; True if this call closed it.

    Safe to call after every file from any worker: only the call that moves the bundle from
    stage ``reading`` to ``ready`` (a compare-and-set; ``done`` comes with the incident's
    completion, like its files') or to ``failed`` does the closing work. ``file_finished=False``
    (a sweep, not a file) leaves the bundle's progress and heartbeat as they are.
    """
    files = Upload.objects.filter(parent_id=bundle_id)
    if files.filter(Q(status=Upload.Status.PENDING)
                    | Q(status=Upload.Status.RUNNING, stage=Upload.Stage.READING)).exists():
        if file_finished:
            _update_progress(bundle_id)
        return False
    totals = files.aggregate(event_count=Sum("event_count"), new_events=Sum("new_events"),
                             skipped_lines=Sum("skipped_lines"), redacted=Sum("redacted"),
                             bytes_read=Sum("bytes_total"))
    errors: list[str] = []
    for file_errors in files.exclude(errors=[]).values_list("errors", flat=True):
        errors.extend(file_errors[: MAX_KEPT_ERRORS - len(errors)])
        if len(errors) >= MAX_KEPT_ERRORS:
            break
    failed = files.filter(status=Upload.Status.FAILED).count()
    usable = files.filter(Q(status=Upload.Status.DONE) | Q(status=Upload.Status.RUNNING,
                                                           stage=Upload.Stage.READY)).count()
    message = ""
    if failed:
        message = f"{failed} of {files.count()} files failed"
    if not usable:
        message = message or "no file in the bundle holds evidence Hindsight reads"
    bundle = Upload.objects.filter(pk=bundle_id, status=Upload.Status.RUNNING,
                                   stage=Upload.Stage.READING).first()
    if bundle is None:
        return False
    # Its files are all finished: nobody reads the work directory any more. Freed first, so
    # that the bundle is never reported finished while it still occupies the disk.
    freed = free_files(bundle)
    closed = Upload.objects.filter(pk=bundle_id, status=Upload.Status.RUNNING,
                                   stage=Upload.Stage.READING).update(
        status=Upload.Status.RUNNING if usable else Upload.Status.FAILED,
        stage=Upload.Stage.READY if usable else Upload.Stage.COMPLETE,
        message=message, errors=errors, finished_at=timezone.now(), heartbeat_at=timezone.now(),
        **freed, **{k: v or 0 for k, v in totals.items()},
    )
    return bool(closed)


def bundle_progress(bundle_id: int) -> None:
    """After a file of a bundle that cannot close yet (its files are loaded into a bulk load,
    ``reading`` until the load ends, which closes it): only the bundle's progress."""
    _update_progress(bundle_id)


# bundle id → when this process last wrote its progress (time.monotonic)
_progress_written: dict[int, float] = {}


def _update_progress(bundle_id: int) -> None:
    """The bundle's progress is its finished files' bytes; also its heartbeat, so that a bundle
    whose files are busy on other workers is not taken for lost. At most once a second: a bundle
    of thousands of small files would otherwise sum its files after each one. A process that
    wrote it less than a second ago does not even ask the database (a query per small file)."""
    now = time.monotonic()
    if now - _progress_written.get(bundle_id, -PROGRESS_SECONDS) < PROGRESS_SECONDS:
        return
    if len(_progress_written) > 1000:
        _progress_written.clear()
    _progress_written[bundle_id] = now
    recent = timezone.now() - timedelta(seconds=PROGRESS_SECONDS)
    if Upload.objects.filter(pk=bundle_id, heartbeat_at__gt=recent).exists():
        return
    finished = Upload.objects.filter(parent_id=bundle_id).exclude(
        Q(status=Upload.Status.PENDING)
        | Q(status=Upload.Status.RUNNING, stage=Upload.Stage.READING))
    done = finished.aggregate(bytes=Sum("bytes_total"), event_count=Sum("event_count"))
    Upload.objects.filter(pk=bundle_id, status=Upload.Status.RUNNING,
                          stage=Upload.Stage.READING).update(
        bytes_read=done["bytes"] or 0, event_count=done["event_count"] or 0,
        heartbeat_at=timezone.now())
