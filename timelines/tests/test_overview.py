"""The overview endpoint (``/api/v1/incidents/{id}/overview/``) and its suggested first window
(``timelines.reads.overview.suggest_window``, tested first without a database)."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.core.cache import cache
from django.http import QueryDict

from timelines.figures.build import EPOCH
from timelines.reads import facets
from timelines.reads.overview import overview, suggest_window
from timelines.store import aggregate, columns

from .test_facets import demo_requests, expected, rows_of
from .test_figure_api import T0, _row, _store, _synthetic_rows

URL = "/api/v1/incidents/{}/overview/"
MINUTE = 60_000_000  # µs
DAY = 24 * 60 * MINUTE


def us(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


def at(*moments) -> np.ndarray:
    return np.array(sorted(moments), dtype=np.int64)


def inside(times, suggestion) -> int:
    """Events within the suggested window, counted one by one."""
    return sum(suggestion.since <= t <= suggestion.until for t in times)


# --- the suggested window, without a database ----------------------------------------------------

def test_a_few_stragglers_years_away_are_left_out():
    rng = random.Random(1)
    start = us(datetime(2017, 9, 11, 19, 55, tzinfo=UTC))
    main = [start + rng.randrange(34 * MINUTE) for _ in range(30)]
    late = [us(datetime(2026, 1, 5, 3, tzinfo=UTC)) + n * MINUTE for n in range(3)]
    times = at(*main, *late)

    window = suggest_window(times)

    assert window is not None and window.reason == "gap"
    assert (window.events, window.outside) == (30, 3) == (inside(times, window), 3)
    assert window.since == min(main)  # clamped to the first event
    assert max(main) < window.until < max(main) + 34 * MINUTE // 10  # a little padding
    assert datetime.fromtimestamp(window.until / 1e6, UTC).year == 2017


def test_stragglers_on_both_sides_are_left_out():
    rng = random.Random(2)
    main = [10 * DAY + rng.randrange(20 * MINUTE) for _ in range(500)]
    times = at(0, 1, 5 * DAY, *main, 30 * DAY, 31 * DAY)

    window = suggest_window(times)

    assert (window.events, window.outside) == (500, 5)
    assert window.since <= min(main) and window.until >= max(main)
    assert window.until - window.since < 21 * MINUTE


def test_a_uniform_incident_is_shown_whole():
    rng = random.Random(3)
    assert suggest_window(at(*(rng.randrange(DAY) for _ in range(5000)))) is None
    assert suggest_window(at(*range(0, 100 * MINUTE, MINUTE // 2))) is None


def test_a_quiet_tail_of_days_after_a_burst_of_minutes_is_trimmed():
    rng = random.Random(4)
    burst = [rng.randrange(5 * MINUTE) for _ in range(10_000)]
    # 40 events over three days: no gap is longer than 5% of the span, so the events stay one
    # group and the 99% run does the trimming
    tail = [5 * MINUTE + n * (3 * DAY // 40) for n in range(1, 41)]
    times = at(*burst, *tail)

    window = suggest_window(times)

    assert window.reason == "dense"
    assert window.until < 6 * MINUTE and window.since <= 10_000_000
    assert window.outside == len(times) - inside(times, window) >= 40
    assert window.events >= 0.99 * len(times)


def test_a_few_events_days_later_are_split_off():
    rng = random.Random(5)
    burst = [rng.randrange(5 * MINUTE) for _ in range(1000)]
    times = at(*burst, DAY, 2 * DAY, 3 * DAY)

    window = suggest_window(times)

    assert (window.reason, window.events, window.outside) == ("gap", 1000, 3)


def test_a_phase_of_the_incident_is_not_hidden():
    """audit2rbac's demo log: 9 requests, 26 minutes of quiet, then 28 requests."""
    first = [us(datetime(2017, 9, 11, 19, 55, 5, tzinfo=UTC)) + n * 40_000_000 for n in range(9)]
    second = [us(datetime(2017, 9, 11, 20, 27, 42, tzinfo=UTC)) + n * 3_000_000
              for n in range(28)]
    assert suggest_window(at(*first, *second)) is None
    # with a third as many events before the quiet, they are stragglers
    assert suggest_window(at(*first[:3], *second)).outside == 3


def test_nothing_to_suggest_for_one_instant_or_too_few_events():
    assert suggest_window(at()) is None
    assert suggest_window(at(5)) is None
    assert suggest_window(at(5, 5, 5)) is None
    window = suggest_window(at(*[7] * 50, 7 + DAY))
    assert (window.since, window.events, window.outside) == (7, 50, 1)
    assert window.until > 7  # a window of one instant still has a width


@pytest.mark.parametrize("seed", range(20))
def test_the_window_counts_are_those_of_its_bounds(seed):
    rng = random.Random(seed)
    times = at(*(rng.choice([0, 3 * DAY]) + int(rng.expovariate(1 / MINUTE)) * rng.randrange(
        1, 100) for _ in range(rng.randrange(2, 400))))
    window = suggest_window(times)
    if window is not None:
        assert window.events == inside(times, window)
        assert window.events + window.outside == len(times) and window.outside > 0
        assert times[0] <= window.since <= window.until <= times[-1]


