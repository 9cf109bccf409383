"""GKE node and container logs from Google Cloud Logging (``timelines.parsers.gke_logs``): pure
parsing, no database.

Expected values are derived in the test from the real fixture files read with PyYAML (or from
entries built here out of them), never copied from what the parser produced.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
import yaml

from timelines.parsers import FORMATS, InputError, Redactor, Report, detect
from timelines.parsers.base import ParseHints, read_head
from timelines.parsers.gke_logs import FORMAT, parse, sniff
from timelines.parsers.redact import MARKER

_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
NODE_DIR = _FIXTURES / "gke" / "k8s_node"
GKE_NODE = sorted(p.name for p in NODE_DIR.glob("*.yaml"))
ALL_FIXTURES = sorted(str(p.relative_to(_FIXTURES)) for p in _FIXTURES.rglob("*")
                      if p.is_file() and p.suffix in (".log", ".json", ".yaml", ".txt", ".gz",
                                                      ".xz"))
# A JWT-shaped token (three base64url parts), as a leaked service account token looks.
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"


def run(data: bytes, name: str = "input", **kwargs) -> tuple[list, Report]:
    report = Report(name)
    return list(parse(io.BytesIO(data), report, **kwargs)), report


def documents(name: str) -> list[dict]:
    """The entries of a fixture as PyYAML reads them (every non-empty document)."""
    text = (NODE_DIR / name).read_text()
    return [d for d in yaml.safe_load_all(text) if d is not None]


def first_content_line(name: str) -> int:
    """The line of the first key of the fixture, after its licence comment."""
    for number, line in enumerate((NODE_DIR / name).read_text().splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            return number
    raise AssertionError(name)


def utc(value) -> datetime:
    """A YAML or JSON timestamp as an aware UTC datetime (PyYAML may already give a datetime)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def to_json(value) -> bytes:
    return json.dumps(value, default=lambda v: v.isoformat().replace("+00:00", "Z")).encode()


def expected_message(entry: dict) -> str:
    if "textPayload" in entry:
        return entry["textPayload"]
    payload = entry["jsonPayload"]
    return payload.get("MESSAGE", payload.get("message"))


def level_in(message: str) -> str:
    """The level a node agent wrote into its line (klog letter or logfmt level=), read here
    independently of the parser."""
    klog = re.match(r"([IWEF])\d{4} ", message)
    if klog:
        return {"I": "info", "W": "warning", "E": "error", "F": "fatal"}[klog.group(1)]
    logfmt = re.search(r"\blevel=(\w+)", message)
    return {"warn": "warning"}.get(logfmt.group(1), logfmt.group(1)) if logfmt else ""


def node_entry(name: str = "kubelet_only_pod_name.yaml") -> dict:
    return copy.deepcopy(documents(name)[0])


def container_entry() -> dict:
    """A k8s_container stdout entry built around a fixture entry's identity and time."""
    base = node_entry()
    return {
        "insertId": "c0ntainer1",
        "textPayload": "GET /healthz 200\n",
        "logName": "projects/sample-project/logs/stdout",
        "resource": {"type": "k8s_container", "labels": {
            "cluster_name": "sample-cluster", "location": "us-central1-a",
            "namespace_name": "kube-system", "pod_name": "kube-dns-58f547fd74-swzzt",
            "container_name": "sidecar", "project_id": "sample-project"}},
        "labels": {"compute.googleapis.com/resource_name": base["resource"]["labels"]["node_name"]},
        "severity": "ERROR",
        "timestamp": base["timestamp"],
    }


# --- the fixtures ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", GKE_NODE)
def test_each_node_fixture_gives_one_row_per_entry_with_the_fields_of_its_entry(name):
    entries = documents(name)
    rows, report = run((NODE_DIR / name).read_bytes(), name)
    assert len(rows) == len(entries) >= 1
    assert report.skipped == 0 and report.errors == []
    for row, entry in zip(rows, entries, strict=True):
        assert row.kind == "log"
        assert row.audit_id == "gke-log:" + entry["insertId"]
        assert row.received == row.completed == utc(entry["timestamp"])
        assert row.received.tzinfo is not None and row.received.utcoffset().total_seconds() == 0
        assert row.duration_ms == 0.0
        assert row.node == entry["resource"]["labels"]["node_name"]
        assert row.component == entry["logName"].rsplit("/", 1)[1]
        assert row.message == expected_message(entry)
        # no Cloud Logging severity on these entries: the line's own level counts
        assert row.severity == level_in(row.message)
        assert row.resource == row.namespace == row.name == ""  # k8s_node: no pod
        assert row.annotations["insertId"] == entry["insertId"]
        assert row.source == name
        assert row.line == first_content_line(name)
        assert orjson.loads(row.raw) == json.loads(to_json(entry))


