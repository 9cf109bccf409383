"""Audit events in other envelopes (``timelines.parsers.envelopes``, ``gke``, ``legacy``): pure
parsing, no database.

Expected values are derived in the test from the input (the real fixture files read with the
stdlib ``json`` module or PyYAML, or envelopes built here around the real native events of
``audit/audit2rbac-demo.log``), never copied from what the parsers produced. Where a request can
also be read natively, the native parser is the reference: the same request through an envelope
must give the same ``(audit_id, received)`` (and for native events inside an envelope the same
row and ``raw``), so that the store merges the two into one row.
"""

from __future__ import annotations

import base64
import copy
import gzip
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from timelines.parsers import InputError, Redactor, Report, parse_audit
from timelines.parsers import audit as native_audit
from timelines.parsers.base import read_head
from timelines.parsers.envelopes import (
    AKS_FORMAT,
    EKS_FORMAT,
    FORMATS,
    GKE_FORMAT,
    LEGACY_FORMAT,
    OTLP_FORMAT,
)
from timelines.parsers.redact import MARKER

_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
DEMO = _FIXTURES / "audit" / "audit2rbac-demo.log"
GKE_K8S = sorted(p.name for p in (_FIXTURES / "gke" / "k8s_audit").glob("*.yaml")
                 if not p.name.endswith("_manifest.yaml"))
GKE_MANIFESTS = sorted(p.name for p in (_FIXTURES / "gke" / "k8s_audit").glob("*_manifest.yaml"))
GKE_OPERATIONS = sorted(p.name for p in (_FIXTURES / "gke" / "gke_audit").glob("*.yaml"))
GKE_NODE = sorted(p.name for p in (_FIXTURES / "gke" / "k8s_node").glob("*.yaml"))
OTLP_FIXTURES = ["otlp-audit-kube.json", "otlp-audit-openshift.json"]
GRPC_TO_HTTP = {0: 200, 3: 400, 5: 404, 6: 409, 7: 403, 16: 401, 13: 500, 14: 503, 4: 504,
                8: 429, 9: 400, 10: 409, 11: 400, 12: 501, 1: 499, 2: 500, 15: 500}


# --- helpers -----------------------------------------------------------------------------------

def run(fmt, data: bytes, name: str = "input") -> tuple[list, Report]:
    report = Report(name)
    rows = list(fmt.parse(io.BytesIO(data), report))
    return rows, report


def run_native(data: bytes, name: str = "input") -> tuple[list, Report]:
    report = Report(name)
    return list(parse_audit(io.BytesIO(data), report)), report


def parse_time(text: str) -> datetime:
    """RFC 3339 with up to nanoseconds (microseconds kept), as an aware datetime."""
    text = text.replace("Z", "+00:00")
    if "." in text:
        head, _, tail = text.partition(".")
        digits = len(tail) - len(tail.lstrip("0123456789"))
        text = f"{head}.{tail[:min(digits, 6)]}{tail[digits:]}"
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def identities(rows) -> list[tuple[str, datetime]]:
    return sorted((r.audit_id, r.received) for r in rows)


def comparable(rows) -> list:
    """Rows without where they came from, in a stable order."""
    return sorted((r._replace(source="", line=0) for r in rows), key=lambda r: (r.audit_id,
                                                                                 r.received))


def demo_lines() -> list[str]:
    return [line.strip() for line in DEMO.read_text().splitlines() if line.strip()]


def demo_events() -> list[dict]:
    return [json.loads(line) for line in demo_lines()]


