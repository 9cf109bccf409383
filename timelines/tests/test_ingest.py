"""The event store on PostgreSQL: merging files, stage collapse, idempotence, bad input,
redaction at rest, upload file handling, body chunks and the upload claim.

Expected values are derived from the fixture files with the ``json`` module, never from the code
under test.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from incidents.models import Incident, Upload
from timelines.ingest import create_local_upload, ingest_upload, purge_incident, write_rows
from timelines.models import BodyChunk, Event
from timelines.parsers import Redactor, Report, audit, parse_audit

pytestmark = pytest.mark.django_db

SECRET_VALUES = ("MY-KEY", "MY-ID")


# --- helpers -----------------------------------------------------------------------------------

def audit_log(fixtures_dir: Path, name: str) -> Path:
    return fixtures_dir / "audit" / name


def json_lines(path: Path) -> list[tuple[int, dict]]:
    """(1-based line number, event) for every non-empty line of a JSON-lines file."""
    out = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                out.append((number, json.loads(line)))
    return out


def identity(event: dict) -> tuple[str, str]:
    return event["auditID"], event.get("requestReceivedTimestamp") or event["timestamp"]


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def read_line(path: Path, number: int) -> dict:
    with path.open(encoding="utf-8") as handle:
        for current, line in enumerate(handle, start=1):
            if current == number:
                return json.loads(line)
    raise AssertionError(f"{path} has no line {number}")


def events_of(incident) -> list[Event]:
    return list(Event.objects.filter(incident=incident).order_by("id"))


def chunk_ids_of(incident) -> set[int]:
    return set(BodyChunk.objects.filter(incident=incident).values_list("pk", flat=True))


def referenced_chunks_of(incident) -> set[int]:
    return set(Event.objects.filter(incident=incident).values_list("body_chunk", flat=True))


# --- merging several files into one timeline ---------------------------------------------------

def test_several_node_files_merge_into_one_timeline_with_source_and_line(
        incident, ingest_file, fixtures_dir, tmp_path):
    demo = audit_log(fixtures_dir, "audit2rbac-demo.log")
    openshift = audit_log(fixtures_dir, "openshift-requestresponse.log")
    lines = [line for line in demo.read_text(encoding="utf-8").splitlines() if line.strip()]
    nodes = [tmp_path / f"node-{n}.log" for n in range(3)]
    for n, node in enumerate(nodes):
        node.write_text("".join(line + "\n" for line in lines[n::3]), encoding="utf-8")
    files = [*nodes, openshift]

    expected = set()
    for path in files:
        expected |= {identity(event) for _, event in json_lines(path)}

    uploads = [ingest_file(incident, path) for path in files]

    assert [u.status for u in uploads] == ["done"] * len(files)
    assert sum(u.event_count for u in uploads) == len(expected)
    events = events_of(incident)
    assert len(events) == len(expected)
    assert {(e.audit_id, e.received) for e in events} == {
        (audit_id, parse_time(received)) for audit_id, received in expected}

    by_name = {path.name: path for path in files}
    assert {e.source for e in events} == set(by_name)
    for event in events:
        # every event points at the file and line it came from
        original = read_line(by_name[event.source], event.line)
        assert original["auditID"] == event.audit_id
        assert original["verb"] == event.verb
    # node-1.log line 2 is the demo log's line 5 (lines[1::3][1] == lines[4])
    second_of_node1 = json.loads(lines[4])
    event = Event.objects.get(incident=incident, source="node-1.log", line=2)
    assert event.audit_id == second_of_node1["auditID"]
    assert event.received == parse_time(second_of_node1["timestamp"])


def test_upload_counts_events_and_new_events_per_file(incident, ingest_file, fixtures_dir):
    demo = audit_log(fixtures_dir, "audit2rbac-demo.log")
    expected = len({identity(event) for _, event in json_lines(demo)})

    upload = ingest_file(incident, demo)

    assert upload.status == Upload.Status.DONE
    assert upload.event_count == expected
    assert upload.new_events == expected
    assert upload.skipped_lines == 0
    assert upload.errors == []
    assert upload.bytes_read == upload.bytes_total == demo.stat().st_size
    assert upload.progress == 1.0
    assert upload.finished_at is not None


def test_incidents_keep_separate_timelines(team, owner, ingest_file, fixtures_dir):
    demo = audit_log(fixtures_dir, "audit2rbac-demo.log")
    first = Incident.objects.create(title="first", team=team)
    second = Incident.objects.create(title="second", team=team)

    ingest_file(first, demo)
    upload = ingest_file(second, demo)

    count = len(json_lines(demo))
    assert upload.new_events == count
    assert Event.objects.filter(incident=first).count() == count
    assert Event.objects.filter(incident=second).count() == count


def test_deleted_evidence_stays_deleted_when_another_ingest_follows(
        team, ingest_file, fixtures_dir):
    """Inline writes (inside a caller's transaction, as here) must not merge earlier batches'
    staged rows again: that would bring back the events of a deleted incident."""
    gone = Incident.objects.create(title="deleted", team=team)
    kept = Incident.objects.create(title="kept", team=team)
    ingest_file(gone, audit_log(fixtures_dir, "audit2rbac-demo.log"))
    gone_id = gone.pk
    gone.delete()
    purge_incident(gone_id)
    assert not Event.objects.filter(incident_id=gone_id).exists()

    upload = ingest_file(kept, audit_log(fixtures_dir, "openshift-requestresponse.log"))

    assert not Event.objects.filter(incident_id=gone_id).exists()
    expected = len(json_lines(audit_log(fixtures_dir, "openshift-requestresponse.log")))
    assert upload.new_events == expected
    assert Event.objects.filter(incident=kept).count() == expected


def test_a_file_holding_the_same_lines_twice_stores_each_request_once(
        incident, ingest_file, fixtures_dir, tmp_path):
    demo = audit_log(fixtures_dir, "audit2rbac-demo.log")
    path = tmp_path / "doubled.log"
    path.write_bytes(demo.read_bytes() * 2)
    expected = {identity(event) for _, event in json_lines(demo)}

    upload = ingest_file(incident, path)

    assert upload.status == "done", upload.message
    assert upload.new_events == len(expected)
    assert Event.objects.filter(incident=incident).count() == len(expected)
    assert chunk_ids_of(incident) == referenced_chunks_of(incident)


# --- stage collapse across files ---------------------------------------------------------------

def _received_stage_of(complete: dict) -> dict:
    """The RequestReceived stage the apiserver logs before ``complete``'s ResponseComplete."""
    event = json.loads(json.dumps(complete))
    event["stage"] = "RequestReceived"
    event["stageTimestamp"] = event["requestReceivedTimestamp"]
    for key in ("responseStatus", "responseObject"):
        event.pop(key, None)
    return event


def _split_request(fixtures_dir, tmp_path):
    """One request split over two apiserver files: its RequestReceived stage in the first, its
    ResponseComplete in the second. Returns the complete event and the two files."""
    _, complete = json_lines(audit_log(fixtures_dir, "openshift-requestresponse.log"))[0]
    file_a = tmp_path / "apiserver-a.log"
    file_b = tmp_path / "apiserver-b.log"
    file_a.write_text(json.dumps(_received_stage_of(complete)) + "\n", encoding="utf-8")
    file_b.write_text(json.dumps(complete) + "\n", encoding="utf-8")
    return complete, file_a, file_b


def test_stage_collapse_across_files_completes_the_same_row(
        incident, ingest_file, fixtures_dir, tmp_path):
    complete, file_a, file_b = _split_request(fixtures_dir, tmp_path)
    received = parse_time(complete["requestReceivedTimestamp"])
    completed = parse_time(complete["stageTimestamp"])

    upload_a = ingest_file(incident, file_a)

    assert upload_a.status == "done" and upload_a.new_events == 1
    (open_span,) = events_of(incident)
    assert open_span.audit_id == complete["auditID"]
    assert open_span.received == received
    assert open_span.completed is None
    assert open_span.duration_ms is None
    assert open_span.code is None
    assert open_span.stage == "RequestReceived"
    assert open_span.source == "apiserver-a.log"

    upload_b = ingest_file(incident, file_b)

    assert upload_b.status == "done"
    assert upload_b.event_count == 1 and upload_b.new_events == 0
    (done,) = events_of(incident)
    assert done.pk == open_span.pk
    assert done.completed == completed
    assert done.duration_ms == pytest.approx((completed - received).total_seconds() * 1000)
    assert done.code == complete["responseStatus"]["code"]
    assert done.stage == "ResponseComplete"
    assert done.source == "apiserver-b.log" and done.line == 1
    assert done.body()["stage"] == "ResponseComplete"

    # The earlier stage arriving again must not reopen the request.
    ingest_file(incident, file_a)

    (still,) = events_of(incident)
    assert still.pk == open_span.pk
    assert still.completed == completed
    assert still.stage == "ResponseComplete"
    assert still.source == "apiserver-b.log"
    assert still.body()["stage"] == "ResponseComplete"


def test_stages_of_one_request_in_one_file_are_one_row(incident, ingest_file, fixtures_dir,
                                                       tmp_path):
    entries = json_lines(audit_log(fixtures_dir, "openshift-requestresponse.log"))
    path = tmp_path / "both-stages.log"
    with path.open("w", encoding="utf-8") as out:
        for _, complete in entries:
            out.write(json.dumps(_received_stage_of(complete)) + "\n")
        for _, complete in entries:
            out.write(json.dumps(complete) + "\n")

    upload = ingest_file(incident, path)

    assert upload.event_count == len(entries)
    events = events_of(incident)
    assert len(events) == len(entries)
    assert all(e.completed is not None and e.stage == "ResponseComplete" for e in events)
    # the final stage's line: the second half of the file
    assert sorted(e.line for e in events) == list(range(len(entries) + 1, 2 * len(entries) + 1))


# --- idempotent re-ingest ----------------------------------------------------------------------

def test_ingesting_the_same_file_twice_changes_nothing(incident, ingest_file, fixtures_dir):
    demo = audit_log(fixtures_dir, "audit2rbac-demo.log")
    count = len({identity(event) for _, event in json_lines(demo)})

    first = ingest_file(incident, demo)
    before = {(e.audit_id, e.received): (e.pk, e.body_chunk, e.body_index, e.upload_id)
              for e in events_of(incident)}
    chunks_before = chunk_ids_of(incident)
    second = ingest_file(incident, demo)

    assert first.new_events == count
    assert second.status == "done"
    assert second.event_count == count
    assert second.new_events == 0
    after = {(e.audit_id, e.received): (e.pk, e.body_chunk, e.body_index, e.upload_id)
             for e in events_of(incident)}
    assert after == before
    assert len(after) == count
    # the second run's chunks were not needed and are gone
    assert chunk_ids_of(incident) == chunks_before


# --- bad input ---------------------------------------------------------------------------------

def test_malformed_lines_are_skipped_and_reported_good_lines_stored(
        incident, ingest_file, fixtures_dir, tmp_path):
    good = [line for line in audit_log(fixtures_dir, "audit2rbac-demo.log")
            .read_text(encoding="utf-8").splitlines() if line.strip()][:4]
    no_audit_id = json.loads(good[0])
    del no_audit_id["auditID"]
    content = [
        good[0],
        '{"kind":"Event","auditID": "truncated',  # 2: malformed JSON
        good[1],
        '{"kind": 0}',  # 4: not an audit event
        good[2],
        json.dumps(no_audit_id),  # 6: no auditID
        "",  # 7: blank lines are not errors
        good[3],
    ]
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(content) + "\n", encoding="utf-8")
    bad_lines = {2, 4, 6}

    upload = ingest_file(incident, path)

    assert upload.status == Upload.Status.DONE
    assert upload.message == ""
    assert upload.skipped_lines == len(bad_lines)
    assert upload.event_count == len(good)
    assert len(upload.errors) == len(bad_lines)
    numbers = set()
    for error in upload.errors:
        match = re.fullmatch(r"mixed\.log:(\d+): (.+)", error)
        assert match, error
        numbers.add(int(match.group(1)))
    assert numbers == bad_lines
    events = events_of(incident)
    assert {e.audit_id for e in events} == {json.loads(line)["auditID"] for line in good}
    assert sorted(e.line for e in events) == [1, 3, 5, 8]


