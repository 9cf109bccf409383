"""The column index (timelines/store/columns.py): the same heatmap counts as the database for every
filter it holds, used by the figure endpoint once built, never when stale or not applicable."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.core.cache import cache
from django.http import QueryDict
from django.utils import timezone

from incidents.models import Incident, Upload
from timelines.figures.lanes import GROUPS
from timelines.ingest import purge_incident
from timelines.models import Event
from timelines.reads.filters import EventFilterSet
from timelines.reads.queries import warm_overview
from timelines.store import aggregate, columns

from .test_figure_api import T0, _python_counts, _row, _store, _synthetic_rows

pytestmark = pytest.mark.django_db

# Queries as the page sends them (repeated parameters OR, different ones AND), each meant to
# select something different: most filters the index holds, values it has never seen, windows.
QUERIES = [
    "",
    "user=alice",
    "user=alice&user=bob&verb=get",
    "verb=list&verb=watch&code=200",
    "resource=pods",
    "resource=pods&namespace=shop",
    "resource=pods&namespace=",  # an empty value is no filter
    "name=obj-1&name=x",
    "kind=event",
    "kind=log&component=kubelet",
    "reason=BackOff",
    "user_agent=helm&source=node-2.log",
    "user=nobody",  # a value that no event has
    "user=alice&user=nobody",
    "code=404",
    "since=2024-03-01T12:02:00Z",
    "until=2024-03-01T12:05:00.000001Z",
    "since=2024-03-01T12:01:40Z&until=2024-03-01T12:01:40.5Z&resource=leases",
    "since=2024-03-01T11:00:00Z&until=2024-03-01T13:00:00Z&verb=delete",  # window beyond the data
    "q=obj-1",  # text: in names, in any case, alone, with other filters, or nowhere
    "q=OBJ&q=-7&user=alice",
    "q=healthz&since=2024-03-01T12:02:00Z",
    "q=no-such-text",
    "namespace=(none)",  # the events without the field: an empty text, no code
    "code=(none)&code=404",
    "user=(none)&user=alice",
    "user_agent=(none)&source=(none)",
]


def _database_counts(incident, query: str, group: str):
    """What the figure counted before the index existed: the database's GROUP BY."""
    filterset = EventFilterSet(QueryDict(query), queryset=Event.objects.filter(incident=incident))
    assert filterset.is_valid(), filterset.errors
    data = filterset.form.cleaned_data
    return filterset.qs.count(), aggregate.lane_counts(
        filterset.qs, group, since=data.get("since"), until=data.get("until"))


def _index_counts(index, query: str, group: str):
    params = QueryDict(query)
    form = EventFilterSet(params, queryset=Event.objects.none()).form
    assert form.is_valid(), form.errors
    data = form.cleaned_data
    window = index.select(index.filters(data, params), data.get("since"), data.get("until"))
    return window.count, index.lane_counts(window, group, since=data.get("since"),
                                           until=data.get("until"))


@pytest.fixture
def indexed(incident):
    """An incident of mixed evidence (requests, Events, log lines, ties, lanes whose parts
    differ but whose names are the same) with its column index built."""
    _store(incident, _synthetic_rows())
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    return incident, columns.load(incident.pk, version)


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_index_counts_what_the_database_counts(indexed, group):
    incident, index = indexed
    assert index is not None and index.events == Event.objects.filter(incident=incident).count()
    selected = set()
    for query in QUERIES:
        expected = _database_counts(incident, query, group)
        assert _index_counts(index, query, group) == expected, query
        selected.add(expected[0])
    assert len(selected) >= len(QUERIES) - 5  # the queries do select different events


def test_folding_follows_the_lane_limit_of_the_database(indexed, monkeypatch):
    incident, index = indexed
    monkeypatch.setattr("timelines.store.aggregate.HEATMAP_LANES", 6)
    counts = _index_counts(index, "", "object")[1]
    assert counts == _python_counts(Event.objects.filter(incident=incident), "object",
                                    max_lanes=6)
    assert len(counts.lanes) == 7 and counts.folded == counts.distinct_lanes - 6


