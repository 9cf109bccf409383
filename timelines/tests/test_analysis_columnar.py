"""The insights' passes over every request, counted on the column index
(``timelines.analysis.columnar``), answer exactly what their queries answer: each compared on an
incident that holds every case the queries tell apart, and the whole of the insights with and
without the index."""

from __future__ import annotations

from copy import deepcopy
from datetime import timedelta

import pytest

from timelines.analysis import columnar, deletions, insights
from timelines.analysis.common import MAX_EVENTS, find_bursts
from timelines.models import Event
from timelines.store import aggregate, columns

from .test_analysis_insights import GC, request, write_log

pytestmark = pytest.mark.django_db


def synthetic() -> list[dict]:
    """Requests of every case the queries tell apart: errors of each category in bursts and
    apart, across minutes; writers that alternate and that hand over; deletes by several actors
    (one with more than an insight lists), by the garbage collector, of namespaces, refused,
    and a deletecollection; objects created again after their deletion, a namespace (keyed
    without its namespace) among them, an unnamed create; LISTs."""
    events, n = [], 0

    def add(verb, resource, name="", **options):
        nonlocal n
        n += 1
        events.append(request(n, verb, resource, name, **options))

    for second in range(90):  # 409s over two minutes, 429s, 5xx and 4xx between them
        add("update", "configmaps", "lock", user="operator", code=409,
            at=timedelta(minutes=30, seconds=second))
    for second in range(30):  # 5xx of two users (as many each) on three resources
        add("get", ("pods", "services", "nodes")[second % 3], f"x{second}",
            user=("kubelet", "scheduler")[second % 2], code=(500, 503)[second % 2],
            at=timedelta(minutes=35, seconds=second))
    for second in range(15):
        add("get", "pods", f"p{second}", user="kubelet", code=(429, 503, 500, 404, 403)[
            second % 5], at=timedelta(minutes=31, seconds=2 * second))
    for step, user in enumerate(["hpa", "argocd", "hpa", "argocd", "hpa"]):
        add("patch", "deployments", "web", user=user, at=timedelta(minutes=5, seconds=step),
            code=409 if step == 3 else 200)
    for step, user in enumerate(["alice", "alice", "bob"]):
        add("update", "deployments", "api", user=user, at=timedelta(minutes=6, seconds=step))
    for k in range(MAX_EVENTS + 30):  # one actor's many deletes: the insight lists the first
        add("delete", "pods", f"job-{k}", user="cleaner", at=timedelta(minutes=40, seconds=k))
    for k in range(5):
        add("delete", "pods", f"owned-{k}", user=GC, at=timedelta(minutes=41, seconds=k))
        add("delete", "secrets", f"s{k}", user="bob", code=403 if k % 2 else 200,
            at=timedelta(minutes=42, seconds=k))
        add("deletecollection", "events", user="bob", at=timedelta(minutes=43, seconds=k))
    for k in range(3):  # created, deleted, created again; a namespace too
        at = timedelta(minutes=50 + 2 * k)
        add("create", "configmaps", f"cm{k}", user="alice", at=at)
        add("delete", "configmaps", f"cm{k}", user="bob", at=at + timedelta(seconds=10))
        add("create", "configmaps", f"cm{k}", user="carol", at=at + timedelta(seconds=20))
        add("create", "namespaces", f"ns{k}", namespace=f"ns{k}", user="alice", at=at)
        add("delete", "namespaces", f"ns{k}", namespace=f"ns{k}", user="alice",
            at=at + timedelta(seconds=5))
        add("create", "namespaces", f"ns{k}", namespace="", user="alice",
            at=at + timedelta(seconds=7))
        add("create", "pods", user="alice", at=at + timedelta(seconds=9))  # no name
        add("delete", "services", f"svc{k}", user="alice", code=404, at=at)
        add("create", "services", f"svc{k}", user="alice", at=at + timedelta(seconds=1))
    # a deleted object's writes with bodies after its deletion (one empties its finalizers),
    # not before, not of its name in another namespace, not without a body
    emptied = {"metadata": {"finalizers": []}}
    add("patch", "configmaps", "fin", level="RequestResponse", at=timedelta(minutes=59))
    add("delete", "configmaps", "fin", user="ctrl", at=timedelta(minutes=60))
    add("patch", "configmaps", "fin", level="RequestResponse", requestObject=emptied,
        at=timedelta(minutes=60, seconds=5))
    add("patch", "configmaps", "fin", namespace="other", level="RequestResponse",
        requestObject=emptied, at=timedelta(minutes=61))
    add("update", "configmaps", "fin", at=timedelta(minutes=61, seconds=5))
    for k in range(20):
        add("list", "pods", user="controller", uri="/api/v1/pods" if k % 2 else
            "/api/v1/pods?resourceVersion=0", at=timedelta(minutes=k), took_ms=30)
    return events


