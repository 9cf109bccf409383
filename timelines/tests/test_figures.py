"""The timeline figure's pure builders: spans in, Plotly figure dict out (no database)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from timelines.figures.build import (
    DETECTION_LIFT_PX,
    DETECTIONS,
    EDGE_SHARE,
    FRAME_PX,
    LANES_PER_PAGE,
    MIN_BAR_SHARE,
    Bar,
    Bins,
    Span,
    build_gantt_figure,
    build_heatmap_figure,
    count_lanes,
    fold_lanes,
    hover_texts,
    microseconds,
    object_lifespans,
)
from timelines.figures.lanes import LABEL_CHARS, OTHER_LANES, short_label, short_labels

T0 = datetime(2024, 2, 1, 10, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _ms(seconds: float) -> float:
    """An x value: epoch milliseconds of ``_at(seconds)``."""
    return microseconds(_at(seconds)) / 1000


def _span(pk, *, start=0.0, end=0.5, verb="get", code=200, kind="audit", name="web",
          user="alice", resource="deployments", subresource="", reason="",
          namespace="shop") -> Span:
    return Span(pk, kind, _at(start), None if end is None else _at(end), verb, code,
                resource, namespace, name, user, "kubectl", "node-1.log", reason, subresource)


def _trace(figure, name):
    return next(t for t in figure["data"] if t["name"] == name)


def _segments(trace):
    """(x0, x1, y, customdata) of each segment of a line trace."""
    x, y, ids = trace["x"], trace["y"], trace.get("customdata", [None] * len(trace["x"]))
    return [(x[i], x[i + 1], y[i], ids[i]) for i in range(0, len(x), 3)]


def test_each_span_is_one_segment_on_its_object_s_lane_in_its_verb_s_trace():
    spans = [_span(1, verb="get"), _span(2, verb="patch", start=1, end=1.2, code=500),
             _span(3, verb="get", name="api", start=2, end=3)]

    figure = build_gantt_figure(spans)

    traces = {t["name"]: t for t in figure["data"] if t["mode"] == "lines"}
    assert set(traces) == {"get", "patch", "lifespan"}
    assert all(t["type"] == "scattergl" for t in traces.values())
    assert traces["get"]["customdata"] == [1, 1, None, 3, 3, None]
    assert traces["get"]["y"] == [0, 0, None, 1, 1, None]  # web first, then api
    assert figure["layout"]["yaxis"]["ticktext"] == ["deployments/shop/web",
                                                     "deployments/shop/api"]
    assert traces["patch"]["x"][:2] == [_ms(1), _ms(1.2)]


def test_x_values_are_epoch_milliseconds_that_give_back_the_exact_microsecond():
    took = timedelta(seconds=3, microseconds=7)
    for start in (T0 + timedelta(microseconds=1), T0 + timedelta(seconds=59, microseconds=999_999),
                  datetime(2099, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)):
        span = Span(1, "audit", start, start + took, "get", 200, "pods", "", "p", "alice", "", "")

        figure = orjson.loads(orjson.dumps(build_gantt_figure([span], group="actor")))

        x0, x1, _ = _trace(figure, "get")["x"]
        assert isinstance(x0, float) and isinstance(x1, float)
        assert (round(x0 * 1000), round(x1 * 1000)) == (microseconds(start),
                                                         microseconds(start + took))


def test_each_bar_s_hover_text_names_its_event_at_both_ends_and_travels_as_numbers():
    spans = [_span(1, start=1, end=1.2, verb="patch", code=500),
             _span(2, start=2.000001, end=None, verb="watch", code=None, name="", user="bob"),
             _span(3, start=3, end=3.0005, kind="event", verb="", code=None, reason="BackOff",
                   user="", subresource="status")]

    figure = build_gantt_figure(spans, group="actor", window_end=_at(60))

    texts = {t["customdata"][0]: text for t, text in zip(figure["data"], hover_texts(figure),
                                                         strict=True)}
    patched = "10:00:01.000000 audit patch 500 deployments/shop/web alice (200.000 ms)"
    watched = "10:00:02.000001 audit watch deployments/shop bob (open)"
    backoff = "10:00:03.000000 event BackOff deployments/shop/web (status)  (0.500 ms)"
    assert texts == {1: [patched, patched, None], 2: [watched, watched, None],
                     3: [backoff, backoff, None]}
    # no text is sent, only numbers into one table of strings, each string once
    assert all("text" not in t for t in figure["data"])
    assert len(figure["labels"]) == len(set(figure["labels"]))
    assert [t["labels"]["parts"][3] for t in figure["data"]] == [200_000, -1, 500]


def test_open_spans_reach_the_window_end_dotted_in_a_trace_of_their_own():
    spans = [_span(1, end=5), _span(2, start=1, end=None, verb="watch")]

    figure = build_gantt_figure(spans, colour="outcome")

    open_trace = _trace(figure, "open")
    assert open_trace["line"]["dash"] == "dot"
    assert open_trace["x"][1] == _ms(5)
    zoomed = build_gantt_figure(spans, colour="outcome", window_end=_at(60))
    assert _trace(zoomed, "open")["x"][1] == _ms(60)


@pytest.mark.parametrize(("code", "bucket"), [(201, "2xx"), (403, "4xx"), (503, "5xx"),
                                              (None, "other")])
def test_outcome_colours_bucket_the_response_code(code, bucket):
    figure = build_gantt_figure([_span(1, code=code)], colour="outcome", group="actor")
    assert [t["name"] for t in figure["data"]] == [bucket]


def test_lanes_can_be_actors_and_other_kinds_keep_their_own_colour():
    spans = [_span(1, user="alice"), _span(2, user="bob"), _span(3, kind="event", user="")]

    figure = build_gantt_figure(spans, group="actor")

    assert figure["layout"]["yaxis"]["ticktext"] == ["alice", "bob", "(event)"]
    assert {t["name"] for t in figure["data"]} == {"get", "event"}


def test_a_one_millisecond_request_in_a_half_hour_window_is_drawn_at_least_a_pixel_wide():
    spans = [_span(1, start=0, end=0.001), _span(2, start=1800, end=1800.5)]

    figure = build_gantt_figure(spans, group="actor")

    x0, x1, _, _ = _segments(_trace(figure, "get"))[0]
    width = timedelta(microseconds=round(x1 * 1000) - round(x0 * 1000))
    assert width >= timedelta(seconds=1800.5) * MIN_BAR_SHARE  # 3.6 s of 30 min
    # the events' span and a margin of EDGE_SHARE on each side, so none sits on the edge
    margin = 1800.5 * EDGE_SHARE
    assert figure["layout"]["xaxis"]["range"] == [_at(-margin).isoformat(),
                                                  _at(1800.5 + margin).isoformat()]


def test_zero_length_requests_still_draw_when_the_window_is_one_instant():
    figure = build_gantt_figure([_span(1, start=0, end=0)], group="actor")
    start, end = figure["data"][0]["x"][:2]
    assert end > start


def test_long_requests_keep_their_true_length():
    figure = build_gantt_figure([_span(1, start=0, end=100), _span(2, start=50, end=60)],
                                group="actor")
    assert _segments(_trace(figure, "get"))[1][:2] == (_ms(50), _ms(60))


def test_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="group"):
        build_gantt_figure([], group="colour")


def test_the_meta_says_mode_spans_lanes_total_and_the_time_range():
    figure = build_gantt_figure([_span(1, start=3, end=9), _span(2, start=1, name="api")])
    assert figure["meta"] == {"mode": "gantt", "spans": 2, "lanes": 2, "total": 2,
                              "lanes_per_page": LANES_PER_PAGE, "detected": 0,
                              "range": [_at(1).isoformat(), _at(3).isoformat()]}
    assert build_gantt_figure([])["meta"]["range"] is None


# --- object lifespans ----------------------------------------------------------------------------

WINDOW = (microseconds(_at(0)), microseconds(_at(100)))


def _lifespans(spans: list[Span]) -> dict[str, list[tuple[datetime, datetime]]]:
    lives = object_lifespans([Bar.of(s) for s in spans], *WINDOW)
    return {lane: [(_moment(begin), _moment(end)) for begin, end in intervals]
            for lane, intervals in lives.items()}


def _moment(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


def test_an_object_lives_from_its_create_to_its_delete():
    spans = [_span(1, start=10, end=10.1, verb="create", code=201),
             _span(2, start=20, end=20.1, verb="get"),
             _span(3, start=30, end=30.2, verb="delete", code=200)]

    assert _lifespans(spans) == {"deployments/shop/web": [(_at(10.1), _at(30.2))]}


def test_an_object_created_before_the_window_starts_with_it_and_one_never_deleted_runs_on():
    existing = [_span(1, start=20, end=20.5, verb="patch"),
                _span(2, start=40, end=40.5, verb="delete")]
    made = [_span(3, name="api", start=50, end=50.5, verb="create", code=201)]

    lives = _lifespans(existing + made)

    assert lives["deployments/shop/web"] == [(_at(0), _at(40.5))]
    assert lives["deployments/shop/api"] == [(_at(50.5), _at(100))]


def test_an_object_deleted_and_created_again_has_two_lives_and_the_last_delete_ends_one():
    spans = [_span(1, start=5, end=5.5, verb="create", code=201),
             _span(2, start=10, end=10, verb="delete"),  # graceful: the object stays…
             _span(3, start=12, end=12, verb="delete"),  # …until the second delete
             _span(4, start=30, end=30, verb="create", code=201)]

    assert _lifespans(spans)["deployments/shop/web"] == [
        (_at(5.5), _at(12)), (_at(30), _at(100))]


def test_failed_requests_and_subresources_do_not_make_or_end_a_life():
    spans = [_span(1, start=5, end=5.5, verb="create", code=409),  # AlreadyExists
             _span(2, start=6, end=6.5, verb="create", code=201, subresource="eviction"),
             _span(3, name="ghost", start=7, end=7.5, verb="get", code=404)]

    lives = _lifespans(spans)

    assert lives == {"deployments/shop/web": [(_at(0), _at(100))]}  # seen (201), never made


def test_collections_and_other_kinds_have_no_lifespan():
    spans = [_span(1, name="", verb="list"), _span(2, kind="event", verb="", code=None)]
    assert _lifespans(spans) == {}


def test_object_lanes_draw_lifespans_beneath_the_requests_and_a_marker_per_mutation_over():
    spans = [_span(11, start=10, end=10.1, verb="create", code=201, user="deployer"),
             _span(12, start=20, end=20.2, verb="patch", user="hpa"),
             _span(13, start=25, end=25.1, verb="update", code=409),  # conflict: no marker
             _span(14, start=30, end=30.3, verb="delete", user="alice")]

    figure = build_gantt_figure(spans, window_start=_at(0), window_end=_at(100))

    assert figure["data"][0]["name"] == "lifespan"  # first: drawn beneath
    lifespan = figure["data"][0]
    assert _segments(lifespan) == [(_ms(10.1), _ms(30.3), 0, None)]
    assert lifespan["text"] == ["deployments/shop/web exists 10:00:10.100000 – 10:00:30.300000",
                                None, None]
    assert "customdata" not in lifespan  # not an event: a click on it opens nothing
    assert "rgba" in lifespan["line"]["color"] and lifespan["line"]["width"] < 8
    modes = [t["mode"] for t in figure["data"]]
    assert modes == sorted(modes, key=lambda m: m == "markers")  # markers last: over the bars
    markers = {t["name"]: t for t in figure["data"] if t["mode"] == "markers"}
    assert set(markers) == {"created", "patched", "deleted"}
    assert len({t["marker"]["symbol"] for t in markers.values()}) == 3
    assert markers["patched"]["customdata"] == [12]
    assert markers["patched"]["x"] == [_ms(20.2)]
    texts = {t["name"]: text for t, text in zip(figure["data"], hover_texts(figure),
                                                 strict=True)}
    assert texts["patched"] == ["patch by hpa at 10:00:20.200000"]
    assert texts["created"] == ["create by deployer at 10:00:10.100000"]
    assert texts["lifespan"] == [lifespan["text"][0]] * 2 + [None]


def test_other_lanes_have_no_lifespans_or_markers():
    spans = [_span(1, verb="create", code=201), _span(2, start=5, end=5.5, verb="delete")]
    figure = build_gantt_figure(spans, group="actor")
    assert all(t["mode"] == "lines" and t["name"] != "lifespan" for t in figure["data"])


def test_a_detected_request_gets_a_star_over_its_start_naming_its_rules_and_priorities():
    spans = [_span(1, start=1, end=1.5, verb="create", code=201, user="deployer"),
             _span(2, start=2, end=2.1, name="api", user="mallory"),
             _span(3, start=3, end=3.2, name="api", verb="delete", user="alice"),
             _span(4, start=4, end=4.1, name="db")]
    detections = {  # as detections.marks gives them: the most severe first
        2: [("Attach/Exec Pod", "NOTICE", "info")],
        3: [("Create Privileged Pod", "WARNING", "warning"),
            ("Attach/Exec Pod", "NOTICE", "info")],
        99: [("K8s Secret Deleted", "INFO", "info")],  # an event not drawn: no star
    }

    figure = build_gantt_figure(spans, window_start=_at(0), window_end=_at(10),
                                detections=detections)

    stars = {t["name"]: t for t in figure["data"] if t.get("legendgroup") == "detected"}
    assert set(stars) == {DETECTIONS["info"][0], DETECTIONS["warning"][0]}
    assert [t.get("legendgroup") for t in figure["data"][-2:]] == ["detected"] * 2  # on top
    info, warning = stars[DETECTIONS["info"][0]], stars[DETECTIONS["warning"][0]]
    assert info["customdata"] == [2] and warning["customdata"] == [3]
    assert info["marker"]["symbol"] == warning["marker"]["symbol"] == "star"
    assert info["marker"]["color"] != warning["marker"]["color"]
    # at the request's start, a few pixels above its bar, in its lane (api's: the second)
    bar = _trace(figure, "delete")
    assert warning["x"] == [bar["x"][0]] == [_ms(3)]
    lane_px = (figure["layout"]["height"] - FRAME_PX) / 3  # three lanes fill the least height
    assert bar["y"][0] == 1 and 0 < (1 - warning["y"][0]) * lane_px == pytest.approx(
        DETECTION_LIFT_PX)
    texts = {t["name"]: text for t, text in zip(figure["data"], hover_texts(figure),
                                                 strict=True)}
    assert texts[DETECTIONS["warning"][0]] == [
        "⚑ Create Privileged Pod (WARNING), Attach/Exec Pod (NOTICE): delete 200 "
        "deployments/shop/api by alice at 10:00:03.000000"]
    assert texts[DETECTIONS["info"][0]] == [
        "⚑ Attach/Exec Pod (NOTICE): get 200 deployments/shop/api by mallory at "
        "10:00:02.000000"]
    assert figure["meta"]["detected"] == 2


def test_a_star_is_as_high_above_its_bar_with_many_lanes_as_with_few():
    spans = [_span(n, start=n, name=f"web-{n}") for n in range(60)]
    figure = build_gantt_figure(spans, detections={0: [("Attach/Exec Pod", "NOTICE", "info")]})
    star = _trace(figure, DETECTIONS["info"][0])
    lane_px = (figure["layout"]["height"] - FRAME_PX) / LANES_PER_PAGE  # 40 lanes shown
    assert (0 - star["y"][0]) * lane_px == pytest.approx(DETECTION_LIFT_PX)


def test_without_detections_the_gantt_has_no_stars():
    spans = [_span(1), _span(2, start=2, end=2.5, verb="delete")]
    for detections in (None, {}, {7: [("Attach/Exec Pod", "NOTICE", "info")]}):
        figure = build_gantt_figure(spans, detections=detections)
        assert all(t.get("legendgroup") != "detected" for t in figure["data"])
        assert figure["meta"]["detected"] == 0
    assert build_gantt_figure(spans) == build_gantt_figure(spans, detections={})


# --- heatmap -------------------------------------------------------------------------------------

def test_bins_cover_first_to_last_in_whole_microseconds():
    bins = Bins.spanning(_at(0), _at(10), 200)
    assert bins.count <= 200
    assert bins.width % timedelta(microseconds=1) == timedelta(0)
    assert bins.index(_at(0)) == 0
    assert bins.index(_at(10)) == bins.count - 1
    one_instant = Bins.spanning(_at(5), _at(5), 200)
    assert (one_instant.count, one_instant.index(_at(5))) == (1, 0)


def test_the_heatmap_counts_every_span_once():
    spans = [_span(n, start=n % 60, name=f"pod-{n % 3}") for n in range(900)]
    bins = Bins.spanning(_at(0), _at(59), 30)

    counts = count_lanes(spans, "object", bins, first=_at(0), last=_at(59))

    assert counts.total == 900
    assert sum(map(sum, counts.z)) == 900
    assert len(counts.z) == 3 and all(len(row) == bins.count for row in counts.z)
    assert counts.z[0][0] == sum(1 for n in range(900) if n % 3 == 0 and n % 60 < 2)


def test_the_most_active_lanes_are_drawn_and_the_others_summed_into_one_row():
    lanes = [("quiet-b", [0], [1]), ("busy", [0, 1], [5, 4]), ("quiet-a", [1], [1]),
             ("middle", [2], [3]), ("quiet-c", [2], [2])]
    bins = Bins(T0, timedelta(seconds=1), 3)

    counts = fold_lanes(lanes, bins, first=_at(0), last=_at(2), max_lanes=2)

    assert counts.lanes == ["busy", "middle", OTHER_LANES]
    assert counts.z == [[5, 4, 0], [0, 0, 3], [1, 1, 2]]
    assert (counts.total, counts.distinct_lanes, counts.folded) == (16, 5, 3)
    # ties between equally active lanes go by name, so the same lanes are kept every time
    tied = fold_lanes([("b", [0], [1]), ("a", [0], [1]), ("c", [0], [1])], bins, first=_at(0),
                      last=_at(0), max_lanes=2)
    assert tied.lanes == ["a", "b", OTHER_LANES]
    # the same lane from two sources (parts that name it alike) is one lane
    twice = fold_lanes([("a", [0], [1]), ("b", [1], [3]), ("a", [0, 2], [2, 1])], bins,
                       first=_at(0), last=_at(2), max_lanes=5)
    assert (twice.lanes, twice.z) == (["a", "b"], [[3, 0, 1], [0, 3, 0]])


def test_the_heatmap_figure_is_compact_and_says_what_was_folded():
    bins = Bins(T0, timedelta(seconds=2), 3)
    counts = fold_lanes([("a", [0], [2]), ("b", [2], [1]), ("c", [1], [1])], bins,
                        first=_at(0), last=_at(5), max_lanes=2)

    figure = build_heatmap_figure(counts)

    trace = figure["data"][0]
    assert trace["type"] == "heatmap" and "x" not in trace
    assert (trace["x0"], trace["dx"]) == (_at(1).isoformat(), 2000)  # centre of bin 0, ms
    assert trace["y"] == ["a", "b", OTHER_LANES]
    assert trace["customdata"] == [[2, 0, 0], [0, 0, 1], [0, 1, 0]]
    # colours follow the decimal logarithm of a count; an empty cell is not drawn
    assert trace["z"] == [[0.301, None, None], [None, None, 0.0], [None, 0.0, None]]
    assert figure["layout"]["xaxis"]["range"] == [_at(0).isoformat(), _at(6).isoformat()]
    assert figure["meta"] == {"mode": "heatmap", "spans": 4, "total": 4, "lanes": 3,
                              "lanes_per_page": LANES_PER_PAGE,
                              "lanes_shown": 3, "other_lanes": 1, "bins": 3, "bin_ms": 2000,
                              "range": [_at(0).isoformat(), _at(5).isoformat()]}


# --- lanes on the page ----------------------------------------------------------------------------

def test_a_long_lane_name_is_shortened_in_the_middle_and_kept_whole_in_lanes():
    long = "pods/openshift-machine-config-operator/machine-config-daemon-7xkqz-canary-2"
    assert short_label("pods/shop/web") == "pods/shop/web"
    short = short_label(long)
    assert len(short) == LABEL_CHARS and "…" in short
    head, tail = short.split("…")
    assert long.startswith(head) and long.endswith(tail) and len(tail) > len(head)

    spans = [_span(n, start=n, name=f"{long}-{n}" if n % 2 else f"web-{n}") for n in range(100)]
    figure = build_gantt_figure(spans)

    names = [f"deployments/shop/{s.name}" for s in spans]
    assert figure["lanes"] == names
    assert figure["layout"]["yaxis"]["ticktext"] == [short_label(n) for n in names]
    assert all(len(t) <= LABEL_CHARS for t in figure["layout"]["yaxis"]["ticktext"])


# A must-gather's static pods: the same namespace prefix and node, the component between
STATIC_PODS = [f"pods/openshift-{component}/{component.removeprefix('openshift-')}-ip-10-0-195-177"
               ".ec2.internal" for component in ("kube-apiserver", "kube-controller-manager",
                                                 "kube-scheduler", "etcd")]


def test_lanes_that_would_look_alike_get_labels_that_tell_them_apart():
    others = ["pods/shop/web", "pods/openshift-kube-apiserver/kube-apiserver-ip-10-0-1-2.internal"]
    names = STATIC_PODS + others
    assert len({short_label(n) for n in STATIC_PODS}) < len(STATIC_PODS)  # the trouble

    labels = short_labels(names)

    assert len(set(labels)) == len(names)
    before = Counter(short_label(n) for n in names)
    alone = [(n, label) for n, label in zip(names, labels, strict=True)
             if before[short_label(n)] == 1]
    assert [label for _, label in alone] == [short_label(n) for n, _ in alone]  # as before
    assert len(alone) == 3  # etcd's, and the two others
    for name, label in zip(names, labels, strict=True):
        if before[short_label(name)] == 1:
            continue
        assert len(label) <= LABEL_CHARS
        resource, _, rest = label.partition("/…/")
        head, _, tail = rest.partition("…")
        object_name = name.rsplit("/", 1)[1]
        assert name.startswith(resource + "/") and object_name.startswith(head)
        assert object_name.endswith(tail)
    # no better label to be had: the same resource and name, the namespaces apart in the middle
    alike = [f"pods/openshift-{n}-{'x' * 30}/prometheus-0" for n in ("a", "b")]
    assert short_labels(alike) == [short_label(n) for n in alike]
    assert short_labels([]) == []


def test_log_files_that_differ_in_a_middle_part_get_labels_of_that_part():
    """A container's log on each node (a must-gather's source-file lanes): the paths differ
    in the pod's part only, which both ends leave out."""
    path = ("must-gather-aws/quay-io-openshift-release-dev-sha256-0123/namespaces/"
            "openshift-kube-apiserver/pods/kube-apiserver-ip-10-0-{}.ec2.internal/"
            "kube-apiserver/kube-apiserver/logs/current.log")
    names = [path.format(node) for node in ("187-218", "195-177", "189-142")]
    assert len({short_label(n) for n in names}) == 1  # the trouble

    labels = short_labels(names)

    assert len(set(labels)) == len(names)
    for name, label in zip(names, labels, strict=True):
        assert len(label) <= LABEL_CHARS and label.startswith("…/kube-apiserver-")
        assert name.split("/")[5].endswith(label.rsplit("…", 1)[1])  # the pod's part


