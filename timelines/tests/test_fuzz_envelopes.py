"""Fuzzing the parsers of evidence in envelopes: EKS CloudWatch pages and subscription payloads,
AKS diagnostic records, OpenTelemetry logs, GKE audit entries and GKE node logs (JSON lines and
YAML documents). No database.

Valid units are built from the real fixtures (``wrapped/``, ``gke/``, and the native events of
``audit/`` inside the envelopes) with generated identities, times and text; broken lines or
documents go between them. Each unit read alone is the reference: every row it gives must come
out of the mixed file too, and only broken lines may be reported. See ``fuzzing``.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import orjson
import yaml

from timelines.parsers import gke, gke_logs
from timelines.parsers.envelopes import AKS_FORMAT, EKS_FORMAT, OTLP_FORMAT

from .fuzzing import (
    FIXTURES,
    broken_line,
    error_lines,
    framed,
    fuzz,
    ident,
    interleave,
    moment,
    odd,
    parse_all,
    rfc3339,
)
from .test_fuzz_audit import SAMPLE_LINES, valid_event


def check_mixed(fmt, units: list[bytes], broken: list[bytes], rng: random.Random,
                separator: bytes | None = None) -> None:
    """Every row of each unit read alone comes out of the units and broken blocks mixed."""
    alone = set()
    for unit in units:
        rows, report, error = parse_all(fmt, unit + b"\n")
        assert rows and not error and not report.errors, (unit, error, report.errors)
        alone |= {(r.kind, r.audit_id, r.received) for r in rows}
    data, broken_at = interleave(units, broken, rng, separator)
    rows, report, error = parse_all(fmt, framed(data, rng))
    assert alone <= {(r.kind, r.audit_id, r.received) for r in rows}
    assert bool(error) == (not units)
    assert error_lines(report) <= broken_at


def _broken(rng: random.Random, count: int = 4) -> list[bytes]:
    return [broken_line(rng, SAMPLE_LINES) for _ in range(rng.randint(0, count))]


def _events(rng: random.Random, unit: int) -> list[dict]:
    return [valid_event(rng, unit * 10 + i) for i in range(rng.randint(1, 3))]


# --- EKS, AKS, OTLP ------------------------------------------------------------------------------

def eks_unit(rng: random.Random, unit: int) -> bytes:
    messages = [{"id": str(rng.randrange(10**20)), "timestamp": rng.randrange(2**41),
                 "message": json.dumps(event) if rng.random() < 0.5 else orjson.dumps(
                     event).decode(), "logStreamName": f"kube-apiserver-audit-{odd(rng)}"}
                for event in _events(rng, unit)]
    if rng.random() < 0.5:
        container = {"events": messages, "searchedLogStreams": [], "nextToken": odd(rng)}
    else:
        container = {"messageType": "DATA_MESSAGE", "owner": "123456789012",
                     "logGroup": "/aws/eks/c/cluster", "logStream": odd(rng),
                     "subscriptionFilters": ["f"], "logEvents": messages}
    return orjson.dumps(container)


AKS_RECORD = json.loads((FIXTURES / "wrapped" / "aks-eventhub-record.json")
                        .read_text(encoding="utf-8-sig"))


def aks_unit(rng: random.Random, unit: int) -> bytes:
    records = []
    for event in _events(rng, unit):
        record = copy.deepcopy(AKS_RECORD)
        record["properties"]["log"] = orjson.dumps(event).decode()
        record["properties"]["pod"] = odd(rng)
        record["category"] = rng.choice(["kube-audit", "kube-audit-admin"])
        if rng.random() < 0.2:
            record["properties"] = json.dumps(record["properties"])  # stringified by a pipeline
        records.append(record)
    return orjson.dumps({"records": records} if rng.random() < 0.7 or len(records) > 1
                        else records[0])


def _any_value(value: Any) -> dict:
    """A plain value as an OTLP ``AnyValue``."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _any_value(v)}
                                           for k, v in value.items()]}}
    return {}


def otlp_unit(rng: random.Random, unit: int) -> bytes:
    records = []
    for event in _events(rng, unit):
        body = (_any_value(event) if rng.random() < 0.3
                else {"stringValue": orjson.dumps(event).decode()})
        records.append({"timeUnixNano": str(rng.randrange(2**62)), "body": body,
                        "attributes": [{"key": odd(rng), "value": {"stringValue": odd(rng)}}]})
    scope = "scopeLogs" if rng.random() < 0.8 else "instrumentationLibraryLogs"
    return orjson.dumps({"resourceLogs": [{"resource": {"attributes": []},
                                           scope: [{"scope": {}, "logRecords": records}]}]})


