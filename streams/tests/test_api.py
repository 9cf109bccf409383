"""Streams through the API: the contract, who sees what, the events list, cutting an incident,
and making a stream by command with a kubeconfig that works."""

from __future__ import annotations

import io

import orjson
import pytest
import yaml
from django.core.management import call_command

from streams import store
from streams.models import Stream
from timelines.models import Event

from .helpers import event_list, expected_rows, fixture_events

pytestmark = pytest.mark.django_db

STREAM_FIELDS = {"id", "name", "team", "retention_hours", "retention_gb", "events", "oldest",
                 "newest", "kubeconfig_url"}


@pytest.fixture
def fed(stream_of, post_batch, demo_log):
    """A stream holding the demo log's events."""
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(fixture_events(demo_log)), token).status_code == 200
    return stream


def test_a_stream_answers_with_the_contract_to_its_team_only(fed, api_as, owner, teammate,
                                                             outsider, demo_log):
    rows = expected_rows(demo_log)
    answer = api_as(teammate).get("/api/v1/streams/")
    assert answer.status_code == 200
    listed = answer.json()
    items = listed["results"] if isinstance(listed, dict) else listed
    assert [item["id"] for item in items] == [fed.pk]
    one = api_as(teammate).get(f"/api/v1/streams/{fed.pk}/").json()
    assert set(one) == STREAM_FIELDS
    assert one["events"] == len(rows)
    assert one["team"] == "platform"
    assert one["oldest"].replace("Z", "+00:00") == min(r.received for r in rows).isoformat()
    assert one["newest"].replace("Z", "+00:00") == max(r.received for r in rows).isoformat()
    assert one["kubeconfig_url"].endswith(f"/api/v1/streams/{fed.pk}/kubeconfig/")
    assert api_as(outsider).get(f"/api/v1/streams/{fed.pk}/").status_code == 404
    assert api_as(outsider).get(f"/api/v1/streams/{fed.pk}/events/").status_code == 404
    assert api_as().get("/api/v1/streams/").status_code == 401


def test_the_events_list_takes_every_events_filter(fed, api_as, teammate, demo_log):
    rows = expected_rows(demo_log)
    client = api_as(teammate)
    everything = client.get(f"/api/v1/streams/{fed.pk}/events/", {"page_size": 1000}).json()
    assert len(everything["results"]) == len(rows)
    assert [e["received"] for e in everything["results"]] == sorted(
        e["received"] for e in everything["results"])
    verb = rows[0].verb
    user = rows[0].impersonated_user or rows[0].username
    answer = client.get(f"/api/v1/streams/{fed.pk}/events/",
                        {"verb": verb, "page_size": 1000}).json()
    assert len(answer["results"]) == sum(r.verb == verb for r in rows)
    answer = client.get(f"/api/v1/streams/{fed.pk}/events/",
                        {"impersonated_user": user, "code": 403, "page_size": 1000}).json()
    assert len(answer["results"]) == sum(r.impersonated_user == user and r.code == 403
                                         for r in rows)
    assert client.get(f"/api/v1/streams/{fed.pk}/events/",
                      {"since": "not a time"}).status_code == 400
    # Every filter of the incident events list is taken (none answers an error).
    from timelines.reads.filters import EventFilterSet

    odd = {"id": "1", "code": "403", "since": "2017-09-11T20:00:00Z",
           "until": "2017-09-11T20:10:00Z", "related": "pods/default/x"}
    for name in EventFilterSet.base_filters:
        answer = client.get(f"/api/v1/streams/{fed.pk}/events/", {name: odd.get(name, "x")})
        assert answer.status_code == 200, (name, answer.content[:300])


def test_cutting_a_window_makes_an_incident_that_retention_never_touches(
        fed, api_as, owner, teammate, demo_log):
    rows = sorted(expected_rows(demo_log), key=lambda r: r.received)
    since, until = rows[5].received, rows[-5].received
    expected = [r for r in rows if since <= r.received <= until and r.verb != "get"]
    body = {"since": since.isoformat(), "until": until.isoformat(), "title": "nightly e2e 1234",
            "verb": [v for v in {r.verb for r in rows} if v != "get"]}
    assert api_as(teammate).post(f"/api/v1/streams/{fed.pk}/incidents/", body,
                                 format="json").status_code == 403
    answer = api_as(owner).post(f"/api/v1/streams/{fed.pk}/incidents/", body, format="json")
    assert answer.status_code == 201, answer.content
    assert set(answer.json()) == {"id", "url"}
    incident_id = answer.json()["id"]
    assert answer.json()["url"].endswith(f"/incidents/{incident_id}/")
    cut = Event.objects.filter(incident_id=incident_id)
    assert {(e.audit_id, e.received) for e in cut} == {(r.audit_id, r.received)
                                                       for r in expected}
    # Like any incident: its events list and details, for the team.
    listed = api_as(teammate).get(f"/api/v1/incidents/{incident_id}/events/",
                                  {"page_size": 1000}).json()
    assert len(listed["results"]) == len(expected)
    one = cut.first()
    streamed = store.events(fed).get(audit_id=one.audit_id, received=one.received)
    assert one.body() == streamed.body()
    # The stream's slots emptied: the incident keeps everything.
    for segment in fed.segments.all():
        store.empty_segment(segment)
    assert store.events(fed).count() == 0
    assert cut.count() == len(expected)
    assert all(e.body() is not None for e in cut)


