"""The C scanner of audit logs (``parsers/_auditscan.c`` through ``audit.parse_audit_copy``)
against the Python parser it stands in for: for every input, the two must store the same rows,
column by column, with the same bodies, skip reasons and redaction counts. No database.

``parse_audit`` is the reference; the scanner's COPY text is read back here into column values
(the store's COPY format, ``store._COPY_COLUMNS``), and the Python rows are put through the
store's own ``_copy_text`` into the same form.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from timelines.ingest import store
from timelines.parsers import InputError, Redactor, Report, audit, parse_audit
from timelines.parsers.base import CopyRows

from .test_parser import AUDIT_FIXTURES

pytestmark = pytest.mark.skipif(
    audit._auditscan is None and os.environ.get("CI") != "true",
    reason="the C scanner is not built (scripts/native.sh)",
)

HEAD, MID = store.copy_affixes(7, 9, "node-1.log")
_UNESCAPE = {"\\\\": "\\", "\\t": "\t", "\\n": "\n", "\\r": "\r"}


def test_the_scanner_is_built_on_ci():
    """CI builds it (scripts/setup.sh): a missing compiler must not go unnoticed there."""
    assert audit._auditscan is not None


def _unescape(field: str) -> str | None:
    if field == "\\N":
        return None
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\":
            out.append(_UNESCAPE[field[i:i + 2]])
            i += 2
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _records(text: str, bodies: dict[int, list[bytes]]) -> dict[tuple, list[dict]]:
    """COPY text rows as {(audit_id, received): [{column: value}, …]} (a request repeated in a
    file has a row per final stage; the store merges them), with each row's body, in line
    order."""
    records = {}
    for line in text.split("\n"):
        if not line:
            continue
        values = [_unescape(v) for v in line.split("\t")]
        assert len(values) == len(store._COPY_COLUMNS), line
        record = dict(zip(store._COPY_COLUMNS, values, strict=True))
        record["body"] = bodies[int(record.pop("body_chunk"))][int(record.pop("body_index"))]
        for name in ("received", "completed"):
            if record[name] is not None:
                record[name] = datetime.fromisoformat(record[name])
        if record["duration_ms"] is not None:
            record["duration_ms"] = float(record["duration_ms"])
        record["annotations"] = json.loads(record["annotations"])
        records.setdefault((record["audit_id"], record["received"]), []).append(record)
    for same in records.values():
        same.sort(key=lambda r: int(r["line"]))
    return records


def _python(data: bytes, name: str = "node-1.log", redactor: Redactor | None = None):
    report = Report(name)
    try:
        rows = list(parse_audit(io.BytesIO(data), report, redactor or Redactor()))
    except InputError as exc:
        return str(exc), report, 0
    ids = itertools.count(1)
    bodies, texts = {}, []
    for start in range(0, len(rows), store.CHUNK_ROWS):
        part = rows[start:start + store.CHUNK_ROWS]
        chunk = next(ids)
        bodies[chunk] = [r.raw for r in part]
        texts.append(store._copy_text(7, 9, part, [chunk]))
    return _records("".join(texts), bodies), report, len(rows)


def _scanned(data: bytes, name: str = "node-1.log", redactor: Redactor | None = None,
             block: int | None = None):
    """Rows of ``parse_audit_copy``: CopyRows and Rows alike, as records; and how many of them
    came from C."""
    report = Report(name)
    ids = itertools.count(1000)
    head, mid = store.copy_affixes(7, 9, name)
    kwargs = dict(copy_head=head, copy_mid=mid, next_chunk_id=lambda: next(ids), chunk_rows=3)
    if block is not None:
        original = audit.open_blocks
        audit.open_blocks = lambda raw, report, lines_read: original(raw, report, lines_read,
                                                                      block)
    try:
        items = list(audit.parse_audit_copy(io.BytesIO(data), report, redactor or Redactor(),
                                            **kwargs))
    except InputError as exc:
        return str(exc), report, 0, 0
    finally:
        if block is not None:
            audit.open_blocks = original
    texts, bodies, rows, from_c = [], {}, 0, 0
    python_rows = []
    for item in items:
        if isinstance(item, CopyRows):
            texts.append(item.text.decode())
            for chunk, lines in item.bodies:
                bodies[chunk] = lines.split(b"\n")
            rows += item.rows
            from_c += item.rows
        else:
            python_rows.append(item)
            rows += 1
    chunk = next(ids)
    bodies[chunk] = [r.raw for r in python_rows]
    texts.append(store._copy_text(7, 9, python_rows, [chunk] * (len(python_rows) // 500 + 1)))
    return _records("".join(texts), bodies), report, rows, from_c


def assert_same(data: bytes, name: str = "node-1.log", redactor_args: dict | None = None,
                block: int | None = None) -> int:
    """Both paths agree on ``data``; returns how many rows the C scanner made."""
    expected, expected_report, expected_rows = _python(data, name,
                                                       Redactor(**(redactor_args or {})))
    got, report, rows, from_c = _scanned(data, name, Redactor(**(redactor_args or {})), block)
    assert rows == expected_rows
    if isinstance(expected, str):  # nothing usable: the same error
        assert got == expected
        return from_c
    assert got.keys() == expected.keys()
    for key, record in expected.items():
        assert got[key] == record, key
    assert (report.skipped, report.redacted) == (expected_report.skipped,
                                                 expected_report.redacted)
    assert sorted(report.errors) == sorted(expected_report.errors)
    return from_c


@pytest.mark.parametrize("name", AUDIT_FIXTURES)
def test_every_fixture_gives_the_rows_of_the_python_parser(fixtures_dir, name):
    assert_same((fixtures_dir / name).read_bytes(), Path(name).name)


def test_the_real_logs_are_read_in_c(fixtures_dir):
    """Not a fallback in disguise: every final stage of a current-format log (with
    requestReceivedTimestamp) that holds nothing to redact is the scanner's. The 2017 log of
    audit2rbac has only ``timestamp`` and is read by Python."""
    data = (fixtures_dir / "audit" / "openshift-requestresponse.log").read_bytes()
    redactor = Redactor()
    ordinary = [line for line in data.splitlines() if line.strip()
                and json.loads(line)["stage"] in ("ResponseComplete", "Panic")
                and "requestReceivedTimestamp" in json.loads(line)
                and not redactor.needs_walk(json.loads(line), line)]
    assert assert_same(data) >= len(ordinary) > 0


# --- built inputs ------------------------------------------------------------------------------

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def event(stage: str = "ResponseComplete", **fields) -> dict:
    value = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": str(uuid.UUID(int=random.getrandbits(128))), "stage": stage,
        "requestURI": "/api/v1/namespaces/default/pods/web-0", "verb": "get",
        "user": {"username": "system:admin", "groups": ["system:masters",
                                                       "system:authenticated"]},
        "sourceIPs": ["10.0.0.1"], "userAgent": "kubectl/v1.30.0",
        "objectRef": {"resource": "pods", "namespace": "default", "name": "web-0",
                      "apiVersion": "v1"},
        "responseStatus": {"metadata": {}, "code": 200},
        "requestReceivedTimestamp": "2024-05-01T12:00:00.123456Z",
        "stageTimestamp": "2024-05-01T12:00:00.125000Z",
        "annotations": {"authorization.k8s.io/decision": "allow"},
    }
    value.update(fields)
    return {k: v for k, v in value.items() if v is not ...}


def lines(*events, raw: list[bytes] = ()) -> bytes:
    return b"\n".join([orjson.dumps(e) for e in events] + list(raw)) + b"\n"


def request(**fields) -> list[dict]:
    final = event(**fields)
    received = {k: v for k, v in final.items() if k not in
                ("responseStatus", "annotations", "stageTimestamp")}
    return [dict(received, stage="RequestReceived",
                 stageTimestamp=final["requestReceivedTimestamp"]), final]


ODD_EVENTS = [
    # escapes in every kind of field, as Go writes them
    dict(requestURI="/api/v1/pods?labelSelector=app%3Dweb\u0026limit=500",
         userAgent='kubectl "quoted" \\ back\tslash', verb="list"),
    dict(objectRef={"resource": "pods", "namespace": "d\u00e9faut", "name": "snow\u2603man",
                    "apiVersion": "v1", "uid": "u-1", "resourceVersion": "42",
                    "subresource": "status", "apiGroup": ""}),
    dict(objectRef={"resource": "deployments", "apiVersion": "apps/v1beta1", "name": "x"}),
    dict(objectRef={"resource": "deployments", "apiGroup": "apps", "apiVersion": "v1"}),
    dict(objectRef=None, responseStatus=None, user=None, annotations=None, sourceIPs=None),
    dict(objectRef=..., responseStatus=..., user=..., annotations=..., sourceIPs=...,
         userAgent=..., verb=..., level=..., requestURI=...),
    dict(user={"username": "a,b", "groups": ['g "1"', "g\\2", "g,3", "g{4}", "", "\u00e9"]}),
    dict(user={"username": "u", "groups": []}, impersonatedUser={"username": "imp"}),
    dict(user={"username": "u", "groups": None}, impersonatedUser=None),
    dict(sourceIPs=[], responseStatus={"code": 201.0}),
    dict(sourceIPs="10.9.9.9", responseStatus={"code": -1}),
    dict(sourceIPs=[None, "10.1.1.1"], responseStatus={"status": "Failure"}),
    dict(annotations={"a": "tab\there", "b": "nl\nhere", "c": "back\\slash", "d": "\u00e9"}),
    dict(annotations="not an object"),
    dict(annotations=["a list"]),
    dict(annotations={"nul": "x\u0000y"}),
    dict(annotations={"emoji": "\U0001f600"}, userAgent="\U0001f600"),
    dict(verb="with\u0000nul", userAgent="\u0001ctl"),
    dict(requestReceivedTimestamp="2024-05-01T12:00:00Z",
         stageTimestamp="2024-05-01T12:00:00.000001Z"),
    dict(requestReceivedTimestamp="2024-05-01T12:00:00.123456789Z",
         stageTimestamp="2024-05-01T14:00:00.987654321+02:00"),
    dict(requestReceivedTimestamp="2024-02-29T23:59:59.5-05:30",
         stageTimestamp="2024-03-01T05:30:00.25Z"),
    dict(requestReceivedTimestamp="2024-05-01 12:00:00Z"),
    dict(requestReceivedTimestamp="2024-05-01T12:00:00.1+0200"),
    dict(stageTimestamp=...),
    dict(stageTimestamp=""),
    dict(stageTimestamp="yesterday"),
    dict(requestReceivedTimestamp="2023-02-29T00:00:00Z"),
    dict(stage="Panic", responseStatus={"code": 500}),
    dict(kind=None, apiVersion=None),
    dict(kind="EventList"),
    dict(apiVersion="audit.k8s.io/v1beta1", timestamp="2024-05-01T12:00:00Z"),
    dict(apiVersion="v1"),
    dict(verb=5),
    dict(user={"username": "u", "groups": "system:masters"}),
    dict(user={"username": "u", "groups": ["ok", 5]}),
    dict(responseStatus={"code": True}),
    dict(responseStatus={"code": 99999999999}),
    dict(objectRef={"resource": "secrets", "name": "s"},
         responseObject={"kind": "Secret", "data": {"password": "aHVudGVyMg=="}}),
    dict(objectRef={"resource": "configmaps", "name": "c"},
         requestObject={"kind": "ConfigMap", "data": {"db_password": "hunter2", "plain": "x"}}),
    # sensitive resources: walked when they carry objects the redactor reads by kind
    dict(objectRef={"resource": "secrets", "namespace": "d"}, verb="list"),
    dict(objectRef={"resource": "configmaps", "name": "c"}, verb="delete", requestObject=None),
    dict(objectRef={"resource": "serviceaccounts", "name": "sa"},
         requestObject={"kind": "ServiceAccount", "metadata": {"name": "sa"}}),
    dict(objectRef={"resource": "serviceaccounts", "name": "sa"},
         requestObject={"kind": "Secret", "data": {"token": "c2VjcmV0"}}),
    dict(objectRef={"resource": "serviceaccounts", "name": "sa", "subresource": "token"},
         responseObject={"kind": "TokenRequest", "status": {"token": "opaque"}}),
    dict(objectRef={"resource": "serviceaccounts", "name": "sa"},
         requestObject={"kind": "ServiceAccount", "metadata": {"annotations": {
             "kubectl.kubernetes.io/last-applied-configuration":
                 '{"kind":"Secret","data":{"a":"b"}}'}}}),
    dict(requestURI="/api/v1/pods?watch=1&access_token=abc.def"),
    dict(requestURI="/api/v1/pods?watch=1\u0026Token=abc"),
    dict(requestURI="/api/v1/pods?code=1"),
    dict(requestURI="/api/v1/pods?codes=1"),
    dict(user={"username": "u", "extra": {"t": ["Bearer abcdefghijklmnop"]}}),
    dict(userAgent="eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"),
    dict(requestObject={"deep": [[[[{"a": [1, 2.5e-3, -0.0, True, False, None, "x"]}]]]]}),
]


@pytest.mark.parametrize("fields", ODD_EVENTS, ids=range(len(ODD_EVENTS)))
def test_odd_fields_give_the_rows_of_the_python_parser(fields):
    random.seed(len(str(fields)))
    assert_same(lines(*request(**fields)))


def test_unicode_escapes_as_go_and_python_write_them():
    random.seed(2)
    received, final = (orjson.dumps(e) for e in request(verb="VERB", userAgent="AGENT"))
    for escaped in (rb"\ud83d\ude00", rb"\u00e9\u2603", rb"\ud83d", rb"\ude00x", rb"\u0000"):
        data = received + b"\n" + final.replace(b"VERB", escaped).replace(
            b'"AGENT"', b'"' + escaped + b'"') + b"\n"
        assert_same(data)
    annotated = final.replace(b'"allow"', rb'"\ud83d\ude00 \u00e9 \ud800"')
    assert_same(received + b"\n" + annotated + b"\n")
    for version in (rb"apps\u002fv1beta1", rb"apps\/v1beta1", rb"a\u002fb/v1"):  # v1alpha1
        grouped = final.replace(b'"apiVersion":"v1"', b'"apiVersion":"' + version + b'"')
        assert grouped != final
        assert assert_same(received + b"\n" + grouped + b"\n") == 1


def test_a_secret_in_a_final_stage_is_redacted_and_closes_its_request():
    events = request(objectRef={"resource": "secrets", "name": "s"},
                     responseObject={"kind": "Secret", "data": {"token": "c2VjcmV0"}})
    data = lines(*events)
    assert assert_same(data) == 0
    got, report, rows, _ = _scanned(data)
    assert rows == 1 and report.redacted == 1
    assert b"c2VjcmV0" not in next(iter(got.values()))[0]["body"]


def test_redaction_off_and_extra_paths():
    events = request(objectRef={"resource": "secrets", "name": "s"},
                     responseObject={"kind": "Secret", "data": {"token": "c2VjcmV0"}},
                     userAgent="Bearer abcdefghijklmnop")
    data = lines(*events)
    assert assert_same(data, redactor_args={"enabled": False}) == 1
    assert assert_same(data, redactor_args={"extra_paths": ["userAgent"]}) == 0


MALFORMED = [
    b'{"kind": "Event", "auditID": "x"',
    b"not json at all",
    b'{"auditID": "a", "stage": "ResponseComplete", "requestReceivedTimestamp": 5}',
    b"\xff\xfe invalid utf-8",
    b'{"kind":"Event","auditID":"a\xc3\x28","stage":"RequestReceived"}',
    b'{"kind":"Event","auditID":"a","stage":"ResponseComplete",'
    b'"requestReceivedTimestamp":"2024-05-01T12:00:00Z","x":01}',
    b'{"kind":"Event","auditID":"a","stage":"ResponseComplete",'
    b'"requestReceivedTimestamp":"2024-05-01T12:00:00Z","x":"\\q"}',
    b'{"kind":"Event","auditID":"a","stage":"ResponseComplete",'
    b'"requestReceivedTimestamp":"2024-05-01T12:00:00Z","x":[1,]}',
    b'{"kind":"Event","auditID":"a","stage":"ResponseComplete",'
    b'"requestReceivedTimestamp":"2024-05-01T12:00:00Z"} trailing',
    b'{"kind":"Event","auditID":"\\u0061","stage":"ResponseComplete",'
    b'"requestReceivedTimestamp":"2024-05-01T12:00:00Z","stageTimestamp":"2024-05-01T12:00:01Z"}',
    b'{"kind":"Event","a\\u0075ditID":"b","stage":"ResponseComplete",'
    b'"requestReceivedTimestamp":"2024-05-01T12:00:00Z","stageTimestamp":"2024-05-01T12:00:01Z"}',
    b"[" * 300 + b"]" * 300,
    b"   ",
    b"[]",
    b'"a string"',
]


def test_malformed_lines_are_skipped_with_the_python_reasons_and_neighbours_kept():
    random.seed(3)
    good = request() + request(verb="delete")
    data = lines(good[0], raw=MALFORMED[:1]) + lines(*good[1:], raw=MALFORMED[1:])
    assert assert_same(data) == 2


def test_stages_split_over_files_lines_and_blocks():
    """A request's stages far apart (other blocks), out of order, repeated, or never finished."""
    random.seed(5)
    requests = [request(verb=f"v{i}") for i in range(60)]
    events = [first for first, _ in requests] + [final for _, final in requests[:50]]
    events.append(requests[0][1])  # a final stage twice
    started = dict(requests[51][0], stage="ResponseStarted")
    events += [started, dict(requests[52][0], stage="ResponseStarted"), requests[52][0]]
    events.insert(0, requests[53][1])  # the final before its RequestReceived
    data = lines(*events)
    for block in (None, 700, 5000):
        assert_same(data, block=block)


