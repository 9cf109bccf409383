"""Parsers: pure functions from bytes to rows, one module per format. No Django imports.

``FORMATS`` is the registry, most specific first; ``detect`` picks the parser for a file.
"""

from __future__ import annotations

import re

from . import audit, envelopes, events, gke_logs, klog, textlog
from .audit import AuditRow, parse_audit
from .audit import sniff as sniff_audit
from .base import Format, InputError, ParseHints, Report, Row, read_head
from .redact import MARKER, Redactor

# Order matters where sniffs overlap: envelopes hold native events (a native sniff could claim an
# OTLP file), and legacy audit text looks like a plain log to the text-log sniff.
FORMATS: list[Format] = [*envelopes.FORMATS, gke_logs.FORMAT, audit.FORMAT, events.FORMAT,
                         klog.FORMAT, textlog.FORMAT]


def detect(head: bytes, name: str) -> Format | None:
    """The format of a file from its first bytes (decompressed) and its name, or None."""
    for candidate in FORMATS:
        if candidate.sniff(head, name):
            return candidate
    return None


_YAML_KEY = re.compile(rb"[A-Za-z_][\w.-]*:(\s|$)")


def describe_unknown(head: bytes) -> str:
    """Why a file's first bytes are not evidence any parser reads, in a few words."""
    text = head.lstrip()
    if not text:
        return "empty file"
    if b"\x00" in head[:8192]:
        return "binary content"
    try:
        head[:8192].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < 8180:  # not just a character cut at the end of the sample
            return "binary content"
    if text[:1] in (b"{", b"["):
        return "JSON, but not audit events, Kubernetes Events or a known envelope"
    first = next((line.strip() for line in text.splitlines()
                  if line.strip() and not line.lstrip().startswith(b"#")), b"")
    if first.startswith(b"---") or _YAML_KEY.match(first):
        return "YAML, but not Kubernetes Events or audit entries"
    return "text, but not a known log or audit format"


__all__ = ["FORMATS", "MARKER", "AuditRow", "Format", "InputError", "ParseHints", "Redactor",
           "Report", "Row", "describe_unknown", "detect", "parse_audit", "read_head", "sniff_audit"]
