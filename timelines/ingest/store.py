"""The writer of the event store: batches of rows merged into ``timelines_event``.

A batch's bodies are compressed into ``BodyChunk`` rows and the rows merged on the identity
``(incident, received, audit_id)``. On PostgreSQL a batch is first COPYed straight into the table
(right whenever none of its rows is stored yet); if any is, it is COPYed into a temporary staging
table and merged with one ``INSERT … SELECT … ON CONFLICT`` (COPY itself has no ON CONFLICT). On
SQLite the same merge runs as ``INSERT … VALUES … ON CONFLICT`` per row.

The merge rule (``MERGE_RULE``, one object for every write path: the two COPYs, SQLite and the
bulk load) makes ingest idempotent and order-free: a stored row is replaced only by a later
stage of the same request (an open span by its completion) or a later sighting of the same
evidence, so ingesting the same content again changes nothing and every event keeps its id.

Every batch first holds its incident's row (``incidents.models.hold_incident``): once an
incident's deletion has committed, no batch of it is written any more, which is what lets
``purge`` remove its events once, in the background.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

import orjson
import psycopg
from django.db import IntegrityError, connection, transaction

from incidents.models import hold_incident

from ..models import BodyChunk, Event
from ..parsers import Row
from ..parsers.audit import STAGE_RANK
from ..parsers.base import CopyRows

CHUNK_ROWS = 500  # events per compressed body chunk: small enough to read one event quickly

# Columns the parsers fill, in Row order, without ``raw`` (which goes to the body chunks).
ROW_COLUMNS = [f for f in Row._fields if f != "raw"]
COLUMNS = ["incident_id", "upload_id", *ROW_COLUMNS, "body_chunk", "body_index"]


class MergeRule:
    """How two rows of the same request identity ``(incident, received, audit_id)`` become the
    one stored: from two files, two stages, or the same file twice. The newcomer replaces the
    kept row only when it is

    - a later stage of the request (``STAGE_RANK``: RequestReceived, ResponseStarted, then the
      final stages; a row without a stage, any other evidence, ranks as final), or
    - the same stage completed later (a completion over none: an Event seen again with a later
      last time);

    otherwise the row seen first stays (the same evidence again changes nothing, and every
    event keeps its id). Every write path applies this object: ``replaces`` in Python (the
    duplicates within a batch of rows), ``on_conflict`` and ``replaces_sql`` in SQL (every
    ``INSERT … ON CONFLICT``: the staging table's merge, SQLite's, the bulk load's; and which
    stored body chunks a merge replaces), ``keep_first_sql`` to pick one row of a group of
    duplicates (the staging table, the bulk load's table)."""

    identity = ("incident_id", "received", "audit_id")

    def rank(self, stage: str) -> int:
        return STAGE_RANK.get(stage, _FINAL_RANK)

    def replaces(self, new: Row, kept: Row) -> bool:
        """Whether ``new`` replaces ``kept`` (rows of the same identity)."""
        new_rank, kept_rank = self.rank(new.stage), self.rank(kept.stage)
        if new_rank != kept_rank:
            return new_rank > kept_rank
        return new.completed is not None and (kept.completed is None
                                              or new.completed > kept.completed)

    def rank_sql(self, alias: str) -> str:
        whens = " ".join(f"WHEN '{stage}' THEN {rank}" for stage, rank in STAGE_RANK.items()
                         if rank != _FINAL_RANK)
        return f"CASE {alias}.stage {whens} ELSE {_FINAL_RANK} END"

    def replaces_sql(self, new: str, kept: str) -> str:
        """``replaces`` as an SQL condition on two row aliases."""
        new_rank, kept_rank = self.rank_sql(new), self.rank_sql(kept)
        return (f"({kept_rank} < {new_rank} OR ({kept_rank} = {new_rank} AND"
                f" {new}.completed IS NOT NULL AND ({kept}.completed IS NULL"
                f" OR {new}.completed > {kept}.completed)))")

    def keep_first_sql(self, alias: str, seen: str) -> str:
        """ORDER BY terms that put first, among rows of one identity, the row the rule keeps:
        the latest stage, then the latest completion (a completion over none), then the first
        seen (``seen``: ascending in the order the rows came)."""
        return f"{self.rank_sql(alias)} DESC, {alias}.completed DESC NULLS LAST, {seen}"

    def on_conflict(self, table: str = "timelines_event") -> str:
        """The ``ON CONFLICT`` clause of an ``INSERT INTO table``: the rule, with every column
        but the incident taken from the newcomer."""
        update = ", ".join(f"{c} = EXCLUDED.{c}" if c != "annotations"
                           else f"annotations = {self._annotations_sql(table)}"
                           for c in COLUMNS if c != "incident_id")
        return (f"ON CONFLICT ({', '.join(self.identity)}) DO UPDATE SET {update}"
                f" WHERE {self.replaces_sql('EXCLUDED', table)}")


    @staticmethod
    def _annotations_sql(table: str) -> str:
        """The newcomer's annotations, keeping the state facts that the kept row carries
        (``analysis.statelinks``: their rows were folded into it and are gone)."""
        key = "linked_state"
        if connection.vendor == "postgresql":
            return (f"CASE WHEN {table}.annotations -> '{key}' IS NULL THEN EXCLUDED.annotations"
                    f" ELSE EXCLUDED.annotations || jsonb_build_object('{key}',"
                    f" {table}.annotations -> '{key}') END")
        return (f"CASE WHEN json_extract({table}.annotations, '$.{key}') IS NULL"
                f" THEN EXCLUDED.annotations ELSE json_set(EXCLUDED.annotations, '$.{key}',"
                f" json(json_extract({table}.annotations, '$.{key}'))) END")


_FINAL_RANK = max(STAGE_RANK.values())
MERGE_RULE = MergeRule()


def write_rows(incident_id: int, upload_id: int | None, rows: Sequence[Row], *,
               optimistic: bool = True, table: str | None = None,
               partition: str | None = None) -> int:
    """Merge rows into the store in one transaction; returns how many were new requests.

    ``optimistic``: on PostgreSQL, first try to COPY straight into the table, which is right
    whenever none of these requests is stored yet (a new upload) and fails as a whole on the
    unique request identity otherwise; then the batch is merged through the staging table.

    ``table``: on PostgreSQL, COPY into this load table instead (``timelines.ingest.bulk``),
    which has no unique index: its rows are deduplicated when the load finishes.

    ``partition``: on PostgreSQL, the leaf partition of ``timelines_event`` that holds the
    incident (a stream's slot table, ``streams.store``): the merge reads and writes it by name
    (see ``_merge_postgres``).
    """
    rows = _latest_per_request(replace_nul(rows)[0])
    with transaction.atomic():
        hold_incident(incident_id)
        chunk_ids = _write_chunks(incident_id, upload_id, rows)
        if connection.vendor == "postgresql":
            text = _copy_text(incident_id, upload_id, rows, chunk_ids)
            if table is not None:
                _copy_into(table, text)
                return len(rows)
            if optimistic and _copy_new(text):
                return len(rows)
            return _merge_postgres(text, chunk_ids, incident_id, partition)
        return _merge_generic(incident_id, upload_id, rows, chunk_ids)


def write_copy(incident_id: int, upload_id: int | None, batch: CopyRows, *,
               optimistic: bool = True, table: str | None = None) -> int:
    """``write_rows`` for rows in COPY format (PostgreSQL): their body chunks (ids reserved by
    ``ChunkIds``) and rows in one transaction; returns how many were new requests."""
    with transaction.atomic():
        hold_incident(incident_id)
        with connection.cursor() as cursor, cursor.copy(
                "COPY timelines_bodychunk (id, incident_id, upload_id, data) FROM STDIN"
                " (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "int8", "int8", "bytea"])
            for chunk_id, lines in batch.bodies:
                copy.write_row((chunk_id, incident_id, upload_id, BodyChunk.pack(lines)))
        if table is not None:
            _copy_into(table, batch.text)
            return batch.rows
        if optimistic and _copy_new(batch.text):
            return batch.rows
        return _merge_postgres(batch.text, [chunk_id for chunk_id, _ in batch.bodies],
                               incident_id)


class ChunkIds:
    """Ids for new body chunks, reserved from their sequence a few at a time, for rows that
    name their chunk before it is written (``CopyRows``). Uses the calling thread's
    connection."""

    RESERVE = 64

    def __init__(self) -> None:
        self.free: deque[int] = deque()

    def next(self) -> int:
        if not self.free:
            with connection.cursor() as cursor:
                cursor.execute("SELECT nextval(pg_get_serial_sequence('timelines_bodychunk', 'id'))"
                               " FROM generate_series(1, %s)", [self.RESERVE])
                self.free.extend(row[0] for row in cursor.fetchall())
        return self.free.popleft()


def copy_affixes(incident_id: int, upload_id: int | None, source: str) -> tuple[bytes, bytes]:
    """The constant parts of an audit row in COPY format around its per-request columns: those
    before ``audit_id`` and those between ``request_uri`` and ``received`` (the C scanner writes
    the rest; see ``_COPY_COLUMNS``)."""
    head = f"{incident_id}\t{_NULL if upload_id is None else upload_id}\t"
    mid = "\t".join(["", copy_escape(source), "audit", "", "", "", "", "", ""])
    return head.encode(), mid.encode()


def _latest_per_request(rows: Sequence[Row]) -> Sequence[Row]:
    """One row per request identity, the one ``MERGE_RULE`` keeps. A batch rarely repeats a
    request (a file holding the same lines twice), but one INSERT … ON CONFLICT must not touch
    a row twice."""
    latest: dict[tuple[str, datetime], Row] = {}
    for row in rows:
        key = (row.audit_id, row.received)
        kept = latest.get(key)
        if kept is None or MERGE_RULE.replaces(row, kept):
            latest[key] = row
    return rows if len(latest) == len(rows) else list(latest.values())


def _write_chunks(incident_id: int, upload_id: int | None, rows: Sequence[Row]) -> list[int]:
    ids = []
    for start in range(0, len(rows), CHUNK_ROWS):
        data = BodyChunk.pack(b"\n".join(r.raw for r in rows[start:start + CHUNK_ROWS]))
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
_NULL = "\\N"


# --- the one rule for text, on every write path -------------------------------------------------
# PostgreSQL text and jsonb cannot hold NUL. A NUL in any text of a row (a field, a group, a key
# or value of the annotations) becomes U+FFFD, the replacement character, before any write path
# sees the row (SQLite too, so that both stores hold the same), and the pipeline counts them in a
# note of the upload. The C scanner hands a line with a NUL to the Python parser, whose rows
# come here. Every other character, control characters included, is stored as it was read.
NUL_REPLACEMENT = "\ufffd"
# COPY text format: backslash, tab, newline and carriage return are escaped; nothing else is
# special there (the C scanner's copy_escape is the same rule).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r",
                               "\x00": NUL_REPLACEMENT})


