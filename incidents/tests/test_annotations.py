"""Annotations: ``/api/v1/incidents/{id}/annotations/``, ``/api/v1/annotations/{id}/``, and the
safe Markdown rendering of their notes (``incidents.markdown``)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import pytest

from incidents.markdown import render_markdown
from incidents.models import Incident
from incidents.notes import Annotation
from timelines.models import Event


@pytest.fixture
def events(incident, ingest_file, demo_log):
    """The demo log's events in file order (read with ``json``, matched by auditID)."""
    ingest_file(incident, demo_log)
    by_audit = {e.audit_id: e for e in Event.objects.filter(incident=incident)}
    order = [json.loads(line)["auditID"] for line in demo_log.read_text().splitlines()
             if line.strip()]
    return [by_audit[a] for a in order]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def url(incident) -> str:
    return f"/api/v1/incidents/{incident.pk}/annotations/"


def post(client, incident, **body):
    return client.post(url(incident), body, format="json")


T0 = datetime.fromisoformat("2017-09-11T20:00:00+00:00")


def iso(delta_s: float) -> str:
    return (T0 + timedelta(seconds=delta_s)).isoformat()


# --- Markdown, no database ---------------------------------------------------------------------

def test_markdown_renders_commonmark():
    html = render_markdown("**etcd** was slow, see [the graph](https://grafana.example/d/1)\n\n"
                           "- one\n- `two`")
    assert "<strong>etcd</strong>" in html
    assert '<a href="https://grafana.example/d/1" rel="noopener noreferrer">the graph</a>' in html
    assert "<li><code>two</code></li>" in html


TAG = re.compile(r"<([a-z0-9]+)([^>]*)>", re.I)  # opening tags and their attributes


@pytest.mark.parametrize("source", [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "![pic](javascript:alert(1))",
    '[x](https://example.com "a" onmouseover="alert(1)")',
])
def test_markdown_neutralizes_scripts_and_script_links(source):
    html = render_markdown(source)
    tags = TAG.findall(html)
    assert tags  # something was rendered
    for name, attributes in tags:
        assert name.lower() in {"p", "a", "img"}, html
        assert not re.search(r"\son\w+\s*=", attributes, re.I), html
        for target in re.findall(r'(?:href|src)="([^"]*)"', attributes):
            assert target.startswith("https://"), html


def test_markdown_html_is_escaped_not_dropped():
    assert render_markdown("a <b>b</b>") == "<p>a &lt;b&gt;b&lt;/b&gt;</p>\n"


# --- creating ----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_an_annotation_on_an_event_takes_the_events_times(events, incident, owner, api_as):
    event = events[2]
    response = post(api_as(owner), incident, event=event.pk, note="bob *can* list now",
                    tags=[" RBAC ", "rbac", "", "Root-Cause"], starred=True)

    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "incident", "event", "start", "end", "note", "note_html", "label",
                         "tags", "starred", "author", "created_at", "updated_at"}
    assert body["incident"] == incident.pk
    assert body["event"] == event.pk
    assert at(body["start"]) == at("2017-09-11T19:58:37Z")  # the file's timestamp
    assert at(body["end"]) == event.completed
    assert body["note"] == "bob *can* list now"
    assert body["note_html"] == "<p>bob <em>can</em> list now</p>\n"
    assert body["label"] == "bob *can* list now"
    assert body["tags"] == ["rbac", "root-cause"]
    assert body["starred"] is True
    assert body["author"] == "owner"
    stored = Annotation.objects.get(pk=body["id"])
    assert (stored.event_id, stored.author, stored.tags) == (event.pk, owner, ["rbac",
                                                                              "root-cause"])


@pytest.mark.django_db
def test_an_annotation_on_a_time_range(incident, owner, api_as):
    response = post(api_as(owner), incident, start=iso(0), end=iso(90), note="etcd compaction")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (at(body["start"]), at(body["end"])) == (T0, T0 + timedelta(seconds=90))
    assert body["event"] is None
    point = post(api_as(owner), incident, start=iso(5)).json()
    assert point["end"] is None


