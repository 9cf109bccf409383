"""Who sees and changes what: the rules of ``incidents.access``, the incident, grant and token
endpoints, and a permission matrix over every route of the project (taken from the URL resolver,
so that a route nobody classified fails the test)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db.models import Count
from django.test import Client
from django.utils import timezone

from incidents import access
from incidents.models import ApiToken, Incident, Membership, Team
from incidents.sharing import IncidentGrant, ShareLink

pytestmark = pytest.mark.django_db


def member(name: str, team: Team, role: str):
    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(user=user, team=team, role=role)
    return user


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the rules ---------------------------------------------------------------------------------

def test_users_see_their_teams_and_granted_incidents(incident, owner, teammate, outsider,
                                                     superuser, team, other_team):
    theirs = Incident.objects.create(title="payments", team=other_team)
    orphan = Incident.objects.create(title="no team yet")
    assert set(access.visible_incidents(owner)) == {incident}
    assert set(access.visible_incidents(outsider)) == {theirs}
    assert set(access.visible_incidents(superuser)) == {incident, theirs, orphan}

    IncidentGrant.objects.create(incident=incident, team=other_team)

    assert set(access.visible_incidents(outsider)) == {incident, theirs}
    assert set(access.visible_incidents(teammate)) == {incident}
    assert not access.visible_incidents(AnonymousUser()).exists()
    assert [orphan not in access.visible_incidents(u) for u in (owner, outsider)] == [True, True]


def test_visible_incidents_have_no_duplicate_rows(incident, owner, team, other_team):
    Membership.objects.create(user=owner, team=other_team, role="viewer")
    IncidentGrant.objects.create(incident=incident, team=other_team)

    rows = access.visible_incidents(owner).annotate(n=Count("uploads"))

    assert [i.pk for i in rows] == [incident.pk]


@pytest.mark.parametrize(("member_role", "grant_role", "writes"), [
    ("viewer", "editor", False), ("editor", "viewer", False), ("editor", "editor", True),
    ("admin", "editor", True), ("admin", "viewer", False)])
def test_a_grant_gives_the_weaker_of_its_role_and_the_membership(incident, other_team,
                                                                 member_role, grant_role,
                                                                 writes):
    user = member("guest", other_team, member_role)
    IncidentGrant.objects.create(incident=incident, team=other_team, role=grant_role)

    assert access.can_write(user, incident) is writes
    assert access.can_upload(user, incident) is writes
    assert access.can_manage_grants(user, incident) is False  # only the owning team
    assert access.can_administer(user, incident) is False


def test_owning_team_roles(incident, team, owner, teammate, superuser):
    admin = member("lead", team, "admin")
    assert [access.can_write(u, incident) for u in (admin, owner, teammate, superuser)] == [
        True, True, False, True]
    assert [access.can_manage_grants(u, incident) for u in (admin, owner, teammate)] == [
        True, True, False]
    assert [access.can_administer(u, incident) for u in (admin, owner, teammate, superuser)] == [
        True, False, False, True]


# --- incident endpoints ------------------------------------------------------------------------

def test_the_incident_answer_has_team_key_url_and_grants(incident, owner, other_team):
    Incident.objects.filter(pk=incident.pk).update(key="job-7")
    IncidentGrant.objects.create(incident=incident, team=other_team, role="editor",
                                 granted_by=owner)

    body = logged_in(owner).get(f"/api/v1/incidents/{incident.pk}/").json()

    assert body["team"] == "platform" and body["key"] == "job-7"
    assert body["url"] == f"http://testserver/incidents/{incident.pk}/"
    assert body["created_at"]
    assert [(g["team"], g["role"], g["granted_by"]) for g in body["grants"]] == [
        ("payments", "editor", "owner")]


def test_a_team_admin_renames_and_gives_the_incident_away(incident, team, other_team, owner):
    admin = logged_in(member("lead", team, "admin"))
    url = f"/api/v1/incidents/{incident.pk}/"

    assert logged_in(owner).patch(url, {"title": "x"}, content_type="application/json"
                                  ).status_code == 403
    assert admin.patch(url, {"team": "nobody"}, content_type="application/json"
                       ).status_code == 400
    response = admin.patch(url, {"title": "etcd overload, 14 July", "team": "payments"},
                           content_type="application/json")

    assert response.status_code == 200
    assert (response.json()["title"], response.json()["team"]) == ("etcd overload, 14 July",
                                                                   "payments")
    incident.refresh_from_db()
    assert incident.team == other_team
    assert admin.get(url).status_code == 404  # no longer theirs
    assert logged_in(owner).put(url, {"title": "x"}, content_type="application/json"
                                ).status_code in (404, 405)


def test_a_superuser_gives_a_teamless_incident_to_a_team(superuser, owner, team):
    orphan = Incident.objects.create(title="from the command line")
    assert logged_in(owner).get(f"/api/v1/incidents/{orphan.pk}/").status_code == 404

    response = logged_in(superuser).patch(f"/api/v1/incidents/{orphan.pk}/",
                                          {"team": "platform"}, content_type="application/json")

    assert response.status_code == 200
    assert logged_in(owner).get(f"/api/v1/incidents/{orphan.pk}/").status_code == 200


def test_moving_an_incident_onto_a_key_the_team_has_is_refused(incident, superuser, other_team):
    Incident.objects.filter(pk=incident.pk).update(key="job-1")
    Incident.objects.create(title="theirs", team=other_team, key="job-1")

    response = logged_in(superuser).patch(f"/api/v1/incidents/{incident.pk}/",
                                          {"team": "payments"}, content_type="application/json")

    assert response.status_code == 400 and "incident_key" in response.json()["team"][0]


def test_grants_are_made_changed_and_taken_back(incident, owner, outsider, other_team):
    client = logged_in(owner)
    url = f"/api/v1/incidents/{incident.pk}/grants/"
    assert logged_in(outsider).get(f"/api/v1/incidents/{incident.pk}/").status_code == 404

    made = client.post(url, {"team": "payments"}, content_type="application/json")
    changed = client.post(url, {"team": "payments", "role": "editor"},
                          content_type="application/json")

    assert (made.status_code, made.json()["role"]) == (201, "viewer")
    assert (changed.status_code, changed.json()["role"]) == (200, "editor")
    assert logged_in(outsider).get(f"/api/v1/incidents/{incident.pk}/").status_code == 200
    assert access.can_write(outsider, incident)
    # the granted team may not pass it on or take it back
    assert logged_in(outsider).delete(url + "payments/").status_code == 403
    for refused in ({"team": "platform"}, {"team": "nobody"}, {"team": "payments",
                                                               "role": "admin"}):
        assert client.post(url, refused, content_type="application/json").status_code == 400
    assert client.delete(url + "payments/").status_code == 204
    assert client.delete(url + "payments/").status_code == 404
    grant = IncidentGrant.objects.create(incident=incident, team=other_team)
    assert client.delete(f"{url}{grant.pk}/").status_code == 204
    assert logged_in(outsider).get(f"/api/v1/incidents/{incident.pk}/").status_code == 404


def test_an_expired_token_is_401_saying_so(owner, incident):
    token, key = ApiToken.issue(owner, expires_at=timezone.now() - timedelta(seconds=1))

    response = Client().get("/api/v1/incidents/", headers={"Authorization": f"Token {key}"})

    assert response.status_code == 401
    assert f"({token.prefix}…) expired at" in response.json()["detail"]
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    assert Client().get("/api/v1/incidents/",
                        headers={"Authorization": f"Token {key}"}).status_code == 200

def test_a_teams_rules_are_its_members_not_a_share_links(incident, owner, outsider):
    holder = Client()
    assert holder.get(f"/s/{ShareLink.issue(incident, owner)[1]}/").status_code == 302
    shipped = holder.get("/api/v1/rules/")
    assert shipped.status_code == 200 and shipped.json()["rules"]
    for client in (holder, logged_in(outsider)):  # a link is no member; nor is another team
        for name in ("platform", "nobody"):  # and no hint that a team exists
            answer = client.get(f"/api/v1/rules/?team={name}")
            assert answer.status_code == 400
            assert answer.json() == {"team": [f"You are in no team named {name!r}."]}
    assert logged_in(owner).get("/api/v1/rules/?team=platform").status_code == 200


# --- the permission matrix ---------------------------------------------------------------------
# Every route (and method) of the project against every kind of principal. A share link whose
# link was revoked or has expired answers 404 to its next request, whatever it asks (then the
# browser is simply anonymous: see test_share_links); tokens are not accepted by pages.

PRINCIPALS = ("owner", "teammate", "outsider", "anonymous", "holder", "revoked", "expired",
              "upload_token", "superuser")
OK, LOGIN, DENIED, MISSING = "ok", "login", "401/403", "404"


def profile(*outcomes: str) -> dict[str, str]:
    return dict(zip(PRINCIPALS, outcomes, strict=True))


READ = profile(OK, OK, MISSING, DENIED, OK, MISSING, MISSING, DENIED, OK)
PAGE = profile(OK, OK, MISSING, LOGIN, OK, MISSING, MISSING, LOGIN, OK)
LIST = profile(OK, OK, OK, DENIED, OK, MISSING, MISSING, DENIED, OK)
PAGE_LIST = profile(OK, OK, OK, LOGIN, OK, MISSING, MISSING, LOGIN, OK)
WRITE = profile(OK, DENIED, MISSING, DENIED, DENIED, MISSING, MISSING, DENIED, OK)
ADMIN = profile(DENIED, DENIED, MISSING, DENIED, DENIED, MISSING, MISSING, DENIED, OK)
UPLOAD_READ = {**READ, "upload_token": OK}
UPLOAD_WRITE = {**WRITE, "upload_token": OK}
PUBLIC = profile(OK, OK, OK, OK, OK, MISSING, MISSING, OK, OK)
PAGE_CREATE = profile(OK, DENIED, OK, LOGIN, DENIED, MISSING, MISSING, LOGIN, OK)
PAGE_UPLOAD = profile(OK, DENIED, MISSING, LOGIN, DENIED, MISSING, MISSING, LOGIN, OK)
SHARE_OPEN = profile(*[OK] * len(PRINCIPALS))  # a valid link opens for anyone
STAFF = profile(LOGIN, LOGIN, LOGIN, LOGIN, LOGIN, MISSING, MISSING, LOGIN, OK)
# Instance-wide Falco rules: any account reads them; superusers (and, with ``team``, its admins)
# add a file.
RULES_ADD = profile(DENIED, DENIED, DENIED, DENIED, DENIED, MISSING, MISSING, DENIED, OK)
# A stream is its team's (streams.access): its members see it, its editors and admins manage it,
# its admins delete it; a share link opens an incident, never a stream (and writes nothing: 403
# before any stream is looked up); an upload token uploads.
STREAM_READ = {**READ, "holder": MISSING}
STREAM_PAGE = {**PAGE, "holder": MISSING}
STREAM_MANAGE = WRITE
STREAM_PAGE_MANAGE = PAGE_UPLOAD
STREAM_ADMIN = ADMIN
STREAM_CREATE = profile(OK, DENIED, DENIED, DENIED, DENIED, MISSING, MISSING, DENIED, OK)
STREAM_PAGE_CREATE = profile(OK, DENIED, DENIED, LOGIN, DENIED, MISSING, MISSING, LOGIN, OK)
# the webhook takes the stream's own token only: any other credential is 401
STREAM_WEBHOOK = profile(DENIED, DENIED, DENIED, DENIED, DENIED, MISSING, MISSING, DENIED,
                         DENIED)


def _now() -> str:
    return timezone.now().isoformat()


def _sequence(w, steps: int = 0):
    from incidents.notes import Sequence, SequenceStep

    sequence = Sequence.objects.create(incident=w.incident, title="root cause", author=w.owner)
    for position in range(steps):
        SequenceStep.objects.create(sequence=sequence, position=position, event_id=w.event.pk,
                                    at=w.event.received)
    return sequence


def _annotation(w):
    from incidents.notes import Annotation

    return Annotation.objects.create(incident=w.incident, start=timezone.now(), note="n",
                                     author=w.owner)


def _link_url(w) -> str:
    return f"/s/{ShareLink.issue(w.incident, w.owner)[1]}/"


def _revoke_url(w) -> str:
    return f"/api/v1/share-links/{ShareLink.issue(w.incident, w.owner)[0].pk}/"


def _upload_form(w) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {"incident_id": w.incident.pk, "file": SimpleUploadedFile("a.log", b"{}\n")}


def _grant_url(w) -> str:
    IncidentGrant.objects.get_or_create(incident=w.incident, team=w.observers)
    return f"/api/v1/incidents/{w.incident.pk}/grants/observers/"


def _step_url(w) -> str:
    sequence = _sequence(w, steps=1)
    return f"/api/v1/sequences/{sequence.pk}/steps/{sequence.steps.get().pk}/"


def _reorder(w):
    sequence = _sequence(w, steps=2)
    order = list(sequence.steps.values_list("pk", flat=True))[::-1]
    return f"/api/v1/sequences/{sequence.pk}/reorder/", {"order": order}


def inc(w, rest: str = "") -> str:
    return f"/api/v1/incidents/{w.incident.pk}/{rest}"


def _insight_sequence(w):
    from timelines.analysis import insights

    number = next(i["id"] for i in insights.current(w.incident.pk)[0] if i["events"])
    return inc(w, f"insights/{number}/sequence/"), {}


def _fresh_stream(w) -> int:
    """A stream of the incident's team that a call may change or delete."""
    from streams.store import create_stream

    w.streams_made += 1
    return create_stream(f"matrix-{w.streams_made}", w.incident.team, retention_hours=1,
                         created_by=w.owner)[0].pk