def test_the_figures_label_their_lanes_apart():
    spans = [_span(n, start=n, resource="pods", namespace=name.split("/")[1],
                   name=name.split("/")[2]) for n, name in enumerate(STATIC_PODS)]
    figure = build_gantt_figure(spans)

    assert figure["lanes"] == STATIC_PODS
    assert figure["layout"]["yaxis"]["ticktext"] == short_labels(STATIC_PODS)
    assert len(set(figure["layout"]["yaxis"]["ticktext"])) == len(STATIC_PODS)


def test_the_first_page_of_many_lanes_is_shown_at_a_readable_height():
    few = build_gantt_figure([_span(n, start=n, name=f"web-{n}") for n in range(3)])
    many = build_gantt_figure([_span(n, start=n, name=f"web-{n}") for n in range(250)])

    assert few["layout"]["yaxis"]["range"] == [2.5, -0.5]  # top down, every lane
    assert many["layout"]["yaxis"]["range"] == [LANES_PER_PAGE - 0.5, -0.5]
    assert many["meta"]["lanes"] == 250 and many["meta"]["lanes_per_page"] == LANES_PER_PAGE
    # the height holds a page of lanes, whatever their number: at least 16 px a lane
    layout = many["layout"]
    plot_height = layout["height"] - layout["margin"]["t"] - 110  # axis, title, legend
    assert plot_height / LANES_PER_PAGE >= 16
    assert many["layout"]["height"] == build_gantt_figure(
        [_span(n, start=n, name=f"web-{n}") for n in range(900)])["layout"]["height"]
    # the legend sits under the time axis, outside the plot, and lane 0 has no zero line
    assert layout["legend"]["yref"] == "container" and layout["legend"]["y"] == 0
    assert layout["yaxis"]["zeroline"] is False