def test_file_without_audit_events_fails_naming_the_file(incident, ingest_file, fixtures_dir):
    path = audit_log(fixtures_dir, "falco/fal_01_003.json")

    upload = ingest_file(incident, path)

    assert upload.status == Upload.Status.FAILED
    assert "fal_01_003.json" in upload.message
    assert upload.event_count == 0
    assert upload.finished_at is not None
    assert not Event.objects.filter(incident=incident).exists()


def test_missing_file_fails(incident, fixtures_dir, tmp_path):
    path = tmp_path / "gone.log"
    shutil.copy(audit_log(fixtures_dir, "audit2rbac-demo.log"), path)
    upload = create_local_upload(incident, path)
    path.unlink()

    result = ingest_upload(upload.pk)

    assert result.status == Upload.Status.FAILED
    assert "gone.log" in result.message
    assert not Event.objects.filter(incident=incident).exists()


def test_file_that_is_no_evidence_fails_and_says_why(incident, ingest_file, fixtures_dir):
    # AdmissionReview captures: JSON lines about Kubernetes objects, but no audit log
    path = fixtures_dir / "admission" / "kube-audit-rest.log"

    upload = ingest_file(incident, path)

    assert upload.status == Upload.Status.FAILED
    assert path.name in upload.message
    assert "not evidence Hindsight reads (JSON" in upload.message
    assert not Event.objects.filter(incident=incident).exists()


