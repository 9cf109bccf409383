"""The README's one line for a CI job's failure step, run for real with curl against a live
server: it cuts the job's window of the stream into an incident."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from timelines.models import Event

from .helpers import event_list, fixture_events

pytestmark = pytest.mark.django_db(transaction=True)

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_one_liner() -> str:
    lines = [line for line in README.read_text().splitlines()
             if line.startswith("curl ") and "/api/v1/streams/" in line and "/incidents/" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_readme_one_liner_cuts_the_jobs_window(live_server, stream_of, post_batch, owner,
                                                   token_for, demo_log):
    stream, token = stream_of()
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    events = []
    for index, line in enumerate(fixture_events(demo_log)):
        event = orjson.loads(line)
        # before the job, then during it: only the job's part is cut
        when = started + timedelta(seconds=index * 10 - 60)
        event.pop("timestamp", None)
        event.pop("metadata", None)
        event["requestReceivedTimestamp"] = event["stageTimestamp"] = when.isoformat()
        events.append(event)
    assert post_batch(stream.pk, event_list([orjson.dumps(e) for e in events]),
                      token).status_code == 200
    command = readme_one_liner().replace("https://hindsight.example.com", live_server.url)
    command = re.sub(r"/api/v1/streams/\d+/", f"/api/v1/streams/{stream.pk}/", command)
    command = command.replace("curl -fsS", "curl -sS -w '\\n%{http_code}'")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HINDSIGHT_TOKEN": token_for(owner),
                               "JOB_STARTED_AT": started.isoformat().replace("+00:00", "Z"),
                               "CI_JOB_ID": "4242"})
    body, _, code = done.stdout.rpartition("\n")
    assert code == "201", (done.stdout, done.stderr)
    answer = json.loads(body)
    assert answer["url"] == f"{live_server.url}/incidents/{answer['id']}/"
    cut = Event.objects.filter(incident_id=answer["id"])
    assert cut.count() == len({(e["auditID"], e["requestReceivedTimestamp"]) for e in events
                               if datetime.fromisoformat(e["requestReceivedTimestamp"])
                               >= started})
    assert cut.count() < len(events)
    assert cut.first().incident.title == "e2e 4242 failed"
