"""What every parser shares: opening (maybe gzipped) input and the per-file report.

No Django imports here or anywhere in ``timelines.parsers``: parsers are pure code, testable
without a database.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
MAX_KEPT_ERRORS = 20


class InputError(Exception):
    """The whole file is unusable (wrong type, nothing recognisable in it)."""


@dataclass
class Report:
    """What a parser saw in one file, beyond the rows it yielded."""

    source: str
    skipped: int = 0
    redacted: int = 0
    errors: list[str] = field(default_factory=list)
    # Set when reading stopped early (truncated gzip): the rows before it were yielded.
    truncated: bool = False

    def skip(self, line: int, reason: str) -> None:
        self.skipped += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(f"{self.source}:{line}: {reason}")


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
