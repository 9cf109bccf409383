"""Making an upload: the row the user follows, and where its file lies.

Two ways in, one place: ``create_upload`` for a file sent to the server (the API and the
incident page: moved into a folder of its own under ``UPLOAD_DIR``, deleted with the upload),
``create_local_upload`` for a file read where it lies (``manage.py ingest``, tests: never
copied, never deleted). Neither starts the ingest: the caller queues it
(``timelines.tasks.enqueue_ingest``, in the same transaction) or runs it (``ingest_upload``).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError

from incidents.models import Incident, IncidentGone, Upload, writing

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
