"""Every failure is an outcome of its own: a refused member of a bundle fails alone, a truncated
gzip keeps the lines it holds whatever its size, a database error of an upload ends it
``failed`` with a message, every thread and task path ends, ``manage.py ingest`` checks its
argument before it creates anything.

Expectations are derived from the fixture files and the archives the tests build.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import threading
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from hindsight.testing import requests_in
from incidents.models import Incident, Upload
from timelines.ingest.unpacker import Limits, unpack
from timelines.models import Event

AUDIT = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "audit"
DEMO = AUDIT / "audit2rbac-demo.log"
MIB = 1024 * 1024


def _entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
           linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = kind, linkname, 1626244028
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def _tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _tar_bytes(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _bomb(size: int) -> bytes:
    """One real audit line repeated to ``size`` bytes: gzip shrinks it some 200 times."""
    line = DEMO.read_bytes().splitlines(keepends=True)[0]
    return line * (size // len(line))


# --- 1. a refused member fails alone ----------------------------------------------------------

def _nested(depth: int, data: bytes) -> bytes:
    for _ in range(depth):
        data = _tar_bytes([_entry("in.tar.gz" if _ else "audit.log", data)])
    return data


HOSTILE = {
    # name: (entries before the valid log, limits, refused name, reason fragment)
    "own ratio": ([_entry("bomb.bin", bytes(16 * MIB))], {"max_ratio": 20}, "bomb.bin",
                  "compression ratio"),
    "bundle ratio": ([_entry(f"z{i}.bin", bytes(768 * 1024)) for i in range(3)], {}, "z1.bin",
                     "for the bundle"),
    "path escape holding a bomb": ([_entry("../evil.log", bytes(16 * MIB))], {},
                                   "../evil.log", "path escapes"),
    "absolute path": ([_entry("/tmp/abs.log", b"x")], {}, "/tmp/abs.log", "absolute path"),
    "symlink": ([_entry("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")], {}, "link",
                "symlink"),
    "hardlink": ([_entry("hard", kind=tarfile.LNKTYPE, linkname="/etc/passwd")], {}, "hard",
                 "hardlink"),
    "device": ([_entry("dev", kind=tarfile.CHRTYPE)], {}, "dev", "device file"),
    "fifo": ([_entry("fifo", kind=tarfile.FIFOTYPE)], {}, "fifo", "device file"),
    "name too long": ([_entry("x" * 300 + ".log", b"x")], {}, "x" * 300 + ".log", "too long"),
    "nested too deep": ([_entry("deep.tar.gz", _nested(3, b"deep"))], {"max_depth": 1},
                        "deep.tar.gz/in.tar.gz", "nested too deep"),
    "corrupt nested archive": ([_entry("broken.tar.gz", _tar_bytes(
        [_entry("a.log", os.urandom(64 * 1024))])[:32 * 1024])], {}, "broken.tar.gz/a.log",
        "corrupt archive"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_refused_tar_member_fails_alone_and_what_follows_it_is_read(case, tmp_path):
    before, limits, name, reason = HOSTILE[case]
    valid = DEMO.read_bytes()
    bundle = _tar(tmp_path / "b.tar.gz", [*before, _entry("after/audit.log", valid)])

    members = list(unpack(bundle, tmp_path / "work", Limits(**limits)))

    refused = {m.name: m.refused for m in members if m.refused}
    assert name in refused and reason in refused[name], refused
    kept = {m.name: m.path.read_bytes() for m in members if m.path is not None}
    assert kept["after/audit.log"] == valid


@pytest.mark.parametrize("case", ["ratio", "bzip2 member", "symlink", "path escape"])
def test_a_refused_zip_member_fails_alone_and_what_follows_it_is_read(case, tmp_path):
    valid = DEMO.read_bytes()
    bundle = tmp_path / "b.zip"
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        if case == "ratio":
            archive.writestr("bomb.bin", bytes(16 * MIB))
        elif case == "bzip2 member":
            archive.writestr("bomb.bin", b"x", compress_type=zipfile.ZIP_BZIP2)
        elif case == "symlink":
            info = zipfile.ZipInfo("bomb.bin")
            info.external_attr = (0o120777 << 16)
            archive.writestr(info, "/etc/passwd")
        else:
            archive.writestr("../bomb.bin", b"x")
        archive.writestr("after/audit.log", valid)

    members = list(unpack(bundle, tmp_path / "work"))

    refused = {m.name: m.refused for m in members if m.refused}
    assert len(refused) == 1 and next(iter(refused)).endswith("bomb.bin"), refused
    kept = {m.name: m.path.read_bytes() for m in members if m.path is not None}
    assert kept == {"after/audit.log": valid}


@pytest.mark.django_db
def test_a_bomb_in_a_bundle_is_refused_by_name_and_the_audit_log_after_it_is_ingested(
        tmp_path, settings, ingest_file):
    settings.BUNDLE_MAX_RATIO = 100
    bomb = _bomb(24 * MIB)
    bundle = _tar(tmp_path / "diagnose.tar.gz", [
        _entry("cp-1/audit-bomb.log", bomb),
        _entry("cp-1/var/log/kubernetes/audit/kube-apiserver-audit.log", DEMO.read_bytes())])
    # The archive shrinks the bomb past the limit: it must be refused, whatever its size.
    assert len(bomb) / bundle.stat().st_size > settings.BUNDLE_MAX_RATIO
    incident = Incident.objects.create(title="bomb")

    upload = ingest_file(incident, bundle)

    upload.refresh_from_db()
    files = {f.name: f for f in upload.files.all()}
    assert files["cp-1/audit-bomb.log"].status == Upload.Status.FAILED
    assert "cp-1/audit-bomb.log: compression ratio" in files["cp-1/audit-bomb.log"].message
    log = files["cp-1/var/log/kubernetes/audit/kube-apiserver-audit.log"]
    assert log.status == Upload.Status.DONE, log.message
    assert upload.status == Upload.Status.DONE and "1 of 2 files failed" in upload.message
    stored = set(Event.objects.filter(incident=incident).values_list("audit_id", flat=True))
    assert stored == {audit_id for audit_id, _ in requests_in(DEMO)}
    assert os.path.exists(bundle)


# --- 2. a truncated gzip keeps its lines, whatever its size -----------------------------------

def _fixture_log(copies: int) -> bytes:
    """The demo log's lines, ``copies`` times over with their auditIDs made unique per copy."""
    lines = DEMO.read_bytes().splitlines(keepends=True)
    out = []
    for copy in range(copies):
        for line in lines:
            event = json.loads(line)
            event["auditID"] = f"{event['auditID']}-{copy}"
            out.append(json.dumps(event).encode() + b"\n")
    return b"".join(out)


