"""Every endpoint whose URL names its representation answers it whatever the Accept header says:
``events.csv``, ``events.json``, a sequence's ``export.md`` and ``export.json`` (and
``export/``, which negotiates between the two), the figure. DRF answered 406 to ``Accept:
text/csv`` on ``events.csv`` (its renderers are JSON ones) and to ``Accept: application/json``
on ``export.md`` (see ``hindsight.negotiation``)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from incidents.notes import Sequence, SequenceStep
from timelines.models import Event

pytestmark = pytest.mark.django_db

# (what the client sends as Accept, a label); None: no Accept header at all
ACCEPTS = [None, "*/*", "text/csv", "application/json", "text/markdown",
           "text/html;q=0.9, */*;q=0.1", "image/png"]


@pytest.fixture
def demo(incident, ingest_file, demo_log, owner):
    ingest_file(incident, demo_log)
    events = list(Event.objects.filter(incident=incident).order_by("received", "id"))
    sequence = Sequence.objects.create(incident=incident, title="root cause", author=owner)
    SequenceStep.objects.create(sequence=sequence, position=0, event_id=events[0].pk,
                                at=events[0].received, note="first")
    return incident, events, sequence


def get(client, url: str, accept: str | None):
    headers = {} if accept is None else {"Accept": accept}
    return client.get(url, headers=headers)


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.mark.parametrize("accept", ACCEPTS)
def test_events_csv_is_csv_whatever_the_accept_header(demo, owner, api_as, accept):
    incident, events, _ = demo

    response = get(api_as(owner), f"/api/v1/incidents/{incident.pk}/events.csv?verb=get", accept)

    assert response.status_code == 200, body(response)[:300]
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body(response).decode())))
    assert [int(r["id"]) for r in rows] == [e.pk for e in events if e.verb == "get"]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_events_json_is_json_whatever_the_accept_header(demo, owner, api_as, accept):
    incident, events, _ = demo

    response = get(api_as(owner), f"/api/v1/incidents/{incident.pk}/events.json", accept)

    assert response.status_code == 200, body(response)[:300]
    assert response["Content-Type"].startswith("application/json")
    assert [row["id"] for row in json.loads(body(response))] == [e.pk for e in events]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_sequence_exports_follow_their_suffix_whatever_the_accept_header(demo, owner, api_as,
                                                                          accept):
    _, events, sequence = demo
    client = api_as(owner)

    markdown = get(client, f"/api/v1/sequences/{sequence.pk}/export.md", accept)
    as_json = get(client, f"/api/v1/sequences/{sequence.pk}/export.json", accept)

    assert markdown.status_code == 200, markdown.content[:300]
    assert markdown["Content-Type"].startswith("text/markdown")
    assert markdown.content.decode().startswith("# root cause\n")
    assert as_json.status_code == 200, as_json.content[:300]
    assert as_json["Content-Type"].startswith("application/json")
    assert [s["event"] for s in as_json.json()["steps"]] == [events[0].pk]


@pytest.mark.parametrize(("accept", "expected"), [
    (None, "text/markdown"), ("*/*", "text/markdown"), ("text/markdown", "text/markdown"),
    ("application/json", "application/json"), ("text/csv", "text/markdown")])
def test_the_export_without_suffix_negotiates_and_falls_back_to_markdown(demo, owner, api_as,
                                                                         accept, expected):
    _, _, sequence = demo

    response = get(api_as(owner), f"/api/v1/sequences/{sequence.pk}/export/", accept)

    assert response.status_code == 200
    assert response["Content-Type"].startswith(expected)


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_figure_is_json_whatever_the_accept_header(demo, owner, api_as, accept):
    incident, events, _ = demo

    response = get(api_as(owner), f"/api/v1/incidents/{incident.pk}/figure/", accept)

    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["meta"]["total"] == len(events)


@pytest.mark.parametrize("accept", ["text/csv", "image/png"])
def test_errors_of_a_download_still_say_why(demo, outsider, owner, api_as, accept):
    incident, _, _ = demo

    hidden = get(api_as(outsider), f"/api/v1/incidents/{incident.pk}/events.csv", accept)
    bad = get(api_as(owner), f"/api/v1/incidents/{incident.pk}/events.csv?code=x", accept)

    assert hidden.status_code == 404 and "No such incident" in hidden.content.decode()
    assert bad.status_code == 400 and "code" in bad.json()
