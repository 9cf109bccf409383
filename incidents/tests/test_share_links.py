"""Share links: made and listed through ``/api/v1/incidents/{id}/share-links/``, revoked through
``/api/v1/share-links/{id}/``, opened in a browser at ``/s/<key>/``: read-only access to one
incident for the session, re-checked on every request."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from incidents.models import Incident, Upload
from incidents.notes import Annotation, Sequence
from incidents.sharing import ShareLink
from timelines.models import Event

pytestmark = pytest.mark.django_db

LINKS_URL = "/api/v1/incidents/{}/share-links/"


@pytest.fixture
def owner_client(owner):
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture
def make_link(owner_client):
    """``make_link(incident, **fields)`` → the 201 answer's JSON, made by the owner."""

    def make(incident, **fields):
        response = owner_client.post(LINKS_URL.format(incident.pk), fields,
                                     content_type="application/json")
        assert response.status_code == 201, response.content
        return response.json()

    return make


def key_of(url: str) -> str:
    return re.fullmatch(r"http://testserver/s/([A-Za-z0-9_-]+)/", url).group(1)


def opened(url: str) -> Client:
    """A fresh browser (not logged in) that has opened the link."""
    browser = Client()
    response = browser.get(urlsplit(url).path)
    assert response.status_code == 302, response.content
    return browser


# --- making and listing ------------------------------------------------------------------------

def test_a_new_link_shows_its_key_once_and_stores_only_its_hash(make_link, owner_client,
                                                                 incident, owner):
    body = make_link(incident, label="for the vendor")

    key = key_of(body["url"])
    assert len(key) >= 43  # 256 random bits, URL-safe base64
    link = ShareLink.objects.get(pk=body["id"])
    assert link.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in str(ShareLink.objects.filter(pk=link.pk).values().get())
    assert link.created_by == owner and link.incident == incident
    assert body["label"] == "for the vendor" and body["expires_at"] is None
    assert set(body) >= {"id", "url", "expires_at", "label", "view", "created_at"}
    listed = owner_client.get(LINKS_URL.format(incident.pk))
    assert listed.status_code == 200
    assert key not in listed.content.decode()
    [row] = listed.json()
    assert row["id"] == link.pk and row["prefix"] == key[:8]
    assert (row["use_count"], row["last_used_at"], row["revoked_at"]) == (0, None, None)
    assert row["active"] is True


def test_expires_in_sets_the_expiry_and_bad_expiries_are_refused(make_link, owner_client,
                                                                  incident):
    before = timezone.now()
    body = make_link(incident, expires_in=3600)
    expires = ShareLink.objects.get(pk=body["id"]).expires_at
    assert before + timedelta(seconds=3600) <= expires <= timezone.now() + timedelta(seconds=3600)

    url = LINKS_URL.format(incident.pk)
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    for fields in ({"expires_at": past}, {"expires_in": 0},
                   {"expires_in": 60, "expires_at": (before + timedelta(days=1)).isoformat()},
                   {"view": {"query": "verb=get", "colour": "verb"}}):
        response = owner_client.post(url, fields, content_type="application/json")
        assert response.status_code == 400, fields
    assert ShareLink.objects.count() == 1


def test_only_writers_make_and_list_links(incident, teammate, outsider, superuser):
    for user, expected in ((teammate, 403), (outsider, 404), (superuser, 201)):
        client = Client()
        client.force_login(user)
        made = client.post(LINKS_URL.format(incident.pk), {}, content_type="application/json")
        assert made.status_code == expected, user
        listed = client.get(LINKS_URL.format(incident.pk))
        assert listed.status_code == (200 if expected == 201 else expected), user
    assert ShareLink.objects.count() == 1


# --- opening -----------------------------------------------------------------------------------