def _new_stream_name(w) -> str:
    w.streams_made += 1
    return f"made-{w.streams_made}"


def _rules_file(w) -> dict:
    w.streams_made += 1
    return {"name": f"matrix-{w.streams_made}.yaml",
            "text": f"- list: matrix_list_{w.streams_made}\n  items: []\n"}


def _cut(w) -> dict:
    now = timezone.now()
    return {"since": (now - timedelta(hours=1)).isoformat(), "until": now.isoformat(),
            "title": "cut"}


def stream(w, rest: str = "") -> str:
    return f"/api/v1/streams/{w.stream.pk}/{rest}"


# (route, method) → (expected outcomes, what to send: a path, or (path, body)); bodies of API
# calls are JSON, of pages and uploads forms.
SPECS = {
    ("incidents:list", "GET"): (PAGE_LIST, lambda w: "/"),
    ("incidents:create", "POST"): (PAGE_CREATE, lambda w: ("/incidents/new/", {"title": "x"})),
    ("incidents:detail", "GET"): (PAGE, lambda w: f"/incidents/{w.incident.pk}/"),
    ("incidents:upload", "POST"): (PAGE_UPLOAD,
                                   lambda w: (f"/incidents/{w.incident.pk}/uploads/", {})),
    ("incidents:share", "GET"): (SHARE_OPEN, _link_url),
    ("healthz", "GET"): (PUBLIC, lambda w: "/healthz"),
    ("schema", "GET"): (PUBLIC, lambda w: "/api/schema/"),
    ("api-docs", "GET"): (PUBLIC, lambda w: "/api/docs/"),
    ("admin:index", "GET"): (STAFF, lambda w: "/admin/"),
    ("admin:incidents_sharelink_changelist", "GET"): (STAFF,
                                                      lambda w: "/admin/incidents/sharelink/"),
    ("api:api-root", "GET"): (LIST, lambda w: "/api/v1/"),
    ("api:incident-list", "GET"): (LIST, lambda w: "/api/v1/incidents/"),
    ("api:incident-detail", "GET"): (READ, lambda w: inc(w, "")),
    ("api:incident-detail", "PATCH"): (ADMIN, lambda w: (inc(w, ""), {"title": "y"})),
    ("api:incident-grants", "POST"): (WRITE, lambda w: (inc(w, "grants/"),
                                                        {"team": "observers"})),
    ("api:incident-grant-detail", "DELETE"): (WRITE, _grant_url),
    ("api:incident-share-links", "GET"): (WRITE, lambda w: inc(w, "share-links/")),
    ("api:incident-share-links", "POST"): (WRITE, lambda w: (inc(w, "share-links/"),
                                                             {"label": "x"})),
    ("api:share-link-detail", "DELETE"): (WRITE, _revoke_url),
    ("api:upload-list", "POST"): (UPLOAD_WRITE, lambda w: ("/api/v1/uploads/", _upload_form(w))),
    ("api:upload-detail", "GET"): (UPLOAD_READ, lambda w: f"/api/v1/uploads/{w.upload.pk}/"),
    ("api:upload-files", "GET"): (UPLOAD_READ,
                                  lambda w: f"/api/v1/uploads/{w.upload.pk}/files/"),
    ("api:event-detail", "GET"): (READ, lambda w: f"/api/v1/events/{w.event.pk}/"),
    ("api:event-diff", "GET"): (READ, lambda w: f"/api/v1/events/{w.event.pk}/diff/"
                                                f"?against={w.event.pk}"),
    ("api:incident-event-list", "GET"): (READ, lambda w: inc(w, "events/")),
    ("incident-events-csv", "GET"): (READ, lambda w: inc(w, "events.csv")),
    ("incident-events-json", "GET"): (READ, lambda w: inc(w, "events.json")),
    ("incident-event-step", "GET"): (READ, lambda w: inc(w, "events/step/")),
    ("incident-figure", "GET"): (READ, lambda w: inc(w, "figure/")),
    ("incident-facets", "GET"): (READ, lambda w: inc(w, "facets/?field=verb")),
    ("incident-overview", "GET"): (READ, lambda w: inc(w, "overview/")),
    ("incident-stats", "GET"): (READ, lambda w: inc(w, "stats/?by=verb")),
    ("incident-stats-inflight", "GET"): (READ, lambda w: inc(w, "stats/inflight/?by=verb")),
    ("stats-page", "GET"): (PAGE, lambda w: f"/incidents/{w.incident.pk}/stats/"),
    ("incident-pods", "GET"): (READ, lambda w: inc(w, "pods/")),
    ("pods-page", "GET"): (PAGE, lambda w: f"/incidents/{w.incident.pk}/pods/"),
    ("incident-history", "GET"): (READ, lambda w: inc(w, "history/?resource=pods&name=x")),
    ("history-page", "GET"): (PAGE, lambda w: f"/incidents/{w.incident.pk}/history/"),
    # run b is the incident itself: both runs must be visible, and so is this one
    ("incident-compare", "GET"): (READ, lambda w: inc(w, f"compare/?against={w.incident.pk}")),
    ("compare-page", "GET"): (PAGE, lambda w: f"/incidents/{w.incident.pk}/compare/"),
    ("incident-insights", "GET"): (READ, lambda w: inc(w, "insights/")),
    ("incident-insights", "POST"): (WRITE, lambda w: (inc(w, "insights/"), {})),
    ("incident-insight-sequence", "POST"): (WRITE, _insight_sequence),
    ("api:incident-annotation-list", "GET"): (READ, lambda w: inc(w, "annotations/")),
    ("api:incident-annotation-list", "POST"): (WRITE, lambda w: (
        inc(w, "annotations/"), {"start": _now(), "note": "seen"})),
    ("api:annotation-detail", "GET"): (READ, lambda w: f"/api/v1/annotations/{_annotation(w).pk}/"),
    ("api:annotation-detail", "PATCH"): (WRITE, lambda w: (
        f"/api/v1/annotations/{_annotation(w).pk}/", {"note": "changed"})),
    ("api:annotation-detail", "DELETE"): (WRITE,
                                          lambda w: f"/api/v1/annotations/{_annotation(w).pk}/"),
    ("api:incident-sequence-list", "GET"): (READ, lambda w: inc(w, "sequences/")),
    ("api:incident-sequence-list", "POST"): (WRITE, lambda w: (
        inc(w, "sequences/"), {"title": "t", "steps": []})),
    ("api:sequence-detail", "GET"): (READ, lambda w: f"/api/v1/sequences/{_sequence(w).pk}/"),
    ("api:sequence-detail", "PUT"): (WRITE, lambda w: (
        f"/api/v1/sequences/{_sequence(w).pk}/", {"title": "t", "steps": []})),
    ("api:sequence-detail", "PATCH"): (WRITE, lambda w: (
        f"/api/v1/sequences/{_sequence(w).pk}/", {"title": "u"})),
    ("api:sequence-detail", "DELETE"): (WRITE,
                                        lambda w: f"/api/v1/sequences/{_sequence(w).pk}/"),
    ("api:sequence-export", "GET"): (READ,
                                     lambda w: f"/api/v1/sequences/{_sequence(w).pk}/export/"),
    ("api:sequence-insert-step", "POST"): (WRITE, lambda w: (
        f"/api/v1/sequences/{_sequence(w).pk}/steps/", {"event": w.event.pk})),
    ("api:sequence-remove-step", "DELETE"): (WRITE, _step_url),
    ("api:sequence-reorder", "POST"): (WRITE, _reorder),
    ("incident-related", "GET"): (READ, lambda w: inc(w, "related/?resource=pods&name=x")),
    ("rules", "GET"): (LIST, lambda w: "/api/v1/rules/"),
    ("rules", "POST"): (RULES_ADD, lambda w: ("/api/v1/rules/", _rules_file(w))),
    ("streams:list", "GET"): (PAGE_LIST, lambda w: "/streams/"),
    ("streams:list", "POST"): (STREAM_PAGE_CREATE, lambda w: (
        "/streams/", {"team": w.incident.team_id, "name": _new_stream_name(w)})),
    ("streams:detail", "GET"): (STREAM_PAGE, lambda w: f"/streams/{w.stream.pk}/"),
    ("streams:cut", "POST"): (STREAM_PAGE_MANAGE, lambda w: (
        f"/streams/{w.stream.pk}/cut/", _cut(w))),
    ("api:stream-list", "GET"): (LIST, lambda w: "/api/v1/streams/"),
    ("api:stream-list", "POST"): (STREAM_CREATE, lambda w: (
        "/api/v1/streams/", {"name": _new_stream_name(w), "team": w.incident.team.name})),
    ("api:stream-detail", "GET"): (STREAM_READ, lambda w: stream(w)),
    ("api:stream-detail", "DELETE"): (STREAM_ADMIN,
                                      lambda w: f"/api/v1/streams/{_fresh_stream(w)}/"),
    ("api:stream-kubeconfig", "GET"): (STREAM_READ, lambda w: stream(w, "kubeconfig/")),
    ("api:stream-kubeconfig", "POST"): (STREAM_MANAGE, lambda w: (
        f"/api/v1/streams/{_fresh_stream(w)}/kubeconfig/", {})),
    ("api:stream-event-list", "GET"): (STREAM_READ, lambda w: stream(w, "events/")),
    ("stream-figure", "GET"): (STREAM_READ, lambda w: stream(w, "figure/")),
    ("api:stream-incident-list", "POST"): (STREAM_MANAGE, lambda w: (
        stream(w, "incidents/"), _cut(w))),
    ("stream-audit", "POST"): (STREAM_WEBHOOK, lambda w: (stream(w, "audit/"), {})),
    # last: it deletes the incident
    ("api:incident-detail", "DELETE"): (ADMIN, lambda w: inc(w, "")),
}
ACCEPTED = {"api:event-diff": {422}}  # no object version in a Metadata-level event: access was
# granted, the diff is impossible


