"""One rule for text on every write path: every control character (0x00-0x1F, 0x7F) and the
backslash, in every text field, is stored as it was read, except NUL, which neither PostgreSQL
text nor jsonb can hold: it becomes U+FFFD and the upload says how many values held one.

The write paths: the C scanner's COPY rows, the Python COPY (straight, and through the staging
table's merge), the bulk load's table, and SQLite (the tests marked ``embedded``, run in the
SQLite pass). Expected values are the inputs themselves.
"""

from __future__ import annotations

import io
import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from incidents.models import Incident, Upload
from timelines.ingest import bulk, store
from timelines.models import Event
from timelines.parsers import Redactor, Report, Row, audit
from timelines.parsers.base import CopyRows

CHARS = [chr(code) for code in range(0x20)] + ["\x7f", "\\"]
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
TEXT_FIELDS = store._TEXT_FIELDS


def stored(value):
    """What the store keeps of a value: NUL replaced, everything else as it is."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {stored(k): stored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [stored(v) for v in value]
    return value


# --- every text field of a row, through the store's write paths ------------------------------

def rows_with_every_char() -> list[Row]:
    rows = []
    for n, char in enumerate(CHARS):
        text = {field: f"{field}<{char}>{n}" for field in TEXT_FIELDS}
        text["audit_id"] = f"id-{n}<{char}>"
        rows.append(Row(**text, received=T0 + timedelta(seconds=n), completed=T0,
                        groups=[f"g<{char}>", "plain", f'q"{char}"'],
                        annotations={f"k<{char}>": f"v<{char}>", "plain": "x"}))
    return rows


def assert_stored_as_read(incident: Incident, rows: list[Row]) -> None:
    fields = [*TEXT_FIELDS, "groups", "annotations"]
    got = {e["received"]: e for e in Event.objects.filter(incident=incident).values(
        "received", *fields)}
    assert len(got) == len(rows)
    for row in rows:
        for field in fields:
            value = getattr(row, field)
            value = list(value) if field == "groups" else value
            assert got[row.received][field] == stored(value), (field, repr(value))


def _write(path: str, incident: Incident, rows: list[Row]) -> None:
    if path == "bulk":
        table = bulk.start_load(incident.pk)
        store.write_rows(incident.pk, None, rows, table=table)
        bulk.finish_load(incident.pk, table)
    else:
        store.write_rows(incident.pk, None, rows, optimistic=path == "copy")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["copy", "merge", "bulk"])
def test_every_control_character_in_every_field_is_stored_by_the_postgres_paths(
        path, drop_partitions):
    incident = Incident.objects.create(title=path)
    rows = rows_with_every_char()

    _write(path, incident, rows)

    assert_stored_as_read(incident, rows)


@pytest.mark.embedded
@pytest.mark.django_db
def test_every_control_character_in_every_field_is_stored_by_sqlite():
    assert connection.vendor == "sqlite"
    incident = Incident.objects.create(title="sqlite")
    rows = rows_with_every_char()

    store.write_rows(incident.pk, None, rows)

    assert_stored_as_read(incident, rows)


def test_the_nul_rule_counts_each_value_that_held_one():
    rows = rows_with_every_char()
    nul = rows[0]

    cleaned, count = store.replace_nul(rows)

    # Every text field, two groups and the annotation's key and value.
    assert count == len(TEXT_FIELDS) + 2 + 2
    assert cleaned[1:] == rows[1:]
    assert "\x00" not in repr(cleaned[0]) and cleaned[0].audit_id == stored(nul.audit_id)
    assert store.replace_nul(rows[1:]) == (rows[1:], 0)


# --- audit logs through the pipeline: the C scanner's rows and the Python parser's ------------

AUDIT_FIELDS = {  # where each field of a stored row comes from in an audit event
    "verb": ("verb",), "username": ("user", "username"),
    "impersonated_user": ("impersonatedUser", "username"), "user_agent": ("userAgent",),
    "resource": ("objectRef", "resource"), "subresource": ("objectRef", "subresource"),
    "namespace": ("objectRef", "namespace"), "name": ("objectRef", "name"),
    "api_group": ("objectRef", "apiGroup"), "api_version": ("objectRef", "apiVersion"),
    "object_uid": ("objectRef", "uid"), "resource_version": ("objectRef", "resourceVersion"),
    "level": ("level",), "request_uri": ("requestURI",),
}


def audit_line(n: int, char: str, *, python_path: bool) -> tuple[str, dict]:
    """An audit event with ``char`` in every text field, and the values the store must keep.
    ``python_path``: its auditID written with a JSON escape, which the C scanner leaves to the
    Python parser (as it does a line that may hold a secret)."""
    values = {field: f"{field}<{char}>{n}" for field in AUDIT_FIELDS}
    if not python_path:  # the scanner leaves an escaped resource to Python (it may be secrets)
        values["resource"] = f"resource{n}"
    values["source_ip"] = f"10.0.0.{n}<{char}>"
    values["groups"] = [f"g<{char}>", "system:authenticated"]
    values["annotations"] = {f"k<{char}>": f"v<{char}>"}
    audit_id = f"a-{n:04d}"
    event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "auditID": audit_id,
             "stage": "ResponseComplete", "sourceIPs": [values["source_ip"]],
             "requestReceivedTimestamp": (T0 + timedelta(seconds=n)).isoformat(),
             "stageTimestamp": (T0 + timedelta(seconds=n, milliseconds=5)).isoformat(),
             "responseStatus": {"code": 200}, "annotations": values["annotations"]}
    for field, where in AUDIT_FIELDS.items():
        target = event
        for key in where[:-1]:
            target = target.setdefault(key, {})
        target[where[-1]] = values[field]
    event["user"]["groups"] = values["groups"]
    line = json.dumps(event)  # every control character as a JSON escape, as a log writes it
    if python_path:
        escaped = audit_id.replace("-", "\\u002d")
        line = line.replace(f'"{audit_id}"', f'"{escaped}"')
    values["audit_id"] = audit_id
    return line, values


def audit_log(python_path: bool) -> tuple[bytes, dict[str, dict]]:
    lines, expected = [], {}
    for n, char in enumerate(CHARS):
        line, values = audit_line(n, char, python_path=python_path)
        lines.append(line)
        expected[values["audit_id"]] = values
    return ("\n".join(lines) + "\n").encode(), expected


@pytest.mark.skipif(audit._auditscan is None, reason="the C scanner is not built")
@pytest.mark.parametrize("python_path", [False, True])
def test_the_lines_take_the_path_the_test_means(python_path):
    data, _ = audit_log(python_path)
    ids = itertools.count(1)
    head, mid = store.copy_affixes(1, 1, "audit.log")
    report = Report("audit.log")

    out = list(audit.parse_audit_copy(io.BytesIO(data), report, Redactor(), copy_head=head,
                                      copy_mid=mid, next_chunk_id=lambda: next(ids),
                                      chunk_rows=500))

    by_c = sum(r.rows for r in out if type(r) is CopyRows)
    by_python = [r for r in out if type(r) is not CopyRows]
    assert not report.skipped, report.errors
    if python_path:
        assert (by_c, len(by_python)) == (0, len(CHARS))
    else:  # only the line holding a NUL is left to Python
        assert by_c == len(CHARS) - 1
        assert [r.audit_id for r in by_python] == ["a-0000"]


def _ingest_audit(tmp_path, ingest_file, python_path: bool):
    data, expected = audit_log(python_path)
    path = tmp_path / "audit.log"
    path.write_bytes(data)
    incident = Incident.objects.create(title="control characters")
    upload = ingest_file(incident, path)
    _assert_audit_stored(incident, upload, expected)


def _assert_audit_stored(incident: Incident, upload: Upload, expected: dict[str, dict]) -> None:
    assert upload.status == Upload.Status.DONE, upload.message
    assert upload.skipped_lines == 0, upload.errors
    events = {e["audit_id"]: e for e in Event.objects.filter(incident=incident).values(
        "audit_id", "source_ip", "groups", "annotations", *AUDIT_FIELDS)}
    assert set(events) == set(expected)
    for audit_id, values in expected.items():
        for field, value in values.items():
            assert events[audit_id][field] == stored(value), (audit_id, field, repr(value))
    # Only the line of NUL held them: its text fields, source IP, a group, a key and a value.
    nul = expected["a-0000"]
    held = sum("\x00" in value for value in nul.values() if isinstance(value, str)) + 3
    assert f"{held} values held a NUL character" in " ".join(upload.notes), upload.notes


@pytest.mark.django_db
@pytest.mark.parametrize("python_path", [False, True], ids=["c-scanner", "python"])
def test_every_control_character_of_an_audit_log_is_stored_as_read(
        python_path, tmp_path, ingest_file):
    _ingest_audit(tmp_path, ingest_file, python_path)


@pytest.mark.embedded
@pytest.mark.django_db
def test_every_control_character_of_an_audit_log_is_stored_as_read_by_sqlite(
        tmp_path, ingest_file):
    _ingest_audit(tmp_path, ingest_file, python_path=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("python_path", [False, True], ids=["c-scanner", "python"])
def test_every_control_character_of_an_audit_log_is_stored_as_read_by_the_bulk_load(
        python_path, tmp_path, settings, drop_partitions):
    from django.core.management import call_command

    settings.BULK_LOAD_MIN_BYTES = 0  # a new incident of any size is bulk loaded
    data, expected = audit_log(python_path)
    path = tmp_path / "audit.log"
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()

    call_command("ingest", str(path), incident="bulk", jobs=1, json=True, wait_complete=True,
                 stdout=out, stderr=err)

    assert "attached" in err.getvalue()  # the load's own table, attached as a partition
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    incident = Incident.objects.get(pk=summary["incident"]["id"])
    _assert_audit_stored(incident, Upload.objects.get(incident=incident), expected)