def _recoverable(cut: bytes) -> bytes:
    """The complete lines a truncated gzip holds, read with zlib alone."""
    data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut)
    return data[: data.rfind(b"\n") + 1]


@pytest.mark.django_db
@pytest.mark.parametrize(("copies", "keep"), [
    (1, 0.98), (1, 0.9), (1, 0.5), (1, 0.4), (50, 0.5), (50, 0.95)])
def test_a_truncated_gzip_keeps_its_recoverable_lines_whatever_its_size(
        copies, keep, tmp_path, ingest_file):
    whole = gzip.compress(_fixture_log(copies), 9)
    cut = whole[: int(len(whole) * keep)]
    path = tmp_path / "audit.log.gz"
    path.write_bytes(cut)
    (tmp_path / "expected.log").write_bytes(_recoverable(cut))
    expected = {audit_id for audit_id, _ in requests_in(tmp_path / "expected.log")}
    assert expected  # the cut keeps some whole lines
    incident = Incident.objects.create(title=f"cut {len(cut)} of {len(whole)} bytes")

    upload = ingest_file(incident, path)

    assert upload.status == Upload.Status.DONE, upload.message
    assert "truncated" in " ".join(upload.errors)
    stored = set(Event.objects.filter(incident=incident).values_list("audit_id", flat=True))
    assert stored == expected


