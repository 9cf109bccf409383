"""Every path that ends an upload frees its files before it writes the outcome: an upload that
reads as finished never still occupies the disk (issue: a fault test saw ``failed`` while the
work directory was still being removed).

The order is observed, not timed: each removal of an upload's work directory or file copy
records what the database says of the upload at that moment, which must not yet be finished.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from incidents.models import Incident, Upload
from timelines.ingest import bundle as bundle_module
from timelines.ingest import fail_upload, ingest_upload, uploads
from timelines.ingest.bundle import finish_bundle, unpack_upload, work_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def removals(monkeypatch):
    """``[(what was removed, the status of its upload then)]`` for every work directory removed
    and every file copy unlinked, with the status read from the database at that moment."""
    seen: list[tuple[str, str]] = []
    rmtree, unlink = shutil.rmtree, Path.unlink

    def status_of(path: Path) -> str:
        upload = (Upload.objects.filter(path=str(path)).first()
                  or next((u for u in Upload.objects.filter(parent=None)
                           if work_dir(u) == path), None))
        return upload.status if upload else "?"

    def spy_rmtree(path, *args, **kwargs):
        if Path(path).exists():
            seen.append((str(path), status_of(Path(path))))
        return rmtree(path, *args, **kwargs)

    def spy_unlink(self, *args, **kwargs):
        if Upload.objects.filter(path=str(self)).exists():
            seen.append((str(self), status_of(self)))
        return unlink(self, *args, **kwargs)

    monkeypatch.setattr(bundle_module.shutil, "rmtree", spy_rmtree)
    monkeypatch.setattr(Path, "unlink", spy_unlink)
    return seen


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def copied(tmp_path):
    """``copied(source_path_or_bytes, name)`` → a running upload of Hindsight's own copy."""
    incident = Incident.objects.create(title="ends")

    def make(data: bytes, name: str, status=Upload.Status.RUNNING) -> Upload:
        copy = tmp_path / "copies" / name
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(data)
        return Upload.objects.create(incident=incident, name=name, path=str(copy),
                                     path_is_copy=True, status=status,
                                     heartbeat_at=timezone.now())

    return make


def _assert_freed_while_unfinished(removals, expected: int) -> None:
    assert len(removals) >= expected, removals
    finished = {Upload.Status.DONE, Upload.Status.FAILED, Upload.Status.SKIPPED}
    assert not [r for r in removals if r[1] in finished], removals


def test_a_failed_bundle_frees_its_work_directory_and_copy_before_it_reads_failed(
        removals, copied, tmp_path, demo_log):
    upload = copied(_tarball(tmp_path / "b.tar.gz", {"a/audit.log": demo_log.read_bytes()})
                    .read_bytes(), "b.tar.gz")
    unpack_upload(upload)
    assert any(work_dir(upload).rglob("*"))

    fail_upload(upload.pk, "No space left on device")

    _assert_freed_while_unfinished(removals, 2)  # the work directory, then the copy
    upload.refresh_from_db()
    assert upload.status == Upload.Status.FAILED and upload.path == ""
    assert not work_dir(upload).exists()


def test_a_closed_bundle_frees_its_files_before_it_reads_done(removals, copied, tmp_path,
                                                               demo_log):
    upload = copied(_tarball(tmp_path / "b.tar.gz", {"a/audit.log": demo_log.read_bytes()})
                    .read_bytes(), "b.tar.gz", status=Upload.Status.PENDING)

    ingest_upload(upload.pk)  # unpacks, ingests its file in-process, closes the bundle

    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE, upload.message
    # the member's copy when it is done, the bundle's work directory and copy when it closes
    _assert_freed_while_unfinished(removals, 3)
    assert not work_dir(upload).exists() and upload.path == ""


@pytest.mark.parametrize(("data", "status"), [
    (b"", None),  # the demo log: done
    (b"\x00\x01 not evidence \xff" * 64, Upload.Status.FAILED),
])
def test_a_plain_file_frees_its_copy_before_its_outcome(removals, copied, demo_log, data, status):
    upload = copied(data or demo_log.read_bytes(), "kube-apiserver-audit.log",
                    status=Upload.Status.PENDING)

    ingest_upload(upload.pk)

    upload.refresh_from_db()
    assert upload.status == (status or Upload.Status.DONE), upload.message
    _assert_freed_while_unfinished(removals, 1)
    assert upload.path == ""


def test_a_bundle_file_skipped_or_failed_frees_its_copy_first(removals, copied, tmp_path):
    upload = copied(_tarball(tmp_path / "b.tar.gz", {"a/core.bin": bytes(range(256)) * 8})
                    .read_bytes(), "b.tar.gz", status=Upload.Status.PENDING)

    ingest_upload(upload.pk)

    child = upload.files.get()
    assert child.status == Upload.Status.SKIPPED, child.message
    _assert_freed_while_unfinished(removals, 2)


def test_an_upload_lost_too_often_frees_its_copy_before_it_reads_failed(removals, copied,
                                                                         settings):
    upload = copied(b"{}\n", "kube-apiserver-audit.log")
    Upload.objects.filter(pk=upload.pk).update(
        attempts=settings.UPLOAD_MAX_ATTEMPTS,
        heartbeat_at=timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS + 5))

    assert uploads.requeue_stale(lambda upload_id: None) == 1

    upload.refresh_from_db()
    assert upload.status == Upload.Status.FAILED
    assert upload.message.startswith("the ingest worker was lost")
    _assert_freed_while_unfinished(removals, 1)


def test_the_close_of_a_bundle_is_still_done_once(copied, tmp_path, demo_log):
    """Freeing first does not let two closers both close: the second finds it closed."""
    upload = copied(_tarball(tmp_path / "b.tar.gz", {"a/audit.log": demo_log.read_bytes()})
                    .read_bytes(), "b.tar.gz")
    children = unpack_upload(upload)
    Upload.objects.filter(pk__in=children).update(status=Upload.Status.DONE)

    assert finish_bundle(upload.pk) is True
    assert finish_bundle(upload.pk) is False
