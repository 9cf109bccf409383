"""The Falco rules over a stream's batches as they arrive (``streams.detect``): after the 200,
the matches of each batch's requests are stored for the stream's events filter
``detection=<rule>``, the same the rules find in an incident holding those requests, and a cut
incident's detections find them too."""

from __future__ import annotations

import os
import threading
from collections import defaultdict

import orjson
import pytest

from incidents.models import Incident
from streams import store
from streams.rounds import detect_batch
from timelines.detections.incident import detections, evaluate, ruleset_of_team
from timelines.detections.models import DetectionMatch
from timelines.ingest.store import write_rows
from timelines.models import Event

from .helpers import event_list, expected_rows, fixture_events


def falco_traces(fixtures_dir) -> list:
    """Falco's k8s_audit test traces (one request per file or a few): requests its rules
    match."""
    return sorted((fixtures_dir / "audit" / "falco").glob("*.json"))


def day_traces(fixtures_dir):
    """(paths, lines) of the traces of one day (others are years apart: a ring of hours keeps
    only some of them)."""
    paths = [path for path in falco_traces(fixtures_dir)
             if all(_of_day(line) for line in fixture_events(path))]
    lines = [line for path in paths for line in fixture_events(path)]
    assert lines
    return paths, lines


def _of_day(line: bytes) -> bool:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("kind") == "Event" and str(
        event.get("requestReceivedTimestamp", "")).startswith("2018-10-26")


def matches_by_key(incident_ids) -> dict[str, set]:
    """rule → {(received, auditID)} of the stored matches of these incidents."""
    keys = dict(((pk), (r, a)) for pk, r, a in Event.objects.filter(
        incident_id__in=incident_ids).values_list("id", "received", "audit_id"))
    out = defaultdict(set)
    for rule, event_id in DetectionMatch.objects.filter(
            incident_id__in=incident_ids).values_list("rule", "event_id"):
        out[rule].add(keys[event_id])
    return dict(out)


def expected_matches(team, rows) -> dict[str, set]:
    """What the rules match among ``rows`` stored as an ordinary incident."""
    incident = Incident.objects.create(title="expected", team=team)
    write_rows(incident.pk, None, rows)
    found = evaluate(incident.pk, ruleset_of_team(team.pk))
    keys = dict(Event.objects.filter(incident=incident).values_list("id", "received"))
    audit = dict(Event.objects.filter(incident=incident).values_list("id", "audit_id"))
    return {rule: {(keys[i], audit[i]) for i in ids} for rule, ids in found.ids.items() if ids}


def stored_lines(stream, paths) -> list:
    """The rows of ``paths`` that the stream kept (its ring drops hours too old for it)."""
    kept = set(store.events(stream).values_list("received", "audit_id"))
    return [row for path in paths for row in expected_rows(path)
            if (row.received, row.audit_id) in kept]


def post_and_wait(post_batch, stream, token, lines, size=40):
    """Post ``lines`` in batches of ``size``, each time waiting for the detection round of this
    process (its thread, which waits for its child when the rounds run there)."""
    for start in range(0, len(lines), size):
        before = {t for t in threading.enumerate() if t.name == "stream-detect"}
        answer = post_batch(stream.pk, event_list(lines[start:start + size]), token)
        assert answer.status_code == 200, answer.content
        for thread in threading.enumerate():
            if thread.name == "stream-detect" and thread not in before:
                thread.join(60)


