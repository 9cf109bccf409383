"""Insights (``timelines.analysis.insights``): each kind on the fixtures, with expectations read
from the files themselves, and on small synthetic logs for the cases the fixtures do not hold;
stored once per data version, access rules, sequences started from an insight."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from hindsight.testing import page_query
from incidents.models import Incident
from incidents.notes import Sequence, format_time
from timelines.analysis import common, insights
from timelines.ingest import create_local_upload, ingest_upload
from timelines.ingest.purge import delete_incident
from timelines.models import Event, IncidentInsights
from timelines.tasks import finish_incident

T0 = datetime(2024, 3, 5, 10, 0, 0, tzinfo=UTC)
GC = "system:serviceaccount:kube-system:generic-garbage-collector"


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def request(n: int, verb: str, resource: str, name: str = "", *, namespace: str = "shop",
            user: str = "alice", at: timedelta = timedelta(0), took_ms: float = 2,
            code: int = 200, level: str = "Metadata", uri: str = "", subresource: str = "",
            user_agent: str = "kubectl/v1.29", **extra) -> dict:
    """One audit event (ResponseComplete) as the apiserver writes it."""
    received = T0 + at
    path = f"/api/v1/namespaces/{namespace}/{resource}" + (f"/{name}" if name else "") + (
        f"/{subresource}" if subresource else "")
    ref = {"resource": resource, "namespace": namespace, "name": name, "apiVersion": "v1"}
    if subresource:
        ref["subresource"] = subresource
    return {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level,
            "auditID": f"req-{n:05d}", "stage": "ResponseComplete", "verb": verb,
            "requestURI": uri or path, "user": {"username": user}, "userAgent": user_agent,
            "sourceIPs": ["10.0.0.1"], "objectRef": {k: v for k, v in ref.items() if v},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": stamp(received),
            "stageTimestamp": stamp(received + timedelta(milliseconds=took_ms)), **extra}


def write_log(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def ids_by_audit_id(incident) -> dict[str, int]:
    return dict(Event.objects.filter(incident=incident, kind="audit").values_list(
        "audit_id", "id"))


def of_kind(found: list[dict], kind: str) -> list[dict]:
    return [i for i in found if i["kind"] == kind]


def read_events(paths) -> list[dict]:
    events = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        try:
            events.append(json.loads(text))
        except json.JSONDecodeError:
            try:
                events.extend(json.loads(line) for line in text.splitlines() if line.strip())
            except json.JSONDecodeError:
                continue  # falco's deliberately malformed trace
    # a request in two files (falco has one) is one event
    unique = {(e["auditID"], e.get("requestReceivedTimestamp")): e for e in events if "verb" in e}
    return list(unique.values())


def ok(event: dict) -> bool:
    return 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300


@pytest.fixture
def fixture_incident(incident, ingest_file, fixtures_dir):
    """The incident holding every falco trace and the two audit logs; returns the events read
    from the files."""
    paths = [*sorted((fixtures_dir / "audit" / "falco").glob("*.json")),
             fixtures_dir / "audit" / "audit2rbac-demo.log",
             fixtures_dir / "audit" / "openshift-requestresponse.log"]
    for path in paths:
        ingest_file(incident, path)
    return read_events(paths)


# --- on the fixtures ----------------------------------------------------------------------------

def test_every_successful_delete_of_the_fixtures_is_told_with_who_and_when(fixture_incident,
                                                                            incident):
    found = insights.compute(incident.pk)
    ids = ids_by_audit_id(incident)
    deletes = [e for e in fixture_incident if e["verb"] == "delete" and ok(e)]
    assert deletes  # falco deletes namespaces, secrets, deployments…
    told = {i for item in of_kind(found, "deletion") for i in item["events"]}
    assert {ids[e["auditID"]] for e in deletes} <= told
    expected = Counter((e["user"]["username"], e["objectRef"]["resource"]) for e in deletes
                       if e["objectRef"]["resource"] != "namespaces")
    groups = {(i["user"], i["resource"]): i for i in of_kind(found, "deletion") if "count" in i}
    assert {key: item["count"] for key, item in groups.items()} == dict(expected)
    for (user, resource), item in groups.items():
        assert [d["name"] for d in item["deletes"]] == [
            e["objectRef"].get("name", "") for e in sorted(
                deletes, key=lambda e: e["requestReceivedTimestamp"])
            if (e["user"]["username"], e["objectRef"]["resource"]) == (user, resource)]
    namespaces = [e for e in deletes if e["objectRef"]["resource"] == "namespaces"]
    told_namespaces = [i for i in of_kind(found, "deletion") if "namespace" in i
                       and "contents_removed_at" in i]
    assert sorted(i["namespace"] for i in told_namespaces) == sorted(
        e["objectRef"]["name"] for e in namespaces)
    for item in told_namespaces:
        source = next(e for e in namespaces if e["objectRef"]["name"] == item["namespace"])
        assert item["user"] == source["user"]["username"]
        assert item["at"].rstrip("Z") == source["requestReceivedTimestamp"].rstrip("Z")


def test_objects_created_again_after_their_deletion_in_the_fixtures(fixture_incident, incident):
    found = insights.compute(incident.pk)
    ids = ids_by_audit_id(incident)
    # the creates whose object's previous successful create or delete was a delete
    lifecycle = sorted((e for e in fixture_incident if e["verb"] in ("create", "delete")
                        and ok(e) and (e.get("objectRef") or {}).get("name")),
                       key=lambda e: e["requestReceivedTimestamp"])
    last, expected = {}, {}
    for event in lifecycle:
        ref = event["objectRef"]
        key = (ref["resource"], "" if ref["resource"] == "namespaces"
               else ref.get("namespace", ""), ref["name"])
        if event["verb"] == "create" and last.get(key, {}).get("verb") == "delete":
            expected.setdefault(key, []).append((last[key], event))
        last[key] = event
    assert expected  # falco re-creates clusterrole some-reader and namespace foo
    told = {(i["resource"], i["namespace"], i["name"]): i
            for i in of_kind(found, "recreated-object")}
    assert set(told) == set(expected)
    for key, pairs in expected.items():
        recreations = told[key]["recreations"]
        assert [(r["deleted"]["event"], r["created"]["event"]) for r in recreations] == [
            (ids[d["auditID"]], ids[c["auditID"]]) for d, c in pairs]
        for recreation, (_, create) in zip(recreations, pairs, strict=True):
            uid = ((create.get("responseObject") or {}).get("metadata") or {}).get("uid", "")
            assert recreation["created"]["uid"] == uid


def test_lists_without_resource_version_by_actor_in_the_fixtures(fixture_incident, incident):
    found = insights.compute(incident.pk)
    expected = Counter(
        e["user"]["username"] for e in fixture_incident if e["verb"] == "list"
        and not re.search(r"[?&]resourceVersion=[^&]", e["requestURI"]))
    assert expected
    told = {i["user"]: i for i in of_kind(found, "list-without-resource-version")}
    assert {u: i["count"] for u, i in told.items()} == dict(expected.most_common(10))
    ids = ids_by_audit_id(incident)
    for user, item in told.items():
        assert set(item["events"]) == {
            ids[e["auditID"]] for e in fixture_incident if e["verb"] == "list"
            and e["user"]["username"] == user and "resourceVersion=" not in e["requestURI"]}


def test_audit_coverage_counts_the_levels_and_stages_of_the_fixtures(fixture_incident,
                                                                     incident):
    [coverage] = of_kind(insights.compute(incident.pk), "audit-coverage")
    assert coverage["levels"] == dict(Counter(e["level"] for e in fixture_incident))
    assert sum(coverage["stages"].values()) == len(fixture_incident)
    written = defaultdict(set)
    for event in fixture_incident:
        if event["verb"] in ("create", "update", "patch", "delete"):
            written[(event.get("objectRef") or {}).get("resource", "")].add(event["level"])
    assert coverage["undiffable"] == sorted(
        r for r, levels in written.items() if r and not levels & {"Request", "RequestResponse"})
    assert coverage["events"] == []


# --- synthetic logs -----------------------------------------------------------------------------

TRACE_URL = "/apis/apps/v1/namespaces/shop/deployments/web"


def test_a_slow_patch_comes_with_its_latency_annotations_and_trace(incident, ingest_file,
                                                                   tmp_path):
    latency = {"apiserver.latency.k8s.io/total": "2.2s", "apiserver.latency.k8s.io/etcd":
               "2.18s", "authorization.k8s.io/decision": "allow"}
    slow = request(1, "patch", "deployments", "web", user="kopf", took_ms=2199,
                   uri=TRACE_URL + "?fieldManager=kopf", user_agent="kopf/1.32.1",
                   annotations=latency, at=timedelta(seconds=6.063))
    events = [slow,
              request(2, "watch", "pods", took_ms=60_000, uri="/api/v1/pods?watch=true"),
              request(3, "create", "pods", "web-0", subresource="exec", took_ms=30_000,
                      code=101),
              request(4, "get", "pods", "web-0", took_ms=999)]
    ingest_file(incident, write_log(tmp_path / "audit.log", events))
    start = T0 + timedelta(seconds=6.063)
    header = "I0305 10:00:08.262884       1 trace.go:205] "
    log = tmp_path / "kube-apiserver.log"
    log.write_text("".join(header + line + "\n" for line in [
        f'Trace[662526312]: "Patch" url:{TRACE_URL},user-agent:kopf/1.32.1,'
        f"client:10.0.0.1 ({start:%d-%b-%Y %H:%M:%S}.063) (total time: 2199ms):",
        'Trace[662526312]: ---"About to apply patch" 3ms (10:00:06.066)',
        'Trace[662526312]: ---"Recorded the audit event" 2183ms (10:00:08.247)',
        "Trace[662526312]: [2.199755066s] [2.199755066s] END"]))
    upload = ingest_file(incident, log)
    assert upload.status == "done", upload.message
    ids = ids_by_audit_id(incident)
    trace_id = Event.objects.get(incident=incident, kind="trace").pk
    [item] = of_kind(insights.compute(incident.pk), "slow-request")
    assert item["events"] == [ids["req-00001"], trace_id]
    assert item["latency"] == {"total": "2.2s", "etcd": "2.18s"}
    assert item["trace"]["event"] == trace_id and item["trace"]["id"] == "662526312"
    assert item["trace"]["steps"] == ['---"About to apply patch" 3ms (10:00:06.066)',
                                      '---"Recorded the audit event" 2183ms (10:00:08.247)']
    assert item["severity"] == "warning" and item["duration_ms"] == pytest.approx(2199)
    assert "etcd 2.18s" in item["explanation"]


def test_a_burst_of_conflicts_is_found_and_scattered_errors_are_not(incident, ingest_file,
                                                                    tmp_path):
    burst = [request(n, "update", "configmaps", "lock", user="operator", code=409,
                     at=timedelta(minutes=30, seconds=n)) for n in range(20)]
    # the same number of 403s spread over an hour: no burst
    scattered = [request(100 + n, "get", "secrets", "db", user="bob", code=403,
                         at=timedelta(minutes=3 * n)) for n in range(20)]
    ingest_file(incident, write_log(tmp_path / "audit.log", burst + scattered))
    ids = ids_by_audit_id(incident)
    [item] = of_kind(insights.compute(incident.pk), "error-burst")
    assert item["category"] == "conflict" and item["event_count"] == 20
    assert item["events"] == [ids[e["auditID"]] for e in burst]
    assert item["codes"] == {"409": 20} and "operator (20)" in item["explanation"]


def test_two_actors_writing_one_object_in_turn_are_conflicting_writers(incident, ingest_file,
                                                                       tmp_path):
    turns = ["hpa", "argocd", "hpa", "argocd"]
    alternating = [request(n, "patch", "deployments", "web", user=user,
                           at=timedelta(seconds=10 * n), code=409 if n == 3 else 200)
                   for n, user in enumerate(turns)]
    # two writers one after the other, no coming back: not a conflict
    handover = [request(10 + n, "update", "deployments", "api", user=user,
                        at=timedelta(seconds=10 * n)) for n, user in enumerate(
        ["alice", "alice", "bob"])]
    ingest_file(incident, write_log(tmp_path / "audit.log", alternating + handover))
    ids = ids_by_audit_id(incident)
    [item] = of_kind(insights.compute(incident.pk), "conflicting-writers")
    assert (item["resource"], item["namespace"], item["name"]) == ("deployments", "shop", "web")
    assert item["switches"] == 3 and item["conflicts"] == 1 and item["severity"] == "critical"
    assert item["events"] == [ids[e["auditID"]] for e in alternating]
    assert {w["user"] for w in item["writers"]} == {"hpa", "argocd"}


def owned(kind: str, name: str, uid: str) -> dict:
    return {"metadata": {"ownerReferences": [{"kind": kind, "name": name, "uid": uid,
                                              "controller": True}]}}


def test_garbage_collector_deletes_are_linked_to_the_owner_deletion(incident, ingest_file,
                                                                    tmp_path):
    owner = request(1, "delete", "deployments", "web", user="alice", level="RequestResponse",
                    objectRef={"resource": "deployments", "namespace": "shop", "name": "web",
                               "uid": "dep-1"})
    replicaset = request(2, "delete", "replicasets", "web-5d4", user=GC, at=timedelta(seconds=1),
                         level="RequestResponse",
                         responseObject={"kind": "ReplicaSet", **owned("Deployment", "web",
                                                                       "dep-1")})
    pod = request(3, "delete", "pods", "web-5d4-x", user=GC, at=timedelta(seconds=2),
                  level="RequestResponse",
                  responseObject={"kind": "Pod", **owned("ReplicaSet", "web-5d4", "rs-1")})
    # no body: linked by time and namespace to bob's delete a minute before
    other = request(4, "delete", "services", "cache", namespace="ops", user="bob",
                    at=timedelta(minutes=1))
    orphan = request(5, "delete", "endpoints", "cache", namespace="ops", user=GC,
                     at=timedelta(minutes=2))
    ingest_file(incident, write_log(tmp_path / "audit.log",
                                    [owner, replicaset, pod, other, orphan]))
    ids = ids_by_audit_id(incident)
    linked = {i["owner"]["event"]: i for i in of_kind(insights.compute(incident.pk), "deletion")
              if "owner" in i}
    assert set(linked) == {ids["req-00001"], ids["req-00004"]}
    web = linked[ids["req-00001"]]
    assert [(c["event"], c["linked_by"]) for c in web["collected"]] == [
        (ids["req-00002"], "ownerReferences"), (ids["req-00003"], "ownerReferences")]
    assert web["events"] == [ids["req-00001"], ids["req-00002"], ids["req-00003"]]
    assert [(c["event"], c["linked_by"]) for c in linked[ids["req-00004"]]["collected"]] == [
        (ids["req-00005"], "time and namespace")]


def test_a_namespace_deletion_says_when_its_contents_went(incident, ingest_file, tmp_path):
    events = [request(1, "delete", "namespaces", "shop", user="alice"),
              *(request(2 + n, "delete", "pods", f"web-{n}", user="namespace-controller",
                        at=timedelta(days=4, seconds=n)) for n in range(3)),
              request(9, "create", "namespaces", "shop", user="ci", at=timedelta(days=5),
                      code=201)]
    ingest_file(incident, write_log(tmp_path / "audit.log", events))
    ids = ids_by_audit_id(incident)
    [item] = [i for i in of_kind(insights.compute(incident.pk), "deletion")
              if i.get("namespace") == "shop" and "contents_removed_at" in i]
    assert item["contents_removed_at"] == format_time(T0 + timedelta(days=4, seconds=2))
    assert item["events"] == [ids[f"req-{n:05d}"] for n in (1, 2, 3, 4)]
    assert item["recreated_at"] == format_time(T0 + timedelta(days=5))
    assert "4 d" in item["explanation"]


def test_a_patch_that_empties_the_finalizers_of_a_deleted_object(incident, ingest_file,
                                                                 tmp_path):
    events = [request(1, "delete", "persistentvolumeclaims", "data", user="alice"),
              request(2, "patch", "persistentvolumeclaims", "data", user="pvc-protection",
                      at=timedelta(seconds=30), level="Request",
                      requestObject={"metadata": {"finalizers": None}}),
              request(3, "patch", "persistentvolumeclaims", "data", user="labeler",
                      at=timedelta(seconds=20), level="Request",
                      requestObject={"metadata": {"labels": {"a": "b"}}})]
    ingest_file(incident, write_log(tmp_path / "audit.log", events))
    ids = ids_by_audit_id(incident)
    [item] = [i for i in of_kind(insights.compute(incident.pk), "deletion")
              if i.get("finalizers_removed")]
    assert item["events"] == [ids["req-00002"]] and item["user"] == "pvc-protection"


def test_an_object_recreated_by_another_actor_under_a_new_uid(incident, ingest_file, tmp_path):
    events = [request(1, "create", "secrets", "tls", user="cert-manager", code=201,
                      level="RequestResponse",
                      responseObject={"metadata": {"name": "tls", "uid": "uid-1"}}),
              request(2, "delete", "secrets", "tls", user="argocd", at=timedelta(seconds=5),
                      level="RequestResponse", responseObject={
                          "kind": "Status", "status": "Success", "details": {"uid": "uid-1"}}),
              request(3, "create", "secrets", "tls", user="cert-manager", code=201,
                      at=timedelta(seconds=5.034), level="RequestResponse",
                      responseObject={"metadata": {"name": "tls", "uid": "uid-2"}})]
    ingest_file(incident, write_log(tmp_path / "audit.log", events))
    ids = ids_by_audit_id(incident)
    [item] = of_kind(insights.compute(incident.pk), "recreated-object")
    assert item["severity"] == "warning"  # another actor than the one that deleted it
    assert item["events"] == [ids["req-00002"], ids["req-00003"]]
    [recreation] = item["recreations"]
    assert (recreation["deleted"]["uid"], recreation["created"]["uid"]) == ("uid-1", "uid-2")
    assert (recreation["deleted"]["user"], recreation["created"]["user"]) == (
        "argocd", "cert-manager")
    assert "new UID uid-2 (was uid-1)" in item["explanation"]


# --- stored once per data version; the API ------------------------------------------------------

def url(incident) -> str:
    return reverse("incident-insights", args=[incident.pk])


def test_insights_are_computed_once_per_data_version(incident, ingest_file, tmp_path, api_as,
                                                     owner, demo_log):
    ingest_file(incident, demo_log)
    client = api_as(owner)
    first = client.get(url(incident))
    assert first.status_code == 200
    row = IncidentInsights.objects.get(incident=incident)
    assert first.json() == row.insights and first["X-Insights-Version"] == row.version
    with CaptureQueriesContext(connection) as queries:
        second = client.get(url(incident))
    assert second.json() == first.json()
    assert not [q for q in queries.captured_queries if "timelines_event" in q["sql"]]
    assert IncidentInsights.objects.get(incident=incident).computed_at == row.computed_at
    # a new upload: a new data version, computed again
    ingest_file(incident, write_log(tmp_path / "audit.log", [
        request(1, "delete", "secrets", "tls", user="mallory")]))
    third = client.get(url(incident)).json()
    assert third != first.json()
    assert any(i.get("user") == "mallory" for i in of_kind(third, "deletion"))
    assert IncidentInsights.objects.get(incident=incident).version != row.version


def test_an_incident_without_evidence_has_no_findings(incident, api_as, owner):
    assert api_as(owner).get(url(incident)).json() == []


def test_finishing_the_uploads_stores_the_insights(incident, demo_log):
    upload = ingest_upload(create_local_upload(incident, demo_log).pk, complete=False)
    assert (upload.status, upload.stage) == ("running", "ready")
    assert not IncidentInsights.objects.filter(incident=incident).exists()
    finish_incident(incident.pk, cache_figures=False)
    row = IncidentInsights.objects.get(incident=incident)
    assert row.insights == insights.compute(incident.pk)
    upload.refresh_from_db()
    assert (upload.status, upload.stage) == ("done", "complete")


def test_deleting_the_incident_removes_its_insights(incident, ingest_file, demo_log):
    ingest_file(incident, demo_log)
    insights.refresh(incident.pk)
    assert IncidentInsights.objects.filter(incident_id=incident.pk).exists()
    assert delete_incident(incident)
    assert not IncidentInsights.objects.filter(incident_id=incident.pk).exists()


def test_who_may_read_recompute_and_make_sequences(incident, ingest_file, api_as, owner,
                                                   teammate, outsider, fixtures_dir):
    ingest_file(incident, fixtures_dir / "audit" / "falco" / "delete_namespace_foo.json")
    ingest_file(incident, fixtures_dir / "audit" / "falco" / "delete_secret.json")
    sequence_url = reverse("incident-insight-sequence", args=[incident.pk, 0])
    assert api_as(outsider).get(url(incident)).status_code == 404
    assert api_as(outsider).post(url(incident)).status_code == 404
    assert api_as(outsider).post(sequence_url).status_code == 404
    assert api_as(None).get(url(incident)).status_code == 401
    assert api_as(teammate).get(url(incident)).status_code == 200
    assert api_as(teammate).post(url(incident)).status_code == 403
    assert api_as(teammate).post(sequence_url).status_code == 403
    assert not Sequence.objects.exists()
    recomputed = api_as(owner).post(url(incident))
    assert recomputed.status_code == 200 and recomputed.json()


def test_a_sequence_from_an_insight_has_its_events_as_steps_in_time_order(
        incident, ingest_file, api_as, owner, tmp_path):
    events = [request(n, "patch", "deployments", "web", user=user, at=timedelta(seconds=n))
              for n, user in enumerate(["hpa", "argocd", "hpa", "argocd", "hpa"])]
    ingest_file(incident, write_log(tmp_path / "audit.log", events))
    found = api_as(owner).get(url(incident)).json()
    [item] = of_kind(found, "conflicting-writers")
    answer = api_as(owner).post(reverse("incident-insight-sequence",
                                        args=[incident.pk, item["id"]]), {}, format="json")
    assert answer.status_code == 201
    sequence = answer.json()
    assert sequence["title"] == item["title"]
    times = dict(Event.objects.filter(pk__in=item["events"]).values_list("pk", "received"))
    assert [s["event"] for s in sequence["steps"]] == sorted(item["events"],
                                                             key=lambda i: (times[i], i))
    assert sequence["steps"][0]["note"] == item["explanation"]
    assert Sequence.objects.get(pk=sequence["id"]).incident_id == incident.pk
    missing = reverse("incident-insight-sequence", args=[incident.pk, len(found)])
    assert api_as(owner).post(missing).status_code == 404


def test_the_events_api_selects_events_by_id(incident, ingest_file, api_as, owner, demo_log):
    ingest_file(incident, demo_log)
    some = list(Event.objects.filter(incident=incident).order_by("id").values_list(
        "id", flat=True)[3:6])
    answer = api_as(owner).get(reverse("api:incident-event-list", args=[incident.pk]),
                               {"id": some}).json()
    assert sorted(e["id"] for e in answer["results"]) == some


@pytest.mark.embedded
def test_insights_of_the_fixtures_on_sqlite(incident, ingest_file, fixtures_dir):
    """The embedded mode: the window and regular expression queries on SQLite."""
    for path in sorted((fixtures_dir / "audit" / "falco").glob("*.json")):
        ingest_file(incident, path)
    found = insights.refresh(incident.pk).insights
    kinds = {i["kind"] for i in found}
    assert {"deletion", "recreated-object", "audit-coverage"} <= kinds
    assert {(i["resource"], i["name"]) for i in of_kind(found, "recreated-object")} >= {
        ("namespaces", "foo"), ("clusterroles", "some-reader")}
    assert Incident.objects.filter(pk=incident.pk).exists()


# --- the incident page --------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_panel_shows_the_insights_and_a_click_puts_their_events_on_the_timeline(
        open_page, owner, incident, falco):
    found = insights.refresh(incident.pk).insights
    [recreated] = [i for i in of_kind(found, "recreated-object") if i["name"] == "some-reader"]
    # read from the fixture: the delete of clusterrole some-reader and its next create
    delete = next(r for r in falco if (r["verb"], r["name"]) == ("delete", "some-reader"))
    create = next(r for r in falco if (r["verb"], r["name"]) == ("create", "some-reader")
                  and r["received"] > delete["received"])
    page = open_page(owner, f"/incidents/{incident.pk}/")
    # one line under the title: the counts and the most severe findings
    page.wait_for_selector("#insights-top .insight-chip")
    assert page.eval_on_selector_all("#insights-top .insight-chip", "chips => chips.map("
                                     "c => c.textContent)") == [i["title"] for i in found[:3]]
    counts = Counter(i["severity"] for i in found)
    assert page.text_content("#insights-status") == " · ".join(
        f"{counts[s]} {s}" for s in ("critical", "warning", "info") if counts[s]) + ":"
    page.click("#insights > summary")  # the list opens over the page
    page.wait_for_selector("#insights-list li.insight")
    shown = page.eval_on_selector_all(
        "#insights-list li.insight", "items => items.map(i => i.querySelector("
        "'.insight-title').textContent)")
    assert shown == [i["title"] for i in found]
    item = page.locator(f'#insights-list li[data-insight="{recreated["id"]}"]')
    assert recreated["explanation"] in item.text_content()
    assert item.locator("button.start-sequence").count() == 1  # the owner writes
    item.locator("a.evidence").click()
    page.wait_for_load_state()
    page.wait_for_function(
        "Number(document.getElementById('gantt').dataset.drawn || 0) >= 1")
    assert sorted(map(int, page_query(page)["id"])) == sorted([delete["id"], create["id"]])
    assert "2 events on" in page.text_content("#gantt-status")
    rows = page.eval_on_selector_all("#events tbody tr[data-event]",
                                     "rows => rows.map(r => Number(r.dataset.event))")
    assert rows == [delete["id"], create["id"]]


@pytest.mark.django_db(transaction=True)
def test_a_link_to_insights_opens_the_panel_on_load_and_on_the_page(open_page, owner, incident,
                                                                    falco):
    insights.refresh(incident.pk)
    page = open_page(owner, f"/incidents/{incident.pk}/#insights")
    page.wait_for_selector("#insights-list li.insight")
    page.wait_for_function("document.getElementById('insights').open")
    page.keyboard.press("Escape")
    assert not page.evaluate("document.getElementById('insights').open")
    page.evaluate("location.hash = ''")
    page.evaluate("location.hash = '#insights'")  # a link on the page: no load
    page.wait_for_function("document.getElementById('insights').open")


@pytest.mark.django_db(transaction=True)
def test_a_reader_sees_no_sequence_button(open_page, teammate, incident, falco):
    insights.refresh(incident.pk)
    page = open_page(teammate, f"/incidents/{incident.pk}/")
    page.click("#insights > summary")
    page.wait_for_selector("#insights-list li.insight")
    assert page.locator("#insights-list button.start-sequence").count() == 0


@pytest.mark.django_db(transaction=True)
def test_start_a_sequence_from_the_panel_opens_it_on_the_timeline(open_page, owner, incident,
                                                                   falco):
    found = insights.refresh(incident.pk).insights
    [recreated] = [i for i in of_kind(found, "recreated-object") if i["name"] == "some-reader"]
    page = open_page(owner, f"/incidents/{incident.pk}/")
    page.click("#insights > summary")
    item = page.locator(f'#insights-list li[data-insight="{recreated["id"]}"]')
    item.locator("button.start-sequence").click()
    page.wait_for_url("**sequence=*")
    sequence = Sequence.objects.get(incident=incident)
    assert page_query(page)["sequence"] == [str(sequence.pk)]
    page.wait_for_selector("#sequence-steps li.step")
    assert page.eval_on_selector_all("#sequence-steps li.step", "items => items.map("
                                     "i => Number(i.dataset.event))") == recreated["events"]
    assert sequence.title == recreated["title"]


# --- pure functions -----------------------------------------------------------------------------

def test_a_burst_must_stand_out_from_the_incident_s_mean_rate():
    first, last = T0, T0 + timedelta(hours=1)
    steady = [("server", T0 + timedelta(minutes=m), 12) for m in range(60)]
    assert common.find_bursts(steady, first, last) == []  # 12 a minute all hour long
    spike = [*steady[:30], ("server", T0 + timedelta(minutes=30), 400),
             ("server", T0 + timedelta(minutes=31), 300), *steady[32:]]
    [burst] = common.find_bursts(spike, first, last)
    assert (burst["start"], burst["end"], burst["count"]) == (
        T0 + timedelta(minutes=30), T0 + timedelta(minutes=32), 700)


def test_a_trace_naming_the_audit_id_wins_over_a_nearer_one():
    request_row = {"audit_id": "abc", "received": T0, "verb": "patch", "duration_ms": 2000,
                   "request_uri": "/api/v1/namespaces/a/pods/b", "user_agent": "x"}
    near = {"id": 1, "annotations": {}, "received": T0, "verb": "patch", "duration_ms": 2000,
            "request_uri": "/api/v1/namespaces/a/pods/b", "user_agent": "x"}
    named = {**near, "id": 2, "annotations": {"audit-id": "abc"},
             "received": T0 + timedelta(seconds=5)}
    other_path = {**near, "id": 3, "request_uri": "/api/v1/namespaces/a/pods/c"}
    assert insights.match_trace(request_row, [near, named])["id"] == 2
    assert insights.match_trace(request_row, [other_path, near])["id"] == 1
    assert insights.match_trace(request_row, [other_path]) is None


@pytest.mark.parametrize(("request_object", "response", "emptied"), [
    ({"metadata": {"finalizers": []}}, None, True),
    ({"metadata": {"finalizers": None}}, None, True),
    ([{"op": "remove", "path": "/metadata/finalizers"}], None, True),
    ([{"op": "replace", "path": "/metadata/finalizers", "value": []}], None, True),
    ({"metadata": {"finalizers": ["a"]}}, {"metadata": {"finalizers": ["a"]}}, False),
    ({"metadata": {"labels": {"x": "y"}}}, {"metadata": {}}, False),
])
def test_what_counts_as_emptying_the_finalizers(request_object, response, emptied):
    from timelines.analysis.deletions import empties_finalizers

    body = {"requestObject": request_object, "responseObject": response}
    assert empties_finalizers(body) is emptied


def test_an_insight_s_filters_name_an_empty_value_so_they_select_its_events_only(
        incident, ingest_file, tmp_path, api):
    """Deletes by a request without a user: the insight's filters (the link when its ids are
    too many for a URL) say ``user=(none)``, which selects those deletes, not alice's too (an
    empty value would be no filter)."""
    nobody = [request(n, "delete", "pods", f"web-{n}", user="", at=timedelta(seconds=n))
              for n in range(1, 4)]
    alice = [request(n, "delete", "pods", f"db-{n}", at=timedelta(seconds=n)) for n in (5, 6)]
    ingest_file(incident, write_log(tmp_path / "audit.log", nobody + alice))

    (found,) = [i for i in of_kind(insights.compute(incident.pk), "deletion")
                if i.get("user") == ""]

    assert found["filters"]["user"] == ["(none)"]
    listed = api(f"/api/v1/incidents/{incident.pk}/events/",
                 {**found["filters"], "page_size": 1000}).json()["results"]
    assert sorted(e["id"] for e in listed) == sorted(found["events"])
    assert len(listed) == len(nobody)
    assert common.insight("k", "t", "info", "", [], filters={"user": ["", "bob"]})[
        "filters"] == {"user": ["(none)", "bob"]}
