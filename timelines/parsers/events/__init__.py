"""Kubernetes Event objects (core/v1 ``Event`` and ``events.k8s.io``) into one row per Event.

Input, gzipped or not:
- JSON: an ``EventList`` or ``List`` (``kubectl get events -o json``, items with or without their
  own kind, as the raw API returns them), a single Event, a JSON array of Events or of watch
  events (``{"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}}``, extra envelope keys such as
  a log shipper's are ignored), JSON lines of any of these, or pretty-printed documents one after
  another (``kubectl get events -w -o json``).
- YAML: an ``EventList``, a single Event, or a multi-document stream mixing Events with other
  objects (only Events become rows; the others are counted in a note, not errors).

Kubernetes objects of every other kind (in the same file, or in a file of objects only, which
``OBJECTS_FORMAT`` claims) become state rows (``state``: a snapshot at the capture time and the
time points the object records). What is neither is left alone, and said so: watch
``BOOKMARK``/``ERROR`` notices, values without kind or metadata, and kube-apiserver audit events
(``audit.k8s.io``), whose kind is also "Event" but which belong to the audit parser. An empty
list is no failure: it yields nothing.

One row per Event identity (``event:<metadata.uid>``, else ``event:<namespace>/<name>``, else a
hash of its content): repeated sightings in the file (a watch stream's ADDED then MODIFIED, the
same Event in two lists) collapse into the latest one (highest count, then latest last time, then
highest resourceVersion). Collapsing needs the whole file, so rows are yielded at the end, in time
order; memory is bounded by the distinct Events, plus the document being read.

A row is the span first→last time of the Event: ``received`` is ``firstTimestamp`` /
``deprecatedFirstTimestamp`` / ``eventTime`` / ``metadata.creationTimestamp`` (the first set),
``completed`` the latest of ``lastTimestamp`` / ``deprecatedLastTimestamp`` /
``series.lastObservedTime`` (else ``received``). Times are timezone-aware UTC.

Bad input never loses good input: a malformed line, document or list item is skipped and recorded
on the report (``source:line: reason``) and the rest is read; inside a broken pretty-printed list
the items are salvaged one by one. ``InputError`` when the file holds no usable Event or object
at all (and is not an empty list).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import BinaryIO

from ..base import Format, InputError, ParseHints, Progress, Report, Row, open_lines
from ..redact import Redactor
from .collector import MAX_DEPTH, PROGRESS_DOCUMENTS, WATCH_TYPES, Collector, describe
from .documents import BIG_YAML_DOCUMENT, BOM, MAX_DOCUMENT_BYTES, YAML_ERRORS, read_documents
from .fields import EVENT_API_VERSIONS, HASHED_ID, IRREGULAR_PLURALS, TIME_KEYS

# The package, by capability: this module sniffs and drives a parse; ``documents`` decodes JSON,
# JSON lines, concatenated JSON, YAML documents and watch streams into candidate objects with their
# line numbers; ``collector`` tells Events from other objects and keeps the latest sighting of
# each; ``fields`` turns one Event object into a ``Row``. The limits are re-exported here to be
# read; to change one (as a test does), patch it in the module that uses it.
PROGRESS_LINES = 4096

# --- sniffing ---------------------------------------------------------------------------------
# Regular expressions over the raw head, JSON ("key": …) or YAML (key: … at a line start, maybe a
# list item). They also match in a head cut mid-document.


def _key(names: str) -> bytes:
    return rb'"(?:' + names.encode() + rb')"\s*:|^[ \t-]*(?:' + names.encode() + rb'):'


# Audit events are kind "Event" too, and at RequestResponse level they carry the Event objects
# they wrote; AdmissionReview captures carry them as well. Any auditID, or an audit.k8s.io or
# admission.k8s.io apiVersion, means one of those, never a file of Events.
_WRAPPERS = re.compile(
    rb'"auditID"\s*:|^[ \t-]*auditID:'
    rb'|"apiVersion"\s*:\s*"(?:audit|admission)\.k8s\.io/'
    rb'|^[ \t-]*apiVersion:[ \t]*["\']?(?:audit|admission)\.k8s\.io/', re.MULTILINE)
_KIND_EVENT = re.compile(
    rb'"kind"\s*:\s*"Event"|^[ \t-]*kind:[ \t]*["\']?Event["\']?[ \t]*\r?$', re.MULTILINE)
_KIND_EVENT_LIST = re.compile(
    rb'"kind"\s*:\s*"EventList"|^[ \t-]*kind:[ \t]*["\']?EventList["\']?[ \t]*\r?$', re.MULTILINE)
_SUBJECT = re.compile(_key("involvedObject|regarding"), re.MULTILINE)
_EVENT_TIMES = re.compile(
    _key("firstTimestamp|lastTimestamp|deprecatedFirstTimestamp|deprecatedLastTimestamp"),
    re.MULTILINE)
_REASON = re.compile(_key("reason"), re.MULTILINE)
_MESSAGE = re.compile(_key("message|note"), re.MULTILINE)


def sniff(head: bytes, name: str = "") -> bool:
    """True if the first bytes of a (decompressed) file hold Kubernetes Events.

    Needs Event-specific keys, not just the word: ``kind: Event`` with ``involvedObject`` /
    ``regarding`` or first/last timestamps, an ``EventList`` (even an empty one), kind-less list
    items with both, or reason+message+first/last timestamp (the insights-operator archive keeps
    only those). False for audit logs and for look-alikes such as OpenShift's ``APIRequestCount``
    named ``events.v1``, and for AdmissionReview captures. ``name`` is not used: content decides.
    """
    if _WRAPPERS.search(head):
        return False
    if _KIND_EVENT_LIST.search(head):
        return True
    subject = _SUBJECT.search(head) is not None
    times = _EVENT_TIMES.search(head) is not None
    if _KIND_EVENT.search(head) and (subject or times):
        return True
    if not _REASON.search(head):
        return False
    return times and (subject or _MESSAGE.search(head) is not None)


# --- parsing ----------------------------------------------------------------------------------


def capture_time(hints: ParseHints | None) -> datetime | None:
    """When the file's objects were captured: the bundle's own record of its collection (the
    must-gather ``timestamp`` file, sonobuoy's run log), not the archive's file times, which a
    copy changes; None when there is none (the objects' latest time stands in)."""
    if hints is None or hints.collected is None or "file times" in hints.year_reason:
        return None
    return hints.collected


def parse(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
          progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield one ``Row`` (kind "event") per Kubernetes Event identity found in ``raw``.

    Malformed lines, documents and list items are skipped and recorded on ``report``; objects
    that are not Events are counted in a note. Bearer tokens, basic credentials and JWTs in any
    string of an Event are replaced before anything is stored (count in ``report.redacted``).
    ``progress(bytes_read, events_so_far)`` is called every 4096 lines and at the end. ``hints``
    are not used: an Event names its own node and component. Raises ``InputError`` when the file
    holds no usable Event, or a document over ``MAX_DOCUMENT_BYTES``.
    """
    lines, counter = open_lines(raw, report)

    def report_progress() -> None:
        if progress is not None:
            progress(counter.count, len(collector.best))

    collector = Collector(report, redactor or Redactor(), report_progress)

    def tick(number: int) -> None:
        if number % PROGRESS_LINES == 0:
            report_progress()

    read_documents(enumerate(lines, start=1), collector, tick)

    rows = collector.rows()
    state = collector.state_rows(capture_time(hints))
    if state:
        rows = sorted([*rows, *state], key=lambda row: (row.received, row.audit_id))
    if progress is not None:
        progress(counter.count, len(rows))
    if (not rows and collector.empty_lists and not collector.others and not collector.state
            and not report.errors):
        # An empty list (``items: []``) is evidence too: nothing was there at capture.
        report.notes.append("the list is empty")
        return
    if not rows:
        details = []
        if collector.state:
            details.append("only objects with no time and no capture time: "
                           f"{describe(collector.state.kinds())}")
        if collector.others:
            details.append(f"only other objects: {describe(collector.others)}")
        if report.errors:
            details.append(f"first problem: {report.errors[0]}")
        suffix = f" ({'; '.join(details)})" if details else ""
        raise InputError(f"{report.source}: no Kubernetes Events found{suffix}")
    yield from rows


_OBJECT_START = re.compile(rb"\A(?:\s*(?:#[^\n]*)?\n)*(?:[ \t]*[{\[]|---|[A-Za-z][\w.-]*:)")
_AUDIT_ID = re.compile(rb'"auditID"\s*:')
_KINDLESS = re.compile(rb'\s*\[?\s*\{\s*"metadata"\s*:\s*\{')
_SELF_LINK = re.compile(rb'"selfLink"\s*:\s*"/apis?/')
_FIRST_API_VERSION = re.compile(
    rb'"apiVersion"\s*:\s*"([^"]*)"|^[ \t-]*apiVersion:[ \t]*["\']?([^\s"\']*)', re.MULTILINE)
_OBJECT_KEYS = tuple(re.compile(_key(name), re.MULTILINE)
                     for name in ("kind", "items", "metadata"))


def sniff_objects(head: bytes, name: str = "") -> bool:
    """True if the first bytes of a (decompressed) file look like Kubernetes objects of any kind
    (or a List of them): a JSON or YAML document with ``apiVersion`` and either ``kind`` and
    ``metadata`` or ``items``.
    Audit and admission captures are not (``_WRAPPERS``); the Event sniff goes first."""
    text = head.removeprefix(BOM)
    if not _OBJECT_START.match(text) or _AUDIT_ID.search(text):
        return False
    if _KINDLESS.match(text) and _SELF_LINK.search(text):
        return True  # the raw API's objects (sonobuoy's resources/): the selfLink names them
    # Only the first apiVersion says what the file is: ConfigMaps quote audit policies.
    first = _FIRST_API_VERSION.search(text)
    if first is None or (first[1] or first[2]).startswith((b"audit.k8s.io/", b"admission.k8s.io/")):
        return False
    # A List's first item may begin past the head (a ConfigMap of certificates): its items do.
    kind, items, metadata = (key.search(text) for key in _OBJECT_KEYS)
    return bool(kind and metadata or items)


FORMAT = Format("k8s-events", sniff, parse)
# Objects of other kinds are read by the same parser (a file may mix them with Events): state
# rows (``state``), and the Events among them as above.
OBJECTS_FORMAT = Format("k8s-objects", sniff_objects, parse)

__all__ = ["BIG_YAML_DOCUMENT", "BOM", "EVENT_API_VERSIONS", "FORMAT", "HASHED_ID",
           "IRREGULAR_PLURALS", "MAX_DEPTH", "MAX_DOCUMENT_BYTES", "OBJECTS_FORMAT",
           "PROGRESS_DOCUMENTS", "PROGRESS_LINES", "TIME_KEYS", "WATCH_TYPES", "YAML_ERRORS",
           "parse", "sniff", "sniff_objects"]
