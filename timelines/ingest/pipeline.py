"""One upload from claim to finish: parse its file in this thread, write batches in another.

Parsing (Python, GIL) and writing (mostly waiting on the database) overlap; at most one batch
waits between them, which bounds memory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
)
from django.db.models import F, Q
from django.utils import timezone

from incidents.models import IncidentGone, Upload

from ..parsers import (
    InputError,
    ParseHints,
    Redactor,
    Report,
    Row,
    describe_unknown,
    detect,
    read_head,
)
from ..parsers.base import CopyRows
from .bundle import bundle_progress, finish_bundle, free_files, remove_work_dir, unpack_upload
from .store import (
    CHUNK_ROWS,
    ChunkIds,
    analyze_incident,
    copy_affixes,
    replace_nul,
    write_copy,
    write_rows,
)
from .unpacker import is_bundle
from .years import IncidentEvidence, record_guess

log = logging.getLogger(__name__)

BATCH_ROWS = 2000
PROGRESS_SECONDS = 1.0
ANALYZE_AFTER_ROWS = 50_000
THREAD_MIN_BYTES = 8 * 1024**2

# --- entry points ------------------------------------------------------------------------------

def ingest_upload(upload_id: int, claimant: str | None = None,
                  on_progress: Callable[[int, int, int], None] | None = None,
                  spawn: Callable[[list[int]], None] | None = None, *,
                  table: str | None = None, complete: bool = True,
                  reread: bool = True) -> Upload | None:
    """Ingest one upload; returns the row as it then is (None without ``reread``: a caller
    of a bundle's thousands of files that reads their outcome once, at the end, spares a query
    per file).

    Its events stored, the upload is ``running`` at stage ``ready`` (``Upload.Stage``). Then,
    with ``complete``, if it was the incident's last upload being read, the incident's
    analyses run here (``analysis.registry.complete_incident``) and its ready uploads become
    ``done``/``complete``; without, the caller completes the incident behind the first answer
    (the Celery task queues a task of its own; ``manage.py ingest`` a detached process).

    A bundle is unpacked into one child upload per file inside, which ``spawn(ids)`` ingests
    (Celery: one task each; default: one after another, here). The bundle finishes with its last
    file (``bundle.finish_bundle``).

    Claims the row with a compare-and-set so that only one worker ingests it: a pending upload,
    or one that this same claimant (a retried or redelivered task) or a lost worker (no heartbeat
    for ``UPLOAD_STALE_SECONDS``) left running. Returns None when the row is gone or another
    worker holds it. Database errors propagate for the caller to retry; bad input is an outcome
    (``failed`` with a message), never an exception.

    If the row is deleted while it is being ingested (its incident was deleted, or a redelivered
    bundle started over), the ingest stops at its next batch or progress report and returns None:
    no event is written for a deleted incident (``incidents.models.hold_incident``), and what
    this run may have unpacked after the incident's purge is removed.

    ``table``: COPY the rows into this load table of ``timelines.ingest.bulk`` (PostgreSQL)
    rather than merging them into the store; the load's end deduplicates and attaches them.
    """
    claimant = claimant or f"local-{uuid.uuid4()}"
    now = timezone.now()
    stale = now - timedelta(seconds=settings.UPLOAD_STALE_SECONDS)
    claimed = Upload.objects.filter(
        Q(status=Upload.Status.PENDING)
        | Q(status=Upload.Status.RUNNING, stage=Upload.Stage.READING)
        & (Q(claimed_by=claimant) | Q(heartbeat_at__lt=stale)),
        pk=upload_id,
    ).update(status=Upload.Status.RUNNING, stage=Upload.Stage.READING, claimed_by=claimant,
             started_at=now,
             heartbeat_at=now, attempts=F("attempts") + 1, message="")
    if not claimed:
        return None
    upload = Upload.objects.filter(pk=upload_id).first()
    if upload is None:
        return None
    refused = ""
    try:
        if upload.parent_id is None and (upload.format == "bundle" or is_bundle(Path(upload.path))):
            children = unpack_upload(upload)
            if spawn is None:
                for child in children:
                    ingest_upload(child, complete=False, reread=False)
            else:
                spawn(children)
            finish_bundle(upload.pk)
        else:
            _run(upload, on_progress, table)
            if upload.parent_id is not None and table is not None:
                # loaded files stay ``reading`` until the load ends, which closes the bundle
                bundle_progress(upload.parent_id)
            elif upload.parent_id is not None:
                finish_bundle(upload.parent_id)
    except Exception as exc:
        # An error caused by the row's deletion (IncidentGone, UploadGone, or one of their
        # consequences: children of a deleted incident refused at commit, a file the purge
        # removed) ends the run: there is nobody left to tell.
        if isinstance(exc, IncidentGone | UploadGone) or not Upload.objects.filter(
                pk=upload_id).exists():
            _abandon(upload, exc)
            return None
        if is_data_error(exc):
            # What the database refused of this file will be refused again: an outcome, not a
            # retry (the events stored before it are kept).
            log.warning("upload %s: the database refused its data: %s", upload_id, exc)
            refused = (f"{upload.name}: the database refused its data: "
                       f"{type(exc).__name__}: {exc}".strip())
        else:
            # Leave the row claimable by the retry (same claimant) and let the caller decide.
            Upload.objects.filter(pk=upload_id, claimed_by=claimant).update(heartbeat_at=None)
            raise
    if refused:  # out of the except block: the failed run's frames and handles are released
        fail_upload(upload_id, refused)
    elif complete and table is None:
        from ..analysis.registry import complete_incident

        complete_incident(upload.incident_id)
    return Upload.objects.filter(pk=upload_id).first() if reread else None


class UploadGone(Exception):
    """The upload's row was deleted while it was being ingested."""