def test_the_figure_comes_from_the_index_once_built(client, owner, incident, monkeypatch):
    _store(incident, _synthetic_rows())
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    client.force_login(owner)
    url = f"/api/v1/incidents/{incident.pk}/figure/"
    queries = ["lanes=actor&verb=get&verb=list", "lanes=object&kind=event",
               "lanes=source&since=2024-03-01T12:03:00Z", "lanes=object&name=obj-1"]
    by_database = [client.get(f"{url}?{q}").content for q in queries]
    assert [json.loads(b)["meta"]["mode"] for b in by_database] == ["heatmap"] * 4

    assert warm_overview(incident.pk) == 2
    cache.clear()

    def fail(*args, **kwargs):
        raise AssertionError("the database was asked to count")

    monkeypatch.setattr(aggregate, "lane_counts", fail)
    monkeypatch.setattr(aggregate, "more_than", fail)
    assert [client.get(f"{url}?{q}").content for q in queries] == by_database


def test_free_text_is_counted_by_the_index_and_groups_by_the_database(client, owner, incident,
                                                                       monkeypatch):
    _store(incident, _synthetic_rows())
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    warm_overview(incident.pk)
    selects = []
    select = columns.ColumnIndex.select
    monkeypatch.setattr(columns.ColumnIndex, "select",
                        lambda *a, **k: selects.append(1) or select(*a, **k))
    client.force_login(owner)
    url = f"/api/v1/incidents/{incident.pk}/figure/"

    group = json.loads(client.get(url, {"group": "system:masters"}).content)
    assert selects == [] and group["meta"]["total"] == 0
    text = json.loads(client.get(url, {"q": "healthz"}).content)
    assert selects == [1]
    assert text["meta"]["total"] == Event.objects.filter(
        incident=incident, request_uri__icontains="healthz").count() > 100
    json.loads(client.get(url, {"verb": "get", "q": ""}).content)  # an empty q is no filter
    assert selects == [1, 1]
    # a term holding a separator of the text blocks is counted by the database
    json.loads(client.get(url, {"q": "health\x01z"}).content)
    assert selects == [1, 1]


def test_a_new_upload_makes_a_new_index_and_the_old_one_goes(client, owner, incident,
                                                            monkeypatch):
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    _store(incident, [_row(n, n, resource="pods", name="a") for n in range(300)])
    warm_overview(incident.pk)
    first = aggregate.data_version(incident.pk)
    assert columns.load(incident.pk, first) is not None

    running = _store(incident, [_row(f"b{n}", 400 + n, resource="pods", name="b")
                                for n in range(50)], finished=False)
    client.force_login(owner)
    url = f"/api/v1/incidents/{incident.pk}/figure/"
    # while it runs: no version, so no index; the database counts all 350
    assert json.loads(client.get(url).content)["meta"]["total"] == 350
    Upload.objects.filter(pk=running.pk).update(status="done", finished_at=timezone.now())
    second = aggregate.data_version(incident.pk)
    assert columns.load(incident.pk, second) is None  # not built yet: the database counts
    assert json.loads(client.get(url, {"name": "b"}).content)["meta"]["mode"] == "gantt"

    warm_overview(incident.pk)
    folders = list((columns.root() / str(incident.pk)).iterdir())
    assert [f.name for f in folders] == [columns.version_dir(incident.pk, second).name]
    assert columns.load(incident.pk, second).events == 350


def test_a_build_that_finishes_after_a_newer_one_removes_itself_not_the_newer(incident):
    _store(incident, [_row(n, n, resource="pods", name="a") for n in range(300)])
    first = aggregate.data_version(incident.pk)
    _store(incident, [_row(f"b{n}", 400 + n, resource="pods", name="b") for n in range(30)])
    second = aggregate.data_version(incident.pk)
    newer = columns.build(incident.pk, second)

    assert columns.build(incident.pk, first) is None  # started before, finished after
    assert [f.name for f in newer.parent.iterdir()] == [newer.name]
    assert columns.load(incident.pk, second).events == 330