def first_content_line(text: str) -> int:
    """The line of a YAML file where its document starts (after the licence comment)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            return number
    raise AssertionError("no content")


def gke_entry(name: str, folder: str = "k8s_audit") -> dict:
    return yaml.safe_load((_FIXTURES / "gke" / folder / name).read_text())


def target_of_resource_name(resource_name: str) -> dict:
    """group/version/namespace/resource/name/subresource of a GKE Kubernetes resourceName,
    derived here for the shapes in the fixtures and tests."""
    group, version, *rest = resource_name.split("/")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
    return {"api_group": "" if group == "core" else group, "api_version": version,
            "namespace": namespace, "resource": rest[0],
            "name": rest[1] if len(rest) > 1 else "", "subresource": rest[2] if len(rest) > 2
            else ""}


# --- sniffing: each format claims its own files only -------------------------------------------

def _claimed_by(relative: str) -> set[str]:
    """Which envelope format each real fixture belongs to (none for the others)."""
    if relative.startswith("gke/gke_audit/") or relative == "gke/oss/test-log.yaml":
        return {"gke-audit"}
    if relative.startswith("gke/k8s_audit/") and not relative.endswith("_manifest.yaml"):
        return {"gke-audit"}
    if relative == "wrapped/aks-eventhub-record.json":
        return {"aks-diagnostics"}
    if relative.startswith("wrapped/otlp-"):
        return {"otlp-audit"}
    return set()


ALL_FIXTURES = sorted(str(p.relative_to(_FIXTURES)) for p in _FIXTURES.rglob("*")
                      if p.is_file() and p.suffix in (".log", ".json", ".yaml", ".txt"))


@pytest.mark.parametrize("relative", ALL_FIXTURES)
def test_only_the_envelope_a_fixture_is_in_claims_it(relative):
    head = read_head(_FIXTURES / relative)
    claimed = {fmt.name for fmt in FORMATS if fmt.sniff(head, relative)}
    assert claimed == _claimed_by(relative)


def test_the_native_audit_and_event_fixtures_are_claimed_by_no_envelope():
    # The parametrized test covers them file by file; this guards the list itself.
    folders = {Path(r).parts[0] for r in ALL_FIXTURES}
    assert {"audit", "events", "klog", "gke", "wrapped"} <= folders


def test_formats_are_listed_with_their_names():
    assert [f.name for f in FORMATS] == ["gke-audit", "eks-cloudwatch", "aks-diagnostics",
                                         "otlp-audit", "legacy-audit"]


def test_synthetic_eks_and_legacy_files_are_claimed_by_their_own_format_only():
    samples = {
        "eks-cloudwatch": [eks_page(demo_lines()), subscription_payload(demo_lines()),
                           base64_gzip(subscription_payload(demo_lines()))],
        "legacy-audit": [LEGACY_PAIR],
    }
    for name, files in samples.items():
        for data in files:
            assert {f.name for f in FORMATS if f.sniff(data[:65536], "x")} == {name}
            assert not native_audit.sniff(data[:65536], "x")


# --- GKE: Kubernetes requests ------------------------------------------------------------------

@pytest.mark.parametrize("name", GKE_K8S)
def test_each_gke_kubernetes_entry_is_one_row_with_the_fields_of_its_entry(name):
    path = _FIXTURES / "gke" / "k8s_audit" / name
    entry = gke_entry(name)
    payload = entry["protoPayload"]
    rows, report = run(GKE_FORMAT, path.read_bytes(), name)

    assert len(rows) == 1
    row = rows[0]
    received = parse_time(entry["timestamp"])
    assert (row.audit_id, row.received) == (entry["operation"]["id"], received)
    assert row.kind == "audit"
    assert row.completed == received and row.duration_ms is None
    assert row.verb == payload["methodName"].rsplit(".", 1)[1]
    assert row.username == payload["authenticationInfo"]["principalEmail"]
    assert row.source_ip == payload["requestMetadata"]["callerIp"]
    assert row.user_agent == payload["requestMetadata"]["callerSuppliedUserAgent"]
    target = target_of_resource_name(payload["resourceName"])
    assert {k: getattr(row, k) for k in target} == target
    assert row.code == GRPC_TO_HTTP[payload["status"]["code"]]
    assert row.annotations["grpc.code"] == str(payload["status"]["code"])
    for key, value in entry["labels"].items():
        assert row.annotations[key] == value
    assert row.stage == "ResponseComplete"
    assert row.source == name
    assert row.line == first_content_line(path.read_text())
    assert json.loads(row.raw) == entry
    assert "no latency in a Google Cloud Logging export" in report.notes
    assert report.skipped == 0


@pytest.mark.parametrize("name", GKE_MANIFESTS)
def test_the_pod_manifests_beside_the_gke_entries_are_not_audit_entries(name):
    path = _FIXTURES / "gke" / "k8s_audit" / name
    assert not GKE_FORMAT.sniff(path.read_bytes()[:65536], name)
    with pytest.raises(InputError, match=name):
        run(GKE_FORMAT, path.read_bytes(), name)


@pytest.mark.parametrize("name", GKE_NODE)
def test_gke_node_logs_are_not_audit_entries(name):
    path = _FIXTURES / "gke" / "k8s_node" / name
    assert not GKE_FORMAT.sniff(path.read_bytes()[:65536], name)
    with pytest.raises(InputError, match=name):
        run(GKE_FORMAT, path.read_bytes(), name)


def all_gke_k8s_entries() -> list[dict]:
    return [gke_entry(name) for name in GKE_K8S]


@pytest.mark.parametrize("shape", ["json-array", "json-lines", "entries-list", "yaml-multi-doc",
                                   "gzip-json-array"])
def test_gke_exports_in_every_shape_give_the_same_rows(shape):
    entries = all_gke_k8s_entries()
    if shape == "json-array":  # gcloud logging read --format=json
        data = json.dumps(entries, indent=2).encode()
    elif shape == "json-lines":
        data = b"".join(json.dumps(e).encode() + b"\n" for e in entries)
    elif shape == "entries-list":
        data = json.dumps({"entries": entries, "nextPageToken": "x"}).encode()
    elif shape == "yaml-multi-doc":
        data = yaml.safe_dump_all(entries).encode()
    else:
        data = gzip.compress(json.dumps(entries, indent=2).encode())
    rows, report = run(GKE_FORMAT, data)
    expected = sorted((e["operation"]["id"], parse_time(e["timestamp"])) for e in entries)
    assert identities(rows) == expected
    reference, _ = run(GKE_FORMAT, yaml.safe_dump_all(entries).encode())
    assert [r._replace(line=0, raw=b"") for r in comparable(rows)] == \
        [r._replace(line=0, raw=b"") for r in comparable(reference)]
    assert sorted(json.loads(r.raw)["insertId"] for r in rows) == \
        sorted(e["insertId"] for e in entries)
    assert report.skipped == 0


def test_rows_of_json_lines_and_yaml_documents_carry_the_line_where_their_entry_starts():
    entries = all_gke_k8s_entries()
    jsonl = b"\n" + b"".join(json.dumps(e).encode() + b"\n" for e in entries)
    rows, _ = run(GKE_FORMAT, jsonl)
    assert sorted(r.line for r in rows) == [2, 3, 4]
    docs = yaml.safe_dump_all(entries, explicit_start=True)
    starts = [n for n, line in enumerate(docs.splitlines(), start=1) if line == "---"]
    rows, _ = run(GKE_FORMAT, docs.encode())
    assert sorted(r.line for r in rows) == [s + 1 for s in starts]


@pytest.mark.parametrize(("grpc", "http"), sorted(GRPC_TO_HTTP.items()))
def test_grpc_status_codes_map_to_the_http_code_and_stay_in_the_annotations(grpc, http):
    entry = gke_entry(GKE_K8S[0])
    entry["protoPayload"]["status"] = {"code": grpc, "message": f"status {grpc}"}
    rows, _ = run(GKE_FORMAT, json.dumps(entry).encode())
    assert rows[0].code == http
    assert rows[0].annotations["grpc.code"] == str(grpc)
    assert rows[0].annotations["grpc.message"] == f"status {grpc}"


def test_an_empty_grpc_status_is_ok_because_proto3_leaves_code_zero_out():
    entry = gke_entry(GKE_K8S[0])
    entry["protoPayload"]["status"] = {}
    rows, _ = run(GKE_FORMAT, json.dumps(entry).encode())
    assert rows[0].code == 200 and rows[0].annotations["grpc.code"] == "0"


@pytest.mark.parametrize(("method", "resource_name", "expected"), [
    ("io.k8s.authorization.rbac.v1.clusterroles.create",
     "rbac.authorization.k8s.io/v1/clusterroles/edit",
     {"verb": "create", "api_group": "rbac.authorization.k8s.io", "api_version": "v1",
      "resource": "clusterroles", "name": "edit", "namespace": "", "subresource": ""}),
    ("io.k8s.apps.v1.deployments.patch", "apps/v1/namespaces/web/deployments/front",
     {"verb": "patch", "api_group": "apps", "api_version": "v1", "resource": "deployments",
      "name": "front", "namespace": "web", "subresource": ""}),
    ("io.k8s.core.v1.pods.exec.create", "core/v1/namespaces/web/pods/p-1/exec",
     {"verb": "create", "api_group": "", "api_version": "v1", "resource": "pods",
      "name": "p-1", "namespace": "web", "subresource": "exec"}),
    ("io.k8s.core.v1.namespaces.delete", "core/v1/namespaces/old",
     {"verb": "delete", "api_group": "", "api_version": "v1", "resource": "namespaces",
      "name": "old", "namespace": "old", "subresource": ""}),
    ("io.k8s.core.v1.pods.list", "core/v1/namespaces/web/pods",
     {"verb": "list", "api_group": "", "api_version": "v1", "resource": "pods", "name": "",
      "namespace": "web", "subresource": ""}),
    # Without a resourceName the method is all there is.
    ("io.k8s.batch.v1.jobs.status.update", None,
     {"verb": "update", "api_group": "batch", "api_version": "v1", "resource": "jobs",
      "name": "", "namespace": "", "subresource": "status"}),
])
def test_gke_method_and_resource_name_give_verb_group_and_object(method, resource_name,
                                                                 expected):
    entry = gke_entry(GKE_K8S[0])
    entry["protoPayload"]["methodName"] = method
    if resource_name is None:
        del entry["protoPayload"]["resourceName"]
    else:
        entry["protoPayload"]["resourceName"] = resource_name
    rows, _ = run(GKE_FORMAT, json.dumps(entry).encode())
    assert {k: getattr(rows[0], k) for k in expected} == expected


def secret_entry() -> dict:
    entry = gke_entry(GKE_K8S[0])
    payload = entry["protoPayload"]
    payload["methodName"] = "io.k8s.core.v1.secrets.create"
    payload["resourceName"] = "core/v1/namespaces/web/secrets/db"
    secret = {"@type": "core.k8s.io/v1.Secret", "apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "db", "namespace": "web"},
              "data": {"password": "c3VwZXJzZWNyZXQ=", "user": "YWRtaW4="}}
    payload["request"] = copy.deepcopy(secret)
    payload["response"] = copy.deepcopy(secret)
    entry["labels"]["note"] = "Authorization: Bearer abcdefghijklmnop1234"
    return entry


def test_a_secret_in_a_gke_request_and_response_body_is_redacted():
    entry = secret_entry()
    rows, report = run(GKE_FORMAT, json.dumps(entry).encode())
    stored = json.loads(rows[0].raw)
    for body in ("request", "response"):
        assert stored["protoPayload"][body]["data"] == {"password": MARKER, "user": MARKER}
        assert stored["protoPayload"][body]["metadata"] == entry["protoPayload"][body]["metadata"]
    assert b"c3VwZXJzZWNyZXQ" not in rows[0].raw and b"abcdefghijklmnop1234" not in rows[0].raw
    assert report.redacted == 5  # four data values and the bearer token
    kept = list(GKE_FORMAT.parse(io.BytesIO(json.dumps(entry).encode()), Report("x"),
                                 Redactor(enabled=False)))
    assert b"c3VwZXJzZWNyZXQ" in kept[0].raw


def test_malformed_gke_entries_are_skipped_with_their_lines_and_good_ones_kept():
    good = all_gke_k8s_entries()
    no_time = copy.deepcopy(good[0])
    del no_time["timestamp"], no_time["receiveTimestamp"]
    bad_time = copy.deepcopy(good[1])
    bad_time["timestamp"] = "yesterday"
    compute = copy.deepcopy(good[2])
    compute["protoPayload"]["methodName"] = "v1.compute.instances.insert"
    compute["protoPayload"]["serviceName"] = "compute.googleapis.com"
    node = gke_entry(GKE_NODE[0], "k8s_node")
    lines = [json.dumps(good[0]), "{not json", json.dumps(no_time), json.dumps(good[1]),
             json.dumps(bad_time), json.dumps(compute), json.dumps(node), json.dumps([1]),
             json.dumps(good[2])]
    rows, report = run(GKE_FORMAT, "\n".join(lines).encode(), "mixed.json")
    assert sorted(r.line for r in rows) == [1, 4, 9]
    assert report.skipped == 6
    assert [e.split(":")[1] for e in report.errors] == ["2", "3", "5", "6", "7", "8"]
    assert "methodName 'v1.compute.instances.insert'" in report.errors[3]
    assert any("compute.googleapis.com: 1" in note for note in report.notes)


def test_a_gke_file_with_nothing_usable_raises_input_error_naming_it():
    node = gke_entry(GKE_NODE[0], "k8s_node")
    with pytest.raises(InputError, match="nodes.json"):
        run(GKE_FORMAT, json.dumps([node, node]).encode(), "nodes.json")


def test_the_oss_yaml_event_gives_the_row_the_native_parser_gives_for_it_as_json():
    path = _FIXTURES / "gke" / "oss" / "test-log.yaml"
    event = yaml.safe_load(path.read_text())
    rows, report = run(GKE_FORMAT, path.read_bytes(), "test-log.yaml")
    native, _ = run_native(json.dumps(event).encode(), "test-log.yaml")
    assert len(rows) == 1
    # A YAML document has no JSON text of its own: the event is stored re-serialised.
    assert rows[0]._replace(line=0, raw=b"") == native[0]._replace(line=0, raw=b"")
    assert json.loads(rows[0].raw) == event
    assert rows[0].line == first_content_line(path.read_text())
    assert (rows[0].audit_id, rows[0].received) == (
        event["auditID"], parse_time(event["requestReceivedTimestamp"]))
    assert report.notes == []


# --- GKE: cluster operations -------------------------------------------------------------------

def operation_expectations(entry: dict) -> dict:
    payload = entry["protoPayload"]
    parts = payload["resourceName"].split("/")
    if "nodePools" in parts:
        resource, name = "nodepools", parts[parts.index("nodePools") + 1]
    else:
        resource, name = "clusters", parts[parts.index("clusters") + 1]
    return {"verb": payload["methodName"].rsplit(".", 1)[1].lower(), "resource": resource,
            "name": name,
            "username": payload.get("authenticationInfo", {}).get("principalEmail", "")}


@pytest.mark.parametrize("name", GKE_OPERATIONS)
def test_each_gke_operation_entry_is_one_row(name):
    path = _FIXTURES / "gke" / "gke_audit" / name
    entry = gke_entry(name, "gke_audit")
    operation = entry.get("operation", {})
    rows, report = run(GKE_FORMAT, path.read_bytes(), name)

    assert len(rows) == 1
    row = rows[0]
    assert row.kind == "audit"
    assert (row.audit_id, row.received) == (operation.get("id", entry["insertId"]),
                                            parse_time(entry["timestamp"]))
    assert {k: getattr(row, k) for k in ("verb", "resource", "name", "username")} == \
        operation_expectations(entry)
    assert row.api_group == entry["protoPayload"]["serviceName"]
    if operation.get("first") and not operation.get("last"):
        assert row.stage == "RequestReceived" and row.completed is None
        assert any("open spans" in note for note in report.notes)
    else:
        assert row.stage == "ResponseComplete" and row.completed == row.received
        assert row.duration_ms is None
    status = entry["protoPayload"].get("status")
    assert row.code == (None if status is None else GRPC_TO_HTTP[status.get("code", 0)])
    assert row.line == first_content_line(path.read_text())


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
@pytest.mark.parametrize("operation", ["cluster_creation", "cluster_deletion",
                                       "nodepool_creation", "nodepool_deletion"])
def test_an_operation_started_and_finished_is_one_span_with_its_real_duration(operation,
                                                                             newest_first):
    folder = _FIXTURES / "gke" / "gke_audit"
    started = (folder / f"{operation}_started.yaml").read_text()
    finished = (folder / f"{operation}_finished.yaml").read_text()
    start, end = yaml.safe_load(started), yaml.safe_load(finished)
    assert start["operation"]["id"] == end["operation"]["id"]
    # gcloud logging read lists newest first: the end of an operation before its start.
    documents = [finished, started] if newest_first else [started, finished]

    rows, report = run(GKE_FORMAT, "\n---\n".join(documents).encode(), "ops.yaml")

    assert len(rows) == 1
    row = rows[0]
    begun, ended = parse_time(start["timestamp"]), parse_time(end["timestamp"])
    assert (row.audit_id, row.received, row.completed) == (start["operation"]["id"], begun,
                                                           ended)
    assert row.duration_ms == (ended - begun).total_seconds() * 1000.0
    assert row.stage == "ResponseComplete" and row.code == 200
    assert {k: getattr(row, k) for k in ("verb", "resource", "name", "username")} == \
        operation_expectations(start)
    assert row.source_ip == start["protoPayload"]["requestMetadata"]["callerIp"]
    assert json.loads(row.raw) == {"entries": [start, end]}
    start_line = first_content_line(started)
    if newest_first:
        start_line += len((finished + "\n---\n").splitlines())  # the lines before it
    assert row.line == start_line
    assert "no latency in a Google Cloud Logging export" not in report.notes


def test_all_gke_fixtures_in_one_export_give_one_row_per_operation_and_request():
    entries = [gke_entry(n, "gke_audit") for n in GKE_OPERATIONS] + all_gke_k8s_entries()
    rows, report = run(GKE_FORMAT, json.dumps(entries, indent=1).encode())
    keys = {e.get("operation", {}).get("id") or e["insertId"] for e in entries}
    assert sorted(r.audit_id for r in rows) == sorted(keys)
    assert report.skipped == 0
    assert all(r.line == 1 for r in rows)  # one JSON document


# --- EKS: CloudWatch Logs ----------------------------------------------------------------------

def eks_page(messages: list[str], stream: str = "kube-apiserver-audit-0123abcd") -> bytes:
    """``aws logs filter-log-events`` output around ``messages``."""
    events = [{"logStreamName": stream, "timestamp": 1505159705000 + i, "message": m,
               "ingestionTime": 1505159706000 + i, "eventId": f"{i:056d}"}
              for i, m in enumerate(messages)]
    return json.dumps({"events": events, "searchedLogStreams": [
        {"logStreamName": stream, "searchedCompletely": True}]}, indent=4).encode()


def subscription_payload(messages: list[str]) -> bytes:
    return json.dumps({
        "messageType": "DATA_MESSAGE", "owner": "123456789012",
        "logGroup": "/aws/eks/demo/cluster", "logStream": "kube-apiserver-audit-0123abcd",
        "subscriptionFilters": ["audit"],
        "logEvents": [{"id": str(i), "timestamp": 1505159705000 + i, "message": m}
                      for i, m in enumerate(messages)],
    }).encode()


def base64_gzip(data: bytes) -> bytes:
    return base64.b64encode(gzip.compress(data))


def test_an_eks_filter_log_events_page_gives_exactly_the_native_rows():
    rows, report = run(EKS_FORMAT, eks_page(demo_lines()), "audit2rbac-demo.log")
    native, _ = run_native(DEMO.read_bytes(), "audit2rbac-demo.log")
    distinct = {(e["auditID"], parse_time(e.get("requestReceivedTimestamp") or e["timestamp"]))
                for e in demo_events()}
    assert len(rows) == len(distinct)
    assert identities(rows) == sorted(distinct) == identities(native)
    assert comparable(rows) == comparable(native)  # raw included: the message as written
    assert all(r.line == 1 for r in rows)
    assert report.skipped == 0


@pytest.mark.parametrize("encoding", ["json", "gzip", "base64-gzip"])
def test_an_eks_subscription_payload_gives_the_native_rows_in_every_encoding(encoding):
    payload = subscription_payload(demo_lines())
    data = {"json": payload, "gzip": gzip.compress(payload),
            "base64-gzip": base64_gzip(payload)}[encoding]
    rows, report = run(EKS_FORMAT, data, "demo")
    native, _ = run_native(DEMO.read_bytes(), "demo")
    assert comparable(rows) == comparable(native)
    assert report.skipped == 0


def test_base64_payloads_one_per_line_are_each_decoded_and_bad_ones_skipped():
    lines = demo_lines()
    half = len(lines) // 2
    data = b"\n".join([base64_gzip(subscription_payload(lines[:half])), b"H4sIbm90IGd6aXA=",
                       base64_gzip(subscription_payload(lines[half:]))]) + b"\n"
    rows, report = run(EKS_FORMAT, data, "kinesis.txt")
    native, _ = run_native(DEMO.read_bytes())
    assert identities(rows) == identities(native)
    assert sorted({r.line for r in rows}) == [1, 3]
    assert report.skipped == 1 and report.errors[0].startswith("kinesis.txt:2: ")


def test_eks_messages_of_other_control_plane_streams_are_skipped_with_their_stream():
    lines = demo_lines()
    page = json.loads(eks_page(lines))
    page["events"].insert(1, {"logStreamName": "kube-apiserver-0123abcd", "timestamp": 1,
                              "message": "I0911 19:55:05.000000  1 trace.go:116] Trace"})
    page["events"].insert(3, {"logStreamName": "authenticator-0123abcd", "timestamp": 2,
                              "message": '{"level":"info","msg":"access granted"}'})
    rows, report = run(EKS_FORMAT, json.dumps(page).encode(), "page.json")
    native, _ = run_native(DEMO.read_bytes())
    assert identities(rows) == identities(native)
    assert report.skipped == 2
    assert "kube-apiserver-0123abcd" in report.errors[0]
    assert "authenticator-0123abcd" in report.errors[1]


def test_a_control_message_is_ignored_with_a_note():
    control = {"messageType": "CONTROL_MESSAGE", "logEvents": [
        {"id": "", "timestamp": 1, "message": "CWL CONTROL MESSAGE: Checking health"}]}
    data = json.dumps(control).encode() + b"\n" + subscription_payload(demo_lines()[:3])
    rows, report = run(EKS_FORMAT, data)
    assert len(rows) == 3 and report.skipped == 0
    assert any("control message" in note for note in report.notes)


def test_an_eks_page_without_audit_messages_raises_input_error_naming_the_file():
    with pytest.raises(InputError, match="authenticator.json"):
        run(EKS_FORMAT, eks_page(['{"level":"info"}', "plain text"], "authenticator-1"),
            "authenticator.json")


def test_stages_of_one_request_in_separate_messages_collapse_as_natively():
    received = "2024-05-01T12:00:00.123456Z"
    base = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": "a-1", "requestURI": "/api/v1/pods?watch=true", "verb": "watch",
            "user": {"username": "alice"}, "sourceIPs": ["10.0.0.1"],
            "objectRef": {"resource": "pods", "apiVersion": "v1"},
            "requestReceivedTimestamp": received}
    stages = [dict(base, stage="RequestReceived", stageTimestamp=received),
              dict(base, stage="ResponseComplete", stageTimestamp="2024-05-01T12:00:02.123456Z",
                   responseStatus={"code": 200})]
    messages = [json.dumps(s, separators=(",", ":")) for s in stages]
    rows, _ = run(EKS_FORMAT, eks_page(messages))
    native, _ = run_native("\n".join(messages).encode())
    assert len(rows) == 1 and comparable(rows) == comparable(native)
    assert rows[0].duration_ms == 2000.0


# --- AKS: diagnostic settings ------------------------------------------------------------------

def test_the_aks_event_hub_record_fixture_gives_the_row_of_its_log():
    path = _FIXTURES / "wrapped" / "aks-eventhub-record.json"
    record = json.loads(path.read_text(encoding="utf-8-sig"))
    event = json.loads(record["properties"]["log"])
    rows, report = run(AKS_FORMAT, path.read_bytes(), path.name)
    native, _ = run_native(record["properties"]["log"].encode(), path.name)
    assert len(rows) == 1
    assert (rows[0].audit_id, rows[0].received) == (event["auditID"],
                                                    parse_time(event["requestReceivedTimestamp"]))
    assert rows[0]._replace(line=0) == native[0]._replace(line=0)
    assert rows[0].raw == record["properties"]["log"].strip().encode()
    assert rows[0].line == 1 and report.skipped == 0


def aks_record(category: str, log: str) -> dict:
    return {"operationName": "Microsoft.ContainerService/managedClusters/diagnosticLogs/Read",
            "category": category, "resourceId": "/SUBSCRIPTIONS/X/MANAGEDCLUSTERS/C",
            "properties": {"log": log, "stream": "stdout", "pod": "kube-apiserver-1"},
            "time": "2017-09-11T19:55:05Z"}


def test_aks_records_of_other_categories_are_counted_in_a_note_not_errors():
    lines = demo_lines()
    records = [aks_record("kube-audit", line) for line in lines[:10]]
    records += [aks_record("kube-audit-admin", line) for line in lines[10:]]
    records.insert(2, aks_record("kube-apiserver", "I0911 19:55:05.1 1 get.go:1] GET /api"))
    records.insert(5, aks_record("kube-apiserver", "E0911 19:55:06.1 1 x.go:1] boom"))
    records.insert(7, aks_record("guard", "guard log"))
    rows, report = run(AKS_FORMAT, json.dumps({"records": records}, indent=2).encode())
    native, _ = run_native(DEMO.read_bytes())
    assert comparable(rows) == comparable(native)
    assert report.skipped == 0
    assert report.notes == ["3 records of other categories skipped, not audit "
                            "(guard: 1, kube-apiserver: 2)"]


def test_aks_storage_account_json_lines_of_records_keep_their_line_numbers():
    lines = demo_lines()[:4]
    data = "\n".join(json.dumps(aks_record("kube-audit", line)) for line in lines)
    data += "\n" + json.dumps(aks_record("kube-audit", "not an event")) + "\n"
    rows, report = run(AKS_FORMAT, data.encode(), "PT1H.json")
    assert sorted(r.line for r in rows) == [1, 2, 3, 4]
    assert report.skipped == 1 and report.errors[0].startswith("PT1H.json:5: ")


def test_aks_with_only_other_categories_raises_input_error_naming_the_file():
    data = json.dumps({"records": [aks_record("kube-apiserver", "I0911 x")]}).encode()
    with pytest.raises(InputError, match="apiserver.json"):
        run(AKS_FORMAT, data, "apiserver.json")


def test_a_secret_in_an_aks_event_is_redacted_as_the_native_parser_redacts_it():
    event = json.loads((_FIXTURES / "audit" / "falco" / "create_secret.json").read_text())
    event = event[0] if isinstance(event, list) else event
    # The fixture is at Metadata level: give it the bodies a RequestResponse policy would log.
    event["level"] = "RequestResponse"
    event["requestObject"] = {"kind": "Secret", "apiVersion": "v1",
                              "metadata": {"name": event["objectRef"]["name"]},
                              "data": {"username": "YWRtaW4=", "password": "czNjcjN0"}}
    line = json.dumps(event, separators=(",", ":"))
    rows, report = run(AKS_FORMAT, json.dumps({"records": [aks_record("kube-audit", line)]})
                       .encode())
    native, native_report = run_native(line.encode())
    assert rows[0].raw == native[0].raw
    secret = json.loads(rows[0].raw)["requestObject"]
    assert set(secret["data"].values()) == {MARKER}
    assert report.redacted == native_report.redacted == len(event["requestObject"]["data"])


# --- OpenTelemetry -----------------------------------------------------------------------------

def otlp_bodies(name: str) -> list[str]:
    document = json.loads((_FIXTURES / "wrapped" / name).read_text())
    return [record["body"]["stringValue"]
            for resource_logs in document["resourceLogs"]
            for scope in resource_logs["scopeLogs"]
            for record in scope["logRecords"]]


@pytest.mark.parametrize("name", OTLP_FIXTURES)
def test_each_otlp_fixture_gives_the_rows_the_native_parser_gives_for_its_bodies(name):
    path = _FIXTURES / "wrapped" / name
    bodies = otlp_bodies(name)
    events = [json.loads(b) for b in bodies]
    rows, report = run(OTLP_FORMAT, path.read_bytes(), name)
    native, _ = run_native("\n".join(bodies).encode(), name)
    distinct = {(e["auditID"], parse_time(e["requestReceivedTimestamp"])) for e in events}
    assert len(rows) == len(distinct) == 3
    assert identities(rows) == sorted(distinct)
    assert comparable(rows) == comparable(native)
    assert all(r.line == 1 for r in rows) and report.skipped == 0


def to_any_value(value):
    """An OTLP AnyValue in its JSON encoding, built here independently of the parser."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [to_any_value(v) for v in value]}}
    return {"kvlistValue": {"values": [{"key": k, "value": to_any_value(v)}
                                       for k, v in value.items()]}}


