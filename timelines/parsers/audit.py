"""kube-apiserver audit logs (``audit.k8s.io`` v1, v1beta1, v1alpha1) into one row per request.

Input: JSON lines (the log backend), lines holding webhook batches (``{"kind":"EventList"}``),
or one JSON document (a single Event, an EventList, or a JSON array of Events), gzipped or not.

The stages of a request (RequestReceived, ResponseStarted, ResponseComplete, Panic) collapse into
one row keyed by ``(auditID, received)``: clients can set their own Audit-ID, so the ID alone is
not an identity. ``received`` is requestReceivedTimestamp, or for the earliest v1beta1 logs the
``timestamp`` field, which there is the same on every stage. A request whose final stage is not in
this file is emitted at the end as an open span (``completed`` None); the store merges it with the
rest of the request when that arrives from another file.

Memory is bounded by the requests in flight, not by the file: a row leaves the pending table as
soon as its final stage is seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import orjson

from .base import (
    CopyRows,
    Format,
    InputError,
    ParseHints,
    Progress,
    Report,
    Row,
    nothing_found,
    open_blocks,
    open_lines,
    parse_time,
)
from .redact import Redactor

try:
    from . import _auditscan  # built by scripts/native.sh
except ImportError:  # not built: every file takes the Python path
    _auditscan = None

FINAL_STAGES = frozenset(("ResponseComplete", "Panic"))
STAGE_RANK = {"RequestReceived": 0, "ResponseStarted": 1, "ResponseComplete": 2, "Panic": 2}
# A whole-document file (pretty-printed Event or EventList) is read into memory; bigger documents
# are not audit logs as the apiserver writes them.
MAX_DOCUMENT_BYTES = 512 * 1024**2
BOM = b"\xef\xbb\xbf"


# Audit parsing yields the generic evidence row; the name says what this module makes of it.
AuditRow = Row


def sniff(head: bytes, name: str = "") -> bool:
    """True if the first bytes of a (decompressed) file look like audit events."""
    return b'"auditID"' in head and (b"audit.k8s.io" in head or b'"stage"' in head)


def parse_audit(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
                progress: Progress | None = None,
                hints: ParseHints | None = None) -> Iterator[AuditRow]:
    """Yield one ``AuditRow`` per request found in ``raw``.

    Bad lines are skipped and recorded on ``report`` as ``source:line: reason``; they never stop
    the file. ``progress(bytes_read, rows)`` is called every 4096 lines. Raises ``InputError``
    when the file holds no audit event at all.
    """
    redactor = redactor or Redactor()
    lines, counter = open_lines(raw, report)
    pending: dict[tuple[str, str], tuple[int, dict[str, Any], bytes, int]] = {}
    rows = 0
    source = report.source
    document: list[bytes] | None = None
    document_start = 1

    for number, line in enumerate(lines, start=1):
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        if document is not None:
            document.append(line)
            continue
        stripped = line.strip()
        if not stripped:
            continue
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            if rows == 0 and not pending and report.skipped == 0 and _opens_document(stripped):
                # Maybe a pretty-printed document rather than JSON lines: read it whole.
                document = [line]
                document_start = number
                continue
            report.skip(number, _json_reason(stripped, exc))
            continue
        for row in _rows_of(value, stripped, number, pending, report, redactor):
            rows += 1
            yield row
        if progress is not None and number % 4096 == 0:
            progress(counter.count, rows)

    if document is not None:
        text = b"".join(document)
        if len(text) > MAX_DOCUMENT_BYTES:
            raise InputError(f"{source}: a JSON document over {MAX_DOCUMENT_BYTES} bytes")
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            # Not a document either: judge it line by line after all, so good lines survive.
            value = None
            for row in _reparse_lines(text, report, redactor, pending, document_start):
                rows += 1
                yield row
        if value is not None:
            for row in _rows_of(value, None, document_start, pending, report, redactor):
                rows += 1
                yield row

    yield from _end_of_file(pending, report, redactor, progress, counter.count, rows)


def _end_of_file(pending: dict, report: Report, redactor: Redactor, progress: Progress | None,
                 bytes_read: int, rows: int) -> Iterator[AuditRow]:
    """The requests still open (``_flush``), then the last progress call. Raises
    ``InputError`` when the file gave no row at all."""
    for row in _flush(pending, report, redactor):
        rows += 1
        yield row
    if progress is not None:
        progress(bytes_read, rows)
    if rows == 0:
        raise nothing_found(report, "no kube-apiserver audit events found")


def _flush(pending: dict, report: Report, redactor: Redactor) -> Iterator[AuditRow]:
    """Requests whose final stage is not in this file: open spans (or merged later in the store).
    Empties ``pending``."""
    for _rank, event, line_bytes, number in pending.values():
        row = _row(event, line_bytes, number, report.source, report, redactor)
        if row is not None:
            yield row
    pending.clear()


class NativeEvents:
    """Native audit events met one at a time inside another envelope (a CloudWatch message, an
    AKS record, an OpenTelemetry log record, a YAML document), made into rows exactly as
    ``parse_audit`` makes them from a log: same checks and skip reasons, the same stage collapse
    across the whole file, the same ``raw``, the same ``(audit_id, received)``.

    ``feed`` yields the rows an event completes; ``flush`` (once, at the end of the file) yields
    the requests still open. Neither raises ``InputError``: whether a file held nothing usable is
    the envelope parser's call.
    """

    def __init__(self, report: Report, redactor: Redactor | None = None) -> None:
        self.report = report
        self.redactor = redactor or Redactor()
        self.pending: dict[tuple[str, str], tuple[int, dict[str, Any], bytes, int]] = {}

    def feed(self, value: Any, number: int, line_bytes: bytes | None = None) -> Iterator[AuditRow]:
        """Rows completed by ``value`` (an Event, an EventList or a list of Events) found at
        line ``number``. ``line_bytes`` is the event's JSON text exactly as the apiserver wrote
        it (stored as ``raw`` when nothing needs redacting, as ``parse_audit`` stores its lines),
        or None to store it re-serialised."""
        return _rows_of(value, line_bytes, number, self.pending, self.report, self.redactor)

    def flush(self) -> Iterator[AuditRow]:
        """The requests whose final stage never came, as open spans."""
        return _flush(self.pending, self.report, self.redactor)


def _reparse_lines(text: bytes, report: Report, redactor: Redactor,
                   pending: dict, first_line: int = 1) -> Iterator[AuditRow]:
    for number, line in enumerate(text.split(b"\n"), start=first_line):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            report.skip(number, _json_reason(stripped, exc))
            continue
        yield from _rows_of(value, stripped, number, pending, report, redactor)


def _rows_of(value: Any, line_bytes: bytes | None, number: int, pending: dict, report: Report,
             redactor: Redactor,
             on_final: Callable[[str, str], object] | None = None) -> Iterator[AuditRow]:
    """Rows completed by one parsed JSON value (an Event, an EventList, a list of Events).
    ``on_final(auditID, received)`` is told of every final stage met."""
    for event in _events_in(value):
        error = _check(event)
        if error:
            report.skip(number, error)
            continue
        own_line = line_bytes if value is event else None  # else re-serialised when stored
        if on_final is not None and event["stage"] in FINAL_STAGES:
            received = event.get("requestReceivedTimestamp") or event.get("timestamp")
            if type(received) is str:
                on_final(event["auditID"], received)
        yield from _collapse(event, own_line, number, pending, report.source, report, redactor)


def _opens_document(line: bytes) -> bool:
    """A first line that a pretty-printed JSON document would start with."""
    return line in (b"{", b"[") or line.endswith((b"{", b"[", b","))


def _json_reason(line: bytes, exc: Exception) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    return f"malformed JSON ({str(exc).splitlines()[0][:120]})"


def _events_in(value: Any) -> list[Any]:
    if isinstance(value, dict) and value.get("kind") == "EventList":
        items = value.get("items")
        return items if isinstance(items, list) else [value]
    if isinstance(value, list):
        return value
    return [value]


def _check(event: Any) -> str | None:
    """Why ``event`` is not an audit event we can use, or None. Runs on every line: keep it lean."""
    if type(event) is not dict:
        return "not an audit event (not a JSON object)"
    kind = event.get("kind")
    api_version = event.get("apiVersion")
    if (kind is not None and kind != "Event") or (
        api_version is not None
        and not (type(api_version) is str and api_version.startswith("audit.k8s.io/"))
    ):
        return f"not an audit event (kind {kind!r}, apiVersion {api_version!r})"
    audit_id = event.get("auditID")
    if type(audit_id) is not str or not audit_id:
        return "audit event without auditID"
    if type(event.get("stage")) is not str:
        return "audit event without stage"
    if not (event.get("requestReceivedTimestamp") or event.get("timestamp")):
        return "audit event without requestReceivedTimestamp or timestamp"
    return None


def _collapse(event: dict[str, Any], line_bytes: bytes | None, number: int,
              pending: dict, source: str, report: Report,
              redactor: Redactor) -> Iterator[AuditRow]:
    received = event.get("requestReceivedTimestamp") or event.get("timestamp")
    key = (event["auditID"], received)
    stage = event["stage"]
    if stage in FINAL_STAGES:
        pending.pop(key, None)
        row = _row(event, line_bytes, number, source, report, redactor)
        if row is not None:
            yield row
        return
    rank = STAGE_RANK.get(stage, 0)
    previous = pending.get(key)
    if previous is None or previous[0] <= rank:
        pending[key] = (rank, event, line_bytes, number)


def _row(event: dict[str, Any], line_bytes: bytes | None, number: int, source: str,
         report: Report, redactor: Redactor) -> AuditRow | None:
    """The row for a request's last seen stage, or None (recorded on ``report``) when a field
    has the wrong shape."""
    try:
        return _build_row(event, line_bytes, number, source, report, redactor)
    except (ValueError, TypeError, AttributeError, IndexError) as exc:
        report.skip(number, f"audit event with a malformed field ({exc})")
        return None


def _build_row(event: dict[str, Any], line_bytes: bytes | None, number: int, source: str,
               report: Report, redactor: Redactor) -> AuditRow:
    if line_bytes is None or redactor.needs_walk(event, line_bytes):
        replaced = redactor.redact_event(event, line_bytes)
        if replaced or line_bytes is None:
            report.redacted += replaced
            line_bytes = orjson.dumps(event)
    stage = event["stage"]
    received = parse_time(event.get("requestReceivedTimestamp") or event.get("timestamp"))
    completed = duration = None
    if stage in FINAL_STAGES:
        stage_time = event.get("stageTimestamp") or (event.get("metadata") or {}).get(
            "creationTimestamp") or event.get("timestamp")
        completed = parse_time(stage_time)
        duration = (completed - received).total_seconds() * 1000.0
    user = event.get("user") or {}
    impersonated = event.get("impersonatedUser") or {}
    ref = event.get("objectRef") or {}
    api_group = _text(ref, "apiGroup")
    api_version = _text(ref, "apiVersion")
    if not api_group and "/" in api_version:  # v1alpha1: objectRef.apiVersion is group/version
        api_group, _, api_version = api_version.rpartition("/")
    status = event.get("responseStatus") or {}
    code = status.get("code")
    if type(code) is not int or not -2**31 <= code < 2**31:  # a float, a bool, out of range
        code = None
    groups = user.get("groups") or []
    if type(groups) is not list:
        raise ValueError(f"user.groups is {type(groups).__name__}, not a list")
    source_ips = event.get("sourceIPs")
    if type(source_ips) is not list or not source_ips:
        source_ips = [source_ips if type(source_ips) is str else ""]
    annotations = event.get("annotations") or {}
    return AuditRow(
        event["auditID"],
        received,
        completed,
        duration,
        _text(event, "verb"),
        _text(user, "username"),
        [g for g in groups if isinstance(g, str)],
        _text(impersonated, "username"),
        _text(event, "userAgent"),
        source_ips[0] if isinstance(source_ips[0], str) else "",
        _text(ref, "resource"),
        _text(ref, "subresource"),
        _text(ref, "namespace"),
        _text(ref, "name"),
        api_group,
        api_version,
        _text(ref, "uid"),
        _text(ref, "resourceVersion"),
        code,
        _text(event, "level"),
        stage,
        _text(event, "requestURI"),
        annotations if isinstance(annotations, dict) else {},
        source,
        number,
        line_bytes,
    )


def _text(container: dict[str, Any], key: str) -> str:
    """A string field; "" when missing, null or empty. Another type is a malformed field."""
    value = container.get(key)
    if type(value) is str:
        return value
    if not value:
        return ""
    raise ValueError(f"{key} is {type(value).__name__}, not a string")


def parse_audit_copy(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
                     progress: Progress | None = None, hints: ParseHints | None = None, *,
                     copy_head: bytes, copy_mid: bytes, next_chunk_id: Callable[[], int],
                     chunk_rows: int) -> Iterator[AuditRow | CopyRows]:
    """``parse_audit`` for the PostgreSQL store: the same rows, most of them as ``CopyRows``
    made by the C scanner (``_auditscan``), the others as ``AuditRow``.

    The scanner collapses stages and writes the rows of final stages of the usual shape; it
    hands back the final stages that may hold a secret (built here, redacted), the lines it does
    not judge (parsed here as ``parse_audit`` would, skip reasons included) and, at the end, the
    stages whose request never completed. Falls back to ``parse_audit`` when the scanner is not
    built, extra redaction paths are configured (every event is walked then) or the file does
    not start with a JSON line (a pretty-printed document).

    ``copy_head``/``copy_mid``: the escaped COPY columns before ``audit_id`` and between
    ``request_uri`` and ``received``; ``next_chunk_id()``: a new body chunk's id.
    """
    redactor = redactor or Redactor()
    number = 1  # of the next line
    blocks, counter = open_blocks(raw, report, lambda: number - 1)
    first = next(blocks, b"")
    if first.startswith(BOM):
        first = first[len(BOM):]
    if _auditscan is None or redactor.extra_paths or not _starts_with_event_line(first):
        raw.seek(0)
        yield from parse_audit(raw, report, redactor, progress, hints)
        return
    scanner = _auditscan.Scanner(copy_head, copy_mid, next_chunk_id, chunk_rows,
                                 redactor.enabled)
    pending: dict = {}  # the collapse of the lines left to Python
    source = report.source
    rows = 0
    block = first
    while block:
        text, count, bodies, finals, others, number = scanner.feed(block, number)
        if count:
            rows += count
            yield CopyRows(text, count, bodies)
        for line_number, line in finals:
            row = _row(orjson.loads(line), line, line_number, source, report, redactor)
            if row is not None:
                rows += 1
                yield row
        for line_number, line in others:
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                report.skip(line_number, _json_reason(line, exc))
                continue
            for row in _rows_of(value, line, line_number, pending, report, redactor,
                                on_final=scanner.forget):
                rows += 1
                yield row
        if progress is not None:
            progress(counter.count, rows)
        block = next(blocks, b"")
    for line_number, line in scanner.flush():
        event = orjson.loads(line)
        if (event["auditID"], event["requestReceivedTimestamp"]) in pending:
            continue  # a later stage of it was left to Python; that one is flushed below
        row = _row(event, line, line_number, source, report, redactor)
        if row is not None:
            rows += 1
            yield row
    yield from _end_of_file(pending, report, redactor, progress, counter.count, rows)


def _starts_with_event_line(block: bytes) -> bool:
    """Whether the first non-blank line of ``block`` is one whole JSON object (JSON lines, not a
    pretty-printed document)."""
    for line in block.split(b"\n", 64):
        stripped = line.strip()
        if stripped:
            try:
                return type(orjson.loads(stripped)) is dict
            except orjson.JSONDecodeError:
                return False
    return False


FORMAT = Format("audit", sniff, parse_audit, parse_copy=parse_audit_copy)
