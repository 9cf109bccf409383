"""``timelines.parsers.events``: pure parsing of Kubernetes Event objects, no database.

Expected values are derived in the test from the input (the real fixture files and bundle
members read with the stdlib ``json`` module or PyYAML directly, or Events built here), never
copied from what the parser produced.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from timelines.parsers import MARKER, InputError, Redactor, Report, Row, events
from timelines.parsers.base import read_head

_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
EVENTS = _FIXTURES / "events"
BUNDLES = _FIXTURES / "bundles"
INSIGHTS = EVENTS / "insights-openshift-machine-api.json"
CRIBL = EVENTS / "cribl-event-watch-stream.json"
KSPAN = EVENTS / "kspan-deployment-2-pods.yaml"
NOT_EVENTS = sorted(
    [p for p in (_FIXTURES / "audit").rglob("*") if p.suffix in (".log", ".json")]
    + list((_FIXTURES / "wrapped").glob("*.json"))
    + list((_FIXTURES / "admission").glob("*"))
    + list((_FIXTURES / "gke").rglob("*.yaml"))
    + list((_FIXTURES / "klog").glob("*.txt")),
    key=str,
)
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


# --- helpers -----------------------------------------------------------------------------------

def parse(data: bytes, name: str = "events.json", **kwargs) -> tuple[list[Row], Report]:
    report = Report(name)
    rows = list(events.parse(io.BytesIO(data), report, **kwargs))
    return rows, report


def parse_file(path: Path, **kwargs) -> tuple[list[Row], Report]:
    report = Report(path.name)
    with open(path, "rb") as handle:
        rows = list(events.parse(handle, report, **kwargs))
    return rows, report


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def to_utc(value) -> datetime | None:
    """The test's own reading of a Kubernetes time: RFC 3339 string or YAML datetime."""
    if value in (None, ""):
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(
        value.replace("Z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def core_event(name: str = "web-1.17a0", uid: str | None = "uid-1", *, count: int = 1,
               first: datetime = T0, last: datetime | None = None, kind: str = "Pod",
               api_version: str = "v1", message: str = "Started container web",
               reason: str = "Started", rv: str = "100", **extra) -> dict:
    """A core/v1 Event as the apiserver returns it."""
    metadata = {"name": name, "namespace": "shop", "resourceVersion": rv,
                "creationTimestamp": stamp(first)}
    if uid is not None:
        metadata["uid"] = uid
    event = {
        "kind": "Event", "apiVersion": "v1", "metadata": metadata,
        "involvedObject": {"kind": kind, "namespace": "shop", "name": "web-1", "uid": "obj-1",
                           "apiVersion": api_version, "resourceVersion": "42"},
        "reason": reason, "message": message, "type": "Normal",
        "source": {"component": "kubelet", "host": "node-a"},
        "firstTimestamp": stamp(first), "lastTimestamp": stamp(last or first), "count": count,
    }
    event.update(extra)
    return event


def json_lines(*values) -> bytes:
    return b"".join(json.dumps(v).encode() + b"\n" for v in values)


def watch(kind: str, obj: dict) -> dict:
    return {"type": kind, "object": obj}


# --- the real fixtures ---------------------------------------------------------------------------

def test_insights_archive_gives_one_row_per_item_placed_at_its_last_timestamp():
    items = json.loads(INSIGHTS.read_text())["items"]
    rows, report = parse_file(INSIGHTS)
    assert len(rows) == len(items)
    assert len({row.audit_id for row in rows}) == len(items)  # no uid, no name: still distinct
    by_message = {row.message: row for row in rows}
    for item in items:
        row = by_message[item["message"]]
        assert row.kind == "event"
        assert row.reason == item["reason"]
        assert row.severity == item["type"]
        assert row.namespace == item["namespace"]
        assert row.received == row.completed == to_utc(item["lastTimestamp"])
        assert row.received.utcoffset() == timedelta(0)  # "+02:00" normalised to UTC
        assert row.count == 1
        assert row.source == INSIGHTS.name
        assert row.audit_id.startswith("event:")
    assert report.skipped == 0
    assert any("no first time" in note for note in report.notes)


def test_cribl_watch_stream_gives_one_row_per_event_uid_with_events_k8s_io_fields():
    records = json.loads(CRIBL.read_text())
    objects = {r["object"]["metadata"]["uid"]: r["object"] for r in records
               if r["type"] in ("ADDED", "MODIFIED", "DELETED")}
    rows, report = parse_file(CRIBL)
    assert len(rows) == len(objects)
    assert {row.audit_id for row in rows} == {f"event:{uid}" for uid in objects}
    plural = {"Pod": "pods", "Ingress": "ingresses"}
    for row in rows:
        obj = objects[row.audit_id.removeprefix("event:")]
        regarding = obj["regarding"]
        assert row.message == obj["note"]
        assert row.reason == obj["reason"]
        assert row.severity == obj["type"]
        assert row.component == obj["reportingController"]
        assert row.node == obj["deprecatedSource"].get("host", "")
        assert row.received == to_utc(obj["deprecatedFirstTimestamp"] or obj["eventTime"])
        series = obj.get("series") or {}
        last = obj.get("deprecatedLastTimestamp") or series.get("lastObservedTime")
        assert row.completed == (to_utc(last) if last else row.received)
        assert row.duration_ms == (row.completed - row.received).total_seconds() * 1000
        assert row.count == max(obj.get("deprecatedCount") or 1, series.get("count") or 1)
        assert row.resource == plural[regarding["kind"]]
        assert (row.namespace, row.name, row.object_uid) == (
            regarding["namespace"], regarding["name"], regarding["uid"])
        assert json.loads(row.raw) == obj  # the Event itself, not the shipper's envelope
    assert report.skipped == 0


def test_kspan_yaml_stream_keeps_the_events_and_counts_the_other_objects():
    documents = [d for d in yaml.safe_load_all(KSPAN.read_text()) if d]
    kinds = Counter(d["kind"] for d in documents)
    event_docs = {d["metadata"]["uid"]: d for d in documents if d["kind"] == "Event"}
    rows, report = parse_file(KSPAN)
    state = [row for row in rows if row.kind == "state"]
    rows = [row for row in rows if row.kind == "event"]
    assert len(rows) == len(event_docs) == kinds["Event"]
    # The other objects are state: one snapshot each (the stream repeats some of them).
    others = {d["metadata"]["uid"] for d in documents if d["kind"] != "Event"}
    assert {row.object_uid for row in state if row.reason == "Snapshot"} == others
    assert any(note.startswith(f"{len(others)} object snapshots")
               and all(f"{kind} ×" in note for kind in kinds if kind != "Event")
               for note in report.notes)
    lines = KSPAN.read_text().splitlines()
    for row in rows:
        doc = event_docs[row.audit_id.removeprefix("event:")]
        first = doc["firstTimestamp"] or doc["eventTime"] or doc["metadata"]["creationTimestamp"]
        assert row.received == to_utc(first)
        assert row.completed == to_utc(doc["lastTimestamp"] or first)
        assert row.reason == doc["reason"]
        assert row.annotations.get("fieldPath") == doc["involvedObject"].get("fieldPath")
        assert row.subresource == ""
        # row.line is where the Event's document starts: its own uid is in it, before any "---".
        document = []
        for text in lines[row.line - 1:]:
            if text.startswith("---"):
                break
            document.append(text)
        assert f"  uid: {doc['metadata']['uid']}" in document
    assert rows == sorted(rows, key=lambda r: (r.received, r.audit_id))  # time order


@pytest.mark.parametrize("path", [INSIGHTS, CRIBL, KSPAN], ids=lambda p: p.name)
def test_sniff_recognises_the_event_fixtures(path):
    assert events.sniff(read_head(path), path.name)


@pytest.mark.parametrize("path", [CRIBL, KSPAN], ids=lambda p: p.name)
def test_sniff_recognises_a_head_cut_mid_document(path):
    assert events.sniff(path.read_bytes()[:3000], path.name)


@pytest.mark.parametrize("path", NOT_EVENTS, ids=lambda p: str(p.relative_to(_FIXTURES)))
def test_sniff_rejects_audit_logs_and_other_evidence(path):
    assert not events.sniff(read_head(path), path.name)


def test_sniff_rejects_an_audit_event_that_carries_an_event_object():
    audit = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "auditID": "a-1",
             "stage": "ResponseComplete", "verb": "create",
             "objectRef": {"resource": "events", "namespace": "shop"},
             "requestObject": core_event()}
    assert not events.sniff(json.dumps(audit).encode(), "audit.log")


