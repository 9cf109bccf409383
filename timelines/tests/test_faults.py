"""Faults during an ingest, on real Celery workers over Redis and PostgreSQL: the whole worker
killed, the broker restarted, the database connection cut, the disk full. Every one ends with
the upload ``done`` (no event lost, none doubled) or ``failed`` with a message naming the cause;
none leaves it ``running``."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import psutil
import pytest
import redis
from django.conf import settings
from django.db import connection

from conftest import FIXTURES
from hindsight.testing import requests_in, write_audit_log
from incidents.models import Incident, Upload
from timelines.models import Event
from timelines.tests.test_worker import _big_audit_log, _post, _wait

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 100_000  # enough that the ingest is mid-way when the fault strikes (~160 MB)
# A ceiling, not an expectation: each wait ends as soon as the upload is complete. A run that
# starts again merges what the first one stored (slower than its COPY), and on a loaded machine
# (a CI runner, the suite's own worker and PostgreSQL) that took more than two minutes.
DONE_WITHIN = 600
STALE_SECONDS = 4  # the workers' HINDSIGHT_UPLOAD_STALE_SECONDS: the sweep in test time


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "big-audit.log"
    _big_audit_log(path, FIXTURES, REQUESTS)
    return path


class Workers:
    """Starts Celery workers (prefork, one child) on the test database and this test's queue;
    stops those still alive at the end, and takes the messages they left unacknowledged."""

    def __init__(self, queue: str, tmp_path: Path) -> None:
        self.queue = queue
        self.tmp_path = tmp_path
        self.started: list[tuple[subprocess.Popen, str]] = []

    def start(self, name: str, *, broker: str = "", wrap: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> subprocess.Popen:
        db = connection.settings_dict
        worker_env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "CELERY_BROKER_URL": broker or settings.CELERY_BROKER_URL,
            "HINDSIGHT_DATA_DIR": str(self.tmp_path / f"{name}-data"),
            "HINDSIGHT_QUEUE": self.queue,
            "HINDSIGHT_UPLOAD_STALE_SECONDS": str(STALE_SECONDS),
            **(env or {}),
        }
        command = [sys.executable, "-m", "celery", "-A", "hindsight", "worker", "-P", "prefork",
                   "-c", "1", "-Q", self.queue, "-n", f"{name}-{self.queue}@%h",
                   "--without-gossip", "--without-mingle", "-l", "info"]
        log = (self.tmp_path / f"{name}.log").open("wb")
        process = subprocess.Popen([*wrap, *command], cwd=ROOT, env=worker_env, stdout=log,
                                   stderr=subprocess.STDOUT)
        log.close()
        self.started.append((process, worker_env["CELERY_BROKER_URL"]))
        return process

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in self.started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill(process)
        # A killed worker's message stays in kombu's ``unacked`` hash until its visibility
        # timeout (hours), and would then be put back on a queue nobody reads: drop it now.
        for broker in {broker for _, broker in self.started}:
            client = redis.Redis.from_url(broker)
            try:
                for tag, raw in client.hgetall("unacked").items():
                    if orjson.loads(raw)[2] == self.queue:
                        client.hdel("unacked", tag)
                        client.zrem("unacked_index", tag)
            except redis.ConnectionError:  # a broker of the test's own, gone already
                pass


@pytest.fixture
def workers(task_queue, tmp_path):
    started = Workers(task_queue, tmp_path)
    yield started
    started.stop()


def kill(process: subprocess.Popen) -> None:
    """SIGKILL a worker and its pool: what the OOM killer or a lost machine does."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        return
    for member in family:
        member.kill()
    psutil.wait_procs(family, timeout=10)
    process.wait(timeout=10)


def _stored_requests(incident_id: int) -> list[tuple[str, datetime]]:
    return list(Event.objects.filter(incident_id=incident_id).values_list("audit_id", "received"))


def _file_requests(path: Path) -> set[tuple[str, datetime]]:
    return {(audit_id, datetime.fromisoformat(received.replace("Z", "+00:00")))
            for audit_id, received in requests_in(path)}