@pytest.mark.django_db
def test_an_event_of_another_incident_is_refused(events, incident, team, owner, api_as,
                                                 ingest_file, fixtures_dir):
    other = Incident.objects.create(title="other", team=team, created_by=owner)
    ingest_file(other, fixtures_dir / "audit" / "openshift-requestresponse.log")
    foreign = Event.objects.filter(incident=other).first()
    client = api_as(owner)

    for event_id in (foreign.pk, 10**12):
        response = post(client, incident, event=event_id)
        assert response.status_code == 400
        assert response.json() == {"event": [f"Event {event_id} is not in this incident."]}
    assert not Annotation.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "field"), [
    ({"start": iso(10), "end": iso(9)}, "end"),
    ({"note": "nowhere"}, "start"),
    ({"event": "{event}", "start": iso(0)}, "start"),
    ({"start": "yesterday"}, "start"),
    ({"start": iso(0), "tags": [f"t{n}" for n in range(21)]}, "tags"),
    ({"start": iso(0), "tags": ["x" * 51]}, "tags"),
    ({"start": iso(0), "tags": "not-a-list"}, "tags"),
])
def test_invalid_annotations_are_refused(events, incident, owner, api_as, body, field):
    if body.get("event") == "{event}":
        body = {**body, "event": events[0].pk}
    response = post(api_as(owner), incident, **body)
    assert response.status_code == 400
    assert field in response.json()
    assert not Annotation.objects.exists()


@pytest.mark.django_db
def test_twenty_tags_of_fifty_characters_are_fine(incident, owner, api_as):
    tags = [f"{n:02d}" + "x" * 48 for n in range(20)]
    response = post(api_as(owner), incident, start=iso(0), tags=tags + [t.upper() for t in tags])
    assert response.status_code == 201
    assert response.json()["tags"] == tags


@pytest.mark.django_db
def test_a_note_with_a_script_is_stored_as_written_and_rendered_inert(incident, owner, api_as):
    note = "<script>alert(1)</script> [x](javascript:alert(1))"
    body = post(api_as(owner), incident, start=iso(0), note=note).json()
    assert body["note"] == note
    assert "<script" not in body["note_html"]
    assert "href" not in body["note_html"]


# --- reading and filtering ---------------------------------------------------------------------

@pytest.fixture
def several(incident, owner, api_as):
    client = api_as(owner)
    made = [
        post(client, incident, start=iso(0), end=iso(60), tags=["etcd"], note="slow etcd"),
        post(client, incident, start=iso(30), tags=["rbac"], starred=True, note="Forbidden"),
        post(client, incident, start=iso(120), end=iso(180), tags=["etcd", "oom"]),
        post(client, incident, start=iso(300), tags=["dns"], note="DNS flaps"),
    ]
    return [r.json()["id"] for r in made]


def listed(client, incident, query="") -> list[int]:
    response = client.get(url(incident) + query)
    assert response.status_code == 200, response.content
    return [a["id"] for a in response.json()["results"]]


@pytest.mark.django_db
def test_the_list_is_in_time_order_with_what_markers_need(several, incident, teammate, api_as):
    body = api_as(teammate).get(url(incident)).json()
    assert [a["id"] for a in body["results"]] == several
    assert body["next"] is None
    first = body["results"][0]
    assert (at(first["start"]), at(first["end"]), first["label"]) == (
        T0, T0 + timedelta(seconds=60), "slow etcd")


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "expected"), [
    ("?tag=etcd", [0, 2]),
    ("?tag=ETCD&tag=dns", [0, 2, 3]),
    ("?tag=nothing", []),
    ("?starred=true", [1]),
    ("?starred=false", [0, 2, 3]),
    ("?q=etcd", [0]),
    ("?q=forbid", [1]),
    # ranges overlapping the window count: [0, 60] ends after 00:50
    ("?since=2017-09-11T20:00:50Z", [0, 2, 3]),
    ("?until=2017-09-11T20:00:30Z", [0, 1]),
    ("?since=2017-09-11T20:02:30Z&until=2017-09-11T20:04:00Z", [2]),
    ("?tag=etcd&since=2017-09-11T20:01:30Z", [2]),
])
def test_the_list_filters(several, incident, owner, api_as, query, expected):
    assert listed(api_as(owner), incident, query) == [several[i] for i in expected]


@pytest.mark.django_db
def test_the_list_filters_by_event(events, incident, owner, api_as):
    client = api_as(owner)
    on_event = post(client, incident, event=events[4].pk).json()["id"]
    post(client, incident, event=events[5].pk)
    post(client, incident, start=iso(0))
    assert listed(client, incident, f"?event={events[4].pk}") == [on_event]


@pytest.mark.django_db
def test_a_bad_filter_is_400(incident, owner, api_as):
    assert api_as(owner).get(url(incident) + "?since=yesterday").status_code == 400


@pytest.mark.embedded
@pytest.mark.django_db
def test_tags_filter_on_the_embedded_sqlite_default(incident, owner, api_as):
    client = api_as(owner)
    made = [post(client, incident, start=iso(n), tags=tags).json()["id"]
            for n, tags in enumerate([["etcd"], ["etcd-2"], ["dns", "etcd"], []])]
    assert listed(client, incident, "?tag=etcd") == [made[0], made[2]]
    assert listed(client, incident, "?tag=dns&tag=etcd-2") == [made[1], made[2]]


