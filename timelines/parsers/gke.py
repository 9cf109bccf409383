"""Google Cloud Logging exports of GKE audit logs into audit rows.

Input: LogEntries whose ``protoPayload`` is an AuditLog, as ``gcloud logging read --format=json``
writes them (a JSON array), as JSON lines, one entry, an ``entries:list`` response
(``{"entries": [...]}``), or YAML (one document or ``---`` separated); gzipped or not. Native
audit events written as YAML are read too (the native parser reads only JSON).

Two kinds of entries are audit entries:
- Kubernetes requests (``methodName`` ``io.k8s.<group>.<version>.<resource>[.<sub>].<verb>``,
  ``resourceName`` ``<group>/<version>/namespaces/<ns>/<resource>/<name>[/<sub>]``). The export
  has one time per request, so ``completed`` is ``received`` and ``duration_ms`` None (a note
  says so); ``status`` is a gRPC status, mapped to the HTTP code the apiserver answered, the gRPC
  code kept in the annotations.
- GKE cluster operations (``google.container.v1.ClusterManager.CreateCluster`` and the like on
  ``projects/p/zones/z/clusters/c[/nodePools/np]``): long-running, logged when they start
  (``operation.first``) and when they end (``operation.last``). The two entries of one
  ``operation.id`` collapse into one span with a real duration; a start without its end is an
  open span; an end without its start is a span of its own at its end time (noted).

``audit_id`` is ``operation.id`` (for Kubernetes requests it is the auditID) or ``insertId``;
``received`` is the entry's ``timestamp``. ``raw`` is the redacted LogEntry as JSON, or
``{"entries": [start, end]}`` for a collapsed operation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson

from .audit import BOM, NativeEvents, parse_time
from .base import (
    Format,
    ParseHints,
    Progress,
    Report,
    Row,
    nothing_found,
)
from .envelope_base import (
    count_note,
    looks_like_native_event,
    object_of_parts,
    read_document,
    values_of,
)
from .redact import Redactor

AUDIT_LOG_TYPE = "type.googleapis.com/google.cloud.audit.AuditLog"
K8S_METHOD = "io.k8s."
GKE_METHOD = "google.container."
NO_LATENCY = "no latency in a Google Cloud Logging export"
# google.rpc.Code to the HTTP status the request was answered with (as grpc-gateway maps them).
GRPC_TO_HTTP = {0: 200, 1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400,
                10: 409, 11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401}
_VERSION = re.compile(r"^v\d+(?:(?:alpha|beta)\d+)?$")
# A native audit event in YAML: a top-level (or list item) ``auditID:`` key.
_YAML_AUDIT_ID = re.compile(rb"^(?:- )?auditID:[ \t]", re.MULTILINE)
_EVERY = 4096


def sniff(head: bytes, name: str = "") -> bool:
    """True for Cloud Logging AuditLog entries about Kubernetes or GKE clusters (JSON or YAML),
    and for native audit events written as YAML. False for other Cloud Logging entries (node
    logs: kubelet, containerd) and for JSON audit logs, which the native parser reads."""
    if b"google.cloud.audit.AuditLog" in head:
        return K8S_METHOD.encode() in head or GKE_METHOD.encode() in head
    start = head.removeprefix(BOM).lstrip()[:1]
    return (start not in (b"{", b"[") and b"audit.k8s.io/" in head
            and _YAML_AUDIT_ID.search(head) is not None)


def parse(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
          progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield audit rows for the AuditLog entries (and YAML native events) in ``raw``.

    Entries that are not Kubernetes or GKE audit entries, or lack what a row needs, are skipped
    and recorded on ``report``; notes say what the export cannot give. Raises ``InputError``
    when nothing usable is found.
    """
    redactor = redactor or Redactor()
    data, counter = read_document(raw, report)
    reader = _Reader(report, redactor)
    native = NativeEvents(report, redactor)
    rows = entries = 0
    for value, line in values_of(data, report):
        for entry, label in _entries(value):
            entries += 1
            if looks_like_native_event(entry) and "protoPayload" not in entry:
                produced = native.feed(entry, line, None)
            else:
                produced = reader.feed(entry, line, label)
            for row in produced:
                rows += 1
                yield row
            if progress is not None and entries % _EVERY == 0:
                progress(counter.count, rows)
    for row in (*reader.flush(), *native.flush()):
        rows += 1
        yield row
    reader.add_notes()
    if progress is not None:
        progress(counter.count, rows)
    if rows == 0:
        raise nothing_found(report, "no Kubernetes or GKE audit entries found")


