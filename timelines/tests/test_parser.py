"""``timelines.parsers.parse_audit``: pure parsing of kube-apiserver audit logs, no database.

Expected values are derived in the test from the input (the real fixture files read with the
stdlib ``json`` module, or events built here), never copied from what the parser produced.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from timelines.parsers import InputError, Redactor, Report, parse_audit

# Resolved at collection time for parametrization; the tests open files through ``fixtures_dir``.
_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
_AUDIT = _FIXTURES / "audit"
AUDIT_FIXTURES = sorted(
    [str(p.relative_to(_FIXTURES)) for p in _AUDIT.glob("*.log")]
    + [
        str(p.relative_to(_FIXTURES))
        for p in (_AUDIT / "falco").glob("*.json")
        if p.name != "fal_01_003.json"
    ]
    + ["wrapped/aks-kube-audit-event.json"]
)

FINAL = ("ResponseComplete", "Panic")
T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


# --- helpers -----------------------------------------------------------------------------------

def parse(data: bytes, name: str = "test.log", **kwargs) -> tuple[list, Report]:
    report = Report(name)
    rows = list(parse_audit(io.BytesIO(data), report, **kwargs))
    return rows, report


def parse_path(path: Path, **kwargs) -> tuple[list, Report]:
    report = Report(path.name)
    with path.open("rb") as handle:
        rows = list(parse_audit(handle, report, **kwargs))
    return rows, report


def ts(moment: datetime) -> str:
    """RFC 3339 with microseconds, as the apiserver writes it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def event(audit_id: str, stage: str, received: datetime, stage_at: datetime | None = None,
          **extra) -> dict:
    """An audit.k8s.io/v1 event for one stage of a request."""
    body = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": audit_id,
        "stage": stage,
        "requestURI": "/api/v1/namespaces/default/pods?limit=500",
        "verb": "list",
        "user": {"username": "alice", "groups": ["dev", "system:authenticated"]},
        "sourceIPs": ["10.0.0.7", "10.0.0.1"],
        "userAgent": "kubectl/v1.29.0 (linux/amd64)",
        "objectRef": {"resource": "pods", "namespace": "default", "apiVersion": "v1"},
        "requestReceivedTimestamp": ts(received),
        "stageTimestamp": ts(stage_at or received),
    }
    if stage in FINAL:
        body["responseStatus"] = {"metadata": {}, "code": 500 if stage == "Panic" else 200}
    body.update(extra)
    return body


