"""Object diffs between two events, and CSV export of the filtered events."""

from __future__ import annotations

import csv
import io
import json

import pytest

from hindsight.testing import requests_in
from timelines.models import Event
from timelines.reads.diff import NoVersion, diff, object_version

# --- the pure diff -------------------------------------------------------------------------------


def _deployment(replicas: int, resource_version: str, image: str = "nginx:1.25") -> dict:
    return {
        "kind": "Deployment", "apiVersion": "apps/v1",
        "metadata": {"name": "web", "namespace": "shop", "resourceVersion": resource_version,
                     "generation": int(resource_version),
                     "managedFields": [{"manager": "kubectl", "time": resource_version}]},
        "spec": {"replicas": replicas,
                 "template": {"spec": {"containers": [{"name": "web", "image": image}]}}},
    }


def test_spec_changes_show_and_bookkeeping_folds_away():
    changes, folded = diff(_deployment(1, "100"), _deployment(3, "205", image="nginx:1.27"))

    assert changes == [
        {"path": "spec.replicas", "before": 1, "after": 3},
        {"path": "spec.template.spec.containers.0.image", "before": "nginx:1.25",
         "after": "nginx:1.27"},
    ]
    assert set(folded) == {"metadata.resourceVersion", "metadata.generation",
                           "metadata.managedFields.0.time"}


def test_unfolded_diff_keeps_the_bookkeeping_too():
    changes, folded = diff(_deployment(1, "100"), _deployment(1, "101"), fold=False)

    assert folded == []
    assert {c["path"] for c in changes} == {"metadata.resourceVersion", "metadata.generation",
                                            "metadata.managedFields.0.time"}


def test_a_lease_renew_time_is_never_folded():
    before = {"kind": "Lease", "metadata": {"name": "x", "resourceVersion": "1"},
              "spec": {"renewTime": "2021-07-14T06:27:00.000000Z"}}
    after = {"kind": "Lease", "metadata": {"name": "x", "resourceVersion": "2"},
             "spec": {"renewTime": "2021-07-14T06:27:10.000000Z"}}

    changes, _ = diff(before, after)

    assert changes == [{"path": "spec.renewTime", "before": before["spec"]["renewTime"],
                        "after": after["spec"]["renewTime"]}]


def test_added_and_removed_fields_and_list_items():
    changes, _ = diff({"spec": {"a": 1, "ports": [80, 443]}}, {"spec": {"b": 2, "ports": [80]}})

    assert changes == [{"path": "spec.a", "before": 1, "after": None},
                       {"path": "spec.b", "before": None, "after": 2},
                       {"path": "spec.ports.1", "before": 443, "after": None}]


@pytest.mark.parametrize(("body", "reason"), [
    ({"kind": "Event", "auditID": "a", "level": "Metadata"}, "audit level is Metadata"),
    ({"kind": "Event", "auditID": "a", "level": "RequestResponse",
      "responseObject": "skipped-too-big-size-object"}, "skipped-too-big-size-object"),
    ({"kind": "Event", "auditID": "a", "level": "Request",
      "requestObject": {"spec": {"replicas": 3}}}, "patch body"),
    (None, "not available"),
])
def test_events_without_an_object_version_say_why(body, reason):
    with pytest.raises(NoVersion, match=reason):
        object_version(body)


# --- through the API -----------------------------------------------------------------------------

def _update(audit_id: str, second: int, obj: dict) -> dict:
    stamp = f"2024-02-01T10:00:{second:02d}.000000Z"
    return {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "RequestResponse",
            "auditID": audit_id, "stage": "ResponseComplete", "verb": "update",
            "requestURI": "/apis/apps/v1/namespaces/shop/deployments/web",
            "user": {"username": "alice"},
            "objectRef": {"resource": "deployments", "namespace": "shop", "name": "web",
                          "apiGroup": "apps", "apiVersion": "v1"},
            "responseStatus": {"code": 200}, "requestObject": obj, "responseObject": obj,
            "requestReceivedTimestamp": stamp, "stageTimestamp": stamp}


@pytest.fixture
def two_versions(incident, ingest_file, tmp_path):
    path = tmp_path / "updates.log"
    path.write_text("\n".join(json.dumps(e) for e in (
        _update("5f0c7a40-0000-4000-8000-000000000001", 1, _deployment(1, "100")),
        _update("5f0c7a40-0000-4000-8000-000000000002", 2, _deployment(3, "205")),
    )))
    ingest_file(incident, path)
    return list(Event.objects.filter(incident=incident).order_by("received"))


@pytest.mark.django_db
def test_the_diff_endpoint_returns_dotted_changes(client, owner, token_for, two_versions):
    first, second = two_versions
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(owner)}"}

    answer = client.get(f"/api/v1/events/{second.pk}/diff/", {"against": first.pk}, **auth)

    assert answer.status_code == 200
    assert answer.json()["changes"] == [{"path": "spec.replicas", "before": 1, "after": 3}]
    assert "metadata.resourceVersion" in answer.json()["folded"]


@pytest.mark.django_db
def test_a_metadata_level_event_gets_the_reason_instead_of_a_diff(client, owner, token_for,
                                                                  incident, ingest_file,
                                                                  demo_log, two_versions):
    ingest_file(incident, demo_log)  # audit2rbac's log is Metadata level
    metadata_event = Event.objects.filter(incident=incident, level="Metadata").first()
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(owner)}"}

    answer = client.get(f"/api/v1/events/{two_versions[0].pk}/diff/",
                        {"against": metadata_event.pk}, **auth)

    assert answer.status_code == 422
    assert "Metadata" in answer.json()["detail"]


@pytest.mark.django_db
def test_an_outsider_cannot_diff_another_team_s_events(client, outsider, token_for,
                                                       two_versions):
    first, second = two_versions
    answer = client.get(f"/api/v1/events/{second.pk}/diff/", {"against": first.pk},
                        HTTP_AUTHORIZATION=f"Token {token_for(outsider)}")
    assert answer.status_code == 404


@pytest.mark.django_db
def test_csv_export_takes_the_event_filters(client, owner, token_for, incident, ingest_file,
                                            demo_log):
    ingest_file(incident, demo_log)
    events = [json.loads(line) for line in demo_log.read_text().splitlines() if line.strip()]
    lists = sum(1 for e in events if e["verb"] == "list")
    url = f"/api/v1/incidents/{incident.pk}/events.csv"
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(owner)}"}

    everything = client.get(url, **auth)
    only_lists = client.get(url, {"verb": "list"}, **auth)

    assert everything.status_code == 200
    assert everything["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(b"".join(everything.streaming_content).decode())))
    assert len(table) == len(requests_in(demo_log))
    assert {"received", "user", "verb", "code", "resource", "name", "subresource"} <= set(
        table[0])
    assert [r["received"] for r in table] == sorted(r["received"] for r in table)
    filtered = list(csv.DictReader(io.StringIO(
        b"".join(only_lists.streaming_content).decode())))
    assert len(filtered) == lists and {r["verb"] for r in filtered} == {"list"}


@pytest.mark.django_db
def test_csv_export_is_for_members_only(client, outsider, token_for, incident):
    url = f"/api/v1/incidents/{incident.pk}/events.csv"
    assert client.get(url).status_code == 401
    assert client.get(url, HTTP_AUTHORIZATION=f"Token {token_for(outsider)}").status_code == 404
