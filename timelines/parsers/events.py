"""Kubernetes Event objects (core/v1 ``Event`` and ``events.k8s.io``) into one row per Event.

Input, gzipped or not:
- JSON: an ``EventList`` or ``List`` (``kubectl get events -o json``, items with or without their
  own kind, as the raw API returns them), a single Event, a JSON array of Events or of watch
  events (``{"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}}``, extra envelope keys such as
  a log shipper's are ignored), JSON lines of any of these, or pretty-printed documents one after
  another (``kubectl get events -w -o json``).
- YAML: an ``EventList``, a single Event, or a multi-document stream mixing Events with other
  objects (only Events become rows; the others are counted in a note, not errors).

Everything that is not an Event is left alone, and said so: objects of other kinds, watch
``BOOKMARK``/``ERROR`` notices, and kube-apiserver audit events (``audit.k8s.io``), whose kind is
also "Event" but which belong to the audit parser.

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
the items are salvaged one by one. ``InputError`` when the file holds no usable Event at all.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, date, datetime
from typing import Any, BinaryIO

import orjson
import yaml

from .base import Format, InputError, ParseHints, Progress, Report, Row, open_lines
from .redact import Redactor, _may_hold_token, _redact_strings

try:
    _YAML_LOADER: Any = yaml.CSafeLoader
except AttributeError:  # PyYAML built without libyaml: same results, slower
    _YAML_LOADER = yaml.SafeLoader

# A document (pretty JSON, YAML) is held in memory to be parsed; beyond this it is not an export
# of Events anyone should upload whole.
MAX_DOCUMENT_BYTES = 512 * 1024**2
PROGRESS_LINES = 4096
PROGRESS_DOCUMENTS = 256
# A YAML list bigger than this is parsed item by item: on one document PyYAML holds the whole node
# graph (some 30 times the text) and is over twice as slow as on its items one at a time.
BIG_YAML_DOCUMENT = 4 * 1024**2
MAX_DEPTH = 4  # lists of lists of watch events of Events: deeper nesting is not a Kubernetes shape
BOM = b"\xef\xbb\xbf"
HASHED_ID = "/~"  # "~" is not allowed in a Kubernetes name: such a key is always our hash
WATCH_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED"))
EVENT_API_VERSIONS = frozenset(("v1", "events.k8s.io/v1", "events.k8s.io/v1beta1"))
TIME_KEYS = ("firstTimestamp", "lastTimestamp", "eventTime", "deprecatedFirstTimestamp",
             "deprecatedLastTimestamp", "series")

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
    numbered = enumerate(lines, start=1)

    def report_progress() -> None:
        if progress is not None:
            progress(counter.count, len(collector.best))

    collector = _Collector(report, redactor or Redactor(), report_progress)

    def tick(number: int) -> None:
        if number % PROGRESS_LINES == 0:
            report_progress()

    # The first non-blank line decides: JSON starts with { or [, anything else is YAML.
    leading: list[tuple[int, bytes]] = []
    for number, line in numbered:
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        leading.append((number, line))
        if line.strip():
            break
    first = leading[-1][1].strip() if leading else b""
    everything = _chain(leading, numbered)

    def read_all(what: str) -> list[bytes]:
        kept: list[bytes] = []
        size = 0
        for number, line in everything:
            size += len(line)
            if size > MAX_DOCUMENT_BYTES:
                raise InputError(f"{report.source}: {what} over {MAX_DOCUMENT_BYTES} bytes; "
                                 "split it into smaller files")
            kept.append(line)
            tick(number)
        return kept

    if first in (b"{", b"["):
        # A pretty-printed document (kubectl get events -o json): one parse of the whole is the
        # common case; documents one after another, or a broken one, go line by line after all.
        text_lines = read_all("a JSON document")
        try:
            value = orjson.loads(b"".join(text_lines))
        except orjson.JSONDecodeError:
            reader = _JsonReader(collector)
            for number, line in enumerate(text_lines, start=1):
                reader.feed(number, line)
                tick(number)
            reader.finish()
        else:
            collector.visit(value, leading[-1][0])
    elif first[:1] in (b"{", b"["):
        reader = _JsonReader(collector)  # JSON lines (or a minified document): streamed
        for number, line in everything:
            reader.feed(number, line)
            tick(number)
        reader.finish()
    elif first:
        _read_yaml(read_all("YAML"), collector)

    rows = collector.rows()
    if progress is not None:
        progress(counter.count, len(rows))
    if not rows:
        details = []
        if collector.others:
            details.append(f"only other objects: {_describe(collector.others)}")
        elif collector.empty_lists and not report.errors:
            details.append("the list is empty")
        if report.errors:
            details.append(f"first problem: {report.errors[0]}")
        suffix = f" ({'; '.join(details)})" if details else ""
        raise InputError(f"{report.source}: no Kubernetes Events found{suffix}")
    yield from rows


def _chain(first: list[tuple[int, bytes]],
           rest: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    yield from first
    yield from rest


class _Collector:
    """Turns parsed values into rows, keeps the latest sighting of each Event, and remembers what
    the report's notes will say."""

    def __init__(self, report: Report, redactor: Redactor,
                 heartbeat: Callable[[], None] | None = None) -> None:
        self.report = report
        self.redactor = redactor
        self.heartbeat = heartbeat  # called every PROGRESS_DOCUMENTS parsed YAML documents
        self.documents = 0
        # audit_id → (rank, row, values redacted in it, whether it had no first time)
        self.best: dict[str, tuple[tuple[int, datetime, int], Row, int, bool]] = {}
        self.sightings = 0  # Events seen, usable or not
        self.built = 0  # sightings that made a row (before collapsing)
        self.others: Counter[str] = Counter()
        self.watch_errors: list[str] = []
        self.empty_lists = 0
        self.bad_times = 0

    def visit(self, value: Any, line: int, item_lines: list[int] | None = None,
              depth: int = 0) -> None:
        """Every Event in ``value`` (found at ``line``; ``item_lines`` are its items' lines when
        known) is added; everything else is counted or reported."""
        if value is None:  # an empty YAML document, a null list
            return
        if depth > MAX_DEPTH:
            self.report.skip(line, "nested too deep to be Kubernetes Events")
            return
        if isinstance(value, list):
            if item_lines is None or len(item_lines) != len(value):
                item_lines = [line] * len(value)
            for item, item_line in zip(value, item_lines, strict=True):
                self.visit(item, item_line, None, depth + 1)
            return
        if not isinstance(value, dict):
            self.report.skip(line, f"not an object ({type(value).__name__})")
            return
        kind = value.get("kind")
        watch_type = value.get("type")
        if isinstance(value.get("object"), dict) and isinstance(watch_type, str) and (
                watch_type in WATCH_TYPES or watch_type in ("BOOKMARK", "ERROR")):
            self._watch_event(watch_type, value["object"], line)
        elif (isinstance(kind, str) and kind.endswith("List")) or (
                kind is None and isinstance(value.get("items"), list)):
            if not value.get("items"):
                self.empty_lists += 1
            self.visit(value.get("items"), line, item_lines, depth + 1)
        elif _is_event(value):
            self.add_event(value, line)
        else:
            self.others[kind if isinstance(kind, str) and kind else "object without kind"] += 1

    def _watch_event(self, watch_type: str, obj: dict[str, Any], line: int) -> None:
        if watch_type in WATCH_TYPES and _is_event(obj):
            self.add_event(obj, line)  # DELETED carries the Event's last state too
        elif watch_type in WATCH_TYPES:
            self.others[str(obj.get("kind") or "object without kind")] += 1
        else:
            self.others[f"watch {watch_type}"] += 1
            if watch_type == "ERROR" and len(self.watch_errors) < 3:
                # A Status: e.g. 410 Gone, the stream has a gap here.
                self.watch_errors.append(f"line {line}: {obj.get('message') or obj}")

    def document_parsed(self) -> None:
        self.documents += 1
        if self.heartbeat is not None and self.documents % PROGRESS_DOCUMENTS == 0:
            self.heartbeat()

    def add_event(self, event: dict[str, Any], line: int) -> None:
        self.sightings += 1
        try:
            built = self._build(event, line)
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            self.report.skip(line, f"Event with a malformed field ({exc})")
            return
        if built is None:
            return
        self.built += 1
        previous = self.best.get(built[1].audit_id)
        # Ties go to the later sighting: later in a stream is newer.
        if previous is None or built[0] >= previous[0]:
            self.best[built[1].audit_id] = built

    def _time(self, container: dict[str, Any], key: str) -> datetime | None:
        try:
            return _parse_time(container.get(key))
        except (ValueError, TypeError, OverflowError):
            self.bad_times += 1  # one bad field does not cost the Event; noted
            return None

    def _build(self, event: dict[str, Any],
               line: int) -> tuple[tuple[int, datetime, int], Row, int, bool] | None:
        """The row for one sighting of an Event, with its rank among sightings, the number of
        values redacted and whether its time is only a last time; None (recorded on the report)
        when it has no usable time."""
        # Redact first, so that the row's message is as clean as its raw JSON. Walking every
        # Event costs more than the rest of the row: the serialised form says whether to.
        raw = _dumps(event)
        redacted = 0
        if self.redactor.enabled and _may_hold_token(raw):
            redacted = _redact_strings(event)
            if redacted:
                raw = _dumps(event)
        meta = _mapping(event.get("metadata"), "metadata")
        involved = event.get("involvedObject")
        if involved is None:
            involved = event.get("regarding")
        involved = _mapping(involved, "involvedObject/regarding")
        source = _mapping(event.get("source"), "source")
        old_source = _mapping(event.get("deprecatedSource"), "deprecatedSource")
        series = _mapping(event.get("series"), "series")

        firsts = [self._time(event, "firstTimestamp"),
                  self._time(event, "deprecatedFirstTimestamp"),
                  self._time(event, "eventTime"), self._time(meta, "creationTimestamp")]
        lasts = [t for t in (self._time(event, "lastTimestamp"),
                             self._time(event, "deprecatedLastTimestamp"),
                             self._time(series, "lastObservedTime")) if t is not None]
        received = next((t for t in firsts if t is not None), None)
        without_first = received is None
        if received is None:
            if not lasts:
                self.report.skip(line, "Event without a usable time (no firstTimestamp, "
                                       "eventTime, lastTimestamp, series or creationTimestamp)")
                return None
            received = min(lasts)
        # firstTimestamp/lastTimestamp are whole seconds while eventTime has microseconds: a last
        # time a fraction before the first is the same instant, not a negative span.
        completed = max([received, *lasts])
        count = max((c for c in (_count(series.get("count")), _count(event.get("count")),
                                 _count(event.get("deprecatedCount"))) if c is not None),
                    default=1)

        namespace = _text(meta.get("namespace"), "metadata.namespace") or _text(
            event.get("namespace"), "namespace")
        uid = _text(meta.get("uid"), "metadata.uid")
        name = _text(meta.get("name"), "metadata.name")
        if uid:
            audit_id = f"event:{uid}"
        elif name:
            audit_id = f"event:{namespace}/{name}"
        else:
            # No identity of its own (insights-operator keeps only reason, message, times): the
            # content that does not change between sightings stands in.
            digest = hashlib.sha256(orjson.dumps(
                [involved, event.get("reason"), event.get("message"), event.get("note"),
                 event.get("type"), source, received.isoformat()],
                default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()
            audit_id = f"event:{namespace}{HASHED_ID}{digest[:20]}"

        kind = _text(involved.get("kind"), "involvedObject.kind")
        group_version = _text(involved.get("apiVersion"), "involvedObject.apiVersion")
        api_group, _, api_version = group_version.rpartition("/")
        involved_name = _text(involved.get("name"), "involvedObject.name")
        # A cluster-scoped object (Node) has no namespace though its Event lives in "default";
        # only an Event that names no object at all falls back to its own namespace.
        involved_namespace = _text(involved.get("namespace"), "involvedObject.namespace") or (
            "" if kind or involved_name else namespace)
        annotations = {}
        field_path = _text(involved.get("fieldPath"), "involvedObject.fieldPath")
        if field_path:  # spec.containers{app}: a part of the object, not an API subresource
            annotations["fieldPath"] = field_path
        action = _text(event.get("action"), "action")
        if action:
            annotations["action"] = action

        row = Row(
            audit_id=audit_id,
            received=received,
            completed=completed,
            duration_ms=(completed - received).total_seconds() * 1000.0,
            resource=_plural(kind),
            namespace=involved_namespace,
            name=involved_name,
            api_group=api_group,
            api_version=api_version,
            object_uid=_text(involved.get("uid"), "involvedObject.uid"),
            resource_version=_text(involved.get("resourceVersion"),
                                   "involvedObject.resourceVersion"),
            annotations=annotations,
            source=self.report.source,
            line=line,
            raw=raw,
            kind="event",
            message=_text(event.get("message"), "message") or _text(event.get("note"), "note"),
            reason=_text(event.get("reason"), "reason"),
            severity=_text(event.get("type"), "type"),
            component=(_text(source.get("component"), "source.component")
                       or _text(old_source.get("component"), "deprecatedSource.component")
                       or _text(event.get("reportingComponent"), "reportingComponent")
                       or _text(event.get("reportingController"), "reportingController")),
            node=(_text(source.get("host"), "source.host")
                  or _text(old_source.get("host"), "deprecatedSource.host")),
            count=count,
        )
        version = _text(meta.get("resourceVersion"), "metadata.resourceVersion")
        rank = (count, completed, int(version) if version.isdigit() else -1)
        return rank, row, redacted, without_first

    def rows(self) -> list[Row]:
        """The kept rows in time order; writes the notes and the redaction count."""
        kept = sorted(self.best.values(), key=lambda entry: (entry[1].received,
                                                              entry[1].audit_id))
        self.report.redacted += sum(entry[2] for entry in kept)
        notes = self.report.notes
        collapsed = self.built - len(kept)
        if collapsed > 0:
            notes.append(f"{collapsed} repeated sightings of the same Event collapsed into the "
                         "latest (highest count, then latest last time)")
        if self.others:
            total = sum(self.others.values())
            what = "object that is not a Kubernetes Event" if total == 1 else (
                "objects that are not Kubernetes Events")
            notes.append(f"{total} {what} ignored: {_describe(self.others)}")
        for error in self.watch_errors:
            notes.append(f"watch stream reported an error at {error}")
        without_first = sum(1 for entry in kept if entry[3])
        if without_first:
            notes.append(f"{without_first} Events have no first time (firstTimestamp, "
                         "eventTime, creationTimestamp): placed at their last time")
        hashed = sum(1 for entry in kept if HASHED_ID in entry[1].audit_id)
        if hashed:
            notes.append(f"{hashed} Events have neither uid nor name: identified by a hash of "
                         "their content")
        if self.bad_times:
            notes.append(f"{self.bad_times} unparseable timestamps ignored")
        return [entry[1] for entry in kept]


def _is_event(obj: Any) -> bool:
    """A core/v1 or events.k8s.io Event; items of a raw API list carry no kind of their own."""
    if not isinstance(obj, dict) or "auditID" in obj:
        return False
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if isinstance(api_version, str) and api_version.startswith("audit.k8s.io/"):
        return False
    subject = isinstance(obj.get("involvedObject"), dict) or isinstance(obj.get("regarding"), dict)
    if kind == "Event":
        return api_version is None or api_version in EVENT_API_VERSIONS or subject
    if kind is None:
        return subject or ("reason" in obj and any(key in obj for key in TIME_KEYS))
    return False


def _dumps(event: dict[str, Any]) -> bytes:
    """The Event as stored JSON; YAML may have given datetimes, dates and non-string keys."""
    return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS
                        | orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z)


def _describe(counter: Counter[str]) -> str:
    return ", ".join(f"{kind} ×{n}" for kind, n in counter.most_common())


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _text(value: Any, what: str) -> str:
    """A string field; YAML turns some unquoted scalars into numbers or booleans."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    raise ValueError(f"{what} is not a string")


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value) or None
    return None


def _parse_time(value: Any) -> datetime | None:
    """A timezone-aware UTC datetime from an RFC 3339 string or a YAML timestamp; None when unset
    (null, empty, or Go's zero time 0001-01-01)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):  # a YAML date without time
        parsed = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        # Python 3.11 reads "Z", offsets and more than 6 fractional digits (truncated).
        parsed = datetime.fromisoformat(value.strip())
    else:
        raise TypeError(f"timestamp {value!r} is not a string")
    if parsed.year <= 1:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


# Resource names that are not the lower-cased kind plus the English plural rules below.
IRREGULAR_PLURALS = {
    "endpoints": "endpoints",
    "securitycontextconstraints": "securitycontextconstraints",
    "podmetrics": "pods",
    "nodemetrics": "nodes",
}


def _plural(kind: str) -> str:
    """The resource name of a kind as in an audit objectRef: Pod→pods, Ingress→ingresses,
    NetworkPolicy→networkpolicies, Endpoints→endpoints; "" for no kind."""
    lower = kind.strip().lower()
    if not lower:
        return ""
    if lower in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[lower]
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    return lower + "s"


# --- JSON ---------------------------------------------------------------------------------------


class _JsonReader:
    """JSON lines, one document, or documents one after another, read line by line.

    A line that parses alone is a value (JSON lines, or a minified document). Otherwise lines
    gather into a document until its brackets balance (counted outside strings), however it is
    indented. A line in column 0 that opens a new value ends a document that is broken: a line
    cut short, or a pretty-printed document cut short before the next one (pretty printers indent
    everything inside a document). A document that does not parse is salvaged item by item.
    Until the first value parses, all lines are kept so that a file in an unexpected layout
    (flow-style YAML) can still be read whole at the end.
    """

    def __init__(self, collector: _Collector) -> None:
        self.collector = collector
        self.report = collector.report
        self.chunk: list[bytes] = []
        self.chunk_start = 0
        self.chunk_bytes = 0
        self.depth = 0
        self.pretty = False  # the document opened with a lone { or [ line
        self.indented: bool | None = None  # its second line is indented
        self.backup: list[bytes] | None = []
        self.backup_bytes = 0
        self.deferred: list[tuple[int, str]] = []

    def skip(self, line: int, reason: str) -> None:
        if self.backup is not None:
            self.deferred.append((line, reason))  # may be moot if the file parses whole
        else:
            self.report.skip(line, reason)

    def value(self, value: Any, line: int) -> None:
        if self.backup is not None:
            self._commit_deferred()
        self.collector.visit(value, line)

    def _commit_deferred(self) -> None:
        self.backup = None
        for line, reason in self.deferred:
            self.report.skip(line, reason)
        self.deferred = []

    def feed(self, number: int, line: bytes) -> None:
        if self.backup is not None:
            self.backup.append(line)
            self.backup_bytes += len(line)
            if self.backup_bytes > MAX_DOCUMENT_BYTES:
                self._commit_deferred()  # too big to retry whole: give up that fallback
        stripped = line.strip()
        if not stripped:
            if self.chunk:
                self.chunk.append(line)
            return
        if self.chunk:
            opens_value = line[:1] in (b"{", b"[")
            if not opens_value or (self.pretty and not self.indented):
                self._extend(line)
                return
            self.flush()  # a new value in column 0: the document before it is broken
        if stripped[:1] not in (b"{", b"["):
            self.skip(number, _json_reason(stripped, None))
            return
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            depth = _depth(stripped)
            if depth <= 0:
                self.skip(number, _json_reason(stripped, exc))
                return
            self.chunk, self.chunk_start, self.chunk_bytes = [line], number, len(line)
            self.depth, self.pretty, self.indented = depth, stripped in (b"{", b"["), None
            return
        self.value(value, number)

    def _extend(self, line: bytes) -> None:
        self.chunk.append(line)
        self.chunk_bytes += len(line)
        if self.chunk_bytes > MAX_DOCUMENT_BYTES:
            raise InputError(f"{self.report.source}: a JSON document over {MAX_DOCUMENT_BYTES} "
                             "bytes; split it into smaller files")
        if self.indented is None:
            self.indented = line[:1] in (b" ", b"\t")
        self.depth += _depth(line)
        if self.depth <= 0:
            self.flush()

    def flush(self) -> None:
        if not self.chunk:
            return
        try:
            value = orjson.loads(b"".join(self.chunk))
        except orjson.JSONDecodeError as exc:
            self._failed(exc)
            return
        start = self.chunk_start
        self.chunk = []
        self.value(value, start)

    def _failed(self, exc: orjson.JSONDecodeError) -> None:
        """The gathered document does not parse: keep its good items, report the rest."""
        lines, start = self.chunk, self.chunk_start
        self.chunk = []
        reason = _json_reason(b"".join(lines), exc)
        error_line = start + exc.lineno - 1
        items = _json_items(lines, start)
        failures = 0
        for item_start, item in items:
            try:
                value = orjson.loads(item.rstrip().rstrip(b","))
            except orjson.JSONDecodeError as item_exc:
                failures += 1
                self.skip(item_start + item_exc.lineno - 1,
                          f"list item: {_json_reason(item, item_exc)}")
                continue
            self.value(value, item_start)
        if not failures:  # the fault is outside the items (or there are none)
            self.skip(error_line, reason)

    def finish(self) -> None:
        self.flush()
        if self.backup is None or not self.backup:
            return
        # Nothing parsed line by line or as pretty documents: try the file whole.
        text = b"".join(self.backup)
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            # JSON-like YAML (flow style, comments)? Not worth PyYAML's time on a big file.
            values = _yaml_quietly(text) if len(text) <= BIG_YAML_DOCUMENT else None
            if values is None:
                self._commit_deferred()
                return
            self.deferred = []
            self.backup = None
            for document, line in values:
                self.collector.visit(document, line)
            return
        self.deferred = []
        self.backup = None
        self.collector.visit(value, 1)


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')


def _depth(line: bytes) -> int:
    """How many brackets ``line`` leaves open (negative: closes), strings not counted."""
    if b'"' in line:
        line = _JSON_STRING.sub(b"", line)
    return line.count(b"{") + line.count(b"[") - line.count(b"}") - line.count(b"]")


def _json_reason(text: bytes, exc: Exception | None) -> str:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    if exc is None:
        return "not JSON (expected an object or a list)"
    return f"malformed JSON ({str(exc).splitlines()[0][:120]})"


_ITEMS_OPEN = re.compile(rb'\s*"items"\s*:\s*\[\s*$')


def _json_items(lines: list[bytes], start: int) -> list[tuple[int, bytes]]:
    """The list items of a pretty-printed JSON array or list object, as (first line, text):
    objects opened by a lone ``{`` and closed by a ``}`` at the same indentation, or written one
    per line. Only the items of a top-level array or of an ``"items": [`` are taken, never deeper
    objects such as ``managedFields`` entries."""
    items: list[tuple[int, bytes]] = []
    armed = lines[0].strip().startswith(b"[")
    indent: bytes | None = None
    current: list[bytes] | None = None
    current_start = 0
    for offset, line in enumerate(lines[1:], start=1):
        body = line.rstrip(b"\r\n")
        stripped = body.strip()
        lead = body[: len(body) - len(body.lstrip())]
        if current is None:
            if indent is None and not armed:
                armed = _ITEMS_OPEN.match(body) is not None
            elif stripped == b"{" and (indent is None or lead == indent):
                indent = lead
                current, current_start = [line], start + offset
            elif (stripped[:1] == b"{" and stripped.rstrip(b",")[-1:] == b"}"
                  and (indent is None or lead == indent)):
                indent = lead  # one item per line
                items.append((start + offset, stripped))
            elif indent is None and stripped:
                return []  # the list does not hold objects one per lone brace
            continue
        current.append(line)
        if lead == indent and stripped in (b"}", b"},"):
            items.append((current_start, b"".join(current)))
            current = None
    if current is not None:  # cut off mid-item
        items.append((current_start, b"".join(current)))
    return items


# --- YAML ---------------------------------------------------------------------------------------

_DOC_START = re.compile(rb"---(?:[ \t]|\r?\n|$)")
_DOC_END = re.compile(rb"\.\.\.[ \t]*\r?\n?$")
_ITEMS_KEY = re.compile(rb"items:[ \t]*(?:#.*)?\r?\n?$")
_ITEM_START = re.compile(rb"( *)- ")


def _read_yaml(lines: list[bytes], collector: _Collector) -> None:
    """Each document of a YAML stream on its own, so that a broken one costs only itself."""
    for start, chunk in _yaml_chunks(lines):
        _read_yaml_chunk(start, chunk, collector)


def _yaml_chunks(lines: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, lines) of each document: split at ``---`` and ``...`` in column 0,
    which YAML forbids inside a document. Directives stay with the document they precede;
    chunks of only comments and blank lines are dropped."""
    chunk: list[bytes] = []
    start = 1
    for number, line in enumerate(lines, start=1):
        if _DOC_START.match(line):
            if _has_content(chunk):
                yield start, chunk
                chunk, start = [], number
            elif not any(part.startswith(b"%") for part in chunk):
                chunk, start = [], number  # only comments before it: drop them
        chunk.append(line)
        if _DOC_END.match(line):
            if _has_content(chunk):
                yield start, chunk
            chunk, start = [], number + 1
    if _has_content(chunk):
        yield start, chunk


def _has_content(chunk: list[bytes]) -> bool:
    for line in chunk:
        stripped = line.strip()
        if stripped.startswith((b"---", b"...")):
            stripped = stripped[3:].strip()  # "--- {kind: Event}": content on the marker line
        if stripped and not stripped.startswith((b"#", b"%")):
            return True
    return False


def _yaml_problem(exc: BaseException) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"malformed YAML ({str(problem)[:120]})"


def _yaml_error_line(exc: BaseException, start: int, text: bytes) -> int:
    """The line of a YAML error; one at the end of the text (an unclosed quote or bracket) is
    put on the document's last line, not on the next document's ``---``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return start
    last = start + max(text.rstrip(b"\n").count(b"\n"), 0)
    return min(start + mark.line, last)


def _yaml_documents(text: bytes, start: int) -> Iterator[tuple[Any, int, list[int] | None]]:
    """(value, line, item lines) of each document in ``text``; raises what PyYAML raises."""
    loader = _YAML_LOADER(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            yield loader.construct_document(node), start + node.start_mark.line, _item_lines(
                node, start)
    finally:
        loader.dispose()


YAML_ERRORS = (yaml.YAMLError, ValueError, TypeError, RecursionError, OverflowError)


def _read_yaml_chunk(start: int, chunk: list[bytes], collector: _Collector) -> None:
    if sum(map(len, chunk)) > BIG_YAML_DOCUMENT:
        items = _yaml_items(chunk, start)
        if items:
            _read_yaml_items(items, collector)
            return
    try:
        documents = list(_yaml_documents(b"".join(chunk), start))
    except YAML_ERRORS as exc:
        # Keep the good items of a broken list; report the document only if they are all good.
        if not _read_yaml_items(_yaml_items(chunk, start), collector):
            collector.report.skip(_yaml_error_line(exc, start, b"".join(chunk)),
                                  f"{_yaml_problem(exc)} in the document from line {start}")
        return
    for value, line, item_lines in documents:
        collector.visit(value, line, item_lines)
        collector.document_parsed()


def _read_yaml_items(items: list[tuple[int, bytes]], collector: _Collector) -> int:
    """Parse list items one by one; returns how many were malformed (each reported)."""
    failures = 0
    for item_start, item in items:
        try:
            documents = list(_yaml_documents(item, item_start))
        except YAML_ERRORS as exc:
            failures += 1
            collector.report.skip(_yaml_error_line(exc, item_start, item),
                                  f"list item: {_yaml_problem(exc)}")
            continue
        for value, line, item_lines in documents:
            collector.visit(value, line, item_lines)
        collector.document_parsed()
    return failures


def _yaml_items(chunk: list[bytes], start: int) -> list[tuple[int, bytes]]:
    """The entries of a top-level ``items:`` block sequence as (first line, text), each still a
    one-item sequence (``- key: …``) so that it parses on its own."""
    items: list[tuple[int, bytes]] = []
    in_items = False
    indent: bytes | None = None
    current: list[bytes] | None = None
    current_start = 0
    for offset, line in enumerate(chunk):
        if not in_items:
            in_items = _ITEMS_KEY.match(line) is not None
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith(b"#"):
            if current is not None:
                current.append(line)
            continue
        match = _ITEM_START.match(line)
        if match and (indent is None or match.group(1) == indent):
            indent = match.group(1)
            if current is not None:
                items.append((current_start, b"".join(current)))
            current, current_start = [line], start + offset
            continue
        lead = len(line) - len(line.lstrip(b" "))
        if indent is None or lead <= len(indent):  # a sibling key of items: the list is over
            break
        if current is not None:
            current.append(line)
    if current is not None:
        items.append((current_start, b"".join(current)))
    return items


def _item_lines(node: Any, start: int) -> list[int] | None:
    """Line numbers of the items of a top-level sequence or ``items:`` sequence."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "items" and isinstance(
                    value, yaml.SequenceNode):
                return [start + item.start_mark.line for item in value.value]
    elif isinstance(node, yaml.SequenceNode):
        return [start + item.start_mark.line for item in node.value]
    return None


def _yaml_quietly(text: bytes) -> list[tuple[Any, int]] | None:
    """All documents of ``text`` as YAML, or None if it is not YAML either."""
    try:
        return [(value, line) for value, line, _ in _yaml_documents(text, 1)]
    except YAML_ERRORS:
        return None


FORMAT = Format("k8s-events", sniff, parse)
