"""Google Cloud Logging exports of GKE node and container logs into ``log`` rows.

Input: LogEntries with a ``textPayload`` or ``jsonPayload`` (kubelet, container-runtime,
docker, kube-proxy, node-problem-detector on ``k8s_node``; pod output on ``k8s_container`` /
``k8s_pod``), in the shapes ``gke`` reads (a JSON array from ``gcloud logging read``, JSON lines,
one entry, ``{"entries": [...]}``, YAML documents; gzipped or not), read with the same helpers
(``envelope_base.read_document`` / ``values_of``). Entries with a ``protoPayload`` are audit
entries: ``gke`` (gke-audit, registered first) reads them; here they are skipped and counted.

Rows: ``received`` = ``completed`` = the entry's ``timestamp`` (``receiveTimestamp`` when it has
none, noted), ``duration_ms`` 0; ``severity`` from the Cloud Logging severity (name or number:
INFO/NOTICE info, WARNING warning, ERROR error, CRITICAL/ALERT/EMERGENCY fatal, DEBUG debug,
DEFAULT or none ""); ``message`` the ``textPayload``, else ``jsonPayload.MESSAGE``/``message``,
else the compact JSON of ``jsonPayload``; ``component`` the log's name (last part of
``logName``: kubelet, container-runtime, stdout…), else ``jsonPayload.SYSLOG_IDENTIFIER``;
``node`` ``resource.labels.node_name``, else the entry label
``compute.googleapis.com/resource_name``, else ``hints.node``. Container and pod entries name
their pod as an audit objectRef does (``resource`` pods, ``namespace``, ``name``).

Identity: ``gke-log:<insertId>``; without an insertId, ``gke-log:sha1-`` + the hash of the entry
(its JSON with sorted keys, before redaction), so the same entry always gets the same key.
``raw`` is the entry as JSON after ``redact_strings``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, BinaryIO
from urllib.parse import unquote

import orjson

from .audit import BOM
from .base import (
    Format,
    ParseHints,
    Progress,
    Report,
    Row,
    nothing_found,
    parse_time,
)
from .envelope_base import count_note, read_document, values_of
from .gke import _entries
from .redact import Redactor, redact_strings
from .textlog import guess_severity

KEY_PREFIX = "gke-log:"
POD_RESOURCES = frozenset(("k8s_container", "k8s_pod"))
NODE_LABEL = "compute.googleapis.com/resource_name"
SEVERITIES = {
    "DEFAULT": "", "DEBUG": "debug", "INFO": "info", "NOTICE": "info", "WARNING": "warning",
    "ERROR": "error", "CRITICAL": "fatal", "ALERT": "fatal", "EMERGENCY": "fatal",
}
# google.logging.type.LogSeverity numbers, as some JSON encoders write them.
SEVERITY_NUMBERS = {0: "DEFAULT", 100: "DEBUG", 200: "INFO", 300: "NOTICE", 400: "WARNING",
                    500: "ERROR", 600: "CRITICAL", 700: "ALERT", 800: "EMERGENCY"}
_PAYLOAD_KEY = re.compile(
    rb'"(?:textPayload|jsonPayload)"\s*:|^[ \t]*(?:-[ \t]+)?(?:textPayload|jsonPayload):',
    re.MULTILINE)
_RESOURCE_TYPE = re.compile(rb'\btype"?\s*:\s*"?(?:k8s_node|k8s_container|k8s_pod)\b')
_LOG_NAME = re.compile(rb'"logName"\s*:|^[ \t]*(?:-[ \t]+)?logName:', re.MULTILINE)
_EVERY = 4096


def sniff(head: bytes, name: str = "") -> bool:
    """True for Cloud Logging entries with a text or JSON payload from a GKE node, container or
    pod (JSON or YAML). Audit entries (``protoPayload`` only) are gke-audit's."""
    head = head.removeprefix(BOM)
    return (_PAYLOAD_KEY.search(head) is not None and _LOG_NAME.search(head) is not None
            and _RESOURCE_TYPE.search(head) is not None)


