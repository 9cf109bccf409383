"""The ingest pipeline: an upload's file into the event store. The only writer of events.

Shape of a run: the parser streams ``AuditRow``s; batches of them go to a writer thread, which
compresses their bodies into ``BodyChunk`` rows and merges the rows into ``timelines_event`` on the
request identity ``(incident, audit_id, received)``. Parsing (Python, GIL) and writing (mostly
waiting on the database) overlap. On PostgreSQL a batch is COPYed into a temporary staging table
and merged with one ``INSERT … SELECT … ON CONFLICT`` (COPY itself has no ON CONFLICT); on SQLite
the same merge runs as ``INSERT … VALUES … ON CONFLICT`` per row.

The merge rule makes ingest idempotent and order-free: an existing row is replaced only by a
later stage of the same request (an open span by its completion), so ingesting the same content
again changes nothing and every event keeps its id.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path

import orjson
import psycopg
from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from incidents.models import Incident, Upload

from .models import BodyChunk, Event
from .parsers import AuditRow, InputError, Redactor, Report, parse_audit
from .parsers.audit import STAGE_RANK

log = logging.getLogger(__name__)

BATCH_ROWS = 5_000
CHUNK_ROWS = 500  # events per compressed body chunk: small enough to read one event quickly
PROGRESS_SECONDS = 1.0
ANALYZE_AFTER_ROWS = 50_000

# Columns the parser fills, in AuditRow order, without ``raw`` (which goes to the body chunks).
ROW_COLUMNS = [f for f in AuditRow._fields if f != "raw"]
COLUMNS = ["incident_id", "upload_id", *ROW_COLUMNS, "body_chunk", "body_index"]
_STAGE_RANK_SQL = ("CASE {0}.stage WHEN 'RequestReceived' THEN 0 WHEN 'ResponseStarted' THEN 1 "
                   "ELSE 2 END")
# A stored row is replaced by a later stage of the same request, or by a later sighting of the
# same evidence (an Event seen again with a higher count and a later last time).
_UPDATE_SET = ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS if c != "incident_id")
_MERGE_WHERE = (f"({_STAGE_RANK_SQL.format('timelines_event')} < "
                f"{_STAGE_RANK_SQL.format('EXCLUDED')} OR "
                f"({_STAGE_RANK_SQL.format('timelines_event')} = "
                f"{_STAGE_RANK_SQL.format('EXCLUDED')} AND "
                f"EXCLUDED.completed > timelines_event.completed))")


# --- entry points ------------------------------------------------------------------------------

def ingest_upload(upload_id: int, claimant: str | None = None,
                  on_progress: Callable[[int, int, int], None] | None = None) -> Upload | None:
    """Ingest one upload, start to finish; returns the finished row.

    Claims the row with a compare-and-set so that only one worker ingests it: a pending upload,
    or one that this same claimant (a retried or redelivered task) or a lost worker (no heartbeat
    for ``UPLOAD_STALE_SECONDS``) left running. Returns None when the row is gone or another
    worker holds it. Database errors propagate for the caller to retry; bad input is an outcome
    (``failed`` with a message), never an exception.
    """
    claimant = claimant or f"local-{uuid.uuid4()}"
    now = timezone.now()
    stale = now - timedelta(seconds=settings.UPLOAD_STALE_SECONDS)
    claimed = Upload.objects.filter(
        Q(status=Upload.Status.PENDING)
        | Q(status=Upload.Status.RUNNING) & (Q(claimed_by=claimant) | Q(heartbeat_at__lt=stale)),
        pk=upload_id,
    ).update(status=Upload.Status.RUNNING, claimed_by=claimant, started_at=now,
             heartbeat_at=now, attempts=F("attempts") + 1, message="")
    if not claimed:
        return None
    upload = Upload.objects.filter(pk=upload_id).first()
    if upload is None:
        return None
    try:
        _run(upload, on_progress)
    except Exception:
        # Leave the row claimable by the retry (same claimant) and let the caller decide.
        Upload.objects.filter(pk=upload_id, claimed_by=claimant).update(heartbeat_at=None)
        raise
    return Upload.objects.filter(pk=upload_id).first()


def fail_upload(upload_id: int, message: str) -> None:
    """Mark an upload failed (unless it finished meanwhile) and delete Hindsight's copy of its
    file, which may hold secrets."""
    changed = Upload.objects.filter(pk=upload_id).exclude(status=Upload.Status.DONE).update(
        status=Upload.Status.FAILED, message=message, finished_at=timezone.now())
    upload = Upload.objects.filter(pk=upload_id, path_is_copy=True).exclude(path="").first()
    if changed and upload is not None:
        Path(upload.path).unlink(missing_ok=True)
        Upload.objects.filter(pk=upload_id).update(path="")


def delete_incident_events(incident: Incident) -> None:
    """Remove an incident's evidence in bulk (the event table has no cascading foreign keys)."""
    Event.objects.filter(incident=incident)._raw_delete(Event.objects.db)
    BodyChunk.objects.filter(incident=incident)._raw_delete(BodyChunk.objects.db)