class World:
    def __init__(self, **objects) -> None:
        self.__dict__.update(objects)


@pytest.fixture
def world(incident, owner, teammate, outsider, superuser, other_team, ingest_file, demo_log):
    from streams.store import create_stream
    from timelines.models import Event

    upload = ingest_file(incident, demo_log)
    return World(stream=create_stream("ci", incident.team, retention_hours=1)[0], streams_made=0,
                 incident=incident, owner=owner, teammate=teammate, outsider=outsider,
                 superuser=superuser, upload=upload, event=Event.objects.filter(
                     incident=incident).order_by("received", "id").first(),
                 observers=Team.objects.create(name="observers"))


def client_of(principal: str, w) -> Client:
    if principal in ("owner", "teammate", "outsider", "superuser"):
        return logged_in(getattr(w, principal))
    if principal == "anonymous":
        return Client()
    if principal == "upload_token":
        key = ApiToken.issue(w.owner, scope=ApiToken.Scope.UPLOAD)[1]
        return Client(headers={"Authorization": f"Token {key}"})
    link, key = ShareLink.issue(w.incident, w.owner)
    client = Client()
    assert client.get(f"/s/{key}/").status_code == 302
    if principal == "revoked":
        ShareLink.objects.filter(pk=link.pk).update(revoked_at=timezone.now())
    elif principal == "expired":
        ShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now())
    return client