# --- redaction at rest -------------------------------------------------------------------------

def test_secret_values_are_nowhere_in_the_database(incident, ingest_file, fixtures_dir):
    path = audit_log(fixtures_dir, "falco/create_configmap_sensitive_values.json")
    raw = path.read_text(encoding="utf-8")
    for secret in SECRET_VALUES:
        assert secret in raw  # the premise: the input does hold them
    entries = json_lines(path)

    upload = ingest_file(incident, path)

    assert upload.status == "done"
    assert upload.event_count == len(entries)
    assert upload.redacted > 0
    with connection.cursor() as cursor:
        # every column of every event row, as PostgreSQL renders the row
        cursor.execute("SELECT t::text FROM timelines_event t WHERE incident_id = %s",
                       [incident.pk])
        rows = [r[0] for r in cursor.fetchall()]
        cursor.execute("SELECT data FROM timelines_bodychunk WHERE incident_id = %s",
                       [incident.pk])
        chunks = [b"\n".join(BodyChunk(data=r[0]).lines()).decode()
                  for r in cursor.fetchall()]
        cursor.execute("SELECT t::text FROM incidents_upload t WHERE incident_id = %s",
                       [incident.pk])
        upload_rows = [r[0] for r in cursor.fetchall()]
    assert len(rows) == len(entries)
    assert chunks
    stored_lines = [line for chunk in chunks for line in chunk.split("\n")]
    assert len(stored_lines) >= len(entries)
    for secret in SECRET_VALUES:
        for text in rows + chunks + upload_rows:
            assert secret not in text
    # what is not secret is kept
    assert all("color.good=purple" in line for line in stored_lines)

    for event in events_of(incident):
        body = event.body()
        assert body["auditID"] == event.audit_id
        for key in ("requestObject", "responseObject"):
            value = body[key]["data"]["access.properties"]
            assert "[REDACTED]" in value
            assert "MY-KEY" not in value and "MY-ID" not in value
            assert body[key]["data"]["ui.properties"] == (
                "color.good=purple\ncolor.bad=yellow\nallow.textmode=true\n")