@pytest.mark.parametrize("encode", [
    lambda obj: json.dumps(obj, indent=2).encode(),
    lambda obj: yaml.safe_dump(obj).encode(),
], ids=["json", "yaml"])
def test_sniff_rejects_an_apirequestcount_named_events_v1(encode):
    look_alike = {
        "apiVersion": "apiserver.openshift.io/v1", "kind": "APIRequestCount",
        "metadata": {"name": "events.v1", "uid": "096f128f"},
        "spec": {"numberOfUsersToReport": 10},
        "status": {"removedInRelease": "", "requestCount": 1411, "currentHour": {
            "byNode": [{"nodeName": "10.0.0.1", "requestCount": 3, "byUser": [{
                "username": "system:serviceaccount:openshift-infra:unidling-controller",
                "userAgent": "openshift-controller-manager/v0.0.0", "requestCount": 3,
                "byVerb": [{"verb": "watch", "requestCount": 3}]}]}]}},
    }
    assert not events.sniff(encode(look_alike), "events.v1.yaml")
    # An object, not an Event; without any time (nor a capture time) it has no place.
    with pytest.raises(InputError, match="no time and no capture time: APIRequestCount"):
        parse(encode(look_alike), "events.v1.yaml")


# --- bundles -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def must_gather(tmp_path_factory) -> dict[str, Path]:
    """The must-gather's per-namespace events.yaml (and its APIRequestCount look-alikes),
    extracted: {namespace or file name: path}."""
    out = tmp_path_factory.mktemp("must-gather")
    found = {}
    with tarfile.open(BUNDLES / "openshift-must-gather-aws.tar.xz", "r:xz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and member.name.endswith("/core/events.yaml"):
                key = parts[-3]
            elif member.isfile() and "/apirequestcounts/events.v1" in member.name:
                key = parts[-1]
            else:
                continue
            data = tar.extractfile(member).read()
            if data[:2] == b"\x1f\x8b":  # none were gzipped when this was written
                data = gzip.decompress(data)
            path = out / f"{key}.yaml"
            path.write_bytes(data)
            found[key] = path
    return found


def test_must_gather_events_yaml_give_one_row_per_event(must_gather):
    namespaces = {k: p for k, p in must_gather.items() if not k.startswith("events.v1")}
    assert len(namespaces) > 40
    total = 0
    for namespace, path in sorted(namespaces.items()):
        items = yaml.load(path.read_bytes(), Loader=yaml.CSafeLoader)["items"] or []
        assert events.sniff(read_head(path), path.name), namespace
        rows, report = parse_file(path)
        expected = {f"event:{item['metadata']['uid']}": item for item in items}
        assert len(rows) == len(expected), namespace
        assert report.skipped == 0, report.errors
        for row in rows:
            item = expected[row.audit_id]
            first = (item.get("firstTimestamp") or item.get("eventTime")
                     or item["metadata"]["creationTimestamp"])
            lasts = [to_utc(t) for t in (item.get("lastTimestamp"),
                                         (item.get("series") or {}).get("lastObservedTime"))
                     if t]
            assert row.received == to_utc(first)
            assert row.completed == max([row.received, *lasts])
            assert row.count == max(item.get("count") or 1,
                                    (item.get("series") or {}).get("count") or 1)
            assert row.message == (item.get("message") or "")
            assert row.name == (item["involvedObject"].get("name") or "")
            assert row.annotations.get("fieldPath") == item["involvedObject"].get("fieldPath")
        total += len(rows)
    # Every Event of every namespace, counted independently.
    assert total == sum(
        len(yaml.load(p.read_bytes(), Loader=yaml.CSafeLoader)["items"] or [])
        for p in namespaces.values())


def test_big_yaml_list_read_item_by_item_gives_the_same_rows(must_gather, monkeypatch):
    path = must_gather["openshift-kube-apiserver-operator"]
    whole, _ = parse_file(path)
    monkeypatch.setattr(events.documents, "BIG_YAML_DOCUMENT", 1024)
    itemwise, report = parse_file(path)
    assert itemwise == whole
    assert report.skipped == 0
    # The line of each row is where its item starts ("- apiVersion: v1").
    lines = path.read_text().splitlines()
    assert all(lines[row.line - 1].startswith("- ") for row in itemwise)


def test_must_gather_apirequestcounts_for_events_are_not_events(must_gather):
    look_alikes = [p for k, p in must_gather.items() if k.startswith("events.v1")]
    assert look_alikes
    for path in look_alikes:
        assert not events.sniff(read_head(path), path.name)
        rows, _ = parse_file(path)
        assert rows and {row.kind for row in rows} == {"state"}
        assert {row.resource for row in rows} == {"apirequestcounts"}


def test_must_gather_events_read_the_same_gzipped(must_gather):
    path = must_gather["openshift-etcd"]
    plain, _ = parse_file(path)
    zipped, _ = parse(gzip.compress(path.read_bytes()), path.name)
    assert [r._replace(raw=b"") for r in zipped] == [r._replace(raw=b"") for r in plain]


@pytest.fixture(scope="module")
def troubleshoot(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("troubleshoot")
    found = {}
    with tarfile.open(BUNDLES / "troubleshoot-supportbundle-baseline.tar.gz", "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and (("/cluster-resources/events/" in member.name)
                                    or member.name.endswith("-events.json")):
                path = out / member.name.replace("/", "__")
                path.write_bytes(tar.extractfile(member).read())
                found[member.name.split("/", 1)[1]] = path
    return found


def test_troubleshoot_bundle_event_lists_give_one_row_per_event(troubleshoot):
    non_empty = 0
    for member, path in sorted(troubleshoot.items()):
        items = json.loads(path.read_text()).get("items") or []
        assert events.sniff(read_head(path), path.name), member
        if not items:  # an empty list is evidence of nothing: no rows, no failure
            rows, report = parse_file(path)
            assert rows == [] and "the list is empty" in report.notes
            continue
        non_empty += 1
        rows, report = parse_file(path)
        assert {row.audit_id for row in rows} == {f"event:{i['metadata']['uid']}" for i in items}
        assert report.skipped == 0
        for row in rows:
            item = next(i for i in items if f"event:{i['metadata']['uid']}" == row.audit_id)
            assert row.received == to_utc(item.get("firstTimestamp") or item.get("eventTime"))
            assert row.node == (item.get("source") or {}).get("host", "")
    assert non_empty >= 3  # default, kube-system and the run-*-events.json lists


def test_kindless_items_of_a_raw_api_list_are_events(troubleshoot):
    path = troubleshoot["run-example/run-example-events.json"]
    document = json.loads(path.read_text())
    assert "kind" not in document and all("kind" not in i for i in document["items"])
    rows, _ = parse_file(path)
    assert len(rows) == len(document["items"])


def test_sonobuoy_bundle_event_arrays_give_one_row_per_event(tmp_path):
    checked = 0
    with tarfile.open(BUNDLES / "sonobuoy-results-0.10.tar.gz", "r:gz") as tar:
        for member in tar.getmembers():
            if not (member.isfile() and member.name.endswith("/Events.json")):
                continue
            path = tmp_path / member.name.replace("/", "__")
            path.write_bytes(tar.extractfile(member).read())
            items = json.loads(path.read_text())  # a bare array of kind-less Events
            assert events.sniff(read_head(path), path.name)
            rows, report = parse_file(path)
            assert {r.audit_id for r in rows} == {f"event:{i['metadata']['uid']}" for i in items}
            assert report.skipped == 0
            checked += 1
    assert checked >= 3


# --- collapsing and identity ---------------------------------------------------------------------

def test_watch_stream_collapses_sightings_to_the_latest():
    t_last = T0 + timedelta(minutes=2)
    data = json_lines(
        watch("ADDED", core_event(count=1, rv="100")),
        watch("MODIFIED", core_event(count=3, last=t_last, rv="130")),
        watch("MODIFIED", core_event(count=2, last=T0 + timedelta(minutes=1), rv="120")),  # late
    )
    rows, report = parse(data)
    assert len(rows) == 1
    row = rows[0]
    assert row.audit_id == "event:uid-1"
    assert (row.count, row.received, row.completed) == (3, T0, t_last)
    assert row.duration_ms == 120_000
    assert row.line == 2  # the JSON line of the kept sighting
    assert json.loads(row.raw)["count"] == 3
    assert any("2 repeated sightings" in note for note in report.notes)


def test_same_event_in_two_yaml_lists_is_one_row_with_the_higher_count():
    later = core_event(count=7, last=T0 + timedelta(hours=1), rv="300")
    earlier = core_event(count=4, last=T0 + timedelta(minutes=30), rv="200")
    data = yaml.safe_dump_all([{"kind": "EventList", "apiVersion": "v1", "items": [later]},
                               {"kind": "EventList", "apiVersion": "v1", "items": [earlier]}])
    rows, _ = parse(data.encode(), "events.yaml")
    assert [(r.count, r.completed) for r in rows] == [(7, T0 + timedelta(hours=1))]


def test_event_without_uid_is_keyed_by_namespace_and_name():
    rows, _ = parse(json.dumps(core_event(name="web-1.abc", uid=None)).encode())
    assert rows[0].audit_id == "event:shop/web-1.abc"


def test_same_identity_gives_the_same_key_and_time_on_reingest():
    data = json.dumps(core_event()).encode()
    first, _ = parse(data)
    again, _ = parse(data)
    assert [(r.audit_id, r.received) for r in first] == [(r.audit_id, r.received) for r in again]


# --- fields ------------------------------------------------------------------------------------

def test_core_event_is_a_span_from_first_to_last_time_in_utc():
    event = core_event(count=12)
    event["firstTimestamp"] = "2024-05-01T14:00:00+02:00"
    event["lastTimestamp"] = "2024-05-01T12:05:30.123456789Z"  # nanoseconds are truncated
    rows, _ = parse(json.dumps(event).encode())
    row = rows[0]
    assert row.received == T0
    assert row.completed == T0 + timedelta(minutes=5, seconds=30, microseconds=123456)
    assert row.duration_ms == pytest.approx(330_123.456)
    assert row.count == 12
    assert (row.component, row.node, row.severity) == ("kubelet", "node-a", "Normal")
    assert (row.resource, row.namespace, row.name, row.object_uid, row.resource_version) == (
        "pods", "shop", "web-1", "obj-1", "42")
    assert (row.api_group, row.api_version) == ("", "v1")
    assert (row.verb, row.code, row.username) == ("", None, "")


def test_yaml_timestamps_unquoted_become_aware_utc_datetimes():
    text = (
        "apiVersion: v1\nkind: Event\n"
        "metadata: {name: a.1, namespace: shop, uid: u-yaml}\n"
        "involvedObject: {kind: Node, name: node-a}\n"
        "reason: NodeReady\nmessage: ready\ntype: Normal\ncount: 2\n"
        "firstTimestamp: 2024-05-01T12:00:00Z\n"
        "lastTimestamp: 2024-05-01 13:00:00\n"  # no zone: UTC
    )
    rows, _ = parse(text.encode(), "event.yaml")
    assert rows[0].received == T0
    assert rows[0].completed == T0 + timedelta(hours=1)
    assert rows[0].received.tzinfo is not None
    # Cluster-scoped object: no namespace on the row though the Event lives in "shop".
    assert (rows[0].resource, rows[0].namespace, rows[0].name) == ("nodes", "", "node-a")
    assert json.loads(rows[0].raw)["firstTimestamp"] == "2024-05-01T12:00:00Z"


def test_events_k8s_io_v1_fields_map_like_core_ones():
    event = {
        "kind": "Event", "apiVersion": "events.k8s.io/v1",
        "metadata": {"name": "web.18a", "namespace": "shop", "uid": "u-new",
                     "resourceVersion": "9", "creationTimestamp": stamp(T0)},
        "eventTime": "2024-05-01T12:00:00.250000Z",
        "series": {"count": 5, "lastObservedTime": "2024-05-01T12:10:00.000000Z"},
        "reportingController": "deployment-controller", "reportingInstance": "kcm-1",
        "action": "Scaling", "reason": "ScalingReplicaSet", "type": "Warning",
        "note": "Scaled up replica set web-7d9 to 3",
        "regarding": {"kind": "Deployment", "namespace": "shop", "name": "web",
                      "uid": "dep-1", "apiVersion": "apps/v1", "resourceVersion": "77"},
        "deprecatedSource": {"host": "node-b"},
    }
    rows, _ = parse(json.dumps(event).encode())
    row = rows[0]
    assert row.received == T0 + timedelta(milliseconds=250)
    assert row.completed == T0 + timedelta(minutes=10)
    assert row.count == 5
    assert row.message == event["note"]
    assert (row.reason, row.severity) == ("ScalingReplicaSet", "Warning")
    assert (row.component, row.node) == ("deployment-controller", "node-b")
    assert (row.resource, row.api_group, row.api_version) == ("deployments", "apps", "v1")
    assert (row.name, row.object_uid, row.resource_version) == ("web", "dep-1", "77")
    assert row.annotations == {"action": "Scaling"}


def test_field_path_is_an_annotation_not_a_subresource():
    event = core_event()
    event["involvedObject"]["fieldPath"] = "spec.containers{web}"
    rows, _ = parse(json.dumps(event).encode())
    assert rows[0].subresource == ""
    assert rows[0].annotations == {"fieldPath": "spec.containers{web}"}


@pytest.mark.parametrize(("kind", "resource"), [
    ("Pod", "pods"), ("Node", "nodes"), ("Deployment", "deployments"),
    ("ReplicaSet", "replicasets"), ("Ingress", "ingresses"), ("Endpoints", "endpoints"),
    ("NetworkPolicy", "networkpolicies"), ("StorageClass", "storageclasses"),
    ("PodSecurityPolicy", "podsecuritypolicies"), ("deployment", "deployments"),
    ("Gateway", "gateways"), ("ComponentStatus", "componentstatuses"), ("DNS", "dnses"),
    ("Proxy", "proxies"), ("Mesh", "meshes"), ("Patch", "patches"), ("Box", "boxes"),
    ("SecurityContextConstraints", "securitycontextconstraints"),
    ("HorizontalPodAutoscaler", "horizontalpodautoscalers"), ("", ""),
])
def test_involved_kind_becomes_the_plural_resource_name(kind, resource):
    rows, _ = parse(json.dumps(core_event(kind=kind)).encode())
    assert rows[0].resource == resource


# --- input shapes ------------------------------------------------------------------------------

def test_pretty_printed_watch_array_and_concatenated_documents_are_read():
    first, second = core_event(uid="u-1"), core_event(name="b.2", uid="u-2", reason="Pulled")
    array = json.dumps([watch("ADDED", first), watch("ADDED", second)], indent=2).encode()
    rows, _ = parse(array)
    assert {r.audit_id for r in rows} == {"event:u-1", "event:u-2"}
    # kubectl get events -w -o json: one pretty document after another.
    stream = json.dumps(first, indent=4).encode() + b"\n" + json.dumps(second, indent=4).encode()
    rows, _ = parse(stream)
    assert {(r.audit_id, r.line) for r in rows} == {
        ("event:u-1", 1), ("event:u-2", json.dumps(first, indent=4).count("\n") + 2)}


def test_pretty_document_cut_short_costs_only_itself():
    first = json.dumps(core_event(uid="u-1"), indent=4)
    second = json.dumps(core_event(name="b.2", uid="u-2"), indent=4)
    cut = first[: first.index('"reason"')]
    rows, report = parse(f"{cut}\n{second}\n".encode())
    assert [(r.audit_id, r.line) for r in rows] == [("event:u-2", cut.count("\n") + 2)]
    assert report.skipped == 1


def test_events_without_identity_are_told_apart_by_content():
    def bare(message: str, at: datetime) -> dict:
        return {"namespace": "ops", "reason": "FailedUpdate", "message": message,
                "type": "Warning", "lastTimestamp": stamp(at)}

    data = json.dumps({"items": [bare("machine a failed", T0), bare("machine b failed", T0),
                                 bare("machine a failed", T0)]}).encode()
    rows, report = parse(data)
    assert len(rows) == 2  # the repeated item is the same Event
    assert all(r.audit_id.startswith("event:ops/") for r in rows)
    assert "2 Events have neither uid nor name: identified by a hash of their content" in (
        report.notes)


def test_unindented_json_document_is_read_whole():
    data = json.dumps({"kind": "List", "apiVersion": "v1", "items": [core_event()]},
                      indent=0).encode()
    rows, report = parse(data)
    assert [r.audit_id for r in rows] == ["event:uid-1"]
    assert report.skipped == 0
    # Unindented documents one after another: their brackets tell where each ends.
    second = core_event(name="b.2", uid="u-2")
    data += b"\n" + json.dumps({"kind": "List", "items": [second]}, indent=0).encode()
    rows, report = parse(data)
    assert {r.audit_id for r in rows} == {"event:uid-1", "event:u-2"}
    assert report.skipped == 0


def test_watch_bookmarks_and_errors_are_noted_not_rows():
    data = json_lines(
        watch("ADDED", core_event()),
        {"type": "BOOKMARK", "object": {"kind": "Event", "metadata": {"resourceVersion": "5"}}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                     "message": "too old resource version: 5 (90)"}},
    )
    rows, report = parse(data)
    assert len(rows) == 1
    assert any("line 3" in n and "too old resource version" in n for n in report.notes)
    assert report.skipped == 0


# --- bad input ---------------------------------------------------------------------------------

def test_malformed_yaml_document_is_skipped_with_its_line_and_the_rest_kept():
    good1 = yaml.safe_dump(core_event(uid="u-1"))
    good2 = yaml.safe_dump(core_event(name="b.2", uid="u-2"))
    bad = "kind: Event\nmessage: \"never closed\nreason: [oops\n"
    text = f"---\n{good1}---\n{bad}---\n{good2}"
    bad_first_line = f"---\n{good1}---\n".count("\n") + 1
    rows, report = parse(text.encode(), "stream.yaml")
    assert {r.audit_id for r in rows} == {"event:u-1", "event:u-2"}
    assert report.skipped == 1
    source, line, reason = report.errors[0].split(":", 2)
    assert source == "stream.yaml"
    assert bad_first_line <= int(line) < bad_first_line + 3
    assert "malformed YAML" in reason


def test_malformed_json_line_is_skipped_with_its_line_and_the_rest_kept():
    lines = json_lines(watch("ADDED", core_event(uid="u-1"))).decode()
    lines += '{"type": "ADDED", "object": {"kind": "Event", "metad\n'  # cut off
    lines += json_lines(watch("ADDED", core_event(name="b.2", uid="u-2"))).decode()
    rows, report = parse(lines.encode())
    assert {(r.audit_id, r.line) for r in rows} == {("event:u-1", 1), ("event:u-2", 3)}
    assert report.errors == [report.errors[0]] and report.errors[0].startswith("events.json:2:")


def test_malformed_item_in_a_pretty_event_list_costs_only_that_item():
    items = [core_event(name=f"e.{i}", uid=f"u-{i}") for i in range(3)]
    text = json.dumps({"kind": "EventList", "apiVersion": "v1", "items": items}, indent=4)
    broken = text.replace('"name": "e.1"', '"name": "e.1" "oops"', 1)
    rows, report = parse(broken.encode())
    assert {r.audit_id for r in rows} == {"event:u-0", "event:u-2"}
    bad_line = broken.splitlines().index(next(
        line for line in broken.splitlines() if '"oops"' in line)) + 1
    assert report.errors == [f"events.json:{bad_line}: list item: " + report.errors[0].split(
        ": list item: ", 1)[1]]


def test_truncated_event_list_keeps_the_items_before_the_cut():
    items = [core_event(name=f"e.{i}", uid=f"u-{i}") for i in range(4)]
    text = json.dumps({"kind": "EventList", "apiVersion": "v1", "items": items}, indent=4)
    cut = text[: text.index('"u-3"')]
    rows, report = parse(gzip.compress(cut.encode()))
    assert {r.audit_id for r in rows} == {"event:u-0", "event:u-1", "event:u-2"}
    assert report.skipped == 1


def test_malformed_item_in_a_yaml_event_list_costs_only_that_item():
    items = [core_event(name=f"e.{i}", uid=f"u-{i}") for i in range(3)]
    text = yaml.safe_dump({"kind": "EventList", "apiVersion": "v1", "items": items})
    broken = text.replace("name: e.1\n", "name: 'e.1\n", 1)
    rows, report = parse(broken.encode(), "events.yaml")
    assert {r.audit_id for r in rows} == {"event:u-0", "event:u-2"}
    assert report.skipped == 1 and ": list item: malformed YAML" in report.errors[0]


def test_event_without_any_time_is_skipped_with_a_reason():
    timeless = core_event(name="t.1", uid="u-t", firstTimestamp=None, lastTimestamp=None)
    del timeless["metadata"]["creationTimestamp"]
    rows, report = parse(json_lines(timeless, core_event()))
    assert [r.audit_id for r in rows] == ["event:uid-1"]
    assert report.errors == ["events.json:1: Event without a usable time (no firstTimestamp, "
                             "eventTime, lastTimestamp, series or creationTimestamp)"]


def test_event_with_a_malformed_field_is_skipped_and_the_rest_kept():
    bad = core_event(name="b.1", uid="u-b", involvedObject="pods/web-1")
    rows, report = parse(json_lines(bad, core_event()))
    assert [r.audit_id for r in rows] == ["event:uid-1"]
    assert report.errors[0].startswith("events.json:1: Event with a malformed field")


def test_file_without_events_raises_input_error_naming_the_file():
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}
    with pytest.raises(InputError, match=r"^objects\.yaml: no Kubernetes Events found.*Deployment"):
        parse(yaml.safe_dump(deployment).encode(), "objects.yaml")
    rows, report = parse(b'{"kind": "EventList", "apiVersion": "v1", "items": []}', "empty.json")
    assert rows == [] and report.notes == ["the list is empty"]  # evidence, not a failure
    with pytest.raises(InputError, match=r"^blank\.yaml: no Kubernetes Events found"):
        parse(b"\n\n", "blank.yaml")