@pytest.mark.parametrize("where", ["process", "thread"])
@pytest.mark.django_db(transaction=True)
def test_batches_are_evaluated_after_the_answer(stream_of, post_batch, team, fixtures_dir,
                                                superuser, settings, client, where):
    settings.CELERY_BROKER_URL = ""  # this process's rounds, which the test can wait for
    settings.STREAM_DETECTIONS = where
    stream, token = stream_of(retention_hours=6)
    paths, lines = day_traces(fixtures_dir)
    post_and_wait(post_batch, stream, token, lines)
    from streams import detector

    child = detector._detector.pid if detector._detector is not None else None
    assert (child is not None) == (where == "process")
    slots = store.incident_ids(stream)
    expected = expected_matches(team, stored_lines(stream, paths))
    assert expected  # the traces are Falco's: its rules match some of them
    assert matches_by_key(slots) == expected
    # the stream's events filter
    client.force_login(superuser)
    rule = sorted(expected)[0]
    listed = client.get(f"/api/v1/streams/{stream.pk}/events/",
                        {"detection": rule, "limit": 500}).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert len(rows) == len(expected[rule])
    # a cut incident's detections
    answer = client.post(f"/api/v1/streams/{stream.pk}/incidents/",
                         {"since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z",
                          "title": "cut", "detection": [rule]}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    cut = answer.json()["id"]
    assert Event.objects.filter(incident_id=cut).count() == len(expected[rule])
    assert {i["rule"] for i in detections(cut) if i.get("rule")} >= {rule}
    assert matches_by_key([cut])[rule] == expected[rule]


@pytest.mark.django_db
def test_evaluating_again_replaces_and_emptying_drops(stream_of, post_batch, team, fixtures_dir):
    """Matches of a batch replace those of its requests (a request's later stages arrive in
    later batches and are evaluated again); a slot emptied takes its matches with it."""
    stream, token = stream_of()  # 3 slots: the day's hours 9, 13 and 14 each have one
    paths, lines = day_traces(fixtures_dir)
    half = len(lines) // 2
    for part in (lines[:half], lines[half:]):
        answer = post_batch(stream.pk, event_list(part), token)
        assert answer.status_code == 200
    slots = store.incident_ids(stream)
    # what the receiver queued (no worker here), over all the requests, twice
    keys = {slot: [(r.isoformat(), a) for r, a in store.events(stream).filter(
        incident_id=slot).values_list("received", "audit_id")] for slot in slots}
    detect_batch(keys)
    first = matches_by_key(slots)
    assert first
    detect_batch(keys)
    assert matches_by_key(slots) == first
    assert DetectionMatch.objects.filter(incident_id__in=slots).count() == sum(
        len(v) for v in first.values())
    assert first == expected_matches(team, stored_lines(stream, paths))
    for segment in stream.segments.all():
        store.empty_segment(segment)
    assert not DetectionMatch.objects.filter(incident_id__in=slots).exists()


def test_batches_stored_while_an_evaluation_runs_are_evaluated_together(settings, monkeypatch):
    """Without a broker one thread a process evaluates the batches: those stored meanwhile are
    taken in its next round, all at once, not each in a thread of its own."""
    from streams import detect

    settings.CELERY_BROKER_URL = ""
    settings.STREAM_DETECTIONS = "thread"  # detect_batch replaced below, in this process
    started, release = threading.Event(), threading.Event()
    rounds = []

    def evaluate_round(stored, pause=None):
        rounds.append({k: list(v) for k, v in stored.items()})
        started.set()
        release.wait(30)
        return {}

    monkeypatch.setattr(detect, "detect_batch", evaluate_round)
    detect.enqueue({1: [("2024-01-01T00:00:00+00:00", "a")]})
    assert started.wait(30)
    for audit_id in "bcde":
        detect.enqueue({1: [("2024-01-01T00:00:01+00:00", audit_id)], 2: [("t", audit_id)]})
    assert [t.name for t in threading.enumerate()].count("stream-detect") == 1
    release.set()
    for thread in threading.enumerate():
        if thread.name == "stream-detect":
            thread.join(30)
    assert len(rounds) == 2
    assert [a for _, a in rounds[1]["1"]] == list("bcde")
    assert [a for _, a in rounds[1]["2"]] == list("bcde")


@pytest.mark.django_db
def test_the_stream_figure_stars_the_requests_its_rules_matched(
        stream_of, post_batch, team, fixtures_dir, superuser, client):
    from timelines.detections import rules
    from timelines.figures.build import hover_texts

    stream, token = stream_of()
    paths, lines = day_traces(fixtures_dir)
    assert post_batch(stream.pk, event_list(lines), token).status_code == 200
    slots = store.incident_ids(stream)
    client.force_login(superuser)
    window = {"since": "2018-10-26T00:00:00Z"}  # every event of the day, not the last minutes

    def stars(**query) -> dict[int, str]:
        figure = client.get(f"/api/v1/streams/{stream.pk}/figure/", {**window, **query}).json()
        assert figure["meta"]["mode"] == "gantt" and figure["meta"]["spans"] > 0
        return {event_id: text
                for trace, texts in zip(figure["data"], hover_texts(figure), strict=True)
                if trace.get("legendgroup") == "detected"
                for event_id, text in zip(trace["customdata"], texts, strict=True)}

    assert stars() == {}  # no worker here: nothing detected yet
    detect_batch({slot: [(r.isoformat(), a) for r, a in store.events(stream).filter(
        incident_id=slot).values_list("received", "audit_id")] for slot in slots})
    matched = defaultdict(set)
    for event_id, rule in DetectionMatch.objects.filter(incident_id__in=slots).values_list(
            "event_id", "rule"):
        matched[event_id].add(rule)
    assert matched
    priority = {r.name: r.priority for r in rules.load(rules.default_files()).rules}
    starred = stars()
    assert set(starred) == set(matched)
    for event_id, text in starred.items():
        assert all(f"{rule} ({priority[rule]})" in text for rule in matched[event_id])
    rule = "Attach/Exec Pod"
    chosen = {e for e, names in matched.items() if rule in names}
    assert chosen and set(stars(detection=rule)) == chosen


def test_a_round_takes_at_most_its_limit_of_requests_oldest_first(monkeypatch):
    from streams import detect

    monkeypatch.setattr(detect, "_pending", {"1": [1, 2], "2": [3, 4, 5]})
    assert detect._take(3) == {"1": [1, 2], "2": [3]}
    assert detect._pending == {"2": [4, 5]}
    assert detect._take(3) == {"2": [4, 5]}
    assert detect._pending == {}


@pytest.mark.django_db
def test_a_round_analyzes_its_slot_when_it_has_doubled(stream_of, post_batch, demo_log,
                                                        monkeypatch):
    from django.db import connection

    from streams import rounds

    monkeypatch.setattr(rounds, "ANALYZE_FROM", 10)
    monkeypatch.setattr(rounds, "_analyzed", {})
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(fixture_events(demo_log)), token).status_code == 200
    segment = max(stream.segments.all(), key=lambda s: s.events)
    table = store.slot_table(stream.pk, segment.slot)

    def tuples():
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
            return cursor.fetchone()[0]

    assert tuples() <= 0  # never analyzed
    assert rounds.analyze_if_grown(segment)
    assert tuples() == Event.objects.filter(incident_id=segment.incident_id).count()
    assert not rounds.analyze_if_grown(segment)  # not grown since
    segment.events *= 2
    assert rounds.analyze_if_grown(segment)
    segment.events = 0  # emptied and taken again
    assert not rounds.analyze_if_grown(segment)


