"""Falco rules over stored incidents (``timelines.detections``): the falco traces through real
ingest give the same detections as the engine on the trace files themselves; detections are
insights (``kind=detection``), the ``detection=`` events filter selects their requests, and
rules files are added through the API or refused with ``file:line: reason``."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from django.urls import reverse

from timelines.analysis import insights
from timelines.detections import engine, rules
from timelines.detections.incident import evaluate, ruleset_for
from timelines.detections.models import DetectionMatch, RulesFile
from timelines.models import Event

from .conftest import FALCO_DAY

pytestmark = pytest.mark.django_db


def expected_matches(fixtures_dir, ruleset) -> dict[str, set[str]]:
    """rule → auditIDs, from the engine on the trace files (the requests of FALCO_DAY)."""
    lines = []
    for path in sorted((fixtures_dir / "audit" / "falco").glob("*.json")):
        events, _ = engine.read_trace(path)
        lines += [e for e in events if e.get("requestReceivedTimestamp", "").startswith(
            FALCO_DAY)]
    found = defaultdict(set)
    for detection in engine.evaluate_lines(ruleset, lines):
        found[detection.rule.name].add(detection.event["auditID"])
    return found


def test_stored_requests_match_as_the_trace_lines_do(falco, incident, fixtures_dir):
    ruleset = ruleset_for(incident.pk)
    expected = expected_matches(fixtures_dir, ruleset)
    found = evaluate(incident.pk, ruleset)
    audit_ids = dict(Event.objects.filter(incident=incident).values_list("id", "audit_id"))
    got = {rule: {audit_ids[i] for i in ids} for rule, ids in found.ids.items() if ids}
    assert got == dict(expected)
    # the private-credential configmaps are detected although their values were redacted
    assert "Create/Modify Configmap With Private Credentials" in got
    # most rules were decided on the columns: only the requests some rule left open were read
    assert 0 < found.bodies_read < len(falco)


def test_the_column_index_decides_as_the_database_does(falco, incident):
    """Past 20,000 events the groups come from the column index's signatures: same matches."""
    from timelines.store import columns
    from timelines.store.aggregate import data_version

    ruleset = ruleset_for(incident.pk)
    by_database = evaluate(incident.pk, ruleset)
    assert not by_database.from_index
    assert columns.build(incident.pk, data_version(incident.pk)) is not None
    by_index = evaluate(incident.pk, ruleset)
    assert by_index.from_index  # its signatures hold more columns: more, smaller groups
    assert {r: sorted(i) for r, i in by_index.ids.items() if i} == {
        r: sorted(i) for r, i in by_database.ids.items() if i}
    assert by_index.bodies_read == by_database.bodies_read


def test_detection_insights_group_by_object_from_the_index_as_from_the_rows(falco, incident,
                                                                           monkeypatch):
    """The objects of a rule's matches, their order, ids and texts: the same from the column
    index's signatures as from the matched rows."""
    from timelines.detections import incident as module
    from timelines.store import columns
    from timelines.store.aggregate import data_version

    ruleset = ruleset_for(incident.pk)
    found = evaluate(incident.pk, ruleset)
    from_rows = module.detection_insights(incident.pk, ruleset, found)
    assert columns.build(incident.pk, data_version(incident.pk)) is not None
    read = []
    monkeypatch.setattr(module, "_objects_from_rows",
                        lambda *args: read.append(args) or pytest.fail("rows read"))
    monkeypatch.setattr(module, "MAX_GROUPS", 2)  # some rules tell the rest in one more
    few = module.detection_insights(incident.pk, ruleset, found)
    monkeypatch.setattr(module, "MAX_GROUPS", 30)
    assert module.detection_insights(incident.pk, ruleset, found) == from_rows
    assert not read
    assert any(i["title"] == i["rule"] and "more requests on" in i["explanation"] for i in few)
    counted = defaultdict(int)
    for item in few:
        counted[item["rule"]] += item["event_count"]
        assert set(item["events"]) <= set(found.ids[item["rule"]])
    assert dict(counted) == {r: len(set(i)) for r, i in found.ids.items() if i}


