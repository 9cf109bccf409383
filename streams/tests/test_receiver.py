"""The webhook receiver: what kube-apiserver posts is stored once, redacted, or refused whole."""

from __future__ import annotations

import orjson
import pytest

from streams import receiver, store
from timelines.ingest import create_local_upload, ingest_upload
from timelines.models import Event

from .helpers import event_list, expected_rows, fixture_events

pytestmark = pytest.mark.django_db


def _identities(queryset):
    return set(queryset.values_list("audit_id", "received"))


def test_it_stores_a_batch_as_the_upload_parser_reads_the_file(stream_of, post_batch, demo_log):
    stream, token = stream_of()
    expected = expected_rows(demo_log)
    answer = post_batch(stream.pk, event_list(fixture_events(demo_log)), token)
    assert answer.status_code == 200, answer.content
    assert answer.json()["new"] == len(expected)
    stored = store.events(stream)
    assert stored.count() == len(expected)
    assert _identities(stored) == {(r.audit_id, r.received) for r in expected}
    assert set(stored.values_list("stage", flat=True)) == {r.stage for r in expected}


def test_a_batch_sent_twice_adds_nothing(stream_of, post_batch, demo_log):
    stream, token = stream_of()
    body = event_list(fixture_events(demo_log))
    assert post_batch(stream.pk, body, token).status_code == 200
    before = dict(store.events(stream).values_list("id", "audit_id"))
    again = post_batch(stream.pk, body, token)
    assert again.status_code == 200
    assert again.json()["new"] == 0
    assert dict(store.events(stream).values_list("id", "audit_id")) == before


