"""Root-cause sequences: ``/api/v1/incidents/{id}/sequences/``, ``/api/v1/sequences/{id}/`` with
its step routes and exports, and the pure formatting in ``incidents.notes``. Expected times and
deltas come from the fixture files, read here with ``json`` and ``datetime``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from incidents import notes
from incidents.models import Incident
from incidents.notes import Annotation, Sequence, SequenceStep
from incidents.notes import describe_event as describe
from timelines.models import Event

OPENSHIFT_LOG = "audit/openshift-requestresponse.log"


def received_times(path) -> dict[str, datetime]:
    """auditID → received, from the raw file."""
    times = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            event = json.loads(line)
            text = event.get("requestReceivedTimestamp") or event["timestamp"]
            times[event["auditID"]] = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return times


def ms(delta: timedelta) -> float:  # as the API counts: float ms, microsecond precision
    return delta / timedelta(milliseconds=1)


@pytest.fixture
def demo(incident, ingest_file, demo_log):
    """The incident with the demo log ingested: ``(incident, events in file order, times)``."""
    ingest_file(incident, demo_log)
    times = received_times(demo_log)
    events = {e.audit_id: e for e in Event.objects.filter(incident=incident)}
    assert len(events) == 37
    return incident, [events[audit_id] for audit_id in times], times


@pytest.fixture
def foreign_event(team, owner, ingest_file, fixtures_dir):
    """An event of another incident of the same team."""
    other = Incident.objects.create(title="other", team=team, created_by=owner)
    ingest_file(other, fixtures_dir / OPENSHIFT_LOG)
    return Event.objects.filter(incident=other).first()


def create(client, incident, title, *steps):
    return client.post(f"/api/v1/incidents/{incident.pk}/sequences/",
                       {"title": title, "steps": list(steps)}, format="json")


@pytest.fixture
def sequence(demo, owner, api_as):
    """A three-step sequence on demo events 0, 2, 1 (the last one earlier than its previous)."""
    incident, events, _ = demo
    response = create(api_as(owner), incident, "bob gets access",
                      {"event": events[0].pk, "note": "bob cannot list pods"},
                      {"event": events[2].pk, "note": "after the binding"},
                      {"event": events[1].pk})
    assert response.status_code == 201, response.content
    return Sequence.objects.get(pk=response.json()["id"])


# --- pure formatting, no database --------------------------------------------------------------

@pytest.mark.parametrize(("value", "text"), [
    (7.0, "+7 ms"), (0.25, "+0.25 ms"), (1.744, "+1.744 ms"), (-3.0, "\u22123 ms"),
    (0.0, "+0 ms"), (1500.0, "+1.5 s"), (44_000.0, "+44 s"), (123_000.0, "+2 min 3 s"),
    (120_000.0, "+2 min"), (3_900_000.0, "+1 h 5 min"), (-183_000.0, "\u22123 min 3 s"),
    (999.9996, "+1 s"), (59_999.9996, "+1 min"), (93_784_000.0, "+1 d 2 h 3 min 4 s"),
])
def test_format_delta_reads_like_a_person_would_say_it(value, text):
    assert notes.format_delta(value) == text


def audit(**fields):
    base = dict(kind="audit", verb="", username="", impersonated_user="", resource="",
                subresource="", namespace="", name="", code=None, request_uri="", reason="",
                message="", severity="", component="", node="")
    return SimpleNamespace(**{**base, **fields})


def test_describe_event_says_who_did_what_to_which_object_and_the_outcome():
    delete = audit(verb="delete", username="system:admin", resource="pods", namespace="default",
                   name="web-0", code=200)
    assert describe(delete) == "system:admin DELETEs pods default/web-0 → 200"
    patch = audit(verb="patch", username="kopf", impersonated_user="bob", resource="deployments",
                  subresource="scale", namespace="ns", name="api", code=409)
    assert describe(patch) == "kopf as bob PATCHes deployments/scale ns/api → 409"
    assert describe(audit(verb="get", username="u", request_uri="/healthz")) == (
        "u GETs /healthz → (no response)")
    backoff = audit(kind="event", severity="Warning", reason="BackOff", resource="pods",
                    namespace="default", name="web-0", message="Back-off\n restarting")
    assert describe(backoff) == "Warning BackOff pods default/web-0: Back-off restarting"
    log = audit(kind="log", component="kubelet", message="x" * 300)
    assert describe(log) == "kubelet: " + "x" * 190 + "…"


def test_sequence_markdown_numbers_steps_with_the_first_time_and_later_deltas():
    start = datetime(2021, 7, 14, 6, 27, 0, 123456, tzinfo=UTC)
    steps = [
        {"at": start, "delta_ms": None, "description": "test-runner DELETEs statefulsets ns/data",
         "note": "the test starts cleanup"},
        {"at": start, "delta_ms": 7.0,
         "description": "system:admin DELETEs persistentvolumeclaims ns/data-0 → 200",
         "note": "the test deletes the PVCs\nbefore the pods are gone\n\n- see *this*"},
        {"at": start, "delta_ms": -3.0, "description": "kubelet: <script> *x*", "note": ""},
    ]
    assert notes.sequence_markdown("PVC lost", steps) == (
        "# PVC lost\n\n"
        "1. At 2021-07-14T06:27:00.123456Z: test-runner DELETEs statefulsets ns/data"
        " — the test starts cleanup\n"
        "2. 7 ms later: system:admin DELETEs persistentvolumeclaims ns/data-0 → 200"
        " — the test deletes the PVCs\n"
        "   before the pods are gone\n"
        "\n"
        "   - see *this*\n"
        "3. 3 ms earlier: kubelet: \\<script\\> \\*x\\*\n")


# --- creating and reading ----------------------------------------------------------------------

@pytest.mark.django_db
def test_created_sequence_has_steps_with_descriptions_and_deltas_from_the_evidence(
        sequence, demo, owner, api_as):
    incident, events, times = demo
    body = api_as(owner).get(f"/api/v1/sequences/{sequence.pk}/").json()

    assert body["title"] == "bob gets access"
    assert body["incident"] == incident.pk
    assert body["author"] == "owner"
    ids = list(times)
    t0, t2, t1 = times[ids[0]], times[ids[2]], times[ids[1]]
    steps = body["steps"]
    assert [s["position"] for s in steps] == [1, 2, 3]
    assert [s["event"] for s in steps] == [events[0].pk, events[2].pk, events[1].pk]
    assert [s["annotation"] for s in steps] == [None, None, None]
    assert [datetime.fromisoformat(s["at"]) for s in steps] == [t0, t2, t1]
    assert [s["delta_ms"] for s in steps] == [None, ms(t2 - t0), ms(t1 - t2)]
    assert [s["offset_ms"] for s in steps] == [0.0, ms(t2 - t0), ms(t1 - t0)]
    assert [s["delta"] for s in steps] == ["", "+3 min 32 s", "\u22123 min 3 s"]
    assert steps[0]["description"] == "system:admin as bob LISTs pods default → 403"
    assert steps[1]["description"] == "system:admin as bob LISTs pods default → 200"
    assert [s["note"] for s in steps] == ["bob cannot list pods", "after the binding", ""]


@pytest.mark.django_db
def test_deltas_keep_the_microseconds_of_the_evidence(incident, owner, api_as, ingest_file,
                                                      fixtures_dir):
    path = fixtures_dir / OPENSHIFT_LOG
    ingest_file(incident, path)
    times = received_times(path)
    by_audit = {e.audit_id: e for e in Event.objects.filter(incident=incident)}
    first, second, third = list(times)[:3]
    response = create(api_as(owner), incident, "olm", *[{"event": by_audit[a].pk}
                                                     for a in (second, first, third)])

    steps = response.json()["steps"]
    expected = ms(times[first] - times[second])
    assert expected == 1.744  # 13:30:25.754378 → .756122, from the file
    assert steps[1]["delta_ms"] == expected
    assert steps[1]["delta"] == "+1.744 ms"
    assert steps[2]["offset_ms"] == ms(times[third] - times[second])
    assert steps[2]["description"] == (
        "system:serviceaccount:openshift-operator-lifecycle-manager:olm-operator-serviceaccount"
        " UPDATEs catalogsources/status openshift-marketplace/certified-operators → 200")


@pytest.mark.django_db
def test_a_step_on_an_annotation_takes_its_time_and_follows_its_changes(demo, owner, api_as):
    incident, events, times = demo
    client = api_as(owner)
    start = times[list(times)[3]] + timedelta(milliseconds=250)
    annotation = client.post(f"/api/v1/incidents/{incident.pk}/annotations/",
                             {"start": start.isoformat(), "note": "## the *binding* lands"},
                             format="json").json()
    on_event = client.post(f"/api/v1/incidents/{incident.pk}/annotations/",
                           {"event": events[2].pk}, format="json").json()
    response = create(client, incident, "with notes", {"event": events[0].pk},
                      {"annotation": annotation["id"]}, {"annotation": on_event["id"]})

    steps = response.json()["steps"]
    assert steps[1]["annotation"] == annotation["id"]
    assert steps[1]["event"] is None
    assert datetime.fromisoformat(steps[1]["at"]) == start
    assert steps[1]["delta_ms"] == ms(start - times[list(times)[0]])
    assert steps[1]["description"] == "annotation: the *binding* lands (" + (
        start.strftime("%Y-%m-%dT%H:%M:%S.250000Z") + ")")
    assert steps[2]["event"] == events[2].pk  # an annotation on an event brings the event
    assert steps[2]["description"] == "system:admin as bob LISTs pods default → 200"

    later = start + timedelta(seconds=2)
    client.patch(f"/api/v1/annotations/{annotation['id']}/", {"start": later.isoformat()},
                 format="json")
    moved = client.get(f"/api/v1/sequences/{response.json()['id']}/").json()["steps"][1]
    assert datetime.fromisoformat(moved["at"]) == later

    client.patch(f"/api/v1/annotations/{on_event['id']}/", {"event": events[3].pk},
                 format="json")
    repointed = client.get(f"/api/v1/sequences/{response.json()['id']}/").json()["steps"][2]
    assert repointed["event"] == events[3].pk
    assert datetime.fromisoformat(repointed["at"]) == times[list(times)[3]]


@pytest.mark.django_db
def test_an_incident_lists_several_sequences_in_as_many_queries_as_one(demo, owner, api_as):
    incident, events, _ = demo
    client = api_as(owner)
    url = f"/api/v1/incidents/{incident.pk}/sequences/"
    marks = [Annotation.objects.create(incident=incident, start=events[n].received, note="n")
             for n in range(4)]
    create(client, incident, "one", {"event": events[0].pk}, {"annotation": marks[0].pk})
    client.get(url)  # token last-used write happens once a minute; keep it out of the count
    with CaptureQueriesContext(connection) as one:
        assert len(client.get(url).json()["results"]) == 1
    for n in range(3):
        create(client, incident, f"more {n}", {"event": events[n + 2].pk},
               {"annotation": marks[n + 1].pk}, {"event": events[n + 9].pk})
    with CaptureQueriesContext(connection) as four:
        listed = client.get(url).json()["results"]
    assert len(four) == len(one)
    assert [s["title"] for s in listed] == ["one", "more 0", "more 1", "more 2"]
    assert [len(s["steps"]) for s in listed] == [2, 3, 3, 3]
    assert listed[3]["steps"][2]["event"] == events[11].pk


# --- validation --------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_step_on_another_incidents_event_or_annotation_is_refused_naming_it(
        demo, team, owner, api_as, foreign_event):
    incident, events, _ = demo
    other = Incident.objects.create(title="other", team=team)
    foreign = Annotation.objects.create(incident=other, start=events[0].received)
    response = create(api_as(owner), incident, "bad", {"event": events[0].pk},
                      {"event": foreign_event.pk}, {"event": 10**12}, {"annotation": foreign.pk})

    assert response.status_code == 400
    assert response.json()["steps"] == {
        "1": {"event": [f"Event {foreign_event.pk} is not in this incident."]},
        "2": {"event": [f"Event {10**12} is not in this incident."]},
        "3": {"annotation": [f"Annotation {foreign.pk} is not in this incident."]}}
    assert not Sequence.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("title", "step", "error"), [
    ("t", {}, "exactly one"), ("t", {"note": "x"}, "exactly one"),
    ("t", {"event": 1, "annotation": 1}, "exactly one"), ("", {"event": 1}, "title")])
def test_a_sequence_needs_a_title_and_steps_on_one_thing(demo, owner, api_as, title, step, error):
    incident, _, _ = demo
    response = create(api_as(owner), incident, title, step)
    assert response.status_code == 400
    assert error in str(response.json())
    assert not Sequence.objects.exists()


# --- changing steps ----------------------------------------------------------------------------

def step_ids(client, sequence) -> list[int]:
    return [s["id"] for s in client.get(f"/api/v1/sequences/{sequence.pk}/").json()["steps"]]


@pytest.mark.django_db
def test_inserting_a_step_at_a_position_or_the_end(sequence, demo, owner, api_as):
    _, events, times = demo
    client = api_as(owner)
    before = step_ids(client, sequence)
    response = client.post(f"/api/v1/sequences/{sequence.pk}/steps/",
                           {"event": events[3].pk, "note": "ns1 too", "position": 2},
                           format="json")

    assert response.status_code == 201, response.content
    steps = response.json()["steps"]
    assert [s["position"] for s in steps] == [1, 2, 3, 4]
    assert [s["id"] for s in steps][:1] + [s["id"] for s in steps][2:] == before
    assert steps[1]["event"] == events[3].pk
    assert steps[1]["note"] == "ns1 too"
    ids = list(times)
    assert steps[1]["delta_ms"] == ms(times[ids[3]] - times[ids[0]])
    assert steps[2]["delta_ms"] == ms(times[ids[2]] - times[ids[3]])
    assert list(SequenceStep.objects.filter(sequence=sequence).values_list(
        "position", flat=True)) == [0, 1, 2, 3]
    appended = client.post(f"/api/v1/sequences/{sequence.pk}/steps/", {"event": events[8].pk},
                           format="json")  # no position: at the end
    assert [s["event"] for s in appended.json()["steps"]][-1] == events[8].pk


@pytest.mark.django_db
def test_inserting_beyond_the_end_or_from_another_incident_is_refused(
        sequence, demo, owner, api_as, foreign_event):
    _, events, _ = demo
    client = api_as(owner)
    url = f"/api/v1/sequences/{sequence.pk}/steps/"
    beyond = client.post(url, {"event": events[8].pk, "position": 5}, format="json")
    foreign = client.post(url, {"event": foreign_event.pk}, format="json")

    assert beyond.status_code == 400
    assert beyond.json() == {"position": ["Between 1 and 4."]}
    assert foreign.status_code == 400
    assert foreign.json() == {"event": [f"Event {foreign_event.pk} is not in this incident."]}
    assert sequence.steps.count() == 3


@pytest.mark.django_db
def test_removing_a_step_renumbers_and_recomputes_deltas(sequence, demo, owner, api_as):
    incident, events, times = demo
    client = api_as(owner)
    first, second, third = step_ids(client, sequence)
    foreign = create(client, incident, "other", {"event": events[4].pk}).json()["steps"][0]["id"]
    assert client.delete(f"/api/v1/sequences/{sequence.pk}/steps/{foreign}/").status_code == 404
    assert SequenceStep.objects.filter(pk=foreign).exists()
    response = client.delete(f"/api/v1/sequences/{sequence.pk}/steps/{second}/")

    assert response.status_code == 200
    steps = response.json()["steps"]
    assert [(s["id"], s["position"]) for s in steps] == [(first, 1), (third, 2)]
    ids = list(times)
    assert steps[1]["delta_ms"] == ms(times[ids[1]] - times[ids[0]])
    assert not SequenceStep.objects.filter(pk=second).exists()


@pytest.mark.django_db
def test_reorder_puts_the_steps_in_the_given_order(sequence, owner, api_as):
    client = api_as(owner)
    first, second, third = step_ids(client, sequence)
    response = client.post(f"/api/v1/sequences/{sequence.pk}/reorder/",
                           {"order": [third, first, second]}, format="json")

    assert response.status_code == 200
    assert [(s["id"], s["position"]) for s in response.json()["steps"]] == [
        (third, 1), (first, 2), (second, 3)]
    assert response.json()["steps"][0]["delta_ms"] is None
    assert step_ids(client, sequence) == [third, first, second]


@pytest.mark.django_db
@pytest.mark.parametrize("order", ["missing", "twice", "foreign", "not a list"])
def test_reorder_refuses_anything_but_each_step_once(sequence, owner, api_as, order):
    client = api_as(owner)
    first, second, third = step_ids(client, sequence)
    body = {"missing": [third, first], "twice": [first, first, second, third],
            "foreign": [first, second, third + 1000], "not a list": "1,2,3"}[order]
    response = client.post(f"/api/v1/sequences/{sequence.pk}/reorder/", {"order": body},
                           format="json")
    assert response.status_code == 400
    assert "order" in response.json()
    assert step_ids(client, sequence) == [first, second, third]


@pytest.mark.django_db
def test_put_replaces_steps_keeping_given_ids_and_delete_removes_all(sequence, demo, owner, api_as):
    _, events, _ = demo
    client = api_as(owner)
    first, second, third = step_ids(client, sequence)
    response = client.put(f"/api/v1/sequences/{sequence.pk}/", {
        "title": "renamed",
        "steps": [{"id": third, "note": "now first"}, {"event": events[6].pk, "note": "new"},
                  {"id": first}],
    }, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    steps = body["steps"]
    assert body["title"] == "renamed"
    assert [s["id"] for s in steps][0] == third
    assert [s["id"] for s in steps][2] == first
    assert steps[1]["id"] not in (first, second, third)
    assert [s["note"] for s in steps] == ["now first", "new", "bob cannot list pods"]
    assert not SequenceStep.objects.filter(pk=second).exists()

    assert client.delete(f"/api/v1/sequences/{sequence.pk}/").status_code == 204
    assert not Sequence.objects.filter(pk=sequence.pk).exists()
    assert not SequenceStep.objects.filter(sequence_id=sequence.pk).exists()


@pytest.mark.django_db
def test_put_needs_title_and_own_steps_but_patch_takes_either(sequence, demo, owner, api_as):
    incident, events, _ = demo
    client = api_as(owner)
    url = f"/api/v1/sequences/{sequence.pk}/"
    assert client.put(url, {"title": "only"}, format="json").status_code == 400
    foreign = create(client, incident, "other", {"event": events[4].pk}).json()["steps"][0]["id"]
    refused = client.put(url, {"title": "t", "steps": [{"id": foreign}]}, format="json")
    assert refused.status_code == 400
    assert "id" in refused.json()["steps"]["0"]
    assert len(step_ids(client, sequence)) == 3
    patched = client.patch(url, {"title": "only the title"}, format="json")
    assert patched.status_code == 200
    assert patched.json()["title"] == "only the title"
    assert len(patched.json()["steps"]) == 3
    emptied = client.patch(url, {"steps": []}, format="json")
    assert emptied.json()["steps"] == []
    assert emptied.json()["title"] == "only the title"


# --- exports -----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_export_md_tells_the_sequence_as_a_numbered_list(sequence, owner, api_as):
    response = api_as(owner).get(f"/api/v1/sequences/{sequence.pk}/export.md")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="sequence-{sequence.pk}.md"')
    assert response.content.decode() == (
        "# bob gets access\n\n"
        "1. At 2017-09-11T19:55:05Z: system:admin as bob LISTs pods default → 403"
        " — bob cannot list pods\n"
        "2. 3 min 32 s later: system:admin as bob LISTs pods default → 200"
        " — after the binding\n"
        "3. 3 min 3 s earlier: system:admin as bob LISTs pods default → 403\n")


@pytest.mark.django_db
def test_export_json_is_the_api_representation_as_a_download(sequence, owner, api_as):
    client = api_as(owner)
    response = client.get(f"/api/v1/sequences/{sequence.pk}/export.json")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == (
        f'attachment; filename="sequence-{sequence.pk}.json"')
    assert json.loads(response.content) == client.get(f"/api/v1/sequences/{sequence.pk}/").json()


# --- who may do what ---------------------------------------------------------------------------

READS = [("get", "/api/v1/incidents/{incident}/sequences/"),
         ("get", "/api/v1/sequences/{sequence}/"),
         ("get", "/api/v1/sequences/{sequence}/export.md"),
         ("get", "/api/v1/sequences/{sequence}/export.json")]
WRITES = [("post", "/api/v1/incidents/{incident}/sequences/", {"title": "t", "steps": []}),
          ("patch", "/api/v1/sequences/{sequence}/", {"title": "changed"}),
          ("put", "/api/v1/sequences/{sequence}/", {"title": "changed", "steps": []}),
          ("delete", "/api/v1/sequences/{sequence}/", None),
          ("post", "/api/v1/sequences/{sequence}/steps/", {"event": "{event}"}),
          ("delete", "/api/v1/sequences/{sequence}/steps/{step}/", None),
          ("post", "/api/v1/sequences/{sequence}/reorder/", {"order": []})]


def call(client, method, template, sequence, body=None):
    step = sequence.steps.first()
    names = {"incident": sequence.incident_id, "sequence": sequence.pk, "step": step.pk,
             "event": step.event_id}
    if body and body.get("event") == "{event}":
        body = {"event": step.event_id}
    return getattr(client, method)(template.format(**names), body, format="json")


def unchanged(sequence) -> bool:
    fresh = Sequence.objects.filter(pk=sequence.pk).first()
    return (fresh is not None and fresh.title == sequence.title
            and Sequence.objects.count() == 1 and fresh.steps.count() == 3)


@pytest.mark.django_db
@pytest.mark.parametrize(("persona", "scope", "read", "write"), [
    ("teammate", "full", 200, 403),  # a viewer reads but may not change
    ("outsider", "full", 404, 404), (None, None, 401, 401), ("owner", "upload", 403, 403)])
def test_who_may_read_and_write(request, sequence, api_as, persona, scope, read, write):
    client = api_as(request.getfixturevalue(persona), scope=scope) if persona else api_as(None)
    for (method, url, *body), code in [(r, read) for r in READS] + [(w, write) for w in WRITES]:
        assert call(client, method, url, sequence, *body).status_code == code, (method, url)
    assert unchanged(sequence)


@pytest.mark.django_db
def test_a_superuser_outside_the_team_may_edit(sequence, superuser, api_as):
    response = api_as(superuser).patch(f"/api/v1/sequences/{sequence.pk}/", {"title": "root"},
                                    format="json")
    assert response.status_code == 200
    assert Sequence.objects.get(pk=sequence.pk).title == "root"
