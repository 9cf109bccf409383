"""The PostgreSQL store: awkward values survive COPY, deleting an incident deletes its evidence."""

from __future__ import annotations

import orjson
import pytest

from timelines.models import Event

pytestmark = pytest.mark.django_db

AWKWARD = 'tab\there, newline\nthere, back\\slash, "quotes", {braces}, comma, é, 日本'


def test_awkward_strings_round_trip_through_copy(incident, ingest_file, tmp_path):
    event = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": "0b3f4a1e-6c1d-4c55-8d5e-000000000042", "stage": "ResponseComplete",
        "requestURI": "/api/v1/namespaces/a/configmaps/x?fieldSelector=a%3Db\\c",
        "verb": "get",
        "user": {"username": AWKWARD, "groups": [AWKWARD, "system:authenticated", "a,b"]},
        "userAgent": AWKWARD + "\r\n",
        "sourceIPs": ["10.0.0.1"],
        "objectRef": {"resource": "pods", "namespace": "a", "name": "nul\u0000name"},
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": "2024-01-01T00:00:00.000001Z",
        "stageTimestamp": "2024-01-01T00:00:00.000201Z",
        "annotations": {"note": AWKWARD, "nul": "a\u0000b"},
    }
    path = tmp_path / "awkward.log"
    path.write_bytes(orjson.dumps(event) + b"\n")

    upload = ingest_file(incident, path)

    assert upload.status == "done", upload.message
    stored = Event.objects.get(incident=incident)
    assert stored.username == AWKWARD
    assert stored.groups == [AWKWARD, "system:authenticated", "a,b"]
    assert stored.user_agent == AWKWARD + "\r\n"
    assert stored.request_uri == event["requestURI"]
    # PostgreSQL text cannot hold NUL: it becomes U+FFFD, and the upload says so
    assert stored.name == "nul\ufffdname"
    assert stored.annotations == {"note": AWKWARD, "nul": "a\ufffdb"}
    assert any("2 values held a NUL" in note for note in upload.notes), upload.notes
    assert stored.duration_ms == pytest.approx(0.2)
    assert stored.body()["user"]["username"] == AWKWARD


def test_deleting_an_incident_deletes_its_events_and_bodies(incident, ingest_file, fixtures_dir):
    from incidents.models import Incident
    from timelines.ingest import purge_incident
    from timelines.models import BodyChunk

    ingest_file(incident, fixtures_dir / "audit" / "audit2rbac-demo.log")
    other = Incident.objects.create(title="kept")
    ingest_file(other, fixtures_dir / "audit" / "openshift-requestresponse.log")
    kept = Event.objects.filter(incident=other).count()
    assert Event.objects.filter(incident=incident).exists()

    gone = incident.pk  # delete() sets pk to None
    incident.delete()
    # the incident answers 404 at once; its evidence goes with the purge that follows
    assert Event.objects.filter(incident_id=gone).exists()
    purge_incident(gone)

    assert not Event.objects.filter(incident_id=gone).exists()
    assert not BodyChunk.objects.filter(incident_id=gone).exists()
    assert Event.objects.filter(incident=other).count() == kept
