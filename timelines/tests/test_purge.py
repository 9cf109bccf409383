"""Deleting an incident and purging its evidence (``timelines.ingest.purge``): the partition of a
bulk-loaded incident and its rows in the DEFAULT partition, purges that were lost, an ingest
still running when its incident is deleted, and the embedded default (SQLite, a thread)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.utils import timezone

from incidents.models import Incident, IncidentGone, Upload
from timelines.ingest import (
    bulk,
    create_local_upload,
    delete_incident,
    ingest_upload,
    pipeline,
    purge,
    purge_incident,
)
from timelines.models import BodyChunk, Event, IncidentPurge

from .test_bulk import audit_event, has_partition, load, table_exists, write_log
from .test_worker import _big_audit_log


def counts(incident_id: int) -> tuple[int, int]:
    return (Event.objects.filter(incident_id=incident_id).count(),
            BodyChunk.objects.filter(incident_id=incident_id).count())


@pytest.mark.django_db(transaction=True)
def test_the_partition_and_the_default_rows_of_deleted_incidents_are_purged(
        tmp_path, team, drop_partitions, ingest_file, demo_log):
    loaded, merged, kept = (Incident.objects.create(title=t, team=team)
                            for t in ("bulk", "default", "kept"))
    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"),
                     audit_event("req-2", "ResponseComplete", second=1))
    assert load(loaded, [path]).attached
    ingest_file(merged, demo_log)
    ingest_file(kept, demo_log)
    before = {i.pk: counts(i.pk) for i in (loaded, merged, kept)}

    for incident in (loaded, merged):
        assert delete_incident(incident)
    assert has_partition(loaded.pk)  # the request leaves it to the purge
    assert counts(merged.pk) == before[merged.pk]

    done = {i.pk: purge_incident(i.pk) for i in (loaded, merged)}

    assert done[loaded.pk]["partition"] == 1 and done[loaded.pk]["events"] == 0
    assert done[merged.pk] == {"partition": 0, "events": 37, "chunks": before[merged.pk][1],
                               "files": 0}
    assert not has_partition(loaded.pk)
    assert not table_exists(bulk.partition_table(loaded.pk))
    assert counts(loaded.pk) == counts(merged.pk) == (0, 0)
    assert counts(kept.pk) == before[kept.pk]
    assert not IncidentPurge.objects.exists()


@pytest.mark.django_db
def test_deleting_twice_deletes_once(incident):
    assert delete_incident(incident) is True
    assert delete_incident(incident) is False
    assert IncidentPurge.objects.filter(pk=incident.pk).count() == 1


@pytest.mark.django_db
def test_the_purge_never_touches_an_incident_that_exists(incident, ingest_file, demo_log):
    ingest_file(incident, demo_log)
    IncidentPurge.objects.create(incident_id=incident.pk)  # cannot happen; guarded all the same

    assert purge_incident(incident.pk) is None

    assert counts(incident.pk)[0] == 37
    assert not IncidentPurge.objects.exists()


@pytest.mark.django_db
def test_a_lost_purge_is_queued_again_once(team, task_queue, django_capture_on_commit_callbacks):
    from timelines.tasks import requeue_lost_purges

    recent = Incident.objects.create(title="recent", team=team)
    lost = Incident.objects.create(title="lost", team=team)
    for incident in (recent, lost):
        delete_incident(incident)
    IncidentPurge.objects.filter(pk=lost.pk).update(
        queued_at=timezone.now() - purge.LOST_AFTER - timedelta(seconds=1))
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert broker.llen(task_queue) == 0  # the deletions' own purges: queued only on commit

    with django_capture_on_commit_callbacks(execute=True):
        assert requeue_lost_purges() == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert requeue_lost_purges() == 0  # queued again just now

    messages = [json.loads(m) for m in broker.lrange(task_queue, 0, -1)]
    assert [(m["headers"]["task"], json.loads(__import__("base64").b64decode(m["body"]))[0])
            for m in messages] == [("timelines.tasks.purge_incident_task", [lost.pk])]
    assert IncidentPurge.objects.get(pk=lost.pk).queued_at > timezone.now() - timedelta(minutes=1)


# --- an ingest running when its incident is deleted ---------------------------------------------

@pytest.fixture
def big_log(tmp_path, fixtures_dir):
    """A log large enough to be written by the writer thread (``THREAD_MIN_BYTES``)."""
    path = tmp_path / "big-audit.log"
    _big_audit_log(path, fixtures_dir, 12_000)
    assert path.stat().st_size > pipeline.THREAD_MIN_BYTES
    return path


@pytest.mark.django_db(transaction=True)
def test_an_ingest_stops_when_its_incident_is_deleted_and_leaves_nothing_behind(
        team, big_log, monkeypatch):
    monkeypatch.setattr(pipeline, "PROGRESS_SECONDS", 0)  # report (and notice) every block
    incident = Incident.objects.create(title="deleted while ingesting", team=team)
    upload = create_local_upload(incident, big_log)
    seen = {}

    def delete_once_events_are_stored(done: int, total: int, rows: int) -> None:
        stored = Event.objects.filter(incident_id=incident.pk).count()
        if stored and "deleted" not in seen:
            assert delete_incident(incident)
            seen["deleted"] = Event.objects.filter(incident_id=incident.pk).count()
            seen["of"] = total

    result = ingest_upload(upload.pk, on_progress=delete_once_events_are_stored)

    assert result is None  # no exception, nothing to report: the row is gone
    assert 0 < seen["deleted"] < 12_000
    # Not one batch was written after the deletion committed (incidents.models.hold_incident) ...
    assert Event.objects.filter(incident_id=incident.pk).count() == seen["deleted"]
    assert not Upload.objects.filter(pk=upload.pk).exists()
    # ... so the purge that the deletion queued removes everything, once.
    purge_incident(incident.pk)
    assert counts(incident.pk) == (0, 0)
    assert big_log.exists()  # a file read in place (manage.py ingest) is never Hindsight's


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_a_deleted_incident_is_refused(team, tmp_path):
    from timelines.ingest import write_rows
    from timelines.parsers import Redactor, Report, parse_audit

    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    with path.open("rb") as handle:
        rows = list(parse_audit(handle, Report(source="a.log"), Redactor()))
    incident = Incident.objects.create(title="gone", team=team)
    delete_incident(incident)

    with pytest.raises(IncidentGone):
        write_rows(incident.pk, None, rows)

    assert counts(incident.pk) == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_bulk_load_whose_incident_is_deleted_becomes_visible_nowhere(tmp_path, team,
                                                                       drop_partitions):
    incident = Incident.objects.create(title="bulk, deleted", team=team)
    table = bulk.start_load(incident.pk)
    path = write_log(tmp_path / "a.log", audit_event("req-1", "ResponseComplete"))
    assert ingest_upload(create_local_upload(incident, path).pk, table=table).stage == "reading"
    delete_incident(incident)

    with pytest.raises(IncidentGone):
        bulk.finish_load(incident.pk, table)

    assert not has_partition(incident.pk) and table_exists(table)
    purge_incident(incident.pk)
    assert not table_exists(table)
    assert counts(incident.pk) == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_an_upload_deleted_while_it_is_ingested_stops_and_its_incident_keeps_the_rest(
        team, big_log, monkeypatch):
    """A redelivered bundle that starts over deletes the files of its earlier attempt, whose
    ingest may still run elsewhere: it stops without an error, and the incident stays."""
    monkeypatch.setattr(pipeline, "PROGRESS_SECONDS", 0)
    incident = Incident.objects.create(title="kept", team=team)
    upload = create_local_upload(incident, big_log)

    def delete_the_upload(done: int, total: int, rows: int) -> None:
        Upload.objects.filter(pk=upload.pk).delete()

    assert ingest_upload(upload.pk, on_progress=delete_the_upload) is None
    assert Incident.objects.filter(pk=incident.pk).exists()
    assert not IncidentPurge.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bulk_load", [False, True])
def test_manage_py_ingest_says_so_when_its_incident_is_deleted_meanwhile(
        tmp_path, fixtures_dir, settings, drop_partitions, bulk_load):
    """``--incident-id`` adds to the DEFAULT partition; a new incident of enough bytes is
    bulk-loaded into a table of its own: either way the command ends with a clear error, and the
    purge leaves nothing."""
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    settings.BULK_LOAD_MIN_BYTES = 1 if bulk_load else 1 << 40
    paths = [tmp_path / f"node-{n}.log" for n in (1, 2)]
    for path in paths:
        _big_audit_log(path, fixtures_dir, 40_000)  # random auditIDs: no request twice
    target = {} if bulk_load else {"incident_id": Incident.objects.create(title="cli").pk}
    outcome = {}

    def run() -> None:
        try:
            call_command("ingest", *map(str, paths), json=True, stdout=StringIO(),
                         stderr=StringIO(), **(target or {"incident": "cli"}))
        except CommandError as exc:
            outcome["error"] = str(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not Upload.objects.filter(
            incident__title="cli", event_count__gt=0).exists():
        time.sleep(0.01)
    incident = Incident.objects.get(title="cli")
    assert delete_incident(incident)
    thread.join(timeout=120)

    assert not thread.is_alive()
    assert outcome["error"] == (f"incident {incident.pk} was deleted while its files were being "
                                "ingested: nothing of them is kept")
    purge_incident(incident.pk)
    assert counts(incident.pk) == (0, 0)
    assert not has_partition(incident.pk)
    assert not table_exists(bulk.load_table(incident.pk))


# --- the embedded default ------------------------------------------------------------------------

@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_on_sqlite_a_thread_purges_a_deleted_incident(incident, ingest_file, demo_log,
                                                      superuser, client):
    ingest_file(incident, demo_log)
    assert counts(incident.pk)[0] == 37
    client.force_login(superuser)

    assert client.delete(f"/api/v1/incidents/{incident.pk}/").status_code == 204
    assert client.get(f"/api/v1/incidents/{incident.pk}/").status_code == 404

    deadline = time.monotonic() + 20
    while IncidentPurge.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not IncidentPurge.objects.exists()
    assert counts(incident.pk) == (0, 0)


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_on_sqlite_incident_ids_are_never_reused(team):
    assert connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s",
                       [Incident._meta.db_table])
        assert "AUTOINCREMENT" in cursor.fetchone()[0]
    last = Incident.objects.create(title="the newest", team=team)
    gone = last.pk
    last.delete()  # without AUTOINCREMENT, SQLite would give the next row this id again

    assert Incident.objects.create(title="next", team=team).pk > gone