def _entries(value: Any) -> Iterator[tuple[Any, str]]:
    """The entries of one JSON value or YAML document, each with a label for skip reasons."""
    if isinstance(value, dict) and isinstance(value.get("entries"), list):
        value = value["entries"]  # an entries:list response
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield item, f"entry {index + 1}: "
    else:
        yield value, ""


class _Reader:
    """Turns entries into rows, holding the halves of long-running operations until the other
    half comes: exports are often newest first (``gcloud logging read`` is), so an operation's
    end usually precedes its start."""

    def __init__(self, report: Report, redactor: Redactor) -> None:
        self.report = report
        self.redactor = redactor
        # operation.id -> (row, redacted entry) of an operation's start, and of its end
        self.starts: dict[str, tuple[Row, dict[str, Any]]] = {}
        self.ends: dict[str, tuple[Row, dict[str, Any]]] = {}
        self.no_latency = 0
        self.ends_alone = 0
        self.open = 0
        self.other_methods: dict[str, int] = {}

    def feed(self, entry: Any, line: int, label: str) -> Iterator[Row]:
        reason = _not_audit(entry)
        if reason:
            self.report.skip(line, label + reason)
            return
        method = entry["protoPayload"]["methodName"]
        if not method.startswith((K8S_METHOD, GKE_METHOD)):
            payload = entry["protoPayload"]
            key = str(payload.get("serviceName") or method.split(".")[0])
            self.other_methods[key] = self.other_methods.get(key, 0) + 1
            self.report.skip(line, f"{label}not a Kubernetes or GKE audit entry "
                                   f"(methodName {method!r})")
            return
        try:
            row = _build(entry, line, self.report, self.redactor)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            self.report.skip(line, f"{label}audit entry with a malformed field ({exc})")
            return
        operation = entry.get("operation") if isinstance(entry.get("operation"), dict) else {}
        first, last = operation.get("first") is True, operation.get("last") is True
        if first == last:  # both (a plain request) or neither: the entry is the whole request
            self.no_latency += 1
            yield row
            return
        mine, other = (self.starts, self.ends) if first else (self.ends, self.starts)
        partner = other.pop(row.audit_id, None)
        if partner is not None:
            yield _span((row, entry), partner) if first else _span(partner, (row, entry))
            return
        repeated = mine.pop(row.audit_id, None)
        if repeated is not None:  # the same half twice: keep both, the earlier on its own
            yield from self._alone(repeated[0], first)
        mine[row.audit_id] = (row, entry)

    def flush(self) -> Iterator[Row]:
        """Halves whose other half is not in this file: a start is an open span, an end a span
        of its own at its end time."""
        for row, _entry in self.starts.values():
            yield from self._alone(row, True)
        for row, _entry in self.ends.values():
            yield from self._alone(row, False)
        self.starts.clear()
        self.ends.clear()

    def _alone(self, row: Row, start: bool) -> Iterator[Row]:
        if start:
            self.open += 1
            yield row._replace(completed=None, duration_ms=None, stage="RequestReceived")
        else:
            self.ends_alone += 1
            self.no_latency += 1
            yield row

    def add_notes(self) -> None:
        notes = self.report.notes
        if self.no_latency:
            notes.append(NO_LATENCY)
        if self.ends_alone:
            notes.append(f"{self.ends_alone} GKE operation end(s) without their start in this "
                         "file: each is a span of its own at its end time")
        if self.open:
            notes.append(f"{self.open} GKE operation(s) started without their end in this "
                         "file: open spans")
        if self.other_methods:
            notes.append(count_note(self.other_methods, "audit entries of other services "
                                                         "skipped"))