def assert_all_stored_once(upload: Upload, path: Path) -> None:
    """Every request of the file is stored, once: the same (auditID, received) set, and as many
    rows as requests."""
    stored = _stored_requests(upload.incident_id)
    expected = _file_requests(path)
    assert len(stored) == len(set(stored)), "a request is stored twice"
    assert set(stored) == expected, (len(set(stored) - expected), len(expected - set(stored)))
    assert upload.event_count == len(expected)


def _running_mid_way(upload: Upload) -> bool:
    return upload.status == Upload.Status.RUNNING and 0 < upload.bytes_read < upload.bytes_total


def test_a_killed_worker_s_upload_is_requeued_by_the_sweep_and_ends_done_without_loss(
        client, owner, token_for, workers, big_log):
    first = workers.start("first")
    upload_id = _post(client, token_for(owner), big_log, "worker killed")
    _wait(upload_id, _running_mid_way)

    kill(first)  # the whole worker, not just its pool child: nobody is left to re-deliver

    second = workers.start("second")
    # Its message is unacknowledged in Redis until the visibility timeout (hours): the sweep is
    # what gives the upload to another worker once its heartbeat is older than
    # HINDSIGHT_UPLOAD_STALE_SECONDS. Beat sends it every minute; here once the heartbeat is
    # stale, as beat would.
    stale = _wait(upload_id, lambda u: u.heartbeat_at is not None and u.heartbeat_at
                  < datetime.now(UTC) - timedelta(seconds=STALE_SECONDS + 1))
    assert stale.status == Upload.Status.RUNNING and stale.attempts == 1
    from timelines.tasks import requeue_stale_uploads

    requeue_stale_uploads.delay()
    upload = _wait(upload_id, lambda u: u.complete, timeout=DONE_WITHIN)

    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.attempts == 2
    assert upload.claimed_by != stale.claimed_by
    assert_all_stored_once(upload, big_log)
    assert second.poll() is None


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own on a free port, which the test may stop and start:
    yields ``(url, stop, start)``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pidfile = tmp_path / "redis.pid"

    def start() -> None:
        subprocess.run(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(pidfile),
                        "--dir", str(tmp_path)], check=True, capture_output=True)
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop() -> None:
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGKILL)  # a crash: nothing saved, every message lost
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.05)
        pidfile.unlink(missing_ok=True)

    start()
    yield f"redis://127.0.0.1:{port}/0", stop, start
    if pidfile.exists():
        stop()


def test_a_broker_restarting_empty_mid_ingest_loses_no_upload(incident, workers, own_redis,
                                                              big_log, demo_log):
    from hindsight.celery import app
    from timelines.ingest import create_local_upload
    from timelines.tasks import ingest_upload_task, requeue_stale_uploads

    url, stop_redis, start_redis = own_redis
    worker = workers.start("worker", broker=url)
    first = create_local_upload(incident, big_log)
    other = Incident.objects.create(title="queued behind", team=incident.team,
                                    created_by=incident.created_by)
    second = create_local_upload(other, demo_log)  # waits in Redis behind the first
    with app.connection_for_write(url) as broker:
        for upload in (first, second):
            ingest_upload_task.apply_async((upload.pk,), connection=broker)
    _wait(first.pk, _running_mid_way)
    assert Upload.objects.get(pk=second.pk).status == Upload.Status.PENDING

    stop_redis()  # a crash: the second upload's message is gone with the broker's memory
    time.sleep(2)
    start_redis()

    # The running ingest needs no broker: it goes on, and its worker reconnects.
    first = _wait(first.pk, lambda u: u.complete, timeout=DONE_WITHIN)
    assert first.status == Upload.Status.DONE, first.message
    assert_all_stored_once(first, big_log)
    # The lost message: the sweep queues the upload again once it has waited too long.
    time.sleep(max(0.0, (second.created_at + timedelta(seconds=STALE_SECONDS + 1)
                         - datetime.now(UTC)).total_seconds()))
    assert Upload.objects.get(pk=second.pk).status == Upload.Status.PENDING
    with app.connection_for_write(url) as broker:
        requeue_stale_uploads.apply_async(connection=broker)
    second = _wait(second.pk, lambda u: u.complete, timeout=DONE_WITHIN)
    assert second.status == Upload.Status.DONE, second.message
    assert_all_stored_once(second, demo_log)
    assert worker.poll() is None, workers.log("worker")[-3000:]


