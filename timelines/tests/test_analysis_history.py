"""Object history (``timelines.analysis.history``) on the fixtures: which requests, Events and
log lines belong to one object, and which requests hold a version of it. Expectations are read
from the fixture files here, with ``json``/``yaml`` and plain text searches."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from timelines.models import Event

CLUSTERROLE = {"resource": "clusterroles", "name": "some-reader"}
LEASE = {"resource": "leases", "namespace": "kube-system", "name": "kube-controller-manager"}


def _falco_bodies(fixtures_dir) -> dict[str, dict]:
    """auditID → the raw falco audit event (the malformed trace left out)."""
    bodies = {}
    for path in (fixtures_dir / "audit" / "falco").glob("*.json"):
        text = path.read_text(encoding="utf-8")
        try:
            events = [json.loads(text)]
        except json.JSONDecodeError:
            try:
                events = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError:
                continue
        bodies.update((e["auditID"], e) for e in events if "auditID" in e)
    return bodies


def _holds_object(body: dict) -> bool:
    """Whether a raw audit event stored a whole object: a response (or request) object with
    metadata that is no Status and no list."""
    for field in ("responseObject", "requestObject"):
        value = body.get(field)
        if (isinstance(value, dict) and isinstance(value.get("metadata"), dict)
                and value.get("kind") not in (None, "Status")
                and not value["kind"].endswith("List")):
            return True
    return False


def _history(api, incident, **params):
    answer = api(f"/api/v1/incidents/{incident.pk}/history/", params)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_clusterroles_history_lists_its_requests_and_versions(api, incident, falco,
                                                                fixtures_dir):
    mine = [r for r in falco if r["resource"] == "clusterroles" and r["name"] == "some-reader"
            and not r["namespace"]]
    assert len(mine) >= 2
    body = _history(api, incident, **CLUSTERROLE)
    assert body["object"] == {"resource": "clusterroles", "namespace": "", "name": "some-reader"}
    assert [e["id"] for e in body["events"]] == [r["id"] for r in mine]
    assert [e["verb"] for e in body["events"]] == [r["verb"] for r in mine]
    # the versions are the requests whose raw event stored the role, each diffed with the last
    raw = _falco_bodies(fixtures_dir)
    holds = [_holds_object(raw[r["audit_id"]]) for r in mine]
    assert [e["version"] for e in body["events"]] == holds
    assert body["versions"] == sum(holds)
    previous = None
    for event, held in zip(body["events"], holds, strict=True):
        assert event["previous_version"] == (previous if held else None)
        previous = event["id"] if held else previous
        assert (event["version_note"] is None) == held
    # a version diffs against the one before it through the events' diff endpoint
    pair = next(e for e in body["events"] if e["previous_version"])
    diff = api(f"/api/v1/events/{pair['id']}/diff/", {"against": pair["previous_version"]})
    assert diff.status_code == 200
    assert diff.json()["against"] == pair["previous_version"]
    # opened from any event of the object, the history is the same
    assert _history(api, incident, event=mine[-1]["id"]) == body


def test_a_namespaced_objects_history_leaves_other_namespaces_out(api, incident, falco):
    pods = [r for r in falco if r["resource"] == "pods" and r["name"]]
    assert pods
    first = pods[0]
    body = _history(api, incident, event=first["id"])
    assert [e["id"] for e in body["events"]] == [
        r["id"] for r in pods if (r["namespace"], r["name"]) == (first["namespace"],
                                                                 first["name"])]
    # filters of the events API narrow it
    verb = first["verb"]
    narrowed = _history(api, incident, event=first["id"], verb=verb)
    assert [e["id"] for e in narrowed["events"]] == [
        e["id"] for e in body["events"] if e["verb"] == verb]


def test_log_lines_naming_the_object_are_in_its_history(api, incident, ingest_file,
                                                        fixtures_dir):
    path = fixtures_dir / "klog" / "kind-kube-controller-manager.txt"
    assert ingest_file(incident, path).status == "done"
    lines = path.read_text(encoding="utf-8").splitlines()
    naming = [n for n, line in enumerate(lines, 1)
              if "kube-system/kube-controller-manager" in line]
    assert naming
    body = _history(api, incident, **LEASE)
    assert [(e["kind"], e["line"]) for e in body["events"]] == [("log", n) for n in naming]
    assert body["versions"] == 0
    # a prefix of the name is another object: none of those lines name it
    prefix = [n for n, line in enumerate(lines, 1)
              if re.search(r"kube-system/kube-controller(?![-\w])", line)]
    shorter = _history(api, incident, **{**LEASE, "name": "kube-controller"})
    assert [e["line"] for e in shorter["events"]] == prefix


def test_kubernetes_events_about_the_object_are_in_its_history(api, incident, ingest_file,
                                                                fixtures_dir):
    path = fixtures_dir / "events" / "kspan-deployment-2-pods.yaml"
    assert ingest_file(incident, path).status == "done"
    about: dict[tuple, set] = {}
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if isinstance(document, dict) and document.get("kind") == "Event":
            involved = document["involvedObject"]
            key = (involved["kind"], involved.get("namespace", ""), involved["name"])
            about.setdefault(key, set()).add(document["metadata"]["uid"])
    (kind, namespace, name), uids = max(about.items(), key=lambda item: len(item[1]))
    resource = Event.objects.filter(incident=incident, kind="event", name=name,
                                    namespace=namespace).values_list("resource", flat=True)[0]
    assert resource == kind.lower() + "s"
    body = _history(api, incident, resource=resource, namespace=namespace, name=name)
    events = [e for e in body["events"] if e["kind"] == "event"]
    assert len(events) == len(uids)
    assert [e["received"] for e in events] == sorted(e["received"] for e in events)


def test_bad_object_choices_get_a_clear_400(api, incident, ingest_file, fixtures_dir,
                                            other_team, owner):
    assert ingest_file(incident, fixtures_dir / "klog" /
                       "kind-kube-controller-manager.txt").status == "done"
    log_line = Event.objects.filter(incident=incident, kind="log").first()
    answer = api(f"/api/v1/incidents/{incident.pk}/history/", {"event": log_line.pk})
    assert answer.status_code == 400
    assert "names no object" in answer.json()["event"]
    assert api(f"/api/v1/incidents/{incident.pk}/history/").status_code == 400
    assert api(f"/api/v1/incidents/{incident.pk}/history/",
               {"event": 10**9}).status_code == 400
    assert api(f"/api/v1/incidents/{incident.pk}/history/",
               {**LEASE, "code": "x"}).status_code == 400


def test_only_the_incidents_readers_see_a_history(api_as, client, outsider, incident, falco):
    event = falco[0]["id"]
    assert api_as(outsider).get(f"/api/v1/incidents/{incident.pk}/history/",
                                {"event": event}).status_code == 404
    client.force_login(outsider)
    assert client.get(f"/incidents/{incident.pk}/history/", {"event": event}).status_code == 404


@pytest.mark.embedded
def test_a_history_in_the_embedded_mode(api, incident, falco):
    mine = [r["id"] for r in falco if r["resource"] == "clusterroles"
            and r["name"] == "some-reader"]
    assert [e["id"] for e in _history(api, incident, **CLUSTERROLE)["events"]] == mine


@pytest.mark.django_db(transaction=True)
def test_the_history_page_lists_the_object_and_shows_a_diff(open_page, owner, incident, falco,
                                                           fixtures_dir):
    mine = [r for r in falco if r["resource"] == "clusterroles" and r["name"] == "some-reader"
            and not r["namespace"]]
    raw = _falco_bodies(fixtures_dir)
    versions = [r for r in mine if _holds_object(raw[r["audit_id"]])]
    page = open_page(owner, f"/incidents/{incident.pk}/history/?event={mine[0]['id']}")
    page.wait_for_selector("#history-table tbody tr[data-event]")
    rows = page.eval_on_selector_all("#history-table tbody tr[data-event]",
                                     "rows => rows.map(r => Number(r.dataset.event))")
    assert rows == [r["id"] for r in mine]
    assert page.text_content("#history-object") == "clusterroles/some-reader"
    # every version but the first diffs with the one before it
    buttons = page.locator("#history-table button.diff-previous")
    assert buttons.count() == len(versions) - 1
    last = versions[-1]
    page.click(f'#history-table tr[data-event="{last["id"]}"] button.diff-previous')
    page.wait_for_function(f"!document.getElementById('detail').hidden && document"
                           f".getElementById('detail-title').textContent === 'Event {last['id']}'")
    page.wait_for_function("document.querySelectorAll('#diff-table tbody tr').length > 0 && "
                           "!/loading/.test(document.getElementById('diff-folded').textContent)")
    before = raw[versions[-2]["audit_id"]]["responseObject"]
    after = raw[last["audit_id"]]["responseObject"]
    changed = {path for path in page.eval_on_selector_all(
        "#diff-table tbody tr td:first-child code", "cells => cells.map(c => c.textContent)")}
    assert changed  # the roles' rules differ between these two creates
    assert all(path.split(".")[0] in before or path.split(".")[0] in after for path in changed)
    assert ("rules" in changed or any(p.startswith("rules.") for p in changed)) == (
        before.get("rules") != after.get("rules"))
    assert f"event {versions[-2]['id']}" in page.text_content("#diff-title")
    # back to the timeline, at this object and event
    link = page.get_attribute(f'#history-table tr[data-event="{last["id"]}"] a.timeline-link',
                              "href")
    assert link.startswith(f"/incidents/{incident.pk}/?") and f"event={last['id']}" in link
    assert page.get_attribute("#link-history", "href").endswith(f"?event={last['id']}")


def test_a_long_history_is_cut_and_says_so(incident, falco):
    from timelines.analysis.history import ObjectKey, object_history

    mine = [r["id"] for r in falco if r["resource"] == "clusterroles"
            and r["name"] == "some-reader"]
    events = Event.objects.filter(incident=incident)
    key = ObjectKey("clusterroles", "", "some-reader")
    cut = object_history(events, key, limit=len(mine) - 1)
    assert [e["id"] for e in cut["events"]] == mine[:-1] and cut["truncated"]
    whole = object_history(events, key, limit=len(mine))
    assert [e["id"] for e in whole["events"]] == mine and not whole["truncated"]


@pytest.mark.django_db(transaction=True)
def test_the_incident_pages_event_details_open_the_object_history(open_page, owner, incident,
                                                                   falco):
    from hindsight.testing import wait_for_detail

    mine = [r for r in falco if r["resource"] == "clusterroles" and r["name"] == "some-reader"]
    event = mine[1]["id"]
    page = open_page(owner, f"/incidents/{incident.pk}/?event={event}")
    wait_for_detail(page, event)
    page.click("#link-history")
    page.wait_for_selector("#history-table tbody tr[data-event]")
    assert page.url.endswith(f"/incidents/{incident.pk}/history/?event={event}")
    assert page.eval_on_selector_all("#history-table tbody tr[data-event]",
                                     "rows => rows.map(r => Number(r.dataset.event))") == [
        r["id"] for r in mine]
    # and back: the timeline link of a row selects that event on the incident page
    page.click(f'#history-table tr[data-event="{mine[0]["id"]}"] a.timeline-link')
    wait_for_detail(page, mine[0]["id"])


def test_a_pods_history_holds_its_state_and_its_own_log_lines(api, incident, fixtures_dir):
    """A bundle's pod: its history lists its object state (the snapshot a version) and every
    line its containers wrote, beside its Events, each once and in time order."""
    from io import StringIO

    from django.core.management import call_command

    from incidents.models import Incident

    call_command("ingest", str(fixtures_dir / "bundles" / "sonobuoy-results-0.10.tar.gz"),
                 incident="sonobuoy", stdout=StringIO(), stderr=StringIO())
    Incident.objects.filter(title="sonobuoy").update(team=incident.team)  # the reader's team
    incident = Incident.objects.get(title="sonobuoy")
    pod = {"resource": "pods", "namespace": "heptio-sonobuoy", "name": "sonobuoy"}
    rows = Event.objects.filter(incident=incident, **pod)
    by_kind = {kind: set(rows.filter(kind=kind).values_list("id", flat=True))
               for kind in ("event", "state", "log")}
    assert all(by_kind.values()), {k: len(v) for k, v in by_kind.items()}
    body = _history(api, incident, **pod)
    listed = [e["id"] for e in body["events"]]
    assert len(listed) == len(set(listed))
    for kind, ids in by_kind.items():
        assert {e["id"] for e in body["events"] if e["kind"] == kind} == ids, kind
    assert [e["received"] for e in body["events"]] == sorted(e["received"]
                                                             for e in body["events"])
    snapshots = set(rows.filter(kind="state", reason="Snapshot").values_list("id", flat=True))
    assert snapshots and {e["id"] for e in body["events"] if e["version"]} >= snapshots
    assert body["versions"] >= len(snapshots)
