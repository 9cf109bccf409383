"""The legacy text audit format (``--audit-log-format=legacy``) into audit rows.

Two generations of it:
- Kubernetes 1.6/1.7 (the basic audit log): a request line
  ``<time> AUDIT: id="…" ip="…" method="GET" user="…" groups="…" as="<self>" asgroups="<lookup>"
  namespace="…" uri="…"`` when the request arrives and a response line ``<time> AUDIT: id="…"
  response="200"`` when it is answered. The two collapse by id into one span: the request line's
  time is ``received``, the response line's is ``completed``.
- Kubernetes 1.8+ (the legacy backend of advanced auditing): one line per stage with every field
  (``stage="…"``, ``method`` holding the verb, ``user-agent``, ``response="<deferred>"`` until it
  is known), each stamped with the request's received time. Stages collapse by (id, time) as in
  the native log; every line has the same time, so there is no latency.

There is no objectRef and no body: verb, resource, namespace, name and subresource are what the
apiserver makes of the method and URI (``/api/v1/namespaces/ns/pods/name/log``,
``/apis/group/version/…``). ``raw`` is a JSON object of the line's fields (both lines' for a
collapsed pair), redacted. Memory is bounded by the requests in flight.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any, BinaryIO

import orjson

from .audit import FINAL_STAGES, STAGE_RANK, parse_time
from .base import (
    Format,
    ParseHints,
    Progress,
    Report,
    Row,
    nothing_found,
    open_lines,
)
from .envelope_base import request_info
from .redact import Redactor

NOTE = "legacy audit format: no objectRef or bodies; resource and name come from the URI"
NO_LATENCY = ("legacy audit format with stages: every line carries the request's received time, "
              "so there is no latency")
HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
                          "CONNECT", "TRACE"))
_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\S+) AUDIT: (.*?)\s*$")
_FIELD = re.compile(r'([A-Za-z][\w-]*)="((?:[^"\\]|\\.)*)"')
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)")
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                   "\\": "\\", '"': '"', "'": "'"}
_SNIFF = re.compile(rb'^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d) AUDIT: id="', re.MULTILINE)
_EVERY = 4096
# Placeholders the apiserver writes for "not known".
_NONE = frozenset(("<none>", "<unknown>", "<self>", "<lookup>", "<deferred>"))


def sniff(head: bytes, name: str = "") -> bool:
    """True if a line of the head is a legacy audit line (``<RFC 3339 time> AUDIT: id="``)."""
    return _SNIFF.search(head) is not None


def parse(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
          progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield one audit row per request in a legacy audit log.

    Lines that are not legacy audit lines, or lack an id, are skipped and recorded on
    ``report``; so is a response line whose request line is not in the file. Requests without
    their response are open spans. Raises ``InputError`` when no request is found.
    """
    redactor = redactor or Redactor()
    lines, counter = open_lines(raw, report)
    # Old generation: id -> (line number, time, fields). New: (id, time) -> (rank, number, fields).
    requests: dict[str, tuple[int, datetime, dict[str, Any]]] = {}
    staged: dict[tuple[str, str], tuple[int, int, dict[str, Any]]] = {}
    rows = 0
    staged_seen = False
    for number, line_bytes in enumerate(lines, start=1):
        if number == 1 and line_bytes.startswith(b"\xef\xbb\xbf"):
            line_bytes = line_bytes[3:]
        try:
            text = line_bytes.decode("utf-8")
        except UnicodeDecodeError:
            report.skip(number, "not valid UTF-8")
            continue
        if not text.strip():
            continue
        match = _LINE.match(text.strip())
        if match is None:
            report.skip(number, "not a legacy audit line (<time> AUDIT: key=\"value\" …)")
            continue
        fields: dict[str, Any] = {key: _unquote(value) for key, value in
                                  _FIELD.findall(match.group(2))}
        stamp = match.group(1)
        audit_id = fields.get("id")
        if not audit_id:
            report.skip(number, "legacy audit line without id")
            continue
        try:
            moment = parse_time(stamp)
        except ValueError as exc:
            report.skip(number, f"legacy audit line with a malformed time ({exc})")
            continue
        fields = {"time": stamp, **fields}
        produced: list[Row] = []
        if "stage" in fields:
            staged_seen = True
            produced = _staged(fields, audit_id, stamp, number, staged, report, redactor)
        elif "method" in fields or "uri" in fields:
            earlier = requests.pop(audit_id, None)
            if earlier is not None:  # the id came again before its response: keep both
                produced.append(_row(*earlier, None, report, redactor))
            requests[audit_id] = (number, moment, fields)
        elif "response" in fields:
            request = requests.pop(audit_id, None)
            if request is None:
                report.skip(number, f"response line for id {audit_id!r} without its request line "
                                    "in this file")
                continue
            produced.append(_row(*request, (moment, fields), report, redactor))
        else:
            report.skip(number, "legacy audit line with neither a request nor a response")
            continue
        for row in produced:
            rows += 1
            yield row
        if progress is not None and number % _EVERY == 0:
            progress(counter.count, rows)

    # Requests not answered in this file: open spans.
    for number, moment, fields in requests.values():
        rows += 1
        yield _row(number, moment, fields, None, report, redactor)
    for _rank, number, fields in staged.values():
        rows += 1
        yield _row(number, parse_time(fields["time"]), fields, None, report, redactor)
    requests.clear()
    staged.clear()
    if progress is not None:
        progress(counter.count, rows)
    if rows == 0:
        raise nothing_found(report, "no legacy audit lines found")
    report.notes.append(NOTE)
    if staged_seen:
        report.notes.append(NO_LATENCY)


def _staged(fields: dict[str, Any], audit_id: str, stamp: str, number: int, staged: dict,
            report: Report, redactor: Redactor) -> list[Row]:
    """A 1.8+ line: final stages make the row, earlier ones wait (the latest stage kept)."""
    key = (audit_id, stamp)
    stage = fields["stage"]
    if stage in FINAL_STAGES:
        staged.pop(key, None)
        moment = parse_time(stamp)
        return [_row(number, moment, fields, (moment, None), report, redactor)]
    rank = STAGE_RANK.get(stage, 0)
    previous = staged.get(key)
    if previous is None or previous[0] <= rank:
        staged[key] = (rank, number, fields)
    return []


def _row(number: int, received: datetime, fields: dict[str, Any],
         response: tuple[datetime, dict[str, Any] | None] | None, report: Report,
         redactor: Redactor) -> Row:
    """The row of a request line (and its response, when ``response`` is ``(time, fields)``;
    fields None when the request's own line carried the final stage)."""
    if response is not None and response[1] is not None:
        fields = {**fields, "responseTime": response[1]["time"],
                  "response": response[1].get("response", "")}
    report.redacted += _redact(fields, redactor)
    method = str(fields.get("method") or "")
    uri = str(fields.get("uri") or "")
    if method.upper() in HTTP_METHODS and method.isupper():
        info = request_info(uri, method)
        verb = info.verb
    else:  # 1.8+: the method field is the verb already
        info = request_info(uri, "GET")
        verb = method
    stage = fields.get("stage") or ("ResponseComplete" if response else "RequestReceived")
    completed = duration = None
    if response is not None:
        completed = response[0]
        if response[1] is not None:  # a response line of its own: its time is the end
            duration = (completed - received).total_seconds() * 1000.0
    code_text = _known(fields.get("response"))
    groups = _known(fields.get("groups"))
    namespace = info.namespace or _known(fields.get("namespace"))
    return Row(
        fields["id"],
        received,
        completed,
        duration,
        verb,
        _known(fields.get("user")),
        [_unquote(g) for g in _QUOTED.findall(groups)] if groups else [],
        _known(fields.get("as")),
        _known(fields.get("user-agent")),
        _known(fields.get("ip")),
        info.resource,
        info.subresource,
        namespace,
        info.name,
        info.api_group,
        info.api_version,
        "",
        "",
        int(code_text) if code_text.isdigit() else None,
        "",
        stage,
        uri,
        {},
        report.source,
        number,
        orjson.dumps(fields),
    )


def _redact(fields: dict[str, Any], redactor: Redactor) -> int:
    """Credentials in the URI's query and tokens in any field, replaced in place."""
    if not redactor.enabled:
        return 0
    shim = {"requestURI": fields.get("uri"), "fields": fields}
    count = redactor.redact_event(shim)
    if isinstance(shim["requestURI"], str):
        fields["uri"] = shim["requestURI"]
    return count


def _known(value: Any) -> str:
    """A field's value, or "" for the apiserver's placeholders (<none>, <self>, …)."""
    if not isinstance(value, str) or value in _NONE:
        return ""
    return value


def _unquote(value: str) -> str:
    """The value of a Go ``%q`` string (without its quotes)."""
    if "\\" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        escape = match.group(1)
        if escape[0] in "xuU" and len(escape) > 1:
            return chr(int(escape[1:], 16))
        if escape[0] in "01234567" and len(escape) == 3:
            return chr(int(escape, 8))
        return _SIMPLE_ESCAPES.get(escape, escape)

    return _ESCAPE.sub(replace, value)


FORMAT = Format("legacy-audit", sniff, parse)