def test_cutting_refuses_a_bad_window(fed, api_as, owner):
    answer = api_as(owner).post(f"/api/v1/streams/{fed.pk}/incidents/",
                                {"since": "2017-09-11T20:00:00Z", "until": "2017-09-11T19:00:00Z",
                                 "title": "x"}, format="json")
    assert answer.status_code == 400


def test_an_editor_makes_a_stream_by_api_and_gets_its_kubeconfig(api_as, owner, teammate,
                                                                 team):
    answer = api_as(teammate).post("/api/v1/streams/", {"name": "prod"}, format="json")
    assert answer.status_code == 403
    answer = api_as(owner).post("/api/v1/streams/", {"name": "prod", "retention_hours": 2},
                                format="json")
    assert answer.status_code == 201, answer.content
    made = answer.json()
    assert STREAM_FIELDS <= set(made)
    config = yaml.safe_load(made["kubeconfig"])
    assert config["users"][0]["user"]["token"] == made["token"]
    assert config["clusters"][0]["cluster"]["server"].endswith(
        f"/api/v1/streams/{made['id']}/audit/")
    assert "--audit-webhook-config-file=/etc/kubernetes/hindsight-audit-webhook.yaml" in \
        made["apiserver_flags"]
    assert Stream.objects.get(pk=made["id"]).segments.count() == 3


def test_create_stream_prints_a_kubeconfig_whose_token_posts_into_it(post_batch, demo_log, db):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_stream", "ci", "--team", "platform", "--retention-hours", "2",
                 "--retention-gb", "1.5", stdout=out, stderr=err)
    config = yaml.safe_load(out.getvalue())
    server = config["clusters"][0]["cluster"]["server"]
    token = config["users"][0]["user"]["token"]
    stream = Stream.objects.get(name="ci")
    assert (stream.team.name, stream.retention_hours, stream.retention_gb) == ("platform", 2, 1.5)
    assert server == f"http://127.0.0.1:8000/api/v1/streams/{stream.pk}/audit/"
    assert "--audit-webhook-config-file" in err.getvalue()
    answer = post_batch(stream.pk, event_list(fixture_events(demo_log)), token)
    assert answer.status_code == 200
    assert orjson.loads(answer.content)["events"] == len(expected_rows(demo_log))


def test_the_kubeconfig_url_gives_a_new_token_that_replaces_the_old(stream_of, post_batch,
                                                                   api_as, owner, teammate,
                                                                   demo_log):
    stream, old = stream_of()
    body = event_list(fixture_events(demo_log)[:5])
    shown = api_as(teammate).get(f"/api/v1/streams/{stream.pk}/kubeconfig/").json()
    assert old not in shown["kubeconfig"]  # only its hash is kept
    assert api_as(teammate).post(f"/api/v1/streams/{stream.pk}/kubeconfig/").status_code == 403
    made = api_as(owner).post(f"/api/v1/streams/{stream.pk}/kubeconfig/").json()
    new = yaml.safe_load(made["kubeconfig"])["users"][0]["user"]["token"]
    assert post_batch(stream.pk, body, old).status_code == 401
    assert post_batch(stream.pk, body, new).status_code == 200


def test_an_admin_deletes_a_stream_with_its_events_and_cut_incidents_stay(
        fed, api_as, owner, team, demo_log):
    from django.db import connection

    from incidents.models import Incident, Membership
    from streams.models import Segment

    rows = expected_rows(demo_log)
    cut = api_as(owner).post(f"/api/v1/streams/{fed.pk}/incidents/", {
        "since": min(r.received for r in rows).isoformat(),
        "until": max(r.received for r in rows).isoformat(), "title": "kept"}, format="json")
    assert cut.status_code == 201
    slots = list(fed.segments.values_list("incident_id", flat=True))
    assert api_as(owner).delete(f"/api/v1/streams/{fed.pk}/").status_code == 403  # an editor
    Membership.objects.filter(user=owner, team=team).update(role="admin")
    assert api_as(owner).delete(f"/api/v1/streams/{fed.pk}/").status_code == 204
    assert not Stream.objects.filter(pk=fed.pk).exists()
    assert not Segment.objects.filter(incident_id__in=slots).exists()
    assert not Incident.objects.filter(pk__in=slots).exists()
    assert not Event.objects.filter(incident_id__in=slots).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [store.stream_table(fed.pk)])
        assert cursor.fetchone()[0] is None
    assert Event.objects.filter(incident_id=cut.json()["id"]).count() == len(rows)
