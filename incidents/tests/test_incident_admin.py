"""Managing incidents from the pages: the incident page's rename, move and delete controls (for
the incident's admins only), the new-incident form's team choice and evidence hint, ``PATCH`` as
those controls use it, and one run of the controls in a real browser."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from incidents.models import Incident, Membership, Team
from incidents.notes import Annotation
from incidents.sharing import ShareLink

pytestmark = pytest.mark.django_db


def member(name: str, team: Team, role: str):
    user = get_user_model().objects.create_user(name, password="pw-" + name)
    Membership.objects.create(user=user, team=team, role=role)
    return user


@pytest.fixture
def team_admin(team):
    """Admin of ``team``: may also rename, move and delete its incidents."""
    return member("lead", team, Membership.Role.ADMIN)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(client, incident) -> str:
    response = client.get(f"/incidents/{incident.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def options(html: str, select_id: str) -> list[str]:
    found = re.search(rf'<select[^>]*id="{select_id}"[^>]*>(.*?)</select>', html, re.S)
    assert found, f"no select #{select_id}"
    return [re.sub(r"\s+", " ", text).strip()
            for text in re.findall(r"<option[^>]*>(.*?)</option>", found[1], re.S)]


# --- the incident page -------------------------------------------------------------------------

def test_only_admins_and_superusers_see_the_controls(incident, owner, teammate, team_admin,
                                                     superuser):
    link_holder = Client()
    link_holder.get(f"/s/{ShareLink.issue(incident, owner)[1]}/")

    shown = {name: 'id="incident-admin"' in page(client, incident) and
             "js/incident-admin.js" in page(client, incident)
             for name, client in [("admin", logged_in(team_admin)),
                                  ("superuser", logged_in(superuser)),
                                  ("editor", logged_in(owner)), ("viewer", logged_in(teammate)),
                                  ("link", link_holder)]}

    assert shown == {"admin": True, "superuser": True, "editor": False, "viewer": False,
                     "link": False}
    html = page(logged_in(owner), incident)
    assert ">Rename<" not in html and "Delete…" not in html and "move-team" not in html


def test_a_team_admin_may_move_it_to_the_teams_they_work_in(incident, team, team_admin,
                                                            superuser, other_team):
    Membership.objects.create(user=team_admin, team=other_team, role=Membership.Role.EDITOR)
    watched = Team.objects.create(name="sre")
    Membership.objects.create(user=team_admin, team=watched, role=Membership.Role.VIEWER)
    Team.objects.create(name="zeta")

    assert options(page(logged_in(team_admin), incident), "move-team") == [
        "Move to team…", "payments"]
    assert options(page(logged_in(superuser), incident), "move-team") == [
        "Move to team…", "payments", "sre", "zeta"]


def test_the_delete_dialog_says_what_goes(incident, team_admin, ingest_file, demo_log, owner):
    ingest_file(incident, demo_log)
    Annotation.objects.create(incident=incident, start=incident.created_at, note="n")
    ShareLink.issue(incident, owner)
    ShareLink.issue(incident, owner)

    html = re.sub(r"\s+", " ", page(logged_in(team_admin), incident))

    assert ("its 37 events and 1 upload, 1 annotation, 0 sequences and 2 share links go with "
            "it.") in html
    assert f'data-url="/api/v1/incidents/{incident.pk}/"' in html


def test_rename_alone_keeps_the_team_and_an_empty_title_is_refused(incident, team_admin):
    client = logged_in(team_admin)
    url = f"/api/v1/incidents/{incident.pk}/"

    renamed = client.patch(url, {"title": "  etcd overload, 14 July "},
                           content_type="application/json")
    empty = client.patch(url, {"title": " "}, content_type="application/json")

    assert (renamed.status_code, renamed.json()["title"], renamed.json()["team"]) == (
        200, "etcd overload, 14 July", "platform")
    assert empty.status_code == 400 and "title" in empty.json()
    assert Incident.objects.get(pk=incident.pk).title == "etcd overload, 14 July"


# --- the new-incident form ---------------------------------------------------------------------

def test_the_form_offers_the_teams_one_may_create_in(team, other_team, owner, teammate,
                                                     superuser):
    Membership.objects.create(user=owner, team=other_team, role=Membership.Role.ADMIN)

    assert options(logged_in(owner).get("/").content.decode(), "new-team") == [
        "payments", "platform"]
    assert options(logged_in(superuser).get("/").content.decode(), "new-team") == [
        "payments", "platform", "no team (superusers only)"]
    assert 'id="new-team"' not in logged_in(teammate).get("/").content.decode()  # a viewer
    assert re.search(r'<option value="" selected>no team', logged_in(superuser).get("/")
                     .content.decode())


def test_a_superuser_creates_in_any_team_or_none_and_others_only_in_theirs(
        team, other_team, owner, superuser):
    for team_id, expected in ((other_team.pk, other_team), ("", None)):
        response = logged_in(superuser).post("/incidents/new/", {"title": "t", "team": team_id})
        assert response.status_code == 302
        assert Incident.objects.get(pk=int(response.url.split("/")[-2])).team == expected

    assert logged_in(owner).post("/incidents/new/", {"title": "t", "team": other_team.pk}
                                 ).status_code == 403
    assert logged_in(owner).post("/incidents/new/", {"title": "t", "team": "x"}
                                 ).status_code == 403
    made = logged_in(owner).post("/incidents/new/", {"title": "mine", "team": team.pk})
    assert Incident.objects.get(pk=int(made.url.split("/")[-2])).team == team


def test_the_hint_names_every_kind_of_evidence_hindsight_reads(owner, settings):
    """Tied to the registries: a parser or bundle layout added without a word in the hint
    fails here."""
    from timelines.ingest.unpacker import _MARKERS
    from timelines.parsers import FORMATS

    settings.MAX_UPLOAD_BYTES = 3 * 1024**3
    said = {"audit": "audit logs", "legacy-audit": "legacy text format",
            "gke-audit": "GKE</strong> Cloud Logging", "eks-cloudwatch": "EKS",
            "aks-diagnostics": "AKS", "otlp-audit": "OTLP", "k8s-events": "Events",
            "k8s-objects": "<strong>objects</strong> of any kind",
            "klog": "klog", "text-log": "journals", "gke-log": "GKE node and container logs",
            "must-gather": "must-gather", "kind": "kind export logs", "konvoy": "konvoy/DKP",
            "sonobuoy": "sonobuoy", "troubleshoot": "troubleshoot.sh"}
    hint = re.search(r'<p class="hint" id="evidence-hint">(.*?)</p>',
                     logged_in(owner).get("/").content.decode(), re.S)[1]

    kinds = [f.name for f in FORMATS] + [layout for layout, _ in _MARKERS]
    assert [k for k in kinds if k not in said] == []
    assert [said[k] for k in kinds if said[k] not in hint] == []
    for words in ("gzipped or rotated", "watch streams", ".tar.gz", ".zip", "3.0\xa0GB"):
        assert words in hint


# --- in a browser ------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_an_admin_renames_fails_to_move_and_deletes_an_incident_in_the_browser(
        open_page, team, other_team, ingest_file, demo_log):
    admin = member("lead", team, Membership.Role.ADMIN)
    Membership.objects.create(user=admin, team=other_team, role=Membership.Role.EDITOR)
    incident = Incident.objects.create(title="etcd overload", team=team, key="job-1")
    Incident.objects.create(title="theirs", team=other_team, key="job-1")  # the move must fail
    ingest_file(incident, demo_log)
    page = open_page(admin, f"/incidents/{incident.pk}/")

    page.click("#rename")
    page.fill("#rename-form input[name=title]", "etcd overload, 14 July")
    page.click("#rename-form button:not([type=button])")
    page.wait_for_function("document.getElementById('admin-status').textContent === 'Renamed.'")
    assert page.inner_text("#incident-title") == "etcd overload, 14 July"
    assert page.title() == "etcd overload, 14 July · Hindsight"
    assert Incident.objects.get(pk=incident.pk).title == "etcd overload, 14 July"

    page.select_option("#move-team", "payments")
    page.click("#move")
    page.wait_for_function(
        "document.getElementById('admin-status').textContent.startsWith('Could not move')")
    assert "incident_key" in page.inner_text("#admin-status")
    assert Incident.objects.get(pk=incident.pk).team == team

    page.click("#delete")
    assert page.is_visible("#delete-dialog")
    assert "its 37 events and 1 upload" in page.inner_text("#delete-dialog")
    page.fill("#delete-form input[name=confirm]", "etcd overload")  # the old title
    assert page.is_disabled("#delete-confirm")
    page.fill("#delete-form input[name=confirm]", "etcd overload, 14 July")
    page.click("#delete-confirm")
    page.wait_for_url(re.compile(r"^https?://[^/]+/$"))  # the incident list

    assert "Incident “etcd overload, 14 July” deleted." in page.inner_text("main")
    assert not Incident.objects.filter(pk=incident.pk).exists()
