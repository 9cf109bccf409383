"""Kubernetes component logs in klog format into one ``log`` row per entry, plus one ``trace`` row
per kube-apiserver trace block.

Accepted input (gzipped or not), one entry per klog header:

- bare klog: ``Lmmdd hh:mm:ss.uuuuuu threadid file:line] message``, L in I, W, E, F;
- the same behind a container-runtime prefix: CRI (``<RFC 3339> stdout|stderr F|P message``), the
  ``kubectl logs --timestamps`` prefix (``<RFC 3339> message``) or docker json-file lines
  (``{"log": "message\\n", "stream": "stderr", "time": "<RFC 3339>"}``). A CRI ``P`` tag or a
  docker ``log`` without its newline is a partial line: the next line completes it.

Lines without a klog header (Go panics, stack traces, wrapped output, the later lines of a trace)
continue the entry before them, joined with "\\n". Behind a runtime prefix they do so only when the
runtime stamped them within a second of the entry's last line; a line stamped later, or one before
any entry, becomes an entry of its own with no severity. Without a prefix, such a line before any
entry has no time: it is skipped and recorded.

The year: a klog header has none. In order of preference it comes from the full timestamp of the
runtime prefix on the same line; a full date found in the first 64 KiB of the file (the start of
an apiserver trace, ``(14-Jul-2021 06:27:06.063)``); the bundle's collection time in the hints
(``collected``: the latest year that does not put the first entry after it); ``hints.year`` (with
``hints.year_reason``), taken as the year of the first entry; the incident's other evidence
(``hints.evidence``, given by the ingest: the year that puts the first entry nearest to it, see
``years.nearest_year``); else the current year, or the latest before it that does not put the
first entry in the future. The last two are guesses, reported in ``report.year_guess``: the
ingest moves the file's rows by whole years when the incident's uploads have all finished, if the
rest of the incident then gives another year (``timelines.ingest.years``). Months that go from
December to January advance the year (and back again, for files that concatenate logs out of
order). ``report.notes`` says which rule chose the year and where it changed (``years``). Header
times carry no zone and are read as UTC; behind a runtime prefix, a header that is
off the runtime's UTC time by more than 10 minutes (a process in a local zone) is moved by that
offset, rounded to 15 minutes, and a note says so.

Identity: ``audit_id`` is ``log:`` (or ``trace:``) + the first 20 hex digits of sha1(component,
node, the pod of a bundle's pod log (``hints.pod``: two pods of one workload write the same lines
at the same instants), the entry's text without runtime prefixes) + ``:`` + the occurrence of
that text at that time (0 for the first), so the key survives a re-upload under another name and
a change of collector (``kubectl logs`` with or without ``--timestamps``, or the CRI file
itself).

Memory: the current entry (capped at ``MAX_ENTRY_LINES`` lines and ``MAX_ENTRY_CHARS``
characters, the rest counted), the traces not yet ended, the first 64 KiB of lines, and a bounded
table of recent keys.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import BinaryIO

import orjson

from .base import (
    HEAD_BYTES,
    Format,
    ParseHints,
    Progress,
    Report,
    Row,
    feed_lines,
    nothing_found,
    open_lines,
    parse_time,
    pod_object,
)
from .redact import URI_SECRET, Redactor, redact_strings
from .years import YearInference

SEVERITY = {"I": "info", "W": "warning", "E": "error", "F": "fatal"}
# Lmmdd hh:mm:ss.uuuuuu threadid file:line] — the thread id is padded with spaces; some klog
# look-alikes leave it out.
KLOG_HEADER = re.compile(
    r"([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})(?:\s+(\d+))?\s+([^\s:\]]+):(\d+)\] ?"
)
RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"
CRI_PREFIX = re.compile(rf"({RFC3339}) (stdout|stderr) ([A-Z](?::[A-Z])*)(?: |$)")
TIMESTAMP_PREFIX = re.compile(rf"({RFC3339}) ")
TRACE_LINE = re.compile(r"\s*Trace\[(\d+)\]: (.*)")
# New style (since 1.19):
#   "Patch" url:...,client:... (14-Jul-2021 06:27:06.063) (total time: 2199ms):
# Old style:
#   "List /api/v1/nodes" (started: 2018-08-29 07:03:25.150254563 +0000 UTC m=+1.2) (total time:
#   591.1003ms):
TRACE_START = re.compile(
    r"(?P<desc>.*?) \((?:(?P<day>\d{1,2})-(?P<mon>[A-Z][a-z]{2})-(?P<year>\d{4}) "
    r"(?P<clock>\d\d:\d\d:\d\d(?:\.\d+)?)"
    r"|started: (?P<iso>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (?P<zone>[+-]\d{4})[^)]*)"
    r"\) \(total time: (?P<total>[^)]+)\):?\s*$"
)
TRACE_END = re.compile(r"\[[^\]]*\] \[[^\]]*\] END\s*$")
TRACE_DATE = re.compile(r"Trace\[\d+\]: .*? \((\d{1,2})-([A-Z][a-z]{2})-(\d{4}) \d\d:\d\d")
GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|μs|ns)")
GO_DURATION_MS = {"h": 3_600_000.0, "m": 60_000.0, "s": 1000.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3,
                  "μs": 1e-3, "ns": 1e-6}
TRACE_FIELD_SPLIT = re.compile(r",(?=[A-Za-z][\w-]*:)")
API_VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete",
                       "deletecollection", "apply", "connect", "proxy"})
MONTHS = {name: number for number, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}

# Component names a file name may carry (kube-apiserver.log, kind's kubelet.log, must-gather's
# crio_service.log); the longest one found in the base name wins.
KNOWN_COMPONENTS = (
    "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet",
    "cloud-controller-manager", "etcd", "containerd", "crio", "cri-o", "dockerd", "docker",
    "openshift-apiserver", "oauth-apiserver", "openshift-controller-manager", "coredns",
    "kindnet", "konnectivity-agent", "konnectivity-server", "cluster-autoscaler",
    "metrics-server", "aws-node", "calico-node", "cilium-agent", "cilium-operator",
)
_COMPONENT_RES = sorted(
    # "openshift-apiserver-operator" is an operator, not the apiserver it manages.
    ((name, re.compile(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9]|-operator)")) for name in
     KNOWN_COMPONENTS), key=lambda item: -len(item[0]))

MAX_ENTRY_LINES = 5000  # a goroutine dump is long; a runaway entry must not hold the file
MAX_ENTRY_CHARS = 1 << 20
MAX_TRACE_STEPS = 500
MAX_OPEN_TRACES = 1024
MAX_RECENT_KEYS = 16384
PREFIX_SKEW = timedelta(minutes=10)
HALF_YEAR = timedelta(days=183)
# Behind a runtime prefix, a line without a klog header continues the entry before it only when
# the runtime stamped it at about the same time: the lines of one klog message arrive in one write
# and share a stamp (a Go panic's lines come in quick succession); a later line is a new write.
SAME_WRITE = timedelta(seconds=1)
PRESCAN_BYTES = 64 * 1024
SNIFF_LINES = 40


# --- shared with textlog ----------------------------------------------------------------------

def guess_component(name: str) -> str:
    """The component a file's base name names (``kind-kube-apiserver.txt`` → kube-apiserver,
    ``crio_service.log`` → crio), or ""."""
    base = PurePosixPath(name.replace("\\", "/")).name.lower()
    for component, pattern in _COMPONENT_RES:
        if pattern.search(base):
            return "crio" if component == "cri-o" else component
    return ""


def micros(fraction: str | None) -> int:
    """Microseconds of a fraction's digits ("262884123" → 262884)."""
    return int(fraction[:6].ljust(6, "0")) if fraction else 0