def otlp_document(bodies: list[dict]) -> dict:
    return {"resourceLogs": [{"resource": {"attributes": [
        {"key": "log_type", "value": {"stringValue": "audit"}}]},
        "scopeLogs": [{"scope": {}, "logRecords": [
            {"timeUnixNano": "1734635994839162050", "body": body} for body in bodies]}]}]}


def test_otlp_kvlist_bodies_give_the_native_rows_with_the_event_reserialised():
    events = demo_events()[:5]
    document = otlp_document([to_any_value(e) for e in events])
    rows, _ = run(OTLP_FORMAT, json.dumps(document).encode())
    native, _ = run_native(b"\n".join(json.dumps(e).encode() for e in events))
    assert [r._replace(raw=b"") for r in comparable(rows)] == \
        [r._replace(raw=b"") for r in comparable(native)]
    assert sorted(json.loads(r.raw)["auditID"] for r in rows) == sorted(e["auditID"]
                                                                         for e in events)
    assert all(json.loads(r.raw) in events for r in rows)


def test_otlp_json_lines_of_documents_keep_lines_and_skip_records_that_are_not_audit():
    lines = demo_lines()
    first = otlp_document([{"stringValue": line} for line in lines[:3]])
    second = otlp_document([{"stringValue": "GET /healthz 200"}]
                           + [{"stringValue": line} for line in lines[3:5]])
    data = (json.dumps(first) + "\n" + json.dumps(second) + "\n{broken\n").encode()
    rows, report = run(OTLP_FORMAT, data, "otlp.jsonl")
    assert sorted(r.line for r in rows) == [1, 1, 1, 2, 2]
    assert report.skipped == 2
    assert report.errors[0] == "otlp.jsonl:2: log record 1: body is not an audit event"
    assert report.errors[1].startswith("otlp.jsonl:3: malformed JSON")