# --- the endpoint --------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _own_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": "overview-tests"}}
    cache.clear()


def get(client, incident, query: str = "", status: int = 200) -> dict:
    answer = client.get(f"{URL.format(incident.pk)}?{query}")
    assert answer.status_code == status, answer.content[:300]
    return answer.json()


def outcome(record) -> str:
    """What the figure's outcome colours call an event (written out again here)."""
    if record["kind"] != "audit":
        return record["kind"]
    if record["open"]:
        return "open"
    code = record["code"]
    return f"{code // 100}xx" if code is not None and 200 <= code <= 599 else "other"


def binned(histogram, records) -> dict[str, list[int]]:
    """Each record in its bin by the histogram's own start and width, counted in Python."""
    start = datetime.fromisoformat(histogram["start"])
    width = timedelta(milliseconds=histogram["bin_ms"])
    series: dict[str, list[int]] = {}
    for record in records:
        series.setdefault(outcome(record), [0] * histogram["bins"])[
            (record["received"] - start) // width] += 1
    return series


@pytest.mark.django_db
def test_the_overview_of_the_demo_log(incident, ingest_file, demo_log, client, owner):
    ingest_file(incident, demo_log)
    client.force_login(owner)
    requests = demo_requests(demo_log)

    answer = get(client, incident)

    assert answer["total"] == len(requests) == 37
    times = sorted(r["received"] for r in requests)
    assert answer["range"] == [datetime.fromisoformat(t).isoformat() for t in (times[0],
                                                                                times[-1])]
    histogram = answer["histogram"]
    assert histogram["by"] == "outcome" and histogram["bins"] <= 120
    assert datetime.fromisoformat(histogram["start"]) == datetime.fromisoformat(times[0])
    assert {s["name"]: sum(s["counts"]) for s in histogram["series"]} == dict(
        Counter(f"{r['code'] // 100}xx" for r in requests))
    records = [dict(r, received=datetime.fromisoformat(r["received"]), kind="audit",
                    open=False) for r in requests]
    assert {s["name"]: s["counts"] for s in histogram["series"]} == binned(histogram, records)
    for field in ("user", "verb", "resource", "namespace", "code", "user_agent"):
        assert answer["facets"][field]["values"] == expected(requests, field, limit=8), field
        assert answer["facets"][field]["distinct"] == len(expected(requests, field))
    assert answer["window"] is None  # its two phases are both shown
    assert len(get(client, incident, "top=2")["facets"]["resource"]["values"]) == 2


@pytest.mark.django_db
def test_since_and_until_set_the_histogram_but_not_the_suggested_window(incident, client,
                                                                        owner):
    rows = [_row(n, n * 2, verb="get", code=200 + 100 * (n % 4)) for n in range(300)]
    rows += [_row("late", 40 * 24 * 3600, verb="get", code=200)]  # 40 days later
    _store(incident, rows)
    client.force_login(owner)
    since, until = "2024-03-01T12:02:00Z", "2024-03-01T12:05:00Z"

    whole = get(client, incident)
    window = get(client, incident, f"since={since}&until={until}&verb=get")

    assert whole["window"]["outside"] == 1 and whole["window"]["events"] == 300
    assert window["window"] == whole["window"]
    records = [r for r in rows_of(incident) if datetime.fromisoformat(since) <= r["received"]
               <= datetime.fromisoformat(until)]
    assert window["total"] == len(records) == 91
    histogram = window["histogram"]
    assert datetime.fromisoformat(histogram["start"]) == datetime.fromisoformat(since)
    end = datetime.fromisoformat(histogram["end"])
    assert end > datetime.fromisoformat(until)
    assert end - timedelta(milliseconds=histogram["bin_ms"]) <= datetime.fromisoformat(until)
    assert {s["name"]: s["counts"] for s in histogram["series"]} == binned(histogram, records)

    # the suggested window, used as since/until, selects the events it says
    suggested = whole["window"]
    listed = client.get(f"/api/v1/incidents/{incident.pk}/events/", {
        "since": suggested["since"], "until": suggested["until"], "page_size": 1000}).json()
    assert len(listed["results"]) == suggested["events"]


@pytest.mark.django_db
def test_stragglers_years_away_get_a_window_of_the_main_events(incident, client, owner):
    before = (datetime(2017, 9, 11, 19, 55, tzinfo=UTC) - T0).total_seconds()
    after = (datetime(2026, 2, 1, tzinfo=UTC) - T0).total_seconds()
    _store(incident, [_row(n, before + n * 61) for n in range(30)]
           + [_row(f"s{n}", after + n * 3600) for n in range(3)])
    client.force_login(owner)

    answer = get(client, incident)

    window = answer["window"]
    assert (window["events"], window["outside"]) == (30, 3)
    assert window["since"].startswith("2017-09-11T19:55") and window["until"].startswith("2017")
    assert answer["range"][1].startswith("2026")


@pytest.mark.django_db
def test_open_requests_and_other_evidence_have_their_series(incident, client, owner):
    rows = [_row(n, n, code=200) for n in range(5)]
    rows += [_row(f"o{n}", n, code=None, completed=None) for n in range(3)]
    rows += [_row(f"x{n}", n, code=101) for n in range(2)]
    rows += [_row(f"e{n}", n, kind="event", code=None) for n in range(4)]
    rows += [_row(f"l{n}", n, kind="log", code=None, completed=None) for n in range(6)]
    rows += [_row(f"f{n}", n, code=504) for n in range(1)]
    _store(incident, rows)
    client.force_login(owner)

    series = get(client, incident)["histogram"]["series"]

    assert [(s["name"], sum(s["counts"])) for s in series] == [
        ("2xx", 5), ("5xx", 1), ("open", 3), ("other", 2), ("event", 4), ("log", 6)]


# --- the column index and the database -----------------------------------------------------------

QUERIES = ["", "user=alice&user=bob", "kind=event&kind=log", "verb=get&code=200",
           "since=2024-03-01T12:02:00Z", "until=2024-03-01T12:01:00Z&resource=pods",
           "since=2024-03-01T12:01:40Z&until=2024-03-01T12:05:00.000001Z&verb=list",
           "user=nobody", "top=3&source=node-1.log", "q=obj-1", "q=HEALTHZ&verb=get",
           "q=no-such-text"]


@pytest.mark.django_db
def test_the_index_gives_the_overview_of_the_database(incident):
    rows = _synthetic_rows(count=2000)
    rows += [_row(f"open-{n}", n * 7, resource="pods", completed=None, code=None)
             for n in range(9)]
    rows += [_row(f"late-{n}", 5 * 24 * 3600 + n, username="alice", verb="get")
             for n in range(4)]
    _store(incident, rows)
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    windows = 0
    for query in QUERIES:
        params = QueryDict(query)
        assert isinstance(facets.select(incident, params, version=version,
                                        fields=("user", "code")), facets.IndexSelection)
        by_index = overview(incident, params, version=version)
        assert by_index == overview(incident, params, version=None), query
        windows += by_index["window"] is not None
        if by_index["total"]:
            assert sum(sum(s["counts"]) for s in by_index["histogram"]["series"]) == \
                by_index["total"]
    assert windows >= 3  # the late events are left out of most views


@pytest.mark.django_db
def test_the_index_overview_matches_the_rows_counted_in_python(incident):
    _store(incident, _synthetic_rows(count=1500) + [
        _row(f"open-{n}", n, completed=None, code=None) for n in range(5)])
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)

    answer = overview(incident, QueryDict(""), version=version)

    records = rows_of(incident)
    assert sum(r["open"] for r in records) >= 5
    histogram = answer["histogram"]
    assert {s["name"]: s["counts"] for s in histogram["series"]} == binned(histogram, records)
    assert answer["facets"]["user"]["values"] == expected(records, "user", limit=8)
    assert answer["total"] == len(records)