@pytest.mark.django_db
def test_a_gzip_cut_before_its_first_line_is_an_outcome_that_says_so(tmp_path, ingest_file):
    path = tmp_path / "audit.log.gz"
    path.write_bytes(gzip.compress(DEMO.read_bytes(), 9)[:30])
    assert _recoverable(path.read_bytes()) == b""
    incident = Incident.objects.create(title="cut")

    upload = ingest_file(incident, path)

    assert upload.status in (Upload.Status.FAILED, Upload.Status.SKIPPED)
    assert "gzip" in upload.message
    assert not Event.objects.filter(incident=incident).exists()


# --- 3/4. every database error of an upload is an outcome -------------------------------------

def _unindexable_log(tmp_path: Path, python_path: bool) -> Path:
    """The demo log with one auditID longer than a btree index entry can be (PostgreSQL refuses
    it: program limit exceeded); random, so that compression does not shrink it."""
    lines = DEMO.read_text().splitlines()
    event = json.loads(lines[-1])
    event["auditID"] = os.urandom(6000).hex()
    line = json.dumps(event)
    if python_path:  # an escaped auditID: the C scanner leaves the line to Python
        line = line.replace(f'"{event["auditID"]}"', '"\\u0061' + event["auditID"][1:] + '"')
    path = tmp_path / "audit.log"
    path.write_text("\n".join([*lines[:-1], line]) + "\n")
    return path


@pytest.mark.django_db
@pytest.mark.parametrize("python_path", [False, True], ids=["c-scanner", "python"])
def test_a_value_the_database_refuses_fails_the_upload_with_a_message(
        python_path, tmp_path, task_queue):
    from timelines.ingest import create_local_upload
    from timelines.tasks import ingest_upload_task

    incident = Incident.objects.create(title="refused")
    upload = create_local_upload(incident, _unindexable_log(tmp_path, python_path))

    result = ingest_upload_task.apply(args=[upload.pk])

    assert result.successful(), result.traceback
    upload.refresh_from_db()
    assert upload.status == Upload.Status.FAILED
    assert "the database refused its data" in upload.message
    assert upload.finished_at is not None


@pytest.mark.django_db
def test_the_soft_time_limit_fails_the_upload_and_the_task_ends(monkeypatch, task_queue):
    from celery.exceptions import SoftTimeLimitExceeded

    from timelines.ingest import create_local_upload, pipeline
    from timelines.tasks import ingest_upload_task

    def out_of_time(self, bytes_read, rows):  # as Celery raises it: wherever the parser is
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(pipeline._Progress, "parsed", out_of_time)
    incident = Incident.objects.create(title="slow")
    upload = create_local_upload(incident, DEMO)

    result = ingest_upload_task.apply(args=[upload.pk])

    assert result.successful(), result.traceback
    upload.refresh_from_db()
    assert upload.status == Upload.Status.FAILED
    assert "took longer than" in upload.message


# --- 5. every writer thread ends --------------------------------------------------------------

def _backend_gone(pid: int, seconds: float = 5.0) -> bool:
    from django.db import connection

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return True
        time.sleep(0.05)
    return False


