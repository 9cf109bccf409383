"""The timeline figure: pure builders, and the endpoint that feeds them the filtered events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from timelines.figures import MAX_SPANS, Span, build_gantt_figure, build_heatmap_figure

T0 = datetime(2024, 2, 1, 10, 0, tzinfo=UTC)


def _span(pk, *, start=0.0, end=0.5, verb="get", code=200, kind="audit", name="web",
          user="alice") -> Span:
    return Span(pk, kind, T0 + timedelta(seconds=start),
                None if end is None else T0 + timedelta(seconds=end), verb, code,
                "deployments", "shop", name, user, "kubectl", "node-1.log", f"span {pk}")


def test_each_span_is_one_segment_on_its_object_s_lane_in_its_verb_s_trace():
    spans = [_span(1, verb="get"), _span(2, verb="patch", start=1, end=1.2),
             _span(3, verb="get", name="api", start=2, end=3)]

    figure = build_gantt_figure(spans)

    traces = {t["name"]: t for t in figure["data"]}
    assert set(traces) == {"get", "patch"}
    assert all(t["type"] == "scattergl" for t in traces.values())
    assert traces["get"]["customdata"] == [1, 1, None, 3, 3, None]
    assert traces["get"]["y"] == [0, 0, None, 1, 1, None]  # web first, then api
    assert figure["layout"]["yaxis"]["ticktext"] == ["deployments/shop/web",
                                                     "deployments/shop/api"]
    assert traces["patch"]["x"][:2] == [(T0 + timedelta(seconds=1)).isoformat(),
                                        (T0 + timedelta(seconds=1.2)).isoformat()]


def test_open_spans_reach_the_window_end_dotted_in_a_trace_of_their_own():
    spans = [_span(1, end=5), _span(2, start=1, end=None, verb="watch")]

    figure = build_gantt_figure(spans, colour="outcome")

    open_trace = next(t for t in figure["data"] if t["name"] == "open")
    assert open_trace["line"]["dash"] == "dot"
    assert open_trace["x"][1] == (T0 + timedelta(seconds=5)).isoformat()


@pytest.mark.parametrize(("code", "bucket"), [(201, "2xx"), (403, "4xx"), (503, "5xx"),
                                              (None, "other")])
def test_outcome_colours_bucket_the_response_code(code, bucket):
    figure = build_gantt_figure([_span(1, code=code)], colour="outcome")
    assert [t["name"] for t in figure["data"]] == [bucket]


def test_lanes_can_be_actors_and_other_kinds_keep_their_own_colour():
    spans = [_span(1, user="alice"), _span(2, user="bob"), _span(3, kind="event", user="")]

    figure = build_gantt_figure(spans, group="actor")

    assert figure["layout"]["yaxis"]["ticktext"] == ["alice", "bob", "(event)"]
    assert {t["name"] for t in figure["data"]} == {"get", "event"}


def test_zero_length_requests_still_draw():
    figure = build_gantt_figure([_span(1, start=0, end=0)])
    start, end = figure["data"][0]["x"][:2]
    assert end > start


def test_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="group"):
        build_gantt_figure([], group="colour")


def test_the_heatmap_counts_every_span_once():
    spans = [_span(n, start=n % 60, name=f"pod-{n % 3}") for n in range(900)]

    figure = build_heatmap_figure(spans, bins=30)

    z = figure["data"][0]["z"]
    assert sum(v or 0 for row in z for v in row) == 900
    assert len(z) == 3 and all(len(row) == 30 for row in z)


# --- the endpoint --------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_figure_endpoint_draws_the_filtered_events(client, owner, token_for, incident,
                                                       ingest_file, demo_log):
    import json

    ingest_file(incident, demo_log)
    events = [json.loads(line) for line in demo_log.read_text().splitlines() if line.strip()]
    auth = {"HTTP_AUTHORIZATION": f"Token {token_for(owner)}"}
    url = f"/api/v1/incidents/{incident.pk}/figure/"

    everything = client.get(url, **auth).json()
    lists = client.get(url, {"verb": "list", "lanes": "actor"}, **auth).json()

    assert everything["meta"] == {"spans": len(events), "lanes": everything["meta"]["lanes"],
                                  "mode": "gantt", "total": len(events)}
    assert lists["meta"]["spans"] == sum(1 for e in events if e["verb"] == "list")
    assert lists["layout"]["yaxis"]["ticktext"] == sorted(
        {e["user"]["username"] for e in events if e["verb"] == "list"},
        key=lists["layout"]["yaxis"]["ticktext"].index)
    assert client.get(url, {"lanes": "nonsense"}, **auth).status_code == 400


@pytest.mark.django_db
def test_a_large_window_becomes_a_heatmap(client, owner, token_for, incident, ingest_file,
                                          demo_log, monkeypatch):
    import timelines.api

    ingest_file(incident, demo_log)
    monkeypatch.setattr(timelines.api, "MAX_SPANS", 10)
    answer = client.get(f"/api/v1/incidents/{incident.pk}/figure/",
                        HTTP_AUTHORIZATION=f"Token {token_for(owner)}").json()
    assert answer["meta"]["mode"] == "heatmap"
    assert MAX_SPANS == 20_000  # the real threshold is untouched


@pytest.mark.django_db
def test_plotly_js_is_served_by_us():
    from django.contrib.staticfiles import finders

    path = finders.find("plotly/plotly.min.js")
    assert path and path.endswith("plotly.min.js")
