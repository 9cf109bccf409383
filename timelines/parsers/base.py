"""What every parser shares: the evidence row, opening (maybe gzipped) input, the per-file report.

No Django imports here or anywhere in ``timelines.parsers``: parsers are pure code, testable
without a database.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import io
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO, NamedTuple, Protocol, TypeVar

GZIP_MAGIC = b"\x1f\x8b"
T = TypeVar("T")
MAX_KEPT_ERRORS = 20


class Row(NamedTuple):
    """One piece of evidence on an incident's timeline: a request (``kind`` audit), a Kubernetes
    Event (event), a log line (log) or a timed span from a log such as an apiserver trace
    (trace). Field order is the store's column order for bulk writes.

    ``(audit_id, received)`` is the row's identity within an incident: ingesting the same
    evidence again must give the same pair. For audit rows ``audit_id`` is the auditID; other
    parsers derive a stable key (prefixed with the kind, e.g. ``event:<uid>``).
    """

    audit_id: str
    received: datetime  # when it happened or began, timezone-aware
    completed: datetime | None = None  # when it ended; None for a span that never did
    duration_ms: float | None = None
    verb: str = ""
    username: str = ""
    groups: tuple[str, ...] | list[str] = ()
    impersonated_user: str = ""
    user_agent: str = ""
    source_ip: str = ""
    resource: str = ""  # the object, as in an audit objectRef: plural resource name
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    api_group: str = ""
    api_version: str = ""
    object_uid: str = ""
    resource_version: str = ""
    code: int | None = None
    level: str = ""
    stage: str = ""
    request_uri: str = ""
    annotations: dict[str, str] = {}  # noqa: RUF012 - never mutated
    source: str = ""  # the file it came from
    line: int = 0  # and the line there
    raw: bytes = b""  # the evidence as stored for the detail view (JSON), redacted
    kind: str = "audit"
    message: str = ""
    reason: str = ""
    severity: str = ""  # Normal/Warning for Events; info/warning/error/fatal for logs
    component: str = ""  # who reported it: Event source, log's program
    node: str = ""
    count: int | None = None  # how many times an Event was seen


class CopyRows(NamedTuple):
    """Rows already in the store's COPY text format (``timelines.ingest.store._COPY_COLUMNS``),
    as the C scanner of audit logs writes them (``audit.parse_audit_copy``): making a ``Row``
    per request was most of the cost of ingest."""

    text: bytes
    rows: int
    # (body chunk id, the stored lines of its rows joined by newlines): row i of ``text`` points
    # at line i % chunk_rows of chunk i // chunk_rows.
    bodies: list[tuple[int, bytes]]


def parse_time(value: Any) -> datetime:
    """An RFC 3339 time as an aware datetime in UTC: fractions past microseconds are truncated
    (Python 3.11 reads the runtime's nanoseconds), no offset means UTC. Every parser reads times
    through here, so the same instant from two formats is the same ``received``. Raises
    ``ValueError`` for anything else."""
    if type(value) is not str:
        raise ValueError(f"timestamp {value!r} is not a string")
    parsed = datetime.fromisoformat(value.strip())
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed if parsed.tzinfo is UTC else parsed.astimezone(UTC)


class InputError(Exception):
    """The whole file is unusable (wrong type, nothing recognisable in it)."""


def nothing_found(report: Report, what: str) -> InputError:
    """The error for a file in which a parser found none of ``what``, naming the file and the
    first problem it met there."""
    reasons = f" (first problem: {report.errors[0]})" if report.errors else ""
    return InputError(f"{report.source}: {what}{reasons}")


class LineParser(Protocol):
    """A parser that takes a file line by line and may hold an entry open across lines."""

    def feed(self, number: int, line: bytes) -> Iterable[Row]: ...

    def finish(self) -> Iterable[Row]: ...


PROGRESS_EVERY = 4096  # items (lines, events) between progress calls


def feed_all(items: Iterable[T], feed: Callable[[T], Iterable[Row]],
             finish: Callable[[], Iterable[Row]], counter: CountingReader,
             progress: Progress | None) -> Generator[Row, None, int]:
    """Every item through ``feed``, then ``finish`` for what is still open, calling
    ``progress(bytes read, rows)`` every ``PROGRESS_EVERY`` items and at the end. Returns (to
    ``yield from``) the number of rows."""
    rows = 0
    for number, item in enumerate(items, start=1):
        for row in feed(item):
            rows += 1
            yield row
        if progress is not None and number % PROGRESS_EVERY == 0:
            progress(counter.count, rows)
    for row in finish():
        rows += 1
        yield row
    if progress is not None:
        progress(counter.count, rows)
    return rows


def feed_lines(parser: LineParser, lines: Iterable[bytes], counter: CountingReader,
               progress: Progress | None) -> Generator[Row, None, int]:
    """``feed_all`` for a line parser: ``parser.feed(line number, line)`` for every line."""
    return (yield from feed_all(enumerate(lines, start=1), lambda item: parser.feed(*item),
                                parser.finish, counter, progress))


class Evidence(Protocol):
    """The other evidence of a file's incident, dated with years of its own: what
    ``years.nearest_year`` needs to give a year to a log whose lines carry none."""

    def span(self) -> tuple[datetime, datetime] | None:
        """The first and last time of the evidence; None when there is none."""

    def nearest(self, when: datetime) -> datetime:
        """The time of the evidence nearest to ``when`` (only called when ``span`` is not None)."""


class TimesEvidence:
    """``Evidence`` as a list of times in memory (tests, small callers); the ingest's own reads
    the database (``timelines.ingest.years.IncidentEvidence``)."""

    def __init__(self, times: Iterable[datetime]) -> None:
        self.times = sorted(times)

    def span(self) -> tuple[datetime, datetime] | None:
        return (self.times[0], self.times[-1]) if self.times else None

    def nearest(self, when: datetime) -> datetime:
        at = bisect.bisect_left(self.times, when)
        near = self.times[max(at - 1, 0):at + 1]
        return min(near, key=lambda time: abs(time - when))


@dataclass(frozen=True)
class ParseHints:
    """What the surroundings of a file tell its parser: the bundle layout (component, node), or
    other evidence (the year that a klog header leaves out)."""

    component: str = ""
    node: str = ""
    # "namespace/name" of the pod whose container wrote the file (a bundle's pod logs): two pods
    # of one workload write the same lines at the same instants, and only this keeps them apart
    pod: str = ""
    year: int | None = None
    year_reason: str = ""  # how ``year`` was inferred, for the report
    # When the bundle was collected: the logs end before it, which settles the year of a log
    # that runs across New Year.
    collected: datetime | None = None
    # The rest of the file's incident, when neither the file nor the fields above give a year:
    # the year that puts the first date nearest to it (``years.nearest_year``). Given by the
    # ingest pipeline, never stored with the upload's hints.
    evidence: Evidence | None = field(default=None, compare=False, repr=False)


def pod_object(pod: str) -> dict[str, str]:
    """The object fields of the lines a pod's container wrote (``ParseHints.pod``,
    "namespace/name"): the pod, as an audit ``objectRef`` would name it, so that they are
    filtered, drawn and listed with the pod's other evidence; none for a line of no pod."""
    namespace, slash, name = pod.partition("/")
    if not slash or not namespace or not name:
        return {}
    return {"resource": "pods", "namespace": namespace, "name": name}