@pytest.mark.embedded
@pytest.mark.django_db
def test_sqlite_gives_the_overview_of_the_log(incident, ingest_file, demo_log, client, owner):
    ingest_file(incident, demo_log)
    client.force_login(owner)
    requests = demo_requests(demo_log)

    answer = get(client, incident, "impersonated_user=bob")

    kept = [r for r in requests if r["impersonated_user"] == "bob"]
    assert answer["total"] == len(kept)
    assert answer["facets"]["code"]["values"] == expected(kept, "code", limit=8)
    records = [dict(r, received=datetime.fromisoformat(r["received"]), kind="audit",
                    open=False) for r in kept]
    histogram = answer["histogram"]
    assert {s["name"]: s["counts"] for s in histogram["series"]} == binned(histogram, records)


@pytest.mark.django_db
def test_the_overview_of_kubernetes_events_lists_their_reasons(incident, ingest_file, client,
                                                                owner, fixtures_dir):
    path = fixtures_dir / "events" / "cribl-event-watch-stream.json"
    assert ingest_file(incident, path).status == "done"
    events = [json.loads(record["_raw"])["object"] for record in json.loads(path.read_text())]
    client.force_login(owner)

    answer = get(client, incident)

    reasons = Counter(event.get("reason", "") for event in events)
    assert answer["facets"]["reason"]["values"] == [
        {"value": value, "count": count, "errors": 0}
        for value, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0]))[:8]]
    assert answer["facets"]["kind"]["values"] == [{"value": "event", "count": len(events),
                                                   "errors": 0}]
    assert answer["facets"]["user"]["values"] == [{"value": "", "count": len(events),
                                                   "errors": 0}]
