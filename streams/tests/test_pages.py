"""The streams pages: making a stream shows its kubeconfig once; the live view is the team's;
a window cut there becomes an incident."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from streams import store
from streams.models import Stream
from timelines.models import Event

from .helpers import event_list, expected_rows, fixture_events

pytestmark = pytest.mark.django_db


def test_an_editor_makes_a_stream_on_the_page_and_sees_its_kubeconfig(client, owner, team):
    client.force_login(owner)
    page = client.post("/streams/", {"name": "nightly", "team": team.pk, "retention_hours": 2})
    assert page.status_code == 200
    stream = Stream.objects.get(name="nightly")
    text = page.content.decode()
    config = yaml.safe_load(text.split('<pre id="kubeconfig">')[1].split("</pre>")[0]
                            .replace("&quot;", '"'))
    assert config["clusters"][0]["cluster"]["server"].endswith(
        f"/api/v1/streams/{stream.pk}/audit/")
    assert "--audit-webhook-config-file" in text
    assert "nightly" in client.get("/streams/").content.decode()


def test_a_superuser_makes_a_stream_for_any_team_on_the_page_as_in_the_api(
        client, superuser, teammate, team):
    client.force_login(teammate)  # a viewer: the team is not offered, and refused
    assert client.post("/streams/", {"name": "nope", "team": team.pk}).status_code == 403
    for chosen in ("platform", "", "9" * 30):  # not a team's id: refused alike, never a 500
        assert client.post("/streams/", {"name": "nope", "team": chosen}).status_code == 403
    client.force_login(superuser)  # in no team, yet superusers do everything
    assert f'value="{team.pk}"' in client.get("/streams/").content.decode()

    page = client.post("/streams/", {"name": "nightly", "team": team.pk, "retention_hours": 2})

    assert page.status_code == 200
    assert Stream.objects.get(name="nightly").team == team
    assert Stream.objects.filter(name="nope").exists() is False


def test_the_live_view_is_the_teams_and_cuts_a_window_into_an_incident(
        client, owner, outsider, stream_of, post_batch, demo_log):
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(fixture_events(demo_log)), token).status_code == 200
    client.force_login(outsider)
    assert client.get(f"/streams/{stream.pk}/").status_code == 404
    client.force_login(owner)
    page = client.get(f"/streams/{stream.pk}/")
    assert page.status_code == 200
    assert f"/api/v1/streams/{stream.pk}/events/" in page.content.decode()
    rows = sorted(expected_rows(demo_log), key=lambda r: r.received)
    since, until = rows[0].received, rows[9].received
    answer = client.post(f"/streams/{stream.pk}/cut/", {
        "title": "from the page", "since": since.isoformat(), "until": until.isoformat()})
    assert answer.status_code == 302
    incident_id = int(answer["Location"].rstrip("/").rsplit("/", 1)[1])
    assert Event.objects.filter(incident_id=incident_id).count() == sum(
        since <= r.received <= until for r in rows)
    assert store.events(stream).count() == len(rows)


def test_the_live_views_timeline_draws_the_minutes_before_the_newest_event(
        stream_of, post_batch, api_as, teammate, outsider, demo_log):
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(fixture_events(demo_log)), token).status_code == 200
    rows = expected_rows(demo_log)
    newest = max(r.received for r in rows)
    assert api_as(outsider).get(f"/api/v1/streams/{stream.pk}/figure/").status_code == 404
    for minutes in (1, 60):
        figure = api_as(teammate).get(f"/api/v1/streams/{stream.pk}/figure/",
                                      {"minutes": minutes}).json()
        expected = sum(r.received >= newest - timedelta(minutes=minutes) for r in rows)
        assert figure["meta"] == {**figure["meta"], "mode": "gantt", "spans": expected}
    verb = rows[0].verb
    figure = api_as(teammate).get(f"/api/v1/streams/{stream.pk}/figure/",
                                  {"minutes": 60, "verb": verb}).json()
    assert figure["meta"]["spans"] == sum(r.verb == verb for r in rows)