def test_the_fixtures_name_kubelet_and_the_container_runtime():
    components = set()
    for name in GKE_NODE:
        rows, _ = run((NODE_DIR / name).read_bytes(), name)
        components.update(r.component for r in rows)
    assert components == {"kubelet", "container-runtime"}


@pytest.mark.parametrize("relative", ALL_FIXTURES)
def test_sniff_claims_the_node_logs_and_nothing_else(relative):
    head = read_head(_FIXTURES / relative)
    assert sniff(head, Path(relative).name) == relative.startswith("gke/k8s_node/")


@pytest.mark.parametrize("name", GKE_NODE)
def test_detect_picks_gke_log_for_the_node_fixtures(name):
    path = NODE_DIR / name
    assert detect(read_head(path), path.name).name == "gke-log"


def test_detect_still_picks_gke_audit_for_audit_entries():
    path = _FIXTURES / "gke" / "k8s_audit" / "container_recorder_test_1_1.yaml"
    assert detect(read_head(path), path.name).name == "gke-audit"


def test_the_format_is_registered_right_after_the_envelopes():
    names = [f.name for f in FORMATS]
    assert names.index("gke-log") == names.index("legacy-audit") + 1
    assert names.index("gke-audit") < names.index("gke-log") < names.index("audit")
    assert FORMAT.name == "gke-log"


# --- shapes ------------------------------------------------------------------------------------

def all_entries() -> list[dict]:
    return [entry for name in GKE_NODE for entry in documents(name)]


def expected_identities(entries) -> list[tuple[str, datetime]]:
    return sorted(("gke-log:" + e["insertId"], utc(e["timestamp"])) for e in entries)


@pytest.mark.parametrize("shape", ["json-array", "json-lines", "entries-list", "yaml-multi-doc",
                                   "gzip-json-array"])
def test_every_shape_of_an_export_gives_the_same_rows(shape):
    entries = all_entries()
    if shape == "json-array":
        data = to_json(entries)
    elif shape == "json-lines":
        data = b"\n".join(to_json(e) for e in entries) + b"\n"
    elif shape == "entries-list":
        data = to_json({"entries": entries})
    elif shape == "yaml-multi-doc":
        data = yaml.safe_dump_all(entries).encode()
    else:
        data = gzip.compress(to_json(entries))
    assert sniff(gzip.decompress(data) if shape.startswith("gzip") else data, "export")
    rows, report = run(data, "export")
    assert report.skipped == 0
    assert sorted((r.audit_id, r.received) for r in rows) == expected_identities(entries)
    by_id = {r.audit_id: r for r in rows}
    for entry in entries:
        row = by_id["gke-log:" + entry["insertId"]]
        assert row.message == expected_message(entry)
        assert row.node == entry["resource"]["labels"]["node_name"]
        assert row.component == entry["logName"].rsplit("/", 1)[1]


def test_json_lines_keep_the_line_of_each_entry():
    entries = all_entries()
    data = b"\n".join(to_json(e) for e in entries) + b"\n"
    rows, _ = run(data)
    assert [r.line for r in rows] == list(range(1, len(entries) + 1))


def test_a_malformed_entry_among_good_ones_is_skipped_with_its_line():
    good = all_entries()
    lines = [to_json(good[0]), b'{"insertId": "broken", "textPayload": ', to_json(good[1]),
             to_json({**good[2], "timestamp": "not a time"}), b"[1, 2]", to_json(good[3])]
    rows, report = run(b"\n".join(lines) + b"\n", "mixed.json")
    assert sorted(r.audit_id for r in rows) == sorted(
        "gke-log:" + e["insertId"] for e in (good[0], good[1], good[3]))
    assert report.skipped == 4  # the broken JSON, the bad time, and the two non-objects
    assert any(e.startswith("mixed.json:2: ") for e in report.errors)
    assert any(e.startswith("mixed.json:4: ") and "timestamp" in e for e in report.errors)


def test_audit_entries_are_left_to_gke_audit_and_counted_in_a_note():
    audit = yaml.safe_load((_FIXTURES / "gke" / "k8s_audit" / "container_recorder_test_1_1.yaml")
                           .read_text())
    rows, report = run(to_json([audit, node_entry()]))
    assert [r.audit_id for r in rows] == ["gke-log:" + node_entry()["insertId"]]
    assert report.skipped == 1 and "protoPayload" in report.errors[0]
    assert any("gke-audit" in note for note in report.notes)