@dataclass(frozen=True)
class YearGuess:
    """A file's year that was guessed, not read: from its incident's other evidence or the clock
    (``years.YearInference``), because neither the file nor its hints gave one. The ingest keeps
    it with the upload (``as_json``) and moves the file's rows by whole years when the rest of
    the incident says otherwise (``timelines.ingest.years.settle_years``)."""

    first: datetime  # the first yearless date, in the year now given to the file
    line: int  # its line
    what: str  # the dates in question, as notes name them ("the klog headers, which carry none")
    note: int  # the index in ``Report.notes`` of the note that says how the year was chosen
    parsed_year: int  # the year the parser gave ``first``

    def as_json(self) -> dict:
        return {"first": self.first.isoformat(), "line": self.line, "what": self.what,
                "note": self.note, "parsed_year": self.parsed_year}

    @classmethod
    def from_json(cls, value: dict) -> YearGuess:
        return cls(datetime.fromisoformat(value["first"]), int(value["line"]), str(value["what"]),
                   int(value["note"]), int(value["parsed_year"]))


@dataclass
class Report:
    """What a parser saw in one file, beyond the rows it yielded."""

    source: str
    skipped: int = 0
    redacted: int = 0
    errors: list[str] = field(default_factory=list)
    # What the format cannot give or what was inferred ("no latency in a GKE export", "year
    # 2021 taken from the bundle's file times"), shown with the source.
    notes: list[str] = field(default_factory=list)
    # Set when reading stopped early (truncated gzip): the rows before it were yielded.
    truncated: bool = False
    # Set when the year of the file's dates was guessed rather than read (see ``YearGuess``).
    year_guess: YearGuess | None = None

    def skip(self, line: int, reason: str) -> None:
        self.skipped += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(f"{self.source}:{line}: {reason}")


Progress = Callable[[int, int], None]  # (bytes read from the file, rows so far)