def test_deleting_the_incident_removes_its_index(incident):
    _store(incident, [_row(n, n, resource="pods", name="a") for n in range(300)])
    folder = columns.build(incident.pk, aggregate.data_version(incident.pk))
    assert folder.exists()
    Incident.objects.filter(pk=incident.pk).delete()
    purge_incident(incident.pk)  # what the deletion queues
    assert not (columns.root() / str(incident.pk)).exists()


def test_a_value_holding_the_separator_leaves_counting_to_the_database(client, owner,
                                                                       incident, monkeypatch):
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    _store(incident, [_row(n, n, resource="pods", name="a\x1fb" if n == 7 else "a")
                      for n in range(300)])
    with pytest.raises(columns.UnusualValues):
        columns.build(incident.pk, aggregate.data_version(incident.pk))
    warm_overview(incident.pk)  # logs it, builds nothing, still caches the overview
    assert not (columns.root() / str(incident.pk)).exists()
    client.force_login(owner)
    figure = json.loads(client.get(f"/api/v1/incidents/{incident.pk}/figure/").content)
    assert figure["meta"]["total"] == 300 and "pods/a\x1fb" in figure["data"][0]["y"]


def test_an_unwritable_index_folder_leaves_counting_to_the_database(client, owner, incident,
                                                                    settings, tmp_path,
                                                                    monkeypatch, caplog):
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    settings.COLUMNS_DIR = tmp_path / "a-file"
    settings.COLUMNS_DIR.write_text("not a folder")
    _store(incident, [_row(n, n, resource="pods", name="a") for n in range(300)])

    assert warm_overview(incident.pk) == 2  # the overview is still counted and cached
    assert f"no column index for incident {incident.pk}" in caplog.text
    client.force_login(owner)
    figure = json.loads(client.get(f"/api/v1/incidents/{incident.pk}/figure/",
                                   {"name": "a"}).content)
    assert figure["meta"]["total"] == 300


def test_open_spans_and_microsecond_edges_count_like_the_database(incident):
    edge = T0 + timedelta(seconds=5)
    rows = [_row(n, n / 100, resource="pods", name=f"p{n % 3}") for n in range(900)]
    rows += [_row("open", 5, resource="pods", name="p0", completed=None)]
    _store(incident, rows)
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    index = columns.load(incident.pk, version)
    query = urlencode({"since": edge.isoformat(),
                       "until": (edge + timedelta(microseconds=1)).isoformat()})
    assert _index_counts(index, query, "object") == _database_counts(incident, query, "object")
    assert _index_counts(index, query, "object")[0] == 2  # n = 500 and the open one


@pytest.mark.embedded
def test_sqlite_builds_the_same_index(incident):
    _store(incident, _synthetic_rows(count=800))
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    index = columns.load(incident.pk, version)
    for query in ("", "user=alice&verb=get", "kind=event", "since=2024-03-01T12:02:00Z"):
        for group in ("object", "actor"):
            assert _index_counts(index, query, group) == _database_counts(incident, query, group)


def test_postgres_groups_the_same_signatures_as_the_orm(incident):
    """PostgreSQL joins and groups the signatures itself (``_postgres_columns``): the same
    (time, signature, duration, id) as the row-by-row read of the embedded default, every
    event once, and an index built from them counts as the database does."""
    _store(incident, _synthetic_rows(count=800))
    received, durations, ids, coded, signatures = columns._postgres_columns(incident.pk)
    grouped = sorted(zip(received.tolist(), (signatures[c] for c in coded.tolist()),
                         durations.tolist(), ids.tolist(), strict=True))
    by_row = sorted(row for chunk in columns._rows(incident.pk) for row in chunk)
    events = Event.objects.filter(incident=incident).count()
    assert len(grouped) == events > 800 and len(signatures) > 10
    assert len(set(signatures)) == len(signatures)
    assert grouped == by_row
    version = aggregate.data_version(incident.pk)
    columns.build(incident.pk, version)
    index = columns.load(incident.pk, version)
    for query in QUERIES[:6]:
        assert _index_counts(index, query, "actor") == _database_counts(incident, query, "actor")