class _SlowWrites:
    """Stands in for the writer's batch write: opens the thread's connection (a real query),
    then waits to be released, or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started = threading.Event()
        self.release = threading.Event()
        self.written: list = []
        self.pid: int | None = None

    def __call__(self, batch) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.pid = cursor.fetchone()[0]
        self.written.append(batch)
        self.started.set()
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("the batch failed")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fail", [False, True], ids=["abandoned", "failing"])
def test_abandon_ends_the_writer_thread_with_a_full_queue_and_releases_its_connection(fail):
    from timelines.ingest.pipeline import _BatchWriter

    incident = Incident.objects.create(title="writer")
    writer = _BatchWriter(incident.pk, None, threaded=True)
    writes = _SlowWrites(fail=fail)
    writer._write = writes
    writer.start()
    writer.put(["first"])
    assert writes.started.wait(5)
    writer.put(["second"])
    assert writer.queue.full()  # the case where a stop marker could not be queued
    threading.Timer(0.3, writes.release.set).start()

    started = time.monotonic()
    writer.abandon()

    assert not writer.thread.is_alive()
    assert time.monotonic() - started < 5
    assert writes.written == [["first"]]  # what was queued is dropped
    assert _backend_gone(writes.pid)


@pytest.mark.django_db(transaction=True)
def test_finish_raises_the_writer_error_and_the_thread_has_ended():
    from timelines.ingest.pipeline import _BatchWriter

    incident = Incident.objects.create(title="writer")
    writer = _BatchWriter(incident.pk, None, threaded=True)
    writes = _SlowWrites(fail=True)
    writer._write = writes
    writer.start()
    writer.put(["first"])
    assert writes.started.wait(5)
    writer.put(["second"])
    writes.release.set()

    with pytest.raises(RuntimeError, match="the batch failed"):
        writer.finish()

    assert not writer.thread.is_alive()
    assert _backend_gone(writes.pid)


def test_a_writer_that_never_started_ends_at_once():
    from timelines.ingest.pipeline import _BatchWriter

    writer = _BatchWriter(1, None, threaded=True)

    writer.abandon()
    writer.finish()

    assert not writer.thread.is_alive()


# --- 6. manage.py ingest checks its arguments before it creates anything ---------------------

def _bad_paths(case: str, tmp_path: Path) -> tuple[list[str], str]:
    """The arguments of a case, and the path its error must name."""
    missing = str(tmp_path / "nonexistent" / "file.log")
    if case == "missing":
        return [missing], missing
    if case == "missing after a good file":
        return [str(DEMO), missing], missing
    if case == "pipe":
        fifo = tmp_path / "pipe.log"
        os.mkfifo(fifo)
        return [str(fifo)], str(fifo)
    if case == "device":
        return ["/dev/null"], "/dev/null"
    # a path through a file: stat itself fails (the unreadable case a root test can make)
    through = str(DEMO / "file.log")
    return [str(DEMO), through], through


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["missing", "missing after a good file", "pipe", "device",
                                  "through a file"])
def test_ingest_refuses_a_bad_path_before_it_creates_anything(case, tmp_path):
    from django.core.management import CommandError, call_command

    paths, named = _bad_paths(case, tmp_path)

    with pytest.raises(CommandError, match=re.escape(named)):
        call_command("ingest", *paths, incident="typo", stdout=io.StringIO(),
                     stderr=io.StringIO())

    assert not Incident.objects.exists()
    assert not Upload.objects.exists()


@pytest.mark.django_db
def test_ingest_refuses_jobs_below_one_before_it_creates_anything():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--jobs"):
        call_command("ingest", str(DEMO), incident="typo", jobs=0, stdout=io.StringIO(),
                     stderr=io.StringIO())

    assert not Incident.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("bundle", [False, True], ids=["file", "bundle"])
def test_ingest_stopped_by_an_error_leaves_no_upload_running(bundle, tmp_path, monkeypatch):
    from django.core.management import call_command

    from timelines.ingest import pipeline

    def broken(self, bytes_read, rows):
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(pipeline._Progress, "parsed", broken)
    path = DEMO
    if bundle:
        path = _tar(tmp_path / "b.tar.gz", [_entry("a/audit.log", DEMO.read_bytes()),
                                            _entry("b/audit.log", DEMO.read_bytes())])

    with pytest.raises(RuntimeError, match="the disk went away"):
        call_command("ingest", str(path), incident="stopped", jobs=1, stdout=io.StringIO(),
                     stderr=io.StringIO())

    uploads = list(Upload.objects.all())
    assert len(uploads) == (3 if bundle else 1)
    assert {u.status for u in uploads} == {Upload.Status.FAILED}
    assert all("the disk went away" in u.message for u in uploads if u.parent_id or not bundle)
