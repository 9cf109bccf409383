"""One merge rule (``store.MERGE_RULE``) on every write path: two rows of the same request
identity ``(incident, received, audit_id)``, from two files or the same file, become the same
stored row whichever path writes them and in whichever order they come.

The paths: the Python COPY (straight into the table, and through the staging table's merge),
the C scanner's COPY rows (``write_copy``), the bulk load (both rows in the load table, or the
second loaded over a stored first), and SQLite (the test marked ``embedded``, run in the SQLite
pass). The row expected is the one the rule names, taken from the inputs themselves.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from incidents.models import Incident
from timelines.ingest import bulk, store
from timelines.models import BodyChunk, Event
from timelines.parsers import Row
from timelines.parsers.base import CopyRows

T0 = datetime(2024, 6, 1, 9, 0, tzinfo=UTC)
FIELDS = ["audit_id", "received", "completed", "stage", "source", "line", "count", "code",
          "verb", "kind"]


def _row(source: str, *, stage: str, completed: datetime | None, kind: str = "audit",
         count: int | None = None, code: int | None = None) -> Row:
    body = {"source": source, "stage": stage}
    return Row(audit_id="req-1", received=T0, completed=completed, stage=stage, kind=kind,
               verb="update", resource="pods", name="web", code=code, count=count,
               source=source, line=1 + len(source), raw=orjson.dumps(body))


# (name, first written, second written, which of the two the rule keeps)
PAIRS = [
    ("an open span by its completion",
     _row("a.log", stage="RequestReceived", completed=None),
     _row("b.log", stage="ResponseComplete", completed=T0 + timedelta(seconds=1), code=200),
     "second"),
    ("a started response by its completion",
     _row("a.log", stage="ResponseStarted", completed=None),
     _row("b.log", stage="ResponseComplete", completed=T0 + timedelta(seconds=2), code=200),
     "second"),
    ("a final stage kept over an earlier one that comes later",
     _row("a.log", stage="ResponseComplete", completed=T0 + timedelta(seconds=1), code=201),
     _row("b.log", stage="RequestReceived", completed=None),
     "first"),
    ("an Event seen again later",
     _row("a.json", stage="", completed=T0 + timedelta(minutes=1), kind="event", count=1),
     _row("b.json", stage="", completed=T0 + timedelta(minutes=5), kind="event", count=4),
     "second"),
    ("a completion over none, the same stage",
     _row("a.json", stage="", completed=None, kind="event", count=1),
     _row("b.json", stage="", completed=T0 + timedelta(minutes=5), kind="event", count=2),
     "second"),
    ("the same evidence again, from another file",
     _row("a.log", stage="ResponseComplete", completed=T0 + timedelta(seconds=1), code=200),
     _row("b.log", stage="ResponseComplete", completed=T0 + timedelta(seconds=1), code=200),
     "first"),
]
POSTGRES_PATHS = ["copy", "merge", "c-copy", "bulk", "bulk-over-stored"]


def _expected(first: Row, second: Row, keeps: str, reverse: bool) -> Row:
    tie = first.stage == second.stage and first.completed == second.completed
    if tie:  # nothing newer: the row written first stays
        return second if reverse else first
    return first if keeps == "first" else second


def _write_copy(incident_id: int, rows: list[Row]) -> None:
    """The rows as the C scanner hands them to the store: COPY text naming body chunks whose
    ids were reserved, the bodies alongside."""
    ids = store.ChunkIds()
    chunk_ids = [ids.next() for _ in range(0, len(rows), store.CHUNK_ROWS)]
    text = store._copy_text(incident_id, None, rows, chunk_ids)
    bodies = [(chunk_id, b"\n".join(r.raw for r in rows[n * store.CHUNK_ROWS:
                                                         (n + 1) * store.CHUNK_ROWS]))
              for n, chunk_id in enumerate(chunk_ids)]
    store.write_copy(incident_id, None, CopyRows(text.encode(), len(rows), bodies))


def _write(path: str, incident_id: int, batches: list[list[Row]]) -> None:
    if path in ("copy", "merge", "sqlite"):
        for rows in batches:
            store.write_rows(incident_id, None, rows, optimistic=path == "copy")
    elif path == "c-copy":
        for rows in batches:
            _write_copy(incident_id, rows)
    elif path == "bulk":
        table = bulk.start_load(incident_id)
        for rows in batches:
            store.write_rows(incident_id, None, rows, table=table)
        bulk.finish_load(incident_id, table)
    else:  # the first batch stored, the others loaded over it (merged: no partition attaches)
        store.write_rows(incident_id, None, batches[0])
        table = bulk.start_load(incident_id)
        for rows in batches[1:]:
            store.write_rows(incident_id, None, rows, table=table)
        assert not bulk.finish_load(incident_id, table).attached


def _stored(incident: Incident) -> tuple[dict, dict | None]:
    """The incident's one stored row (its fields and body); no body chunk left unused."""
    events = list(Event.objects.filter(incident=incident))
    assert len(events) == 1
    used = {e.body_chunk for e in events}
    assert set(BodyChunk.objects.filter(incident_id=incident.pk).values_list("pk", flat=True)) \
        == used
    event = events[0]
    return {f: getattr(event, f) for f in FIELDS}, event.body()


def _as_stored(row: Row) -> tuple[dict, dict]:
    return {f: getattr(row, f) for f in FIELDS}, orjson.loads(row.raw)


def _run(paths: list[str], first: Row, second: Row, keeps: str, reverse: bool,
         one_batch: bool) -> None:
    pair = [second, first] if reverse else [first, second]
    batches = [pair] if one_batch else [[pair[0]], [pair[1]]]
    expected = _as_stored(_expected(first, second, keeps, reverse))
    for path in paths:
        if one_batch and path == "bulk-over-stored":
            continue
        incident = Incident.objects.create(title=path)
        _write(path, incident.pk, batches)
        assert _stored(incident) == expected, path


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("one_batch", [False, True], ids=["two-files", "one-file"])
@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "reversed"])
@pytest.mark.parametrize(("first", "second", "keeps"), [p[1:] for p in PAIRS],
                         ids=[p[0] for p in PAIRS])
def test_every_postgres_path_keeps_the_row_the_merge_rule_names(
        first, second, keeps, reverse, one_batch, drop_partitions):
    _run(POSTGRES_PATHS, first, second, keeps, reverse, one_batch)


@pytest.mark.embedded
@pytest.mark.django_db
@pytest.mark.parametrize("one_batch", [False, True], ids=["two-files", "one-file"])
@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "reversed"])
@pytest.mark.parametrize(("first", "second", "keeps"), [p[1:] for p in PAIRS],
                         ids=[p[0] for p in PAIRS])
def test_sqlite_keeps_the_row_the_merge_rule_names(first, second, keeps, reverse, one_batch):
    _run(["sqlite"], first, second, keeps, reverse, one_batch)


@pytest.mark.parametrize(("first", "second", "keeps"), [p[1:] for p in PAIRS],
                         ids=[p[0] for p in PAIRS])
def test_the_rule_in_python_names_the_same_row(first, second, keeps):
    rule = store.MERGE_RULE
    tie = first.stage == second.stage and first.completed == second.completed
    assert rule.replaces(second, first) is (keeps == "second")
    assert rule.replaces(first, second) is (keeps == "first" and not tie)
