"""The API behind the interactive timeline: the free-text filter ``q``, the JSON export
(``events.json``) and stepping to the neighbour of an event (``events/step/``).

Expected results come from the fixture files, read here with ``json``: an audit event's text is
its requestURI and objectRef.name, a Kubernetes Event's its message and involvedObject.name.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from pathlib import Path

import pytest

from timelines.models import Event
from timelines.web.api import CSV_COLUMNS

pytestmark = pytest.mark.django_db

EVENTS_URL = "/api/v1/incidents/{}/events/"
JSON_URL = "/api/v1/incidents/{}/events.json"
STEP_URL = "/api/v1/incidents/{}/events/step/"


def _read(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return document.get("items", [document]) if isinstance(document, dict) else document


def _texts(event: dict) -> list[str]:
    """What ``q`` searches, straight from the raw evidence."""
    if event.get("kind") == "Event" and "auditID" in event:
        return [event.get("requestURI") or "", (event.get("objectRef") or {}).get("name") or ""]
    return [event.get("message") or "", (event.get("involvedObject") or {}).get("name") or ""]


def _key(event: dict) -> str:
    return event.get("auditID") or event["message"]


@pytest.fixture
def evidence(incident, ingest_file, fixtures_dir, demo_log) -> list[dict]:
    """Requests of the audit2rbac demo (URIs, no names), the falco clusterrole create (a name
    its URI lacks) and two Kubernetes Events (messages): the raw events."""
    paths = [demo_log, fixtures_dir / "audit" / "falco" / "create_clusterrole.json",
             fixtures_dir / "events" / "insights-openshift-machine-api.json"]
    raw = []
    for path in paths:
        assert ingest_file(incident, path).status == "done"
        raw += _read(path)
    assert Event.objects.filter(incident=incident).count() == len(raw)
    return raw


def _found(api, incident, params) -> list[Event]:
    answer = api(EVENTS_URL.format(incident.pk), {**params, "page_size": 1000})
    assert answer.status_code == 200, answer.content
    assert answer.json()["next"] is None
    return [Event.objects.get(pk=r["id"]) for r in answer.json()["results"]]


def _keys_of(events: list[Event]) -> set[str]:
    return {e.audit_id if e.kind == "audit" else e.message for e in events}


# --- q ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["/apis/apps", "RECONCILER failed", "Some-Reader", "NS1/pods",
                                  "jsmg4", "/api/v1/nodes?includeuninitialized"])
def test_q_finds_the_text_in_uri_message_or_name_in_any_case(api, incident, evidence, text):
    expected = {_key(e) for e in evidence if any(text.lower() in t.lower() for t in _texts(e))}
    assert expected  # each case finds something

    assert _keys_of(_found(api, incident, {"q": text})) == expected


def test_q_finds_an_object_by_a_name_its_uri_does_not_hold(api, incident, evidence):
    created = next(e for e in evidence if e.get("objectRef", {}).get("name") == "some-reader")
    assert "some-reader" not in created["requestURI"]

    assert _keys_of(_found(api, incident, {"q": "some-reader"})) == {created["auditID"]}


def test_repeated_q_must_all_match(api, incident, evidence):
    both = {_key(e) for e in evidence
            if any("reconciler" in t for t in _texts(e)) and any("2c" in t for t in _texts(e))}
    either = {_key(e) for e in evidence
              if any("reconciler" in t or "2c" in t for t in _texts(e))}
    assert 0 < len(both) < len(either)

    found = _found(api, incident, {"q": ["reconciler", "2c"]})

    assert _keys_of(found) == both


def test_q_ands_with_the_other_filters(api, incident, evidence):
    expected = {e["auditID"] for e in evidence if "auditID" in e and e["verb"] == "list"
                and "/namespaces/default/" in e["requestURI"]}
    assert 0 < len(expected)

    found = _found(api, incident, {"q": "/namespaces/default/", "verb": "list"})

    assert _keys_of(found) == expected


def test_q_takes_like_wildcards_literally(api, incident, evidence):
    assert not any("%" in t or "_" in t for e in evidence for t in _texts(e))

    assert _found(api, incident, {"q": "%"}) == []
    assert _found(api, incident, {"q": "_"}) == []


def test_q_filters_the_figure_and_the_csv_too(api, incident, evidence):
    expected = [e for e in evidence if any("/apis/apps" in t for t in _texts(e))]

    figure = api(f"/api/v1/incidents/{incident.pk}/figure/", {"q": "/apis/apps"}).json()
    table = api(f"/api/v1/incidents/{incident.pk}/events.csv", {"q": "/apis/apps"})

    assert figure["meta"]["total"] == len(expected)
    rows = list(csv.DictReader(io.StringIO(b"".join(table.streaming_content).decode())))
    assert {r["audit_id"] for r in rows} == {e["auditID"] for e in expected}


# --- events.json --------------------------------------------------------------------------------

def _json_export(api, incident, params=None):
    answer = api(JSON_URL.format(incident.pk), params)
    assert answer.status_code == 200
    assert answer.streaming  # rows are written as they are read, never the whole list at once
    chunks = list(answer.streaming_content)
    return answer, chunks, json.loads(b"".join(chunks))


def test_json_export_has_the_csv_columns_and_values(api, incident, evidence):
    answer, chunks, rows = _json_export(api, incident)
    table = list(csv.DictReader(io.StringIO(
        b"".join(api(f"/api/v1/incidents/{incident.pk}/events.csv").streaming_content)
        .decode())))

    assert answer["Content-Type"] == "application/json"
    assert f"incident-{incident.pk}-events.json" in answer["Content-Disposition"]
    assert len(rows) == len(evidence) == len(table)
    assert len(chunks) > len(rows)  # one piece per row, plus the brackets
    for row, line in zip(rows, table, strict=True):
        assert list(row) == CSV_COLUMNS
        assert {k: "" if v is None else str(v) for k, v in row.items()} == line
    received = [datetime.fromisoformat(r["received"]) for r in rows]
    assert received == sorted(received)
    assert all(isinstance(r["id"], int) and isinstance(r["line"], int) for r in rows)


def test_json_export_takes_the_event_filters(api, incident, evidence):
    lists = {e["auditID"] for e in evidence if e.get("verb") == "list"
             and e.get("impersonatedUser", {}).get("username") == "bob"}
    assert lists

    _, _, rows = _json_export(api, incident, {"verb": "list", "impersonated_user": "bob"})
    _, _, texts = _json_export(api, incident, {"q": "reconciler"})

    assert {r["audit_id"] for r in rows} == lists
    assert {r["verb"] for r in rows} == {"list"}
    assert len(texts) == 2 and {r["kind"] for r in texts} == {"event"}
    assert all("reconciler" in r["message"] for r in texts)


def test_json_export_of_nothing_is_an_empty_array(api, incident, evidence):
    _, _, rows = _json_export(api, incident, {"user": "nobody"})
    assert rows == []


def test_json_export_refuses_a_bad_filter_and_strangers(api, client, incident, outsider,
                                                        token_for, evidence):
    url = JSON_URL.format(incident.pk)
    assert api(url, {"code": "abc"}).status_code == 400
    assert client.get(url).status_code == 401
    assert api(url, key=token_for(outsider)).status_code == 404


# --- step -----------------------------------------------------------------------------------------

def _step(api, incident, params) -> int | None:
    answer = api(STEP_URL.format(incident.pk), params)
    assert answer.status_code == 200, answer.content
    event = answer.json()["event"]
    return event and event["id"]


def _in_order(api, incident, params=None) -> list[int]:
    answer = api(EVENTS_URL.format(incident.pk), {**(params or {}), "page_size": 1000})
    return [r["id"] for r in answer.json()["results"]]


def test_stepping_walks_every_event_once_in_both_directions(api, incident, evidence):
    # the demo log stamps to the second: 23 requests share 20:27:42, so ids break the ties
    order = _in_order(api, incident)
    assert len(order) == len(evidence)

    forward, current = [], _step(api, incident, {})
    while current is not None:
        forward.append(current)
        current = _step(api, incident, {"from": current})
    backward, current = [], _step(api, incident, {"direction": "previous"})
    while current is not None:
        backward.append(current)
        current = _step(api, incident, {"from": current, "direction": "previous"})

    assert forward == order
    assert backward == order[::-1]


def test_stepping_stays_in_the_filters_and_finds_text(api, incident, evidence):
    forbidden = _in_order(api, incident, {"code": "403"})
    text = _in_order(api, incident, {"code": "403", "q": "/pods"})
    assert 1 < len(text) < len(forbidden)

    assert _step(api, incident, {"code": "403", "from": forbidden[0]}) == forbidden[1]
    assert _step(api, incident, {"code": "403", "q": "/pods", "from": text[0]}) == text[1]
    assert _step(api, incident, {"code": "403", "q": "/pods", "from": text[-1]}) is None
    assert _step(api, incident, {"code": "403", "q": "/pods", "from": text[1],
                                 "direction": "previous"}) == text[0]


def test_stepping_from_an_event_outside_the_filters(api, incident, evidence):
    everything = _in_order(api, incident)
    lists = _in_order(api, incident, {"verb": "list"})
    outside = next(pk for pk in everything if pk not in lists and pk > lists[0])
    after = [pk for pk in everything[everything.index(outside) + 1:] if pk in lists]

    assert _step(api, incident, {"verb": "list", "from": outside}) == after[0]


def test_stepping_refuses_foreign_or_bad_anchors(api, incident, evidence, other_team,
                                                 ingest_file, demo_log):
    from incidents.models import Incident

    theirs = Incident.objects.create(title="theirs", team=other_team)
    ingest_file(theirs, demo_log)
    foreign = Event.objects.filter(incident=theirs).first().pk
    url = STEP_URL.format(incident.pk)

    assert api(url, {"from": foreign}).status_code == 404
    assert api(url, {"from": "abc"}).status_code == 400
    assert api(url, {"direction": "sideways"}).status_code == 400
    assert api(STEP_URL.format(theirs.pk)).status_code == 404