def test_a_file_without_log_entries_raises_input_error_naming_it():
    audit_path = _FIXTURES / "gke" / "k8s_audit" / "container_recorder_test_1_1.yaml"
    with pytest.raises(InputError, match="no-logs.yaml"):
        run(audit_path.read_bytes(), "no-logs.yaml")
    with pytest.raises(InputError, match="empty.json"):
        run(b"[]", "empty.json")


# --- fields ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("cloud", "expected"), [
    ("DEFAULT", ""), ("DEBUG", "debug"), ("INFO", "info"), ("NOTICE", "info"),
    ("WARNING", "warning"), ("ERROR", "error"), ("CRITICAL", "fatal"), ("ALERT", "fatal"),
    ("EMERGENCY", "fatal"), (None, ""), (400, "warning"), (500, "error"), ("error", "error"),
])
def test_cloud_logging_severities_map_to_log_severities(cloud, expected):
    entry = node_entry()
    entry["jsonPayload"]["MESSAGE"] = "a line that names no level"
    if cloud is None:
        entry.pop("severity", None)
    else:
        entry["severity"] = cloud
    rows, _ = run(to_json(entry))
    assert rows[0].severity == expected


def test_a_line_s_own_level_stands_in_for_a_missing_severity():
    entry = node_entry()
    entry.pop("severity", None)
    entry["jsonPayload"]["MESSAGE"] = "E1119 10:00:00.000000    1 kubelet.go:1] sync failed"
    rows, _ = run(to_json(entry))
    assert rows[0].severity == "error"


def test_a_container_entry_names_its_pod_as_an_audit_object_ref_does():
    entry = container_entry()
    rows, _ = run(to_json([entry]))
    row = rows[0]
    labels = entry["resource"]["labels"]
    assert (row.resource, row.namespace, row.name) == ("pods", labels["namespace_name"],
                                                       labels["pod_name"])
    assert row.node == entry["labels"]["compute.googleapis.com/resource_name"]
    assert row.component == "stdout"
    assert row.message == entry["textPayload"].rstrip("\n")
    assert row.severity == "error"
    assert row.annotations["container_name"] == labels["container_name"]
    assert row.annotations["insertId"] == entry["insertId"]


def test_message_falls_back_to_lower_case_message_then_to_the_payload_json():
    entry = node_entry()
    payload = entry["jsonPayload"]
    text = payload.pop("MESSAGE")
    payload["message"] = text
    rows, _ = run(to_json(entry))
    assert rows[0].message == text
    entry = node_entry()
    entry["jsonPayload"] = {"reason": "OOMKilling", "count": 3}
    rows, _ = run(to_json(entry))
    assert json.loads(rows[0].message) == entry["jsonPayload"]
    assert "\n" not in rows[0].message


def test_component_falls_back_to_the_syslog_identifier_and_node_to_hints():
    entry = node_entry()
    identifier = entry["jsonPayload"]["SYSLOG_IDENTIFIER"]
    del entry["logName"]
    del entry["resource"]["labels"]["node_name"]
    rows, _ = run(to_json(entry), hints=ParseHints(node="from-bundle"))
    assert rows[0].component == identifier
    assert rows[0].node == "from-bundle"


def test_an_entry_without_insert_id_gets_a_stable_key():
    entry = node_entry()
    del entry["insertId"]
    first, _ = run(to_json(entry))
    second, _ = run(yaml.safe_dump(entry).encode())
    assert first[0].audit_id == second[0].audit_id
    assert first[0].audit_id.startswith("gke-log:")
    other = {**entry, "textPayload": "another line"}
    del other["jsonPayload"]
    third, _ = run(to_json(other))
    assert third[0].audit_id != first[0].audit_id


def test_yaml_datetimes_are_normalised_to_aware_utc():
    entry = node_entry()
    expected = utc(entry["timestamp"])
    document = yaml.safe_dump(entry).replace(f"timestamp: '{entry['timestamp']}'",
                                             "timestamp: !!timestamp 2024-01-01 02:00:00+01:00")
    assert "!!timestamp" in document
    rows, _ = run(document.encode())
    assert rows[0].received == expected
    assert rows[0].received.tzinfo is not None


def test_a_token_in_a_log_line_is_redacted_in_message_and_raw():
    entry = node_entry()
    entry["jsonPayload"]["MESSAGE"] = f"probe failed: Authorization: Bearer {TOKEN}"
    rows, report = run(to_json(entry), redactor=Redactor())
    assert TOKEN not in rows[0].message and MARKER in rows[0].message
    assert TOKEN.encode() not in rows[0].raw
    assert report.redacted >= 1
    kept, report = run(to_json(entry), redactor=Redactor(enabled=False))
    assert TOKEN in kept[0].message and report.redacted == 0
