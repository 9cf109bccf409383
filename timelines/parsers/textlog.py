"""Node and pod logs as plain text into one ``log`` row per entry.

Accepted input (gzipped or not), one entry per line that starts with a time:

- ``journalctl`` output: ``short`` (``Jul 14 06:27:08 node-1 kubelet[1234]: message``),
  ``short-precise`` (the same with microseconds), ``short-iso`` and ``short-iso-precise``
  (``2021-07-14T06:27:08+0000 node-1 kubelet[1234]: message``), and ``json`` (an entry per line,
  sonobuoy's ``systemd_logs``: ``__REALTIME_TIMESTAMP``, ``_HOSTNAME``, ``SYSLOG_IDENTIFIER``,
  ``_PID``, ``MESSAGE``, ``PRIORITY`` as the severity); the journal's own marker lines
  (``-- Logs begin at …``, ``-- Boot …``, ``-- No entries --``) are not entries;
- pod and container logs whose lines start with an RFC 3339 time: ``kubectl logs --timestamps``,
  CRI files (``2021-07-14T06:27:08.262884123Z stdout F message``, ``P`` for a partial line that
  the next one completes), docker json-file lines (``{"log": …, "stream": …, "time": …}``);
- structured loggers' JSON lines (zap, logrus, slog: ``{"level": …, "ts"|"time"|"timestamp": …,
  "msg"|"message": …}``, a time as RFC 3339 or epoch seconds): the level is the severity, the
  other keys follow the message as ``key=value``; sonobuoy's own ``meta/run.log``;
- close relatives met in bundles: ISO times with a space or a comma (``2021-07-14 06:27:08,123
  INFO …``, taken as UTC when they carry no zone), logrus text (``time="…" level=info msg=…``),
  the Kubernetes e2e framework's ``Dec 13 17:06:53.480: INFO: …`` (its file is read although
  most of its lines are the suite's own, untimed: specs, ``STEP:`` lines), and klog lines mixed
  into such files.

A line with no time continues the entry before it (joined with "\\n"); before any entry it is
skipped and recorded. Files that are mostly klog belong to ``klog`` (which also reads klog behind a
runtime prefix): ``sniff`` says False for them.

Rows: ``component`` is the journal's program (kubelet, crio, hyperkube…), else ``hints.component``,
else a component named by the file name; ``node`` is the journal's host, else ``hints.node``;
``severity`` only when the message says it plainly (a klog header, ``level=error``, a leading
``ERROR``/``WARN``/``INFO`` word, etcd's ``E |``) or the journal's priority does, else "".

The year of the ``short`` format and of klog headers is inferred as in ``klog`` (see
``years.YearInference``), with one more source: a journal header's ``end at <date>`` gives the year
of the lines after it. ``report.notes`` says which rule chose it. Times without a zone are read
as UTC (noted).

Identity: ``log:`` + sha1(component, node, host, program, pid, message)[:20] + ``:`` + occurrence
of that text at that time, so that the same line collected with or without a runtime prefix
gets the same key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import BinaryIO

import orjson

from . import klog
from .base import (
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
from .klog import (
    KLOG_HEADER,
    MONTHS,
    SEVERITY,
    Entry,
    KeyMaker,
    guess_component,
    micros,
    redact_values,
    sniff_lines,
)
from .redact import Redactor
from .years import YearInference

MONTH = r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
SYSLOG_TIME = rf"{MONTH} +(\d{{1,2}}) (\d\d):(\d\d):(\d\d)(?:\.(\d{{1,9}}))?"
# host, then program with an optional [pid], then ":" — the part of a journal line after its time.
JOURNAL_TAIL = r"([A-Za-z0-9][\w.-]*) ([^\s\[\]]+?)(?:\[(\d+)\])?:(?: (.*)|$)"
JOURNAL_SHORT = re.compile(rf"{SYSLOG_TIME} {JOURNAL_TAIL}")
JOURNAL_TAIL_RE = re.compile(JOURNAL_TAIL)
BARE_SYSLOG = re.compile(rf"{SYSLOG_TIME}:? (.*)")  # e2e framework: "Dec 13 17:06:53.480: INFO: …"
# The zone right after the time, or after a space when the date and time are apart: Go's
# time.String() ("2021-08-03 12:14:13.632016778 +0200 CEST m=+138.36", a must-gather's
# timestamp file), whose time read as UTC moved it by the offset.
ISO_START = re.compile(
    r"(\d{4}-\d\d-\d\d)([T ])(\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?"
    r"(Z|[+-]\d\d:?\d\d|(?<=\d) [+-]\d\d\d\d(?= [A-Z]{2,5}\b))?(?:[ \t]|$)"
)
CRI_TAIL = re.compile(r"(stdout|stderr) ([A-Z](?::[A-Z])*)(?: |$)")
LOGFMT_TIME = re.compile(r'time="([^"]+)"(?: |$)')
JOURNAL_MARKER = re.compile(r"-- .*--\s*$")
JOURNAL_END = re.compile(
    r"-- (?:Logs begin|Journal begins) at .*?(?:end|ends) at \w+ (\d{4})-(\d\d)-(\d\d) "
)
LEVEL_VALUE = re.compile(r"""(?:\blevel=|"level"\s*:\s*)"?([A-Za-z]+)""")
LEVEL_WORD = re.compile(r"\b(ERROR|ERR|FATAL|PANIC|CRITICAL|CRIT|WARNING|WARN|INFO|NOTICE)\b")
ETCD_LEVEL = re.compile(r"([IWEFN]) \| ")
LEVELS = {
    "error": "error", "err": "error", "eror": "error",
    "fatal": "fatal", "panic": "fatal", "critical": "fatal", "crit": "fatal", "emerg": "fatal",
    "alert": "fatal",
    "warning": "warning", "warn": "warning", "warng": "warning",
    "info": "info", "notice": "info",
}
ETCD_LEVELS = {"I": "info", "N": "info", "W": "warning", "E": "error", "F": "fatal"}
SNIFF_LINES = 40
# the Kubernetes e2e framework's log (sonobuoy's e2e.log): its timed lines are fewer than the
# suite's own (specs, steps, the "S" of skipped ones), which mark it
E2E_SUITE = re.compile(r"(?:Running Suite: |STEP: |Ran \d+ of \d+ Specs)")


