"""The real Celery path: a worker process over Redis ingests uploads made through the API, and a
worker killed mid-ingest has its upload run again to the same result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import psutil
import pytest
from django.conf import settings
from django.db import connection

from incidents.models import Upload
from timelines.models import Event

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def worker(task_queue, tmp_path):
    """A Celery worker (prefork, one child) on the test database; yields its Popen."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "HINDSIGHT_DATA_DIR": str(tmp_path / "worker-data"),
        "HINDSIGHT_QUEUE": task_queue,  # where the worker sends the tasks it spawns
    }
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "hindsight", "worker", "-P", "prefork", "-c", "1",
         "-Q", task_queue, "-n", f"{task_queue}@%h", "--without-gossip", "--without-mingle",
         "-l", "info"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    yield process
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


def _post(client, token, path: Path, title: str) -> int:
    with path.open("rb") as handle:
        answer = client.post("/api/v1/uploads/", {"incident": title, "file": handle},
                             HTTP_AUTHORIZATION=f"Token {token}")
    assert answer.status_code == 202, answer.content
    return answer.json()["id"]


def _wait(upload_id: int, until, timeout: float = 90.0) -> Upload:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        upload = Upload.objects.get(pk=upload_id)
        if until(upload):
            return upload
        time.sleep(0.1)
    raise AssertionError(f"upload {upload_id} never reached the state: {upload.__dict__}")


def test_a_worker_ingests_an_upload_posted_to_the_api(client, owner, token_for, worker,
                                                      fixtures_dir):
    source = fixtures_dir / "audit" / "audit2rbac-demo.log"
    expected = len({orjson.loads(line)["auditID"] for line in source.read_bytes().splitlines()})
    upload_id = _post(client, token_for(owner), source, "via worker")

    upload = _wait(upload_id, lambda u: u.complete)

    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.event_count == expected
    assert Event.objects.filter(incident_id=upload.incident_id).count() == expected
    assert upload.bytes_read == upload.bytes_total == source.stat().st_size


def _big_audit_log(path: Path, fixtures_dir: Path, requests: int) -> None:
    """RequestReceived + ResponseComplete lines for ``requests`` clones of a fixture event."""
    template = orjson.loads((fixtures_dir / "audit" / "openshift-requestresponse.log")
                            .read_bytes().splitlines()[0])
    with path.open("wb") as out:
        for n in range(requests):
            event = dict(template, auditID=str(uuid.uuid4()),
                         requestReceivedTimestamp=f"2024-05-01T10:{n // 60_000_000 % 60:02d}:"
                                                  f"{n // 1_000_000 % 60:02d}.{n % 1_000_000:06d}Z")
            event["stageTimestamp"] = event["requestReceivedTimestamp"]
            out.write(orjson.dumps(dict(event, stage="RequestReceived")) + b"\n")
            out.write(orjson.dumps(dict(event, stage="ResponseComplete")) + b"\n")


def test_a_killed_worker_s_upload_runs_again_without_losing_or_doubling_events(
        client, owner, token_for, worker, fixtures_dir, tmp_path):
    requests = 150_000
    path = tmp_path / "big-audit.log"
    _big_audit_log(path, fixtures_dir, requests)
    upload_id = _post(client, token_for(owner), path, "killed worker")

    # Kill the pool child while it is writing; the worker re-delivers the unacknowledged task.
    _wait(upload_id, lambda u: u.status == Upload.Status.RUNNING and u.event_count > 0)
    children = psutil.Process(worker.pid).children()
    assert children, "the prefork worker has no pool child"
    for child in children:
        child.kill()

    upload = _wait(upload_id, lambda u: u.complete, timeout=600)  # a ceiling (see test_faults)

    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.attempts >= 2
    assert Event.objects.filter(incident_id=upload.incident_id).count() == requests
    assert upload.event_count == requests


def test_deleting_an_incident_while_a_worker_ingests_it_ends_the_ingest_and_purges_all(
        client, owner, superuser, token_for, worker, fixtures_dir, tmp_path):
    from timelines.models import BodyChunk, IncidentPurge

    path = tmp_path / "big-audit.log"
    _big_audit_log(path, fixtures_dir, 100_000)
    upload_id = _post(client, token_for(owner), path, "deleted while ingesting")
    upload = _wait(upload_id, lambda u: u.status == Upload.Status.RUNNING and u.event_count > 0)
    copy = Path(upload.path)
    assert copy.is_file()

    deleted = client.delete(f"/api/v1/incidents/{upload.incident_id}/",
                            HTTP_AUTHORIZATION=f"Token {token_for(superuser)}")

    assert deleted.status_code == 204
    log = tmp_path / "worker.log"  # the worker fixture's

    def ended(task: str) -> bool:
        return any(f"{task}[" in line and "succeeded in" in line
                   for line in log.read_text().splitlines())

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (ended("ingest_upload_task")
                                               and ended("purge_incident_task")):
        time.sleep(0.2)
    text = log.read_text()
    assert not IncidentPurge.objects.exists(), text[-3000:]
    assert not Event.objects.filter(incident_id=upload.incident_id).exists()
    assert not BodyChunk.objects.filter(incident_id=upload.incident_id).exists()
    assert not copy.exists() and not copy.parent.exists()
    assert "was deleted while being ingested; stopped" in text, text[-3000:]
    finished = [line for line in text.splitlines() if "succeeded in" in line]
    assert any("ingest_upload_task" in line for line in finished), text[-3000:]
    assert any("purge_incident_task" in line for line in finished), text[-3000:]
    for trouble in ("Traceback", "ERROR", "Retry in", "raised unexpected"):
        assert trouble not in text, text[-3000:]


def test_a_bundle_s_files_are_ingested_by_tasks_of_their_own(client, owner, token_for, worker,
                                                             fixtures_dir, tmp_path):
    import io
    import tarfile

    audit = fixtures_dir / "audit"
    sources = {"cp-1/kube-apiserver-audit.log": audit / "audit2rbac-demo.log",
               "cp-2/kube-apiserver-audit.log": audit / "openshift-requestresponse.log",
               "cp-1/kube-controller-manager.log":
                   fixtures_dir / "klog" / "kind-kube-controller-manager.txt"}
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as archive:
        for name, source in sources.items():
            data = source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    upload_id = _post(client, token_for(owner), bundle, "bundle via worker")

    upload = _wait(upload_id, lambda u: u.complete)

    files = list(Upload.objects.filter(parent_id=upload_id))
    assert upload.status == Upload.Status.DONE, upload.message
    assert {f.name for f in files} == set(sources)
    assert all(f.status == Upload.Status.DONE for f in files), [f.message for f in files]
    # each file was claimed by a Celery task of its own, none by the bundle's task
    claimants = {f.claimed_by for f in files} | {upload.claimed_by}
    assert len(claimants) == len(files) + 1
    assert not any(c.startswith("local-") for c in claimants)
    assert upload.event_count == sum(f.event_count for f in files) == Event.objects.filter(
        incident_id=upload.incident_id).count()
