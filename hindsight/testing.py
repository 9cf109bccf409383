"""Helpers shared by the test modules (fixtures live in the root conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path


def requests_in(path: Path) -> set[tuple[str, str]]:
    """The request identities (auditID, received) in a JSON-lines audit log, read with the
    standard library: expectations derived independently of the parser under test."""
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            event = json.loads(line)
            keys.add((event["auditID"],
                      event.get("requestReceivedTimestamp") or event["timestamp"]))
    return keys
