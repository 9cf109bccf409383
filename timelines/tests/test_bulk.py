"""Bulk load of a new incident (``timelines.ingest.bulk``): the same events as the normal path,
duplicates collapsed by the merge rule, a partition of its own that deletion drops, and the merge
whenever it cannot attach.

Transactional tests: the load runs DDL and, in the command, other processes' connections.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from incidents.models import Incident, Upload
from timelines.ingest import bulk, create_local_upload, ingest_upload, purge_incident
from timelines.models import BodyChunk, Event

pytestmark = pytest.mark.django_db(transaction=True)

# Everything but what names where a row came from (ids, uploads, body positions).
COMPARED = [f.attname for f in Event._meta.concrete_fields
            if f.attname not in ("id", "incident_id", "upload_id", "body_chunk", "body_index")]


@pytest.fixture(autouse=True)
def _drop_partitions(drop_partitions):
    """Every test of this module may leave partitions or load tables."""


# --- helpers -----------------------------------------------------------------------------------

def fixture_logs(fixtures_dir) -> list:
    audit = fixtures_dir / "audit"
    return sorted(audit.glob("*.log")) + sorted((audit / "falco").glob("*.json"))


def rows_of(incident_id: int) -> dict[tuple, dict]:
    return {(e["received"], e["audit_id"]): e
            for e in Event.objects.filter(incident_id=incident_id).values(*COMPARED)}


def bodies_of(incident_id: int) -> dict[tuple, dict | None]:
    return {(e.received, e.audit_id): e.body()
            for e in Event.objects.filter(incident_id=incident_id)}


def has_partition(incident_id: int) -> bool:
    with connection.cursor() as cursor:
        return bulk._is_partition(cursor, bulk.partition_table(incident_id))


def table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


def orphan_chunks(incident_id: int) -> set[int]:
    stored = set(BodyChunk.objects.filter(incident_id=incident_id).values_list("pk", flat=True))
    used = set(Event.objects.filter(incident_id=incident_id).values_list("body_chunk", flat=True))
    return stored - used


def run_ingest(*paths, **options) -> dict:
    out = StringIO()
    try:
        call_command("ingest", *map(str, paths), json=True, stdout=out, stderr=StringIO(),
                     **options)
    except CommandError:
        pass  # files that are no evidence fail; the summary says which
    return json.loads(out.getvalue().strip().splitlines()[-1])


def load(incident: Incident, paths) -> bulk.LoadResult:
    """A bulk load of ``paths``, one after another, as ``manage.py ingest`` does it."""
    table = bulk.start_load(incident.pk)
    for path in paths:
        upload = ingest_upload(create_local_upload(incident, path).pk, table=table)
        # read into the load table: not readable before the load is attached
        assert (upload.status, upload.stage) == ("running", "reading"), upload.message
        assert upload.finished_at is not None
    return bulk.finish_load(incident.pk, table)


def audit_event(audit_id: str, stage: str, *, second: int = 0, user: str = "alice") -> dict:
    received = f"2024-05-01T10:00:{second:02d}.000000Z"
    event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
             "auditID": audit_id, "stage": stage, "requestURI": "/api/v1/namespaces/a/pods/p",
             "verb": "get", "user": {"username": user, "groups": ["system:authenticated"]},
             "sourceIPs": ["10.0.0.1"], "userAgent": "kubectl",
             "objectRef": {"resource": "pods", "namespace": "a", "name": "p"},
             "requestReceivedTimestamp": received, "stageTimestamp": received}
    if stage == "ResponseComplete":
        event["stageTimestamp"] = f"2024-05-01T10:00:{second:02d}.250000Z"
        event["responseStatus"] = {"code": 200}
    return event


def write_log(path, *events) -> object:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


# --- the same events as the normal path --------------------------------------------------------

def test_a_bulk_load_stores_exactly_the_events_of_the_normal_path(fixtures_dir, settings):
    logs = fixture_logs(fixtures_dir)
    settings.BULK_LOAD_MIN_BYTES = 10**15
    normal = run_ingest(*logs, incident="normal path", jobs=1)
    settings.BULK_LOAD_MIN_BYTES = 0
    loaded = run_ingest(*logs, incident="bulk load", jobs=1)

    normal_id, bulk_id = normal["incident"]["id"], loaded["incident"]["id"]
    assert not has_partition(normal_id) and has_partition(bulk_id)
    expected = rows_of(normal_id)
    assert len(expected) > 50
    assert rows_of(bulk_id) == expected
    assert bodies_of(bulk_id) == bodies_of(normal_id)
    assert not table_exists(bulk.load_table(bulk_id))
    assert orphan_chunks(bulk_id) == set()

    def counts(summary):
        return sorted((u["name"], u["status"], u["events"], u["new_events"])
                      for u in summary["uploads"])

    # the falco files repeat two requests: the later file's copy is not new in either path
    assert counts(loaded) == counts(normal)


def test_a_bundle_of_mixed_evidence_loads_as_the_normal_path_stores_it(fixtures_dir, settings):
    """Events, component logs and audit lines of a real bundle: the load table takes every kind
    of evidence, and the deduplication and merge rule hold for all of them."""
    bundle = fixtures_dir / "bundles" / "sonobuoy-results-0.10.tar.gz"
    settings.BULK_LOAD_MIN_BYTES = 10**15
    normal = run_ingest(bundle, incident="normal path", jobs=1)
    settings.BULK_LOAD_MIN_BYTES = 0
    loaded = run_ingest(bundle, incident="bulk load", jobs=1)

    normal_id, bulk_id = normal["incident"]["id"], loaded["incident"]["id"]
    assert has_partition(bulk_id)
    expected = rows_of(normal_id)
    kinds = {row["kind"] for row in expected.values()}
    assert len(kinds) > 1, kinds
    assert rows_of(bulk_id) == expected
    assert bodies_of(bulk_id) == bodies_of(normal_id)
    assert orphan_chunks(bulk_id) == set()


def test_a_load_from_several_processes_stores_every_request_once(fixtures_dir, settings):
    logs = fixture_logs(fixtures_dir)
    settings.BULK_LOAD_MIN_BYTES = 10**15
    normal = run_ingest(*logs, incident="normal path", jobs=1)
    settings.BULK_LOAD_MIN_BYTES = 0
    loaded = run_ingest(*logs, *logs, incident="bulk load", jobs=2)

    normal_id, bulk_id = normal["incident"]["id"], loaded["incident"]["id"]
    assert has_partition(bulk_id)
    assert rows_of(bulk_id).keys() == rows_of(normal_id).keys()
    assert orphan_chunks(bulk_id) == set()
    assert sum(u["new_events"] for u in loaded["uploads"]) == len(rows_of(normal_id))


# --- duplicates --------------------------------------------------------------------------------

@pytest.mark.parametrize("complete_first", [False, True])
def test_stages_of_a_request_in_two_files_collapse_to_the_complete_one(tmp_path, incident,
                                                                      complete_first):
    received = write_log(tmp_path / "a.log", audit_event("req-1", "RequestReceived"),
                         audit_event("req-2", "ResponseComplete", second=1),
                         audit_event("req-4", "RequestReceived", second=3))
    complete = write_log(tmp_path / "b.log", audit_event("req-1", "ResponseComplete"),
                         audit_event("req-2", "RequestReceived", second=1),
                         audit_event("req-3", "ResponseComplete", second=2),
                         audit_event("req-4", "ResponseStarted", second=3))
    files = [complete, received] if complete_first else [received, complete]

    result = load(incident, files)

    assert result.attached
    events = {e.audit_id: e for e in Event.objects.filter(incident=incident)}
    assert sorted(events) == ["req-1", "req-2", "req-3", "req-4"]
    for event in events.values():
        stage = "ResponseStarted" if event.audit_id == "req-4" else "ResponseComplete"
        assert event.stage == stage
        assert event.body()["stage"] == stage
        assert event.body()["auditID"] == event.audit_id
        assert (event.completed is None) == (stage == "ResponseStarted")
    assert events["req-1"].source == "b.log" and events["req-2"].source == "a.log"
    assert events["req-4"].source == "b.log"
    assert orphan_chunks(incident.pk) == set()
    new = dict(Upload.objects.filter(incident=incident).values_list("name", "new_events"))
    assert new == {"a.log": 1, "b.log": 3}


def test_a_load_without_repeated_requests_is_not_deduplicated(tmp_path, incident):
    """The unique request identity is built first; when it holds, there is nothing to
    deduplicate and that pass over every row is skipped."""
    path = write_log(tmp_path / "a.log", *(audit_event(f"req-{n}", "ResponseComplete", second=n)
                                           for n in range(10)))

    result = load(incident, [path])

    assert result.attached and result.events == 10
    assert "dedupe" not in result.seconds and "index" in result.seconds


def test_the_same_file_twice_is_stored_once(tmp_path, incident):
    path = write_log(tmp_path / "a.log", *(audit_event(f"req-{n}", "ResponseComplete", second=n)
                                           for n in range(10)))

    result = load(incident, [path, path])

    assert result.attached and result.events == 10
    assert "dedupe" in result.seconds  # the unique identity failed first
    assert Event.objects.filter(incident=incident).count() == 10
    first, second = Upload.objects.filter(incident=incident).order_by("pk")
    assert (first.new_events, second.new_events) == (10, 0)
    assert set(Event.objects.filter(incident=incident).values_list("upload_id", flat=True)) == {
        first.pk}
    assert orphan_chunks(incident.pk) == set()
    assert all(e.body()["auditID"] == e.audit_id
               for e in Event.objects.filter(incident=incident))


def test_a_later_completion_wins_among_equal_stages_then_the_first_loaded(tmp_path, incident):
    early = audit_event("req-1", "ResponseComplete", user="first")
    late = audit_event("req-1", "ResponseComplete", user="later")
    late["stageTimestamp"] = "2024-05-01T10:00:00.900000Z"
    tie = audit_event("req-2", "ResponseComplete", second=1, user="tied")
    files = [write_log(tmp_path / "a.log", early, audit_event("req-2", "ResponseComplete",
                                                              second=1, user="first")),
             write_log(tmp_path / "b.log", late, tie)]

    load(incident, files)

    users = dict(Event.objects.filter(incident=incident).values_list("audit_id", "username"))
    assert users == {"req-1": "later", "req-2": "first"}


# --- the partition -----------------------------------------------------------------------------

def test_deleting_the_incident_drops_its_partition(tmp_path, incident):
    other = Incident.objects.create(title="kept")
    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    load(incident, [path])
    load(other, [path])
    assert has_partition(incident.pk)

    incident_id = incident.pk
    incident.delete()
    assert has_partition(incident_id)  # until the purge that follows
    purge_incident(incident_id)

    assert not has_partition(incident_id)
    assert not table_exists(bulk.partition_table(incident_id))
    assert not Event.objects.filter(incident_id=incident_id).exists()
    assert not BodyChunk.objects.filter(incident_id=incident_id).exists()
    assert Event.objects.filter(incident=other).count() == 1 and has_partition(other.pk)
    assert bulk.drop_incident_partition(incident_id) is False


def test_a_second_load_into_an_incident_with_a_partition_merges(tmp_path, incident):
    first = write_log(tmp_path / "a.log", audit_event("req-1", "RequestReceived"),
                      audit_event("req-2", "ResponseComplete", second=1))
    second = write_log(tmp_path / "b.log", audit_event("req-1", "ResponseComplete"),
                       audit_event("req-2", "RequestReceived", second=1),
                       audit_event("req-3", "ResponseComplete", second=2))
    assert load(incident, [first]).attached
    kept = dict(Event.objects.filter(incident=incident).values_list("audit_id", "pk"))

    result = load(incident, [second])

    assert not result.attached
    assert result.events == 1  # req-3
    assert not table_exists(bulk.load_table(incident.pk))
    events = {e.audit_id: e for e in Event.objects.filter(incident=incident)}
    assert sorted(events) == ["req-1", "req-2", "req-3"]
    assert all(e.stage == "ResponseComplete" for e in events.values())
    assert all(e.body()["stage"] == "ResponseComplete" for e in events.values())
    # merged rows keep their ids, as in the store
    assert events["req-1"].pk == kept["req-1"] and events["req-2"].pk == kept["req-2"]
    assert events["req-1"].source == "b.log" and events["req-2"].source == "a.log"
    assert orphan_chunks(incident.pk) == set()
    assert Upload.objects.get(incident=incident, name="b.log").new_events == 1


def test_a_load_that_cannot_attach_is_merged(tmp_path, incident, ingest_file):
    path = write_log(tmp_path / "a.log", audit_event("req-1", "RequestReceived"),
                     audit_event("req-2", "ResponseComplete", second=1))
    table = bulk.start_load(incident.pk)
    ingest_upload(create_local_upload(incident, path).pk, table=table)
    # meanwhile an upload through the store: the DEFAULT partition now holds the incident's rows
    ingest_file(incident, write_log(tmp_path / "b.log", audit_event("req-1", "ResponseComplete")))

    result = bulk.finish_load(incident.pk, table)

    assert not result.attached and not has_partition(incident.pk)
    assert not table_exists(table)
    events = {e.audit_id: e for e in Event.objects.filter(incident=incident)}
    assert sorted(events) == ["req-1", "req-2"]
    assert events["req-1"].stage == "ResponseComplete" and events["req-1"].source == "b.log"
    assert orphan_chunks(incident.pk) == set()


def test_a_load_of_nothing_leaves_no_partition(tmp_path, incident):
    table = bulk.start_load(incident.pk)

    result = bulk.finish_load(incident.pk, table)

    assert not result.attached and result.events == 0
    assert not has_partition(incident.pk) and not table_exists(table)


def test_ids_are_unique_and_come_from_the_store_sequence(tmp_path, incident):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('timelines_event', 'id')")
        (sequence,) = cursor.fetchone()
        assert sequence == "public.timelines_event_id_seq"
        cursor.execute(f"SELECT nextval('{sequence}')")
        (before,) = cursor.fetchone()
    path = write_log(tmp_path / "a.log", *(audit_event(f"req-{n}", "ResponseComplete", second=n)
                                           for n in range(20)))
    load(incident, [path, path])
    ids = list(Event.objects.filter(incident=incident).values_list("pk", flat=True))
    later = Event.objects.create(incident=incident, audit_id="x", received="2024-05-01T11:00Z")

    assert len(ids) == len(set(ids)) == 20
    assert all(before < pk < later.pk for pk in ids)


def test_the_orm_and_the_event_api_see_the_attached_rows(tmp_path, incident, api):
    path = write_log(tmp_path / "a.log", *(audit_event(f"req-{n}", "ResponseComplete", second=n)
                                           for n in range(12)))
    load(incident, [path])

    assert Event.objects.filter(incident=incident).count() == 12
    assert Event.objects.filter(incident=incident, audit_id="req-3").get().code == 200
    response = api(f"/api/v1/incidents/{incident.pk}/events/", {"page_size": 5})
    assert response.status_code == 200
    seen = []
    while True:
        body = response.json()
        seen += [r["audit_id"] for r in body["results"]]
        if body["next"] is None:
            break
        response = api(body["next"])
    assert seen == [f"req-{n}" for n in range(12)]
    detail = api(f"/api/v1/events/{Event.objects.get(incident=incident, audit_id='req-3').pk}/")
    assert detail.status_code == 200


# --- the command -------------------------------------------------------------------------------

def test_an_error_midway_still_attaches_what_was_loaded(tmp_path, settings, monkeypatch):
    from timelines.management.commands import ingest as command

    settings.BULK_LOAD_MIN_BYTES = 0
    first = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    second = write_log(tmp_path / "b.log", audit_event("req-2", "ResponseComplete"))
    real = command.ingest_upload

    def failing(upload_id, *args, **kwargs):
        if Upload.objects.get(pk=upload_id).name == "b.log":
            raise RuntimeError("worker lost")
        return real(upload_id, *args, **kwargs)

    monkeypatch.setattr(command, "ingest_upload", failing)
    with pytest.raises(RuntimeError, match="worker lost"):
        call_command("ingest", str(first), str(second), incident="interrupted", jobs=1,
                     stdout=StringIO(), stderr=StringIO())

    incident = Incident.objects.get(title="interrupted")
    assert has_partition(incident.pk)
    assert list(Event.objects.filter(incident=incident).values_list("audit_id", flat=True)) == [
        "req-1"]


def test_a_load_that_cannot_be_finished_is_dropped_and_its_files_fail(tmp_path, settings,
                                                                      monkeypatch):
    settings.BULK_LOAD_MIN_BYTES = 0
    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))

    def broken(incident_id, table, on_step=None):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bulk, "finish_load", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        call_command("ingest", str(path), incident="broken", jobs=1, stdout=StringIO(),
                     stderr=StringIO())

    incident = Incident.objects.get(title="broken")
    assert not table_exists(bulk.load_table(incident.pk))
    assert not BodyChunk.objects.filter(incident=incident).exists()
    upload = Upload.objects.get(incident=incident)
    assert upload.status == "failed" and "disk full" in upload.message


def test_the_command_prints_when_indexing_starts(tmp_path, settings):
    settings.BULK_LOAD_MIN_BYTES = 0
    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    err = StringIO()

    call_command("ingest", str(path), incident="said", jobs=1, stdout=StringIO(), stderr=err)

    assert "indexing 1 events …" in err.getvalue()


def test_a_small_load_or_an_existing_incident_goes_through_the_store(tmp_path, settings,
                                                                     incident):
    settings.BULK_LOAD_MIN_BYTES = 10**6
    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    small = run_ingest(path, incident="small")
    settings.BULK_LOAD_MIN_BYTES = 0
    run_ingest(path, incident_id=incident.pk)

    assert not has_partition(small["incident"]["id"]) and not has_partition(incident.pk)
    assert Event.objects.filter(incident=incident).count() == 1


# --- the schema --------------------------------------------------------------------------------

def indexes_of(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                       " WHERE x.indrelid = to_regclass(%s)", [table])
        return {name for (name,) in cursor.fetchall()}


def plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # a few rows: the index if there is one
        cursor.execute("EXPLAIN " + sql, params)
        text = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    return text


def test_the_object_and_user_indexes_come_after_the_first_answer(tmp_path, incident):
    """Attached with the indexes its parent requires (the request identity, the primary key),
    a load is readable; its own indexes by object and by user are built after, by the
    analyses, and the reads by user and by object use them then. The DEFAULT partition has
    its own."""
    events = [audit_event(f"r{n}", "ResponseComplete", second=n, user=f"u{n % 3}")
              for n in range(30)]
    for n, event in enumerate(events):
        event["objectRef"]["name"] = f"p{n % 10}"
    path = write_log(tmp_path / "a.log", *events)
    load(incident, [path])
    partition = bulk.partition_table(incident.pk)
    parent = {"timelines_event_pkey", "event_request_identity"}
    own = {f"{name}_{incident.pk}" for name in bulk.PARTITION_INDEXES}
    assert indexes_of("timelines_event") == parent
    assert indexes_of(partition) == {f"{name}_{incident.pk}" for name in parent}
    by_user = ("SELECT id FROM timelines_event WHERE incident_id = %s AND username = %s"
               " ORDER BY received")
    assert f"event_actor_{incident.pk}" not in plan(by_user, [incident.pk, "u1"])
    expected = list(Event.objects.filter(incident=incident, username="u1")
                    .order_by("received").values_list("pk", flat=True))
    assert len(expected) == 10

    assert sorted(bulk.index_partition(incident.pk)) == sorted(own)

    assert indexes_of(partition) == {f"{name}_{incident.pk}" for name in parent} | own
    assert f"event_actor_{incident.pk}" in plan(by_user, [incident.pk, "u1"])
    # (without the incident in their keys: the partition holds it alone)
    by_object = ("SELECT id FROM timelines_event WHERE incident_id = %s AND resource = %s"
                 " AND namespace = %s AND name = %s ORDER BY received")
    assert f"event_object_{incident.pk}" in plan(by_object, [incident.pk, "pods", "a", "p1"])
    with connection.cursor() as cursor:
        cursor.execute(by_user, [incident.pk, "u1"])
        assert [pk for (pk,) in cursor.fetchall()] == expected
    assert bulk.index_partition(incident.pk) == []  # built once
    other = Incident.objects.create(title="in the default partition")
    assert bulk.index_partition(other.pk) == []
    assert {f"{name}_default" for name in bulk.PARTITION_INDEXES} <= indexes_of(
        "timelines_event_default")


def test_the_planner_knows_a_loaded_partition_s_ids_are_distinct(tmp_path, incident):
    """Reads by id (a page of the column index's matches, an insight's events) are planned for
    as many rows as ids: the load's statistics include ``id`` (without, the planner took 100 ids
    for half the partition, and at 500,000 events scanned all of it: 0.28 s a read)."""
    path = write_log(tmp_path / "a.log", *(audit_event(f"r{n}", "ResponseComplete",
                                                        second=n % 60) for n in range(2000)))
    load(incident, [path])
    ids = list(Event.objects.filter(incident=incident).order_by("pk").values_list(
        "pk", flat=True)[::20])
    assert len(ids) == 100
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) SELECT id FROM timelines_event"
                       " WHERE incident_id = %s AND id = ANY(%s)", [incident.pk, ids])
        plan = cursor.fetchone()[0][0]["Plan"]
    assert plan["Plan Rows"] == len(ids)


def test_the_command_builds_the_partition_indexes_with_its_analyses(tmp_path, settings):
    settings.BULK_LOAD_MIN_BYTES = 0
    path = write_log(tmp_path / "a.log", *(audit_event(f"r{n}", "ResponseComplete", second=n)
                                           for n in range(5)))
    summary = run_ingest(path, incident="bulk", wait_complete=True)

    incident_id = summary["incident"]["id"]
    assert has_partition(incident_id)
    assert {f"{name}_{incident_id}" for name in bulk.PARTITION_INDEXES} <= indexes_of(
        bulk.partition_table(incident_id))
    assert [u["stage"] for u in summary["uploads"]] == ["complete"]


def test_the_models_match_the_migrations():
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


def test_the_partitioning_migration_reverses_with_every_row(tmp_path, incident, ingest_file):
    from django.db.migrations.executor import MigrationExecutor

    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    other = Incident.objects.create(title="in the default partition")
    ingest_file(other, path)
    load(incident, [path])
    before = sorted(Event.objects.values_list("pk", "incident_id", "audit_id"))
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()

    try:
        executor = MigrationExecutor(connection)
        executor.migrate([("timelines", "0002_evidence_kinds")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT relkind, pg_get_serial_sequence('timelines_event', 'id')"
                           " FROM pg_class WHERE relname = 'timelines_event'")
            assert cursor.fetchone() == ("r", "public.timelines_event_id_seq")
            cursor.execute("SELECT attidentity FROM pg_attribute WHERE attname = 'id'"
                           " AND attrelid = 'timelines_event'::regclass")
            assert cursor.fetchone() == ("d",)
            assert _body_storage(cursor) == "x"  # 0005 reversed: PostgreSQL's default
        assert sorted(Event.objects.values_list("pk", "incident_id", "audit_id")) == before
    finally:
        MigrationExecutor(connection).migrate(latest)

    assert sorted(Event.objects.values_list("pk", "incident_id", "audit_id")) == before
    with connection.cursor() as cursor:
        assert _body_storage(cursor) == "e"
    # 0010 again (every row now in the DEFAULT partition): the object and user indexes are
    # the partition's own, not the parent's
    assert not indexes_of("timelines_event") & set(bulk.PARTITION_INDEXES)
    assert {f"{name}_default" for name in bulk.PARTITION_INDEXES} <= indexes_of(
        "timelines_event_default")
    created = Event.objects.create(incident=other, audit_id="y", received="2024-05-01T11:00Z")
    assert created.pk > max(pk for pk, _, _ in before)


def _body_storage(cursor) -> str:
    cursor.execute("SELECT attstorage FROM pg_attribute WHERE attname = 'data'"
                   " AND attrelid = 'timelines_bodychunk'::regclass")
    return cursor.fetchone()[0]


def test_body_chunks_are_stored_without_a_second_compression(incident, ingest_file,
                                                            fixtures_dir):
    """zstd frames are stored EXTERNAL (migration 0005): PostgreSQL does not try to compress
    them again, and they read back whole."""
    ingest_file(incident, fixtures_dir / "audit" / "audit2rbac-demo.log")
    with connection.cursor() as cursor:
        assert _body_storage(cursor) == "e"
    events = Event.objects.filter(incident=incident).exclude(body_chunk=None)
    assert events.count() > 10
    for event in events:
        assert event.body()["auditID"] == event.audit_id


def test_the_commands_processes_commit_without_waiting_for_the_flush():
    """Told once per connection of a process (again on a new one), not at the pool's start."""
    from timelines.management.commands import ingest

    def setting() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return cursor.fetchone()[0]

    assert setting() == "on"
    ingest._commit_without_waiting()
    assert setting() == "off"
    connection.close()
    assert setting() == "on"  # a new connection
    ingest._commit_without_waiting()
    assert setting() == "off"
    connection.close()