# Errors of the connection, not of what was sent: another try may succeed. psycopg's own are
# listed too: a COPY goes to psycopg directly, and its errors are not Django's. The one list of
# transient errors: the tasks retry these (``timelines.tasks``).
TRANSIENT_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError,
                    psycopg.InterfaceError)
# SQLSTATE classes of the server's passing troubles: connection (08), transaction rollback
# (40: deadlock, serialization), insufficient resources (53: disk full, too many connections),
# object not in prerequisite state (55: a lock not available), operator intervention (57:
# shutdown, cancel), system error (58). psycopg calls some other classes OperationalError too
# (54, program limit exceeded: a value too long for an index), which no retry would change.
_TRANSIENT_SQLSTATE_CLASSES = {"08", "40", "53", "55", "57", "58"}


def is_data_error(exc: BaseException) -> bool:
    """Whether the database refused what was sent (a value it cannot hold or index, a
    constraint), which sending it again would not change."""
    if not isinstance(exc, DatabaseError | psycopg.DatabaseError):
        return False
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate:
        return sqlstate[:2] not in _TRANSIENT_SQLSTATE_CLASSES
    return not isinstance(exc, TRANSIENT_ERRORS)


def _abandon(upload: Upload, exc: Exception) -> None:
    """The end of a run whose row was deleted. A top-level upload's row goes only with its
    incident: remove the bundle work directory that unpacking may have made again after the
    purge removed it. (A bundle's file leaves its directory alone: a bundle that started over
    unpacks into the same one.)"""
    log.info("upload %s (incident %s) was deleted while being ingested; stopped: %s",
             upload.pk, upload.incident_id, exc)
    if upload.parent_id is None:
        remove_work_dir(upload)


def fail_upload(upload_id: int, message: str) -> None:
    """Mark an upload failed (unless it finished meanwhile), having first deleted Hindsight's copy
    of its file, which may hold secrets, and a bundle's unpacked files (``bundle.free_files``):
    once ``failed`` is written, nothing of the upload is left on disk. An upload whose events
    are stored (stage ``ready``) is not failed by what happens after: the analyses' failures
    are logged, and the readers compute what they need themselves."""
    upload = Upload.objects.filter(pk=upload_id).exclude(status=Upload.Status.DONE).exclude(
        stage=Upload.Stage.READY).first()
    if upload is None:
        return
    freed = free_files(upload)
    changed = Upload.objects.filter(pk=upload_id).exclude(status=Upload.Status.DONE).exclude(
        stage=Upload.Stage.READY).update(status=Upload.Status.FAILED,
                                         stage=Upload.Stage.COMPLETE, message=message,
                                         finished_at=timezone.now(), **freed)
    if changed and upload.parent_id is not None:  # its bundle may have been waiting for it alone
        finish_bundle(upload.parent_id)


# --- one run -----------------------------------------------------------------------------------

