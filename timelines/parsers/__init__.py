"""Parsers: pure functions from bytes to rows, one module per format. No Django imports."""

from .audit import AuditRow, parse_audit
from .audit import sniff as sniff_audit
from .base import InputError, Report, Row
from .redact import MARKER, Redactor

__all__ = ["AuditRow", "InputError", "MARKER", "Redactor", "Report", "Row", "parse_audit",
           "sniff_audit"]