def test_a_database_connection_cut_mid_batch_is_retried_to_done(client, owner, token_for,
                                                                 workers, big_log):
    workers.start("worker")
    upload_id = _post(client, token_for(owner), big_log, "connection cut")
    _wait(upload_id, _running_mid_way)

    with connection.cursor() as cursor:  # every connection of the worker: its own, its writer's
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert cursor.fetchone()[0] >= 1
    upload = _wait(upload_id, lambda u: u.complete, timeout=DONE_WITHIN)

    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.attempts >= 2, workers.log("worker")[-3000:]
    assert_all_stored_once(upload, big_log)


def _can_mount_tmpfs() -> bool:
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


def test_a_bundle_that_fills_the_work_directory_fails_saying_so_and_frees_it(
        client, owner, token_for, workers, tmp_path, demo_log):
    """The worker runs in a mount namespace of its own where its upload directory (where
    bundles are unpacked) is a 1 MiB tmpfs: a real ENOSPC, not a simulated one."""
    if not _can_mount_tmpfs():
        pytest.fail("this test needs `unshare -rm` (user and mount namespaces) to give the "
                    "worker a small tmpfs", pytrace=False)
    log = tmp_path / "kube-apiserver-audit.log"  # 4 MiB of requests, in a 1 MiB work directory
    write_audit_log(log, datetime(2024, 5, 1, tzinfo=UTC),
                    [timedelta(milliseconds=n) for n in range(12_000)])
    assert log.stat().st_size > 3 * 1024**2
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as archive:  # a file that fits, then one that does not
        for name, source in [("cp-0/kube-apiserver-audit.log", demo_log),
                             ("cp-1/kube-apiserver-audit.log", log)]:
            data = source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    work = tmp_path / "worker-data" / "uploads"  # the worker's UPLOAD_DIR
    work.mkdir(parents=True)
    worker = workers.start("worker", wrap=(
        "unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=1m tmpfs "{work}" && exec "$@"',
        "sh"))

    upload_id = _post(client, token_for(owner), bundle, "disk full")
    upload = _wait(upload_id, lambda u: u.complete, timeout=DONE_WITHIN)

    assert upload.status == Upload.Status.FAILED
    assert "No space left on device" in upload.message, upload.message
    # the work directory is removed: the disk is not left full
    seen = Path(f"/proc/{worker.pid}/root") / str(work).lstrip("/")
    assert os.statvfs(seen).f_bfree == os.statvfs(seen).f_blocks, list(seen.rglob("*"))
    assert not Event.objects.filter(incident_id=upload.incident_id).exists()


def test_an_upload_whose_worker_dies_at_every_attempt_fails_rather_than_looping(
        client, owner, token_for, workers, big_log):
    """A file that kills its worker every time (out of memory, say) is delivered again after
    each death (``reject_on_worker_lost``); after ``HINDSIGHT_UPLOAD_MAX_ATTEMPTS`` it fails."""
    worker = workers.start("worker", env={"HINDSIGHT_UPLOAD_MAX_ATTEMPTS": "2"})
    upload_id = _post(client, token_for(owner), big_log, "kills its worker")
    for attempt in (1, 2):
        _wait(upload_id, lambda u, attempt=attempt: _running_mid_way(u) and u.attempts == attempt)
        for child in psutil.Process(worker.pid).children():
            child.kill()  # the pool child: the worker lives on and delivers the task again

    upload = _wait(upload_id, lambda u: u.complete, timeout=DONE_WITHIN)

    assert upload.status == Upload.Status.FAILED
    assert upload.message.startswith("the ingest worker was lost 2 times"), upload.message
    assert upload.attempts == 2
    assert worker.poll() is None