# --- changing ----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_patch_changes_the_note_tags_and_star(incident, owner, api_as):
    client = api_as(owner)
    made = post(client, incident, start=iso(0), note="first").json()
    response = client.patch(f"/api/v1/annotations/{made['id']}/",
                            {"note": "# Root cause", "tags": ["Etcd"], "starred": True},
                            format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["note_html"] == "<h1>Root cause</h1>\n"
    assert body["label"] == "Root cause"
    assert (body["tags"], body["starred"]) == (["etcd"], True)
    assert at(body["updated_at"]) > at(made["updated_at"])
    assert body["created_at"] == made["created_at"]
    assert Annotation.objects.get(pk=made["id"]).note == "# Root cause"


@pytest.mark.django_db
def test_patch_keeps_event_times_unless_the_event_is_dropped(events, incident, owner, api_as):
    client = api_as(owner)
    made = post(client, incident, event=events[0].pk).json()
    detail = f"/api/v1/annotations/{made['id']}/"

    assert client.patch(detail, {"start": iso(0)}, format="json").status_code == 400
    moved = client.patch(detail, {"event": events[3].pk}, format="json").json()
    assert at(moved["start"]) == at("2017-09-11T19:59:03Z")
    freed = client.patch(detail, {"event": None, "end": iso(0)}, format="json")
    assert freed.status_code == 200, freed.content
    assert freed.json()["event"] is None
    assert at(freed.json()["start"]) == at("2017-09-11T19:59:03Z")
    assert at(freed.json()["end"]) == T0
    assert client.patch(detail, {"end": "2017-09-11T19:00:00Z"}, format="json").status_code == 400


@pytest.mark.django_db
def test_put_is_not_offered(incident, owner, api_as):
    made = post(api_as(owner), incident, start=iso(0)).json()
    response = api_as(owner).put(f"/api/v1/annotations/{made['id']}/", {"start": iso(1)},
                              format="json")
    assert response.status_code == 405


@pytest.mark.django_db
def test_delete_removes_it(incident, owner, api_as):
    made = post(api_as(owner), incident, start=iso(0)).json()
    assert api_as(owner).delete(f"/api/v1/annotations/{made['id']}/").status_code == 204
    assert not Annotation.objects.filter(pk=made["id"]).exists()


# --- who may do what ---------------------------------------------------------------------------

@pytest.fixture
def existing(incident, owner):
    return Annotation.objects.create(incident=incident, start=T0, note="kept", author=owner)


def attempts(incident, annotation):
    """(method, url, body) for every route: reads first, then writes."""
    detail = f"/api/v1/annotations/{annotation.pk}/"
    reads = [("get", url(incident), None), ("get", detail, None)]
    writes = [("post", url(incident), {"start": iso(0)}),
              ("patch", detail, {"note": "changed"}),
              ("delete", detail, None)]
    return reads, writes


def untouched(annotation) -> bool:
    return list(Annotation.objects.values_list("pk", "note")) == [(annotation.pk, "kept")]


@pytest.mark.django_db
def test_a_viewer_reads_but_may_not_write(incident, existing, teammate, api_as):
    client = api_as(teammate)
    reads, writes = attempts(incident, existing)
    for method, target, body in reads:
        assert getattr(client, method)(target, body, format="json").status_code == 200
    for method, target, body in writes:
        assert getattr(client, method)(target, body, format="json").status_code == 403, method
    assert untouched(existing)


@pytest.mark.django_db
@pytest.mark.parametrize(("persona", "scope", "code"), [
    ("outsider", "full", 404), (None, None, 401), ("owner", "upload", 403)])
def test_others_get_nothing(request, incident, existing, api_as, persona, scope, code):
    user = request.getfixturevalue(persona) if persona else None
    client = api_as(user, scope=scope) if user else api_as(None)
    reads, writes = attempts(incident, existing)
    for method, target, body in reads + writes:
        response = getattr(client, method)(target, body, format="json")
        assert response.status_code == code, (method, target)
    assert untouched(existing)


@pytest.mark.django_db
def test_the_owner_and_a_superuser_write(incident, existing, owner, superuser, api_as):
    for user in (owner, superuser):
        response = api_as(user).patch(f"/api/v1/annotations/{existing.pk}/",
                                   {"note": f"by {user.username}"}, format="json")
        assert response.status_code == 200
    assert Annotation.objects.get(pk=existing.pk).note == "by root"
    created = post(api_as(superuser), incident, start=iso(0)).json()
    assert created["author"] == "root"
