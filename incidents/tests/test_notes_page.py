"""The incident page's annotations, sequences and share-link panels as the server renders them:
write controls for those who may write (``access.can_write``) only, and the API addresses the
scripts use."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from incidents.models import Membership, Team
from incidents.notes import Annotation
from incidents.sharing import IncidentGrant, ShareLink

pytestmark = pytest.mark.django_db

# what only writers get: the share panel and its script, the annotation form and its buttons,
# creating sequences and adding steps
WRITE_CONTROLS = ['id="share"', 'id="share-form"', "js/share.js", 'id="annotation-form"',
                  'id="annotate-event"', 'id="annotate-window"', 'id="sequence-new"',
                  'id="step-form"', 'id="sequence-delete"']
# what everyone who sees the incident gets
READ_PANELS = ['id="annotations"', 'id="annotation-list"', 'id="annotation-filter"',
               'id="sequences"', 'id="sequence-select"', 'id="sequence-steps"',
               "js/notes.js", "js/sequences.js"]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def link_holder(incident, owner) -> Client:
    """A browser, not logged in, that opened a share link to the incident."""
    _, key = ShareLink.issue(incident, owner)
    browser = Client()
    assert browser.get(f"/s/{key}/").status_code == 302
    return browser


def page_of(client: Client, incident) -> str:
    response = client.get(f"/incidents/{incident.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def data_attribute(page: str, element_id: str, name: str) -> str:
    tag = re.search(rf'<[a-z]+ id="{element_id}"[^>]*>', page, re.S).group(0)
    return re.search(rf'{name}="([^"]*)"', tag).group(1)


@pytest.mark.parametrize("who", ["owner", "superuser", "granted editor"])
def test_writers_get_the_write_controls(who, incident, owner, superuser, other_team):
    user = {"owner": owner, "superuser": superuser}.get(who)
    if user is None:
        user = _member("helper", other_team, "editor")
        IncidentGrant.objects.create(incident=incident, team=other_team, role="editor")
    page = page_of(logged_in(user), incident)

    for control in WRITE_CONTROLS + READ_PANELS:
        assert control in page, control
    assert data_attribute(page, "notes-side", "data-can-write") == "1"
    assert data_attribute(page, "notes-side", "data-csrf-token")


@pytest.mark.parametrize("who", ["teammate", "granted viewer", "editor granted viewer",
                                 "link holder"])
def test_readers_get_the_panels_without_write_controls(who, incident, owner, teammate,
                                                       other_team):
    if who == "teammate":
        client = logged_in(teammate)
    elif who == "link holder":
        client = link_holder(incident, owner)
    else:  # a grant never gives more than it says, whatever the role in the team
        role = "viewer" if who == "granted viewer" else "editor"
        IncidentGrant.objects.create(incident=incident, team=other_team, role="viewer")
        client = logged_in(_member("reader", other_team, role))
    Annotation.objects.create(incident=incident, start=incident.created_at, note="hello")

    page = page_of(client, incident)

    for control in WRITE_CONTROLS:
        assert control not in page, control
    for panel in READ_PANELS:
        assert panel in page, panel
    assert data_attribute(page, "notes-side", "data-can-write") == "0"
    assert ("Shared link, read-only" in page) == (who == "link holder")


def test_the_panels_point_at_this_incidents_api(incident, owner):
    client = logged_in(owner)
    page = page_of(client, incident)

    lists = {panel: data_attribute(page, panel, "data-list-url")
             for panel in ("annotations", "sequences", "share")}
    assert lists == {"annotations": f"/api/v1/incidents/{incident.pk}/annotations/",
                     "sequences": f"/api/v1/incidents/{incident.pk}/sequences/",
                     "share": f"/api/v1/incidents/{incident.pk}/share-links/"}
    for url in lists.values():
        assert client.get(url).status_code == 200, url
    items = {panel: data_attribute(page, panel, "data-item-url")
             for panel in ("annotations", "sequences", "share")}
    assert items == {"annotations": "/api/v1/annotations/", "sequences": "/api/v1/sequences/",
                     "share": "/api/v1/share-links/"}
    # the item prefixes, completed with an id, are the API's routes
    note = client.post(lists["annotations"], {"start": "2024-01-01T00:00:00Z", "note": "n"},
                       content_type="application/json").json()
    assert client.get(items["annotations"] + f"{note['id']}/").json()["note"] == "n"


def _member(name: str, team: Team, role: str):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, team=team, role=role)
    return user


def test_the_chosen_sequence_is_a_view_not_an_event_filter(incident, owner):
    response = logged_in(owner).get(f"/incidents/{incident.pk}/?resource=pods&sequence=7")

    export = re.search(r'<a id="export-csv" href="([^"]*)"', response.content.decode()).group(1)
    assert export.endswith("?resource=pods")  # the export is of the events, whatever is chosen
