"""Parsers: pure functions from bytes to rows, one module per format. No Django imports.

``FORMATS`` is the registry, most specific first; ``detect`` picks the parser for a file.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

from . import audit, envelopes, events, gke_logs, klog, textlog
from .audit import AuditRow, parse_audit
from .audit import sniff as sniff_audit
from .base import GZIP_MAGIC, HEAD_BYTES, Format, InputError, ParseHints, Report, Row, read_head
from .redact import MARKER, Redactor

# Order matters where sniffs overlap: envelopes hold native events (a native sniff could claim an
# OTLP file), and legacy audit text looks like a plain log to the text-log sniff.
# Objects of any kind come after Events (a file of Events may hold other objects too) and before
# the logs, whose lines may quote an object.
FORMATS: list[Format] = [*envelopes.FORMATS, gke_logs.FORMAT, audit.FORMAT, events.FORMAT,
                         events.OBJECTS_FORMAT, klog.FORMAT, textlog.FORMAT]


def detect(head: bytes, name: str) -> Format | None:
    """The format of a file from its first bytes (decompressed) and its name, or None."""
    for candidate in FORMATS:
        if candidate.sniff(head, name):
            return candidate
    return None


def describe_unknown(path: Path, head: bytes | None = None) -> str:
    """What a file that no parser reads looks like, in a few words, for the list of unused files
    ("empty file", "binary", "JSON, kind SecretList", "YAML, kind ConfigMap", "HTML", "text").
    ``head`` is its first bytes (decompressed) when the caller has read them already."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            magic = handle.read(2)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if size == 0:
        return "empty file"
    if head is None:
        head = read_head(path)
    if (magic == GZIP_MAGIC and b"\n" not in head and len(head) < HEAD_BYTES
            and _ends_early(path)):
        return "gzip that cannot be read"  # not one whole line comes out of it
    if not head:
        return "empty file"
    sample = head[:8192]
    # Control characters other than whitespace and ESC (colour codes in logs).
    controls = sum(byte < 9 or 13 < byte < 32 and byte != 27 for byte in sample)
    if b"\x00" in sample or controls > len(sample) // 20:
        return "binary"
    text = sample.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith((b"{", b"[")):
        kind = re.search(rb'"kind"\s*:\s*"([A-Za-z0-9.]+)"', head)
        return f"JSON, kind {kind[1].decode()}" if kind else "JSON"
    if re.match(rb"(?i)<!doctype html|<html", text):
        return "HTML"
    kind = re.search(rb"(?m)^kind:[ \t]*['\"]?([A-Za-z0-9.]+)", head)
    if kind:
        return f"YAML, kind {kind[1].decode()}"
    if text.startswith(b"---") or re.search(rb"(?m)^(?:apiVersion|metadata|items):", head):
        return "YAML"
    return "text"


def _ends_early(path: Path) -> bool:
    """Whether a gzip file's stream breaks before its end. Read to the end: called only for a
    file that gave less than a line and less than a head, so a short one (or a broken one)."""
    try:
        with gzip.open(path, "rb") as stream:
            while stream.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error):
        return True
    return False


__all__ = ["FORMATS", "MARKER", "AuditRow", "Format", "InputError", "ParseHints", "Redactor",
           "Report", "Row", "describe_unknown", "detect", "parse_audit", "read_head", "sniff_audit"]
