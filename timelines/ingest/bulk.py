"""Bulk load of a new incident: COPY into a bare table, then index it once and attach it.

Why. Keeping ``timelines_event``'s six btree indexes up to date row by row costs about three
times the PostgreSQL CPU of a COPY into a table without indexes followed by CREATE INDEX
(measured on 200k rows: 5.1 s indexed against 1.55 s + 1.3 s). ``timelines_event`` is therefore
partitioned by incident (migration 0003): a large new incident (``manage.py ingest``) is COPYed
into a load table of its own, which is then deduplicated, indexed and attached as the incident's
partition. Everything else goes through ``store`` into the DEFAULT partition, as before.

Invariants:

- ``start_load`` makes ``timelines_event_load_<incident>``: the columns and defaults of the
  store, ids from the store's sequence (so they stay unique across partitions), a CHECK that
  every row is the incident's (which also lets ATTACH skip its scan), no index. The rows in it
  are not visible to readers until ``finish_load``.
- ``finish_load`` leaves each request identity ``(incident, received, audit_id)`` once, the row
  the store's merge rule keeps, and no body chunk that only the dropped duplicates pointed at.
  Then it either attaches the table as ``timelines_event_<incident>`` with the parent's indexes,
  or, if the incident has a partition already or the attach fails, merges the rows into the
  store with the store's ``ON CONFLICT`` rule and drops the table. One transaction: rows are
  never lost; either way each load upload's ``new_events`` is what it added.
- The parent's indexes (the primary key and the request identity) are built before the attach;
  the partition's own (``PARTITION_INDEXES``: by object and by user, migration 0010) after the
  first answer, by ``index_partition`` (an analysis of ``timelines.analysis.registry``). Until
  then the partition's reads are exact, without those two shortcuts.
- ``drop_incident_partition`` is the fast way to delete an incident's events (the purge of a
  deleted incident uses it, ``timelines.ingest.purge``).
- A load whose incident is deleted meanwhile becomes visible nowhere: every batch and the end of
  ``finish_load`` hold the incident's row (``incidents.models.hold_incident``).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from incidents.models import Upload, hold_incident

from .store import COLUMNS, MERGE_RULE, _delete_orphan_chunks, analyze

log = logging.getLogger(__name__)

# Building the indexes: enough memory to sort in one pass, and room for the parallel workers
# (PostgreSQL gives each participant at least 32 MB, else it plans fewer).
INDEX_MEMORY = "256MB"
# Each partition's own indexes (name → columns; migration 0010 made them so): a partition of a
# bulk load gets them after its first answer (``index_partition``), the DEFAULT one has them.
# A partition holds one incident: its indexes do not lead with ``incident_id`` (the DEFAULT
# one's do), which every entry would repeat; the planner uses them for the same reads (the
# incident's own partition, then the rest of the key), and they cost less to build (500,000
# events: 4.3 s instead of 5.1 s, one process each, bench/README.md).
PARTITION_INDEXES = {
    "event_object": "(resource, namespace, name, received)",
    "event_actor": "(username, received)",
}


@dataclass
class LoadResult:
    attached: bool  # False: merged into the store (the incident had a partition, or attach failed)
    events: int  # rows the load added to the incident
    seconds: dict[str, float] = field(default_factory=dict)  # per step


def load_table(incident_id: int) -> str:
    return f"timelines_event_load_{int(incident_id)}"


def partition_table(incident_id: int) -> str:
    return f"timelines_event_{int(incident_id)}"


def start_load(incident_id: int) -> str:
    """Create the incident's empty load table (dropping a leftover one) and return its name."""
    table = load_table(incident_id)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {table}")
        # INCLUDING DEFAULTS carries the nextval() of the store's sequence for ``id``. Logged, so
        # that it can be attached as it is (an unlogged table would be rewritten).
        cursor.execute(f"CREATE TABLE {table} (LIKE timelines_event INCLUDING DEFAULTS,"
                       f" CONSTRAINT {table}_incident CHECK (incident_id = {int(incident_id)}))")
    return table