def copy_escape(value: str) -> str:
    """A text value as a column of PostgreSQL's COPY text format."""
    return value.translate(_COPY_ESCAPES)


def _array_literal(values: Sequence[str]) -> str:
    """A text[] value in PostgreSQL's array syntax, every element quoted (then COPY-escaped as
    any other column)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for v in values) + "}"


def _without_nul(value):
    """A JSON-like value with every NUL of its strings (keys too) replaced."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_REPLACEMENT)
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def _nul_count(value) -> int:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return sum(_nul_count(k) + _nul_count(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_nul_count(v) for v in value)
    return 0


def replace_nul(rows: Sequence[Row]) -> tuple[Sequence[Row], int]:
    """``rows`` with every NUL of their text replaced by ``NUL_REPLACEMENT``, and how many
    values held one. Rows without NUL (nearly all) are returned as they are."""
    out: list[Row] | None = None
    count = 0
    for index, r in enumerate(rows):
        if "\x00" not in "".join((*(getattr(r, f) for f in _TEXT_FIELDS), *r.groups)) and (
                not r.annotations or b"\\u0000" not in orjson.dumps(r.annotations)):
            continue
        if out is None:
            out = list(rows)
        changed = {f: getattr(r, f).replace("\x00", NUL_REPLACEMENT) for f in _TEXT_FIELDS
                   if "\x00" in getattr(r, f)}
        count += len(changed) + _nul_count(r.groups) + _nul_count(r.annotations)
        out[index] = r._replace(**changed, groups=_without_nul(r.groups),
                                annotations=_without_nul(r.annotations))
    return (rows if out is None else out), count


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
            text = "\t".join(copy_escape(getattr(r, f)) for f in _TEXT_FIELDS)
        groups = copy_escape(_array_literal(r.groups)) if r.groups else "{}"
        annotations = copy_escape(orjson.dumps(r.annotations).decode())
        out.append(
            f"{head}{text}\t{r.received.isoformat()}\t"
            f"{_NULL if r.completed is None else r.completed.isoformat()}\t"
            f"{_NULL if r.duration_ms is None else repr(r.duration_ms)}\t{groups}\t"
            f"{_NULL if r.code is None else r.code}\t{annotations}\t{r.line}\t"
            f"{_NULL if r.count is None else r.count}\t"
            f"{chunk_ids[index // CHUNK_ROWS]}\t{index % CHUNK_ROWS}\n"
        )
    return "".join(out)


def _copy_into(table: str, text: str | bytes) -> None:
    """COPY rows (``_COPY_COLUMNS`` order) into ``table``."""
    with connection.cursor() as cursor:
        # Losing the last moments of an ingest to a crash is harmless (it is re-run and
        # idempotent), so do not wait for the WAL flush on every batch.
        cursor.execute("SET LOCAL synchronous_commit = off")
        with cursor.copy(f"COPY {table} ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy:
            copy.write(text)


def _copy_new(text: str | bytes) -> bool:
    """COPY rows straight into the event table; False (and nothing written) if any of them is
    stored already."""
    try:
        with transaction.atomic():  # a savepoint to fall back to
            _copy_into("timelines_event", text)
        return True
    except (IntegrityError, psycopg.errors.UniqueViolation):
        return False


def _merge_postgres(text: str, chunk_ids: list[int], incident_id: int,
                    partition: str | None = None) -> int:
    """Merge a batch of one incident's rows (COPY text) through the staging table.

    The stored rows are joined through the staging table's incident column, not the incident
    as a constant: with a constant the planner prunes to the incident's partition at plan time
    and plans by that partition's statistics, which after a purge or before the first ANALYZE
    may say it is empty, and then merges by a nested loop over its rows (seconds per 2,000-row
    batch of a re-run, seen on the DEFAULT partition). Through the join it plans every
    partition instead, which costs a little per partition: the slot tables of audit streams
    add one per hour of each ring, so a stream names its slot's leaf table (``partition``) and
    the merge reads and writes only that (measured on 400-event batches with eleven streams:
    302 ms through the parent, 29 ms by the slot's table, ``bench/README.md``)."""
    columns = ", ".join(COLUMNS)
    incident = int(incident_id)
    target = partition or "timelines_event"
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", target):
        raise ValueError(f"not a table name: {target!r}")
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
            f" SELECT DISTINCT e.body_chunk FROM {_STAGE_TABLE} s JOIN {target} e"
            f" ON e.incident_id = s.incident_id AND e.received = s.received"
            f" AND e.audit_id = s.audit_id"
            f" WHERE {MERGE_RULE.replaces_sql('s', 'e')}),"
            # New requests are counted before the insert (the statement's one snapshot):
            # a partitioned table cannot return xmax to tell inserts from updates.
            f" fresh AS ("
            f" SELECT count(*) AS n FROM (SELECT DISTINCT incident_id, received, audit_id"
            f" FROM {_STAGE_TABLE}) s WHERE NOT EXISTS (SELECT 1 FROM {target} e"
            f" WHERE e.incident_id = s.incident_id AND e.received = s.received"
            f" AND e.audit_id = s.audit_id)),"
            f" merged AS ("
            f" INSERT INTO {target} ({columns})"
            # One row per request: a batch of COPY rows may repeat one (a file holding the same
            # lines twice), and ON CONFLICT cannot touch a row twice: the one the rule keeps
            # (rows come in body order).
            f" SELECT DISTINCT ON (incident_id, received, audit_id) {columns} FROM {_STAGE_TABLE}"
            f" ORDER BY incident_id, received, audit_id,"
            f" {MERGE_RULE.keep_first_sql(_STAGE_TABLE, 'body_chunk, body_index')}"
            f" {MERGE_RULE.on_conflict(target)}"
            f" RETURNING body_chunk)"
            f" SELECT (SELECT n FROM fresh), (SELECT array_agg(DISTINCT body_chunk) FROM merged),"
            f" (SELECT array_agg(body_chunk) FROM replaced)"
        )
        new, used, replaced = cursor.fetchone()
        unused = sorted(set(chunk_ids) - set(used or ()))
        if unused:
            cursor.execute("DELETE FROM timelines_bodychunk WHERE id = ANY(%s)", [unused])
        if replaced:
            _delete_orphan_chunks(cursor, [c for c in replaced if c is not None], incident,
                                  partition)
        return new


def _delete_orphan_chunks(cursor, candidates: list[int], incident_id: int | None = None,
                          partition: str | None = None) -> None:
    """Delete the chunks among ``candidates`` that no event points at any more (their events were
    completed by a later stage from another file). Rare for uploads, so a scan of the incident's
    partition is affordable there (``incident_id``, when the caller knows the one incident the
    candidates are of, limits it to that partition). A stream's batches complete the requests of
    the batches before them all the time: ``partition`` (its slot's table) has an index on the
    chunk (``streams.store.CHUNK_INDEX``), which answers by a probe instead."""
    if not candidates:
        return
    if partition is not None:
        cursor.execute(
            "DELETE FROM timelines_bodychunk c WHERE c.id = ANY(%s) AND NOT EXISTS"
            f" (SELECT 1 FROM {partition} e WHERE e.body_chunk = c.id)", [candidates])
        return
    only = "" if incident_id is None else f" AND e.incident_id = {int(incident_id)}"
    cursor.execute(
        "DELETE FROM timelines_bodychunk c WHERE c.id = ANY(%s) AND NOT EXISTS"
        " (SELECT 1 FROM timelines_event e WHERE e.incident_id = c.incident_id"
        f"{only} AND e.body_chunk = c.id)", [candidates])


def _merge_generic(incident_id: int, upload_id: int | None, rows: Sequence[Row],
                   chunk_ids: list[int]) -> int:
    """The SQLite path: the same ``MERGE_RULE``, row by row. Simpler and slower, correct."""
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
            f" {MERGE_RULE.on_conflict()}",
            list(_values(incident_id, upload_id, rows, chunk_ids,
                         ops.adapt_datetimefield_value, lambda v: orjson.dumps(v).decode())),
        )
    candidates = set(chunk_ids) | (replaced - {None})
    BodyChunk.objects.filter(pk__in=candidates).exclude(
        pk__in=Event.objects.filter(incident_id=incident_id, body_chunk__in=candidates)
        .values("body_chunk")).delete()
    return Event.objects.filter(incident_id=incident_id).count() - before