def _not_audit(entry: Any) -> str | None:
    """Why ``entry`` is not an AuditLog LogEntry, or None."""
    if not isinstance(entry, dict):
        return "not a Cloud Logging entry (not an object)"
    payload = entry.get("protoPayload")
    if not isinstance(payload, dict):
        kind = next((k for k in ("jsonPayload", "textPayload") if k in entry), None)
        log = str(entry.get("logName") or "").rpartition("/")[2]
        if kind or log:
            return f"not an audit entry ({kind or 'no protoPayload'}, log {log or '?'})"
        return "not a Cloud Logging entry (no protoPayload)"
    if payload.get("@type") != AUDIT_LOG_TYPE:
        return f"not an audit entry (protoPayload of type {payload.get('@type')!r})"
    if not isinstance(payload.get("methodName"), str) or not payload["methodName"]:
        return "audit entry without methodName"
    return None


def _build(entry: dict[str, Any], line: int, report: Report, redactor: Redactor) -> Row:
    """The row of one entry (as a complete request: ``completed`` = ``received``)."""
    payload = entry["protoPayload"]
    method: str = payload["methodName"]
    operation = entry.get("operation") if isinstance(entry.get("operation"), dict) else {}
    audit_id = operation.get("id") or entry.get("insertId")
    if not isinstance(audit_id, str) or not audit_id:
        raise ValueError("no operation.id or insertId")
    stamp = entry.get("timestamp") or entry.get("receiveTimestamp")
    if not stamp:
        raise ValueError("no timestamp")
    received = parse_time(stamp)
    if method.startswith(K8S_METHOD):
        verb, group, version, namespace, resource, name, subresource = _k8s_target(payload)
    else:
        verb, group, version, namespace, resource, name, subresource = _gke_target(payload)
    annotations = {str(k): str(v) for k, v in (entry.get("labels") or {}).items()}
    code = None
    status = payload.get("status")
    if isinstance(status, dict):
        grpc = int(status.get("code") or 0)  # proto3 leaves OK (0) out: {} is OK
        code = GRPC_TO_HTTP.get(grpc)
        annotations["grpc.code"] = str(grpc)
        if status.get("message"):
            annotations["grpc.message"] = str(status["message"])
    if method.startswith(GKE_METHOD):
        cluster, location = _cluster_of(payload.get("resourceName"))
        if cluster:
            annotations["container.googleapis.com/cluster"] = cluster
        if location:
            annotations["container.googleapis.com/location"] = location
    report.redacted += _redact(entry, resource, subresource, redactor)
    authentication = payload.get("authenticationInfo") or {}
    metadata = payload.get("requestMetadata") or {}
    return Row(
        audit_id,
        received,
        received,
        None,
        verb,
        str(authentication.get("principalEmail") or ""),
        [],
        "",
        str(metadata.get("callerSuppliedUserAgent") or ""),
        str(metadata.get("callerIp") or ""),
        resource,
        subresource,
        namespace,
        name,
        group,
        version,
        "",
        "",
        code,
        "",
        "ResponseComplete",
        "",
        annotations,
        report.source,
        line,
        _dumps(entry),
    )


