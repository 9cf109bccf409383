"""Fixtures of the timelines tests that several modules share."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

from timelines.models import Event

FALCO_DAY = "2018-10-26"  # the falco traces of this day: one minikube session, 38 requests


def _read(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def falco(incident, ingest_file, fixtures_dir) -> list[dict]:
    """The incident holding every falco trace of 26 October 2018 (clusterrole ``some-reader``
    created five times and deleted once, at RequestResponse level, among pods, services,
    configmaps); returns each request's facts with its event id, in time order."""
    requests = []
    for path in sorted((fixtures_dir / "audit" / "falco").glob("*.json")):
        try:
            events = [e for e in _read(path) if e.get("requestReceivedTimestamp", "")
                      .startswith(FALCO_DAY)]
        except json.JSONDecodeError:
            continue  # the deliberately malformed trace
        if not events:
            continue
        assert ingest_file(incident, path).status == "done"
        for event in events:
            ref = event.get("objectRef") or {}
            requests.append({
                "audit_id": event["auditID"],
                "received": datetime.fromisoformat(
                    event["requestReceivedTimestamp"].replace("Z", "+00:00")),
                "verb": event["verb"], "user": event["user"]["username"],
                "resource": ref.get("resource", ""),
                "namespace": ref.get("namespace", ""), "name": ref.get("name", ""),
                "uri": event["requestURI"], "file": path.name})
    ids = dict(Event.objects.filter(incident=incident).values_list("audit_id", "id"))
    assert len(ids) == len(requests) == 38
    for request in requests:
        request["id"] = ids[request["audit_id"]]
    return sorted(requests, key=lambda r: (r["received"], r["id"]))


@pytest.fixture
def drop_partitions():
    """A flush empties the tables but keeps partitions and load tables: drop this test's."""
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND (c.relname ~"
            " '^timelines_event_load_[0-9]+$' OR c.relname ~ '^timelines_event_[0-9]+$')")
        for (name,) in cursor.fetchall():
            cursor.execute(f"DROP TABLE {name}")