# The columns queries filter and sort on; statistics of the others (bodies of text, JSON)
# cost half of ANALYZE's time and serve no plan. ``id`` is one: reads by id (a page of the
# column index's matches, an insight's events) take as many rows as ids only if the planner
# knows ids are distinct (the primary key is (id, incident_id), so it cannot tell), else it
# takes 200 ids for the whole partition and scans it (500,000 events: 0.28 s a read, against
# a few ms by the primary key); they cost nothing to sample.
ANALYZE_COLUMNS = ["id", "incident_id", "received", "completed", "duration_ms", "kind", "username",
                   "verb", "code", "resource", "subresource", "namespace", "name", "api_group",
                   "impersonated_user", "user_agent", "source_ip", "level", "stage", "source",
                   "reason", "severity", "component", "node"]


def analyze(table: str, sample: int | None = None) -> None:
    """Fresh planner statistics of ``table`` (``ANALYZE_COLUMNS``). ``sample``: the statistics
    target (PostgreSQL reads 300 rows per unit and keeps that many common values and histogram
    buckets; its default is 100)."""
    with connection.cursor() as cursor:
        if sample is not None:
            cursor.execute("SET LOCAL default_statistics_target = %s", [sample])
        cursor.execute(f"ANALYZE {table} ({', '.join(ANALYZE_COLUMNS)})")
        if sample is not None:
            cursor.execute("RESET default_statistics_target")


def analyze_incident(incident_id: int) -> None:
    """``analyze`` the partition of ``timelines_event`` that holds the incident's events (on the
    partitioned table itself, ANALYZE would read every partition)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM timelines_event"
                       " WHERE incident_id = %s LIMIT 1", [incident_id])
        found = cursor.fetchone()
    if found:
        analyze(found[0])


def analyze_time_order() -> None:
    """Statistics of ``received`` on the partitioned ``timelines_event`` itself, from a sample
    of 3,000 rows across its partitions (0.12 s at 10M events).

    Autovacuum analyzes the partitions, never the partitioned table. Without statistics of its
    own the planner guesses that an incident's first page (``ORDER BY received, id``: an
    incremental sort over ``event_request_identity``) sorts 1/200 of the incident before its
    first row, and at 10M events chose parallel workers for it: 122 ms, 112 of them starting the
    workers, against 0.6 ms with the statistics. ``received`` is nearly unique, kept as a
    fraction of the rows, so the statistics stay right as the table grows."""
    if connection.vendor != "postgresql":
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL default_statistics_target = 10")
        cursor.execute("ANALYZE timelines_event (received)")