def sniff_lines(head: bytes, limit: int = SNIFF_LINES) -> list[str]:
    """The first non-empty lines of ``head``, decoded; when ``head`` fills the sniffing window,
    its last line may be cut and is left out (unless it is the only one)."""
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = text.split("\n")
    if len(head) >= HEAD_BYTES and len(lines) > 1:
        lines = lines[:-1]
    return [line.rstrip("\r") for line in lines if line.strip()][:limit]


class KeyMaker:
    """Stable row keys: ``<kind>:<sha1 of component, node, pod and text>[:20]:<occurrence>``.

    The occurrence counts identical text at the same time within a bounded window of recent keys,
    so repeated identical lines stay distinct and the same file gives the same keys again.
    """

    def __init__(self, component: str, node: str, pod: str = "") -> None:
        # the pod only when there is one, so that the keys of other logs stay as they were
        self.salt = (f"{component}\x00{node}\x00" + (f"{pod}\x00" if pod else "")).encode()
        self.recent: OrderedDict[tuple[str, datetime], int] = OrderedDict()

    def digest(self) -> hashlib._Hash:
        hasher = hashlib.sha1(usedforsecurity=False)
        hasher.update(self.salt)
        return hasher

    def key(self, kind: str, digest: str, when: datetime) -> str:
        slot = (kind + digest[:20], when)
        occurrence = self.recent.get(slot, -1) + 1
        self.recent[slot] = occurrence
        if occurrence:
            self.recent.move_to_end(slot)
        elif len(self.recent) > MAX_RECENT_KEYS:
            self.recent.popitem(last=False)
        return f"{kind}:{digest[:20]}:{occurrence}"