def test_detections_are_insights_and_filter_events(falco, incident, fixtures_dir, api):
    expected = expected_matches(fixtures_dir, ruleset_for(incident.pk))
    insights.refresh(incident.pk)
    answer = api(reverse("incident-insights", args=[incident.pk]), {"kind": "detection"})
    assert answer.status_code == 200
    found = answer.json()
    assert found and {i["kind"] for i in found} == {"detection"}
    by_rule = defaultdict(set)
    audit_ids = dict(Event.objects.filter(incident=incident).values_list("id", "audit_id"))
    for item in found:
        rule = rules.load(rules.default_files()).rule(item["rule"])
        assert item["title"] == rule.name and item["priority"] == rule.priority
        assert item["severity"] == rules.severity_of(rule.priority)
        assert item["output"] == item["explanation"] and "%ka." not in item["output"]
        assert item["filters"] == {"detection": [rule.name]}
        by_rule[item["rule"]] |= {audit_ids[i] for i in item["events"]}
    assert dict(by_rule) == dict(expected)
    # the events filter selects the same requests, in the list's order
    rule_name = "Create/Modify Configmap With Private Credentials"
    page = api(reverse("api:incident-event-list", args=[incident.pk]), {"detection": rule_name})
    assert page.status_code == 200
    assert {e["audit_id"] for e in page.json()["results"]} == expected[rule_name]
    item = next(i for i in found if i["rule"] == rule_name)
    assert set(item["events"]) == set(DetectionMatch.objects.filter(
        incident=incident, rule=rule_name).values_list("event_id", flat=True))


