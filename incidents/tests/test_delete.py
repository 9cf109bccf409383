"""``DELETE /api/v1/incidents/{id}/``: who may, what answers 404 afterwards, and what is gone
once the purge it queues has run (``timelines.ingest.purge``)."""

from __future__ import annotations

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from incidents.models import ApiToken, Incident, Membership, Upload
from incidents.notes import Annotation, Sequence, SequenceStep
from incidents.sharing import IncidentGrant, ShareLink
from timelines.ingest import purge_incident
from timelines.ingest.bundle import work_dir
from timelines.models import BodyChunk, Event, IncidentPurge
from timelines.store import aggregate, columns

pytestmark = pytest.mark.django_db


@pytest.fixture
def team_admin(team):
    """Admin of ``team``: may also rename, move and delete its incidents."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("lead", password="pw-lead")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    return user


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class Case:
    """An incident with a bit of everything: events, a pending upload whose file waits on disk,
    a bundle with a file and its work directory, an annotation, a sequence with a step, a grant,
    a share link (opened in a browser) and a column index."""

    def __init__(self, incident, owner, other_team, ingest_file, demo_log) -> None:
        self.incident = incident
        self.id = incident.pk
        ingest_file(incident, demo_log)
        self.events = list(Event.objects.filter(incident=incident).order_by("received", "id"))
        assert len(self.events) == 37
        posted = logged_in(owner).post("/api/v1/uploads/", {
            "incident_id": incident.pk, "file": SimpleUploadedFile("later.log", b"{}\n")})
        assert posted.status_code == 202, posted.content
        self.pending = Upload.objects.get(pk=posted.json()["id"])
        self.bundle = Upload.objects.create(incident=incident, name="bundle.tar.gz",
                                            format="bundle", status=Upload.Status.RUNNING)
        self.bundle_dir = work_dir(self.bundle)
        self.bundle_dir.mkdir(parents=True)
        (self.bundle_dir / "kubelet.log").write_text("secret-ish\n")
        self.bundle_file = Upload.objects.create(incident=incident, parent=self.bundle,
                                                 name="kubelet.log",
                                                 path=str(self.bundle_dir / "kubelet.log"))
        self.annotation = Annotation.objects.create(incident=incident, event_id=self.events[0].pk,
                                                    start=self.events[0].received, note="here")
        self.sequence = Sequence.objects.create(incident=incident, title="root cause")
        SequenceStep.objects.create(sequence=self.sequence, position=0,
                                    event_id=self.events[1].pk, at=self.events[1].received)
        IncidentGrant.objects.create(incident=incident, team=other_team)
        self.link, key = ShareLink.issue(incident, owner)
        self.link_url = f"/s/{key}/"
        self.holder = Client()
        assert self.holder.get(self.link_url).status_code == 302
        Upload.objects.filter(pk=self.bundle.pk).update(status=Upload.Status.DONE,
                                                        finished_at=self.bundle.created_at)
        self.index = columns.build(incident.pk, aggregate.data_version(incident.pk))
        assert self.index is not None and self.index.exists()

    def urls(self) -> list[str]:
        """Everything of the incident a client may ask for."""
        event = self.events[0].pk
        base = f"/api/v1/incidents/{self.id}/"
        return [base, base + "events/", base + "figure/", base + "events.csv",
                base + "events.json", base + "events/step/", base + "annotations/",
                base + "sequences/", f"/api/v1/events/{event}/",
                f"/api/v1/events/{event}/diff/?against={self.events[1].pk}",
                f"/api/v1/annotations/{self.annotation.pk}/",
                f"/api/v1/sequences/{self.sequence.pk}/", f"/api/v1/uploads/{self.pending.pk}/",
                f"/incidents/{self.id}/"]


@pytest.fixture
def case(incident, owner, other_team, ingest_file, demo_log):
    return Case(incident, owner, other_team, ingest_file, demo_log)


def test_a_team_admin_deletes_an_incident_and_all_of_it_answers_404(case, team_admin,
                                                                     superuser):
    client = logged_in(team_admin)
    before = {url: client.get(url).status_code for url in case.urls()}
    assert set(before.values()) <= {200, 422}, before  # 422: a diff of Metadata-level events
    pending_file = case.pending.path
    assert f'href="/incidents/{case.id}/"' in logged_in(superuser).get("/").content.decode()

    response = client.delete(f"/api/v1/incidents/{case.id}/")

    assert response.status_code == 204
    for who in (client, logged_in(superuser)):
        answers = {url: who.get(url).status_code for url in case.urls()}
        assert set(answers.values()) == {404}, answers
    assert Client().get(case.link_url).status_code == 404
    assert case.holder.get(f"/incidents/{case.id}/").status_code == 404  # the opened link too
    assert not Incident.objects.filter(pk=case.id).exists()
    for model in (Upload, Annotation, Sequence, IncidentGrant, ShareLink):
        assert not model.objects.filter(incident_id=case.id).exists(), model
    assert not SequenceStep.objects.filter(sequence_id=case.sequence.pk).exists()
    assert f'href="/incidents/{case.id}/"' not in logged_in(superuser).get("/").content.decode()

    # The evidence waits for the purge (invisible meanwhile), which the deletion queued.
    assert Event.objects.filter(incident_id=case.id).count() == 37
    purge = IncidentPurge.objects.get(pk=case.id)
    assert purge.files == [pending_file] and sorted(purge.uploads) == sorted(
        [case.events[0].upload_id, case.pending.pk, case.bundle.pk])

    done = purge_incident(case.id)

    assert done["events"] == 37 and done["chunks"] >= 1 and done["files"] == 2
    assert not Event.objects.filter(incident_id=case.id).exists()
    assert not BodyChunk.objects.filter(incident_id=case.id).exists()
    assert not IncidentPurge.objects.filter(pk=case.id).exists()
    assert not case.bundle_dir.exists()
    from pathlib import Path

    assert not Path(pending_file).exists() and not Path(pending_file).parent.exists()
    assert not (columns.root() / str(case.id)).exists()
    assert purge_incident(case.id) is None  # once is enough; again is harmless


def test_the_deletion_request_leaves_the_events_to_the_purge(case, superuser):
    """What makes it quick whatever the size: no statement of the request reads or writes the
    event or body chunk tables (the whole deletion is a few small rows)."""
    client = logged_in(superuser)  # its sign-in's statements are not the request's
    with CaptureQueriesContext(connection) as queries:
        response = client.delete(f"/api/v1/incidents/{case.id}/")

    assert response.status_code == 204
    statements = [q["sql"] for q in queries.captured_queries]
    touching = [sql for sql in statements if re.search(r"timelines_(event|bodychunk)\b", sql)]
    assert touching == []
    # a few per table holding rows of the incident, however many events it has
    assert 5 < len(statements) < 40, "\n".join(sql[:150] for sql in statements)


@pytest.mark.parametrize(("who", "expected"), [
    ("owner", 403), ("teammate", 403), ("outsider", 404), ("grantee", 403),
    ("upload_token", 403), ("anonymous", 401), ("link_holder", 403), ("team_admin", 204),
    ("superuser", 204)])
def test_only_admins_of_its_team_and_superusers_may_delete(incident, owner, teammate, outsider,
                                                           other_team, team_admin, superuser,
                                                           who, expected):
    principals = {"owner": owner, "teammate": teammate, "outsider": outsider,
                  "team_admin": team_admin, "superuser": superuser}
    if who == "grantee":  # an admin of a team the incident is granted to as editor
        IncidentGrant.objects.create(incident=incident, team=other_team, role="editor")
        Membership.objects.filter(user=outsider).update(role=Membership.Role.ADMIN)
        client = logged_in(outsider)
    elif who == "upload_token":
        client = Client(headers={"Authorization": "Token " + ApiToken.issue(
            team_admin, scope=ApiToken.Scope.UPLOAD)[1]})
    elif who == "anonymous":
        client = Client()
    elif who == "link_holder":
        client = Client()
        client.get(f"/s/{ShareLink.issue(incident, owner)[1]}/")
    else:
        client = logged_in(principals[who])

    response = client.delete(f"/api/v1/incidents/{incident.pk}/")

    assert response.status_code == expected, response.content
    assert Incident.objects.filter(pk=incident.pk).exists() == (expected != 204)
    if expected == 403:
        assert re.search(r"admins|may only upload|read-only", response.json()["detail"])


def test_a_token_of_a_team_admin_deletes_too(incident, team_admin, api_as):
    assert api_as(team_admin).delete(f"/api/v1/incidents/{incident.pk}/").status_code == 204
    assert api_as(team_admin).delete(f"/api/v1/incidents/{incident.pk}/").status_code == 404


def test_the_incident_list_then_says_it_was_deleted(incident, team_admin):
    client = logged_in(team_admin)

    assert client.delete(f"/api/v1/incidents/{incident.pk}/").status_code == 204
    page = client.get("/").content.decode()

    assert "Incident “etcd overload” deleted." in page
    assert "Incident “etcd overload” deleted." not in client.get("/").content.decode()  # once


def test_incident_ids_are_never_reused(team, owner):
    first = Incident.objects.create(title="first", team=team)
    last = Incident.objects.create(title="last", team=team)
    gone = last.pk
    last.delete()

    again = Incident.objects.create(title="again", team=team)

    assert again.pk > gone > first.pk