def redact_values(values: dict[str, str], redactor: Redactor, report: Report) -> None:
    """Redact bearer/basic credentials, JWTs and secret query values in ``values`` in place,
    counting into ``report.redacted``. Cheap when nothing looks like a secret."""
    if not redactor.enabled:
        return
    for value in values.values():
        if "eyJ" in value or "earer " in value or "asic " in value or "?" in value:
            break
    else:
        return  # the common case: nothing that could be a secret
    count = 0
    for key, value in values.items():
        if "=" in value and "?" in value:
            new_value, n = URI_SECRET.subn(lambda m: m.group(1) + "[REDACTED]", value)
            if n:
                values[key] = new_value
                count += n
    count += redact_strings(values)
    report.redacted += count


def go_duration_ms(text: str) -> float | None:
    """Milliseconds of a Go duration ("2199ms", "591.1003ms", "1m2.5s"), or None."""
    text = text.strip()
    parts = GO_DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * GO_DURATION_MS[unit] for number, unit in parts)


# --- klog -------------------------------------------------------------------------------------

def unwrap(text: str) -> tuple[datetime | None, str, bool, str]:
    """Split a runtime prefix off a line: (its time or None, the text after it, whether the line
    is partial and the next one continues it, the stream or "")."""
    if text.startswith('{"') and '"log"' in text:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = None
        if (isinstance(value, dict) and isinstance(value.get("log"), str)
                and isinstance(value.get("time"), str)):
            try:
                when = parse_time(value["time"])
            except ValueError:
                return None, text, False, ""
            log = value["log"]
            stream = value.get("stream")
            return (when, log.removesuffix("\n").removesuffix("\r"), not log.endswith("\n"),
                    stream if isinstance(stream, str) else "")
    if text[:1].isdigit():
        match = CRI_PREFIX.match(text)
        if match:
            try:
                when = parse_time(match.group(1))
            except ValueError:
                return None, text, False, ""
            return when, text[match.end():], "P" in match.group(3).split(":"), match.group(2)
        match = TIMESTAMP_PREFIX.match(text)
        if match:
            try:
                when = parse_time(match.group(1))
            except ValueError:
                return None, text, False, ""
            return when, text[match.end():], False, ""
    return None, text, False, ""


def sniff(head: bytes, name: str = "") -> bool:
    """True when most of the first non-empty lines carry a klog header, bare or behind a CRI,
    ``kubectl logs --timestamps`` or docker json-file prefix."""
    lines = sniff_lines(head)
    if not lines:
        return False
    hits = sum(1 for line in lines if KLOG_HEADER.match(unwrap(line)[1]))
    return hits * 2 > len(lines)


@dataclass
class Entry:
    """A log entry being read: its first line and the lines that continue it (bounded)."""

    line: int
    received: datetime
    severity: str
    location: str
    thread: str
    digest: hashlib._Hash
    lines: list[str] = field(default_factory=list)
    chars: int = 0
    dropped: int = 0
    traced: bool = False  # whether a line may belong to an apiserver trace

    def add(self, text: str) -> None:
        self.digest.update(b"\n" + text.encode("utf-8", "surrogatepass"))
        if "Trace[" in text:
            self.traced = True
        if len(self.lines) >= MAX_ENTRY_LINES or self.chars + len(text) > MAX_ENTRY_CHARS:
            self.dropped += 1
            return
        self.lines.append(text)
        self.chars += len(text) + 1

    def message(self) -> str:
        lines = self.lines
        end = len(lines)
        while end > 1 and not lines[end - 1].strip():
            end -= 1
        text = "\n".join(lines[:end])
        if self.dropped:
            text += f"\n[… {self.dropped} more lines not kept]"
        return text