# --- one run -----------------------------------------------------------------------------------

def _run(upload: Upload, on_progress: Callable[[int, int, int], None] | None = None) -> None:
    path = Path(upload.path)
    if not path.is_file():
        _finish(upload, Upload.Status.FAILED, Report(upload.name),
                message=f"{upload.name}: the uploaded file is no longer on disk")
        return
    total = path.stat().st_size
    Upload.objects.filter(pk=upload.pk).update(bytes_total=total, bytes_read=0, events=0)
    report = Report(upload.name)
    redactor = Redactor(settings.REDACT_EXTRA_PATHS, enabled=settings.REDACT)
    progress = _Progress(upload.pk, report, total, on_progress)
    # A writer thread has its own connection, which cannot see rows of a transaction that the
    # caller holds open (tests, nested use): then write inline.
    writer = _BatchWriter(upload.incident_id, upload.pk, threaded=not connection.in_atomic_block)
    writer.start()
    try:
        with path.open("rb") as handle:
            batch: list[AuditRow] = []
            for row in parse_audit(handle, report, redactor, progress=progress.parsed):
                batch.append(row)
                if len(batch) >= BATCH_ROWS:
                    writer.put(batch)
                    batch = []
            if batch:
                writer.put(batch)
        writer.finish()
    except InputError as exc:
        writer.finish()
        _finish(upload, Upload.Status.FAILED, report, message=str(exc),
                rows=progress.rows, new=writer.new_rows)
        return
    except BaseException:
        writer.abandon()
        raise
    progress.parsed(total, progress.rows)
    _finish(upload, Upload.Status.DONE, report, rows=progress.rows, new=writer.new_rows,
            bytes_read=total)
    if connection.vendor == "postgresql" and writer.new_rows >= ANALYZE_AFTER_ROWS:
        # Fresh statistics now, not whenever autovacuum comes by: without them the planner
        # misjudges the first queries of a new incident (measured: 64-146 ms instead of 2 ms).
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE timelines_event")


def _finish(upload: Upload, status: str, report: Report, *, message: str = "", rows: int = 0,
            new: int = 0, bytes_read: int | None = None) -> None:
    fields = dict(status=status, message=message, events=rows, new_events=new,
                  skipped_lines=report.skipped, redacted=report.redacted,
                  errors=report.errors, finished_at=timezone.now(), heartbeat_at=timezone.now())
    if bytes_read is not None:
        fields["bytes_read"] = bytes_read
    Upload.objects.filter(pk=upload.pk).update(**fields)
    if upload.path_is_copy and upload.path:
        # The original may hold secrets; what is kept is the redacted evidence in the store.
        Path(upload.path).unlink(missing_ok=True)
        Upload.objects.filter(pk=upload.pk).update(path="")


class _Progress:
    """Writes bytes read and rows so far to the upload row (and tells ``on_progress(bytes_read,
    bytes_total, rows)``), at most once a second."""

    def __init__(self, upload_id: int, report: Report, total: int,
                 on_progress: Callable[[int, int, int], None] | None = None) -> None:
        self.upload_id = upload_id
        self.report = report
        self.total = total
        self.on_progress = on_progress
        self.rows = 0
        self.last = 0.0

    def parsed(self, bytes_read: int, rows: int) -> None:
        self.rows = rows
        now = time.monotonic()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        Upload.objects.filter(pk=self.upload_id).update(
            bytes_read=bytes_read, events=rows, skipped_lines=self.report.skipped,
            redacted=self.report.redacted, heartbeat_at=timezone.now())
        if self.on_progress is not None:
            self.on_progress(bytes_read, self.total, rows)


