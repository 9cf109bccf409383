"""What the stream tests share besides fixtures."""

from __future__ import annotations

from streams.sender import body_of, read_events
from timelines.parsers import Redactor, Report, parse_audit


def fixture_events(path) -> list[bytes]:
    return list(read_events([str(path)]))


def expected_rows(path):
    """The rows the upload pipeline's parser makes of ``path``: what a stream must hold."""
    with open(path, "rb") as raw:
        return list(parse_audit(raw, Report(path.name), Redactor()))


def event_list(lines: list[bytes]) -> bytes:
    return body_of(lines)
