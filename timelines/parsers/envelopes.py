"""kube-apiserver audit events delivered inside other envelopes, into the same audit rows as the
native parser gives for them.

- ``eks-cloudwatch``: Amazon CloudWatch Logs, where each ``message`` is a native event as a JSON
  string: ``aws logs filter-log-events`` / ``get-log-events`` pages (``{"events": [...]}``) and
  subscription payloads (``{"messageType": "DATA_MESSAGE", "logEvents": [...]}``), the latter
  also gzipped, or base64 text of the gzip as a Lambda or Kinesis consumer receives it.
- ``aks-diagnostics``: Azure diagnostic settings records (``{"records": [...]}`` from Event Hubs,
  JSON lines of records from a storage account, or one record) of category ``kube-audit`` or
  ``kube-audit-admin``, the event in ``properties.log`` as a JSON string.
- ``otlp-audit``: OpenTelemetry JSON logs (``resourceLogs[].scopeLogs[].logRecords[]``), the
  event in the record body as a JSON string or as a ``kvlistValue``.
- ``gke-audit`` (module ``gke``) and ``legacy-audit`` (module ``legacy``) are listed here too.

For the first three, the events themselves go through the native parser's own code
(``audit.NativeEvents``): same checks, same stage collapse across the file, the same
``(audit_id, received)`` and the same ``raw`` (the event's JSON text as the apiserver wrote it,
or re-serialised after redaction), so a request ingested both natively and through an envelope
merges into one row. ``line`` is the line where the JSON value holding the event starts (1 for a
single document); skip reasons name the event's position inside it.

``FORMATS`` lists them most specific first. Register them before the native ``audit`` format:
its sniff can match an envelope whose events are objects rather than strings.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from . import gke, legacy
from .audit import BOM, NativeEvents
from .base import (
    Format,
    ParseHints,
    Progress,
    Report,
    Row,
    feed_all,
    nothing_found,
)
from .envelope_base import (
    count_note,
    json_values,
    looks_like_native_event,
    native_event_bytes,
    read_document,
)
from .redact import Redactor

AKS_AUDIT_CATEGORIES = frozenset(("kube-audit", "kube-audit-admin"))
GZIP_BASE64 = b"H4sI"  # base64 of the gzip magic and deflate method: 1f 8b 08
_ESCAPED_AUDIT_ID = b'\\"auditID\\"'  # an event inside a JSON string


# --- EKS: CloudWatch Logs ------------------------------------------------------------------------

def sniff_eks(head: bytes, name: str = "") -> bool:
    """True for CloudWatch Logs pages or subscription payloads (maybe as base64 of their gzip)
    whose messages are audit events."""
    text = head.removeprefix(BOM).lstrip()
    if text.startswith(GZIP_BASE64):
        text = _peek_base64_gzip(text)
    if b'"logEvents"' not in text and not (b'"events"' in text and b'"message"' in text):
        return False
    return _ESCAPED_AUDIT_ID in text


def parse_eks(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
              progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield audit rows for the audit events in CloudWatch Logs messages.

    Messages that are not audit events (other EKS control-plane streams: kube-apiserver klog,
    authenticator, scheduler) are skipped with the stream they came from; so are values that
    are neither a page nor a payload. Raises ``InputError`` when no audit event is found.
    """
    data, counter = read_document(raw, report)
    values = (_base64_payloads(data, report) if data.lstrip().startswith(GZIP_BASE64)
              else json_values(data, report))

    def events() -> Iterator[tuple[Any, int, bytes | None]]:
        controls = 0
        for value, line in values:
            for container in value if isinstance(value, list) else [value]:
                if isinstance(container, dict) and container.get("messageType") == \
                        "CONTROL_MESSAGE":
                    controls += 1  # CloudWatch's reachability check for a new subscription
                    continue
                items = _cloudwatch_events(container)
                if items is None:
                    report.skip(line, "not a CloudWatch Logs page (events) or subscription "
                                      "payload (logEvents)")
                    continue
                group_stream = container.get("logStream") if isinstance(container, dict) else None
                for index, item in enumerate(items, start=1):
                    stream = (item.get("logStreamName") if isinstance(item, dict) else None) \
                        or group_stream
                    where = f"event {index}" + (f" of stream {stream}" if stream else "")
                    message = item.get("message") if isinstance(item, dict) else None
                    found = native_event_bytes(message)
                    if found is None or not looks_like_native_event(found[0]):
                        report.skip(line, f"{where}: message is not an audit event")
                        continue
                    yield found[0], line, found[1]
        if controls:
            report.notes.append(f"{controls} CloudWatch control message(s) ignored")

    yield from _native_rows(events(), report, redactor, progress, counter,
                            "no audit events in CloudWatch Logs messages")