@pytest.fixture
def indexed(incident, ingest_file, fixtures_dir, tmp_path):
    """An incident of the synthetic requests, two of the fixtures' audit logs and an Event
    list (no requests), with its column index built."""
    ingest_file(incident, write_log(tmp_path / "audit.log", synthetic()))
    for path in [fixtures_dir / "audit" / "audit2rbac-demo.log",
                 fixtures_dir / "audit" / "openshift-requestresponse.log",
                 fixtures_dir / "events" / "insights-openshift-machine-api.json"]:
        ingest_file(incident, path)
    assert Event.objects.filter(incident=incident).exclude(kind="audit").exists()
    assert columns.build(incident.pk, aggregate.data_version(incident.pk)) is not None
    requests = columnar.of_incident(incident.pk)
    assert requests is not None
    return incident, Event.objects.filter(incident=incident), requests


def test_the_coverage_is_counted_on_the_index_as_in_the_database(indexed):
    _, events, requests = indexed
    expected = sorted(insights.coverage_rows(events))
    assert len(expected) > 5
    assert sorted(insights.coverage_rows(events, requests)) == expected


def test_errors_per_minute_are_counted_on_the_index_as_in_the_database(indexed):
    _, events, requests = indexed
    rows, first, last = insights.error_minutes(events)
    assert {category for category, _, _ in rows} == {"conflict", "throttled", "server",
                                                    "client"}
    assert len({minute for _, minute, _ in rows}) > 2
    found, first_found, last_found = insights.error_minutes(events, requests)
    assert sorted(found) == sorted(rows)
    assert (first_found, last_found) == (first, last)
    bursts = find_bursts(rows, first, last)
    assert {burst["category"] for burst in bursts} >= {"conflict", "server"}
    expected = insights.burst_details(events, deepcopy(bursts))
    assert any(len(burst["users"]) > 1 for burst in expected)
    assert insights.burst_details(events, deepcopy(bursts), requests) == expected


def test_writes_per_writer_are_counted_on_the_index_as_in_the_database(indexed):
    _, events, requests = indexed
    per_writer = sorted(insights.writes_per_writer(events))
    assert ("deployments", "", "shop", "web", "argocd", 2) in per_writer  # a 409 among them
    assert sorted(columnar.writes_per_writer(requests)) == per_writer
    expected = insights.writer_rows(events)
    assert {(w["name"], w["username"]) for w in expected} >= {("web", "hpa"), ("web", "argocd")}
    assert insights.writer_rows(events, requests) == expected


def test_delete_groups_are_counted_on_the_index_as_in_the_database(indexed):
    _, events, requests = indexed
    expected = deletions.deletion_groups(events)
    cleaner = next(g for g in expected if g["username"] == "cleaner")
    assert cleaner["count"] == MAX_EVENTS + 30 and len(cleaner["deletes"]) == MAX_EVENTS
    assert GC not in {g["username"] for g in expected}
    assert deletions.deletion_groups(events, requests) == expected


def test_recreations_are_found_on_the_index_as_in_the_database(indexed):
    _, events, requests = indexed
    expected = deletions._recreations(events)
    names = {row["name"] for row in events.filter(pk__in=[i for _, i, _ in expected]).values()}
    assert {"cm0", "cm1", "cm2", "ns0", "ns1", "ns2"} <= names
    assert not {"svc0", "svc1", "svc2"} & names  # their deletes failed
    assert columnar.recreations(requests) == expected
    assert deletions.recreated_rows(events, requests) == deletions.recreated_rows(events)


def test_finalizer_writes_are_found_on_the_index_as_in_the_database(indexed):
    _, events, requests = indexed
    expected = deletions.finalizer_rows(events)
    assert [(w["namespace"], w["name"]) for w in expected] == [("shop", "fin")]
    assert deletions.finalizer_rows(events, requests) == expected
    first, _ = columnar.finalizer_candidates(requests, 1000, 1000)
    deleted = events.filter(verb="delete", code__gte=200, code__lt=300).exclude(name="")
    assert set(first) == set(deleted.values_list("resource", "namespace", "name"))


def test_the_insights_are_the_same_with_the_index_and_without(indexed):
    incident, _, _ = indexed
    without = insights.compute(incident.pk, index=False)
    kinds = {i["kind"] for i in without}
    assert {"deletion", "recreated-object", "error-burst", "conflicting-writers",
            "audit-coverage"} <= kinds
    assert insights.compute(incident.pk) == without


def test_an_incident_without_index_is_counted_in_the_database(incident, ingest_file, tmp_path):
    ingest_file(incident, write_log(tmp_path / "audit.log", synthetic()[:50]))
    assert columnar.of_incident(incident.pk) is None  # small: no index
    assert {i["kind"] for i in insights.compute(incident.pk)} >= {"error-burst"}


@pytest.mark.embedded
def test_the_insights_are_the_same_with_the_index_and_without_on_sqlite(indexed):
    incident, _, _ = indexed
    without = insights.compute(incident.pk, index=False)
    assert {"deletion", "recreated-object", "error-burst"} <= {i["kind"] for i in without}
    assert insights.compute(incident.pk) == without