# --- legacy text format ------------------------------------------------------------------------

LEGACY_PAIR = (
    b'2017-03-21T03:57:09.106841886-04:00 AUDIT: id="c939d2a7-1c37-4ef1-b2f7-4ba9b1e43b53" '
    b'ip="127.0.0.1" method="GET" user="admin" '
    b'groups="\\"system:masters\\",\\"system:authenticated\\"" as="<self>" asgroups="<lookup>" '
    b'namespace="default" uri="/api/v1/namespaces/default/pods"\n'
    b'2017-03-21T03:57:09.108403639-04:00 AUDIT: id="c939d2a7-1c37-4ef1-b2f7-4ba9b1e43b53" '
    b'response="200"\n'
)


def test_a_legacy_request_and_its_response_line_are_one_span():
    rows, report = run(LEGACY_FORMAT, LEGACY_PAIR, "audit.log")
    assert len(rows) == 1
    row = rows[0]
    received = datetime.fromisoformat("2017-03-21T03:57:09.106841-04:00")
    completed = datetime.fromisoformat("2017-03-21T03:57:09.108403-04:00")
    assert (row.audit_id, row.received, row.completed) == (
        "c939d2a7-1c37-4ef1-b2f7-4ba9b1e43b53", received, completed)
    assert row.duration_ms == pytest.approx((completed - received).total_seconds() * 1000)
    assert (row.verb, row.resource, row.namespace, row.name) == ("list", "pods", "default", "")
    assert (row.username, list(row.groups), row.impersonated_user) == (
        "admin", ["system:masters", "system:authenticated"], "")
    assert (row.source_ip, row.code, row.stage, row.line) == ("127.0.0.1", 200,
                                                              "ResponseComplete", 1)
    assert row.request_uri == "/api/v1/namespaces/default/pods"
    assert row.kind == "audit" and row.source == "audit.log"
    assert json.loads(row.raw)["response"] == "200"
    assert ("legacy audit format: no objectRef or bodies; resource and name come from the URI"
            in report.notes)


