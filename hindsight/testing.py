"""Helpers shared by the test modules (fixtures live in the root conftest.py)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


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


def page_query(page) -> dict[str, list[str]]:
    """The query of a Playwright page's URL, every value of each parameter."""
    return parse_qs(urlsplit(page.url).query)


def wait_for_detail(page, event_id: int) -> None:
    """Wait until the incident page's detail panel shows the event."""
    page.wait_for_function(
        f"!document.getElementById('detail').hidden && "
        f"document.getElementById('detail-title').textContent === 'Event {event_id}'")


def write_audit_log(path: Path, start: datetime, offsets: list[timedelta], *,
                    user: str = "kubelet", code: int = 200) -> None:
    """A synthetic JSON-lines audit log at ``path``: one GET per offset from ``start``, on thirty
    pods in turn (``pods/shop/web-<n % 30>``), by ``user``, answered ``code``; auditIDs from the
    file's name."""
    lines = []
    for n, offset in enumerate(offsets):
        stamp = (start + offset).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lines.append(json.dumps({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": f"{path.stem}-{n:08d}", "stage": "ResponseComplete", "verb": "get",
            "requestURI": f"/api/v1/namespaces/shop/pods/web-{n % 30}",
            "user": {"username": user}, "responseStatus": {"code": code},
            "objectRef": {"resource": "pods", "namespace": "shop", "name": f"web-{n % 30}"},
            "requestReceivedTimestamp": stamp, "stageTimestamp": stamp}))
    path.write_text("\n".join(lines) + "\n")