def send(client: Client, method: str, call, api: bool):
    path, body = call if isinstance(call, tuple) else (call, None)
    if method == "GET":
        return client.get(path)
    if body is not None and api and "file" not in body:
        return client.generic(method, path, json.dumps(body),
                              content_type="application/json")
    if method == "POST":
        return client.post(path, body or {})
    return client.generic(method, path)


def outcome(response, accepted: set[int]) -> str:
    code = response.status_code
    if code in (401, 403):
        return DENIED
    if code == 404:
        return MISSING
    if code == 302 and "login" in response.url:
        return LOGIN
    if 200 <= code < 300 or code == 302 or code in accepted:
        return OK
    return f"unexpected {code}"


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_permission_matrix(principal, world):
    fresh_each_time = principal in ("revoked", "expired")  # their first request sees the end
    client = client_of(principal, world)
    wrong = []
    for (route, method), (expected, build) in SPECS.items():
        # opening a link must not make the principal a link holder for the next routes
        fresh = fresh_each_time or route == "incidents:share"
        response = send(client_of(principal, world) if fresh else client, method, build(world),
                        api=route.startswith("api:"))
        got = outcome(response, ACCEPTED.get(route, set()))
        if got != expected[principal]:
            wrong.append(f"{method} {route}: expected {expected[principal]}, got {got}")
    assert not wrong, "\n".join(wrong)