def test_body_is_the_stored_event_unchanged_when_nothing_is_secret(
        incident, ingest_file, fixtures_dir):
    path = audit_log(fixtures_dir, "openshift-requestresponse.log")
    originals = {event["auditID"]: event for _, event in json_lines(path)}

    upload = ingest_file(incident, path)

    assert upload.redacted == 0
    for event in events_of(incident):
        assert event.body() == originals[event.audit_id]


def test_redaction_can_be_disabled(incident, ingest_file, fixtures_dir, settings):
    settings.REDACT = False
    path = audit_log(fixtures_dir, "falco/create_configmap_sensitive_values.json")

    upload = ingest_file(incident, path)

    assert upload.redacted == 0
    assert all("MY-KEY" in e.body()["requestObject"]["data"]["access.properties"]
               for e in events_of(incident))


# --- the uploaded file after ingest ------------------------------------------------------------

def test_api_upload_copy_is_deleted_after_ingest(incident, owner, fixtures_dir, settings):
    folder = Path(settings.UPLOAD_DIR) / "copy"
    folder.mkdir(parents=True)
    copy = folder / "audit.log"
    shutil.copy(audit_log(fixtures_dir, "audit2rbac-demo.log"), copy)
    upload = Upload.objects.create(incident=incident, name="audit.log", path=str(copy),
                                   path_is_copy=True, uploaded_by=owner,
                                   bytes_total=copy.stat().st_size)

    result = ingest_upload(upload.pk)

    assert result.status == "done"
    assert not copy.exists()
    assert result.path == ""
    assert result.event_count == len(json_lines(audit_log(fixtures_dir, "audit2rbac-demo.log")))


