"""Fuzzing the audit-log parsers: native JSON lines (``parse_audit``), its C scanner path
(``parse_audit_copy``, held equal to the Python parser on every input) and the legacy text format.
No database.

Valid lines are the real fixture events (``audit/``) with generated auditIDs, times and field
text; broken lines (cut, junk, invalid UTF-8, non-objects) are put between them. Every valid
line's request must come out, and only broken lines may be reported. See ``fuzzing``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
from datetime import datetime, timedelta

import orjson
import pytest

from timelines.parsers import InputError, Redactor, Report, audit, parse_audit
from timelines.parsers.base import parse_time
from timelines.parsers.envelopes import LEGACY_FORMAT

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
from .test_auditscan import assert_same, lines, request


def _fixture_events() -> list[dict]:
    events = []
    for path in sorted((FIXTURES / "audit").rglob("*")):
        if path.suffix not in (".log", ".json"):
            continue
        text = path.read_text(encoding="utf-8")
        try:
            values = [json.loads(text)]
        except json.JSONDecodeError:
            try:
                values = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError:
                continue  # falco's deliberately malformed trace
        for value in values:
            items = value.get("items", [value]) if isinstance(value, dict) else value
            events.extend(e for e in items if isinstance(e, dict) and "auditID" in e)
    return events


SAMPLE_LINES = [orjson.dumps(e) for e in _fixture_events()]
STRING_FIELDS = (("verb",), ("userAgent",), ("requestURI",), ("user", "username"),
                 ("objectRef", "namespace"), ("objectRef", "name"), ("objectRef", "resource"),
                 ("impersonatedUser", "username"), ("stage",))
STAGES = ["RequestReceived", "ResponseStarted", "ResponseComplete", "Panic", "Odd"]


def valid_event(rng: random.Random, number: int) -> dict:
    """A fixture event made a request of its own: a new auditID, maybe a new received time, odd
    text in some string fields, maybe another stage."""
    event = orjson.loads(rng.choice(SAMPLE_LINES))
    event["auditID"] = ident(rng, number)
    if rng.random() < 0.5:
        key = "requestReceivedTimestamp" if "requestReceivedTimestamp" in event else "timestamp"
        event[key] = rfc3339(moment(rng), rng)
    for _ in range(rng.randint(0, 3)):
        path = rng.choice(STRING_FIELDS)
        container = event
        for key in path[:-1]:
            if not isinstance(container.get(key), dict):
                container[key] = {}
            container = container[key]
        container[path[-1]] = rng.choice(STAGES) if path == ("stage",) else odd(rng)
    return event


def key_of(event: dict) -> tuple[str, datetime]:
    return event["auditID"], parse_time(event.get("requestReceivedTimestamp")
                                        or event["timestamp"])


def mixed_log(rng: random.Random) -> tuple[bytes, set, set[int]]:
    """Valid events and broken lines, framed; the requests' identities and the broken lines."""
    events = [valid_event(rng, n) for n in range(rng.randint(0, 6))]
    broken = [broken_line(rng, SAMPLE_LINES) for _ in range(rng.randint(0, 5))]
    data, broken_at = interleave([orjson.dumps(e) for e in events], broken, rng)
    return framed(data, rng), {key_of(e) for e in events}, broken_at


def test_mixed_valid_and_broken_lines_lose_no_request_and_blame_only_broken_lines():
    def check(case):
        data, keys, broken_at = case
        rows, report, error = parse_all(audit.FORMAT, data)
        assert {(r.audit_id, r.received) for r in rows} == keys
        assert bool(error) == (not keys)
        assert error_lines(report) <= broken_at

    fuzz(check, mixed_log)


# --- the C scanner -------------------------------------------------------------------------------

EDITS = [b"", b'"', b"}", b"{", b"\\", b"\\u00", b"\x00", b"\xc3", b"1", b",", b"\n", b" ", b"[",
         b"]", b'"stage":"Panic",', b'"code":1e3,', b"\xe2\x80\xa8", b'"auditID":5,', b"\r"]


def mutated_log(rng: random.Random) -> tuple[bytes, int | None]:
    """A mixed log, half of the time with bytes flipped, cut or inserted anywhere (lines that may
    still be JSON, events with a field of the wrong shape), and a block size for the scanner."""
    data = mixed_log(rng)[0]
    if data and data[:2] != b"\x1f\x8b" and rng.random() < 0.5:
        edited = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(edited) + 1)
            edited[at:at + rng.randint(0, 2)] = rng.choice(EDITS)
        data = bytes(edited)
    return data, rng.choice([None, None, 64, 700, 4096])


