"""The embedded default (no DATABASE_URL, no broker): SQLite under the data directory and ingest
in a thread of the web process. Run by the test command's second pass."""

from __future__ import annotations

import json
import time
from io import StringIO

import orjson
import pytest
from django.core.management import call_command
from django.db import connection

from hindsight.testing import requests_in
from incidents.models import Incident, Upload
from timelines.models import Event

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


def test_it_runs_on_sqlite_with_nothing_configured():
    assert connection.vendor == "sqlite"


def test_ingest_command_merges_files_and_is_idempotent_on_sqlite(fixtures_dir):
    files = [fixtures_dir / "audit" / "audit2rbac-demo.log",
             fixtures_dir / "audit" / "openshift-requestresponse.log"]
    expected = sum(len(requests_in(f)) for f in files)
    out = StringIO()
    call_command("ingest", *map(str, files), incident="embedded", json=True, stdout=out)
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    incident_id = summary["incident"]["id"]
    assert [u["status"] for u in summary["uploads"]] == ["done", "done"]
    ids = set(Event.objects.filter(incident_id=incident_id).values_list("id", flat=True))
    assert len(ids) == expected

    call_command("ingest", *map(str, files), incident_id=incident_id, json=True, stdout=StringIO())

    assert set(Event.objects.filter(incident_id=incident_id).values_list("id", flat=True)) == ids


def test_an_open_span_is_completed_by_a_later_file_on_sqlite(tmp_path, ingest_file):
    base = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": "5d1c0f5e-0000-4000-8000-000000000001", "verb": "watch",
            "requestURI": "/api/v1/pods?watch=true", "user": {"username": "alice"},
            "objectRef": {"resource": "pods", "apiVersion": "v1"},
            "requestReceivedTimestamp": "2024-03-01T10:00:00.000001Z"}
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_bytes(orjson.dumps(dict(base, stage="RequestReceived",
                                        stageTimestamp=base["requestReceivedTimestamp"])))
    second.write_bytes(orjson.dumps(dict(base, stage="ResponseComplete",
                                         stageTimestamp="2024-03-01T10:05:00.500001Z",
                                         responseStatus={"code": 200})))
    incident = Incident.objects.create(title="watch")

    ingest_file(incident, first)
    event = Event.objects.get(incident=incident)
    assert event.completed is None
    ingest_file(incident, second)
    ingest_file(incident, first)  # an earlier stage again must not reopen it

    completed = Event.objects.get(incident=incident)
    assert completed.pk == event.pk
    assert completed.duration_ms == pytest.approx(300_500.0)
    assert completed.code == 200


def test_api_filters_work_on_sqlite(client, owner, token_for, incident, ingest_file,
                                    fixtures_dir):
    path = fixtures_dir / "audit" / "audit2rbac-demo.log"
    ingest_file(incident, path)
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    masters = {e["auditID"] for e in events if "system:masters" in e["user"].get("groups", [])}
    window = sorted(e["timestamp"] for e in events)[5:11]
    in_window = {e["auditID"] for e in events if window[0] <= e["timestamp"] <= window[-1]}
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(owner)}"}
    url = f"/api/v1/incidents/{incident.pk}/events/"

    by_group = client.get(url, {"group": "system:masters", "page_size": 1000}, **auth).json()
    by_time = client.get(url, {"since": window[0], "until": window[-1], "page_size": 1000},
                         **auth).json()

    assert {e["audit_id"] for e in by_group["results"]} == masters
    assert {e["audit_id"] for e in by_time["results"]} == in_window
    # "(none)": the events without the field, beside values or alone
    cluster_scoped = {e["auditID"] for e in events if not e.get("objectRef", {}).get("namespace")}
    no_group = {e["auditID"] for e in events if not e["user"].get("groups")}
    for params, expected in (({"namespace": "(none)"}, cluster_scoped),
                             ({"group": ["(none)", "system:masters"]}, no_group | masters),
                             ({"code": "(none)"}, set())):
        got = client.get(url, {**params, "page_size": 1000}, **auth).json()
        assert {e["audit_id"] for e in got["results"]} == expected, params
    assert 0 < len(cluster_scoped) < len(events)


def test_an_api_upload_is_ingested_in_a_thread_of_the_web_process(client, owner, token_for,
                                                                    fixtures_dir):
    path = fixtures_dir / "audit" / "openshift-requestresponse.log"
    with path.open("rb") as handle:
        answer = client.post("/api/v1/uploads/", {"incident": "threaded", "file": handle},
                             HTTP_AUTHORIZATION=f"Token {token_for(owner)}")
    assert answer.status_code == 202
    upload_id = answer.json()["id"]

    deadline = time.monotonic() + 30
    while not Upload.objects.get(pk=upload_id).complete and time.monotonic() < deadline:
        time.sleep(0.05)

    upload = Upload.objects.get(pk=upload_id)
    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.event_count == len(requests_in(path))
    assert upload.path == ""  # the uploaded copy is gone once ingested


def test_a_bundle_of_audit_events_and_logs_ingests_on_sqlite(fixtures_dir, tmp_path):
    import io
    import tarfile

    members = {"node/audit.log": fixtures_dir / "audit" / "audit2rbac-demo.log",
               "node/events.json": fixtures_dir / "events" / "insights-openshift-machine-api.json",
               "node/kube-apiserver.log": fixtures_dir / "klog" / "kind-kube-apiserver.txt"}
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as archive:
        for name, source in members.items():
            info = tarfile.TarInfo(name)
            info.size = source.stat().st_size
            archive.addfile(info, io.BytesIO(source.read_bytes()))
    out = StringIO()

    call_command("ingest", str(bundle), incident="sqlite bundle", json=True, stdout=out,
                 stderr=StringIO())
    call_command("ingest", str(bundle), incident_id=json.loads(
        out.getvalue().strip().splitlines()[-1])["incident"]["id"], json=True,
                 stdout=StringIO(), stderr=StringIO())  # again: nothing new

    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    formats = {u["name"]: (u["format"], u["status"]) for u in summary["uploads"]}
    assert formats == {"node/audit.log": ("audit", "done"),
                       "node/events.json": ("k8s-events", "done"),
                       "node/kube-apiserver.log": ("klog", "done")}
    events = Event.objects.filter(incident_id=summary["incident"]["id"])
    by_kind = {kind: events.filter(kind=kind).count() for kind in ("audit", "event", "log")}
    assert by_kind["audit"] == len(requests_in(members["node/audit.log"]))
    assert by_kind["event"] == sum(u["events"] for u in summary["uploads"]
                                   if u["format"] == "k8s-events") > 0
    assert by_kind["log"] == sum(u["events"] for u in summary["uploads"]
                                 if u["format"] == "klog") > 0
    assert events.count() == sum(u["events"] for u in summary["uploads"])
