"""The first answer first: an upload goes ``reading`` → ``ready`` (its events stored, every read
exact) → ``complete`` (the analyses registered in ``timelines.analysis.registry`` have run);
``status`` is ``done`` only then."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hindsight.testing import requests_in
from incidents.models import Upload
from timelines.analysis import registry
from timelines.analysis.registry import after_ready, complete_incident, registered
from timelines.ingest import create_local_upload, fail_upload, ingest_upload
from timelines.ingest.uploads import requeue_stale
from timelines.models import IncidentInsights
from timelines.store import aggregate

pytestmark = pytest.mark.django_db


def ready_upload(incident, path) -> Upload:
    """``path`` ingested into ``incident`` up to the first answer, the analyses not run."""
    upload = ingest_upload(create_local_upload(incident, path).pk, complete=False)
    assert (upload.status, upload.stage) == ("running", "ready"), upload.message
    return upload


def unregister(*names: str) -> None:
    """Remove analyses a test registered."""
    for name in names:
        registry.ANALYSES.pop(name)
        registry.ALONGSIDE.discard(name)


@pytest.fixture
def recorded():
    """An analysis registered for the test (and removed after it) that records its calls."""
    calls = []

    @after_ready("test recorder")
    def record(incident_id: int) -> None:
        stage = set(Upload.objects.filter(incident_id=incident_id)
                    .values_list("status", "stage"))
        calls.append((incident_id, stage))

    yield calls
    registry.ANALYSES.pop("test recorder")


def test_a_ready_upload_answers_exactly_and_says_so_in_its_status(incident, demo_log, api_as,
                                                                 owner):
    upload = ready_upload(incident, demo_log)
    client = api_as(owner)

    status = client.get(f"/api/v1/uploads/{upload.pk}/").json()
    assert (status["status"], status["stage"]) == ("running", "ready")
    # every read answers from the stored events, as it will once complete
    expected = len(requests_in(demo_log))
    assert upload.event_count == expected
    page = client.get(f"/api/v1/incidents/{incident.pk}/events/",
                      {"page_size": expected + 10}).json()
    assert len(page["results"]) == expected
    assert aggregate.data_version(incident.pk) is not None  # final: its answers may be cached
    assert not IncidentInsights.objects.filter(incident=incident).exists()

    assert complete_incident(incident.pk)

    status = client.get(f"/api/v1/uploads/{upload.pk}/").json()
    total = len(registered())
    assert (status["status"], status["stage"]) == ("done", "complete")
    assert status["analyses"] == {"done": total, "total": total}
    assert IncidentInsights.objects.filter(incident=incident).exists()
    assert not complete_incident(incident.pk)  # nothing waits for it any more


def test_analyses_run_after_ready_in_order_and_a_failing_one_stops_nothing(
        incident, demo_log, recorded):
    @after_ready("test failure")
    def fail(incident_id: int) -> None:
        raise ValueError("broken analysis")

    try:
        upload = ready_upload(incident, demo_log)
        assert recorded == []  # never on the way to the first answer

        assert complete_incident(incident.pk)
    finally:
        registry.ANALYSES.pop("test failure")

    # run once, while the upload was ready, after the project's own analyses
    assert recorded == [(incident.pk, {("running", "ready")})]
    names = list(registered())
    assert names.index("test recorder") > names.index("insights")
    upload.refresh_from_db()
    assert (upload.status, upload.stage) == ("done", "complete")


def test_nothing_is_analysed_while_another_upload_is_read(incident, demo_log, fixtures_dir,
                                                          recorded):
    first = ready_upload(incident, demo_log)
    second = create_local_upload(incident, fixtures_dir / "audit"
                                 / "openshift-requestresponse.log")

    assert not complete_incident(incident.pk)
    assert recorded == []
    assert aggregate.data_version(incident.pk) is not None  # a pending file changes nothing yet

    ingest_upload(second.pk)  # the last one to be ready completes them all

    assert recorded == [(incident.pk, {("running", "ready")})]
    assert set(incident.uploads.values_list("pk", "status", "stage")) == {
        (first.pk, "done", "complete"), (second.pk, "done", "complete")}


def test_a_ready_upload_is_not_failed_by_what_comes_after(incident, demo_log):
    upload = ready_upload(incident, demo_log)

    fail_upload(upload.pk, "the worker was lost")

    upload.refresh_from_db()
    assert (upload.status, upload.stage, upload.message) == ("running", "ready", "")


def test_a_lost_completion_is_started_again_and_a_ready_upload_never_read_again(
        incident, demo_log, settings):
    upload = ready_upload(incident, demo_log)
    stale = timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS + 1)
    Upload.objects.filter(pk=upload.pk).update(heartbeat_at=stale)
    ingested, completed = [], []

    assert requeue_stale(ingested.append, completed.append) == 1

    assert (ingested, completed) == ([], [incident.pk])
    upload.refresh_from_db()
    assert (upload.status, upload.stage) == ("running", "ready")
    assert upload.heartbeat_at > stale  # not started twice by the next sweep
    assert requeue_stale(ingested.append, completed.append) == 0
    assert complete_incident(incident.pk)  # the lost run's claim was given up


def test_analyses_under_way_are_not_run_twice(incident, demo_log, recorded, settings):
    upload = ready_upload(incident, demo_log)
    Upload.objects.filter(pk=upload.pk).update(
        analyses={"done": 1, "total": 4, "running": "overview", "run": "another run"},
        heartbeat_at=timezone.now())

    assert not complete_incident(incident.pk)
    assert recorded == []

    stale = timezone.now() - timedelta(seconds=settings.UPLOAD_STALE_SECONDS + 1)
    Upload.objects.filter(pk=upload.pk).update(heartbeat_at=stale)  # that run died
    assert complete_incident(incident.pk)
    assert recorded == [(incident.pk, {("running", "ready")})]


def test_the_incident_page_shows_the_analyses_behind_a_ready_upload(incident, demo_log, client,
                                                                    owner):
    upload = ready_upload(incident, demo_log)
    Upload.objects.filter(pk=upload.pk).update(
        analyses={"done": 2, "total": 4, "running": "insights"})
    client.force_login(owner)

    page = client.get(incident.get_absolute_url()).content.decode()

    assert "ready; analysing 2/4 (insights)" in page
    # its row is polled until complete, and known to be readable already
    assert f'data-upload="{upload.pk}"' in page
    row = page[page.index(f'data-upload="{upload.pk}"'):].split(">", 1)[0]
    assert 'data-finished="0"' in row and 'data-ready="1"' in row
    assert 'id="reload-hint"' in page


@pytest.mark.django_db(transaction=True)
def test_analyses_registered_alongside_run_in_a_lane_beside_the_others(incident, demo_log,
                                                                        monkeypatch):
    """On PostgreSQL outside a caller's transaction, the ``alongside`` analyses (the column
    index, the overview) run in a thread of their own while the others run; a reader of the
    column index in the other lane waits for that lane (``columns.wait_built``)."""
    import threading

    from timelines.store import columns

    other_started = threading.Event()
    seen = []
    insights = registered()["insights"]  # the other lane's first

    def insights_first(incident_id: int) -> None:
        other_started.set()
        insights(incident_id)

    monkeypatch.setitem(registry.ANALYSES, "insights", insights_first)

    @after_ready("test beside", alongside=True)
    def beside(incident_id: int) -> None:
        seen.append(("beside", threading.current_thread().name,
                     other_started.wait(20)))  # the other lane runs meanwhile

    @after_ready("test reader")
    def reader(incident_id: int) -> None:
        columns.wait_built(incident_id)
        seen.append(("reader", threading.current_thread().name, len(seen)))

    try:
        ready_upload(incident, demo_log)
        assert complete_incident(incident.pk)
        total = len(registered())
    finally:
        registry.ANALYSES.pop("test beside")
        registry.ANALYSES.pop("test reader")
        registry.ALONGSIDE.discard("test beside")
    assert seen == [("beside", f"analyses-{incident.pk}", True),
                    ("reader", threading.current_thread().name, 1)]
    assert columns._announced == {}
    upload = incident.uploads.get()
    assert (upload.status, upload.stage) == ("done", "complete")
    assert upload.analyses == {"done": total, "total": total}


@pytest.mark.django_db(transaction=True)
def test_a_reader_of_the_column_index_goes_on_once_it_is_built_not_after_the_lane(
        incident, demo_log):
    """The lane beside builds the column index, then goes on (the partition indexes); the
    other lane's readers of the index (the detections, the insights counted on it) wait for
    the index only: here the lane's analysis after the index ends only once the reader has
    gone on, which it would never do if it waited for the whole lane."""
    import threading

    from timelines.store import columns

    reader_went_on = threading.Event()
    seen = []

    @after_ready("test after the index", alongside=True)
    def after_index(incident_id: int) -> None:
        seen.append(("after the index", reader_went_on.wait(20)))

    @after_ready("test reader")
    def reader(incident_id: int) -> None:
        columns.wait_built(incident_id)
        reader_went_on.set()

    try:
        ready_upload(incident, demo_log)
        assert complete_incident(incident.pk)
    finally:
        unregister("test after the index", "test reader")
    assert seen == [("after the index", True)]
    assert columns._announced == {}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cpus", [2, 8])
def test_each_lane_plans_for_its_share_of_the_cpus(incident, demo_log, monkeypatch, cpus):
    """The two lanes are the parallel work behind the first answer: each plans its queries and
    index builds with the workers its half of the CPUs leaves (none on two CPUs, where a
    parallel plan only takes CPU from the other lane), and the connection that runs the
    completion plans as before afterwards."""
    import os

    from django.db import connection

    def parallel() -> tuple[str, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('max_parallel_workers_per_gather'),"
                           " current_setting('max_parallel_maintenance_workers')")
            return cursor.fetchone()

    before = parallel()
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    seen = {}

    @after_ready("test beside", alongside=True)
    def beside(incident_id: int) -> None:
        seen["beside"] = parallel()

    @after_ready("test other")
    def other(incident_id: int) -> None:
        seen["other"] = parallel()

    try:
        ready_upload(incident, demo_log)
        assert complete_incident(incident.pk)
    finally:
        unregister("test beside", "test other")
    share = str(cpus // 2 - 1)
    assert seen == {"beside": (share, share), "other": (share, share)}
    assert parallel() == before


@pytest.mark.django_db(transaction=True)
def test_a_database_error_in_the_lane_beside_fails_the_completion(incident, demo_log):
    from django.db import OperationalError

    @after_ready("test lost database", alongside=True)
    def lost(incident_id: int) -> None:
        raise OperationalError("connection lost")

    try:
        ready_upload(incident, demo_log)
        with pytest.raises(OperationalError):
            complete_incident(incident.pk)
    finally:
        registry.ANALYSES.pop("test lost database")
        registry.ALONGSIDE.discard("test lost database")
    upload = incident.uploads.get()
    assert (upload.status, upload.stage) == ("running", "ready")  # a retry completes it


def test_an_uploads_progress_shows_at_the_first_report_then_once_a_second(incident, tmp_path):
    """A large file's reading shows its progress at once (a 160 MB audit log is read in a
    second: waiting a second first showed nothing until it was done), then at most once a
    second. A small one (a bundle holds thousands) writes none at its first report: its
    outcome, a moment later, says the same."""
    from timelines.ingest import pipeline
    from timelines.parsers import Report

    large = pipeline.THREAD_MIN_BYTES
    for total, first in ((large, 100), (large - 1, 0)):
        upload = Upload.objects.create(incident=incident, name="big.log",
                                       path=str(tmp_path / "x"),
                                       status=Upload.Status.RUNNING, bytes_total=total)
        heard = []
        progress = pipeline._Progress(upload.pk, Report("big.log"), total,
                                      lambda read, total, rows, heard=heard: heard.append(read))
        progress.parsed(100, 10)
        assert Upload.objects.get(pk=upload.pk).bytes_read == first
        progress.parsed(200, 20)  # within the second
        assert Upload.objects.get(pk=upload.pk).bytes_read == first
        assert heard == ([first] if first else [])