def finish_load(incident_id: int, table: str,
                on_step: Callable[[str], None] | None = None) -> LoadResult:
    """Deduplicate the load table (if a request came twice) and attach it as the incident's
    partition, or merge it into the store; see the module docstring. ``on_step(message)`` hears
    of the long steps. Database errors propagate, with nothing changed (the load table still
    holds its rows)."""
    result = LoadResult(attached=False, events=0)
    step = partial(_step, result.seconds, on_step)
    with transaction.atomic(), connection.cursor() as cursor:
        with step("count"):
            cursor.execute(f"SELECT upload_id, count(*) FROM {table} GROUP BY upload_id")
            loaded = dict(cursor.fetchall())
        events = f"{sum(loaded.values()):,} events"
        dedupe = partial(_dedupe_step, cursor, table, step, events)
        partition = partition_table(incident_id)
        dropped: Counter[int | None] = Counter()
        if loaded and _is_partition(cursor, partition):
            log.info("incident %s has a partition already: merging %s", incident_id, table)
        elif loaded:  # (an empty load is not attached: merged, it is just dropped)
            try:
                with transaction.atomic():  # a savepoint: a failed attach falls back to the merge
                    dropped = _index_and_attach(cursor, incident_id, table, partition, step,
                                                events, dedupe)
                result.attached = True
            except DatabaseError as exc:
                log.warning("could not attach %s as a partition, merging it: %s", table, exc)
        if result.attached:
            uploads = {u: n - dropped[u] for u, n in loaded.items()}
        else:
            dedupe()  # one row per request: ON CONFLICT cannot touch a row twice
            with step("merge", f"merging {events} into the store …"):
                uploads = dict.fromkeys(loaded, 0) | _merge(cursor, table)
                cursor.execute(f"DROP TABLE {table}")
        result.events = sum(uploads.values())
        # Last, so that a deletion of the incident never waits for the steps above (the load
        # table is dropped by the purge): if the incident was deleted meanwhile, nothing of the
        # load becomes visible (IncidentGone, all of this rolled back).
        hold_incident(incident_id)
        # one statement for all of them (a bundle loads thousands of files)
        counted = {u: n for u, n in uploads.items() if u is not None}
        cursor.execute(f"UPDATE {Upload._meta.db_table} u SET new_events = v.n FROM"
                       " (SELECT unnest(%s::bigint[]) AS id, unnest(%s::bigint[]) AS n) v"
                       " WHERE u.id = v.id", [list(counted), list(counted.values())])
        # The rows become visible now: a new finished_at makes a new data version, so nothing
        # counted or cached while they were not (aggregate.data_version) outlives this commit.
        Upload.objects.filter(pk__in=[u for u in uploads if u is not None]).exclude(
            finished_at=None).update(finished_at=timezone.now())
    return result


