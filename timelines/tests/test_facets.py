"""The facets endpoint (``/api/v1/incidents/{id}/facets/``): the values of a field among the
filtered events with their counts, checked against counts made independently (the fixture file
read with json, or the event rows counted in Python), from the column index and from the
database alike."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.http import QueryDict
from django.test import Client

from timelines.models import Event
from timelines.reads import facets
from timelines.store import aggregate, columns

from .test_figure_api import T0, _row, _store, _synthetic_rows

pytestmark = pytest.mark.django_db

URL = "/api/v1/incidents/{}/facets/"
# event column of each facet, for counting the rows in Python
COLUMN = {**columns.FILTER_COLUMNS, "group": "groups"}


@pytest.fixture(autouse=True)
def _own_cache(settings):
    """An empty cache of this module's own: answers are cached under keys naming incident ids,
    which a new test database gives out again."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": "facet-tests"}}
    cache.clear()


def demo_requests(path) -> list[dict]:
    """The requests of audit2rbac's demo log as the file says them (one line per request)."""
    requests = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        ref = event.get("objectRef", {})
        requests.append({
            "user": event["user"]["username"],
            "impersonated_user": event.get("impersonatedUser", {}).get("username", ""),
            "verb": event["verb"], "resource": ref.get("resource", ""),
            "namespace": ref.get("namespace", ""), "user_agent": event.get("userAgent", ""),
            "code": event.get("responseStatus", {}).get("code"),
            "group": event["user"].get("groups", []), "received": event["timestamp"]})
    return requests


def expected(records, field: str, *, limit: int = 1000, contains: str = "") -> list[dict]:
    """Values of ``field`` among ``records`` (dicts), most frequent first, ties by value."""
    counts, errors = Counter(), Counter()
    for record in records:
        values = record[field]
        for value in (set(values) or {""}) if isinstance(values, list) else [values]:
            if contains and (value is None or contains.lower() not in str(value).lower()):
                continue
            counts[value] += 1
            errors[value] += (record["code"] or 0) >= 400
    order = sorted(counts, key=lambda v: (-counts[v], v is None, v if v is not None else 0))
    return [{"value": v, "count": counts[v], "errors": errors[v]} for v in order][:limit]


def rows_of(incident) -> list[dict]:
    """Every event of the incident with its facet fields, read as plain rows."""
    names = list(dict.fromkeys([*COLUMN.values(), "received", "completed", "request_uri",
                                "message"]))
    records = []
    for row in Event.objects.filter(incident=incident).values(*names):
        record = {field: row[column] for field, column in COLUMN.items()}
        record.update(received=row["received"], open=row["completed"] is None, text=" ".join(
            (row["request_uri"], row["message"], row["name"])).lower())
        records.append(record)
    return records


def get(client, incident, query: str = "", status: int = 200) -> dict:
    answer = client.get(f"{URL.format(incident.pk)}?{query}")
    assert answer.status_code == status, answer.content[:300]
    return answer.json()


@pytest.fixture
def demo(incident, ingest_file, demo_log, client, owner):
    ingest_file(incident, demo_log)
    client.force_login(owner)
    return client


# --- counts --------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["user", "impersonated_user", "verb", "resource", "namespace",
                                   "user_agent", "code", "group"])
def test_each_value_is_counted_as_the_log_file_says(demo, incident, demo_log, field):
    requests = demo_requests(demo_log)

    answer = get(demo, incident, f"field={field}&limit=1000")

    assert answer["field"] == field
    assert answer["total"] == len(requests) == 37
    assert answer["values"] == expected(requests, field)
    assert answer["distinct"] == len(answer["values"])


def test_errors_count_the_answers_of_400_and_more(demo, incident, demo_log):
    answer = get(demo, incident, "field=impersonated_user")
    forbidden = Counter(r["impersonated_user"] for r in demo_requests(demo_log)
                        if r["code"] == 403)
    assert {v["value"]: v["errors"] for v in answer["values"]} == {
        v["value"]: forbidden[v["value"]] for v in answer["values"]}
    assert sum(v["errors"] for v in answer["values"]) == 11


@pytest.mark.parametrize("query, keep", [
    ("verb=list&verb=get&resource=pods", lambda r: r["verb"] in ("list", "get")
     and r["resource"] == "pods"),
    ("impersonated_user=bob&code=403", lambda r: r["impersonated_user"] == "bob"
     and r["code"] == 403),
    ("since=2017-09-11T20:01:30Z&until=2017-09-11T20:27:42Z",
     lambda r: datetime(2017, 9, 11, 20, 1, 30, tzinfo=UTC) <= r["received"]
     <= datetime(2017, 9, 11, 20, 27, 42, tzinfo=UTC)),
    ("q=PODS&q=default", lambda r: "pods" in r["text"] and "default" in r["text"]),
    ("group=system:masters&namespace=ns1", lambda r: "system:masters" in r["group"]
     and r["namespace"] == "ns1"),
    ("user=nobody", lambda r: False),
])
def test_the_filters_narrow_the_counts_as_in_the_events_list(demo, incident, query, keep):
    records = [r for r in rows_of(incident) if keep(r)]
    events = demo.get(f"/api/v1/incidents/{incident.pk}/events/?{query}&page_size=1000").json()

    for field in ("impersonated_user", "verb", "namespace", "code"):
        answer = get(demo, incident, f"{query}&field={field}")
        assert answer["total"] == len(records) == len(events["results"]), query
        assert answer["values"] == expected(records, field), (query, field)
    assert 0 < len(records) < 37 or query == "user=nobody"