class _Terminal(StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_command_reports_its_loose_files_and_a_bundle_as_one(tmp_path, settings, jobs,
                                                                 monkeypatch):
    """Each loose file gets its line (and, on a terminal, its progress by name); a bundle's
    files are told by the bundle's summary, not one by one."""
    from pathlib import Path

    from timelines.ingest import pipeline

    settings.BULK_LOAD_MIN_BYTES = 1 << 40  # through the store, file by file
    monkeypatch.setattr(pipeline, "THREAD_MIN_BYTES", 1)  # progress at the first report
    path = write_log(tmp_path / "loose.log", audit_event("r1", "ResponseComplete"))
    bundle = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "bundles" / (
        "troubleshoot-supportbundle-baseline.tar.gz")
    out, err = StringIO(), _Terminal()
    call_command("ingest", str(path), str(bundle), incident="report", jobs=jobs,
                 wait_complete=True, stdout=out, stderr=err)

    lines = out.getvalue().splitlines()
    assert len([line for line in lines if line.startswith("loose.log: running, 1 events")]) == 1
    if jobs == 1:  # the progress of a file read in this process
        progress = err.getvalue().replace("\r\033[K", "\n").splitlines()
        assert any(line.startswith("loose.log:") and "%" in line for line in progress)
    bundle_lines = [line for line in lines if line.startswith(bundle.name)]
    assert len(bundle_lines) == 1 and "files (" in bundle_lines[0]
    files = Upload.objects.filter(parent__name=bundle.name)
    assert files.count() > 100
    assert not [line for line in lines
                if any(line.startswith(f"{name}:") for name in files.values_list("name",
                                                                                flat=True))]
