"""The events list and the step endpoint narrowed by the column index (``timelines.web.api``
``narrowed``, ``index_query``): with an index and without one, every filter kind gives the same
events, page by page in both directions and step by step, and a value no event holds is
answered without reading the events."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.renderers import JSONRenderer

from timelines.models import Event
from timelines.store import aggregate, columns
from timelines.web.serializers import LIST_COLUMNS, EventSerializer, event_rows

from .test_figure_api import T0, _row, _store, _synthetic_rows

pytestmark = pytest.mark.django_db

URL = "/api/v1/incidents/{}/events/"


def _iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


# (query, which rows it keeps), the rows as ``Event.objects.values()`` gives them
QUERIES = [
    ({"user": "alice"}, lambda e: e["username"] == "alice"),
    ({"user": ["alice", "ci-bot"], "verb": "list"},
     lambda e: e["username"] in ("alice", "ci-bot") and e["verb"] == "list"),
    ({"verb": "delete"}, lambda e: e["verb"] == "delete"),
    ({"resource": "leases"}, lambda e: e["resource"] == "leases"),
    ({"namespace": "late"}, lambda e: e["namespace"] == "late"),  # only at the very end
    ({"namespace": "no-such-namespace"}, lambda e: False),
    ({"name": "tie-a"}, lambda e: e["name"] == "tie-a"),
    ({"name": "middle"}, lambda e: e["name"] == "middle"),  # one event, tied with others
    ({"code": "418"}, lambda e: e["code"] == 418),
    ({"code": "599"}, lambda e: False),
    ({"kind": "log", "source": "node-2.log"},
     lambda e: e["kind"] == "log" and e["source"] == "node-2.log"),
    ({"verb": "get", "since": _iso(120), "until": _iso(180)},
     lambda e: e["verb"] == "get" and T0 + timedelta(seconds=120) <= e["received"]
     <= T0 + timedelta(seconds=180)),
    ({"namespace": "late", "until": _iso(300)}, lambda e: False),
    # "(none)": the events without the field (an empty text, no code), alone or with values
    ({"namespace": "(none)"}, lambda e: e["namespace"] == ""),
    ({"code": ["(none)", "418"]}, lambda e: e["code"] in (None, 418)),
    ({"user": "(none)", "kind": "log"}, lambda e: e["username"] == "" and e["kind"] == "log"),
    ({"user_agent": "helm", "code": "200", "impersonated_user": "bob"},
     lambda e: e["user_agent"] == "helm" and e["code"] == 200
     and e["impersonated_user"] == "bob"),
]


@pytest.fixture
def indexed(incident, client, owner):
    """Synthetic evidence (tied times included) with a namespace only in its last seconds, a
    name and a code each on one event in the middle, tied with two others; index built."""
    rows = _synthetic_rows(count=800)
    rows += [_row(f"late-{n}", 590 + n, namespace="late", resource="pods", name=f"l{n}")
             for n in range(5)]
    rows += [_row(f"mid-{n}", 300.5, name="middle" if n == 1 else "m", code=418 if n == 1 else 200,
                  impersonated_user="bob" if n else "", user_agent="helm") for n in range(3)]
    _store(incident, rows)
    columns.build(incident.pk, aggregate.data_version(incident.pk))
    client.force_login(owner)
    return incident


def pages(client, incident, query: dict, *, page_size: int) -> tuple[list[int], list[int]]:
    """The ids of every page, following ``next`` from the first page to the last, then
    ``previous`` back to the first (each page's rows in the list's order)."""
    forward, pages_seen = [], []
    answer = client.get(URL.format(incident.pk), {**query, "page_size": page_size})
    while True:
        assert answer.status_code == 200, answer.content[:300]
        body = answer.json()
        ids = [event["id"] for event in body["results"]]
        forward += ids
        pages_seen.append(ids)
        if body["next"] is None:
            break
        answer = client.get(body["next"])
    backward = list(pages_seen[-1])
    while body["previous"] is not None:
        body = client.get(body["previous"]).json()
        backward = [event["id"] for event in body["results"]] + backward
    return forward, backward


def test_with_and_without_the_index_every_filter_gives_the_same_pages(indexed, client):
    incident = indexed
    events = list(Event.objects.filter(incident=incident).order_by("received", "id").values())
    assert columns.load(incident.pk, aggregate.data_version(incident.pk)) is not None
    by_index = {}
    for query, keep in QUERIES:
        wanted = [e["id"] for e in events if keep(e)]
        size = max(3, len(wanted) // 6)  # several pages each
        by_index[repr(query)] = pages(client, incident, query, page_size=size)
        assert by_index[repr(query)] == (wanted, wanted), query
    columns.discard(incident.pk)
    assert columns.load(incident.pk, aggregate.data_version(incident.pk)) is None
    for query, keep in QUERIES:
        size = max(3, len([e for e in events if keep(e)]) // 6)
        assert pages(client, incident, query, page_size=size) == by_index[repr(query)], query


def test_pages_are_the_same_when_the_index_is_read_in_small_blocks(indexed, client,
                                                                   monkeypatch):
    monkeypatch.setattr(columns, "_REACH_BLOCK", 5)
    monkeypatch.setattr(columns, "_REACH_BLOCK_MAX", 80)
    test_with_and_without_the_index_every_filter_gives_the_same_pages(indexed, client)


def test_reach_spans_the_nearest_matches_as_select_finds_them(indexed, monkeypatch):
    monkeypatch.setattr(columns, "_REACH_BLOCK", 3)
    monkeypatch.setattr(columns, "_REACH_BLOCK_MAX", 100)
    index = columns.load(indexed.pk, aggregate.data_version(indexed.pk))
    for filters in ({"user": ["alice"]}, {"namespace": ["late"]}, {"code": [418]},
                    {"verb": ["get"], "user": ["bob", "ci-bot"]}, {"name": ["tie-a"]}):
        times = index.times(index.select(filters, None, None))  # the matches, in time order
        assert times.size, filters
        points = [None, int(times[0]), int(times[times.size // 2]), int(times[-1]),
                  int(times[times.size // 3]) + 1]
        for count in (1, 2, 11, 300, 5000):
            for point in points:
                after = times if point is None else times[times > point]
                wanted = (int(after[0]), int(after[:count][-1])) if after.size else None
                assert index.reach(filters, None, None, count=count, after=point) == wanted
                if point is not None:
                    before = times[times < point][-count:]
                    wanted = (int(before[0]), int(before[-1])) if before.size else None
                    assert index.reach(filters, None, None, count=count, before=point) == wanted


def _event_queries(client, url: str, query: dict) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        answer = client.get(url, query)
    assert answer.status_code == 200, answer.content[:300]
    return [q["sql"] for q in captured.captured_queries if "timelines_event" in q["sql"]]


def test_a_value_no_event_holds_is_answered_without_reading_the_events(indexed, client):
    url = URL.format(indexed.pk)
    for query in ({"namespace": "no-such-namespace"}, {"code": "599"},
                  {"name": "middle", "verb": "watch"}, {"namespace": "late", "until": _iso(300)}):
        assert _event_queries(client, url, query) == [], query
        assert client.get(url, query).json()["results"] == []
    columns.discard(indexed.pk)  # without the index the database is asked, and finds nothing
    assert len(_event_queries(client, url, {"code": "599"})) == 1


def test_a_rare_value_is_looked_for_only_where_the_index_found_it(indexed, client):
    url = URL.format(indexed.pk)
    middle = Event.objects.get(incident=indexed, name="middle")
    [sql] = _event_queries(client, url, {"name": "middle"})
    assert sql.count('"timelines_event"."received" >=') == 1
    assert sql.count('"timelines_event"."received" <=') == 1
    assert str(middle.received.replace(tzinfo=None)) in sql
    # filters the index does not hold, or a window alone, go to the database as they are
    for query in ({"group": "system:masters"}, {"since": _iso(10)},
                  {"user": "alice", "group": "system:masters"}, {"audit_id": "req-3"}):
        [sql] = _event_queries(client, url, query)
        assert '"timelines_event"."received" <=' not in sql, query


def test_each_page_reads_only_the_time_its_rows_span(indexed, client):
    """A page of 10 reads from its first row to the one after its last (the paginator fetches
    one more to know whether a next page follows), whichever way the cursor goes."""
    url = URL.format(indexed.pk)
    alice = [str(t.replace(tzinfo=None)) for t in Event.objects.filter(
        incident=indexed, username="alice").order_by("received", "id")
        .values_list("received", flat=True)]
    [sql] = _event_queries(client, url, {"user": "alice", "page_size": 10})
    assert alice[0] in sql and alice[10] in sql and alice[11] not in sql
    second = client.get(url, {"user": "alice", "page_size": 10}).json()["next"]
    [sql] = _event_queries(client, second, {})
    assert alice[10] in sql and alice[20] in sql and alice[21] not in sql  # after alice[9]
    back = client.get(second).json()["previous"]
    [sql] = _event_queries(client, back, {})
    assert alice[0] in sql and alice[9] in sql and alice[11] not in sql  # before alice[10]


def test_an_upload_running_leaves_the_query_to_the_database(indexed, client):
    _store(indexed, [_row("more", 5, namespace="new")], finished=False)
    assert aggregate.data_version(indexed.pk) is None
    [sql] = _event_queries(client, URL.format(indexed.pk), {"namespace": "new"})
    assert '"timelines_event"."received" <=' not in sql
    assert [e["name"] for e in client.get(URL.format(indexed.pk), {"namespace": "new"})
            .json()["results"]] == [""]


# --- stepping (j/k) -----------------------------------------------------------------------------

STEP_URL = "/api/v1/incidents/{}/events/step/"


def _neighbours(events: list[dict], keep, anchor: dict | None) -> tuple[int | None, int | None]:
    """The ids of the first kept event after ``anchor`` and of the last before it, in
    ``(received, id)`` order (None: from the very start / end), as the step endpoint answers."""
    kept = [e for e in events if keep(e)]
    if anchor is None:
        return (kept[0]["id"] if kept else None), (kept[-1]["id"] if kept else None)
    at = (anchor["received"], anchor["id"])
    after = [e["id"] for e in kept if (e["received"], e["id"]) > at]
    before = [e["id"] for e in kept if (e["received"], e["id"]) < at]
    return (after[0] if after else None), (before[-1] if before else None)


def _step(client, incident, query: dict, **params) -> int | None:
    answer = client.get(STEP_URL.format(incident.pk), {**query, **params})
    assert answer.status_code == 200, answer.content[:300]
    event = answer.json()["event"]
    return event["id"] if event else None


def test_stepping_finds_the_same_neighbours_with_and_without_the_index(indexed, client,
                                                                         settings):
    """From every 40th event, from the events tied at one instant and from nowhere, the next
    and previous match of every filter kind, with the index and without (some 3,000 steps:
    past the API's rate limit, lifted here)."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "api": None}}
    events = list(Event.objects.filter(incident=indexed).order_by("received", "id").values())
    anchors = [None, *events[::40], *[e for e in events if e["name"] in ("middle", "m")],
               events[-1]]
    for indexed_now in (True, False):
        if not indexed_now:
            columns.discard(indexed.pk)
        assert (columns.load(indexed.pk, aggregate.data_version(indexed.pk)) is not None) \
            == indexed_now
        for query, keep in QUERIES:
            for anchor in anchors:
                after, before = _neighbours(events, keep, anchor)
                origin = {} if anchor is None else {"from": anchor["id"]}
                assert _step(client, indexed, query, direction="next", **origin) == after, \
                    (query, anchor and anchor["id"], indexed_now)
                assert _step(client, indexed, query, direction="previous", **origin) == before, \
                    (query, anchor and anchor["id"], indexed_now)


def test_stepping_to_a_value_no_event_holds_reads_no_event(indexed, client):
    url = STEP_URL.format(indexed.pk)
    first = Event.objects.filter(incident=indexed).order_by("received", "id").first()
    for params in ({"code": "599"}, {"namespace": "no-such-namespace", "direction": "previous"}):
        assert _event_queries(client, url, params) == [], params
        assert client.get(url, params).json()["event"] is None
    # from an event: it is read, then only the events at its own instant are looked at
    anchor, looked = _event_queries(client, url, {"code": "599", "from": first.pk})
    assert f"\"timelines_event\".\"received\" <= '{first.received.replace(tzinfo=None)}" in looked
    assert client.get(url, {"code": "599", "from": first.pk}).json()["event"] is None
    # a rare value is looked for no further than where the index found it
    middle = Event.objects.get(incident=indexed, name="middle")
    [sql] = _event_queries(client, url, {"name": "middle"})
    assert str(middle.received.replace(tzinfo=None)) in sql


# --- the list's rows ----------------------------------------------------------------------------

FIXTURE_FILES = ["audit/audit2rbac-demo.log", "audit/openshift-requestresponse.log",
                 "events/cribl-event-watch-stream.json", "events/kspan-deployment-2-pods.yaml",
                 "klog/kind-kube-apiserver.txt"]


def test_the_list_gives_each_event_as_the_serializer_does(incident, ingest_file, fixtures_dir,
                                                          client, owner):
    for name in FIXTURE_FILES:
        assert ingest_file(incident, fixtures_dir / name).status == "done", name
    client.force_login(owner)
    listed, url = [], f"{URL.format(incident.pk)}?page_size=1000"
    while url:
        body = client.get(url).json()
        listed += body["results"]
        url = body["next"]
    events = Event.objects.filter(incident=incident).order_by("received", "id")
    assert len(listed) == events.count()
    assert {e["kind"] for e in listed} >= {"audit", "event", "log"}
    for row, event in zip(listed, events, strict=True):
        old = dict(EventSerializer(event).data)
        assert list(row) == list(old), event.pk  # the same fields in the same order
        for field, value in old.items():
            assert row[field] == value and type(row[field]) is type(value), (event.pk, field)
    # rendered, the old rows and the new are the same bytes
    assert JSONRenderer().render(event_rows(events.values(*LIST_COLUMNS))) == \
        JSONRenderer().render(EventSerializer(events, many=True).data)
    # and they say what the log file says
    demo = [json.loads(line) for line in (fixtures_dir / FIXTURE_FILES[0]).read_text()
            .splitlines() if line.strip()]
    by_id = {e["audit_id"]: e for e in listed if e["kind"] == "audit"}
    for request in demo:
        row = by_id[request["auditID"]]
        assert (row["verb"], row["user"], row["code"], row["received"]) == (
            request["verb"], request["user"]["username"], request["responseStatus"]["code"],
            request["timestamp"])


# --- the same on SQLite (the embedded default) ------------------------------------------------

@pytest.mark.embedded
def test_sqlite_with_and_without_the_index_gives_the_same_pages(indexed, client):
    test_with_and_without_the_index_every_filter_gives_the_same_pages(indexed, client)


@pytest.mark.embedded
def test_sqlite_answers_a_value_no_event_holds_without_reading_the_events(indexed, client):
    test_a_value_no_event_holds_is_answered_without_reading_the_events(indexed, client)


@pytest.mark.embedded
def test_sqlite_list_gives_each_event_as_the_serializer_does(incident, ingest_file,
                                                             fixtures_dir, client, owner):
    test_the_list_gives_each_event_as_the_serializer_does(incident, ingest_file, fixtures_dir,
                                                          client, owner)