def test_api_upload_copy_is_deleted_even_when_the_ingest_fails(incident, fixtures_dir, settings):
    folder = Path(settings.UPLOAD_DIR) / "copy"
    folder.mkdir(parents=True)
    copy = folder / "fal_01_003.json"
    shutil.copy(audit_log(fixtures_dir, "falco/fal_01_003.json"), copy)
    upload = Upload.objects.create(incident=incident, name=copy.name, path=str(copy),
                                   path_is_copy=True)

    result = ingest_upload(upload.pk)

    assert result.status == "failed"
    assert not copy.exists()


def test_local_file_of_manage_py_ingest_is_left_in_place(incident, fixtures_dir, tmp_path):
    path = tmp_path / "kept.log"
    shutil.copy(audit_log(fixtures_dir, "audit2rbac-demo.log"), path)
    content = path.read_bytes()
    upload = create_local_upload(incident, path)
    assert upload.path_is_copy is False

    result = ingest_upload(upload.pk)

    assert result.status == "done"
    assert path.read_bytes() == content
    assert result.path == str(path.resolve())


# --- body chunks -------------------------------------------------------------------------------

def _rows(path: Path):
    report = Report(path.name)
    with path.open("rb") as handle:
        return list(parse_audit(handle, report, Redactor()))


@pytest.mark.parametrize("optimistic", [True, False], ids=["straight-copy", "staged-merge"])
def test_write_rows_twice_leaves_no_orphan_chunks(incident, fixtures_dir, optimistic):
    rows = _rows(audit_log(fixtures_dir, "audit2rbac-demo.log"))

    assert write_rows(incident.pk, None, rows, optimistic=optimistic) == len(rows)
    chunks_after_first = chunk_ids_of(incident)
    assert write_rows(incident.pk, None, rows, optimistic=optimistic) == 0

    assert Event.objects.filter(incident=incident).count() == len(rows)
    assert chunk_ids_of(incident) == chunks_after_first
    assert chunk_ids_of(incident) == referenced_chunks_of(incident)


def test_write_rows_with_overlap_keeps_only_referenced_chunks(incident, fixtures_dir):
    demo = _rows(audit_log(fixtures_dir, "audit2rbac-demo.log"))
    openshift = _rows(audit_log(fixtures_dir, "openshift-requestresponse.log"))

    write_rows(incident.pk, None, demo)
    new = write_rows(incident.pk, None, [*demo[:10], *openshift])

    assert new == len(openshift)
    assert Event.objects.filter(incident=incident).count() == len(demo) + len(openshift)
    assert chunk_ids_of(incident) == referenced_chunks_of(incident)
    # every event's body is reachable and is its own
    for event in events_of(incident):
        assert event.body()["auditID"] == event.audit_id


def test_completing_an_open_span_from_another_file_leaves_no_orphan_chunk(
        incident, ingest_file, fixtures_dir, tmp_path):
    complete, file_a, file_b = _split_request(fixtures_dir, tmp_path)

    ingest_file(incident, file_a)
    ingest_file(incident, file_b)

    assert chunk_ids_of(incident) == referenced_chunks_of(incident)


def test_a_chunk_still_used_by_other_events_survives_a_completion(
        incident, ingest_file, fixtures_dir, tmp_path, monkeypatch):
    # The Python parser puts an open span and complete requests in one chunk (the C scanner
    # keeps open spans apart, in Python's chunks).
    monkeypatch.setattr(audit, "_auditscan", None)
    entries = [event for _, event in json_lines(
        audit_log(fixtures_dir, "openshift-requestresponse.log"))]
    first, others = entries[0], entries[1:]
    file_a = tmp_path / "a.log"
    file_b = tmp_path / "b.log"
    # A: the first request's opening stage and the other requests, complete: one chunk
    file_a.write_text("".join(json.dumps(e) + "\n"
                              for e in [_received_stage_of(first), *others]), encoding="utf-8")
    file_b.write_text(json.dumps(first) + "\n", encoding="utf-8")

    ingest_file(incident, file_a)
    (chunk_a,) = chunk_ids_of(incident)
    ingest_file(incident, file_b)

    assert chunk_a in chunk_ids_of(incident)
    assert chunk_ids_of(incident) == referenced_chunks_of(incident)
    assert len(chunk_ids_of(incident)) == 2
    for event in events_of(incident):
        assert event.body()["auditID"] == event.audit_id
        assert event.body()["stage"] == "ResponseComplete"


