"""``GET /api/v1/incidents/{id}/events/`` and ``GET /api/v1/events/{id}/``.

Every expected result is computed here from the fixture files with the ``json`` module: the test
has its own small implementation of each filter over the raw audit events.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from incidents.models import ApiToken, Incident
from timelines.models import Event

pytestmark = pytest.mark.django_db

EVENTS_URL = "/api/v1/incidents/{}/events/"
REQUIRED_FIELDS = {"id", "audit_id", "verb", "user", "user_agent", "resource", "subresource",
                   "namespace", "name", "code", "received", "completed", "duration_ms", "source"}
LOGS = ("audit2rbac-demo.log", "openshift-requestresponse.log")
EXTRA_AUDIT_ID = "00000000-test-4000-8000-podslogsubres"


# --- the fixture data, read independently ------------------------------------------------------

def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def facts(event: dict) -> dict:
    """What each filter looks at, straight from the raw audit event."""
    ref = event.get("objectRef") or {}
    user = event.get("user") or {}
    return {
        "audit_id": event["auditID"],
        "resource": ref.get("resource") or "",
        "subresource": ref.get("subresource") or "",
        "name": ref.get("name") or "",
        "namespace": ref.get("namespace") or "",
        "user": user.get("username") or "",
        "impersonated_user": (event.get("impersonatedUser") or {}).get("username") or "",
        "verb": event.get("verb") or "",
        "code": (event.get("responseStatus") or {}).get("code"),
        "groups": user.get("groups") or [],
        "user_agent": event.get("userAgent") or "",
        "received": parse_time(event.get("requestReceivedTimestamp") or event["timestamp"]),
        "raw": event,
    }


def matches(fact: dict, params: dict[str, list[str]]) -> bool:
    for key, values in params.items():
        if key == "group":
            ok = any(group in values for group in fact["groups"]) or (
                "(none)" in values and not fact["groups"])
        elif key == "code":
            ok = fact["code"] in [None if v == "(none)" else int(v) for v in values]
        elif "(none)" in values and fact.get(key) == "":  # the event has no such value
            ok = True
        elif key == "since":
            ok = all(fact["received"] >= parse_time(v) for v in values)
        elif key == "until":
            ok = all(fact["received"] <= parse_time(v) for v in values)
        else:
            ok = fact[key] in values
        if not ok:
            return False
    return True


@pytest.fixture
def timeline(incident, ingest_file, fixtures_dir, tmp_path) -> list[dict]:
    """The incident with both fixture logs and one extra request on a subresource of pods
    (``pods/log``, cloned from a fixture event); returns the facts of every event."""
    events = []
    for name in LOGS:
        path = fixtures_dir / "audit" / name
        events += read_events(path)
        assert ingest_file(incident, path).status == "done"
    template = next(e for e in read_events(fixtures_dir / "audit" / LOGS[0])
                    if (e.get("objectRef") or {}).get("resource") == "pods"
                    and e["verb"] == "list")
    extra = json.loads(json.dumps(template))
    extra["auditID"] = EXTRA_AUDIT_ID
    extra["verb"] = "get"
    extra["objectRef"]["subresource"] = "log"
    extra["objectRef"]["name"] = "web-0"
    extra_path = tmp_path / "extra.log"
    extra_path.write_text(json.dumps(extra) + "\n", encoding="utf-8")
    assert ingest_file(incident, extra_path).status == "done"
    events.append(extra)
    return [facts(e) for e in events]


def all_results(get, url, params) -> list[dict]:
    """Every page of a cursor-paginated list."""
    response = get(url, {**params, "page_size": 1000})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["next"] is None
    return body["results"]


# --- filters -----------------------------------------------------------------------------------

FILTER_CASES = [
    {"resource": ["pods"]},
    {"resource": ["catalogsources"]},
    {"subresource": ["status"]},
    {"subresource": ["log"]},
    {"name": ["certified-operators"]},
    {"name": ["web-0", "multus-admission-controller"]},
    {"namespace": ["default"]},
    {"namespace": ["default", "ns1"]},
    {"user": ["system:admin"]},
    {"user": ["system:serviceaccount:openshift-operator-lifecycle-manager:"
              "olm-operator-serviceaccount"]},
    {"impersonated_user": ["bob"]},
    {"impersonated_user": ["alice", "system:serviceaccount:ns1:sa1"]},
    {"verb": ["list"]},
    {"verb": ["create", "update", "patch"]},
    {"code": ["403"]},
    {"code": ["200", "201"]},
    {"group": ["system:masters"]},
    {"group": ["system:serviceaccounts:openshift-cluster-version", "system:masters"]},
    {"verb": ["list"], "impersonated_user": ["bob"], "code": ["403"]},
    {"resource": ["pods"], "namespace": ["default"], "verb": ["get"]},
    {"namespace": ["openshift-marketplace"], "code": ["200"]},
    {"user": ["nobody"]},
    # "(none)": the events without a value of the field, alone or beside values
    {"namespace": ["(none)"]},
    {"subresource": ["(none)", "log"]},
    {"impersonated_user": ["(none)", "bob"], "verb": ["get"]},
    {"name": ["(none)"], "resource": ["pods"]},
    {"group": ["(none)", "system:masters"]},
]


@pytest.mark.parametrize("params", FILTER_CASES, ids=lambda p: "&".join(
    f"{k}={v}" for k, vs in p.items() for v in vs))
def test_filter_returns_exactly_the_matching_events(api, incident, timeline, params):
    expected = sorted(f["audit_id"] for f in timeline if matches(f, params))

    results = all_results(api, EVENTS_URL.format(incident.pk), params)

    assert sorted(r["audit_id"] for r in results) == expected


def test_every_filter_case_is_meaningful(timeline):
    """The cases above must select something, and less than everything (except the
    deliberate miss), or they would not test a filter."""
    for params in FILTER_CASES:
        selected = sum(matches(f, params) for f in timeline)
        if params == {"user": ["nobody"]}:
            assert selected == 0
        else:
            assert 0 < selected < len(timeline), params


def test_resource_matches_whatever_the_subresource(api, incident, timeline):
    expected = {f["audit_id"]: f["subresource"] for f in timeline if f["resource"] == "pods"}
    assert "" in expected.values() and "log" in expected.values()  # both kinds are there

    results = all_results(api, EVENTS_URL.format(incident.pk), {"resource": "pods"})

    assert {r["audit_id"]: r["subresource"] for r in results} == expected


def test_repeated_parameter_ors_and_different_parameters_and(api, incident, timeline):
    url = EVENTS_URL.format(incident.pk)
    lists = {r["audit_id"] for r in all_results(api, url, {"verb": "list"})}
    creates = {r["audit_id"] for r in all_results(api, url, {"verb": "create"})}
    either = {r["audit_id"] for r in all_results(api, url, {"verb": ["list", "create"]})}
    forbidden = {r["audit_id"] for r in all_results(api, url, {"code": "403"})}
    both = {r["audit_id"] for r in all_results(api, url, {"verb": "list", "code": "403"})}

    assert lists and creates and forbidden
    assert either == lists | creates
    assert both == lists & forbidden
    assert both and both != lists and both != forbidden


def _stamps(timeline):
    counts: dict[datetime, int] = {}
    for fact in timeline:
        counts[fact["received"]] = counts.get(fact["received"], 0) + 1
    return counts


def test_since_and_until_include_their_ends(api, incident, timeline):
    url = EVENTS_URL.format(incident.pk)
    counts = _stamps(timeline)
    # a moment shared by several requests, and one to the microsecond
    crowded = max(counts, key=counts.get)
    assert counts[crowded] > 1
    precise = next(t for t in counts if t.microsecond)

    for moment in (crowded, precise):
        stamp = moment.isoformat().replace("+00:00", "Z")
        exact = {f["audit_id"] for f in timeline if f["received"] == moment}
        at = all_results(api, url, {"since": stamp, "until": stamp})
        assert {r["audit_id"] for r in at} == exact
        since = all_results(api, url, {"since": stamp})
        assert {r["audit_id"] for r in since} == {
            f["audit_id"] for f in timeline if f["received"] >= moment}
        until = all_results(api, url, {"until": stamp})
        assert {r["audit_id"] for r in until} == {
            f["audit_id"] for f in timeline if f["received"] <= moment}


def test_since_until_accept_rfc3339_offsets(api, incident, timeline):
    url = EVENTS_URL.format(incident.pk)
    moment = max(_stamps(timeline), key=_stamps(timeline).get)
    # the same instant written in +02:00
    local = moment.astimezone(timezone.get_fixed_timezone(120)).isoformat()
    assert local.endswith("+02:00")
    window_end = (moment + timedelta(minutes=2)).isoformat().replace("+00:00", "Z")

    results = all_results(api, url, {"since": local, "until": window_end})

    assert sorted(r["audit_id"] for r in results) == sorted(
        f["audit_id"] for f in timeline
        if moment <= f["received"] <= moment + timedelta(minutes=2))


@pytest.mark.parametrize("params", [{"code": "abc"}, {"since": "yesterday"},
                                    {"until": "2024-13-45T00:00:00Z"}])
def test_bad_filter_value_is_400(api, incident, timeline, params):
    response = api(EVENTS_URL.format(incident.pk), params)

    assert response.status_code == 400
    assert next(iter(params)) in response.json()


# --- pagination and fields ---------------------------------------------------------------------

def test_cursor_pagination_walks_every_event_once_in_time_order(api, incident, timeline):
    url = EVENTS_URL.format(incident.pk)
    seen: list[dict] = []
    pages = 0
    response = api(url, {"page_size": 7})
    while True:
        assert response.status_code == 200
        body = response.json()
        assert len(body["results"]) <= 7
        seen += body["results"]
        pages += 1
        if body["next"] is None:
            break
        assert pages < 100, "pagination does not end"
        response = api(body["next"])

    assert pages == -(-len(timeline) // 7)
    ids = [r["id"] for r in seen]
    assert len(ids) == len(set(ids)) == len(timeline)
    assert {r["audit_id"] for r in seen} == {f["audit_id"] for f in timeline}
    received = {f["audit_id"]: f["received"] for f in timeline}
    keys = [(received[r["audit_id"]], r["id"]) for r in seen]
    assert keys == sorted(keys)
    # ties on received exist and were walked across pages without loss
    assert len(set(received.values())) < len(timeline)


def test_results_carry_the_required_fields_from_the_fixture(api, incident, timeline):
    by_id = {f["audit_id"]: f for f in timeline}

    results = all_results(api, EVENTS_URL.format(incident.pk), {})

    assert len(results) == len(timeline)
    for result in results:
        assert REQUIRED_FIELDS <= set(result), REQUIRED_FIELDS - set(result)
        fact = by_id[result["audit_id"]]
        assert result["user"] == fact["user"]
        assert result["impersonated_user"] == fact["impersonated_user"]
        for key in ("verb", "resource", "subresource", "namespace", "name", "code",
                    "user_agent"):
            assert result[key] == fact[key], key
        assert parse_time(result["received"]) == fact["received"]
        raw = fact["raw"]
        if raw.get("stageTimestamp"):
            completed = parse_time(raw["stageTimestamp"])
            assert parse_time(result["completed"]) == completed
            assert result["duration_ms"] == pytest.approx(
                (completed - fact["received"]).total_seconds() * 1000)
        assert result["source"] in (*LOGS, "extra.log")


def test_user_is_the_authenticated_user_and_impersonation_is_separate(api, incident, timeline):
    impersonating = [f for f in timeline if f["impersonated_user"]]
    assert impersonating  # the demo log has impersonation

    results = all_results(api, EVENTS_URL.format(incident.pk), {"impersonated_user": "bob"})

    assert results
    assert {r["user"] for r in results} == {
        f["user"] for f in impersonating if f["impersonated_user"] == "bob"}
    assert all(r["impersonated_user"] == "bob" for r in results)
    assert all(r["user"] != "bob" for r in results)
    # filtering by user finds the authenticated user, not the impersonated one
    assert all_results(api, EVENTS_URL.format(incident.pk), {"user": "bob"}) == []


# --- authentication and visibility -------------------------------------------------------------

def test_no_token_is_401(api, incident):
    response = api(EVENTS_URL.format(incident.pk), key=None)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Token")


def test_wrong_token_is_401(api, incident):
    assert api(EVENTS_URL.format(incident.pk), key="hs_not-a-real-key").status_code == 401


def test_expired_token_is_401(api, incident, owner):
    _, key = ApiToken.issue(owner, expires_at=timezone.now() - timedelta(seconds=1))

    response = api(EVENTS_URL.format(incident.pk), key=key)

    assert response.status_code == 401


def test_token_that_expires_later_works(api, incident, owner, timeline):
    _, key = ApiToken.issue(owner, expires_at=timezone.now() + timedelta(hours=1))

    assert api(EVENTS_URL.format(incident.pk), key=key).status_code == 200


def test_token_of_an_inactive_user_is_401(api, incident, owner, token_for):
    key = token_for(owner)
    owner.is_active = False
    owner.save()

    assert api(EVENTS_URL.format(incident.pk), key=key).status_code == 401


def test_teammate_viewer_may_read_events(api, incident, teammate, token_for, timeline):
    response = api(EVENTS_URL.format(incident.pk), {"page_size": 1000},
                   key=token_for(teammate))

    assert response.status_code == 200
    assert len(response.json()["results"]) == len(timeline)


def test_outsider_gets_404_for_another_teams_incident(api, incident, outsider, token_for,
                                                      timeline):
    key = token_for(outsider)

    assert api(EVENTS_URL.format(incident.pk), key=key).status_code == 404
    event = Event.objects.filter(incident=incident).first()
    assert api(f"/api/v1/events/{event.pk}/", key=key).status_code == 404
    assert api(f"/api/v1/incidents/{incident.pk}/", key=key).status_code == 404


def test_superuser_sees_a_teamless_incident_others_do_not(api, superuser, owner, token_for,
                                                          ingest_file, fixtures_dir):
    orphan = Incident.objects.create(title="made by manage.py, no team")
    path = fixtures_dir / "audit" / "openshift-requestresponse.log"
    ingest_file(orphan, path)

    response = api(EVENTS_URL.format(orphan.pk), key=token_for(superuser))

    assert response.status_code == 200
    assert sorted(r["audit_id"] for r in response.json()["results"]) == sorted(
        e["auditID"] for e in read_events(path))
    assert api(EVENTS_URL.format(orphan.pk), key=token_for(owner)).status_code == 404


def test_unknown_incident_is_404(api, incident):
    assert api(EVENTS_URL.format(incident.pk + 1000)).status_code == 404


# --- one event with its body -------------------------------------------------------------------

def test_event_detail_returns_the_stored_body(api, incident, timeline, fixtures_dir):
    originals = {e["auditID"]: e for e in read_events(fixtures_dir / "audit" / LOGS[1])}
    for event in Event.objects.filter(incident=incident, audit_id__in=list(originals)):
        response = api(f"/api/v1/events/{event.pk}/")
        assert response.status_code == 200
        body = response.json()
        assert body["id"] == event.pk
        assert body["incident"] == incident.pk
        assert body["body"] == originals[event.audit_id]


def test_event_detail_body_is_redacted(api, incident, ingest_file, fixtures_dir):
    path = fixtures_dir / "audit" / "falco" / "create_configmap_sensitive_values.json"
    ingest_file(incident, path)
    events = list(Event.objects.filter(incident=incident))
    assert len(events) == len(read_events(path))

    for event in events:
        response = api(f"/api/v1/events/{event.pk}/")
        assert response.status_code == 200
        text = response.content.decode()
        assert "MY-KEY" not in text
        body = response.json()["body"]
        assert body["auditID"] == event.audit_id
        assert "[REDACTED]" in body["requestObject"]["data"]["access.properties"]


def test_event_detail_needs_a_token(api, incident, timeline):
    event = Event.objects.filter(incident=incident).first()

    assert api(f"/api/v1/events/{event.pk}/", key=None).status_code == 401