@pytest.mark.parametrize(("method", "uri", "expected"), [
    ("GET", "/api/v1/namespaces/default/pods", ("list", "", "v1", "pods", "", "default", "")),
    ("GET", "/api/v1/namespaces/default/pods?watch=true&resourceVersion=1",
     ("watch", "", "v1", "pods", "", "default", "")),
    ("GET", "/api/v1/watch/namespaces/default/pods", ("watch", "", "v1", "pods", "", "default",
                                                      "")),
    ("GET", "/api/v1/namespaces/default/pods/web-1", ("get", "", "v1", "pods", "", "default",
                                                      "web-1")),
    ("GET", "/api/v1/namespaces/default/pods/web-1/log?container=a",
     ("get", "", "v1", "pods", "log", "default", "web-1")),
    ("POST", "/api/v1/namespaces/default/pods", ("create", "", "v1", "pods", "", "default", "")),
    ("PUT", "/apis/apps/v1/namespaces/prod/deployments/api",
     ("update", "apps", "v1", "deployments", "", "prod", "api")),
    ("PATCH", "/apis/apps/v1/namespaces/prod/deployments/api/scale",
     ("patch", "apps", "v1", "deployments", "scale", "prod", "api")),
    ("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterroles/edit",
     ("delete", "rbac.authorization.k8s.io", "v1", "clusterroles", "", "", "edit")),
    ("DELETE", "/api/v1/namespaces/default/pods", ("deletecollection", "", "v1", "pods", "",
                                                   "default", "")),
    ("GET", "/api/v1/namespaces/kube-system", ("get", "", "v1", "namespaces", "", "kube-system",
                                               "kube-system")),
    ("PUT", "/api/v1/namespaces/old/finalize", ("update", "", "v1", "namespaces", "finalize",
                                                "old", "old")),
    ("GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1",
     ("list", "", "v1", "nodes", "", "", "node-1")),
    ("GET", "/healthz", ("get", "", "", "", "", "", "")),
    ("GET", "/apis/apps/v1", ("get", "", "", "", "", "", "")),
])
def test_legacy_verb_and_object_come_from_the_method_and_uri(method, uri, expected):
    line = (f'2017-03-21T03:57:09Z AUDIT: id="x" ip="1.2.3.4" method="{method}" user="u" '
            f'groups="<none>" as="<self>" asgroups="<lookup>" namespace="<none>" uri="{uri}"\n')
    rows, _ = run(LEGACY_FORMAT, line.encode())
    got = rows[0]
    assert (got.verb, got.api_group, got.api_version, got.resource, got.subresource,
            got.namespace, got.name) == expected
    assert got.completed is None and got.stage == "RequestReceived"  # no response line