def resolver_routes(patterns=None, namespace: str = ""):
    """(route key, callback) for every URL pattern, format-suffix variants left out."""
    from django.urls import URLResolver, get_resolver

    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = ":".join(p for p in (namespace, entry.namespace) if p)
            yield from resolver_routes(entry.url_patterns, inner)
        elif "(?P<format>" not in str(entry.pattern) and "drf_format_suffix" not in str(
                entry.pattern):
            name = entry.name or str(entry.pattern)
            yield (f"{namespace}:{name}" if namespace else name), entry.callback


def methods_of(callback) -> set[str] | None:
    """The methods a DRF view answers; None for a plain Django view (not introspectable)."""
    view = getattr(callback, "cls", None)
    if view is None:
        return None
    allowed = {m for m in view.http_method_names if m not in ("head", "options")}
    actions = getattr(callback, "actions", None)
    names = set(actions) if actions else {m for m in allowed if hasattr(view, m)}
    return {m.upper() for m in names & allowed}


def test_every_route_is_in_the_matrix():
    from django.contrib.auth import urls as account_urls

    account_pages = {p.name for p in account_urls.urlpatterns}  # public by design
    classified = {route for route, _ in SPECS}
    unclassified, seen = [], set()
    for route, callback in resolver_routes():
        seen.add(route)
        if route in account_pages or (route.startswith("admin:") and route not in classified):
            continue  # the admin site: one staff check guards it all (admin:index above)
        methods = methods_of(callback)
        if methods is None:
            unclassified += [] if route in classified else [f"{route} (a page)"]
        else:
            unclassified += [f"{m} {route}" for m in sorted(methods) if (route, m) not in SPECS]
    assert not unclassified, f"routes missing from the permission matrix: {unclassified}"
    assert classified <= seen, f"the matrix lists routes that no longer exist: {classified - seen}"