def load_scanner(path: str):
    """The C scanner built at ``path`` (by ``scripts/sanitize.sh``), as a module."""
    spec = importlib.util.spec_from_file_location("_auditscan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def scanner(monkeypatch):
    """The C scanner under test: the one built by ``scripts/native.sh``, or the build named by
    ``HINDSIGHT_AUDITSCAN`` (the sanitizers' build, see ``test_fuzz_sanitized``)."""
    if os.environ.get("HINDSIGHT_AUDITSCAN"):
        monkeypatch.setattr(audit, "_auditscan", load_scanner(os.environ["HINDSIGHT_AUDITSCAN"]))
    assert audit._auditscan is not None, "the C scanner is not built (scripts/native.sh)"
    return audit._auditscan


def test_the_c_scanner_gives_the_rows_of_the_python_parser_on_every_input(scanner):
    """``test_auditscan.assert_same``: rows column by column, bodies, skip reasons and
    redaction counts, whatever the block size."""
    fuzz(lambda case: assert_same(case[0], block=case[1]), mutated_log)


def test_the_c_scanner_decodes_a_uri_that_starts_with_an_escape(scanner):
    """Found by UBSan on the fuzzed inputs: the first URI a scanner decoded, starting with an
    escape, copied 0 bytes into a buffer not allocated yet (memcpy to NULL)."""
    random.seed(31)
    for uri in ("\\u0041", '"quoted"', "\u00e9x", "\\"):
        assert assert_same(lines(*request(requestURI=uri))) == 1


def test_arbitrary_bytes_are_skipped_or_refused_never_a_crash():
    def make(rng: random.Random) -> bytes:
        parts = [rng.randbytes(rng.randint(0, 60)) if rng.random() < 0.5 else
                 rng.choice(SAMPLE_LINES)[: rng.randint(0, 400)] for _ in range(rng.randint(0, 4))]
        return b"\n".join(parts)

    def check(data: bytes) -> None:
        try:
            list(parse_audit(io.BytesIO(data), Report("junk.log"), Redactor()))
        except InputError:
            pass

    fuzz(check, make)


# --- legacy text format ----------------------------------------------------------------------

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "get", "BREW"]
URIS = ["/api/v1/namespaces/default/pods", "/api/v1/nodes/n1", "/healthz", "/apis", "",
        "/apis/apps/v1/namespaces/p/deployments/d/scale", "/api/v1/watch/pods", "/api/v1",
        "/api/v1/pods?watch=1&fieldSelector=metadata.name%3Dx", "/api/v1/namespaces/ns/status",
        "/api/v1/namespaces/ns/pods/p/proxy/a/b", "/api/v1/proxy", "/apis/g/v1/watch"]


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _line(stamp: str, fields: dict[str, str]) -> bytes:
    return (f"{stamp} AUDIT: " + " ".join(f"{k}={_quoted(v)}" for k, v in fields.items())
            ).encode()


def legacy_request(rng: random.Random, number: int) -> tuple[list[bytes], tuple]:
    """The lines of one request in either generation of the legacy format, and its identity."""
    audit_id = ident(rng, number)
    when = moment(rng)
    stamp = rfc3339(when, rng)
    fields = {"ip": odd(rng), "method": rng.choice(METHODS), "user": odd(rng),
              "groups": odd(rng), "as": rng.choice(["<self>", odd(rng)]), "namespace": odd(rng),
              "uri": rng.choice(URIS) if rng.random() < 0.8 else odd(rng)}
    if rng.random() < 0.5:  # 1.8+: a line per stage, each with the received time
        lines = []
        for _ in range(rng.randint(1, 3)):
            stage = rng.choice(STAGES[:4])
            response = "<deferred>" if stage == "RequestReceived" else str(rng.randint(100, 599))
            lines.append(_line(stamp, {"id": audit_id, "stage": stage, **fields,
                                       "user-agent": odd(rng), "response": response}))
    else:
        lines = [_line(stamp, {"id": audit_id, **fields})]
        if rng.random() < 0.5:
            answered = when + timedelta(milliseconds=rng.randint(0, 9999))
            lines.append(_line(rfc3339(answered, rng), {"id": audit_id, "response": "200"}))
    return lines, (audit_id, parse_time(stamp))


def legacy_log(rng: random.Random) -> tuple[bytes, set, set[int]]:
    requests = [legacy_request(rng, n) for n in range(rng.randint(0, 5))]
    # Cut JSON lines rather than cut legacy lines: a legacy line cut after a field is one still.
    broken = [broken_line(rng, SAMPLE_LINES) for _ in range(rng.randint(0, 4))]
    data, broken_at = interleave([line for lines, _ in requests for line in lines], broken, rng)
    return framed(data, rng), {key for _, key in requests}, broken_at


def test_legacy_lines_between_broken_lines_are_all_read():
    def check(case):
        data, keys, broken_at = case
        rows, report, error = parse_all(LEGACY_FORMAT, data)
        assert {(r.audit_id, r.received) for r in rows} == keys
        assert bool(error) == (not keys)
        assert error_lines(report) <= broken_at

    fuzz(check, legacy_log)
