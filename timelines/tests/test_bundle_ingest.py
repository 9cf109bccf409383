"""Diagnose bundles through the pipeline: one upload per file inside, hostile entries refused,
files that hold nothing we read listed with the reason, the bundle closed by its last file."""

from __future__ import annotations

import io
import json
import re
import tarfile
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from hindsight.testing import requests_in
from incidents.models import Incident, Upload
from timelines.ingest import ingest_upload
from timelines.ingest.bundle import unpack_upload, work_dir
from timelines.models import BodyChunk, Event

pytestmark = pytest.mark.django_db


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1626244028  # 2021-07-14
    archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def bundle(tmp_path, fixtures_dir) -> Path:
    """A konvoy-style bundle: two control-plane nodes' audit logs, a binary file, and an entry
    that tries to escape the work directory."""
    audit = fixtures_dir / "audit"
    path = tmp_path / "diagnose.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        _add(archive, "cp-1/var/log/kubernetes/audit/kube-apiserver-audit.log",
             (audit / "audit2rbac-demo.log").read_bytes())
        _add(archive, "cp-2/var/log/kubernetes/audit/kube-apiserver-audit.log",
             (audit / "openshift-requestresponse.log").read_bytes())
        _add(archive, "cp-1/core.bin", bytes(range(256)) * 8)
        _add(archive, "../escaped.log", (audit / "openshift-requestresponse.log").read_bytes())
    return path


def _summary(out: StringIO) -> dict:
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_a_bundle_becomes_one_entry_per_file_with_format_status_and_reason(bundle, fixtures_dir,
                                                                           tmp_path):
    out = StringIO()
    with pytest.raises(CommandError):  # the escaping entry failed
        call_command("ingest", str(bundle), incident="diagnose", json=True, stdout=out,
                     stderr=StringIO())

    entries = {e["name"]: e for e in _summary(out)["uploads"]}
    audit = fixtures_dir / "audit"
    node1 = entries["cp-1/var/log/kubernetes/audit/kube-apiserver-audit.log"]
    node2 = entries["cp-2/var/log/kubernetes/audit/kube-apiserver-audit.log"]
    assert (node1["status"], node1["format"]) == ("done", "audit")
    assert node1["events"] == len(requests_in(audit / "audit2rbac-demo.log"))
    assert node2["events"] == len(requests_in(audit / "openshift-requestresponse.log"))
    assert entries["cp-1/core.bin"]["status"] == "skipped"
    assert "binary" in entries["cp-1/core.bin"]["message"]
    escaped = [e for name, e in entries.items() if "escaped" in name]
    assert len(escaped) == 1 and escaped[0]["status"] == "failed"
    assert not (tmp_path / "escaped.log").exists()
    assert not (bundle.parent.parent / "escaped.log").exists()


def test_the_bundle_is_closed_by_its_last_file_and_its_work_directory_removed(bundle,
                                                                              fixtures_dir):
    incident = Incident.objects.create(title="bundle")
    upload = Upload.objects.create(incident=incident, name=bundle.name, path=str(bundle),
                                   path_is_copy=False)

    ingest_upload(upload.pk)

    upload.refresh_from_db()
    files = list(upload.files.all())
    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.format == "bundle"
    assert upload.event_count == sum(f.event_count for f in files) > 0
    assert "1 of 4 files failed" in upload.message
    assert not work_dir(upload).exists()
    assert bundle.exists()  # a file given on the command line is never deleted
    hints = {f.name: f.hints for f in files if f.format == "audit"}
    assert hints["cp-1/var/log/kubernetes/audit/kube-apiserver-audit.log"].get("node") == "cp-1"
    assert Event.objects.filter(incident=incident).count() == sum(
        len(requests_in(fixtures_dir / "audit" / n))
        for n in ("audit2rbac-demo.log", "openshift-requestresponse.log"))


def test_unpacking_again_replaces_the_files_of_the_earlier_attempt(bundle):
    incident = Incident.objects.create(title="again")
    upload = Upload.objects.create(incident=incident, name=bundle.name, path=str(bundle),
                                   path_is_copy=False)

    first = unpack_upload(upload)
    second = unpack_upload(upload)

    assert len(first) == len(second) == 3  # two audit logs and the binary; the escape refused
    assert upload.files.count() == 4
    assert not set(first) & set(second)


def test_a_bundle_posted_to_the_api_lists_its_files(client, owner, token_for, bundle):
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(owner)}"}
    with bundle.open("rb") as handle:
        answer = client.post("/api/v1/uploads/", {"incident": "ci", "file": handle}, **auth)
    assert answer.status_code == 202
    upload_id = answer.json()["id"]
    ingest_upload(upload_id)  # on_commit never fires inside a test transaction

    status = client.get(f"/api/v1/uploads/{upload_id}/", **auth).json()
    files = client.get(status["files"]["url"], **auth).json()

    assert status["format"] == "bundle" and status["status"] == "done"
    assert status["files"]["total"] == 4
    assert status["files"]["by_status"] == {"done": 2, "skipped": 1, "failed": 1}
    assert {f["name"] for f in files["results"]} >= {
        "cp-1/var/log/kubernetes/audit/kube-apiserver-audit.log", "cp-1/core.bin"}
    assert Upload.objects.get(pk=upload_id).path == ""  # the uploaded copy is gone


