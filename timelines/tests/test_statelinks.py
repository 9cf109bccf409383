"""A state time point that an audit log also holds is linked to the request (issue 19 item 1):
a bundle of objects and an audit log, built here from the Falco traces' create requests, whose
response bodies are the objects as created."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db.models import Sum

from incidents.models import Upload
from timelines.analysis.registry import registered
from timelines.analysis.statelinks import KEY, fold_state_into_requests
from timelines.analysis.states import state_rows
from timelines.models import Event
from timelines.store import aggregate, columns

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


def _objects() -> list[tuple[dict, dict]]:
    """(request, object as created) of the traces."""
    return [(request, request["responseObject"]) for request in _requests()]


@pytest.mark.django_db
@pytest.mark.parametrize("order", ["audit first", "objects first", "one bundle"])
def test_a_created_time_point_is_folded_into_its_create_request(tmp_path, incident, ingest_file,
                                                                api, order):
    if order == "one bundle":
        files = [_bundle(tmp_path / "both.tar.gz", True, True)]
    else:
        audit = _bundle(tmp_path / "audit.tar.gz", True, False)
        objects = _bundle(tmp_path / "objects.tar.gz", False, True)
        files = [audit, objects] if order == "audit first" else [objects, audit]
    for path in files:  # each upload ready folds what the incident holds by then
        ingest_file(incident, path)

    listed = api(f"/api/v1/incidents/{incident.pk}/events/?page_size=500").json()["results"]
    states = api(f"/api/v1/incidents/{incident.pk}/events/?kind=state&page_size=500"
                 ).json()["results"]
    for request, created in _objects():
        meta = created["metadata"]
        when = _at(meta["creationTimestamp"])
        audit = Event.objects.get(incident=incident, kind="audit", audit_id=request["auditID"])
        # the request carries the fact; no state row says it a second time
        assert not Event.objects.filter(incident=incident, kind="state", reason="Created",
                                        object_uid=meta["uid"]).exists()
        [fact] = audit.annotations[KEY]
        assert (fact["reason"], _at(fact["received"]), fact["object_uid"]) == (
            "Created", when, meta["uid"])
        assert fact["source"].endswith(".json") and fact["name"] == meta["name"]
        # once in the events list (the request) and absent from ?kind=state; the snapshot
        # (taken here when the last object was created) is a fact of its own
        # (a generateName create names no object in its request: the request is its row)
        about = [e for e in listed if (e["resource"], e["namespace"]) == (
            audit.resource, meta["namespace"]) and e["reason"] != "Snapshot"
            and (e["name"] == meta["name"] or e["id"] == audit.pk)
            and abs(_at(e["received"]) - when).total_seconds() <= 2]
        assert [(e["id"], e["kind"]) for e in about] == [(audit.pk, "audit")]
        assert not [e for e in states if e["reason"] == "Created"
                    and e["name"] == meta["name"]]
        detail = api(f"/api/v1/events/{audit.pk}/").json()
        assert detail["also"] == [
            f"Created at {fact['received']} from snapshot {fact['source']}:{fact['line']}"]
    # the other state rows of the objects stay (their Snapshot rows), and the list is the rows
    assert states and all(e["reason"] != "Created" for e in states)
    assert len(listed) == Event.objects.filter(incident=incident).count()
    assert "state links" not in registered()
    # Folding again changes nothing.
    before = sorted(Event.objects.filter(incident=incident).values_list("pk", "annotations"))
    assert fold_state_into_requests(incident.pk) == 0
    assert sorted(Event.objects.filter(incident=incident).values_list(
        "pk", "annotations")) == before


@pytest.mark.django_db
def test_folding_makes_a_new_data_version_and_the_column_index_agrees(tmp_path, incident,
                                                                       ingest_file):
    objects = ingest_file(incident, _bundle(tmp_path / "objects.tar.gz", False, True))
    audit = ingest_file(incident, _bundle(tmp_path / "audit.tar.gz", True, False))
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    index = columns.load(incident.pk, version)
    stored = sorted(Event.objects.filter(incident=incident).values_list("pk", flat=True))
    assert sorted(index.ids({}, 0, 2**62).tolist()) == stored
    folded = [fact["audit_id"] for annotations in Event.objects.filter(
        incident=incident, annotations__has_key=KEY).values_list("annotations", flat=True)
        for fact in annotations[KEY]]
    assert len(folded) == len(_objects())
    # every row counted once, by the bundles and by their files: the objects' rows less those
    # folded
    bundles = Upload.objects.filter(pk__in=(objects.pk, audit.pk))
    assert bundles.aggregate(n=Sum("new_events"))["n"] == len(stored)
    assert Upload.objects.filter(parent__in=bundles).aggregate(
        n=Sum("new_events"))["n"] == len(stored)


@pytest.mark.django_db
def test_a_state_row_names_its_request_until_it_is_folded(tmp_path, incident, ingest_file, api):
    from timelines.analysis.registry import prepare_reads
    from timelines.ingest import create_local_upload, ingest_upload

    ingest_file(incident, _bundle(tmp_path / "objects.tar.gz", False, True))
    upload = create_local_upload(incident, _bundle(tmp_path / "audit.tar.gz", True, False))
    before = aggregate.data_version(incident.pk)
    ingest_upload(upload.pk, complete=False)  # stored, not yet folded
    request, created = _objects()[1]  # the pod of a generateName: named only in the response
    row = Event.objects.get(incident=incident, kind="state", reason="Created",
                            object_uid=created["metadata"]["uid"])
    audit = Event.objects.get(incident=incident, audit_id=request["auditID"])
    answer = api(f"/api/v1/events/{row.pk}/").json()
    assert answer["request"]["id"] == audit.pk
    assert answer["request"]["audit_id"] == request["auditID"]
    assert answer["request"]["verb"] == "create"
    assert answer["request"]["user"] == request["user"]["username"]
    assert api(f"/api/v1/events/{audit.pk}/").json()["also"] == []
    stored = aggregate.data_version(incident.pk)
    assert stored != before

    prepare_reads(incident.pk)
    assert aggregate.data_version(incident.pk) != stored
    assert api(f"/api/v1/events/{row.pk}/").status_code == 404
    answer = api(f"/api/v1/events/{audit.pk}/").json()
    assert answer["request"] is None
    assert [text.split(" from ")[0] for text in answer["also"]] == [
        f"Created at {_at(created['metadata']['creationTimestamp']).isoformat()}"]


@pytest.mark.django_db
def test_a_deletion_pending_at_capture_is_still_found_once_folded(tmp_path, incident,
                                                                   ingest_file):
    """The configmap of the trace deleted a minute later, with a grace period, and its snapshot
    taken while the deletion is pending: the state row folds into the delete request, and the
    rows that findings read still hold the pending deletion, as the request."""
    request, created = _objects()[0]
    deleted = _at(request["requestReceivedTimestamp"]) + timedelta(minutes=1)
    grace = 30
    delete = {**request, "auditID": "0b5e5d0c-0000-4000-8000-00000000d31e", "verb": "delete",
              "requestReceivedTimestamp": deleted.isoformat().replace("+00:00", "Z"),
              "stageTimestamp": deleted.isoformat().replace("+00:00", "Z"),
              "requestURI": request["requestURI"] + "/" + created["metadata"]["name"],
              "responseStatus": {"code": 200, "metadata": {}}}
    delete.pop("requestObject")
    snapshot = json.loads(json.dumps(created))
    pending = deleted + timedelta(seconds=grace)
    snapshot["metadata"].update(
        deletionTimestamp=pending.isoformat().replace("+00:00", "Z"),
        deletionGracePeriodSeconds=grace, finalizers=["example.com/hold"])
    path = tmp_path / "deleting.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("b/audit/audit.log", json.dumps(delete).encode() + b"\n"),
                           ("b/objects/cm.json", json.dumps(snapshot).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ingest_file(incident, path)

    request_row = Event.objects.get(incident=incident, audit_id=delete["auditID"])
    assert not Event.objects.filter(incident=incident, kind="state",
                                    reason="DeletionRequested").exists()
    rows = [row for row in state_rows(Event.objects.filter(incident=incident))
            if row["reason"] == "DeletionRequested"]
    assert [(row["id"], row["received"], row["name"], row["severity"]) for row in rows] == [
        (request_row.pk, pending, created["metadata"]["name"], "Warning")]


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
    assert not Event.objects.filter(incident=incident, annotations__has_key=KEY).exists()
    assert fold_state_into_requests(incident.pk) == 0


@pytest.mark.django_db
def test_a_request_replaced_by_a_later_copy_keeps_the_state_it_carries(tmp_path, incident,
                                                                       ingest_file):
    ingest_file(incident, _bundle(tmp_path / "both.tar.gz", True, True))
    requests = _requests()
    carried = {r["auditID"]: Event.objects.get(incident=incident, audit_id=r["auditID"])
               .annotations[KEY] for r in requests}
    later = []
    for request in requests:  # the same requests, completed a millisecond later: they replace
        done = _at(request["stageTimestamp"]) + timedelta(milliseconds=1)
        later.append({**request, "stageTimestamp": done.isoformat().replace("+00:00", "Z")})
    path = tmp_path / "later.log"
    path.write_text("".join(json.dumps(r) + "\n" for r in later))
    ingest_file(incident, path)

    for request in later:
        row = Event.objects.get(incident=incident, audit_id=request["auditID"])
        assert row.completed == _at(request["stageTimestamp"])  # the later copy is the row
        assert row.annotations[KEY] == carried[request["auditID"]]
        assert row.annotations["authorization.k8s.io/decision"] == "allow"


def test_an_incident_of_audit_logs_alone_is_not_read_for_state(incident, ingest_file,
                                                               fixtures_dir):
    """Its uploads say it holds no state row: no pass over its events for them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from timelines.analysis.statelinks import fold_state_into_requests

    assert ingest_file(incident, fixtures_dir / "audit" / "audit2rbac-demo.log").status == "done"
    with CaptureQueriesContext(connection) as queries:
        assert fold_state_into_requests(incident.pk) == 0
    assert not [q for q in queries.captured_queries if "timelines_event" in q["sql"]]