def test_legacy_impersonation_comes_from_as():
    line = (b'2017-03-21T03:57:09Z AUDIT: id="x" ip="1.2.3.4" method="GET" user="admin" '
            b'groups="<none>" as="bob" asgroups="\\"dev\\"" namespace="<none>" '
            b'uri="/api/v1/nodes"\n')
    rows, _ = run(LEGACY_FORMAT, line)
    assert (rows[0].username, rows[0].impersonated_user) == ("admin", "bob")


def go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def legacy_line_of(event: dict) -> str:
    """An event as the 1.8+ legacy backend writes it (k8s.io/apiserver EventString)."""
    user = event["user"]
    impersonated = event.get("impersonatedUser")
    groups = ",".join(go_quote(g) for g in user.get("groups", [])) or "<none>"
    return (f'{event.get("requestReceivedTimestamp") or event["timestamp"]} AUDIT: '
            f'id={go_quote(event["auditID"])} stage={go_quote(event["stage"])} '
            f'ip={go_quote(event["sourceIPs"][0])} method={go_quote(event["verb"])} '
            f'user={go_quote(user["username"])} groups={go_quote(groups)} '
            f'as={go_quote(impersonated["username"] if impersonated else "<self>")} '
            f'asgroups="<lookup>" user-agent={go_quote(event.get("userAgent", ""))} '
            f'namespace={go_quote(event.get("objectRef", {}).get("namespace") or "<none>")} '
            f'uri={go_quote(event["requestURI"])} '
            f'response="{event.get("responseStatus", {}).get("code", "<deferred>")}"')