def _run(upload: Upload, on_progress: Callable[[int, int, int], None] | None = None,
         table: str | None = None) -> None:
    path = Path(upload.path)
    if not path.is_file():
        _finish(upload, Upload.Status.FAILED, Report(upload.name),
                message=f"{upload.name}: the uploaded file is no longer on disk")
        return
    total = path.stat().st_size
    report = Report(upload.name)
    head = read_head(path)
    parser = detect(head, upload.name)
    fmt = parser.name if parser else ""
    if total >= THREAD_MIN_BYTES:
        # what the upload's progress shows while it is read; a small file (a bundle holds
        # thousands) is read in a moment, and its outcome says the same (``_finish``)
        Upload.objects.filter(pk=upload.pk).update(bytes_total=total, bytes_read=0,
                                                   event_count=0, format=fmt)
    if parser is None:
        reason = describe_unknown(path, head)
        if upload.parent_id is not None:  # a bundle's file that holds nothing we read: listed
            _finish(upload, Upload.Status.SKIPPED, report, message=reason, fmt=fmt, total=total)
        else:
            _finish(upload, Upload.Status.FAILED, report, fmt=fmt, total=total,
                    message=f"{upload.name}: not evidence Hindsight reads ({reason})")
        return
    # The rest of the incident gives a year to a log that has none of its own (read only then).
    hints = dataclasses.replace(_hints(upload.hints) or ParseHints(),
                                evidence=IncidentEvidence(upload.incident_id, (upload.pk,)))
    redactor = Redactor(settings.REDACT_EXTRA_PATHS, enabled=settings.REDACT)
    progress = _Progress(upload.pk, report, total, on_progress)
    # A writer thread has its own connection, which cannot see rows of a transaction that the
    # caller holds open (tests, nested use): then write inline. A small file is written inline
    # too: a thread and a connection of its own cost more than the overlap gains (a bundle holds
    # thousands of small files).
    threaded = total >= THREAD_MIN_BYTES and not connection.in_atomic_block
    writer = _BatchWriter(upload.incident_id, upload.pk, threaded=threaded, table=table)
    parse = parser.parse
    if parser.parse_copy is not None and connection.vendor == "postgresql":
        # Most rows come already in COPY format, with their body chunks' ids reserved here.
        head, mid = copy_affixes(upload.incident_id, upload.pk, report.source)
        parse = functools.partial(parser.parse_copy, copy_head=head, copy_mid=mid,
                                  next_chunk_id=ChunkIds().next, chunk_rows=CHUNK_ROWS)
    writer.start()
    try:
        with path.open("rb") as handle:
            batch: list[Row] = []
            for row in parse(handle, report, redactor, progress=progress.parsed, hints=hints):
                if type(row) is CopyRows:
                    writer.put(row)
                    continue
                batch.append(row)
                if len(batch) >= BATCH_ROWS:
                    writer.put(batch)
                    batch = []
            if batch:
                writer.put(batch)
        writer.finish()
    except InputError as exc:
        writer.finish()
        writer.note_replaced(report)
        _finish(upload, Upload.Status.FAILED, report, message=str(exc),
                rows=progress.rows, new=writer.new_rows, fmt=fmt, total=total)
        return
    except BaseException:
        writer.abandon()
        raise
    writer.note_replaced(report)
    progress.parsed(total, progress.rows)
    _finish(upload, Upload.Status.DONE, report, rows=progress.rows, new=writer.new_rows,
            bytes_read=total, table=table, fmt=fmt, total=total)
    if (connection.vendor == "postgresql" and table is None
            and writer.new_rows >= ANALYZE_AFTER_ROWS):
        # Fresh statistics now, not whenever autovacuum comes by: without them the planner
        # misjudges the first queries of a new incident (measured: 64-146 ms instead of 2 ms).
        analyze_incident(upload.incident_id)


def _hints(stored: dict) -> ParseHints | None:
    """ParseHints from their JSON form on the upload row."""
    if not stored:
        return None
    fields = {k: v for k, v in stored.items() if k in ParseHints.__dataclass_fields__}
    if isinstance(fields.get("collected"), str):
        fields["collected"] = datetime.fromisoformat(fields["collected"])
    return ParseHints(**fields)


def _finish(upload: Upload, status: str, report: Report, *, message: str = "", rows: int = 0,
            new: int = 0, bytes_read: int | None = None, table: str | None = None,
            fmt: str | None = None, total: int | None = None) -> None:
    """The end of reading a file. ``status`` done means stored: the row says ``running`` at
    stage ``ready`` (``done`` comes with ``complete``, after the analyses), or, loaded into a
    bulk load ``table``, still ``reading`` until the load is attached (``bulk.finish_load``)."""
    stage = Upload.Stage.COMPLETE
    if status == Upload.Status.DONE:
        status = Upload.Status.RUNNING
        stage = Upload.Stage.READING if table is not None else Upload.Stage.READY
    fields = dict(status=status, stage=stage, message=message, event_count=rows, new_events=new,
                  skipped_lines=report.skipped, redacted=report.redacted, errors=report.errors,
                  notes=report.notes, finished_at=timezone.now(), heartbeat_at=timezone.now(),
                  hints=record_guess(upload.hints, report.year_guess))
    if bytes_read is not None:
        fields["bytes_read"] = bytes_read
    elif total is not None:
        fields["bytes_read"] = 0
    if fmt is not None:  # the file was opened: what it is (and its size) are known
        fields.update(format=fmt, bytes_total=total)
    # The original may hold secrets; what is kept is the redacted evidence in the store. Removed
    # before the outcome is written (``bundle.free_files``).
    fields.update(free_files(upload))
    Upload.objects.filter(pk=upload.pk).update(**fields)