@dataclass(slots=True)
class _Start:
    """What the first line of an entry says."""

    when: datetime | None  # a full time, or None when ``yearless`` holds the date
    message: str
    yearless: tuple[int, int, int, int, int, int] | None = None  # month, day, h, m, s, µs
    host: str = ""
    program: str = ""
    pid: str = ""
    stream: str = ""
    partial: bool = False  # a CRI "P" line or a docker line without its newline
    severity: str = ""
    location: str = ""
    thread: str = ""
    zoned: bool = True


def _classify(text: str) -> _Start | None:
    """The entry a line starts, or None for a line without a time (a continuation)."""
    first = text[:1]
    if first == "{":
        if '"__REALTIME_TIMESTAMP"' in text:
            return _journal_json(text)
        # (a structured line may hold the word "log" too: it is one if docker's shape fails)
        return (_docker(text) if '"log"' in text else None) or _json_log(text)
    if first.isdigit():
        return _iso(text)
    if first == "t" and text.startswith('time="'):
        match = LOGFMT_TIME.match(text)
        if match:
            try:
                when = parse_time(match.group(1).replace(" ", "T", 1))
            except ValueError:
                return None
            return _Start(when, text[match.end():])
        return None
    if first in "JFMASOND":
        match = JOURNAL_SHORT.match(text)
        if match:
            return _Start(None, match.group(10) or "", _syslog_date(match), match.group(7),
                          match.group(8), match.group(9) or "")
        match = BARE_SYSLOG.match(text)
        if match:
            return _Start(None, match.group(7), _syslog_date(match))
    if first in "IWEF":
        match = KLOG_HEADER.match(text)
        if match:
            return _Start(
                None, text[match.end():],
                (int(match.group(2)), int(match.group(3)), int(match.group(4)),
                 int(match.group(5)), int(match.group(6)), micros(match.group(7))),
                severity=SEVERITY[match.group(1)],
                location=f"{match.group(9)}:{match.group(10)}", thread=match.group(8) or "",
            )
    return None