def test_a_final_stage_left_to_python_closes_the_request_the_scanner_opened():
    random.seed(7)
    received, final = request()
    final = dict(final, stageTimestamp="2024-05-01 12:00:01Z")  # the Python path reads it
    got, _report, rows, from_c = _scanned(lines(received, final))
    assert (rows, from_c) == (1, 0)
    assert next(iter(got.values()))[0]["completed"] is not None


def test_gzip_and_truncated_gzip_keep_the_lines_before_the_damage():
    random.seed(11)
    events = [e for i in range(400) for e in request(verb=f"v{i}")]
    data = lines(*events)
    packed = gzip.compress(data)
    assert_same(packed, block=4096)
    assert_same(packed[: len(packed) * 2 // 3], block=4096)


def test_bom_crlf_and_blank_lines():
    random.seed(13)
    a, b = request(), request()
    data = b"\xef\xbb\xbf" + lines(*a).replace(b"\n", b"\r\n") + b"\n  \n\t\n" + lines(*b)
    assert assert_same(data) == 2


def test_a_pretty_printed_document_takes_the_python_path():
    random.seed(17)
    data = json.dumps({"kind": "EventList", "items": request()}, indent=2).encode()
    assert assert_same(data) == 0


def test_fuzzed_lines_never_disagree():
    """Random corruptions of real-looking lines: cut, byte flips, inserted quotes and braces."""
    rng = random.Random(19)
    random.seed(19)
    base = [orjson.dumps(e) for fields in ODD_EVENTS[:20] for e in request(**fields)]
    corrupted = []
    for line in base * 3:
        line = bytearray(line)
        for _ in range(rng.randint(0, 3)):
            at = rng.randrange(len(line))
            line[at:at + 1] = rng.choice([b"", b'"', b"}", b"\\", b"\x00", b"\xc3", b"1", b","])
        corrupted.append(bytes(line))
    rng.shuffle(corrupted)
    assert_same(b"\n".join(corrupted) + b"\n")


def test_large_synthetic_log_is_read_in_c():
    random.seed(23)
    start = T0
    events = []
    for i in range(3000):
        received = start + timedelta(microseconds=i * 357)
        done = received + timedelta(microseconds=1000 + i)
        pair = request(verb="get", requestReceivedTimestamp=received.strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"), stageTimestamp=done.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        events.extend(pair)
    assert assert_same(lines(*events), block=64 * 1024) == 3000


def test_a_last_line_without_newline_and_lines_longer_than_a_block():
    random.seed(29)
    data = lines(*request(), *request(verb="x"), *request(verb="y")).rstrip(b"\n")
    for block in (None, 7, 64, 300):
        assert assert_same(data, block=block) == 3