class _Progress:
    """Writes bytes read and rows so far to the upload row (and tells ``on_progress(bytes_read,
    bytes_total, rows)``) at most once a second; for a large file (``THREAD_MIN_BYTES``) at its
    first report too: a 160 MB audit log is read in a second here, and waiting a second first
    showed 0 bytes read until it was done (and left the fault tests no moment mid-way). A small
    file is read in a moment and its outcome says the same (``_finish``): a row written at its
    first report too was a query more for each of a bundle's thousands of files."""

    def __init__(self, upload_id: int, report: Report, total: int,
                 on_progress: Callable[[int, int, int], None] | None = None) -> None:
        self.upload_id = upload_id
        self.report = report
        self.total = total
        self.on_progress = on_progress
        self.rows = 0
        # the first report of a large file is written
        self.last = -PROGRESS_SECONDS if total >= THREAD_MIN_BYTES else time.monotonic()

    def parsed(self, bytes_read: int, rows: int) -> None:
        self.rows = rows
        now = time.monotonic()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        if not Upload.objects.filter(pk=self.upload_id).update(
                bytes_read=bytes_read, event_count=rows, skipped_lines=self.report.skipped,
                redacted=self.report.redacted, heartbeat_at=timezone.now()):
            raise UploadGone(f"upload {self.upload_id} was deleted")
        if self.on_progress is not None:
            self.on_progress(bytes_read, self.total, rows)


class _BatchWriter:
    """Writes batches in a thread of its own, so that the parser keeps going meanwhile.

    At most one batch waits in the queue, which bounds memory. An error in the thread is raised
    again in the caller at the next ``put`` or at ``finish``.
    """

    def __init__(self, incident_id: int, upload_id: int, threaded: bool = True,
                 table: str | None = None) -> None:
        self.threaded = threaded
        self.table = table
        self.incident_id = incident_id
        self.upload_id = upload_id
        self.queue: queue.Queue[list[Row] | CopyRows | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.new_rows = 0
        # Once a batch met stored requests (a re-ingest, overlapping files), later ones likely
        # will too: stop trying the straight COPY.
        self.optimistic = True
        self.stopped = False  # by abandon()
        self.nul_replaced = 0  # values that held a NUL (store.replace_nul)
        self.thread = threading.Thread(target=self._loop, name="hindsight-writer", daemon=True)

    def start(self) -> None:
        if self.threaded:
            self.thread.start()

    def put(self, batch: list[Row] | CopyRows) -> None:
        if not self.threaded:
            self._write(batch)
            return
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.queue.put(batch, timeout=0.5)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        """Write what is queued, end the thread, and raise its error if it had one."""
        self._end()
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        """Stop after the batch being written, dropping those queued (the run failed; a retry
        writes them again), and wait for the thread to end: none outlives its run, holding a
        connection, waiting for a batch that never comes."""
        self.stopped = True
        self._end()

    def _end(self) -> None:
        """Give the thread its stop marker, however full the queue, and wait for it to end. A
        thread that ended already (or never started) takes no marker: nothing would take it."""
        if not self.threaded:
            return
        while self.thread.is_alive():
            try:
                self.queue.put(None, timeout=0.5)
                break
            except queue.Full:  # the thread is busy with a batch; it will take the next
                continue
        if self.thread.ident is not None:
            self.thread.join()

    def note_replaced(self, report: Report) -> None:
        """Say on the upload how many values held a NUL, which the store cannot hold."""
        if self.nul_replaced:
            report.notes.append(
                f"{self.nul_replaced:,} values held a NUL character, which the store cannot "
                "hold: each NUL was replaced by U+FFFD (\ufffd)")

    def _write(self, batch: list[Row] | CopyRows) -> None:
        if type(batch) is not CopyRows:
            batch, replaced = replace_nul(batch)
            self.nul_replaced += replaced
        write = write_copy if type(batch) is CopyRows else write_rows
        new = write(self.incident_id, self.upload_id, batch, optimistic=self.optimistic,
                    table=self.table)
        self.new_rows += new
        if new < (batch.rows if type(batch) is CopyRows else len(batch)):
            self.optimistic = False

    def _loop(self) -> None:
        try:
            while (batch := self.queue.get()) is not None:
                if self.error is None and not self.stopped:
                    self._write(batch)
        except BaseException as exc:  # reported to the parsing thread
            self.error = exc
            while self.queue.get() is not None:  # drain so that put() never blocks forever
                pass
        finally:
            close_old_connections()
            connection.close()