def abandon_load(incident_id: int, table: str) -> None:
    """Drop a load that could not be finished, with the body chunks only its rows pointed at
    (nothing if the table is gone: the incident was deleted and purged)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [table])
        if cursor.fetchone()[0] is None:
            return
        cursor.execute(f"SELECT array_agg(DISTINCT body_chunk) FROM {table}")
        chunks = cursor.fetchone()[0] or []
        cursor.execute(f"DROP TABLE {table}")
        _delete_orphan_chunks(cursor, [c for c in chunks if c is not None])


def drop_incident_partition(incident_id: int) -> bool:
    """Drop the incident's partition (and a leftover load table) if it has one; returns whether it
    had. Dropping a table is instant where deleting its rows one by one is not."""
    if connection.vendor != "postgresql":
        return False
    partition = partition_table(incident_id)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {load_table(incident_id)}")
        if not _is_partition(cursor, partition):
            return False
        # Both take a short exclusive lock on timelines_event (no DETACH CONCURRENTLY while
        # there is a DEFAULT partition), held until the caller's transaction commits.
        cursor.execute(f"ALTER TABLE timelines_event DETACH PARTITION {partition}")
        cursor.execute(f"DROP TABLE {partition}")
    return True


def index_partition(incident_id: int) -> list[str]:
    """Build the indexes of ``PARTITION_INDEXES`` that the incident's partition lacks (none if
    it has no partition: its events are in the DEFAULT one); returns the names built. Each in a
    transaction of its own, usable once built. A plain ``CREATE INDEX``: reads go on meanwhile;
    a write to the partition (another load merged into the incident) waits for it."""
    if connection.vendor != "postgresql":
        return []
    partition = partition_table(incident_id)
    built = []
    for name, columns in PARTITION_INDEXES.items():
        own = f"{name}_{int(incident_id)}"
        with transaction.atomic(), connection.cursor() as cursor:
            if not _is_partition(cursor, partition):
                return built
            cursor.execute("SELECT to_regclass(%s)", [own])
            if cursor.fetchone()[0] is not None:
                continue
            cursor.execute(f"SET LOCAL maintenance_work_mem = '{INDEX_MEMORY}'")
            cursor.execute(f"CREATE INDEX {own} ON {partition} {columns}")
            built.append(own)
    return built


# --- steps -------------------------------------------------------------------------------------

def _is_partition(cursor, name: str) -> bool:
    cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent ="
                   " 'timelines_event'::regclass AND inhrelid = to_regclass(%s))", [name])
    return cursor.fetchone()[0]


def _dedupe_step(cursor, table: str, step, events: str) -> Counter[int | None]:
    with step("dedupe", f"deduplicating {events} …"):
        # The hash aggregate of a million identities fits in memory then (1.2 s instead of 2 s
        # spilling to disk).
        cursor.execute("SET LOCAL work_mem = '256MB'")
        dropped = _dedupe(cursor, table)
        cursor.execute("RESET work_mem")
        return dropped


def _dedupe(cursor, table: str) -> Counter[int | None]:
    """One row per request identity, the one the store's ``MERGE_RULE`` keeps (of equals, the
    first loaded: the lower id). Then the body chunks that only the deleted rows pointed at go
    too. Returns the rows deleted per upload."""
    # Duplicates are few (files that overlap): find their identities with one hash aggregate and
    # rank only those, rather than sorting the whole table.
    cursor.execute(
        f"WITH duplicated AS ("
        f" SELECT received, audit_id FROM {table} GROUP BY received, audit_id"
        f" HAVING count(*) > 1),"
        f" ranked AS ("
        f" SELECT t.ctid AS dup_ctid, row_number() OVER (PARTITION BY t.received, t.audit_id"
        f" ORDER BY {MERGE_RULE.keep_first_sql('t', 't.id')}) AS n"
        f" FROM {table} t JOIN duplicated USING (received, audit_id))"
        f" DELETE FROM {table} t USING ranked r WHERE t.ctid = r.dup_ctid AND r.n > 1"
        f" RETURNING t.upload_id, t.body_chunk")
    deleted = cursor.fetchall()
    candidates = {chunk for _, chunk in deleted if chunk is not None}
    if candidates:
        cursor.execute(f"SELECT DISTINCT body_chunk FROM {table} WHERE body_chunk = ANY(%s)",
                       [sorted(candidates)])
        unused = candidates - {chunk for (chunk,) in cursor.fetchall()}
        if unused:
            cursor.execute("DELETE FROM timelines_bodychunk WHERE id = ANY(%s)", [sorted(unused)])
    return Counter(upload_id for upload_id, _ in deleted)


def _index_and_attach(cursor, incident_id: int, table: str, partition: str, step,
                      events: str, dedupe: Callable[[], Counter[int | None]]
                      ) -> Counter[int | None]:
    """Build the parent's indexes on the load table, analyze it and attach it as the incident's
    partition; returns the rows ``dedupe`` deleted per upload.

    The unique request identity is built first: when it succeeds, which is whenever no request
    came twice, the load needs no deduplication (a GROUP BY of every identity: 3.2 s of a
    million-event load); when it fails, ``dedupe`` runs and it is built again.

    Each index matches its parent index (same definition; the constraint ones carry their
    constraint), so ATTACH adopts them instead of building its own; the CHECK made by
    ``start_load`` spares ATTACH its scan of the table. ATTACH still scans the DEFAULT partition
    for rows of the incident (if there are any, it fails and the caller merges)."""
    cursor.execute(
        "SELECT i.relname, pg_get_indexdef(i.oid), c.contype FROM pg_index x"
        " JOIN pg_class i ON i.oid = x.indexrelid"
        " LEFT JOIN pg_constraint c ON c.conindid = i.oid AND c.conrelid = x.indrelid"
        " WHERE x.indrelid = 'timelines_event'::regclass")
    # the unique identity first
    indexes = sorted(cursor.fetchall(), key=lambda index: index[2] != "u")
    dropped: Counter[int | None] = Counter()
    with step("index", f"indexing {events} …"):
        # Parallel workers share the sort of each build (max_parallel_maintenance_workers).
        cursor.execute(f"SET LOCAL maintenance_work_mem = '{INDEX_MEMORY}'")
        for name, definition, kind in indexes:
            own = f"{name}_{int(incident_id)}"
            # "CREATE [UNIQUE] INDEX name ON ONLY public.timelines_event USING …"
            create = re.sub(r"^(CREATE (?:UNIQUE )?INDEX) \S+ ON ONLY \S+ ",
                            rf"\1 {own} ON {table} ", definition)
            if kind == "u":
                try:
                    with transaction.atomic():
                        cursor.execute(create)
                except IntegrityError:  # a request loaded twice
                    dropped = dedupe()
                    cursor.execute(create)
            else:
                cursor.execute(create)
            if kind in ("p", "u"):
                cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {own}"
                               f" {'PRIMARY KEY' if kind == 'p' else 'UNIQUE'} USING INDEX {own}")
    with step("analyze"):
        # Statistics now, not whenever autovacuum comes by: without them the planner misjudges
        # the incident's first queries (see pipeline.ANALYZE_AFTER_ROWS). Before the attach,
        # which locks the DEFAULT partition until this transaction ends.
        # A partition holds one incident: 30 common values and histogram buckets per column
        # (9,000 sampled rows) plan its queries as well as 100 do, in a quarter of the time
        # (0.13 s against 0.50 s for 200,000 events).
        analyze(table, sample=30)
    with step("attach"):
        cursor.execute(f"ALTER TABLE {table} RENAME TO {partition}")
        cursor.execute(f"ALTER TABLE timelines_event ATTACH PARTITION {partition}"
                       f" FOR VALUES IN ({int(incident_id)})")
        # The partition's own constraint says the same from now on.
        cursor.execute(f"ALTER TABLE {partition} DROP CONSTRAINT {table}_incident")
    return dropped


def _merge(cursor, table: str) -> dict[int | None, int]:
    """Merge the (deduplicated) load table into the store with the store's ``MERGE_RULE``, as
    ``store._merge_postgres`` merges a batch; returns the new rows per upload."""
    columns = ", ".join(COLUMNS)
    cursor.execute(f"SELECT array_agg(DISTINCT body_chunk) FROM {table}")
    loaded = {c for c in cursor.fetchone()[0] or () if c is not None}
    identity = ("e.incident_id = s.incident_id AND e.received = s.received"
                " AND e.audit_id = s.audit_id")
    cursor.execute(
        # ``replaced`` and ``fresh`` read the store as it was before the insert (one snapshot per
        # statement): the chunks of the rows it replaces, and the rows that are new (a
        # partitioned table cannot RETURNING xmax to tell inserts from updates).
        f"WITH replaced AS ("
        f" SELECT DISTINCT e.body_chunk FROM {table} s JOIN timelines_event e ON {identity}"
        f" WHERE {MERGE_RULE.replaces_sql('s', 'e')}),"
        f" fresh AS ("
        f" SELECT s.upload_id, count(*) AS n FROM {table} s WHERE NOT EXISTS"
        f" (SELECT 1 FROM timelines_event e WHERE {identity}) GROUP BY s.upload_id),"
        f" merged AS ("
        f" INSERT INTO timelines_event ({columns}) SELECT {columns} FROM {table}"
        f" {MERGE_RULE.on_conflict()} RETURNING body_chunk)"
        f" SELECT (SELECT array_agg(ARRAY[upload_id, n]) FROM fresh),"
        f" (SELECT array_agg(DISTINCT body_chunk) FROM merged),"
        f" (SELECT array_agg(body_chunk) FROM replaced)")
    fresh, used, replaced = cursor.fetchone()
    new = dict(fresh or ())
    used = set(used or ())
    unused = sorted(loaded - used)
    if unused:  # chunks of rows the store already had in a later stage
        cursor.execute("DELETE FROM timelines_bodychunk WHERE id = ANY(%s)", [unused])
    _delete_orphan_chunks(cursor, [c for c in replaced or () if c is not None])
    return new


@contextmanager
def _step(seconds: dict[str, float], on_step: Callable[[str], None] | None, name: str,
          message: str | None = None) -> Iterator[None]:
    """Time a step into ``seconds[name]``; tell ``on_step`` of it first if it has a message."""
    if message and on_step is not None:
        on_step(message)
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(time.perf_counter() - start, 3)