@dataclass
class _Trace:
    trace_id: str
    line: int
    received: datetime
    total_ms: float
    description: str
    start_text: str
    severity: str
    steps: list[str] = field(default_factory=list)


class _KlogParser:
    """The state of one file: the entry being read, open traces, year, keys."""

    def __init__(self, report: Report, redactor: Redactor, hints: ParseHints) -> None:
        self.report = report
        self.redactor = redactor
        self.component = hints.component or guess_component(report.source)
        self.node = hints.node
        self.years = YearInference(report, hints, "the klog headers, which carry none")
        self.keys = KeyMaker(self.component, self.node, hints.pod)
        self.on_pod = pod_object(hints.pod)  # a pod's lines are about it
        self.entry: Entry | None = None
        self.last_when: datetime | None = None  # runtime time of the entry's last line
        self.traces: OrderedDict[str, _Trace] = OrderedDict()
        self.partial: tuple[int, datetime | None, str] | None = None  # a split line's start
        self.shift = timedelta(0)
        self.prefix_noted = False
        self.utc_noted = False
        self.trace_fix_noted = False
        self.entries = 0

    # -- lines -----------------------------------------------------------------------------

    def prescan(self, lines: Iterable[bytes]) -> None:
        """Take the year from a full date early in the file (a trace start) when there is one."""
        for raw in lines:
            if b"Trace[" not in raw:
                continue
            match = TRACE_DATE.search(raw.decode("utf-8", "replace"))
            if match and match.group(2) in MONTHS:
                try:
                    when = datetime(int(match.group(3)), MONTHS[match.group(2)],
                                    int(match.group(1)), tzinfo=UTC)
                except ValueError:
                    continue
                self.years.early_date(when, "from the date of the first apiserver trace in "
                                            f"the file ({match.group(1)}-{match.group(2)}-"
                                            f"{match.group(3)})")
                return

    def feed(self, number: int, raw: bytes) -> Iterator[Row]:
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        if number == 1:
            text = text.lstrip("\ufeff")
        when, inner, partial, _stream = unwrap(text)
        if self.partial is not None:
            # The rest of a line that the runtime split: joined without a newline.
            first_line, first_when, before = self.partial
            self.partial = None
            number, when, inner = first_line, first_when or when, before + inner
        if partial and len(inner) < MAX_ENTRY_CHARS:
            self.partial = (number, when, inner)
            return
        yield from self._line(number, when, inner)

    def _line(self, number: int, when: datetime | None, inner: str) -> Iterator[Row]:
        header = KLOG_HEADER.match(inner)
        if header:
            try:
                received = self._header_time(header, when, number)
            except ValueError as exc:
                self.report.skip(number, f"klog header with an impossible date ({exc})")
                return
            if self.entry is not None:
                yield from self._flush()
            self.last_when = when
            self.entry = Entry(number, received, SEVERITY[header.group(1)],
                                f"{header.group(9)}:{header.group(10)}", header.group(8) or "",
                                self.keys.digest())
            self.entry.digest.update(inner.encode("utf-8", "surrogatepass"))
            self.entry.lines.append(inner[header.end():])
            self.entry.chars = len(self.entry.lines[0])
            self.entry.traced = "Trace[" in inner
            return
        if self.entry is not None and (when is None or self.last_when is None
                                       or abs(when - self.last_when) <= SAME_WRITE):
            self.entry.add(inner)
            if when is not None:
                self.last_when = when
            return
        if not inner.strip():
            return
        if when is not None:
            # Output that is not klog's (a wrapper script, a panic long after the last entry):
            # dated by the runtime, an entry of its own.
            if self.entry is not None:
                yield from self._flush()
            self.years.anchor(when)
            self.last_when = when
            self.entry = Entry(number, when, "", "", "", self.keys.digest())
            self.entry.digest.update(inner.encode("utf-8", "surrogatepass"))
            self.entry.lines.append(inner)
            self.entry.chars = len(inner)
            self.entry.traced = "Trace[" in inner
            return
        self.report.skip(number, "no klog header and no entry before it to continue, so no time "
                                 f"({inner[:60]!r})")

    def _header_time(self, header: re.Match[str], when: datetime | None,
                     number: int) -> datetime:
        _, month_text, day_text, hour, minute, second, fraction = header.groups()[:7]
        month, day = int(month_text), int(day_text)
        hour, minute, second, micro = int(hour), int(minute), int(second), micros(fraction)
        if when is None:
            if not self.utc_noted:
                self.utc_noted = True
                self.report.notes.append("klog header times carry no zone: read as UTC")
            return self.years.date(month, day, hour, minute, second, micro, number)
        # Behind a runtime prefix: the prefix gives the year; the header gives the precise time.
        if not self.prefix_noted:
            self.prefix_noted = True
            self.report.notes.append("year for the klog headers: from the container runtime's "
                                     "RFC 3339 timestamp on each line")
        best: datetime | None = None
        for year in (when.year, when.year - 1, when.year + 1):
            try:
                candidate = datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)
            except ValueError:
                continue
            if abs(candidate - when) < HALF_YEAR:
                best = candidate
                break  # nearly always the prefix's own year
            if best is None or abs(candidate - when) < abs(best - when):
                best = candidate
        if best is None:
            raise ValueError(f"{month:02d}-{day:02d} is not a date")
        self.years.anchor(when)
        skew = when - best
        if abs(skew) > PREFIX_SKEW:
            quarter = timedelta(minutes=15)
            shift = quarter * round(skew / quarter)
            if shift != self.shift:
                self.shift = shift
                hours = shift.total_seconds() / 3600
                self.report.notes.append(
                    f"klog header times are {abs(hours):.2f} h "
                    f"{'ahead of' if hours < 0 else 'behind'} the runtime's UTC timestamps from "
                    f"line {number} (a process in a local time zone?): header and trace times "
                    f"moved by {hours:+.2f} h")
        return best + self.shift

    # -- entries and traces ----------------------------------------------------------------

    def _flush(self) -> Iterator[Row]:
        entry, self.entry = self.entry, None
        if entry is None:
            return
        self.entries += 1
        message = entry.message()
        values = {"message": message}
        redact_values(values, self.redactor, self.report)
        message = values["message"]
        received = entry.received
        annotations = {}
        if entry.location:
            annotations["location"] = entry.location
        if entry.thread:
            annotations["thread"] = entry.thread
        raw = orjson.dumps({
            "time": received, "severity": entry.severity, "component": self.component,
            "node": self.node, **annotations, "message": message,
        })
        yield Row(
            self.keys.key("log", entry.digest.hexdigest(), received), received, received, 0.0,
            annotations=annotations, source=self.report.source, line=entry.line, raw=raw,
            kind="log", message=message, severity=entry.severity, component=self.component,
            node=self.node, **self.on_pod,
        )
        if entry.traced:
            yield from self._traces_in(entry)

    def _traces_in(self, entry: Entry) -> Iterator[Row]:
        for offset, text in enumerate(entry.lines):
            if "Trace[" not in text:
                continue
            match = TRACE_LINE.match(text)
            if not match:
                continue
            trace_id, body = match.group(1), match.group(2)
            start = TRACE_START.match(body)
            if start:
                trace = self._start_trace(trace_id, body, start, entry, entry.line + offset)
                if trace is not None:
                    if trace_id in self.traces:  # the same random id again: end the old one
                        yield self._trace_row(self.traces.pop(trace_id))
                    self.traces[trace_id] = trace
                    if len(self.traces) > MAX_OPEN_TRACES:
                        yield self._trace_row(self.traces.popitem(last=False)[1])
                continue
            trace = self.traces.get(trace_id)
            if trace is None:
                continue  # its start is not in this file
            if TRACE_END.search(body):
                yield self._trace_row(self.traces.pop(trace_id))
            elif len(trace.steps) < MAX_TRACE_STEPS:
                trace.steps.append(body)

    def _start_trace(self, trace_id: str, body: str, start: re.Match[str], entry: Entry,
                     number: int) -> _Trace | None:
        total = go_duration_ms(start.group("total"))
        if total is None:
            return None
        try:
            if start.group("iso"):
                received = datetime.strptime(
                    f"{start.group('iso')[:26]} {start.group('zone')}",
                    "%Y-%m-%d %H:%M:%S.%f %z" if "." in start.group("iso")
                    else "%Y-%m-%d %H:%M:%S %z").astimezone(UTC)
            else:
                clock = start.group("clock")
                hour, minute, rest = clock.split(":")
                second, _, fraction = rest.partition(".")
                received = datetime(
                    int(start.group("year")), MONTHS[start.group("mon")], int(start.group("day")),
                    int(hour), int(minute), int(second), micros(fraction), tzinfo=UTC,
                ) + self.shift
                # Some releases formatted the start as "15:04:00.000": the seconds always read 00.
                # The entry's own time is the trace's end, so it gives the seconds back.
                derived = entry.received - timedelta(milliseconds=total)
                if second == "00" and timedelta(seconds=2) < abs(derived - received) < timedelta(
                        minutes=1):
                    received = derived
                    if not self.trace_fix_noted:
                        self.trace_fix_noted = True
                        self.report.notes.append(
                            "trace start times with seconds fixed at 00 (a known formatting bug "
                            "of some kube-apiserver releases): taken as the log time minus the "
                            "trace's total time")
        except (KeyError, ValueError):
            return None
        return _Trace(trace_id, number, received, total, start.group("desc"), body,
                      entry.severity or "info")

    def _trace_row(self, trace: _Trace) -> Row:
        verb = uri = user_agent = client = ""
        extra: dict[str, str] = {}
        described = re.match(r'"((?:[^"\\]|\\.)*)"(?: (.*))?$', trace.description)
        if described:
            name, fields = described.group(1), described.group(2) or ""
            words = name.split(" ")
            if words[0].lower() in API_VERBS and (len(words) == 1 or (
                    len(words) == 2 and words[1].startswith("/"))):
                verb = words[0].lower()
                if len(words) == 2:
                    uri = words[1]
            for part in TRACE_FIELD_SPLIT.split(fields) if fields else ():
                key, _, value = part.partition(":")
                if key == "url":
                    uri = value
                elif key == "user-agent":
                    user_agent = value
                elif key == "client":
                    client = value
                elif key == "audit-id" and value:
                    extra["audit-id"] = value
        values = {"message": trace.description, "uri": uri, "user_agent": user_agent,
                  "steps": "\n".join(trace.steps)}
        redact_values(values, self.redactor, self.report)
        annotations = {"steps": values["steps"], "trace": trace.trace_id, **extra}
        completed = trace.received + timedelta(milliseconds=trace.total_ms)
        digest = self.keys.digest()
        digest.update(trace.start_text.encode("utf-8", "surrogatepass"))
        raw = orjson.dumps({
            "trace": trace.trace_id, "start": trace.received.isoformat(),
            "total_ms": trace.total_ms, "component": self.component, "node": self.node,
            "message": values["message"], "steps": values["steps"],
        })
        return Row(
            self.keys.key("trace", digest.hexdigest(), trace.received), trace.received,
            completed, trace.total_ms, verb=verb, user_agent=values["user_agent"],
            source_ip=client, request_uri=values["uri"], annotations=annotations,
            source=self.report.source, line=trace.line, raw=raw, kind="trace",
            message=values["message"], severity=trace.severity, component=self.component,
            node=self.node,
        )

    def finish(self) -> Iterator[Row]:
        if self.partial is not None:
            number, when, inner = self.partial
            self.partial = None
            yield from self._line(number, when, inner)
        yield from self._flush()
        while self.traces:  # no END line seen: the start line still gave the total time
            yield self._trace_row(self.traces.popitem(last=False)[1])
        self.years.finish()


def prescanned(lines: Iterator[bytes], limit: int = PRESCAN_BYTES) -> tuple[list[bytes],
                                                                             Iterator[bytes]]:
    """The first ``limit`` bytes of lines, and an iterator over all lines (those included)."""
    head: list[bytes] = []
    size = 0
    for line in lines:
        head.append(line)
        size += len(line)
        if size >= limit:
            break
    return head, itertools.chain(head, lines)


def parse(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
          progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield a ``log`` row per klog entry and a ``trace`` row per apiserver trace in ``raw``.

    Lines that cannot be dated are skipped and recorded on ``report``; they never stop the file.
    ``progress(bytes_read, rows)`` is called every 4096 lines. Raises ``InputError`` when the
    file holds no klog entry.
    """
    parser = _KlogParser(report, redactor or Redactor(), hints or ParseHints())
    lines, counter = open_lines(raw, report)
    head, lines = prescanned(lines)
    parser.prescan(head)
    del head
    yield from feed_lines(parser, lines, counter, progress)
    if parser.entries == 0:
        raise nothing_found(report, "no klog log entries found")


FORMAT = Format("klog", sniff, parse)
