"""A state time point that an audit log also holds is linked to the request (issue 19 item 1):
a bundle of objects and an audit log, built here from the Falco traces' create requests, whose
response bodies are the objects as created."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from timelines.analysis.registry import registered
from timelines.analysis.statelinks import link_state_to_requests
from timelines.models import Event

FALCO = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "audit" / "falco"
TRACES = ("create_configmap.json", "create_nginx_pod_privileged.json")  # named, generateName


def _requests() -> list[dict]:
    return [json.loads(line) for name in TRACES
            for line in (FALCO / name).read_text().splitlines() if line.strip()]


def _bundle(path: Path, with_audit: bool, with_objects: bool) -> Path:
    requests = _requests()
    with tarfile.open(path, "w:gz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if with_audit:
            add("bundle/audit/audit.log", b"".join(json.dumps(r).encode() + b"\n"
                                                   for r in requests))
        if with_objects:
            for number, request in enumerate(requests):
                add(f"bundle/objects/{number}.json",
                    json.dumps(request["responseObject"]).encode())
    return path


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


@pytest.mark.django_db
@pytest.mark.parametrize("order", ["audit first", "objects first", "one bundle"])
def test_a_created_time_point_is_linked_to_its_create_request(tmp_path, incident, ingest_file,
                                                               order):
    if order == "one bundle":
        files = [_bundle(tmp_path / "both.tar.gz", True, True)]
    else:
        audit = _bundle(tmp_path / "audit.tar.gz", True, False)
        objects = _bundle(tmp_path / "objects.tar.gz", False, True)
        files = [audit, objects] if order == "audit first" else [objects, audit]
    for path in files:  # each upload ready runs the analyses, the links among them
        ingest_file(incident, path)

    assert "state links" in registered()
    requests = _requests()
    for request in requests:
        meta = request["responseObject"]["metadata"]
        created = Event.objects.get(incident=incident, kind="state", reason="Created",
                                    object_uid=meta["uid"])
        audit = Event.objects.get(incident=incident, kind="audit",
                                  audit_id=request["auditID"])
        assert created.received == _at(meta["creationTimestamp"])
        assert created.annotations["request"] == audit.pk
        assert created.annotations["request_audit_id"] == request["auditID"]
    # Once linked, a row is not linked again; nothing else was linked.
    assert link_state_to_requests(incident.pk) == 0
    assert Event.objects.filter(incident=incident, annotations__has_key="request").count() \
        == len(requests)


@pytest.mark.django_db
def test_a_request_of_another_time_is_not_linked(tmp_path, incident, ingest_file):
    requests = _requests()
    for request in requests:  # the same objects, created a minute after the requests
        request["responseObject"]["metadata"]["creationTimestamp"] = "2018-10-26T15:00:00Z"
    path = tmp_path / "late.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for number, request in enumerate(requests):
            data = json.dumps(request["responseObject"]).encode()
            info = tarfile.TarInfo(f"late/{number}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ingest_file(incident, _bundle(tmp_path / "audit.tar.gz", True, False))
    ingest_file(incident, path)

    assert Event.objects.filter(incident=incident, kind="state", reason="Created").count() \
        == len(requests)
    assert not Event.objects.filter(incident=incident, annotations__has_key="request").exists()
    assert link_state_to_requests(incident.pk) == 0


@pytest.mark.django_db
def test_the_detail_of_a_linked_time_point_shows_its_request_stored_or_not(tmp_path, incident,
                                                                            ingest_file, api):
    ingest_file(incident, _bundle(tmp_path / "both.tar.gz", True, True))
    request = _requests()[1]  # the pod of a generateName: named only in the response
    created = Event.objects.get(incident=incident, kind="state", reason="Created",
                                object_uid=request["responseObject"]["metadata"]["uid"])
    audit = Event.objects.get(incident=incident, audit_id=request["auditID"])
    answers = [api(f"/api/v1/events/{created.pk}/").json()]
    Event.objects.filter(incident=incident, pk=created.pk).update(annotations={})
    answers.append(api(f"/api/v1/events/{created.pk}/").json())

    for answer in answers:
        assert answer["request"]["id"] == audit.pk
        assert answer["request"]["audit_id"] == request["auditID"]
        assert answer["request"]["verb"] == "create"
        assert answer["request"]["user"] == request["user"]["username"]
    assert api(f"/api/v1/events/{audit.pk}/").json()["request"] is None
