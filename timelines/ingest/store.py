"""The writer of the event store: batches of rows merged into ``timelines_event``.

A batch's bodies are compressed into ``BodyChunk`` rows and the rows merged on the identity
``(incident, received, audit_id)``. On PostgreSQL a batch is first COPYed straight into the table
(right whenever none of its rows is stored yet); if any is, it is COPYed into a temporary staging
table and merged with one ``INSERT … SELECT … ON CONFLICT`` (COPY itself has no ON CONFLICT). On
SQLite the same merge runs as ``INSERT … VALUES … ON CONFLICT`` per row.

The merge rule makes ingest idempotent and order-free: a stored row is replaced only by a later
stage of the same request (an open span by its completion) or a later sighting of the same
evidence, so ingesting the same content again changes nothing and every event keeps its id.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence

import orjson
import psycopg
from django.db import IntegrityError, connection, transaction

from incidents.models import Incident

from ..models import BodyChunk, Event
from ..parsers import Row
from ..parsers.audit import STAGE_RANK

CHUNK_ROWS = 500  # events per compressed body chunk: small enough to read one event quickly

# Columns the parsers fill, in Row order, without ``raw`` (which goes to the body chunks).
ROW_COLUMNS = [f for f in Row._fields if f != "raw"]
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



def write_rows(incident_id: int, upload_id: int | None, rows: Sequence[Row], *,
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


def _latest_per_request(rows: Sequence[Row]) -> Sequence[Row]:
    """One row per request identity, the latest stage winning. A batch rarely repeats a request
    (a file holding the same lines twice), but one INSERT … ON CONFLICT must not touch a row
    twice."""
    latest: dict[tuple[str, object], Row] = {}
    for row in rows:
        key = (row.audit_id, row.received)
        kept = latest.get(key)
        if kept is None or STAGE_RANK.get(row.stage, 2) >= STAGE_RANK.get(kept.stage, 2):
            latest[key] = row
    return rows if len(latest) == len(rows) else list(latest.values())


def _write_chunks(incident_id: int, upload_id: int | None, rows: Sequence[Row]) -> list[int]:
    ids = []
    for start in range(0, len(rows), CHUNK_ROWS):
        data = zlib.compress(b"\n".join(r.raw for r in rows[start:start + CHUNK_ROWS]), 1)
        ids.append(BodyChunk.objects.create(incident_id=incident_id, upload_id=upload_id,
                                            data=data).pk)
    return ids


def _values(incident_id: int, upload_id: int | None, rows: Sequence[Row],
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
# Text columns of Row, COPYed as one tab-joined run (see _copy_text).
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


def _copy_text(incident_id: int, upload_id: int | None, rows: Sequence[Row],
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


def _merge_generic(incident_id: int, upload_id: int | None, rows: Sequence[Row],
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


def delete_incident_events(incident: Incident) -> None:
    """Remove an incident's evidence in bulk (the event table has no cascading foreign keys)."""
    Event.objects.filter(incident=incident)._raw_delete(Event.objects.db)
    BodyChunk.objects.filter(incident=incident)._raw_delete(BodyChunk.objects.db)
