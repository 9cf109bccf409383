"""Request time statistics (``/api/v1/incidents/{id}/stats/``, ``…/stats/inflight/`` and the
statistics page): checked against the fixture files read with json, and the column index
against the database, value for value."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import datetime, timedelta

import numpy as np
import pytest
from django.core.cache import cache
from django.http import QueryDict
from django.test import Client

from timelines.analysis import stats
from timelines.parsers.base import Row
from timelines.reads import facets
from timelines.store import aggregate, columns

from .test_figure_api import T0, _store

pytestmark = pytest.mark.django_db

URL = "/api/v1/incidents/{}/stats/"
FIELD = {"user": "user", "user_agent": "user_agent", "verb": "verb", "resource": "resource",
         "namespace": "namespace", "code": "code"}


@pytest.fixture(autouse=True)
def _own_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": "stats-tests"}}
    cache.clear()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def file_requests(path) -> list[dict]:
    """The requests of an audit log as its JSON lines say them: one line per request here (both
    fixtures hold the ResponseComplete stage only); duration from requestReceivedTimestamp to
    stageTimestamp, or 0 where the line has one ``timestamp``."""
    requests = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        assert event["stage"] == "ResponseComplete"
        received = _time(event.get("requestReceivedTimestamp") or event["timestamp"])
        completed = _time(event.get("stageTimestamp") or event["timestamp"])
        ref = event.get("objectRef", {})
        requests.append({
            "user": event["user"]["username"], "user_agent": event.get("userAgent", ""),
            "verb": event["verb"], "resource": ref.get("resource", ""),
            "namespace": ref.get("namespace", ""),
            "code": event.get("responseStatus", {}).get("code"),
            "received": received, "us": (completed - received) // timedelta(microseconds=1)})
    return requests


def nearest_rank(sorted_us: list[int], percent: int) -> float:
    """The ⌈p·n⌉-th shortest, in exact integer arithmetic."""
    rank = max(-(-percent * len(sorted_us) // 100), 1)
    return sorted_us[rank - 1] / 1000


def expected(requests: list[dict], by: str) -> list[dict]:
    groups = defaultdict(list)
    for request in requests:
        groups[request[by]].append(request)
    rows = []
    for key, members in groups.items():
        done = sorted(r["us"] for r in members if r["us"] is not None)
        rows.append({
            "key": key, "requests": len(members), "total_ms": sum(done) / 1000,
            "p50_ms": nearest_rank(done, 50) if done else None,
            "p95_ms": nearest_rank(done, 95) if done else None,
            "max_ms": done[-1] / 1000 if done else None,
            "errors": sum((r["code"] or 0) >= 400 for r in members)})
    return sorted(rows, key=lambda r: (-r["total_ms"], r["key"] is None,
                                       r["key"] if r["key"] is not None else 0))


def get(client, incident, query: str = "", status: int = 200):
    answer = client.get(f"{URL.format(incident.pk)}?{query}")
    assert answer.status_code == status, answer.content[:300]
    return answer.json()


OPENSHIFT = "openshift-requestresponse.log"


@pytest.fixture
def fixture_log():
    from conftest import FIXTURES

    return FIXTURES / "audit" / OPENSHIFT


@pytest.mark.parametrize("by", list(stats.BY))
@pytest.mark.parametrize("log", ["demo", "openshift"])
def test_each_group_is_what_the_log_file_says(incident, ingest_file, demo_log, fixture_log,
                                              client, owner, by, log):
    path = demo_log if log == "demo" else fixture_log
    ingest_file(incident, path)
    client.force_login(owner)
    requests = file_requests(path)

    answer = get(client, incident, f"by={by}")

    assert answer["results"] == expected(requests, FIELD[by])
    assert answer["requests"] == len(requests)
    assert answer["keys"] == len(answer["results"])


def test_the_openshift_log_has_times_to_rank(fixture_log):
    # the comparison above proves something only if durations differ
    assert len({r["us"] for r in file_requests(fixture_log)}) > 2


def test_filters_narrow_the_requests_as_in_the_events_list(incident, ingest_file, demo_log,
                                                           client, owner):
    ingest_file(incident, demo_log)
    client.force_login(owner)
    requests = [r for r in file_requests(demo_log)
                if r["verb"] in ("list", "get") and r["received"] >= _time("2017-09-11T20:00:00Z")]
    answer = get(client, incident, "by=code&verb=list&verb=get&since=2017-09-11T20:00:00Z")
    assert answer["results"] == expected(requests, "code")
    assert 0 < answer["requests"] < len(file_requests(demo_log))


def test_a_bad_by_or_limit_is_a_400_naming_what_is_allowed(incident, client, owner):
    client.force_login(owner)
    answer = get(client, incident, "by=colour", status=400)
    assert "user, user_agent, verb, resource, namespace, code" in str(answer["by"])
    assert "whole number" in str(get(client, incident, "limit=-1", status=400)["limit"])
    assert get(client, incident, "code=abc", status=400)["code"]


def test_only_those_who_see_the_incident_read_it(incident, ingest_file, demo_log, outsider,
                                                 teammate):
    ingest_file(incident, demo_log)
    as_outsider, as_teammate = Client(), Client()
    as_outsider.force_login(outsider)
    as_teammate.force_login(teammate)
    for path in ("stats/?by=verb", "stats/inflight/?by=verb"):
        url = f"/api/v1/incidents/{incident.pk}/{path}"
        assert as_outsider.get(url).status_code == 404
        assert Client().get(url).status_code in (401, 403)
        assert as_teammate.get(url).status_code == 200
    assert as_outsider.get(f"/incidents/{incident.pk}/stats/").status_code == 404
    assert as_teammate.get(f"/incidents/{incident.pk}/stats/?verb=get").status_code == 200
    assert Client().get(f"/incidents/{incident.pk}/stats/").status_code == 302  # to log in


# --- the column index and the database -----------------------------------------------------------

def _timed_rows(count: int = 3000, seed: int = 11) -> list[Row]:
    """Requests of varied durations (ties included), open ones, failures, and Events and log
    lines, which the statistics leave out."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        received = T0 + timedelta(microseconds=rng.randrange(600_000_000))
        shape = rng.random()
        fields = {"verb": rng.choice(["get", "list", "watch", "create", "patch"]),
                  "username": rng.choice(["alice", "bob", "system:node:n1", "ci-bot", ""]),
                  "user_agent": rng.choice(["kubectl/v1.30", "", "kubelet/v1.29", "helm"]),
                  "resource": rng.choice(["pods", "configmaps", "", "leases"]),
                  "namespace": rng.choice(["shop", "kube-system", ""]),
                  "source": rng.choice(["node-1.log", "node-2.log"]),
                  "code": rng.choice([200, 200, 200, 201, 404, 409, 500]),
                  "name": rng.choice(["", "obj-1", "obj-12", "web"])}
        if shape < 0.8:
            length = timedelta(microseconds=int(rng.lognormvariate(8, 2)) // 50 * 50)
            fields["completed"] = received + length
        elif shape < 0.85:
            fields.update(completed=None, code=None)
        elif shape < 0.93:
            fields.update(kind="event", completed=received, username="", verb="", code=None,
                          reason="BackOff")
        else:
            fields.update(kind="log", completed=received + timedelta(seconds=3), username="",
                          verb="", code=None, message="x")
        rows.append(Row(audit_id=f"t-{n}", received=received, raw=b"{}", **fields))
    # a group whose requests never completed
    rows += [Row(audit_id=f"o-{n}", received=T0 + timedelta(seconds=n), raw=b"{}",
                 username="stuck", verb="watch", completed=None) for n in range(3)]
    return rows


QUERIES = ["", "user=alice&user=bob", "verb=list&code=200", "kind=event",
           "resource=pods&namespace=shop", "since=2024-03-01T12:02:00Z",
           "since=2024-03-01T12:01:40Z&until=2024-03-01T12:05:00.000001Z&verb=list",
           "user=nobody", "source=node-2.log&user_agent=helm", "q=obj-1", "q=OBJ&verb=get",
           "q=no-such-text"]


@pytest.fixture
def indexed(incident):
    _store(incident, _timed_rows())
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    return incident, version


def _rows_counted_in_python(incident, by: str) -> list[dict]:
    from timelines.models import Event

    column = stats.BY[by]
    requests = [{"key": key, "us": None if done is None else
                 (done - start) // timedelta(microseconds=1), "code": code}
                for key, start, done, code in Event.objects.filter(
                    incident=incident, kind="audit").values_list(
                    column, "received", "completed", "code")]
    return expected(requests, "key")


@pytest.mark.parametrize("by", list(stats.BY))
def test_the_index_answers_as_the_database_does(indexed, by):
    incident, version = indexed
    totals = set()
    for query in QUERIES:
        params = QueryDict(f"{query}&by={by}")
        assert isinstance(facets.select(incident, params, version=version, fields=[by]),
                          facets.IndexSelection)
        by_index = stats.stats(incident, params, version=version)
        by_database = stats.stats(incident, params, version=None)
        assert by_index == by_database, query
        totals.add(by_index["requests"])
        assert stats.inflight(incident, params, version=version) == \
            stats.inflight(incident, params, version=None), query
        # PostgreSQL's rows (read in one pass, or one by one) ranked in Python: the same
        queryset = facets.select(incident, params, version=None).queryset
        for rows in (stats._postgres_rows(queryset, stats.BY[by]),
                     stats._database_rows(queryset, stats.BY[by])):
            group, _, duration, done, failed, keys = rows
            assert stats.group_stats(group, duration, done, failed, keys) == \
                by_database["results"], query
    assert len(totals) >= len(QUERIES) - 3  # the queries do select different requests


@pytest.mark.parametrize("by", ["user", "code"])
def test_the_index_answers_as_the_rows_counted_in_python(indexed, by):
    incident, version = indexed
    answer = stats.stats(incident, QueryDict(f"by={by}"), version=version)
    assert answer["results"] == _rows_counted_in_python(incident, by)
    stuck = [r for r in answer["results"] if r["key"] == "stuck"]
    assert not stuck or stuck[0] == {"key": "stuck", "requests": 3, "total_ms": 0.0,
                                     "p50_ms": None, "p95_ms": None, "max_ms": None,
                                     "errors": 0}


def test_the_api_answers_from_the_index_without_asking_the_database(indexed, client, owner,
                                                                    monkeypatch):
    incident, _ = indexed
    client.force_login(owner)
    by_database = get(client, incident, "by=verb&user=alice")
    cache.clear()

    def fail(*args, **kwargs):
        raise AssertionError("the database was asked")

    monkeypatch.setattr(stats, "_postgres_stats", fail)
    monkeypatch.setattr(stats, "_database_rows", fail)
    monkeypatch.setattr(stats, "_postgres_rows", fail)
    assert get(client, incident, "by=verb&user=alice") == by_database
    # the free text is answered from the index too; the groups by the database
    assert get(client, incident, "by=verb&q=obj-1")["requests"] > 0
    with pytest.raises(AssertionError, match="database was asked"):
        client.get(URL.format(incident.pk), {"by": "verb", "group": "system:masters"})


def test_answers_are_cached_until_the_evidence_changes(incident, client, owner):
    _store(incident, [Row(audit_id=f"a{n}", received=T0 + timedelta(seconds=n), raw=b"{}",
                          username="alice", completed=T0 + timedelta(seconds=n, milliseconds=5))
                      for n in range(4)])
    client.force_login(owner)
    first = get(client, incident, "by=user")
    from timelines.models import Event

    Event.objects.filter(incident=incident).delete()  # behind the cache's back
    assert get(client, incident, "by=user") == first
    _store(incident, [Row(audit_id="b", received=T0, raw=b"{}", username="bob",
                          completed=T0 + timedelta(milliseconds=7))])
    assert [r["key"] for r in get(client, incident, "by=user")["results"]] == ["bob"]


@pytest.mark.parametrize("path", ["select", "sort", "lexsort"])
def test_each_way_of_ranking_gives_the_nearest_rank_percentiles(monkeypatch, path):
    """Few keys: a selection per key; many: one sort (of a combined key, or by lexsort when
    the durations span too much to combine)."""
    rng = np.random.default_rng(5)
    group = rng.integers(0, 7, 4000)
    duration = rng.integers(0, 50, 4000) * 1000  # many ties
    if path == "lexsort":
        duration[0] = 2**61
    done = rng.random(4000) < 0.9
    failed = rng.random(4000) < 0.1
    if path != "select":
        monkeypatch.setattr(stats, "SELECT_KEYS", 0)
    keys = [f"k{g}" for g in range(7)]
    requests = [{"key": keys[g], "us": int(d) if ok else None, "code": 500 if bad else 200}
                for g, d, ok, bad in zip(group, duration, done, failed, strict=True)]
    assert stats.group_stats(group, duration, done, failed, keys) == expected(requests, "key")


# --- in flight ----------------------------------------------------------------------------------

def test_in_flight_is_the_time_in_flight_in_each_bin_over_its_width():
    rng = np.random.default_rng(3)
    received = rng.integers(0, 10_000_000, 500)
    completed = received + rng.integers(0, 3_000_000, 500)
    group = rng.integers(0, 4, 500)
    keys = ["a", "b", "c", "d"]
    answer = stats.in_flight(group, received, completed, keys, bins=20, top=2)
    width = answer["width_ms"] * 1000
    first = received.min()
    brute = np.zeros((4, answer["bins"]))
    for g, r, c in zip(group, received, completed, strict=True):
        for b in range(answer["bins"]):
            low, high = first + b * width, first + (b + 1) * width
            brute[g, b] += max(0, min(c, high) - max(r, low))
    brute /= width
    ranked = sorted(range(4), key=lambda g: (-brute[g].sum(), keys[g]))
    assert [s["key"] for s in answer["series"]] == [keys[g] for g in ranked[:2]] + ["(others)"]
    for series, g in zip(answer["series"], ranked[:2], strict=False):
        assert series["mean"] == pytest.approx(brute[g], abs=1e-3)
        assert series["requests"] == int((group == g).sum())
    assert answer["series"][2]["mean"] == pytest.approx(brute[ranked[2:]].sum(axis=0), abs=2e-3)


def test_in_flight_of_the_log_counts_each_request_once(incident, ingest_file, fixture_log,
                                                        client, owner):
    ingest_file(incident, fixture_log)
    client.force_login(owner)
    requests = file_requests(fixture_log)
    answer = client.get(f"/api/v1/incidents/{incident.pk}/stats/inflight/?by=verb&top=50").json()
    assert sum(s["requests"] for s in answer["series"]) == len(requests)
    # the time in flight of all bins is the requests' total time
    total_us = sum(sum(s["mean"]) for s in answer["series"]) * answer["width_ms"] * 1000
    assert total_us == pytest.approx(sum(r["us"] for r in requests), rel=1e-3, abs=5)


# --- embedded ------------------------------------------------------------------------------------

@pytest.mark.embedded
def test_sqlite_answers_as_the_log_file_says(incident, ingest_file, fixture_log, client, owner):
    ingest_file(incident, fixture_log)
    client.force_login(owner)
    for by in ("user", "verb", "code"):
        assert get(client, incident, f"by={by}")["results"] == \
            expected(file_requests(fixture_log), FIELD[by])


@pytest.mark.embedded
def test_sqlite_and_its_index_agree(incident):
    _store(incident, _timed_rows(count=800))
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    for query in ("by=user", "by=code&verb=list", "by=namespace&until=2024-03-01T12:04:00Z"):
        params = QueryDict(query)
        assert stats.stats(incident, params, version=version) == \
            stats.stats(incident, params, version=None)
        assert stats.inflight(incident, params, version=version) == \
            stats.inflight(incident, params, version=None)


# --- the page ------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_page_shows_the_table_and_charts_and_a_row_opens_its_timeline(
        open_page, owner, incident, ingest_file, fixture_log):
    from conftest import SCREENSHOTS
    from hindsight.testing import page_query

    ingest_file(incident, fixture_log)
    wanted = expected([r for r in file_requests(fixture_log) if r["code"] == 200], "user")
    assert len(wanted) > 2
    # from the incident page, filtered: its Analysis link carries the filters
    page = open_page(owner, f"/incidents/{incident.pk}/?code=200")
    page.click("#analysis-nav a[data-carry-filters]")
    page.wait_for_selector("#stats-table tbody tr td a")
    assert page_query(page) == {"code": ["200"]}
    shown = page.eval_on_selector_all("#stats-table tbody tr", """trs => trs.map(tr => [
        tr.cells[0].textContent, Number(tr.cells[1].textContent.replace(/,/g, '')),
        Number(tr.cells[2].textContent.replace(/,/g, '')), Number(tr.cells[6].textContent)])""")
    assert shown == [[r["key"], r["requests"], r["total_ms"], r["errors"]] for r in wanted]
    assert "code=200" in page.text_content("#stats-filters")
    # plotly drew the bars (one per key, the longest the widest) and the in-flight lines
    page.wait_for_selector("#stats-bars .bars path")
    page.wait_for_selector("#inflight-chart .scatterlayer path.js-line")
    bars = page.locator("#stats-bars .bars path")
    assert bars.count() == len(wanted)
    widths = [bars.nth(i).bounding_box()["width"] for i in range(bars.count())]
    assert max(widths) > 100 and widths[-1] == max(widths)  # drawn bottom up: the top key last
    assert page.locator("#inflight-chart .scatterlayer .trace").count() == len(wanted)
    page.screenshot(path=str(SCREENSHOTS / "stats-page.png"), full_page=True)
    # sorting by a column reorders the rows
    page.click("#stats-table th[data-sort=key]")
    keys = page.eval_on_selector_all("#stats-table tbody tr", "trs => trs.map(tr => "
                                     "tr.cells[0].textContent)")
    assert keys == sorted(r["key"] for r in wanted)
    first = wanted[0]["key"]
    page.click(f"#stats-table tbody tr[data-key='{first}'] td a")
    page.wait_for_load_state()
    assert page_query(page) == {"code": ["200"], "user": [first]}
    assert page.url.endswith("#timeline")
    page.wait_for_function("Number(document.getElementById('gantt').dataset.drawn || 0) >= 1")
    assert page.input_value("#filters input[name=user]") == first


def test_a_key_the_requests_lack_is_named_and_opens_its_timeline(open_page, owner, incident,
                                                                 ingest_file, demo_log):
    """The requests of cluster-scoped objects have no namespace: their row is "(none)", as the
    incident page's facets say it, and it links to the timeline of those requests."""
    from hindsight.testing import page_query

    ingest_file(incident, demo_log)
    without = [r for r in file_requests(demo_log) if r["namespace"] == ""]
    assert 0 < len(without) < len(file_requests(demo_log))
    page = open_page(owner, f"/incidents/{incident.pk}/stats/?by=namespace")
    row = page.locator("#stats-table tbody tr[data-key='(none)']")
    row.wait_for()
    assert row.locator("td").nth(1).text_content().replace(",", "") == str(len(without))

    row.locator("td a").click()
    page.wait_for_load_state()

    assert page_query(page) == {"namespace": ["(none)"]}
    page.wait_for_function("Number(document.getElementById('gantt').dataset.drawn || 0) >= 1")
    page.click("#window-reset")  # the page opens on the burst: the whole span
    page.wait_for_function(f"document.getElementById('gantt-status').textContent"
                           f".includes('{len(without)} events on')")