def test_a_round_gives_way_while_a_batch_is_being_received(monkeypatch):
    """After each slice of its work a round waits while this process receives a batch (up to
    GIVE_WAY), and does not wait when none is."""
    from streams import detect

    monkeypatch.setattr(detect, "WORK_SLICE", 0.0)
    monkeypatch.setattr(detect, "GIVE_WAY", 30.0)
    pause = detect.GiveWay()
    pause()
    assert pause.waited == 0.0  # nothing being received: no wait
    entered, leave = threading.Event(), threading.Event()

    def receive():
        with detect.receiving():
            entered.set()
            leave.wait(30)

    receiver = threading.Thread(target=receive)
    receiver.start()
    assert entered.wait(30)
    threading.Timer(0.3, leave.set).start()
    pause()  # returns once the batch is received, long before GIVE_WAY
    receiver.join(30)
    assert 0.2 < pause.waited < 20
    assert detect._receiving == 0 and detect._idle.is_set()


@pytest.mark.django_db
def test_the_receiver_holds_the_detections_back_while_it_stores(stream_of, post_batch,
                                                                  demo_log, monkeypatch):
    from streams import detect, receiver

    seen = []
    real = receiver.write_batch

    def write_batch(stream, rows):
        seen.append((detect._receiving, detect._idle.is_set()))
        return real(stream, rows)

    monkeypatch.setattr(receiver, "write_batch", write_batch)
    stream, token = stream_of()
    assert post_batch(stream.pk, event_list(fixture_events(demo_log)), token).status_code == 200
    assert seen == [(1, False)]
    assert detect._receiving == 0 and detect._idle.is_set()
    # a refused batch leaves it too
    assert post_batch(stream.pk, b'{"kind": "EventList"}', token).status_code == 400
    assert detect._receiving == 0 and detect._idle.is_set()