def test_a_sequence_starts_from_a_detection(falco, incident, owner, token_for, client):
    found = [i for i in insights.refresh(incident.pk).insights if i["kind"] == "detection"]
    item = next(i for i in found if i["rule"] == "Attach/Exec Pod")
    answer = client.post(reverse("incident-insight-sequence", args=[incident.pk, item["id"]]),
                         {}, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Token {token_for(owner)}")
    assert answer.status_code == 201, answer.content
    sequence = answer.json()
    assert sequence["title"] == "Attach/Exec Pod"
    assert [step["event"] for step in sequence["steps"]] == item["events"]
    assert sequence["steps"][0]["note"] == item["output"]


BROKEN = {
    "syntax.yaml": ("- rule: x\n  condition: ka.verb=get\n  output: [unclosed\n", 3),
    "field.yaml": ("- macro: m\n  condition: ka.verb=get\n\n- rule: r\n  desc: d\n"
                   "  condition: m and ka.nosuch.field=1\n  output: o\n  priority: INFO\n"
                   "  source: k8s_audit\n", 6),
    "macro.yaml": ("- rule: r\n  desc: d\n  condition: kevt and no_such_macro\n  output: o\n"
                   "  priority: INFO\n  source: k8s_audit\n", 3),
    "type.yaml": ("- list: l\n  items: [a]\n- rule: r\n  desc: d\n  condition: ka.verb=get\n"
                  "  output: o\n  priority: LOUD\n  source: k8s_audit\n", 7),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_rules_file_is_refused_whole_with_file_and_line(name, client, superuser_key):
    text, line = BROKEN[name]
    answer = client.post(reverse("rules"), {"name": name, "text": text},
                         content_type="application/json", HTTP_AUTHORIZATION=superuser_key)
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith(f"{name}:{line}: ")
    assert not RulesFile.objects.exists()  # nothing of it is kept


def test_an_added_rules_file_tunes_the_shipped_rules(client, superuser_key, owner, token_for,
                                                     other_team):
    text = ("- list: allowed_k8s_users\n  items: [alice]\n  override:\n    items: append\n"
            "- rule: Attach/Exec Pod\n  enabled: false\n")
    answer = client.post(reverse("rules"), {"name": "local.yaml", "text": text},
                         content_type="application/json", HTTP_AUTHORIZATION=superuser_key)
    assert answer.status_code == 201, answer.content
    listing = client.get(reverse("rules"), HTTP_AUTHORIZATION=superuser_key).json()
    assert [f["name"] for f in listing["files"]] == ["k8s_audit_rules.yaml", "local.yaml"]
    rules_by_name = {r["name"]: r for r in listing["rules"]}
    assert len(rules_by_name) == 48
    assert rules_by_name["Attach/Exec Pod"]["enabled"] is False
    assert rules_by_name["Create Privileged Pod"] == {
        "name": "Create Privileged Pod", "priority": "WARNING", "source":
        "k8s_audit_rules.yaml", "enabled": True, "evaluated": True, "tags": ["k8s"]}
    # another team's files are not listed to those outside it
    outside = client.get(reverse("rules"), {"team": other_team.name},
                         HTTP_AUTHORIZATION=f"Token {token_for(owner)}")
    assert outside.status_code == 400
    # not an admin: refused
    refused = client.post(reverse("rules"), {"name": "x.yaml", "text": text},
                          content_type="application/json",
                          HTTP_AUTHORIZATION=f"Token {token_for(owner)}")
    assert refused.status_code == 403


@pytest.fixture
def superuser_key(django_user_model, token_for):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    return f"Token {token_for(admin)}"


def test_the_timeline_marks_detected_events(falco, incident, owner, client):
    insights.refresh(incident.pk)
    rule_name = "Attach/Exec Pod"
    expected = set(DetectionMatch.objects.filter(incident=incident, rule=rule_name).values_list(
        "event_id", flat=True))
    assert expected
    client.force_login(owner)
    page = client.get(reverse("incidents:detail", args=[incident.pk]),
                      {"detection": rule_name, "partial": "events"}).content.decode()
    rows = set(map(int, re.findall(r'data-event="(\d+)"', page)))
    assert rows == expected  # the filter on the page's table
    assert page.count(f"⚑ {rule_name}</a>") == len(expected)  # each row marked


def test_the_purge_of_a_deleted_incident_removes_its_matches(falco, incident):
    from timelines.ingest.purge import delete_incident, purge_incident

    insights.refresh(incident.pk)
    assert DetectionMatch.objects.filter(incident=incident).exists()
    delete_incident(incident)
    purge_incident(incident.pk)
    assert not DetectionMatch.objects.filter(incident_id=incident.pk).exists()


def test_the_matches_move_to_their_keyed_table_and_back(falco, incident):
    """Migration 0003 moves every match to the table keyed by (incident, event, rule), and a
    duplicate that the serial id allowed as one; reversed, every match is back."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    insights.refresh(incident.pk)
    stored = sorted(DetectionMatch.objects.filter(incident=incident).values_list(
        "event_id", "rule"))
    assert len(stored) > 10
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        MigrationExecutor(connection).migrate([("detections", "0002_detection_event_id")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT event_id, rule FROM detections_detectionevent"
                           " WHERE incident_id = %s", [incident.pk])
            assert sorted(cursor.fetchall()) == stored
            cursor.execute("INSERT INTO detections_detectionevent (incident_id, event_id, rule)"
                           " VALUES (%s, %s, %s)", [incident.pk, *stored[0]])
    finally:
        MigrationExecutor(connection).migrate(latest)
    assert sorted(DetectionMatch.objects.filter(incident=incident).values_list(
        "event_id", "rule")) == stored


def _stores_each_match_once(incident) -> None:
    from timelines.detections.incident import Matches, store_matches

    found = Matches()
    found.ids["a"] += [3, 1, 3]
    found.ids["b"] += [1]
    store_matches(incident.pk, found)
    assert sorted(DetectionMatch.objects.filter(incident=incident).values_list(
        "rule", "event_id")) == [("a", 1), ("a", 3), ("b", 1)]


def test_matches_are_stored_once_each(incident):
    """A rule that names an event twice stores one match (the key refuses a second): by COPY
    on PostgreSQL, by rows on SQLite (the embedded test below)."""
    _stores_each_match_once(incident)


@pytest.mark.embedded
def test_matches_are_stored_once_each_embedded(incident):
    _stores_each_match_once(incident)


def test_new_matches_write_only_what_changed(incident, team, owner):
    """PostgreSQL: a match found again stays where it is (the same row), those no longer found
    are deleted (of a rule gone too), the new ones added; another incident's stay."""
    from django.db import connection

    from incidents.models import Incident
    from timelines.detections.incident import Matches, store_matches

    def matches(**ids) -> Matches:
        found = Matches()
        for rule, event_ids in ids.items():
            found.ids[rule] += event_ids
        return found

    def rows(incident_id) -> dict[tuple, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT rule, event_id, ctid::text FROM detections_detectionmatch"
                           " WHERE incident_id = %s", [incident_id])
            return {(rule, event_id): where for rule, event_id, where in cursor.fetchall()}

    other = Incident.objects.create(title="other", team=team, created_by=owner)
    store_matches(other.pk, matches(a=[1, 2]))
    store_matches(incident.pk, matches(a=[1, 2, 3], b=[2], gone=[5]))
    before = rows(incident.pk)
    store_matches(incident.pk, matches(a=[3, 4, 2], b=[], c=[1]))
    after = rows(incident.pk)
    assert set(after) == {("a", 2), ("a", 3), ("a", 4), ("c", 1)}
    assert after[("a", 2)] == before[("a", 2)] and after[("a", 3)] == before[("a", 3)]
    assert set(rows(other.pk)) == {("a", 1), ("a", 2)}
    store_matches(incident.pk, matches())
    assert rows(incident.pk) == {} and len(rows(other.pk)) == 2


@pytest.mark.django_db(transaction=True)
def test_two_processes_try_the_bodies_as_one_does(falco, incident, monkeypatch, caplog):
    """A whole incident's bodies are tried in two halves, one in a forked process: the same
    matches in the same order as one process trying them all; the parent's connection still
    answers; a helper that fails leaves its half to the parent, with nothing lost."""
    import os

    from django.db import connection

    from timelines.detections import incident as module

    ruleset = ruleset_for(incident.pk)
    monkeypatch.setattr(module._Helper, "MIN_BODIES", 10**9)
    alone = evaluate(incident.pk, ruleset)
    assert alone.bodies_read > 10
    started = []
    start = module._Helper.start.__func__

    def spy(cls, bodies, pointers):
        helper = start(cls, bodies, pointers)
        started.append((helper, len(pointers)))
        return helper

    monkeypatch.setattr(module._Helper, "start", classmethod(spy))
    monkeypatch.setattr(module._Helper, "MIN_BODIES", 1)
    shared = evaluate(incident.pk, ruleset)
    assert len(started) == 1 and started[0][0] is not None and started[0][1] > 0
    assert dict(shared.ids) == dict(alone.ids)  # lists: the order too
    assert shared.bodies_read == alone.bodies_read
    with connection.cursor() as cursor:  # the child closed nothing of the parent's
        cursor.execute("SELECT count(*) FROM timelines_event WHERE incident_id = %s",
                       [incident.pk])
        assert cursor.fetchone()[0] == len(falco)

    monkeypatch.setattr(module._Helper, "_child", staticmethod(lambda *args: os._exit(3)))
    started.clear()
    with caplog.at_level("WARNING", logger=module.__name__):
        failed = evaluate(incident.pk, ruleset)
    assert started and started[0][0] is not None
    assert "ended with status" in caplog.text
    assert dict(failed.ids) == dict(alone.ids)
    assert failed.bodies_read == alone.bodies_read

    # one that hangs is killed once the parent's patience is out
    import time

    monkeypatch.setattr(module._Helper, "_child", staticmethod(lambda *args: time.sleep(120)))
    monkeypatch.setattr(module._Helper, "MIN_PATIENCE", 1.0)
    caplog.clear()
    started_at = time.monotonic()
    with caplog.at_level("WARNING", logger=module.__name__):
        hung = evaluate(incident.pk, ruleset)
    assert time.monotonic() - started_at < 30
    assert "gave no answer" in caplog.text
    assert dict(hung.ids) == dict(alone.ids)


@pytest.mark.parametrize("size", [0, 1, 7, 2000])
def test_the_set_helpers_answer_as_numpy_s_set_functions(size):
    """``_distinct`` and ``_within`` sort instead of hashing, with numpy's answers (repeated
    values, none, one)."""
    import numpy as np

    from timelines.detections.incident import _distinct, _within

    rng = np.random.default_rng(size)
    values, among = rng.integers(0, 60, size), rng.integers(0, 60, size // 2)
    assert _distinct(values).tolist() == np.unique(values).tolist()
    assert _within(values, among).tolist() == np.isin(values, among).tolist()