@dataclass(frozen=True)
class Format:
    """A parser as the registry knows it.

    ``sniff(head, name)`` says from the first 64 KiB of a file (decompressed) and its name
    whether ``parse(raw, report, redactor, progress, hints)`` should read it; ``parse`` yields
    ``Row``s, records bad lines on ``report`` and raises ``InputError`` when the file holds
    nothing of its kind.
    """

    name: str
    sniff: Callable[[bytes, str], bool]
    parse: Callable[..., Iterator[Row]]
    # ``parse`` with keyword arguments ``copy_head``, ``copy_mid``, ``next_chunk_id`` and
    # ``chunk_rows``, which may also yield ``CopyRows`` (PostgreSQL only); None: not offered.
    parse_copy: Callable[..., Iterator[Row | CopyRows]] | None = None


HEAD_BYTES = 64 * 1024


def read_head(path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of a file, gunzipped if it is gzip; b"" if unreadable.

    A gzip stream that ends early or breaks gives what came out of it before: the parsers keep
    the lines of a truncated gzip, so what says which parser reads it must see them too, however
    short the file (a whole-``size`` read of a small file would reach the break and lose all)."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(2)
            handle.seek(0)
            if start != GZIP_MAGIC:
                return handle.read(size)
            parts: list[bytes] = []
            got = 0
            with gzip.GzipFile(fileobj=handle) as unzipped:
                with contextlib.suppress(EOFError, gzip.BadGzipFile, zlib.error):
                    # read1: at most one read of the file each, so that a failing read loses
                    # only what it would have added.
                    while got < size and (part := unzipped.read1(size - got)):
                        parts.append(part)
                        got += len(part)
            return b"".join(parts)
    except (OSError, EOFError, zlib.error):
        return b""


class CountingReader(io.RawIOBase):
    """Wraps the raw file to count bytes read, which is what progress reports (compressed bytes
    for a gzip file, so that bytes read reaches the size on disk)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = self.raw.readinto(buffer)
        self.count += n or 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


BLOCK_BYTES = 1024**2


def open_blocks(raw: BinaryIO, report: Report, lines_read: Callable[[], int],
                size: int = BLOCK_BYTES) -> tuple[Iterator[bytes], CountingReader]:
    """``open_lines`` by the block: runs of whole lines of about ``size`` bytes (the last block
    may end without a newline), with the same handling of a truncated gzip stream: the complete
    lines before the damage are yielded, then one error is recorded. ``lines_read()``: how many
    lines the caller has taken from the blocks so far (it counts them anyway; counting them here
    too cost a pass over every block), for that error's line number."""
    counter = CountingReader(raw)
    buffered = io.BufferedReader(counter, buffer_size=1 << 20)
    stream: BinaryIO = buffered
    if buffered.peek(2)[:2] == GZIP_MAGIC:
        stream = gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[assignment]

    def blocks() -> Iterator[bytes]:
        rest = b""
        while True:
            parts = [rest]
            got = len(rest)
            # ``rest`` is the start of a line; a line longer than half a block makes it longer
            need = size if got < size // 2 else got + size
            try:
                while got < need:
                    # read1: one read of the decompressor at a time, so that what came before
                    # a damaged part of a gzip stream is not lost with the failing read.
                    part = stream.read1(size)  # type: ignore[attr-defined]
                    if not part:
                        break
                    parts.append(part)
                    got += len(part)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                data = b"".join(parts)
                end = data.rfind(b"\n") + 1
                if end:
                    yield data[:end]
                lines = lines_read()
                report.truncated = True
                report.skip(lines + 1, f"gzip stream is truncated or corrupt ({exc}); "
                            f"the {lines} lines before it were read")
                return
            data = b"".join(parts)
            if got < need:  # the end
                if data:
                    yield data
                return
            end = data.rfind(b"\n") + 1
            if not end:  # no line ends in it yet: read on
                rest = data
                continue
            rest = data[end:]
            yield data[:end]

    return blocks(), counter


def open_lines(raw: BinaryIO, report: Report) -> tuple[Iterator[bytes], CountingReader]:
    """Lines of ``raw`` (transparently gunzipped when it starts with the gzip magic), and the
    counter of bytes taken from ``raw``.

    A truncated or corrupt gzip stream ends the iteration after the last complete line, records
    one error and sets ``report.truncated``; it never raises.
    """
    counter = CountingReader(raw)
    buffered = io.BufferedReader(counter, buffer_size=1 << 20)
    head = buffered.peek(2)[:2]
    stream: BinaryIO = buffered
    if head == GZIP_MAGIC:
        stream = gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[assignment]

    def lines() -> Iterator[bytes]:
        number = 0
        while True:
            try:
                line = stream.readline()
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                report.truncated = True
                report.skip(number + 1, f"gzip stream is truncated or corrupt ({exc}); "
                            f"the {number} lines before it were read")
                return
            if not line:
                return
            number += 1
            yield line

    return lines(), counter
