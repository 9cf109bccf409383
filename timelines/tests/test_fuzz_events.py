"""Fuzzing the parser of Kubernetes Event objects: JSON lines of Events and of watch events, and
multi-document YAML streams, with broken lines or documents between them. No database.

Valid units are the real fixture Events (``events/``: the kspan YAML stream, the cribl watch
stream, the insights-operator list) with generated uids, times and text. Each unit read alone is
the reference: its row must come out of the mixed file too, and only broken lines may be
reported. See ``fuzzing``.
"""

from __future__ import annotations

import json
import random

import orjson
import yaml

from timelines.parsers import events

from .fuzzing import (
    FIXTURES,
    broken_line,
    error_lines,
    fuzz,
    ident,
    moment,
    odd,
    parse_all,
    rfc3339,
)
from .test_fuzz_envelopes import check_mixed


def _fixture_events() -> list[bytes]:
    found = []
    for document in yaml.safe_load_all((FIXTURES / "events" / "kspan-deployment-2-pods.yaml")
                                       .read_text(encoding="utf-8")):
        if isinstance(document, dict) and document.get("kind") == "Event":
            found.append(document)
    for item in json.loads((FIXTURES / "events" / "cribl-event-watch-stream.json").read_text()):
        raw = json.loads(item["_raw"]) if isinstance(item.get("_raw"), str) else None
        if isinstance(raw, dict) and isinstance(raw.get("object"), dict) and \
                raw["object"].get("kind") == "Event":
            found.append(raw["object"])
    found += json.loads((FIXTURES / "events" / "insights-openshift-machine-api.json")
                        .read_text())["items"]
    return [orjson.dumps(e, default=str) for e in found]


EVENTS = _fixture_events()
TIME_FIELDS = ("firstTimestamp", "lastTimestamp", "eventTime")


def event_unit(rng: random.Random, unit: int, as_yaml: bool) -> bytes:
    event = orjson.loads(rng.choice(EVENTS))
    if isinstance(event.get("metadata"), dict):
        event["metadata"]["uid"] = ident(rng, unit)
        event["metadata"]["name"] = odd(rng)
    event["message" if "message" in event or "note" not in event else "note"] = (
        f"{ident(rng, unit)} {odd(rng)}")
    event["reason"] = odd(rng)
    when = moment(rng)
    for key in TIME_FIELDS:
        if event.get(key) and rng.random() < 0.5:
            event[key] = rfc3339(when, rng) if key != "eventTime" else when.strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ")
    value = {"type": rng.choice(["ADDED", "MODIFIED"]), "object": event} \
        if rng.random() < 0.3 else event
    if as_yaml:
        return yaml.dump(value, Dumper=yaml.CSafeDumper, allow_unicode=rng.random() < 0.5,
                         width=rng.choice([80, 10**6])).encode().rstrip(b"\n")
    return orjson.dumps(value)


def test_events_between_broken_lines_and_documents_are_all_read():
    samples = EVENTS

    def make(rng: random.Random):
        as_yaml = rng.random() < 0.25
        units = [event_unit(rng, n, as_yaml) for n in range(rng.randint(0, 3))]
        broken = [broken_line(rng, samples) for _ in range(rng.randint(0, 4))]
        return units, broken, rng, (b"---" if as_yaml else None)

    fuzz(lambda case: check_mixed(events.FORMAT, *case), make)


def test_a_damaged_line_before_json_lines_loses_no_event():
    """Found by the fuzzing above: junk as the first line made a file of JSON lines YAML (every
    Event lost); a lone ``{`` before a line took that line into a document that never closed
    (its Event lost); an error was blamed on the line after a cut one."""
    event = orjson.loads(EVENTS[0])
    line = orjson.dumps(event)
    expected = parse_all(events.FORMAT, line + b"\n")[0]
    assert len(expected) == 1
    for data, broken in ((b"\x00\x00\n" + line + b"\n", {1}),
                         (b"xjunk\r\n" + line + b"\r\n", {1}),
                         (line + b"\n{\n" + line.replace(b'"uid":"', b'"uid":"2') + b"\n", {2}),
                         (line[:40] + b"\r\n" + line + b"\r\n", {1})):
        rows, report, error = parse_all(events.FORMAT, data)
        assert {r.audit_id for r in expected} <= {r.audit_id for r in rows}, data
        assert error == "" and error_lines(report) == broken, report.errors