def line(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def jsonl(*values) -> bytes:
    return b"".join(line(v) + b"\n" for v in values)


def events_of(path: Path) -> list[dict]:
    """Every object of kind Event in a fixture: JSON lines or one JSON document (maybe with a
    BOM), webhook batches unwrapped."""
    text = path.read_bytes().decode("utf-8-sig")
    try:
        documents = [json.loads(text)]
    except json.JSONDecodeError:
        documents = [json.loads(chunk) for chunk in text.splitlines() if chunk.strip()]
    found: list = []
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == "EventList":
            found.extend(doc["items"])
        elif isinstance(doc, list):
            found.extend(doc)
        else:
            found.append(doc)
    return [e for e in found if isinstance(e, dict) and e.get("kind") == "Event"]


def json_lines(path: Path) -> list[tuple[int, bytes, dict]]:
    """(1-based line number, line bytes without the newline, event) of a JSON-lines file."""
    out = []
    for number, raw_line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if raw_line.strip():
            out.append((number, raw_line.strip(), json.loads(raw_line)))
    return out


def identity(e: dict) -> tuple[str, datetime]:
    return e["auditID"], parse_time(e.get("requestReceivedTimestamp") or e["timestamp"])


def expected_fields(e: dict) -> dict:
    """The row columns an event implies, read the way DOMAIN.md describes the fields."""
    ref = e.get("objectRef") or {}
    group = ref.get("apiGroup", "")
    version = ref.get("apiVersion", "")
    if not group and "/" in version:
        group, version = version.split("/", 1)
    return {
        "audit_id": e["auditID"],
        "verb": e.get("verb", ""),
        "username": e["user"]["username"],
        "groups": e["user"].get("groups", []),
        "impersonated_user": (e.get("impersonatedUser") or {}).get("username", ""),
        "user_agent": e.get("userAgent", ""),
        "source_ip": e["sourceIPs"][0],
        "resource": ref.get("resource", ""),
        "subresource": ref.get("subresource", ""),
        "namespace": ref.get("namespace", ""),
        "name": ref.get("name", ""),
        "api_group": group,
        "api_version": version,
        "object_uid": ref.get("uid", ""),
        "resource_version": ref.get("resourceVersion", ""),
        "code": e["responseStatus"]["code"],
        "level": e["level"],
        "stage": e["stage"],
        "request_uri": e["requestURI"],
        "annotations": e.get("annotations", {}),
    }


def fields_of(row, names) -> dict:
    return {name: getattr(row, name) for name in names}


# --- the real fixture files --------------------------------------------------------------------

@pytest.mark.parametrize("relative", AUDIT_FIXTURES)
def test_every_audit_fixture_parses_into_one_row_per_distinct_request(fixtures_dir, relative):
    path = fixtures_dir / relative
    expected = {identity(e) for e in events_of(path)}
    assert expected, f"{relative} holds no Event: the fixture list is wrong"

    rows, report = parse_path(path)

    assert len(rows) == len(expected)
    assert {(row.audit_id, row.received) for row in rows} == expected
    assert report.skipped == 0
    assert report.errors == []
    assert report.truncated is False
    for row in rows:
        assert row.source == path.name
        stored = json.loads(row.raw)
        assert (stored["auditID"], stored["stage"]) == (row.audit_id, row.stage)


def test_the_deliberately_malformed_falco_trace_raises_input_error_naming_the_file(fixtures_dir):
    path = fixtures_dir / "audit" / "falco" / "fal_01_003.json"
    assert json.loads(path.read_bytes()) == {"kind": 0}

    with pytest.raises(InputError, match="fal_01_003.json"):
        parse_path(path)


def test_the_falco_test_description_yaml_is_not_audit_data(fixtures_dir):
    path = fixtures_dir / "audit" / "falco" / "falco_k8s_audit_tests.yaml"

    with pytest.raises(InputError, match="falco_k8s_audit_tests.yaml"):
        parse_path(path)


def test_audit2rbac_rows_carry_the_fields_of_their_events(fixtures_dir):
    path = fixtures_dir / "audit" / "audit2rbac-demo.log"
    lines = json_lines(path)
    by_id = {e["auditID"]: (number, raw, e) for number, raw, e in lines}
    assert len(by_id) == len(lines)  # auditIDs are unique in this file: look-up by ID is safe
    # The file exercises impersonation, 403s and requests without objectRef.
    assert any("impersonatedUser" in e for _, _, e in lines)
    assert any("objectRef" not in e for _, _, e in lines)
    assert any(e["responseStatus"]["code"] == 403 for _, _, e in lines)

    rows, report = parse_path(path, redactor=Redactor(enabled=False))

    assert len(rows) == len(lines)
    for row in rows:
        number, raw, e = by_id[row.audit_id]
        expected = expected_fields(e)
        assert fields_of(row, expected) == expected
        # No requestReceivedTimestamp/stageTimestamp here: timestamp and creationTimestamp.
        assert row.received == parse_time(e["timestamp"])
        assert row.completed == parse_time(e["metadata"]["creationTimestamp"])
        assert row.duration_ms == (row.completed - row.received).total_seconds() * 1000
        assert row.source == report.source == "audit2rbac-demo.log"
        assert row.line == number
        assert row.raw == raw


def test_openshift_requestresponse_rows_carry_the_fields_of_their_events(fixtures_dir):
    path = fixtures_dir / "audit" / "openshift-requestresponse.log"
    lines = json_lines(path)
    by_id = {e["auditID"]: (number, raw, e) for number, raw, e in lines}
    assert len(by_id) == len(lines)
    assert any(e["objectRef"].get("subresource") for _, _, e in lines)
    assert any(e["objectRef"].get("apiGroup") for _, _, e in lines)

    rows, report = parse_path(path, redactor=Redactor(enabled=False))

    assert len(rows) == len(lines)
    for row in rows:
        number, raw, e = by_id[row.audit_id]
        expected = expected_fields(e)
        assert fields_of(row, expected) == expected
        received = parse_time(e["requestReceivedTimestamp"])
        completed = parse_time(e["stageTimestamp"])
        assert (row.received, row.completed) == (received, completed)
        assert row.duration_ms == pytest.approx((completed - received) / timedelta(milliseconds=1))
        assert row.line == number
        assert row.raw == raw
        assert json.loads(row.raw)["responseObject"] == e["responseObject"]


def test_the_bom_prefixed_pretty_printed_aks_event_is_one_row(fixtures_dir):
    path = fixtures_dir / "wrapped" / "aks-kube-audit-event.json"
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and data.count(b"\n") > 10
    e = json.loads(data.decode("utf-8-sig"))

    rows, report = parse_path(path, redactor=Redactor(enabled=False))

    assert len(rows) == 1
    row = rows[0]
    expected = expected_fields(e)
    assert fields_of(row, expected) == expected
    assert row.received == parse_time(e["requestReceivedTimestamp"])
    assert row.completed == parse_time(e["stageTimestamp"])
    assert json.loads(row.raw) == e
    assert report.skipped == 0


# --- stage collapse ----------------------------------------------------------------------------

def test_it_collapses_request_received_and_response_complete_into_one_row():
    a_done = T0 + timedelta(milliseconds=12, microseconds=345)
    b_at = T0 + timedelta(microseconds=700)
    b_done = T0 + timedelta(seconds=1, microseconds=1)
    lines = [
        event("req-a", "RequestReceived", T0),
        event("req-b", "RequestReceived", b_at, verb="get"),
        event("req-a", "ResponseComplete", T0, a_done),
        event("req-c", "ResponseComplete", T0 + timedelta(seconds=2)),  # logged only when done
        event("req-b", "ResponseComplete", b_at, b_done, verb="get"),
    ]
    data = jsonl(*lines)

    rows, report = parse(data)

    assert report.skipped == 0
    by_id = {row.audit_id: row for row in rows}
    assert sorted(by_id) == ["req-a", "req-b", "req-c"] and len(rows) == 3
    a, b = by_id["req-a"], by_id["req-b"]
    assert (a.received, a.completed) == (T0, a_done)
    assert (b.received, b.completed) == (b_at, b_done)
    assert a.duration_ms == pytest.approx(12.345)
    assert b.duration_ms == pytest.approx(1000.001 - 0.7)
    assert by_id["req-c"].duration_ms == 0
    assert {row.stage for row in rows} == {"ResponseComplete"}
    for row in (a, b):
        assert row.received.tzinfo is not None and row.received.utcoffset() == timedelta(0)
        assert row.completed.tzinfo is not None and row.completed.utcoffset() == timedelta(0)
    assert a.received.microsecond == T0.microsecond
    assert b.completed.microsecond == (T0.microsecond + 1) % 1_000_000
    # The row is the final stage: its line and its raw JSON.
    assert (a.line, b.line, by_id["req-c"].line) == (3, 5, 4)
    assert a.raw == line(lines[2])
    assert b.verb == "get"
    assert a.source_ip == lines[2]["sourceIPs"][0] != lines[2]["sourceIPs"][-1]


def test_a_watch_without_its_final_stage_is_an_open_span():
    started = T0 + timedelta(milliseconds=3)
    watch = {"verb": "watch", "requestURI": "/api/v1/pods?watch=true"}
    lines = [
        event("watch-1", "RequestReceived", T0, **watch),
        event("other", "RequestReceived", T0),
        event("watch-1", "ResponseStarted", T0, started, **watch),
        event("other", "ResponseComplete", T0, T0 + timedelta(milliseconds=5)),
    ]

    rows, report = parse(jsonl(*lines))

    assert len(rows) == 2
    watch_row = next(row for row in rows if row.audit_id == "watch-1")
    assert watch_row.completed is None
    assert watch_row.duration_ms is None
    assert watch_row.stage == "ResponseStarted"
    assert watch_row.received == T0
    assert watch_row.verb == "watch"
    assert watch_row.line == 3
    assert json.loads(watch_row.raw) == lines[2]
    assert report.skipped == 0


def test_panic_is_a_final_stage():
    panicked = T0 + timedelta(milliseconds=40)
    lines = [
        event("boom", "RequestReceived", T0, verb="watch"),
        event("boom", "ResponseStarted", T0, T0 + timedelta(milliseconds=1), verb="watch"),
        event("boom", "Panic", T0, panicked, verb="watch"),
    ]

    rows, _report = parse(jsonl(*lines))

    assert len(rows) == 1
    (row,) = rows
    assert row.stage == "Panic"
    assert row.completed == panicked
    assert row.duration_ms == pytest.approx(40.0)
    assert row.code == 500
    assert row.line == 3


def test_the_same_audit_id_with_two_received_times_is_two_requests():
    """Clients set their own Audit-ID header: the ID alone is not an identity."""
    second = T0 + timedelta(seconds=30)
    lines = [
        event("client-set-id", "RequestReceived", T0),
        event("client-set-id", "RequestReceived", second),
        event("client-set-id", "ResponseComplete", second, second + timedelta(milliseconds=2)),
        event("client-set-id", "ResponseComplete", T0, T0 + timedelta(milliseconds=9)),
    ]

    rows, _report = parse(jsonl(*lines))

    assert len(rows) == 2
    spans = sorted((row.received, row.completed) for row in rows)
    assert spans == [
        (T0, T0 + timedelta(milliseconds=9)),
        (second, second + timedelta(milliseconds=2)),
    ]


def test_a_reused_audit_id_completing_does_not_close_the_other_request():
    later = T0 + timedelta(seconds=5)
    lines = [
        event("reused", "RequestReceived", T0, verb="watch"),
        event("reused", "RequestReceived", later),
        event("reused", "ResponseComplete", later, later + timedelta(milliseconds=3)),
    ]

    rows, _report = parse(jsonl(*lines))

    spans = sorted((row.received, row.completed, row.stage) for row in rows)
    assert spans == [
        (T0, None, "RequestReceived"),
        (later, later + timedelta(milliseconds=3), "ResponseComplete"),
    ]


def test_earliest_v1beta1_events_use_timestamp_and_metadata_creation_timestamp():
    """Kubernetes 1.8-1.9: no requestReceivedTimestamp/stageTimestamp/userAgent; ``timestamp`` is
    the received time on every stage, ``metadata.creationTimestamp`` the stage time."""

    def old(stage: str, stage_time: str) -> dict:
        body = {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1beta1",
            "metadata": {"creationTimestamp": stage_time},
            "level": "Metadata",
            "timestamp": "2018-01-02T03:04:05Z",
            "auditID": "old-1",
            "stage": stage,
            "requestURI": "/api/v1/namespaces/kube-system/configmaps/x",
            "verb": "get",
            "user": {"username": "kubelet", "groups": ["system:nodes"]},
            "sourceIPs": ["192.168.1.2"],
            "objectRef": {"resource": "configmaps", "namespace": "kube-system", "name": "x",
                          "apiVersion": "v1"},
        }
        if stage == "ResponseComplete":
            body["responseStatus"] = {"metadata": {}, "code": 200}
        return body

    lines = [old("RequestReceived", "2018-01-02T03:04:05Z"),
             old("ResponseComplete", "2018-01-02T03:04:07Z")]

    rows, report = parse(jsonl(*lines))

    assert report.skipped == 0
    assert len(rows) == 1
    (row,) = rows
    assert row.received == parse_time(lines[0]["timestamp"])
    assert row.completed == parse_time(lines[1]["metadata"]["creationTimestamp"])
    assert row.duration_ms == 2000.0
    assert row.user_agent == ""
    assert row.stage == "ResponseComplete"
    assert row.line == 2


@pytest.mark.parametrize(
    ("object_api_version", "group", "version"),
    [("apps/v1", "apps", "v1"), ("rbac.authorization.k8s.io/v1alpha1",
                                 "rbac.authorization.k8s.io", "v1alpha1"), ("v1", "", "v1")],
)
def test_v1alpha1_object_ref_api_version_holds_group_and_version(object_api_version, group,
                                                                 version):
    e = event("alpha", "ResponseComplete", T0, apiVersion="audit.k8s.io/v1alpha1",
              objectRef={"resource": "deployments", "namespace": "default", "name": "web",
                         "apiVersion": object_api_version})

    rows, _report = parse(jsonl(e))

    assert len(rows) == 1
    assert (rows[0].api_group, rows[0].api_version) == (group, version)
    assert (rows[0].resource, rows[0].name) == ("deployments", "web")


# --- envelopes ---------------------------------------------------------------------------------

def test_webhook_batches_on_one_line_are_unwrapped_and_collapsed_across_items():
    done = T0 + timedelta(milliseconds=7)
    batch1 = {"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": {}, "items": [
        event("w-1", "RequestReceived", T0),
        event("w-2", "ResponseComplete", T0),
    ]}
    batch2 = {"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": {}, "items": [
        event("w-3", "RequestReceived", T0),
        event("w-1", "ResponseComplete", T0, done),
    ]}

    rows, report = parse(jsonl(batch1, batch2))

    assert report.skipped == 0
    by_id = {row.audit_id: row for row in rows}
    assert sorted(by_id) == ["w-1", "w-2", "w-3"] and len(rows) == 3
    assert (by_id["w-1"].completed, by_id["w-1"].line) == (done, 2)
    assert by_id["w-2"].line == 1
    assert by_id["w-3"].completed is None
    assert json.loads(by_id["w-1"].raw) == batch2["items"][1]


def test_a_pretty_printed_event_list_document_is_read_whole():
    items = [event(f"doc-{i}", "ResponseComplete", T0 + timedelta(seconds=i)) for i in range(4)]
    items.insert(1, event("doc-2", "RequestReceived", T0 + timedelta(seconds=2)))
    document = {"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": {},
                "items": items}
    data = json.dumps(document, indent=2).encode()
    assert data.count(b"\n") > 20

    rows, report = parse(data)

    assert report.skipped == 0
    assert sorted(row.audit_id for row in rows) == ["doc-0", "doc-1", "doc-2", "doc-3"]
    for row in rows:
        original = next(e for e in items
                        if e["auditID"] == row.audit_id and e["stage"] == "ResponseComplete")
        assert row.received == parse_time(original["requestReceivedTimestamp"])
        assert json.loads(row.raw) == original


def test_a_json_array_of_events_is_read_whole():
    items = [event("arr-1", "RequestReceived", T0), event("arr-1", "ResponseComplete", T0)]

    rows, _report = parse(json.dumps(items, indent=1).encode())

    assert [(row.audit_id, row.stage) for row in rows] == [("arr-1", "ResponseComplete")]


# --- gzip --------------------------------------------------------------------------------------

def plain_rows(fixtures_dir: Path) -> list:
    return parse_path(fixtures_dir / "audit" / "audit2rbac-demo.log")[0]


def without_source(rows) -> list:
    return [row._replace(source="") for row in rows]


@pytest.mark.parametrize(
    ("name", "compressed"),
    [
        ("audit2rbac-demo.log.gz", True),
        ("audit-2020-04-06T06-37-23.123.log.gz", True),
        ("audit.log", True),  # gzipped without saying so
        ("not-really.gz", False),  # says gzip, is plain
    ],
)
def test_gzip_is_sniffed_from_content_and_gives_the_same_rows_as_plain(fixtures_dir, tmp_path,
                                                                      name, compressed):
    plain = (fixtures_dir / "audit" / "audit2rbac-demo.log").read_bytes()
    path = tmp_path / name
    path.write_bytes(gzip.compress(plain) if compressed else plain)

    rows, report = parse_path(path)

    assert without_source(rows) == without_source(plain_rows(fixtures_dir))
    assert len(rows) == len(events_of(fixtures_dir / "audit" / "audit2rbac-demo.log"))
    assert {row.source for row in rows} == {name}
    assert report.truncated is False and report.skipped == 0


def test_a_truncated_gzip_keeps_the_rows_before_the_cut(fixtures_dir, tmp_path):
    plain = (fixtures_dir / "audit" / "audit2rbac-demo.log").read_bytes()
    compressed = gzip.compress(plain)
    cut = compressed[: len(compressed) // 2]
    # What any gzip reader can recover from the cut stream: the complete lines in it.
    recoverable = zlib.decompressobj(wbits=31).decompress(cut)
    complete = recoverable.count(b"\n")
    total = plain.count(b"\n")
    assert 0 < complete < total, "the cut must fall inside the data"
    expected_ids = [json.loads(chunk)["auditID"] for chunk in plain.split(b"\n")[:complete]]
    path = tmp_path / "audit-2020-04-06T06-37-23.123.log.gz"
    path.write_bytes(cut)

    rows, report = parse_path(path)  # must not raise: rows came out

    assert [row.audit_id for row in rows] == expected_ids
    assert report.truncated is True
    assert len(report.errors) == 1
    assert report.errors[0].startswith(f"{path.name}:{complete + 1}: ")
    assert "truncated" in report.errors[0]


def test_a_gzip_with_a_corrupt_trailer_keeps_every_row_and_reports_it(fixtures_dir, tmp_path):
    plain = (fixtures_dir / "audit" / "audit2rbac-demo.log").read_bytes()
    compressed = bytearray(gzip.compress(plain))
    compressed[-8] ^= 0xFF  # the CRC32 of the trailer
    path = tmp_path / "audit.log.gz"
    path.write_bytes(bytes(compressed))

    rows, report = parse_path(path)

    assert len(rows) == plain.count(b"\n")
    assert report.truncated is True
    assert len(report.errors) == 1 and report.errors[0].startswith(f"{path.name}:")


def test_a_truncated_gzip_with_nothing_recoverable_is_an_input_error(tmp_path):
    compressed = gzip.compress(jsonl(event("x", "ResponseComplete", T0)) * 50)
    path = tmp_path / "audit.log.gz"
    path.write_bytes(compressed[:12])

    with pytest.raises(InputError, match="audit.log.gz"):
        parse_path(path)


# --- bad input never loses good input ----------------------------------------------------------

def mixed_lines() -> tuple[list[bytes], list[str], dict[int, str]]:
    """Lines of a damaged log, the auditIDs of its good lines, and {bad line number: reason
    fragment}."""
    good = [event(f"good-{i}", "ResponseComplete", T0 + timedelta(seconds=i)) for i in range(4)]
    no_id = event("dropped", "ResponseComplete", T0)
    del no_id["auditID"]
    truncated = line(event("cut", "ResponseComplete", T0))
    truncated = truncated[: len(truncated) * 2 // 3]
    lines = [
        line(good[0]),
        b'{"kind": "Event", "auditID": }',
        truncated,
        line(good[1]),
        b"\xff\xfe\x00{" + line(good[2])[1:],
        b"",
        line({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "web"}}),
        line(no_id),
        line(good[2]),
        b"   ",
        line(good[3]),
    ]
    bad = {2: "JSON", 3: "JSON", 5: "UTF-8", 7: "not an audit event", 8: "auditID"}
    return lines, [e["auditID"] for e in good], bad


def test_bad_lines_are_skipped_with_their_line_numbers_and_good_lines_kept():
    lines, good_ids, bad = mixed_lines()
    data = b"\n".join(lines) + b"\n"

    rows, report = parse(data, name="damaged.log")

    assert sorted(row.audit_id for row in rows) == sorted(good_ids)
    assert report.skipped == len(bad)
    assert len(report.errors) == len(bad)
    for error, (number, reason) in zip(report.errors, sorted(bad.items()), strict=True):
        assert error.startswith(f"damaged.log:{number}: "), error
        assert reason in error
    good_lines = {json.loads(chunk)["auditID"]: n for n, chunk in enumerate(lines, start=1)
                  if chunk.strip() and n not in bad}
    assert {row.audit_id: row.line for row in rows} == good_lines


@pytest.mark.parametrize("blank_lines_before", [0, 3])
def test_a_truncated_first_line_that_looks_like_a_document_does_not_lose_the_file(
        blank_lines_before):
    good = [event(f"good-{i}", "ResponseComplete", T0 + timedelta(seconds=i)) for i in range(3)]
    lines = [b""] * blank_lines_before + [
        b'{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata",',
        line(good[0]),
        b'{"kind":"Event",,}',
        line(good[1]),
        line(good[2]),
    ]
    data = b"\n".join(lines) + b"\n"
    first_bad = blank_lines_before + 1

    rows, report = parse(data, name="cut.log")

    assert sorted(row.audit_id for row in rows) == [e["auditID"] for e in good]
    assert report.skipped == 2
    assert report.errors[0].startswith(f"cut.log:{first_bad}: ")
    assert report.errors[1].startswith(f"cut.log:{first_bad + 2}: ")
    assert {row.audit_id: row.line for row in rows} == {
        "good-0": first_bad + 1, "good-1": first_bad + 3, "good-2": first_bad + 4}


def test_only_the_first_twenty_errors_are_kept_but_every_bad_line_is_counted():
    bad_count = 30
    lines = [line(event("first", "ResponseComplete", T0))]
    lines += [b'{"broken": %d' % i for i in range(bad_count)]
    lines += [line(event("last", "ResponseComplete", T0))]

    rows, report = parse(b"\n".join(lines) + b"\n", name="noisy.log")

    assert sorted(row.audit_id for row in rows) == ["first", "last"]
    assert report.skipped == bad_count
    assert len(report.errors) == 20
    assert [e.split(":")[1] for e in report.errors] == [str(n) for n in range(2, 22)]


def test_an_event_with_a_malformed_timestamp_is_skipped_not_fatal():
    bad = event("bad-time", "ResponseComplete", T0)
    bad["requestReceivedTimestamp"] = "yesterday"
    good = event("good", "ResponseComplete", T0)

    rows, report = parse(jsonl(bad, good), name="t.log")

    assert [row.audit_id for row in rows] == ["good"]
    assert report.skipped == 1
    assert report.errors[0].startswith("t.log:1: ")


def test_a_file_of_only_bad_lines_is_an_input_error_naming_the_file():
    with pytest.raises(InputError, match="garbage.log"):
        parse(b"hello\nworld\n", name="garbage.log")


def test_nanosecond_timestamps_are_truncated_to_microseconds():
    e = event("nano", "ResponseComplete", T0)
    e["requestReceivedTimestamp"] = "2024-05-01T12:00:00.123456789Z"
    e["stageTimestamp"] = "2024-05-01T12:00:00.200000999Z"

    rows, report = parse(jsonl(e))

    assert report.skipped == 0
    (row,) = rows
    assert row.received == datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert row.completed == datetime(2024, 5, 1, 12, 0, 0, 200000, tzinfo=UTC)
    assert row.duration_ms == pytest.approx(76.544)


def test_a_timestamp_without_an_offset_is_read_as_utc():
    e = event("naive", "ResponseComplete", T0)
    e["requestReceivedTimestamp"] = "2024-05-01T12:00:00.250000"
    e["stageTimestamp"] = "2024-05-01T14:00:00.750000+02:00"

    rows, report = parse(jsonl(e))

    assert report.skipped == 0
    (row,) = rows
    assert row.received == datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)
    assert row.received.utcoffset() == timedelta(0)
    assert row.duration_ms == pytest.approx(500.0)


# --- progress ----------------------------------------------------------------------------------

@pytest.mark.parametrize("compressed", [False, True])
def test_progress_reports_increasing_byte_counts_up_to_the_size_on_disk(tmp_path, compressed):
    count = 12_000
    noise = random.Random(4096)
    # Lines of ~800 bytes of random names: bigger than the 1 MiB read buffer even gzipped.
    data = b"".join(
        line(event(f"p-{i}", "ResponseComplete", T0 + timedelta(microseconds=i),
                   requestURI=f"/api/v1/namespaces/default/pods/{noise.randbytes(150).hex()}"))
        + b"\n"
        for i in range(count)
    )
    if compressed:
        data = gzip.compress(data, compresslevel=1)
    path = tmp_path / "big.log"
    path.write_bytes(data)
    calls: list[tuple[int, int]] = []

    rows, _report = parse_path(path, progress=lambda done, rows: calls.append((done, rows)))

    assert len(rows) == count
    assert len(calls) >= count // 4096
    done = [c[0] for c in calls]
    assert done == sorted(done)
    assert done[0] < done[-1]
    assert done[-1] == path.stat().st_size
    counted = [c[1] for c in calls]
    assert counted == sorted(counted)
    assert counted[-1] == count