def _syslog_date(match: re.Match[str]) -> tuple[int, int, int, int, int, int]:
    return (MONTHS[match.group(1)], int(match.group(2)), int(match.group(3)),
            int(match.group(4)), int(match.group(5)), micros(match.group(6)))


# ``journalctl -o json`` (sonobuoy's systemd_logs plugin): an entry per line, its time in µs
# since the epoch, its syslog priority (0-7).
JOURNAL_PRIORITY = {"0": "fatal", "1": "fatal", "2": "fatal", "3": "error", "4": "warning",
                    "5": "info", "6": "info"}


def _journal_json(text: str) -> _Start | None:
    try:
        value = orjson.loads(text)
        when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
            microseconds=int(value["__REALTIME_TIMESTAMP"]))
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, OverflowError):
        return None
    message = value.get("MESSAGE")
    if isinstance(message, list):  # journald exports a message that is not UTF-8 as its bytes
        try:
            message = bytes(message).decode("utf-8", "replace")
        except (TypeError, ValueError):
            message = ""

    def field(name: str) -> str:
        return value[name] if isinstance(value.get(name), str) else ""

    return _Start(when, message if isinstance(message, str) else "", host=field("_HOSTNAME"),
                  program=field("SYSLOG_IDENTIFIER") or field("_COMM"), pid=field("_PID"),
                  severity=JOURNAL_PRIORITY.get(field("PRIORITY"), ""))


def _docker(text: str) -> _Start | None:
    if '"log"' not in text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("log"), str)
            and isinstance(value.get("time"), str)):
        return None
    try:
        when = parse_time(value["time"])
    except ValueError:
        return None
    log = value["log"]
    stream = value.get("stream")
    return _Start(when, log.removesuffix("\n").removesuffix("\r"),
                  stream=stream if isinstance(stream, str) else "",
                  partial=not log.endswith("\n"))


# structured loggers' JSON lines (logrus, zap, slog): the keys of the time, the message and the
# level; the other keys follow the message as key=value
JSON_TIME_KEYS = ("time", "ts", "timestamp")
JSON_MESSAGE_KEYS = ("msg", "message")
JSON_LEVEL_KEYS = ("level", "severity")


