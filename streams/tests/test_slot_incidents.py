"""A stream's slot incidents are no one's incidents: no list shows them (superusers' neither),
no incident page or API reaches them, and deleting one answers 409 naming its stream (it goes
with its stream only), where it used to answer 500 on the protected row."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from incidents.models import Incident, Membership
from streams.models import Segment
from timelines.ingest import delete_incident
from timelines.ingest.purge import SlotIncident

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def slots(stream_of):
    stream, _ = stream_of(name="prod-audit")
    return stream, list(Segment.objects.filter(stream=stream).select_related("incident"))


def test_lists_never_show_slot_incidents(slots, incident, superuser, owner):
    stream, segments = slots
    slot_ids = {s.incident_id for s in segments}
    for user in (superuser, owner):
        client = logged_in(user)
        listed = client.get("/api/v1/incidents/?limit=1000").json()
        rows = listed["results"] if isinstance(listed, dict) else listed
        ids = {row["id"] for row in rows}
        assert incident.pk in ids
        assert not ids & slot_ids
        page = client.get("/").content.decode()
        assert incident.title in page
        for segment in segments:
            assert segment.incident.title not in page


def test_slot_incident_is_not_reachable_as_an_incident(slots, superuser):
    _, segments = slots
    client = logged_in(superuser)
    pk = segments[0].incident_id
    assert client.get(f"/incidents/{pk}/").status_code == 404
    assert client.get(f"/api/v1/incidents/{pk}/").status_code == 404
    answer = client.patch(f"/api/v1/incidents/{pk}/", {"title": "mine now"},
                          content_type="application/json")
    assert answer.status_code == 404
    assert Incident.objects.get(pk=pk).title == segments[0].incident.title


def test_deleting_a_slot_incident_answers_409_naming_the_stream(slots, superuser, team, outsider):
    stream, segments = slots
    admin = Membership.objects.create(
        team=team, role=Membership.Role.ADMIN,
        user=type(superuser).objects.create_user("lead", password="pw-lead")).user
    for user in (superuser, admin):
        for segment in segments:
            answer = logged_in(user).delete(f"/api/v1/incidents/{segment.incident_id}/")
            assert answer.status_code == 409, answer.content
            detail = answer.json()["detail"]
            assert stream.name in detail and f"slot {segment.slot}" in detail
    # who cannot see the stream learns nothing of it
    assert logged_in(outsider).delete(
        f"/api/v1/incidents/{segments[0].incident_id}/").status_code == 404
    with pytest.raises(SlotIncident, match=stream.name):
        delete_incident(segments[0].incident)
    assert Segment.objects.filter(stream=stream).count() == len(segments) == stream.slots
    held = Incident.objects.filter(pk__in=[s.incident_id for s in segments])
    assert held.count() == len(segments)


def test_admin_neither_lists_nor_deletes_slot_incidents(slots, incident, superuser):
    stream, segments = slots
    client = logged_in(superuser)
    page = client.get("/admin/incidents/incident/").content.decode()
    assert incident.title in page
    assert segments[0].incident.title not in page
    pk = segments[0].incident_id
    answer = client.post(f"/admin/incidents/incident/{pk}/delete/", {"post": "yes"})
    assert answer.status_code == 409
    assert stream.name in answer.content.decode()
    assert Incident.objects.filter(pk=pk).exists()


def test_ingest_command_refuses_a_slot_incident(slots, demo_log):
    stream, segments = slots
    with pytest.raises(CommandError, match=stream.name):
        call_command("ingest", str(demo_log), "--incident-id", str(segments[0].incident_id))
    assert Segment.objects.get(pk=segments[0].pk).events == 0


def test_build_columns_skips_slot_incidents(slots, incident):
    _, segments = slots
    out = StringIO()
    call_command("build_columns", stdout=out)
    said = out.getvalue()
    assert f"incident {incident.pk}:" in said
    for segment in segments:
        assert f"incident {segment.incident_id}:" not in said