def test_bodies_of_more_than_one_chunk_are_each_events_own(incident, fixtures_dir, tmp_path,
                                                            monkeypatch):
    import timelines.ingest.store as ingest

    monkeypatch.setattr(ingest, "CHUNK_ROWS", 4)
    rows = _rows(audit_log(fixtures_dir, "audit2rbac-demo.log"))

    write_rows(incident.pk, None, rows)

    assert len(chunk_ids_of(incident)) == -(-len(rows) // 4)
    for event in events_of(incident):
        body = event.body()
        assert body["auditID"] == event.audit_id
        assert body["verb"] == event.verb


# --- the claim ---------------------------------------------------------------------------------

@pytest.fixture
def local_upload(incident, fixtures_dir, tmp_path):
    path = tmp_path / "claimed.log"
    shutil.copy(audit_log(fixtures_dir, "audit2rbac-demo.log"), path)
    return create_local_upload(incident, path)


def _hold(upload: Upload, claimant: str, heartbeat, attempts: int = 1) -> Upload:
    Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.RUNNING, claimed_by=claimant,
                                               heartbeat_at=heartbeat, started_at=heartbeat,
                                               attempts=attempts)
    return Upload.objects.get(pk=upload.pk)


def _snapshot(upload_id: int) -> dict:
    return Upload.objects.filter(pk=upload_id).values().get()


def test_upload_held_by_a_live_worker_is_not_claimed(local_upload, incident):
    held = _hold(local_upload, "worker-a", timezone.now())
    before = _snapshot(held.pk)

    assert ingest_upload(held.pk, claimant="worker-b") is None

    assert _snapshot(held.pk) == before
    assert not Event.objects.filter(incident=incident).exists()


def test_same_claimant_can_claim_again_on_retry(local_upload, incident):
    held = _hold(local_upload, "task-1", timezone.now(), attempts=1)

    result = ingest_upload(held.pk, claimant="task-1")

    assert result is not None
    assert result.status == "done"
    assert result.claimed_by == "task-1"
    assert result.attempts == 2
    assert Event.objects.filter(incident=incident).count() == result.event_count > 0


def test_stale_heartbeat_is_taken_over(local_upload, incident, settings):
    stale = timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS + 5)
    held = _hold(local_upload, "lost-worker", stale, attempts=1)

    result = ingest_upload(held.pk, claimant="new-worker")

    assert result.status == "done"
    assert result.claimed_by == "new-worker"
    assert result.attempts == 2
    assert Event.objects.filter(incident=incident).count() == result.event_count > 0


def test_finished_upload_is_not_claimed_again(local_upload):
    done = ingest_upload(local_upload.pk)
    assert done.status == "done"
    before = _snapshot(done.pk)

    assert ingest_upload(done.pk) is None
    assert ingest_upload(done.pk, claimant=done.claimed_by) is None
    assert _snapshot(done.pk) == before


def test_claim_of_a_deleted_upload_returns_none(db):
    assert ingest_upload(10**9, claimant="x") is None


def test_requeue_stale_uploads_requeues_or_fails(incident, settings, tmp_path):
    from timelines.tasks import requeue_stale_uploads

    # No broker: the requeued upload is started in a thread on commit, which never comes inside
    # the test transaction; the row's state is what is checked here.
    settings.CELERY_BROKER_URL = ""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.UPLOAD_STALE_SECONDS + 5)

    def upload(name, heartbeat, attempts):
        path = tmp_path / f"{name}-{uuid.uuid4().hex}.log"
        path.write_text("{}\n")
        row = create_local_upload(incident, path)
        return _hold(row, f"worker-{name}", heartbeat, attempts=attempts)

    lost = upload("lost", stale, 1)
    exhausted = upload("exhausted", stale, settings.UPLOAD_MAX_ATTEMPTS)
    alive = upload("alive", now, 1)
    alive_before = _snapshot(alive.pk)

    assert requeue_stale_uploads() == 2

    lost.refresh_from_db()
    assert lost.status == Upload.Status.PENDING
    assert lost.claimed_by == ""
    assert lost.attempts == 1
    exhausted.refresh_from_db()
    assert exhausted.status == Upload.Status.FAILED
    assert str(settings.UPLOAD_MAX_ATTEMPTS) in exhausted.message
    assert exhausted.finished_at is not None
    assert _snapshot(alive.pk) == alive_before

    # the requeued upload is claimable by a new worker (no claimant of its own any more)
    assert ingest_upload(lost.pk, claimant="fresh") is not None
