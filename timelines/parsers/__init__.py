"""Parsers: pure functions from bytes to rows, one module per format. No Django imports.

``FORMATS`` is the registry, most specific first; ``detect`` picks the parser for a file.
"""

from __future__ import annotations

from . import audit
from .audit import AuditRow, parse_audit
from .audit import sniff as sniff_audit
from .base import Format, InputError, ParseHints, Report, Row, read_head
from .redact import MARKER, Redactor

FORMATS: list[Format] = [audit.FORMAT]


def detect(head: bytes, name: str) -> Format | None:
    """The format of a file from its first bytes (decompressed) and its name, or None."""
    for candidate in FORMATS:
        if candidate.sniff(head, name):
            return candidate
    return None


__all__ = ["FORMATS", "MARKER", "AuditRow", "Format", "InputError", "ParseHints", "Redactor",
           "Report", "Row", "detect", "parse_audit", "read_head", "sniff_audit"]