def test_a_batch_is_merged_through_its_slots_table_alone(stream_of, post_batch, demo_log):
    """Every stream adds partitions; a merge through the parent table would plan and probe them
    all (302 ms a batch with eleven streams, ``bench/README.md``)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    stream, token = stream_of()
    stream_of("other")  # partitions of another stream, which the merge must not read
    body = event_list(fixture_events(demo_log))
    assert post_batch(stream.pk, body, token).status_code == 200
    with CaptureQueriesContext(connection) as queries:
        again = post_batch(stream.pk, body, token)  # all stored: merged, not copied
    assert again.status_code == 200 and again.json()["new"] == 0
    merges = [q["sql"] for q in queries.captured_queries if "ON CONFLICT" in q["sql"]]
    slots = {store.slot_table(stream.pk, s.slot) for s in stream.segments.all()}
    assert merges
    for sql in merges:
        assert "timelines_event " not in sql.replace("INTO timelines_event_stage", "")
        assert any(f"INSERT INTO {slot} " in sql for slot in slots), sql[:300]


def test_stages_of_a_request_in_different_batches_make_one_event(stream_of, post_batch,
                                                                 fixtures_dir):
    path = fixtures_dir / "audit" / "openshift-requestresponse.log"
    lines = fixture_events(path)
    events = [orjson.loads(line) for line in lines]
    # Every request as its RequestReceived first (the stage the apiserver sends first), in a
    # batch of its own, then the file's own events.
    received = [orjson.dumps({**e, "stage": "RequestReceived"}) for e in events]
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(received), token).status_code == 200
    assert store.events(stream).filter(completed__isnull=True).count() == len(
        {(e["auditID"], e["requestReceivedTimestamp"]) for e in events})
    assert post_batch(stream.pk, event_list(lines), token).status_code == 200
    expected = expected_rows(path)
    stored = store.events(stream)
    assert stored.count() == len(expected)
    assert stored.filter(completed__isnull=True).count() == sum(
        r.completed is None for r in expected)


def test_a_single_event_and_v1beta1_are_taken(stream_of, post_batch, fixtures_dir):
    path = fixtures_dir / "audit" / "falco" / "create_configmap_no_sensitive_values.json"
    event = orjson.loads(path.read_bytes())
    assert event["apiVersion"] == "audit.k8s.io/v1beta1"
    stream, token = stream_of()
    answer = post_batch(stream.pk, event, token)
    assert answer.status_code == 200, answer.content
    assert store.events(stream).count() == len(expected_rows(path))


def test_secrets_are_redacted_as_for_an_upload(stream_of, post_batch, fixtures_dir, incident):
    folder = fixtures_dir / "audit" / "falco"
    paths = [p for p in sorted(folder.glob("*.json")) if b"Secret" in p.read_bytes()
             or b"ConfigMap" in p.read_bytes()]
    paths = [p for p in paths if expected_rows_or_none(p)]
    assert paths
    stream, token = stream_of()
    lines = [line for p in paths for line in fixture_events(p)]
    assert post_batch(stream.pk, event_list(lines), token).status_code == 200
    for path in paths:
        ingest_upload(create_local_upload(incident, path).pk)
    uploaded = {(e.audit_id, e.received): e.body() for e in Event.objects.filter(incident=incident)}
    streamed = {(e.audit_id, e.received): e.body() for e in store.events(stream)}
    assert streamed.keys() == uploaded.keys()
    assert streamed == uploaded
    redacted = [b for b in uploaded.values() if "hindsight:redacted" in orjson.dumps(b).decode()
                or "REDACTED" in orjson.dumps(b).decode().upper()]
    assert redacted  # the comparison above covered bodies that redaction changed


def expected_rows_or_none(path):
    try:
        return expected_rows(path)
    except Exception:  # noqa: BLE001 - the deliberately malformed fixture
        return None


# --- refusals --------------------------------------------------------------------------------

def test_a_malformed_batch_answers_400_naming_the_item_and_stores_nothing(
        stream_of, post_batch, demo_log):
    stream, token = stream_of()
    lines = fixture_events(demo_log)
    broken = orjson.loads(lines[3])
    del broken["auditID"]
    body = event_list([*lines[:3], orjson.dumps(broken), *lines[4:]])
    answer = post_batch(stream.pk, body, token)
    assert answer.status_code == 400
    assert "items[3]" in answer.json()["detail"]
    assert "without auditID" in answer.json()["detail"]
    assert store.events(stream).count() == 0

    answer = post_batch(stream.pk, b'{"kind":"EventList","items":[', token)
    assert answer.status_code == 400
    assert "not JSON" in answer.json()["detail"]
    answer = post_batch(stream.pk, {"kind": "PodList", "apiVersion": "v1", "items": []}, token)
    assert answer.status_code == 400
    assert "audit.k8s.io" in answer.json()["detail"]
    assert store.events(stream).count() == 0


def test_a_batch_over_the_limit_answers_413(stream_of, post_batch, demo_log, settings):
    stream, token = stream_of()
    body = event_list(fixture_events(demo_log))
    settings.STREAM_MAX_BATCH_BYTES = len(body) - 1
    answer = post_batch(stream.pk, body, token)
    assert answer.status_code == 413
    assert str(len(body) - 1) in answer.json()["detail"]
    assert store.events(stream).count() == 0


def test_a_wrong_token_answers_401_and_another_streams_404(stream_of, post_batch, demo_log):
    stream, token = stream_of("a")
    other, other_token = stream_of("b")
    body = event_list(fixture_events(demo_log))
    assert post_batch(stream.pk, body, "hss_wrong").status_code == 401
    assert post_batch(stream.pk, body, other_token).status_code == 404
    assert store.events(stream).count() == store.events(other).count() == 0


def test_a_streams_token_opens_nothing_but_its_webhook(client, stream_of, post_batch, demo_log):
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(fixture_events(demo_log)), token).status_code == 200
    for scheme in ("Bearer", "Token"):
        headers = {"Authorization": f"{scheme} {token}"}
        for path in ("/api/v1/streams/", f"/api/v1/streams/{stream.pk}/",
                     f"/api/v1/streams/{stream.pk}/events/",
                     f"/api/v1/streams/{stream.pk}/kubeconfig/"):
            assert client.get(path, headers=headers).status_code == 401, (scheme, path)
        cut = client.post(f"/api/v1/streams/{stream.pk}/incidents/",
                          {"since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z",
                           "title": "x"}, content_type="application/json", headers=headers)
        assert cut.status_code == 401, scheme


def test_overload_answers_429_with_retry_after_and_keeps_what_was_acknowledged(
        stream_of, post_batch, demo_log, settings):
    settings.STREAM_CONCURRENCY = 1
    settings.STREAM_QUEUE_SECONDS = 0.05
    stream, token = stream_of()
    lines = fixture_events(demo_log)
    assert post_batch(stream.pk, event_list(lines[:10]), token).status_code == 200
    kept = _identities(store.events(stream))
    busy = receiver._semaphore()
    assert busy.acquire(timeout=1)  # another batch being stored
    try:
        answer = post_batch(stream.pk, event_list(lines[10:]), token)
    finally:
        busy.release()
    assert answer.status_code == 429
    assert answer["Retry-After"] == "1"
    assert _identities(store.events(stream)) == kept
    assert post_batch(stream.pk, event_list(lines[10:]), token).status_code == 200
    assert store.events(stream).count() == len(expected_rows(demo_log))


def test_a_batch_commits_durably_though_the_writer_turns_synchronous_commit_off(
        stream_of, demo_log):
    """The store's writer sets ``synchronous_commit = off`` for file ingest (re-runnable); an
    acknowledged batch must not be lost to a crash, so its transaction ends with it on. (The
    test's own transaction holds the batch's, so the setting it would commit with is visible.)"""
    from django.db import connection

    from streams.receiver import parse_batch

    stream, _ = stream_of()
    rows, problem = parse_batch(event_list(fixture_events(demo_log)), "test")
    assert problem is None
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")  # as the writer leaves it
        store.write_batch(stream, rows)
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_a_gzipped_batch_is_taken_and_a_gzip_bomb_answers_413(stream_of, post_batch, demo_log,
                                                              settings):
    import gzip

    stream, token = stream_of()
    body = event_list(fixture_events(demo_log))
    answer = post_batch(stream.pk, gzip.compress(body), token, Content_Encoding="gzip")
    assert answer.status_code == 200, answer.content
    assert answer.json()["new"] == len(expected_rows(demo_log))
    settings.STREAM_MAX_BATCH_BYTES = 1024**2
    bomb = gzip.compress(b" " * (64 * 1024**2))  # 64 KiB that unzip to 64 MiB
    assert len(bomb) < settings.STREAM_MAX_BATCH_BYTES
    answer = post_batch(stream.pk, bomb, token, Content_Encoding="gzip")
    assert answer.status_code == 413
    assert "once unzipped" in answer.json()["detail"]


def test_a_batch_completing_earlier_requests_finds_their_orphan_chunks_by_the_slots_index(
        stream_of, post_batch, fixtures_dir):
    """A stream's batches complete the requests of the batches before them; the chunks no row
    points at any more are deleted, found by the slot table's index on the chunk, not by reading
    the whole slot."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from timelines.models import BodyChunk

    lines = fixture_events(fixtures_dir / "audit" / "openshift-requestresponse.log")
    events = [orjson.loads(line) for line in lines]
    stream, token = stream_of()
    received = [orjson.dumps({**e, "stage": "RequestReceived"}) for e in events]
    assert post_batch(stream.pk, event_list(received), token).status_code == 200
    slots = store.incident_ids(stream)
    first_chunks = set(BodyChunk.objects.filter(incident_id__in=slots).values_list("id", flat=True))
    with CaptureQueriesContext(connection) as queries:
        assert post_batch(stream.pk, event_list(lines), token).status_code == 200
    # every request completed: the RequestReceived chunks are orphans, and deleted
    left = set(BodyChunk.objects.filter(incident_id__in=slots).values_list("id", flat=True))
    assert first_chunks and not first_chunks & left
    deletes = [q["sql"] for q in queries.captured_queries
               if q["sql"].startswith("DELETE FROM timelines_bodychunk c")]
    assert deletes
    for segment in stream.segments.all():
        table = store.slot_table(stream.pk, segment.slot)
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [table])
            assert any("(body_chunk)" in row[0] for row in cursor.fetchall()), table
    for sql in deletes:
        assert "FROM timelines_event e" not in sql and "streams_event_" in sql
        with connection.cursor() as cursor:  # whether the probe can use it, whatever the size
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + sql.replace("DELETE FROM", "SELECT 1 FROM", 1))
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "_chunk" in plan, plan
