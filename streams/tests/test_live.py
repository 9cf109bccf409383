"""Streams against a real web server (gunicorn on the test database): ``replay_audit`` posting
a log, and three senders streaming while the web's worker is killed, PostgreSQL's connections
are cut, a Redis of the test's own is restarted empty and the web server is restarted: every
event acknowledged is stored once, none is lost."""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
import requests
from django.core.management import call_command
from django.db import connection

from streams import store
from streams.sender import replay

from .helpers import fixture_events

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
BASE = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Web:
    """gunicorn serving the test database, restartable."""

    def __init__(self, tmp_path: Path, extra_env: dict[str, str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        db = connection.settings_dict
        self.env = {**os.environ, **extra_env,
                    "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:"
                                    f"{db['PORT'] or 5432}/{db['NAME']}",
                    "HINDSIGHT_DATA_DIR": str(tmp_path / "web")}
        self.process: subprocess.Popen | None = None
        self.log = tmp_path / "web.log"

    def start(self) -> None:
        gunicorn = Path(sys.executable).parent / "gunicorn"
        self.process = subprocess.Popen(
            [str(gunicorn), "hindsight.wsgi:application", "--bind", f"127.0.0.1:{self.port}",
             "--workers", "1", "--threads", "4", "--graceful-timeout", "1"],
            cwd=ROOT, env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"gunicorn did not start: {self.log.read_text()[-2000:]}")

    def worker_pids(self) -> list[int]:
        found = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True,
                               text=True).stdout.split()
        return [int(pid) for pid in found]

    def kill(self) -> None:
        """SIGKILL the master and its workers: no graceful anything."""
        for pid in self.worker_pids():
            os.kill(pid, signal.SIGKILL)
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def web(tmp_path):
    servers = []

    def make(extra_env=None):
        server = Web(tmp_path, extra_env or {})
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _cloned(fixtures_dir, requests_count: int, tag: str, offset: int) -> list[bytes]:
    """``requests_count`` requests cloned from the fixtures' events, each as its
    RequestReceived and ResponseComplete lines (new auditIDs, a millisecond apart)."""
    templates = [orjson.loads(line) for line in
                 fixture_events(fixtures_dir / "audit" / "openshift-requestresponse.log")
                 + fixture_events(fixtures_dir / "audit" / "audit2rbac-demo.log")]
    lines = []
    for index in range(requests_count):
        event = dict(templates[index % len(templates)])
        event.pop("timestamp", None)
        event.pop("metadata", None)
        received = BASE + timedelta(milliseconds=index * 3 + offset)
        text = received.isoformat().replace("+00:00", "Z")
        done = (received + timedelta(milliseconds=2)).isoformat().replace("+00:00", "Z")
        audit_id = f"{tag}-{uuid.UUID(int=index)}"
        first = {**event, "auditID": audit_id, "stage": "RequestReceived",
                 "requestReceivedTimestamp": text, "stageTimestamp": text}
        for key in ("responseStatus", "responseObject", "annotations"):
            first.pop(key, None)
        lines.append(orjson.dumps(first))
        lines.append(orjson.dumps({**event, "auditID": audit_id, "stage": "ResponseComplete",
                                   "requestReceivedTimestamp": text, "stageTimestamp": done}))
    return lines


def _identities(lines: list[bytes]) -> set[tuple[str, str]]:
    return {(e["auditID"], e["requestReceivedTimestamp"]) for e in map(orjson.loads, lines)}


def _stored(stream) -> set[tuple[str, str]]:
    return {(a, r.isoformat().replace("+00:00", "Z"))
            for a, r in store.events(stream).values_list("audit_id", "received")}


def test_replay_audit_posts_a_log_and_says_what_was_acknowledged(web, stream_of, tmp_path,
                                                                 demo_log):
    stream, token = stream_of()
    server = web()
    out, err = io.StringIO(), io.StringIO()
    call_command("replay_audit", str(demo_log), "--url",
                 f"{server.url}/api/v1/streams/{stream.pk}/audit/", "--token", token,
                 "--batch", "10", stdout=out, stderr=err)
    lines = fixture_events(demo_log)
    assert f"acknowledged {len(lines)} events in {-(-len(lines) // 10)} batches" \
        in out.getvalue()
    assert store.events(stream).count() == len({(e["auditID"], e["timestamp"])
                                                for e in map(orjson.loads, lines)})
    with pytest.raises(Exception, match="401"):
        call_command("replay_audit", str(demo_log), "--url",
                     f"{server.url}/api/v1/streams/{stream.pk}/audit/", "--token", "hss_no",
                     stdout=out, stderr=err)


def test_nothing_is_lost_or_doubled_across_killed_workers_cut_connections_and_restarts(
        web, stream_of, tmp_path, fixtures_dir):
    redis_port = _free_port()
    redis_server = shutil.which("redis-server")
    assert redis_server, "redis-server is needed for the Redis restart"

    def start_redis():
        # A Redis of this test's own (never the shared one), without persistence: a restart
        # comes back empty.
        process = subprocess.Popen([redis_server, "--port", str(redis_port), "--bind",
                                    "127.0.0.1", "--save", "", "--appendonly", "no"],
                                   stdout=subprocess.DEVNULL)
        time.sleep(0.2)
        return process

    redis_process = start_redis()
    try:
        stream, token = stream_of()
        broker = f"redis://127.0.0.1:{redis_port}/0"
        server = web({"CELERY_BROKER_URL": broker, "CACHE_URL": broker})
        url = f"{server.url}/api/v1/streams/{stream.pk}/audit/"
        files, sent = [], set()
        for number in range(3):  # three apiservers
            lines = _cloned(fixtures_dir, 3000, f"api{number}", number)
            sent |= _identities(lines)
            path = tmp_path / f"node-{number}.log"
            path.write_bytes(b"\n".join(lines) + b"\n")
            files.append(path)
        tallies, errors = [], []

        def send(path):
            try:
                tallies.append(replay([str(path)], url, token, batch=400, rate=1500))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        senders = [threading.Thread(target=send, args=(p,)) for p in files]
        for thread in senders:
            thread.start()
        faults = []
        time.sleep(0.6)
        cut = 0
        deadline = time.monotonic() + 2
        while not cut and time.monotonic() < deadline:  # the web's connection, once it has one
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                               " WHERE datname = current_database() AND pid <> pg_backend_pid()")
                cut = cursor.fetchone()[0]
            time.sleep(0.02)
        faults.append(f"{cut} PostgreSQL connections cut")
        time.sleep(0.5)
        os.kill(server.worker_pids()[0], signal.SIGKILL)  # gunicorn forks another
        faults.append("worker killed")
        time.sleep(0.5)
        redis_process.kill()
        redis_process.wait()
        redis_process = start_redis()
        faults.append("Redis restarted empty")
        time.sleep(0.5)
        server.kill()
        server.start()
        faults.append("web restarted")
        for thread in senders:
            thread.join(120)
        assert not errors, errors
        assert len(tallies) == 3
        assert sum(t.events for t in tallies) == 3 * 6000
        retries = sum(t.retries for t in tallies)
        print(f"faults: {faults}; sender retries: {retries}")  # noqa: T201 - the run's record
        assert retries > 0, f"the faults ({faults}) were never met by a sender"
        assert cut > 0
        stored = _stored(stream)
        assert stored == sent
        assert store.events(stream).count() == len(sent)
        assert store.summary(stream)["events"] == len(sent)  # the slots' counts, kept as written
        assert not store.events(stream).filter(completed__isnull=True).exists()
    finally:
        redis_process.kill()
        redis_process.wait()