def test_the_heatmap_colour_bar_is_labelled_in_counts_by_decade():
    bins = Bins(T0, timedelta(seconds=1), 2)
    counts = fold_lanes([("hot", [0, 1], [7000, 6500]), ("quiet", [0], [5])], bins,
                        first=_at(0), last=_at(1))

    trace = build_heatmap_figure(counts)["data"][0]

    assert trace["colorbar"]["ticktext"] == ["1", "10", "100", "1,000"]
    assert trace["colorbar"]["tickvals"] == [0, 1, 2, 3]
    assert trace["zmax"] == pytest.approx(3.845, abs=0.001)
    # the quiet lane's 5 events are a quarter of the way up the colour scale, not white
    assert trace["z"][1][0] / trace["zmax"] > 0.15


def test_log_files_of_several_components_alike_are_told_apart_each_by_its_own_part():
    """A must-gather's ``…apiserver/logs/current.log``: three components' pods, one per node
    or with a generated suffix, and a pod's previous log beside its current one. The parts in
    which they differ are too many for one label; each gets the fewest that tell it apart."""
    root = "must-gather-aws/quay-io-openshift-release-dev-sha256-0123/namespaces"
    pods = [("openshift-kube-apiserver", f"kube-apiserver-ip-10-0-{node}.ec2.internal",
             "kube-apiserver") for node in ("187-218", "195-177", "189-142")]
    pods += [("openshift-oauth-apiserver", f"apiserver-8468dd74fb-{pod}", "oauth-apiserver")
             for pod in ("p7vhs", "hw7fr", "nkqwv")]
    pods += [("openshift-apiserver", f"apiserver-5647477f76-{pod}", "openshift-apiserver")
             for pod in ("pvx6b", "2zz4k", "zxzjs")]
    names = [f"{root}/{namespace}/pods/{pod}/{container}/{container}/logs/current.log"
             for namespace, pod, container in pods]
    assert len({short_label(n) for n in names}) == 1  # the trouble

    labels = short_labels(names)

    assert len(set(labels)) == len(names)
    for (_, pod, _), label in zip(pods, labels, strict=False):
        assert len(label) <= LABEL_CHARS and label.startswith("…/")
        head, _, tail = label[2:].partition("…")
        assert pod.startswith(head) and pod.endswith(tail)  # the pod's part, shortened


def test_lanes_a_group_cannot_all_be_told_apart_by_are_told_apart_where_they_can():
    middles = [f"{'x' * 60}{n}{'y' * 60}" for n in ("a", "b")]  # told where labels cut
    middles += ["short", "another"]
    alike = [f"{'z' * 50}/{m}/containers/logs/current.log" for m in middles]
    assert len({short_label(n) for n in alike}) == 1  # one group: the same start and end

    labels = short_labels(alike)

    assert labels[2] == "…/short" and labels[3] == "…/another"
    assert labels[0] == labels[1] == short_label(alike[0])  # the twins keep theirs