class _BatchWriter:
    """Writes batches in a thread of its own, so that the parser keeps going meanwhile.

    At most one batch waits in the queue, which bounds memory. An error in the thread is raised
    again in the caller at the next ``put`` or at ``finish``.
    """

    def __init__(self, incident_id: int, upload_id: int, threaded: bool = True) -> None:
        self.threaded = threaded
        self.incident_id = incident_id
        self.upload_id = upload_id
        self.queue: queue.Queue[list[AuditRow] | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.new_rows = 0
        # Once a batch met stored requests (a re-ingest, overlapping files), later ones likely
        # will too: stop trying the straight COPY.
        self.optimistic = True
        self.thread = threading.Thread(target=self._loop, name="hindsight-writer", daemon=True)

    def start(self) -> None:
        if self.threaded:
            self.thread.start()

    def put(self, batch: list[AuditRow]) -> None:
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
        if not self.threaded:
            return
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        if not self.threaded:
            return
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass

    def _write(self, batch: list[AuditRow]) -> None:
        new = write_rows(self.incident_id, self.upload_id, batch, optimistic=self.optimistic)
        self.new_rows += new
        if new < len(batch):
            self.optimistic = False

    def _loop(self) -> None:
        try:
            while (batch := self.queue.get()) is not None:
                if self.error is None:
                    self._write(batch)
        except BaseException as exc:  # reported to the parsing thread
            self.error = exc
            while self.queue.get() is not None:  # drain so that put() never blocks forever
                pass
        finally:
            close_old_connections()
            connection.close()


# --- the merge ---------------------------------------------------------------------------------

def write_rows(incident_id: int, upload_id: int | None, rows: Sequence[AuditRow], *,
               optimistic: bool = True) -> int:
    """Merge rows into the store in one transaction; returns how many were new requests.

    ``optimistic``: on PostgreSQL, first try to COPY straight into the table, which is right
    whenever none of these requests is stored yet (a new upload) and fails as a whole on the
    unique request identity otherwise; then the batch is merged through the staging table.
    """
    rows = _latest_per_request(rows)
    with transaction.atomic():
        chunk_ids = _write_chunks(incident_id, upload_id, rows)
        if connection.vendor == "postgresql":
            text = _copy_text(incident_id, upload_id, rows, chunk_ids)
            if optimistic and _copy_new(text):
                return len(rows)
            return _merge_postgres(text, chunk_ids)
        return _merge_generic(incident_id, upload_id, rows, chunk_ids)


def _latest_per_request(rows: Sequence[AuditRow]) -> Sequence[AuditRow]:
    """One row per request identity, the latest stage winning. A batch rarely repeats a request
    (a file holding the same lines twice), but one INSERT … ON CONFLICT must not touch a row
    twice."""
    latest: dict[tuple[str, object], AuditRow] = {}
    for row in rows:
        key = (row.audit_id, row.received)
        kept = latest.get(key)
        if kept is None or STAGE_RANK.get(row.stage, 2) >= STAGE_RANK.get(kept.stage, 2):
            latest[key] = row
    return rows if len(latest) == len(rows) else list(latest.values())


def _write_chunks(incident_id: int, upload_id: int | None, rows: Sequence[AuditRow]) -> list[int]:
    ids = []
    for start in range(0, len(rows), CHUNK_ROWS):
        data = zlib.compress(b"\n".join(r.raw for r in rows[start:start + CHUNK_ROWS]), 1)
        ids.append(BodyChunk.objects.create(incident_id=incident_id, upload_id=upload_id,
                                            data=data).pk)
    return ids


def _values(incident_id: int, upload_id: int | None, rows: Sequence[AuditRow],
            chunk_ids: list[int], adapt_time: Callable, adapt_list: Callable) -> Iterable[tuple]:
    for index, row in enumerate(rows):
        yield (incident_id, upload_id, row.audit_id, adapt_time(row.received),
               adapt_time(row.completed) if row.completed is not None else None,
               row.duration_ms, row.verb, row.username, adapt_list(row.groups),
               row.impersonated_user, row.user_agent, row.source_ip, row.resource,
               row.subresource, row.namespace, row.name, row.api_group, row.api_version,
               row.object_uid, row.resource_version, row.code, row.level, row.stage,
               row.request_uri, orjson.dumps(row.annotations).decode(), row.source, row.line,
               row.kind, row.message, row.reason, row.severity, row.component, row.node,
               row.count, chunk_ids[index // CHUNK_ROWS], index % CHUNK_ROWS)


_STAGE_TABLE = "hindsight_stage"
# Text columns of AuditRow, COPYed as one tab-joined run (see _copy_text).
_TEXT_FIELDS = ["audit_id", "verb", "username", "impersonated_user", "user_agent", "source_ip",
                "resource", "subresource", "namespace", "name", "api_group", "api_version",
                "object_uid", "resource_version", "level", "stage", "request_uri", "source",
                "kind", "message", "reason", "severity", "component", "node"]
_COPY_COLUMNS = ["incident_id", "upload_id", *_TEXT_FIELDS, "received", "completed",
                 "duration_ms", "groups", "code", "annotations", "line", "count", "body_chunk",
                 "body_index"]
# PostgreSQL text cannot hold NUL: it is dropped (it never means anything in these fields).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r",
                               "\x00": ""})
_NULL = "\\N"


def _copy_text(incident_id: int, upload_id: int | None, rows: Sequence[AuditRow],
               chunk_ids: list[int]) -> str:
    """Rows in COPY text format, columns in ``_COPY_COLUMNS`` order.

    Formatting here is about four times cheaper than ``Copy.write_row`` per row, which matters:
    COPY formatting was the largest cost of a batch. Text fields are joined first and escaped
    only in the rare row that needs it.
    """
    head = f"{incident_id}\t{_NULL if upload_id is None else upload_id}\t"
    separators = len(_TEXT_FIELDS) - 1
    out = []
    for index, r in enumerate(rows):
        text = "\t".join((r.audit_id, r.verb, r.username, r.impersonated_user, r.user_agent,
                          r.source_ip, r.resource, r.subresource, r.namespace, r.name,
                          r.api_group, r.api_version, r.object_uid, r.resource_version, r.level,
                          r.stage, r.request_uri, r.source, r.kind, r.message, r.reason,
                          r.severity, r.component, r.node))
        if ("\\" in text or "\n" in text or "\r" in text or "\x00" in text
                or text.count("\t") != separators):
            text = "\t".join(getattr(r, f).translate(_COPY_ESCAPES) for f in _TEXT_FIELDS)
        groups = "{" + ",".join('"' + g.replace("\\", "\\\\").replace('"', '\\"') + '"'
                                for g in r.groups) + "}"
        annotations = orjson.dumps(r.annotations).decode()
        if "\\" in groups or "\\" in annotations or "\n" in groups or "\t" in groups:
            groups = groups.translate(_COPY_ESCAPES)
            # jsonb refuses the NUL escape as well
            annotations = annotations.replace("\\u0000", "").translate(_COPY_ESCAPES)
        out.append(
            f"{head}{text}\t{r.received.isoformat()}\t"
            f"{_NULL if r.completed is None else r.completed.isoformat()}\t"
            f"{_NULL if r.duration_ms is None else repr(r.duration_ms)}\t{groups}\t"
            f"{_NULL if r.code is None else r.code}\t{annotations}\t{r.line}\t"
            f"{_NULL if r.count is None else r.count}\t"
            f"{chunk_ids[index // CHUNK_ROWS]}\t{index % CHUNK_ROWS}\n"
        )
    return "".join(out)


def _copy_new(text: str) -> bool:
    """COPY rows straight into the event table; False (and nothing written) if any of them is
    stored already."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:  # a savepoint to fall back to
            cursor.execute("SET LOCAL synchronous_commit = off")
            with cursor.copy(f"COPY timelines_event ({', '.join(_COPY_COLUMNS)}) FROM STDIN") \
                    as copy:
                copy.write(text)
        return True
    except (IntegrityError, psycopg.errors.UniqueViolation):
        return False


def _merge_postgres(text: str, chunk_ids: list[int]) -> int:
    columns = ", ".join(COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE_TABLE} ON COMMIT DELETE ROWS AS "
                       f"SELECT {columns} FROM timelines_event WITH NO DATA")
        # ON COMMIT DELETE ROWS empties it only at a real commit: inside a caller's transaction
        # (inline writes) earlier batches' rows, of any incident, would be merged again (and
        # events deleted meanwhile brought back).
        cursor.execute(f"TRUNCATE {_STAGE_TABLE}")
        # Losing the last moments of an ingest to a crash is harmless (it is re-run and
        # idempotent), so do not wait for the WAL flush on every batch.
        cursor.execute("SET LOCAL synchronous_commit = off")
        with cursor.copy(f"COPY {_STAGE_TABLE} ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy:
            copy.write(text)
        cursor.execute(
            # ``replaced`` reads the rows as they were before the insert (one snapshot per
            # statement): the chunks of stages that a later stage is about to replace.
            f"WITH replaced AS ("
            f" SELECT DISTINCT e.body_chunk FROM {_STAGE_TABLE} s JOIN timelines_event e"
            f" ON e.incident_id = s.incident_id AND e.received = s.received"
            f" AND e.audit_id = s.audit_id"
            f" WHERE {_STAGE_RANK_SQL.format('e')} < {_STAGE_RANK_SQL.format('s')}),"
            f" merged AS ("
            f" INSERT INTO timelines_event ({columns})"
            f" SELECT {columns} FROM {_STAGE_TABLE}"
            f" ON CONFLICT (incident_id, received, audit_id) DO UPDATE SET {_UPDATE_SET}"
            f" WHERE {_MERGE_WHERE}"
            f" RETURNING (xmax = 0) AS inserted, body_chunk)"
            f" SELECT count(*) FILTER (WHERE inserted), array_agg(DISTINCT body_chunk),"
            f" (SELECT array_agg(body_chunk) FROM replaced) FROM merged"
        )
        new, used, replaced = cursor.fetchone()
        unused = sorted(set(chunk_ids) - set(used or ()))
        if unused:
            cursor.execute("DELETE FROM timelines_bodychunk WHERE id = ANY(%s)", [unused])
        if replaced:
            _delete_orphan_chunks(cursor, [c for c in replaced if c is not None])
        return new


def _delete_orphan_chunks(cursor, candidates: list[int]) -> None:
    """Delete the chunks among ``candidates`` that no event points at any more (their events were
    completed by a later stage from another file). Rare, so a scan is affordable."""
    if candidates:
        cursor.execute(
            "DELETE FROM timelines_bodychunk c WHERE c.id = ANY(%s) AND NOT EXISTS"
            " (SELECT 1 FROM timelines_event e WHERE e.incident_id = c.incident_id"
            " AND e.body_chunk = c.id)", [candidates])


def _merge_generic(incident_id: int, upload_id: int | None, rows: Sequence[AuditRow],
                   chunk_ids: list[int]) -> int:
    """The SQLite path: same merge rule, row by row. Simpler and slower, correct."""
    columns = ", ".join(COLUMNS)
    placeholders = ", ".join(["%s"] * len(COLUMNS))
    ops = connection.ops
    before = Event.objects.filter(incident_id=incident_id).count()
    replaced = set(Event.objects.filter(
        incident_id=incident_id, audit_id__in={r.audit_id for r in rows}
    ).values_list("body_chunk", flat=True))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO timelines_event ({columns}) VALUES ({placeholders})"
            f" ON CONFLICT (incident_id, received, audit_id) DO UPDATE SET {_UPDATE_SET}"
            f" WHERE {_MERGE_WHERE}",
            list(_values(incident_id, upload_id, rows, chunk_ids,
                         ops.adapt_datetimefield_value, lambda v: orjson.dumps(v).decode())),
        )
    candidates = set(chunk_ids) | (replaced - {None})
    BodyChunk.objects.filter(pk__in=candidates).exclude(
        pk__in=Event.objects.filter(incident_id=incident_id, body_chunk__in=candidates)
        .values("body_chunk")).delete()
    return Event.objects.filter(incident_id=incident_id).count() - before


def _same(value):
    return value


# --- for manage.py ingest and tests ------------------------------------------------------------

def create_local_upload(incident: Incident, path: str | os.PathLike, user=None) -> Upload:
    """An upload row for a file read in place (not copied, not deleted afterwards)."""
    path = Path(path)
    return Upload.objects.create(incident=incident, name=path.name, path=str(path.resolve()),
                                 path_is_copy=False, uploaded_by=user,
                                 bytes_total=path.stat().st_size if path.is_file() else 0)