def test_legacy_lines_of_the_1_8_backend_have_the_native_identities_and_fields():
    events = demo_events()
    data = "\n".join(legacy_line_of(e) for e in events).encode()
    rows, report = run(LEGACY_FORMAT, data)
    native, _ = run_native(DEMO.read_bytes())
    assert identities(rows) == identities(native)
    fields = ("verb", "username", "groups", "impersonated_user", "source_ip", "resource",
              "namespace", "name", "subresource", "api_group", "api_version", "code", "stage",
              "request_uri")

    def columns(row) -> dict:
        return {f: list(getattr(row, f)) if f == "groups" else getattr(row, f) for f in fields}

    assert [columns(r) for r in comparable(rows)] == [columns(n) for n in comparable(native)]
    assert all(r.completed == r.received and r.duration_ms is None for r in rows)
    assert any("no latency" in note for note in report.notes)


def test_legacy_bad_lines_orphan_responses_and_unanswered_requests():
    request, response = LEGACY_PAIR.splitlines()
    other = request.replace(b"c939d2a7", b"0000aaaa")
    data = b"\n".join([b"garbage line", request, b"", response,
                       response.replace(b"c939d2a7", b"ffffffff"), other,
                       b'2017-03-21T03:57:09Z AUDIT: ip="1.2.3.4"']) + b"\n"
    rows, report = run(LEGACY_FORMAT, data, "audit.log")
    assert [(r.audit_id[:8], r.line, r.stage) for r in rows] == [
        ("c939d2a7", 2, "ResponseComplete"), ("0000aaaa", 6, "RequestReceived")]
    assert rows[1].completed is None
    assert report.skipped == 3
    assert [e.split(":")[1] for e in report.errors] == ["1", "5", "7"]