def parse(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
          progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield a ``log`` row per node or container log entry in ``raw``.

    Entries that are not such log entries, or lack a usable time, are skipped and recorded on
    ``report``. Raises ``InputError`` naming ``report.source`` when nothing usable is found.
    """
    redactor = redactor or Redactor()
    hints = hints or ParseHints()
    data, counter = read_document(raw, report)
    audit_entries: dict[str, int] = {}
    received_only = 0
    rows = entries = 0
    for value, line in values_of(data, report):
        for entry, label in _entries(value):
            entries += 1
            if progress is not None and entries % _EVERY == 0:
                progress(counter.count, rows)
            reason = _not_log(entry)
            if reason:
                if isinstance(entry, dict) and "protoPayload" in entry:
                    log = _log_id(entry.get("logName"))
                    audit_entries[log] = audit_entries.get(log, 0) + 1
                report.skip(line, label + reason)
                continue
            try:
                row, fallback = _build(entry, line, report, redactor, hints)
            except (ValueError, TypeError, AttributeError) as exc:
                report.skip(line, f"{label}log entry with a malformed field ({exc})")
                continue
            received_only += fallback
            rows += 1
            yield row
    if audit_entries:
        report.notes.append(count_note(audit_entries, "audit entries (protoPayload) skipped: "
                                                      "the gke-audit format reads them"))
    if received_only:
        report.notes.append(f"{received_only} entries without a timestamp are placed at their "
                            "receiveTimestamp")
    if progress is not None:
        progress(counter.count, rows)
    if rows == 0:
        raise nothing_found(report, "no GKE node or container log entries "
                                    "(textPayload/jsonPayload) found")


def _not_log(entry: Any) -> str | None:
    """Why ``entry`` is not a node or container log entry, or None."""
    if not isinstance(entry, dict):
        return "not a Cloud Logging entry (not an object)"
    if "protoPayload" in entry:
        return f"an audit entry (protoPayload, log {_log_id(entry.get('logName')) or '?'})"
    if "textPayload" in entry:
        if not isinstance(entry["textPayload"], str):
            return "textPayload is not a string"
        return None
    if "jsonPayload" in entry:
        if not isinstance(entry["jsonPayload"], dict):
            return "jsonPayload is not an object"
        return None
    return "not a log entry (no textPayload or jsonPayload)"


def _build(entry: dict[str, Any], line: int, report: Report, redactor: Redactor,
           hints: ParseHints) -> tuple[Row, int]:
    """The row of one entry, and 1 if its time is the receiveTimestamp (else 0)."""
    stamp, fallback = entry.get("timestamp"), 0
    if stamp is None or stamp == "":
        stamp, fallback = entry.get("receiveTimestamp"), 1
        if stamp is None or stamp == "":
            raise ValueError("no timestamp")
    try:
        received = _time(stamp)
    except ValueError as exc:
        raise ValueError(f"timestamp {stamp!r} is not an RFC 3339 time ({exc})") from None
    severity = _severity(entry.get("severity"))
    insert_id = entry.get("insertId")
    if isinstance(insert_id, str) and insert_id:
        audit_id = KEY_PREFIX + insert_id
    else:
        insert_id = ""
        digest = hashlib.sha1(_dumps(entry, sort=True), usedforsecurity=False).hexdigest()
        audit_id = f"{KEY_PREFIX}sha1-{digest[:24]}"
    if redactor.enabled:
        report.redacted += redact_strings(entry)
    payload = entry.get("jsonPayload") if "textPayload" not in entry else None
    if payload is None:
        message = entry["textPayload"]
    else:
        text = payload.get("MESSAGE", payload.get("message"))
        message = text if isinstance(text, str) else _dumps(payload).decode()
    message = message.rstrip("\r\n")
    # Node agents often leave the entry's severity unset and say it in the line (klog "I1119",
    # "level=info").
    severity = severity or guess_severity(message)
    resource = entry.get("resource") if isinstance(entry.get("resource"), dict) else {}
    resource_labels = _strings(resource.get("labels"))
    labels = _strings(entry.get("labels"))
    identifier = payload.get("SYSLOG_IDENTIFIER") if payload is not None else None
    identifier = identifier if isinstance(identifier, str) else ""
    component = _log_id(entry.get("logName")) or identifier or hints.component
    node = resource_labels.get("node_name") or labels.get(NODE_LABEL) or hints.node
    pods, namespace, name = "", "", ""
    if resource.get("type") in POD_RESOURCES:
        namespace = resource_labels.get("namespace_name", "")
        name = resource_labels.get("pod_name", "")
        pods = "pods" if name else ""
    annotations: dict[str, str] = {}
    for key, value in (("insertId", insert_id),
                       ("container_name", resource_labels.get("container_name", "")),
                       ("cluster_name", resource_labels.get("cluster_name", "")),
                       ("program", identifier if identifier != component else "")):
        if value:
            annotations[key] = value
    row = Row(
        audit_id, received, received, 0.0, resource=pods, namespace=namespace, name=name,
        annotations=annotations, source=report.source, line=line, raw=_dumps(entry),
        kind="log", message=message, severity=severity, component=component, node=node,
    )
    return row, fallback


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):  # YAML with an explicit !!timestamp
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return parse_time(value)


def _severity(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        value = SEVERITY_NUMBERS.get(value, "")
    # Anything else is no Cloud Logging severity: the line is kept without one.
    return SEVERITIES.get(value.upper(), "") if isinstance(value, str) else ""


def _log_id(log_name: Any) -> str:
    """``kubelet`` of ``projects/p/logs/kubelet`` (URL-decoded: ``cloudaudit.googleapis.com/…``)."""
    if not isinstance(log_name, str):
        return ""
    head, marker, tail = log_name.partition("/logs/")
    return unquote(tail if marker else head)


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def _dumps(value: Any, sort: bool = False) -> bytes:
    # YAML may give non-string keys or values JSON lacks; raw must still be one JSON line.
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_SORT_KEYS if sort else 0)
    return orjson.dumps(value, default=str, option=option)


FORMAT = Format("gke-log", sniff, parse)