def test_limit_contains_and_ties(incident, client, owner):
    users = ["b"] * 3 + ["a"] * 3 + ["C"] * 3 + ["Cd"] + ["d"] * 2
    _store(incident, [_row(n, n, username=u, code=404 if n % 2 else 200)
                      for n, u in enumerate(users)])
    client.force_login(owner)

    top = get(client, incident, "field=user&limit=2")
    narrowed = get(client, incident, "field=user&contains=c")
    codes = get(client, incident, "field=code&contains=40")

    assert [v["value"] for v in top["values"]] == ["C", "a"]  # ties by code point
    assert top["distinct"] == 5 and top["total"] == len(users)
    assert [(v["value"], v["count"]) for v in narrowed["values"]] == [("C", 3), ("Cd", 1)]
    assert narrowed["distinct"] == 2 and narrowed["total"] == len(users)
    assert [v["value"] for v in codes["values"]] == [404]
    assert get(client, incident, "field=user&limit=0")["values"] == []
    assert len(get(client, incident, "field=user&limit=99999")["values"]) == 5


def test_an_unknown_field_or_limit_is_a_400_naming_what_is_allowed(demo, incident):
    unknown = get(demo, incident, "field=password", status=400)
    missing = get(demo, incident, "", status=400)
    bad_limit = get(demo, incident, "field=user&limit=-1", status=400)
    bad_filter = get(demo, incident, "field=user&code=abc", status=400)

    assert unknown["field"].startswith("one of ")
    assert set(unknown["field"].removeprefix("one of ").split(", ")) == set(
        facets.FACET_FIELDS) >= {"user", "user_agent", "verb", "code", "group", "node"}
    assert missing == unknown
    assert "limit" in bad_limit and "code" in bad_filter


def test_group_counts_each_group_of_an_event_once(incident, client, owner):
    groups = [["system:masters", "system:authenticated"], ["system:authenticated"],
              ["a", "a"], [], ["system:authenticated", "b"]]
    _store(incident, [_row(n, n, groups=g, code=500 if n == 4 else 200)
                      for n, g in enumerate(groups)])
    client.force_login(owner)

    answer = get(client, incident, "field=group")

    counts = {v["value"]: (v["count"], v["errors"]) for v in answer["values"]}
    assert counts == {"system:authenticated": (3, 1), "system:masters": (1, 0), "a": (1, 0),
                      "b": (1, 1), "": (1, 0)}
    for value in ("system:authenticated", "a", "b"):
        assert counts[value][0] == Event.objects.filter(incident=incident,
                                                        groups__has=value).count()


# --- access --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["facets/?field=user", "overview/"])
def test_only_those_who_see_the_incident_read_it(incident, ingest_file, demo_log, outsider,
                                                 teammate, owner, path):
    ingest_file(incident, demo_log)
    url = f"/api/v1/incidents/{incident.pk}/{path}"
    as_outsider, as_teammate = Client(), Client()
    as_outsider.force_login(outsider)
    as_teammate.force_login(teammate)
    owner_client = Client()
    owner_client.force_login(owner)
    link = owner_client.post(f"/api/v1/incidents/{incident.pk}/share-links/", {},
                             content_type="application/json").json()["url"]
    holder = Client()
    assert holder.get(link.removeprefix("http://testserver")).status_code == 302

    assert as_outsider.get(url).status_code == 404
    assert Client().get(url).status_code in (401, 403)
    assert as_teammate.get(url).status_code == 200
    assert holder.get(url).status_code == 200
    assert holder.get(url).json() == as_teammate.get(url).json()


# --- the column index and the database -----------------------------------------------------------

QUERIES = ["", "user=alice&user=bob", "verb=get&code=200", "kind=event", "kind=log&kind=event",
           "resource=pods&namespace=shop", "since=2024-03-01T12:02:00Z",
           "since=2024-03-01T12:01:40Z&until=2024-03-01T12:05:00.000001Z&verb=list",
           "user=nobody", "source=node-2.log&user_agent=helm", "q=obj-1", "q=HEALTHZ&verb=get",
           "q=no-such-text", "namespace=(none)", "code=(none)",
           "user=(none)&user=alice&verb=get", "source=(none)&q=obj-1&verb=get"]


@pytest.fixture
def indexed(incident):
    """Mixed evidence (requests, Events, log lines, open spans) with its column index built."""
    rows = _synthetic_rows(count=2000)
    rows += [_row(f"open-{n}", n, resource="pods", name="o", completed=None, code=None)
             for n in range(7)]
    rows += [_row(f"fail-{n}", 30 + n, resource="pods", name="f", code=503 - n % 2 * 100)
             for n in range(9)]
    _store(incident, rows)
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    return incident, version