def _k8s_target(payload: dict[str, Any]) -> tuple[str, str, str, str, str, str, str]:
    """verb, group, version, namespace, resource, name, subresource of a Kubernetes request:
    from ``resourceName`` (which spells the group in full: rbac.authorization.k8s.io), else from
    ``methodName`` alone."""
    tokens = payload["methodName"][len(K8S_METHOD):].split(".")
    verb = tokens[-1]
    resource_name = payload.get("resourceName")
    if isinstance(resource_name, str):
        parts = resource_name.strip("/").split("/")
        if len(parts) >= 3 and _VERSION.match(parts[1]):
            group = "" if parts[0] == "core" else parts[0]
            namespace, resource, name, subresource = object_of_parts(parts[2:])
            return verb, group, parts[1], namespace, resource, name, subresource
    index = next((i for i, t in enumerate(tokens[:-1]) if _VERSION.match(t)), None)
    if index is None:
        return verb, "", "", "", "", "", ""
    group = ".".join(tokens[:index])
    rest = tokens[index + 1:-1]
    return (verb, "" if group == "core" else group, tokens[index], "",
            rest[0] if rest else "", "", rest[1] if len(rest) > 1 else "")


def _gke_target(payload: dict[str, Any]) -> tuple[str, str, str, str, str, str, str]:
    """verb, group, version, namespace, resource, name, subresource of a cluster operation:
    ``google.container.v1.ClusterManager.CreateNodePool`` on ``.../clusters/c/nodePools/np`` is
    verb createnodepool, resource nodepools, name np."""
    tokens = payload["methodName"].split(".")
    verb = tokens[-1].lower()
    version = next((t for t in tokens if _VERSION.match(t)), "")
    group = str(payload.get("serviceName") or "container.googleapis.com")
    resource = name = ""
    resource_name = payload.get("resourceName")
    if isinstance(resource_name, str):
        parts = resource_name.strip("/").split("/")
        if "nodePools" in parts and parts.index("nodePools") + 1 < len(parts):
            resource, name = "nodepools", parts[parts.index("nodePools") + 1]
        elif "clusters" in parts and parts.index("clusters") + 1 < len(parts):
            resource, name = "clusters", parts[parts.index("clusters") + 1]
    return verb, group, version, "", resource, name, ""


def _cluster_of(resource_name: Any) -> tuple[str, str]:
    if not isinstance(resource_name, str):
        return "", ""
    parts = resource_name.strip("/").split("/")
    cluster = location = ""
    for key, value in zip(parts, parts[1:], strict=False):
        if key == "clusters":
            cluster = value
        elif key in ("zones", "locations"):
            location = value
    return cluster, location


def _span(start: tuple[Row, dict[str, Any]], end_half: tuple[Row, dict[str, Any]]) -> Row:
    """One row for an operation's start and end entries: the start's time, line and details
    (the end entry carries little more than the final status), the end's time and status."""
    first, first_entry = start
    end, end_entry = end_half
    merged = {field: getattr(first, field) or getattr(end, field)
              for field in ("verb", "username", "user_agent", "source_ip", "resource", "name",
                            "api_group", "api_version")}
    status_known = "grpc.code" in end.annotations
    return first._replace(
        completed=end.received,
        duration_ms=(end.received - first.received).total_seconds() * 1000.0,
        code=end.code if status_known else first.code,
        stage="ResponseComplete",
        annotations={**first.annotations, **end.annotations},
        raw=_dumps({"entries": [first_entry, end_entry]}),
        **merged,
    )


def _redact(entry: dict[str, Any], resource: str, subresource: str, redactor: Redactor) -> int:
    """Redact an entry in place: the request and response bodies as the objects of their
    resource (Secret data, tokens, …) and the configured extra paths, named as in native events
    (``requestObject.…``), then tokens in any string of the entry."""
    if not redactor.enabled:
        return 0
    payload = entry["protoPayload"]
    shim = {"objectRef": {"resource": resource, "subresource": subresource},
            "requestObject": payload.get("request"), "responseObject": payload.get("response")}
    count = redactor.redact_event(shim)
    # The shim holds the entry's own body objects, so they are redacted in place; the pass over
    # the whole entry then finds tokens elsewhere (labels, metadata).
    count += Redactor().redact_event({"entry": entry})
    return count


def _dumps(value: Any) -> bytes:
    # YAML may give non-string keys or values JSON lacks; raw must still be one JSON line.
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS)


FORMAT = Format("gke-audit", sniff, parse)