def _json_log(text: str) -> _Start | None:
    """A structured logger's line (``{"level":"info","ts":1627980000.1,"msg":"…"}``, logrus's
    ``"time":"2017-12-13T17:05:25Z"``), not a Kubernetes object nor an audit event."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or "apiVersion" in value or "auditID" in value:
        return None
    keys = [next((k for k in group if k in value), None)
            for group in (JSON_TIME_KEYS, JSON_MESSAGE_KEYS, JSON_LEVEL_KEYS)]
    if None in keys or not isinstance(value[keys[1]], str):
        return None
    stamp = value[keys[0]]
    try:
        if isinstance(stamp, int | float) and not isinstance(stamp, bool):
            when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=stamp)
        elif isinstance(stamp, str):
            when = parse_time(stamp.replace(" ", "T", 1))
        else:
            return None
    except (ValueError, OverflowError):
        return None
    level = value[keys[2]]
    rest = " ".join(f"{key}={item if isinstance(item, str) else orjson.dumps(item).decode()}"
                    for key, item in value.items() if key not in keys)
    return _Start(when, f"{value[keys[1]]} {rest}" if rest else value[keys[1]],
                  severity=LEVELS.get(level.lower(), "") if isinstance(level, str) else "")


def _iso(text: str) -> _Start | None:
    match = ISO_START.match(text)
    if not match:
        return None
    date, separator, clock, fraction, zone = match.groups()
    zone = zone.lstrip() if zone else zone
    try:
        when = datetime.fromisoformat(f"{date}T{clock}").replace(microsecond=micros(fraction))
        if zone and zone != "Z":
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            when = (when - sign * offset).replace(tzinfo=UTC)
        else:
            when = when.replace(tzinfo=UTC)
    except ValueError:
        return None
    rest = text[match.end():]
    if zone and separator == "T":
        cri = CRI_TAIL.match(rest)
        if cri:
            return _Start(when, rest[cri.end():], stream=cri.group(1),
                          partial="P" in cri.group(2).split(":"))
        if zone != "Z":
            # journalctl -o short-iso writes a numeric offset (+0000), never Z, then host and
            # program; kubectl --timestamps and CRI write Z.
            journal = JOURNAL_TAIL_RE.match(rest)
            if journal:
                return _Start(when, journal.group(4) or "", host=journal.group(1),
                              program=journal.group(2), pid=journal.group(3) or "")
    return _Start(when, rest, zoned=bool(zone))


def guess_severity(message: str) -> str:
    """info/warning/error/fatal when the message says so plainly, else ""."""
    header = KLOG_HEADER.match(message)
    if header:
        return SEVERITY[header.group(1)]
    start = message[:300]
    level = LEVEL_VALUE.search(start)
    if level:
        return LEVELS.get(level.group(1).lower(), "")
    etcd = ETCD_LEVEL.match(message)
    if etcd:
        return ETCD_LEVELS[etcd.group(1)]
    word = LEVEL_WORD.search(message[:40])
    if word:
        return LEVELS[word.group(1).lower()]
    return ""


def sniff(head: bytes, name: str = "") -> bool:
    """True when most of the first non-empty lines (journal markers aside) start with a time of
    a shape this parser reads, and the file is not klog (``klog.sniff``)."""
    lines = [line for line in sniff_lines(head, SNIFF_LINES * 2)
             if not JOURNAL_MARKER.match(line)][:SNIFF_LINES]
    if not lines:
        return False
    hits = sum(1 for line in lines if _classify(line) is not None)
    if hits * 2 <= len(lines) and not (hits >= 3 and any(map(E2E_SUITE.match, lines))):
        return False
    return not klog.sniff(head, name)


@dataclass
class _TextEntry(Entry):
    host: str = ""
    program: str = ""
    pid: str = ""
    stream: str = ""


class _TextParser:
    def __init__(self, report: Report, redactor: Redactor, hints: ParseHints) -> None:
        self.report = report
        self.redactor = redactor
        self.component = hints.component or guess_component(report.source)
        self.node = hints.node
        self.years = YearInference(report, hints,
                                   "the dates that carry none (journal short format, klog)")
        self.keys = KeyMaker(self.component, self.node, hints.pod)
        self.on_pod = pod_object(hints.pod)  # a pod's lines are about it
        self.entry: _TextEntry | None = None
        self.partial: tuple[int, _Start] | None = None
        self.entries = 0
        self.zone_noted = False

    def feed(self, number: int, raw: bytes) -> Iterator[Row]:
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        if number == 1:
            text = text.lstrip("\ufeff")
        if text.startswith("-- ") and JOURNAL_MARKER.match(text):
            yield from self._flush()
            end = JOURNAL_END.match(text)
            if end:
                try:
                    when = datetime(int(end.group(1)), int(end.group(2)), int(end.group(3)),
                                    tzinfo=UTC)
                except ValueError:
                    return
                self.years.last_date(when, f"from the journal header on line {number} "
                                           f"(entries end at {when.date().isoformat()})")
            return
        start = _classify(text)
        if self.partial is not None:
            first_line, pending = self.partial
            self.partial = None
            if start is not None and start.when is not None:
                # The rest of a line that the runtime split: same entry, no newline between.
                pending.message += start.message
                if start.partial and len(pending.message) < klog.MAX_ENTRY_CHARS:
                    self.partial = (first_line, pending)
                    return
                yield from self._start(first_line, pending)
                return
            yield from self._start(first_line, pending)
        if start is None:
            if self.entry is not None:
                self.entry.add(text)
            elif text.strip():
                self.report.skip(number, f"no time at the start of the line and no entry before "
                                         f"it to continue ({text[:60]!r})")
            return
        if start.partial:
            self.partial = (number, start)
            return
        yield from self._start(number, start)

    def _start(self, number: int, start: _Start) -> Iterator[Row]:
        try:
            received = self._time(start, number)
        except ValueError as exc:
            self.report.skip(number, f"a time that is not a date ({exc})")
            return
        yield from self._flush()
        severity = start.severity or guess_severity(start.message)
        digest = self.keys.digest()
        digest.update(f"{start.host}\x00{start.program}\x00{start.pid}\x00".encode())
        digest.update(start.message.encode("utf-8", "surrogatepass"))
        self.entry = _TextEntry(number, received, severity, start.location, start.thread, digest,
                                [start.message], len(start.message), host=start.host,
                                program=start.program, pid=start.pid, stream=start.stream)

    def _time(self, start: _Start, number: int) -> datetime:
        if start.when is not None:
            self.years.anchor(start.when)
            if not start.zoned and not self.zone_noted:
                self.zone_noted = True
                self.report.notes.append(f"times without a zone (from line {number}) are read "
                                         f"as UTC")
            return start.when
        assert start.yearless is not None
        if not self.zone_noted:
            self.zone_noted = True
            self.report.notes.append(f"times without a zone (from line {number}) are read as UTC")
        return self.years.date(*start.yearless, number)

    def _flush(self) -> Iterator[Row]:
        entry, self.entry = self.entry, None
        if entry is None:
            return
        self.entries += 1
        values = {"message": entry.message()}
        redact_values(values, self.redactor, self.report)
        message = values["message"]
        component = entry.program or self.component
        node = entry.host or self.node
        annotations: dict[str, str] = {}
        for key, value in (("pid", entry.pid), ("stream", entry.stream),
                           ("location", entry.location), ("thread", entry.thread)):
            if value:
                annotations[key] = value
        raw = orjson.dumps({
            "time": entry.received, "severity": entry.severity,
            "component": component, "node": node, **annotations, "message": message,
        })
        yield Row(
            self.keys.key("log", entry.digest.hexdigest(), entry.received), entry.received,
            entry.received, 0.0, annotations=annotations, source=self.report.source,
            line=entry.line, raw=raw, kind="log", message=message, severity=entry.severity,
            component=component, node=node, **self.on_pod,
        )

    def finish(self) -> Iterator[Row]:
        if self.partial is not None:
            first_line, pending = self.partial
            self.partial = None
            yield from self._start(first_line, pending)
        yield from self._flush()
        self.years.finish()


def parse(raw: BinaryIO, report: Report, redactor: Redactor | None = None,
          progress: Progress | None = None, hints: ParseHints | None = None) -> Iterator[Row]:
    """Yield a ``log`` row per timestamped entry in ``raw`` (journal text or pod log).

    Lines that cannot be dated are skipped and recorded on ``report``; they never stop the file.
    ``progress(bytes_read, rows)`` is called every 4096 lines. Raises ``InputError`` when the
    file holds no timestamped entry.
    """
    parser = _TextParser(report, redactor or Redactor(), hints or ParseHints())
    lines, counter = open_lines(raw, report)
    yield from feed_lines(parser, lines, counter, progress)
    if parser.entries == 0:
        raise nothing_found(report, "no timestamped log lines found")


FORMAT = Format("text-log", sniff, parse)