def test_opening_a_link_goes_to_the_saved_view(make_link, incident, owner):
    sequence = Sequence.objects.create(incident=incident, title="root cause", author=owner)
    body = make_link(incident, view={"query": "?verb=get&verb=list&lanes=actor&after=x|1",
                                     "sequence": sequence.pk})
    assert body["view"] == {"query": "verb=get&verb=list&lanes=actor", "sequence": sequence.pk}

    response = Client().get(urlsplit(body["url"]).path)

    assert response.status_code == 302
    target = urlsplit(response.url)
    assert target.path == f"/incidents/{incident.pk}/"
    assert parse_qs(target.query) == {"verb": ["get", "list"], "lanes": ["actor"],
                                      "sequence": [str(sequence.pk)]}
    assert response.headers["Cache-Control"].startswith("max-age=0")


def test_a_sequence_of_another_incident_cannot_be_saved(owner_client, incident, team, owner):
    other = Incident.objects.create(title="other", team=team)
    sequence = Sequence.objects.create(incident=other, title="elsewhere", author=owner)

    response = owner_client.post(LINKS_URL.format(incident.pk),
                                 {"view": {"sequence": sequence.pk}},
                                 content_type="application/json")

    assert response.status_code == 400
    assert not ShareLink.objects.exists()


def test_the_holder_reads_that_incident_and_nothing_else(make_link, incident, team, owner,
                                                         ingest_file, demo_log):
    ingest_file(incident, demo_log)
    sibling = Incident.objects.create(title="same team, not shared", team=team)
    Annotation.objects.create(incident=incident, start=timezone.now(), note="seen", author=owner)
    browser = opened(make_link(incident)["url"])
    event = Event.objects.filter(incident=incident).first()

    page = browser.get(f"/incidents/{incident.pk}/")
    assert page.status_code == 200
    assert "Shared link, read-only" in page.content.decode()
    for url in (f"/api/v1/incidents/{incident.pk}/", f"/api/v1/incidents/{incident.pk}/events/",
                f"/api/v1/incidents/{incident.pk}/figure/",
                f"/api/v1/incidents/{incident.pk}/events.csv", f"/api/v1/events/{event.pk}/",
                f"/api/v1/incidents/{incident.pk}/annotations/",
                f"/api/v1/uploads/{Upload.objects.get(incident=incident).pk}/"):
        assert browser.get(url).status_code == 200, url
    listing = browser.get("/")
    assert list(listing.context["incidents"]) == [incident]
    assert [i["id"] for i in browser.get("/api/v1/incidents/").json()] == [incident.pk]
    assert browser.get(f"/incidents/{sibling.pk}/").status_code == 404
    assert browser.get(f"/api/v1/incidents/{sibling.pk}/").status_code == 404
    assert browser.get("/admin/").status_code == 302  # to the admin login: not staff


def test_the_holder_may_change_nothing(make_link, incident, demo_log):
    browser = opened(make_link(incident)["url"])

    refused = [
        browser.post(f"/api/v1/incidents/{incident.pk}/annotations/",
                     {"start": timezone.now().isoformat(), "note": "x"},
                     content_type="application/json"),
        browser.post(LINKS_URL.format(incident.pk), {}, content_type="application/json"),
        browser.patch(f"/api/v1/incidents/{incident.pk}/", {"title": "x"},
                      content_type="application/json"),
        browser.post("/api/v1/uploads/", {"incident_id": incident.pk,
                                          "file": demo_log.open("rb")}),
        browser.post(f"/incidents/{incident.pk}/uploads/", {"file": demo_log.open("rb")}),
        browser.post("/incidents/new/", {"title": "mine now"}),
    ]

    assert [r.status_code for r in refused] == [403] * len(refused)
    assert "read-only" in refused[0].json()["detail"]
    assert not Annotation.objects.exists() and not Upload.objects.exists()
    assert ShareLink.objects.count() == 1
    assert list(Incident.objects.values_list("title", flat=True)) == [incident.title]


def test_each_opening_is_counted(make_link, owner_client, incident):
    body = make_link(incident)
    for _ in range(3):
        opened(body["url"])

    link = ShareLink.objects.get(pk=body["id"])
    assert link.use_count == 3
    assert timezone.now() - link.last_used_at < timedelta(minutes=1)