@pytest.mark.parametrize("member", ["openshift-must-gather-aws.tar.xz",
                                    "troubleshoot-supportbundle-baseline.tar.gz",
                                    "sonobuoy-results-0.10.tar.gz"])
def test_real_bundles_ingest_every_file_or_say_why_not(member, fixtures_dir):
    path = fixtures_dir / "bundles" / member
    with tarfile.open(path) as archive:  # files and links: a refused link is listed too
        regular = sum(1 for m in archive.getmembers() if not m.isdir())
    out = StringIO()
    try:
        call_command("ingest", str(path), incident=member, json=True, stdout=out,
                     stderr=StringIO())
    except CommandError:
        pass  # a failed file is listed below; what matters is that each one is accounted for

    entries = _summary(out)["uploads"]
    assert len(entries) == regular
    for entry in entries:
        assert entry["status"] in ("done", "skipped", "failed"), entry
        if entry["status"] != "done":
            assert entry["message"], entry
        if entry["format"] in ("klog", "text-log"):
            # every line kept: two pods of one workload log the same lines at the same
            # instants (the must-gather lost 21 lines, the sonobuoy run one, as repeats)
            assert entry["new_events"] == entry["events"], entry
    # a pod's log lines are about it (its namespace and name as their object), and no other
    # line is: the layouts' pod log paths (must-gather, sonobuoy, troubleshoot)
    pod_log = re.compile(r"(?:^|/)(?:namespaces/([^/]+)/pods/([^/]+)/[^/]+/[^/]+/logs/"
                         r"|podlogs/([^/]+)/([^/]+)/logs/|cluster-resources/pods/logs/([^/]+)/"
                         r"([^/]+)/)")
    pod_files = 0
    for entry in entries:
        if entry["format"] not in ("klog", "text-log") or not entry["new_events"]:
            continue
        match = pod_log.search(entry["name"])
        pod = [part for part in match.groups() if part] if match else []
        pod_files += bool(pod)
        objects = set(Event.objects.filter(upload_id=entry["id"], kind="log").values_list(
            "resource", "namespace", "name").distinct())
        assert objects == ({("pods", *pod)} if pod else {("", "", "")}), entry["name"]
    # (the troubleshoot bundle's two pod logs hold no time: skipped as text)
    assert pod_files >= {"openshift-must-gather-aws.tar.xz": 100,
                         "sonobuoy-results-0.10.tar.gz": 5}.get(member, 0)
    # nothing stored holds a token's shape: JWTs, and JWS signatures with the payload detached
    # (the sonobuoy run's kube-public/cluster-info holds one, a bootstrap token's)
    incident = Incident.objects.get(title=member)
    token = re.compile(rb"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]{8,}")
    for chunk in BodyChunk.objects.filter(incident=incident).iterator():
        for line in chunk.lines():
            assert not token.search(line), line[:300]


def test_a_failed_bundle_leaves_no_unpacked_files_behind(bundle, tmp_path):
    from timelines.ingest import fail_upload

    incident = Incident.objects.create(title="lost")
    copy = tmp_path / "copy.tar.gz"
    copy.write_bytes(bundle.read_bytes())
    upload = Upload.objects.create(incident=incident, name=copy.name, path=str(copy),
                                   path_is_copy=True, status=Upload.Status.RUNNING)
    unpack_upload(upload)
    assert any(work_dir(upload).rglob("*"))

    fail_upload(upload.pk, "the worker was lost 3 times")

    assert not work_dir(upload).exists()
    assert not copy.exists()
    assert Upload.objects.get(pk=upload.pk).status == Upload.Status.FAILED


def test_files_queued_behind_a_moving_bundle_are_not_requeued(bundle, settings):
    from datetime import timedelta

    from django.utils import timezone

    from timelines.tasks import requeue_stale_uploads

    settings.CELERY_BROKER_URL = ""  # requeue would start threads; none run in a test transaction
    incident = Incident.objects.create(title="queued")
    upload = Upload.objects.create(incident=incident, name=bundle.name, path=str(bundle),
                                   path_is_copy=False, status=Upload.Status.RUNNING)
    unpack_upload(upload)
    long_ago = timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS + 60)
    upload.files.update(created_at=long_ago)
    Upload.objects.filter(pk=upload.pk).update(heartbeat_at=timezone.now())  # files finishing

    assert requeue_stale_uploads() == 0

    Upload.objects.filter(pk=upload.pk).update(heartbeat_at=long_ago)  # nothing moved for long
    waiting = upload.files.filter(status=Upload.Status.PENDING).count()
    assert requeue_stale_uploads() == waiting > 0