def test_legacy_tokens_in_the_uri_and_fields_are_redacted():
    line = (b'2017-03-21T03:57:09Z AUDIT: id="x" ip="1.2.3.4" method="GET" user="u" '
            b'groups="<none>" as="<self>" asgroups="<lookup>" user-agent="Bearer abcdefghijklm" '
            b'namespace="<none>" uri="/api/v1/nodes?access_token=s3cr3t-value"\n')
    rows, report = run(LEGACY_FORMAT, line)
    assert b"s3cr3t-value" not in rows[0].raw and b"abcdefghijklm" not in rows[0].raw
    assert rows[0].request_uri == f"/api/v1/nodes?access_token={MARKER}"
    assert report.redacted == 2


def test_a_legacy_file_with_nothing_usable_raises_input_error_naming_it():
    with pytest.raises(InputError, match="notes.txt"):
        run(LEGACY_FORMAT, b"hello\nworld\n", "notes.txt")


# --- every envelope ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_envelope_refuses_an_empty_or_foreign_file_naming_it(fmt):
    for data in (b"", b"{}", b'{"kind":"PodList","items":[]}', b"just text\n"):
        with pytest.raises(InputError, match="foreign.bin"):
            run(fmt, data, "foreign.bin")


@pytest.mark.parametrize("fmt", [EKS_FORMAT, AKS_FORMAT, OTLP_FORMAT], ids=lambda f: f.name)
def test_progress_is_reported_with_the_rows_so_far(fmt):
    lines = demo_lines()
    data = {"eks-cloudwatch": eks_page(lines),
            "aks-diagnostics": json.dumps({"records": [aks_record("kube-audit", x)
                                                       for x in lines]}).encode(),
            "otlp-audit": json.dumps(otlp_document([{"stringValue": x} for x in lines]))
            .encode()}[fmt.name]
    calls = []
    rows = list(fmt.parse(io.BytesIO(data), Report("p"), None, lambda b, r: calls.append((b, r))))
    assert calls[-1] == (len(data), len(rows))