def test_the_index_counts_every_field_as_the_database_does(indexed):
    incident, version = indexed
    fields = [f for f in facets.FACET_FIELDS if f != "group"]
    totals = set()
    for query in QUERIES:
        params = QueryDict(query)
        assert isinstance(facets.select(incident, params, version=version, fields=fields),
                          facets.IndexSelection), query
        assert isinstance(facets.select(incident, params, version=None),
                          facets.DatabaseSelection)
        for field in fields:
            q = QueryDict(f"{query}&field={field}&limit=1000")
            by_index = facets.facets(incident, q, version=version)
            assert by_index == facets.facets(incident, q, version=None), (query, field)
            totals.add(by_index["total"])
    assert len(totals) >= len(QUERIES) - 1  # the queries do select different events


def test_the_index_counts_match_the_rows_counted_in_python(indexed):
    incident, version = indexed
    records = rows_of(incident)
    for field in ("user", "code", "kind", "name", "source"):
        answer = facets.facets(incident, QueryDict(f"field={field}&limit=1000"),
                               version=version)
        assert answer["values"] == expected(records, field)
        assert sum(v["count"] for v in answer["values"]) == len(records)


def test_the_api_answers_from_the_index_without_asking_the_database(indexed, client, owner,
                                                                    monkeypatch):
    incident, _ = indexed
    client.force_login(owner)
    by_database = get(client, incident, "field=verb&user=alice&since=2024-03-01T12:01:00Z")
    cache.clear()

    def fail(*args, **kwargs):
        raise AssertionError("the database was asked to count")

    monkeypatch.setattr(facets.DatabaseSelection, "value_counts", fail)
    assert get(client, incident, "field=verb&user=alice&since=2024-03-01T12:01:00Z") == \
        by_database
    # the free text is counted from the index too; the groups go to the database
    assert get(client, incident, "field=verb&q=healthz")["total"] == Event.objects.filter(
        incident=incident, request_uri__icontains="healthz").count() > 0
    with pytest.raises(AssertionError, match="asked to count"):
        client.get(URL.format(incident.pk), {"field": "group"})


def test_answers_are_cached_until_the_evidence_changes(incident, client, owner):
    _store(incident, [_row(n, n, username="alice") for n in range(5)])
    client.force_login(owner)
    first = get(client, incident, "field=user&lanes=object")  # a view parameter is ignored

    Event.objects.filter(incident=incident).delete()  # behind the cache's back
    assert get(client, incident, "field=user") == first
    _store(incident, [_row(f"b{n}", n, username="bob") for n in range(2)])  # a new upload
    assert get(client, incident, "field=user")["values"] == [
        {"value": "bob", "count": 2, "errors": 0}]


def test_an_upload_still_running_is_counted_by_the_database(incident, client, owner):
    _store(incident, [_row(n, n, username="alice") for n in range(3)])
    _store(incident, [_row(f"r{n}", 100 + n, username="bob") for n in range(2)],
           finished=False)
    client.force_login(owner)
    assert aggregate.data_version(incident.pk) is None
    assert get(client, incident, "field=user")["total"] == 5


# --- embedded ------------------------------------------------------------------------------------

@pytest.mark.embedded
def test_sqlite_counts_the_facets_of_the_log(demo, incident, demo_log):
    requests = demo_requests(demo_log)
    for field in ("impersonated_user", "code", "group", "resource"):
        answer = get(demo, incident, f"field={field}&since=2017-09-11T20:00:00Z")
        kept = [r for r in requests if r["received"] >= "2017-09-11T20:00:00Z"]
        assert answer["total"] == len(kept)
        assert answer["values"] == expected(kept, field), field


@pytest.mark.embedded
def test_sqlite_and_its_index_agree(incident):
    _store(incident, _synthetic_rows(count=500) + [
        _row("late", 900, completed=None, code=None, resource="pods")])
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    for query in ("field=user", "field=code&kind=audit", "field=name&until=" + (
            T0 + timedelta(minutes=3)).isoformat().replace("+00:00", "Z")):
        assert facets.facets(incident, QueryDict(query), version=version) == \
            facets.facets(incident, QueryDict(query), version=None)


def test_build_columns_indexes_the_large_incidents_that_have_no_index(incident, team,
                                                                      monkeypatch):
    """After an upgrade that changes the index format, the older indexes are not read: the
    command builds them again."""
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    from incidents.models import Incident

    small = Incident.objects.create(title="small", team=team)
    _store(incident, [_row(n, n) for n in range(150)])
    _store(small, [_row(n, n) for n in range(20)])
    version = aggregate.data_version(incident.pk)
    assert columns.load(incident.pk, version) is None
    out = StringIO()

    call_command("build_columns", stdout=out)

    assert columns.load(incident.pk, version).events == 150
    assert columns.load(small.pk, aggregate.data_version(small.pk)) is None
    assert out.getvalue().splitlines() == [f"incident {incident.pk}: indexed",
                                           f"incident {small.pk}: no index"]