def _check_envelope(fmt, make_unit):
    def make(rng: random.Random):
        return [make_unit(rng, n) for n in range(rng.randint(0, 4))], _broken(rng), rng

    fuzz(lambda case: check_mixed(fmt, *case), make)


def test_eks_pages_and_payloads_between_broken_lines_are_all_read():
    _check_envelope(EKS_FORMAT, eks_unit)


def test_aks_records_between_broken_lines_are_all_read():
    _check_envelope(AKS_FORMAT, aks_unit)


def test_otlp_documents_between_broken_lines_are_all_read():
    _check_envelope(OTLP_FORMAT, otlp_unit)


# --- GKE audit and node logs ---------------------------------------------------------------------

def _yaml_entries(folder: str, skip: str = "") -> list[dict]:
    entries = []
    for path in sorted((FIXTURES / "gke" / folder).glob("*.yaml")):
        if skip and path.name.endswith(skip):
            continue
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(document, dict):
                entries.append(document)
    return entries


GKE_ENTRIES = [orjson.dumps(e, default=str) for e in _yaml_entries("k8s_audit", "_manifest.yaml")
               + _yaml_entries("gke_audit")]
NODE_ENTRIES = [orjson.dumps(e, default=str) for e in _yaml_entries("k8s_node")]


def _as_text(entry: dict, rng: random.Random, as_yaml: bool) -> bytes:
    if as_yaml:
        return yaml.dump(entry, Dumper=yaml.CSafeDumper, allow_unicode=rng.random() < 0.5,
                         width=rng.choice([80, 10**6])).encode().rstrip(b"\n")
    return orjson.dumps(entry)


def gke_unit(rng: random.Random, unit: int, as_yaml: bool) -> bytes:
    entry = orjson.loads(rng.choice(GKE_ENTRIES))
    entry["insertId"] = ident(rng, unit)
    if isinstance(entry.get("operation"), dict):
        entry["operation"]["id"] = ident(rng, unit)
    entry["timestamp"] = rfc3339(moment(rng), rng)
    payload = entry["protoPayload"]
    payload.setdefault("authenticationInfo", {})["principalEmail"] = odd(rng)
    payload.setdefault("requestMetadata", {})["callerSuppliedUserAgent"] = odd(rng)
    entry.setdefault("labels", {})[odd(rng)] = odd(rng)
    return _as_text(entry, rng, as_yaml)


def node_unit(rng: random.Random, unit: int, as_yaml: bool) -> bytes:
    entry = orjson.loads(rng.choice(NODE_ENTRIES))
    entry["insertId"] = ident(rng, unit)
    entry["timestamp"] = rfc3339(moment(rng), rng)
    if "textPayload" in entry or rng.random() < 0.3:
        entry.pop("jsonPayload", None)
        entry["textPayload"] = odd(rng)
    else:
        entry["jsonPayload"]["MESSAGE"] = odd(rng)
    entry.setdefault("resource", {}).setdefault("labels", {})["node_name"] = odd(rng)
    return _as_text(entry, rng, as_yaml)


def _check_gke(fmt, make_unit):
    def make(rng: random.Random):
        as_yaml = rng.random() < 0.25
        units = [make_unit(rng, n, as_yaml) for n in range(rng.randint(0, 3))]
        return units, _broken(rng), rng, (b"---" if as_yaml else None)

    fuzz(lambda case: check_mixed(fmt, *case), make)


def test_gke_audit_entries_between_broken_lines_and_documents_are_all_read():
    _check_gke(gke.FORMAT, gke_unit)


def test_gke_node_log_entries_between_broken_lines_and_documents_are_all_read():
    _check_gke(gke_logs.FORMAT, node_unit)


def test_a_damaged_first_line_does_not_make_a_json_file_yaml():
    """Found by the fuzzing above: a JSON-lines export whose first line was junk (or ``-``) was
    read as one YAML document, and every entry in it lost."""
    entries = [orjson.loads(GKE_ENTRIES[0]), orjson.loads(NODE_ENTRIES[0])]
    for fmt, entry in zip((gke.FORMAT, gke_logs.FORMAT), entries, strict=True):
        expected = len(parse_all(fmt, orjson.dumps(entry))[0])
        assert expected == 1
        for first in (b"xI\x1033g\x0e2Q", b"-", b"key: value", b"\xef\xbb\xbf"):
            data = first + b"\n" + orjson.dumps(entry) + b"\n"
            rows, report, error = parse_all(fmt, data)
            assert (len(rows), error) == (1, ""), (first, report.errors)