def _cloudwatch_events(container: Any) -> list[Any] | None:
    if not isinstance(container, dict):
        return None
    for key in ("logEvents", "events"):
        if isinstance(container.get(key), list):
            return container[key]
    return None


def _base64_payloads(data: bytes, report: Report) -> Iterator[tuple[Any, int]]:
    """JSON values of base64-encoded gzip payloads, one per line (a whole file of one payload
    is one line). A line that does not decode is recorded on ``report``."""
    for number, line in enumerate(data.split(b"\n"), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            decoded = gzip.decompress(base64.b64decode(line, validate=True))
        except (binascii.Error, ValueError, EOFError, OSError, zlib.error) as exc:
            report.skip(number, f"not a base64-encoded gzip payload ({exc})")
            continue
        inner = Report("payload")
        for value, _inner_line in json_values(decoded, inner):
            yield value, number
        for error in inner.errors:
            report.skip(number, f"decoded payload line {error.removeprefix('payload:')}")
        for _ in range(inner.skipped - len(inner.errors)):
            report.skip(number, "decoded payload: malformed JSON")


def _peek_base64_gzip(text: bytes) -> bytes:
    """The start of what the first line of base64 gzip text decodes to (b"" if it does not)."""
    line = text.split(b"\n", 1)[0].strip()
    line = line[: len(line) - len(line) % 4]
    try:
        compressed = base64.b64decode(line, validate=True)
        return zlib.decompressobj(wbits=31).decompress(compressed, 64 * 1024)
    except (binascii.Error, ValueError, zlib.error):
        return b""


# --- AKS: Azure diagnostic settings ------------------------------------------------------------

def sniff_aks(head: bytes, name: str = "") -> bool:
    """True for Azure diagnostic records of the kube-audit categories."""
    return (b'"properties"' in head and b'"category"' in head
            and (b'"kube-audit"' in head or b'"kube-audit-admin"' in head))


def parse_aks(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
              progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield audit rows for the events in kube-audit / kube-audit-admin records.

    Records of other categories (kube-apiserver klog text, guard, cluster-autoscaler, …) are not
    audit evidence: they are counted in a note, not reported as errors. A kube-audit record
    whose ``properties.log`` is not an event is skipped. Raises ``InputError`` when no audit
    event is found.
    """
    data, counter = read_document(raw, report)

    def events() -> Iterator[tuple[Any, int, bytes | None]]:
        other: dict[str, int] = {}
        for value, line in json_values(data, report):
            if isinstance(value, dict) and isinstance(value.get("records"), list):
                records, several = value["records"], True
            elif isinstance(value, list):
                records, several = value, True
            else:
                records, several = [value], False
            for index, record in enumerate(records, start=1):
                where = f"record {index}: " if several else ""
                if not isinstance(record, dict) or "category" not in record:
                    report.skip(line, f"{where}not an Azure diagnostic record (no category)")
                    continue
                category = str(record.get("category") or "")
                if category not in AKS_AUDIT_CATEGORIES:
                    other[category] = other.get(category, 0) + 1
                    continue
                properties = record.get("properties")
                if isinstance(properties, str):  # some pipelines stringify the properties
                    found = native_event_bytes(properties)
                    properties = found[0] if found else None
                log = properties.get("log") if isinstance(properties, dict) else None
                found = native_event_bytes(log)
                if found is None or not looks_like_native_event(found[0]):
                    report.skip(line, f"{where}{category} record whose properties.log is not "
                                      "an audit event")
                    continue
                yield found[0], line, found[1]
        if other:
            report.notes.append(count_note(other, "records of other categories skipped, not "
                                                  "audit"))

    yield from _native_rows(events(), report, redactor, progress, counter,
                            "no kube-audit records")


# --- OpenTelemetry JSON logs -------------------------------------------------------------------

def sniff_otlp(head: bytes, name: str = "") -> bool:
    """True for OTLP JSON logs whose records carry audit events."""
    return b'"resourceLogs"' in head and (b"auditID" in head or b"k8s.audit" in head)


def parse_otlp(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
               progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield audit rows for the audit events in OTLP log record bodies (a JSON string, or a
    ``kvlistValue`` holding the event's fields). Records whose body is not an audit event are
    skipped. Raises ``InputError`` when no audit event is found."""
    data, counter = read_document(raw, report)

    def events() -> Iterator[tuple[Any, int, bytes | None]]:
        for value, line in json_values(data, report):
            for document in value if isinstance(value, list) else [value]:
                if not isinstance(document, dict) or not isinstance(
                        document.get("resourceLogs"), list):
                    report.skip(line, "not an OTLP logs document (no resourceLogs)")
                    continue
                number = 0
                for resource_logs in document["resourceLogs"]:
                    for record in _log_records(resource_logs):
                        number += 1
                        found = _event_of_body(record.get("body")
                                               if isinstance(record, dict) else None)
                        if found is None or not looks_like_native_event(found[0]):
                            report.skip(line, f"log record {number}: body is not an audit event")
                            continue
                        yield found[0], line, found[1]

    yield from _native_rows(events(), report, redactor, progress, counter,
                            "no audit events in OpenTelemetry log records")


def _log_records(resource_logs: Any) -> Iterator[Any]:
    if not isinstance(resource_logs, dict):
        return
    # instrumentationLibraryLogs: the name before OTLP 0.19.
    scopes = resource_logs.get("scopeLogs") or resource_logs.get("instrumentationLibraryLogs")
    for scope in scopes if isinstance(scopes, list) else ():
        records = scope.get("logRecords") if isinstance(scope, dict) else None
        yield from records if isinstance(records, list) else ()


def _event_of_body(body: Any) -> tuple[Any, bytes | None] | None:
    if not isinstance(body, dict):
        return None
    if "stringValue" in body:
        return native_event_bytes(body["stringValue"])
    if "kvlistValue" in body:
        return any_value(body), None
    return None


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` (JSON encoding) as the plain value it holds: 64-bit ints arrive as
    strings, key-value lists become objects, arrays lists."""
    if not isinstance(value, dict):
        return value
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        try:
            return int(value["intValue"])
        except (TypeError, ValueError):
            return value["intValue"]
    if "boolValue" in value:
        return value["boolValue"]
    if "doubleValue" in value:
        return value["doubleValue"]
    if "arrayValue" in value:
        items = (value["arrayValue"] or {}).get("values") or []
        return [any_value(item) for item in items]
    if "kvlistValue" in value:
        pairs = (value["kvlistValue"] or {}).get("values") or []
        return {str(pair.get("key")): any_value(pair.get("value"))
                for pair in pairs if isinstance(pair, dict)}
    if "bytesValue" in value:
        return value["bytesValue"]  # base64 text: kept as written
    return None


# --- shared --------------------------------------------------------------------------------------

def _native_rows(events: Iterator[tuple[Any, int, bytes | None]], report: Report,
                 redactor: Redactor | None, progress: Progress | None, counter,
                 nothing: str) -> Iterator[Row]:
    """Rows of native events found in an envelope, with progress, and ``InputError`` (naming
    the file and its first problem) when there are none."""
    native = NativeEvents(report, redactor)
    rows = yield from feed_all(events, lambda event: native.feed(*event), native.flush, counter,
                               progress)
    if rows == 0:
        raise nothing_found(report, nothing)


EKS_FORMAT = Format("eks-cloudwatch", sniff_eks, parse_eks)
AKS_FORMAT = Format("aks-diagnostics", sniff_aks, parse_aks)
OTLP_FORMAT = Format("otlp-audit", sniff_otlp, parse_otlp)
GKE_FORMAT = gke.FORMAT
LEGACY_FORMAT = legacy.FORMAT

# Most specific first: each envelope's sniff looks for its own keys; legacy matches text lines.
FORMATS: list[Format] = [GKE_FORMAT, EKS_FORMAT, AKS_FORMAT, OTLP_FORMAT, LEGACY_FORMAT]