def test_a_logged_in_user_keeps_their_incidents_and_gains_read_access(make_link, incident,
                                                                       outsider, other_team,
                                                                       demo_log):
    own = Incident.objects.create(title="payments outage", team=other_team)
    body = make_link(incident)
    browser = Client()
    browser.force_login(outsider)
    assert browser.get(f"/incidents/{incident.pk}/").status_code == 404

    browser.get(urlsplit(body["url"]).path)

    assert browser.get(f"/incidents/{incident.pk}/").status_code == 200
    assert browser.get(f"/incidents/{own.pk}/").status_code == 200
    assert {i["id"] for i in browser.get("/api/v1/incidents/").json()} == {incident.pk, own.pk}
    upload = browser.post("/api/v1/uploads/", {"incident_id": incident.pk,
                                               "file": demo_log.open("rb")})
    assert upload.status_code == 403
    # a token of the same user carries no session, so no link
    assert incident.pk not in [i["id"] for i in Client().get(
        "/api/v1/incidents/", headers={"Authorization": f"Token {token(outsider)}"}).json()]


def token(user) -> str:
    from incidents.models import ApiToken

    return ApiToken.issue(user)[1]


# --- ending ------------------------------------------------------------------------------------

def end_by_revoking(owner_client, link: ShareLink) -> None:
    response = owner_client.delete(f"/api/v1/share-links/{link.pk}/")
    assert response.status_code == 204
    link.refresh_from_db()
    assert link.revoked_at is not None and not link.active


def end_by_expiry(owner_client, link: ShareLink) -> None:
    ShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


def end_by_deleting(owner_client, link: ShareLink) -> None:
    link.delete()


@pytest.mark.parametrize("end", [end_by_revoking, end_by_expiry, end_by_deleting])
def test_an_ended_link_stops_working_at_once(end, make_link, owner_client, incident):
    body = make_link(incident)
    browser = opened(body["url"])
    assert browser.get(f"/api/v1/incidents/{incident.pk}/").status_code == 200

    end(owner_client, ShareLink.objects.get(pk=body["id"]))

    gone = browser.get(f"/incidents/{incident.pk}/")
    assert gone.status_code == 404
    assert "revoked or has expired" in gone.content.decode()
    # and from then on the browser is simply not logged in
    assert browser.get(f"/api/v1/incidents/{incident.pk}/").status_code == 401
    assert browser.get(f"/incidents/{incident.pk}/").url.startswith("/accounts/login/")
    assert Client().get(urlsplit(body["url"]).path).status_code == 404


def test_an_ended_link_answers_404_in_the_api_too(make_link, owner_client, incident):
    body = make_link(incident)
    browser = opened(body["url"])

    end_by_revoking(owner_client, ShareLink.objects.get(pk=body["id"]))

    response = browser.get(f"/api/v1/incidents/{incident.pk}/events/")
    assert response.status_code == 404
    assert "revoked" in response.json()["detail"]


def test_an_unknown_key_is_404(incident):
    assert Client().get("/s/" + "A" * 43 + "/").status_code == 404


def test_only_writers_of_the_incident_revoke(make_link, incident, teammate, outsider):
    body = make_link(incident)
    for user, expected in ((outsider, 404), (teammate, 403)):
        client = Client()
        client.force_login(user)
        assert client.delete(f"/api/v1/share-links/{body['id']}/").status_code == expected
    assert ShareLink.objects.get(pk=body["id"]).active


def test_a_session_may_hold_links_to_several_incidents(make_link, incident, team):
    second = Incident.objects.create(title="second", team=team)
    browser = opened(make_link(incident)["url"])
    browser.get(urlsplit(make_link(second)["url"]).path)

    assert {i["id"] for i in browser.get("/api/v1/incidents/").json()} == {incident.pk, second.pk}