@pytest.mark.django_db
def test_a_round_that_gives_way_finds_the_same_matches(stream_of, post_batch, team,
                                                       fixtures_dir):
    stream, token = stream_of()
    paths, lines = day_traces(fixtures_dir)
    assert post_batch(stream.pk, event_list(lines), token).status_code == 200
    slots = store.incident_ids(stream)
    keys = {slot: [(r.isoformat(), a) for r, a in store.events(stream).filter(
        incident_id=slot).values_list("received", "audit_id")] for slot in slots}
    calls = []
    detect_batch(keys, pause=lambda: calls.append(1))
    assert len(calls) > 10  # between groups and bodies, not only around the round
    assert matches_by_key(slots) == expected_matches(team, stored_lines(stream, paths))


def test_the_detection_thread_runs_below_the_receivers():
    from streams import detect

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = []

    def run():
        detect._lower_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert seen == [min(19, base + detect.DETECT_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # not this one


@pytest.mark.django_db(transaction=True)
def test_rounds_run_in_a_child_process_below_the_receivers_which_is_started_again(
        stream_of, post_batch, team, fixtures_dir, settings):
    """On PostgreSQL without a broker a web process's rounds run in its child process, at the
    lowest CPU priority; a child killed is started again and the next batches are evaluated;
    a child whose input closes exits."""
    from streams import detector

    settings.CELERY_BROKER_URL = ""
    stream, token = stream_of(retention_hours=6)
    paths, lines = day_traces(fixtures_dir)
    half = len(lines) // 2
    post_and_wait(post_batch, stream, token, lines[:half])
    child = detector.detector().process
    assert child is not None and child.poll() is None and child.pid != os.getpid()
    assert os.getpriority(os.PRIO_PROCESS, child.pid) == detector.NICE
    assert os.getpriority(os.PRIO_PROCESS, 0) < detector.NICE  # the receivers' is not lowered
    slots = store.incident_ids(stream)
    first = DetectionMatch.objects.filter(incident_id__in=slots).count()
    assert first

    child.kill()
    child.wait()
    post_and_wait(post_batch, stream, token, lines[half:])
    again = detector.detector().process
    assert again is not None and again.pid != child.pid and again.poll() is None
    assert matches_by_key(slots) == expected_matches(team, stored_lines(stream, paths))

    detector.detector().stop()
    assert again.wait(10) == 0


@pytest.mark.django_db(transaction=True)
def test_a_round_the_child_cannot_do_is_an_error_and_the_child_goes_on(settings):
    from streams import detector

    with pytest.raises(RuntimeError, match="stream detector: ValueError"):
        detector.detector().run({"not an incident": [["2024-01-01T00:00:00+00:00", "a"]]})
    process = detector.detector().process
    assert detector.detector().run({}) == {}
    assert detector.detector().process is process  # the same child


@pytest.mark.django_db(transaction=True)
def test_a_child_that_cannot_start_leaves_the_round_to_the_thread(
        stream_of, post_batch, team, fixtures_dir, settings, monkeypatch):
    from streams import detector

    settings.CELERY_BROKER_URL = ""
    monkeypatch.setattr(detector, "PYTHON", "false")  # exits at once, answering nothing
    stream, token = stream_of(retention_hours=6)
    paths, lines = day_traces(fixtures_dir)
    post_and_wait(post_batch, stream, token, lines)
    assert matches_by_key(store.incident_ids(stream)) == expected_matches(
        team, stored_lines(stream, paths))