def test_audit_log_is_not_read_as_events():
    path = _FIXTURES / "audit" / "audit2rbac-demo.log"
    with pytest.raises(InputError, match="audit2rbac-demo.log: no Kubernetes Events found"):
        parse_file(path)


def test_document_over_the_size_cap_raises_input_error(monkeypatch):
    monkeypatch.setattr(events.documents, "MAX_DOCUMENT_BYTES", 2048)
    big = [core_event(name=f"e.{i}", uid=f"u-{i}") for i in range(20)]
    with pytest.raises(InputError, match="over 2048 bytes"):
        parse(json.dumps({"kind": "EventList", "items": big}, indent=2).encode())
    with pytest.raises(InputError, match="over 2048 bytes"):
        parse(yaml.safe_dump({"kind": "EventList", "items": big}).encode(), "big.yaml")


# --- redaction, progress, registry ---------------------------------------------------------------

def test_bearer_token_and_jwt_in_a_message_are_redacted():
    token = "s3cr3tT0kenValue0123456789"
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl"
    message = f"probe failed: curl -H 'Authorization: Bearer {token}' (kubeconfig token {jwt})"
    data = json_lines(watch("ADDED", core_event(message=message)),
                      watch("MODIFIED", core_event(message=message, count=2)))
    rows, report = parse(data)
    assert len(rows) == 1
    assert token not in rows[0].message and jwt not in rows[0].message
    assert f"Bearer {MARKER}" in rows[0].message
    assert token.encode() not in rows[0].raw and jwt.encode() not in rows[0].raw
    assert report.redacted == 2  # once per kept Event, not per sighting

    rows, report = parse(data, redactor=Redactor(enabled=False))
    assert token in rows[0].message and report.redacted == 0


def test_progress_reports_bytes_read_and_events():
    data = json_lines(*(core_event(name=f"e.{i}", uid=f"u-{i}") for i in range(5000)))
    calls = []
    rows, _ = parse(data, progress=lambda done, rows: calls.append((done, rows)))
    assert len(rows) == 5000
    assert calls[-1] == (len(data), 5000)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_format_is_named_and_wired():
    assert events.FORMAT.name == "k8s-events"
    assert events.FORMAT.sniff is events.sniff and events.FORMAT.parse is events.parse
