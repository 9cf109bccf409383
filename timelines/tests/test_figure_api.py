"""The figure endpoint and the database's heatmap counts, on the real PostgreSQL (and one test on
the embedded SQLite)."""

from __future__ import annotations

import gzip
import json
import os
import random
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from incidents.models import Upload
from timelines.figures.build import Bins, Span, count_lanes, hover_texts, microseconds
from timelines.figures.lanes import GROUPS, OTHER_LANES
from timelines.ingest.store import write_rows
from timelines.models import Event
from timelines.parsers import Row
from timelines.store import aggregate
from timelines.store.columns import ColumnIndex

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


def _row(n: int, seconds: float, **fields) -> Row:
    received = T0 + timedelta(seconds=seconds)
    fields.setdefault("completed", received + timedelta(milliseconds=2))
    return Row(audit_id=f"req-{n}", received=received, raw=b"{}", **fields)


def _synthetic_rows(count: int = 3000, seed: int = 7) -> list[Row]:
    """Requests on many objects over ten minutes, plus evidence without the lane's own column
    (non-resource URLs, Events, log lines without a user), lanes whose parts differ but whose
    names are the same ("pods" + "" + "x" and "pods" + "x" + ""), and lanes tied on counts with
    names that only sort right by code point ("tie-Z" < "tie-a" < "tie-É")."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        shape = rng.random()
        fields = {"verb": rng.choice(["get", "list", "watch", "create", "patch", "delete"]),
                  "username": rng.choice(["alice", "bob", "system:node:n1", "ci-bot"]),
                  "user_agent": rng.choice(["kubectl/v1.30", "", "kubelet/v1.29", "helm"]),
                  "source": rng.choice(["node-1.log", "node-2.log", ""]), "code": 200}
        if shape < 0.6:
            fields.update(resource=rng.choice(["pods", "configmaps", "deployments"]),
                          namespace=rng.choice(["shop", "kube-system", ""]),
                          name=f"obj-{int(80 ** rng.random())}")
        elif shape < 0.7:
            fields.update(resource="", request_uri="/healthz")  # a non-resource URL
        elif shape < 0.8:
            fields.update(kind="event", resource="pods", namespace="shop", name="obj-1",
                          username="", verb="", code=None, reason="BackOff")
        elif shape < 0.9:
            fields.update(kind="log", username="", verb="", code=None, component="kubelet")
        elif shape < 0.95:
            fields.update(resource="pods", name="x")
        else:
            fields.update(resource="pods", namespace="x")
        rows.append(_row(n, rng.uniform(0, 600), **fields))
    for tie in ("tie-Z", "tie-a", "tie-É"):
        rows += [_row(f"{tie}-{k}", 100 + k, resource="leases", name=tie) for k in range(400)]
    return rows


def _store(incident, rows: list[Row], *, finished=True, format="klog") -> Upload:
    """The rows as one upload of the incident (through the store's writer). ``format`` is the
    parser the upload claims: "audit" promises requests only, which the heatmap relies on."""
    upload = Upload.objects.create(incident=incident, name="synthetic", status="running",
                                   format=format)
    write_rows(incident.pk, upload.pk, rows)
    if finished:
        Upload.objects.filter(pk=upload.pk).update(status="done", finished_at=timezone.now())
    return upload


def _spans(queryset) -> list[Span]:
    return [Span(0, kind, received, None, "", None, resource, namespace, name, user, agent,
                 source, "")
            for kind, received, resource, namespace, name, user, agent, source
            in queryset.values_list("kind", "received", "resource", "namespace", "name",
                                    "username", "user_agent", "source")]


def _python_counts(queryset, group, *, since=None, until=None, max_lanes):
    spans = _spans(queryset)
    first = min(s.start for s in spans)
    last = max(s.start for s in spans)
    bins = Bins.spanning(since or first, until or last)
    return count_lanes(spans, group, bins, first=first, last=last, max_lanes=max_lanes)


@pytest.fixture(autouse=True)
def _own_cache(settings):
    """A cache of this module's own, empty: figures are cached under keys that name incident
    ids, which a new test database gives out again."""
    from django.core.cache import cache

    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": "figure-tests"}}
    cache.clear()


@pytest.fixture
def client_of(client):
    def sign_in(user):
        client.force_login(user)
        return client

    return sign_in


def _figure(client, incident, **query):
    answer = client.get(f"/api/v1/incidents/{incident.pk}/figure/", query)
    assert answer.status_code == 200, answer.content[:300]
    return answer.json()


# --- the database's counts ------------------------------------------------------------------------

@pytest.mark.parametrize("group", list(GROUPS))
def test_postgresql_counts_each_lane_and_bin_as_python_does(incident, group):
    _store(incident, _synthetic_rows())
    events = Event.objects.filter(incident=incident)

    counts = aggregate.lane_counts(events, group, max_lanes=2)

    assert counts == _python_counts(events, group, max_lanes=2)
    assert counts.total == events.count()
    every_lane = _python_counts(events, group, max_lanes=1000).lanes
    assert counts.folded == len(every_lane) - 2 > 0
    if group == "object":
        # the busiest three lanes are tied: the first two by code point are kept
        assert counts.lanes == ["leases/tie-Z", "leases/tie-a", OTHER_LANES]
        assert {"pods/x", "(log)", "(audit)", "pods/shop/obj-1"} <= set(every_lane)


@pytest.mark.parametrize("group", ["object", "actor"])
def test_an_incident_of_requests_only_is_counted_from_the_index_alike(incident, group):
    rows = [r for r in _synthetic_rows() if r.kind == "audit"]
    assert any(r.resource == "" for r in rows)  # "(audit)" lanes without reading the kind
    _store(incident, rows, format="audit")
    events = Event.objects.filter(incident=incident)

    assert aggregate.requests_only(incident.pk)
    counts = aggregate.lane_counts(events, group, max_lanes=3, requests_only=True)

    assert counts == _python_counts(events, group, max_lanes=3)
    _store(incident, [_row("log-1", 1, kind="log")], format="klog")
    assert not aggregate.requests_only(incident.pk)


def test_postgresql_counts_filtered_events_in_the_window_asked_for(incident):
    _store(incident, _synthetic_rows())
    since, until = T0 + timedelta(seconds=60), T0 + timedelta(seconds=400)
    events = Event.objects.filter(incident=incident, verb__in=["get", "patch"],
                                  received__gte=since, received__lte=until)

    counts = aggregate.lane_counts(events, "actor", since=since, until=until, max_lanes=50)

    assert counts == _python_counts(events, "actor", since=since, until=until, max_lanes=50)
    assert counts.bins.start == since and counts.bins.index(until) == counts.bins.count - 1


def test_counting_how_many_stops_after_the_limit(incident):
    _store(incident, [_row(n, n) for n in range(11)])
    events = Event.objects.filter(incident=incident)
    assert aggregate.more_than(events, 10)
    assert not aggregate.more_than(events, 11)
    assert aggregate.lane_counts(events.none(), "object") is None


# --- the endpoint --------------------------------------------------------------------------------

def test_the_figure_endpoint_draws_the_filtered_events(client_of, owner, incident, ingest_file,
                                                       demo_log):
    ingest_file(incident, demo_log)
    events = [json.loads(line) for line in demo_log.read_text().splitlines() if line.strip()]
    client = client_of(owner)

    everything = _figure(client, incident)
    lists = _figure(client, incident, verb="list", lanes="actor")

    stored = Event.objects.filter(incident=incident).order_by("received")
    assert everything["meta"]["mode"] == "gantt"
    assert everything["meta"]["spans"] == everything["meta"]["total"] == len(events)
    assert everything["meta"]["range"] == [stored.first().received.isoformat(),
                                           stored.last().received.isoformat()]
    assert lists["meta"]["spans"] == sum(1 for e in events if e["verb"] == "list")
    assert lists["layout"]["yaxis"]["ticktext"] == sorted(
        {e["user"]["username"] for e in events if e["verb"] == "list"},
        key=lists["layout"]["yaxis"]["ticktext"].index)
    assert client.get(f"/api/v1/incidents/{incident.pk}/figure/",
                      {"lanes": "nonsense"}).status_code == 400


def test_beyond_max_spans_the_database_counts_a_heatmap_with_its_lanes_capped(
        client_of, owner, incident, monkeypatch):
    rows = _synthetic_rows()
    _store(incident, rows)
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    monkeypatch.setattr("timelines.store.aggregate.HEATMAP_LANES", 6)

    figure = _figure(client_of(owner), incident, lanes="object")

    expected = _python_counts(Event.objects.filter(incident=incident), "object", max_lanes=6)
    trace = figure["data"][0]
    assert trace["type"] == "heatmap"
    assert trace["y"] == expected.lanes and trace["y"][-1] == OTHER_LANES
    assert trace["customdata"] == expected.z
    assert figure["meta"]["total"] == figure["meta"]["spans"] == len(rows)  # nothing truncated
    assert figure["meta"]["lanes"] == expected.distinct_lanes
    assert figure["meta"]["lanes_shown"] == 7
    assert figure["meta"]["other_lanes"] == expected.distinct_lanes - 6
    assert figure["meta"]["range"] == [expected.first.isoformat(), expected.last.isoformat()]


def test_a_zoomed_window_of_few_enough_events_comes_back_as_a_gantt(client_of, owner, incident,
                                                                    monkeypatch):
    _store(incident, [_row(n, n / 10, resource="pods", name=f"p{n % 7}", verb="get")
                      for n in range(1000)])
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    client = client_of(owner)
    since, until = "2024-03-01T12:00:10Z", "2024-03-01T12:00:15Z"

    overview = _figure(client, incident)
    zoomed = _figure(client, incident, since=since, until=until)

    assert overview["meta"]["mode"] == "heatmap"
    assert zoomed["meta"]["mode"] == "gantt"
    assert zoomed["meta"]["spans"] == zoomed["meta"]["total"] == 51  # 10.0 s … 15.0 s
    assert zoomed["layout"]["xaxis"]["range"] == ["2024-03-01T12:00:10+00:00",
                                                  "2024-03-01T12:00:15+00:00"]
    ids = {i for t in zoomed["data"] for i in t.get("customdata", []) if i is not None}
    assert ids == set(Event.objects.filter(
        incident=incident, received__range=(T0 + timedelta(seconds=10),
                                             T0 + timedelta(seconds=15))).values_list("pk",
                                                                                      flat=True))


def test_object_lanes_show_lifespans_and_mutation_markers_that_open_the_event(
        client_of, owner, incident):
    _store(incident, [
        _row(1, 1, resource="pods", namespace="shop", name="web", verb="create", code=201,
             username="deployer"),
        _row(2, 2, resource="pods", namespace="shop", name="web", verb="get", code=200),
        _row(3, 3, resource="pods", namespace="shop", name="web", verb="delete", code=200,
             username="alice")])

    figure = _figure(client_of(owner), incident)

    lifespan = figure["data"][0]
    assert lifespan["name"] == "lifespan" and lifespan["y"][:2] == [0, 0]
    markers = {t["name"]: t for t in figure["data"] if t["mode"] == "markers"}
    created = Event.objects.get(incident=incident, verb="create")
    assert markers["created"]["customdata"] == [created.pk]
    texts = dict(zip((t["name"] for t in figure["data"]), hover_texts(figure), strict=True))
    assert texts["deleted"][0].startswith("delete by alice at 12:00:03")


def _gantt_rows() -> list[Row]:
    """Requests at odd microseconds, one that never completed and an Event with a reason."""
    rows = [_row(n, n * 1.000037, resource="pods", namespace="shop", name=f"p{n % 3}",
                 verb="get", code=200, username="alice") for n in range(20)]
    rows.append(_row("watch", 7.5, completed=None, resource="pods", verb="watch",
                     username="bob"))
    rows.append(_row("backoff", 9.25, kind="event", resource="pods", namespace="shop",
                     name="p1", verb="", code=None, reason="BackOff"))
    return rows


def _assert_each_bar_starts_at_its_event_and_names_it_once(figure, incident) -> None:
    events = {e.pk: e for e in Event.objects.filter(incident=incident)}
    drawn = set()
    for trace, texts in zip(figure["data"], hover_texts(figure), strict=True):
        if trace["mode"] != "lines" or "customdata" not in trace:
            continue  # lifespans: no events
        for i in range(0, len(trace["x"]), 3):  # start, end, gap
            event = events[trace["customdata"][i]]
            assert trace["customdata"][i:i + 3] == [event.pk, event.pk, None]
            # epoch milliseconds, exact to the microsecond of the stored time
            assert round(trace["x"][i] * 1000) == microseconds(event.received)
            assert trace["x"][i + 1] > trace["x"][i] and trace["x"][i + 2] is None
            text, *rest = texts[i:i + 3]
            assert rest == [text, None]  # the same hover text on both ends
            assert text.startswith(f"{event.received:%H:%M:%S.%f} {event.kind} ")
            assert (event.reason or event.verb) in text
            assert text.endswith("(open)" if event.completed is None else " ms)")
            drawn.add(event.pk)
    assert drawn == set(events)


def test_each_bar_starts_at_its_event_s_exact_microsecond_and_names_it_once(
        client_of, owner, incident):
    _store(incident, _gantt_rows())

    figure = _figure(client_of(owner), incident, lanes="actor")

    assert figure["meta"]["mode"] == "gantt"
    _assert_each_bar_starts_at_its_event_and_names_it_once(figure, incident)
    watch = Event.objects.get(incident=incident, verb="watch")
    assert [text[0] for t, text in zip(figure["data"], hover_texts(figure), strict=True)
            if t["customdata"][0] == watch.pk] == [
        f"{watch.received:%H:%M:%S.%f} audit watch pods bob (open)"]
    assert aggregate.span_rows(Event.objects.none(), ("id", "received")) == []


def test_a_big_figure_goes_gzipped_to_a_client_that_accepts_it(client_of, owner, incident,
                                                                 monkeypatch):
    _store(incident, _gantt_rows())
    monkeypatch.setattr("timelines.web.api.GZIP_MIN_BYTES", 2000)
    client = client_of(owner)
    url = f"/api/v1/incidents/{incident.pk}/figure/"

    plain = client.get(url)
    packed = client.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    small = client.get(url, {"user": "bob"}, HTTP_ACCEPT_ENCODING="gzip")

    assert len(plain.content) > 2000 and not plain.has_header("Content-Encoding")
    assert packed["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed.content) == plain.content
    assert len(small.content) < 2000 and not small.has_header("Content-Encoding")
    assert all("Accept-Encoding" in r["Vary"] for r in (plain, packed, small))


def test_the_heatmap_is_counted_once_per_data_version(client_of, owner, incident, monkeypatch):
    _store(incident, [_row(n, n, resource="pods", name="a") for n in range(300)], format="audit")
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    client = client_of(owner)
    calls = []
    count = aggregate.lane_counts
    monkeypatch.setattr(aggregate, "lane_counts", lambda *a, **k: calls.append(1) or count(*a, **k))

    first = _figure(client, incident, colour="verb")
    again = _figure(client, incident, colour="outcome")  # a heatmap has no colours: same answer
    assert (first, len(calls)) == (again, 1)

    running = _store(incident, [_row(f"b{n}", 400 + n, resource="pods", name="b")
                                for n in range(50)], finished=False)
    assert _figure(client, incident)["meta"]["total"] == 350  # not from the cache…
    _figure(client, incident)
    assert len(calls) == 3  # …nor into it while an upload runs
    Upload.objects.filter(pk=running.pk).update(status="done", finished_at=timezone.now())
    assert _figure(client, incident)["meta"]["total"] == 350
    _figure(client, incident)
    assert len(calls) == 4


def test_the_overview_is_counted_after_the_last_upload_finishes(client_of, owner, incident,
                                                                monkeypatch):
    from timelines.reads.queries import warm_overview

    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)
    calls = []
    count = aggregate.lane_counts
    monkeypatch.setattr(aggregate, "lane_counts", lambda *a, **k: calls.append(1) or count(*a, **k))
    indexed = ColumnIndex.lane_counts
    monkeypatch.setattr(ColumnIndex, "lane_counts",
                        lambda *a, **k: calls.append(1) or indexed(*a, **k))
    _store(incident, [_row(n, n, resource="pods", name="a") for n in range(300)], format="audit")
    waiting = _store(incident, [_row(f"b{n}", 400 + n, resource="pods", name="b")
                                for n in range(50)], finished=False)
    assert warm_overview(incident.pk) == 0 and calls == []  # another upload is on its way

    Upload.objects.filter(pk=waiting.pk).update(status="done", finished_at=timezone.now())
    assert warm_overview(incident.pk) == 2 and len(calls) == 2  # object and actor lanes
    client = client_of(owner)
    assert _figure(client, incident)["meta"]["total"] == 350
    assert _figure(client, incident, lanes="actor")["meta"]["mode"] == "heatmap"
    assert len(calls) == 2  # both served from what the warm-up counted


def test_a_small_incident_needs_no_overview(incident):
    from timelines.reads.queries import warm_overview

    _store(incident, [_row(n, n) for n in range(30)])
    assert warm_overview(incident.pk) == 0


def test_an_outsider_gets_404(client_of, outsider, incident):
    _store(incident, [_row(1, 1)])
    client = client_of(outsider)
    assert client.get(f"/api/v1/incidents/{incident.pk}/figure/").status_code == 404


@pytest.mark.embedded
def test_sqlite_counts_the_heatmap_in_python_without_truncating(client_of, owner, incident,
                                                                 monkeypatch):
    rows = _synthetic_rows(count=600)
    _store(incident, rows)
    monkeypatch.setattr("timelines.reads.queries.MAX_SPANS", 100)

    figure = _figure(client_of(owner), incident, lanes="actor")

    expected = _python_counts(Event.objects.filter(incident=incident), "actor", max_lanes=50)
    assert figure["meta"]["mode"] == "heatmap"
    assert figure["meta"]["total"] == len(rows)
    assert figure["data"][0]["customdata"] == expected.z


@pytest.mark.embedded
def test_sqlite_draws_the_same_bars_at_the_exact_microsecond(client_of, owner, incident):
    _store(incident, _gantt_rows())

    figure = _figure(client_of(owner), incident)

    assert figure["meta"]["mode"] == "gantt"
    _assert_each_bar_starts_at_its_event_and_names_it_once(figure, incident)


def test_plotly_js_is_served_by_us(settings):
    from django.contrib.staticfiles import finders

    path = finders.find(settings.PLOTLY_JS)
    assert path and os.path.getsize(path) > 1_000_000
    assert finders.find("plotly/plotly.min.js")  # the fallback is always there


def test_the_plotly_bundle_is_served_once_built(settings):
    """scripts/assets.sh builds the bundle (scripts/test.sh always runs it); in CI it must have:
    a build that silently did not happen would leave the page on the 4.8 MB plotly.min.js."""
    from django.contrib.staticfiles import finders

    bundle = settings.BASE_DIR / "assets" / "dist" / "plotly-timeline.min.js"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        assert bundle.is_file(), "scripts/assets.sh did not build the plotly.js bundle"
    if bundle.is_file():
        assert settings.PLOTLY_JS == "plotly/plotly-timeline.min.js"
        assert finders.find(settings.PLOTLY_JS) == str(bundle)
    else:
        assert settings.PLOTLY_JS == "plotly/plotly.min.js"


# --- detections ----------------------------------------------------------------------------------

def _stars(figure) -> dict[int, tuple[dict, str]]:
    """The figure's detection stars: event id → (its trace, its hover text)."""
    stars = {}
    for trace, texts in zip(figure["data"], hover_texts(figure), strict=True):
        if trace.get("legendgroup") == "detected":
            for event_id, text in zip(trace["customdata"], texts, strict=True):
                assert event_id not in stars  # one star per event
                stars[event_id] = (trace, text)
    return stars


def test_detected_requests_are_starred_with_their_rules_and_honour_the_filters(
        client_of, owner, incident, falco):
    from collections import defaultdict

    from timelines.detections import rules
    from timelines.detections.incident import evaluate, ruleset_for, store_matches
    from timelines.detections.models import DetectionMatch

    client = client_of(owner)
    # the analyses after the ingest stored the matches already: none, no stars
    DetectionMatch.objects.filter(incident_id=incident.pk).delete()
    before = _figure(client, incident)
    assert before["meta"]["mode"] == "gantt" and before["meta"]["spans"] == len(falco)
    assert _stars(before) == {} and before["meta"]["detected"] == 0

    store_matches(incident.pk, evaluate(incident.pk, ruleset_for(incident.pk)))
    matched = defaultdict(set)
    for event_id, rule in DetectionMatch.objects.filter(incident_id=incident.pk).values_list(
            "event_id", "rule"):
        matched[event_id].add(rule)
    assert 1 < len(matched) < len(falco)
    priority = {r.name: r.priority for r in rules.load(rules.default_files()).rules}
    figure = _figure(client, incident)
    stars = _stars(figure)
    assert set(stars) == set(matched) and figure["meta"]["detected"] == len(matched)
    lane_of = {}  # each event's bar: its lane and start
    for trace in figure["data"]:
        if trace["mode"] == "lines" and "customdata" in trace:
            for i in range(0, len(trace["x"]), 3):
                lane_of[trace["customdata"][i]] = (trace["y"][i], trace["x"][i])
    for event_id, (trace, text) in stars.items():
        worst = min(matched[event_id], key=lambda r: rules.PRIORITIES.index(priority[r]))
        assert trace["name"] == f"detected: {rules.severity_of(priority[worst])}"
        for rule in matched[event_id]:
            assert f"{rule} ({priority[rule]})" in text
        lane, start = lane_of[event_id]
        i = trace["customdata"].index(event_id)
        assert trace["x"][i] == start and lane - 0.5 < trace["y"][i] < lane
    # the filters choose the events, and with them the stars
    pods = {r["id"] for r in falco if r["resource"] == "pods"}
    starred = _figure(client, incident, resource="pods")
    assert starred["meta"]["spans"] == len(pods)
    assert set(_stars(starred)) == set(matched) & pods not in (pods, set())  # one pod is not
    rule = "Create/Modify Configmap With Private Credentials"
    chosen = {e for e, names in matched.items() if rule in names}
    assert chosen and set(_stars(_figure(client, incident, detection=rule))) == chosen
    undetected = (pods - set(matched)).pop()
    assert _stars(_figure(client, incident, id=undetected)) == {}
