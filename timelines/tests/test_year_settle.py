"""The year of logs that carry none, from the rest of their incident, in the database
(``timelines.ingest.years``): chosen at ingest when the other evidence is in, moved by whole years
when the incident's uploads have all finished when it came later. On PostgreSQL, and the tests
marked ``embedded`` on SQLite.

Expected times are the klog headers of the fixture files read here, in the year of the audit log
or Events beside them (read here too); never what the code under test produced.
"""

from __future__ import annotations

import calendar
import io
import json
import re
import tarfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from django.core.management import call_command
from django.db import transaction

from incidents.models import Incident, Upload
from incidents.notes import Annotation, Sequence, SequenceStep
from timelines.ingest import create_local_upload, ingest_upload, settle_years
from timelines.ingest.years import GUESS_KEY, move_upload_events
from timelines.models import Event
from timelines.parsers.base import parse_time
from timelines.store import aggregate

pytestmark = pytest.mark.django_db

HEADER = re.compile(rb"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ", re.M)


# --- helpers -----------------------------------------------------------------------------------

def header_times(path: Path, year: int) -> list[datetime]:
    """The klog header times of a file in ``year``, in file order (none crosses New Year)."""
    return [datetime(year, *map(int, m.groups()), tzinfo=UTC)
            for m in HEADER.finditer(path.read_bytes())]


def audit_year(path: Path) -> int:
    (year,) = {parse_time(orjson.loads(line)["requestReceivedTimestamp"]).year
               for line in path.read_bytes().splitlines() if line}
    return year


def log_times(upload: Upload) -> list[datetime]:
    return list(Event.objects.filter(upload_id=upload.pk, kind="log")
                .order_by("line").values_list("received", flat=True))


def year_note(upload: Upload) -> str:
    upload.refresh_from_db()
    return upload.notes[upload.hints[GUESS_KEY]["note"]]


@pytest.fixture
def klog_file(fixtures_dir) -> Path:
    return fixtures_dir / "klog" / "kind-kube-apiserver.txt"


@pytest.fixture
def audit_file(fixtures_dir) -> Path:
    """An audit log of June: the kind logs' 27 January is nearest in the same year."""
    return fixtures_dir / "audit" / "openshift-requestresponse.log"


def klog_before_audit(incident, klog_file, audit_file) -> tuple[Upload, Upload, int]:
    """The klog file ingested alone (its year assumed), then the audit log; not settled yet.
    Returns both uploads and the year the klog file was first given."""
    klog = ingest_upload(create_local_upload(incident, klog_file).pk, complete=False)
    assumed = log_times(klog)[0].year
    assert log_times(klog) == header_times(klog_file, assumed)
    assert "assumed" in year_note(klog)
    assert assumed != audit_year(audit_file)  # else nothing would have to move
    audit = ingest_upload(create_local_upload(incident, audit_file).pk, complete=False)
    return klog, audit, assumed


def assert_moved(klog: Upload, klog_file: Path, year: int, assumed: int) -> None:
    assert log_times(klog) == header_times(klog_file, year)
    events = Event.objects.filter(upload_id=klog.pk)
    assert all(e.completed == e.received for e in events if e.kind == "log")
    assert all(e.body()["time"] == e.received.isoformat() for e in events if e.kind == "log")
    note = year_note(klog)
    assert note.startswith(f"year {year} for the klog headers")
    assert "nearest to the incident's other evidence" in note
    assert f"moved from {assumed}" in note


def bundle_of(path: Path, mtime: datetime, into: Path) -> Path:
    """A tar.gz holding ``path`` at its top level, its file time ``mtime``: a bundle of no known
    layout, whose collection time is its file times."""
    bundle = into / "bundle.tar.gz"
    data = path.read_bytes()
    with tarfile.open(bundle, "w:gz") as archive:
        info = tarfile.TarInfo(path.name)
        info.size, info.mtime = len(data), mtime.timestamp()
        archive.addfile(info, io.BytesIO(data))
    return bundle


# --- PostgreSQL --------------------------------------------------------------------------------

def test_a_klog_file_ingested_after_an_audit_log_takes_its_year(incident, ingest_file, klog_file,
                                                                audit_file):
    ingest_file(incident, audit_file)
    klog = ingest_file(incident, klog_file)

    year = audit_year(audit_file)
    assert log_times(klog) == header_times(klog_file, year)
    note = year_note(klog)
    assert note.startswith(f"year {year} for the klog headers")
    assert "nearest to the incident's other evidence" in note and "moved from" not in note
    version = aggregate.data_version(incident.pk)

    assert settle_years(incident.pk) == {}  # right already: nothing to move
    assert aggregate.data_version(incident.pk) == version


def test_a_klog_file_ingested_before_the_audit_log_moves_when_the_uploads_finish(
        incident, owner, klog_file, audit_file):
    klog, _, assumed = klog_before_audit(incident, klog_file, audit_file)
    first = Event.objects.filter(upload_id=klog.pk, kind="log").order_by("received").first()
    mark = Annotation.objects.create(incident=incident, event_id=first.pk, start=first.received,
                                     note="apiserver up", author=owner)
    sequence = Sequence.objects.create(incident=incident, title="boot", author=owner)
    step = SequenceStep.objects.create(sequence=sequence, position=0, event_id=first.pk,
                                       at=first.received)
    ids = set(Event.objects.filter(upload_id=klog.pk).values_list("pk", flat=True))
    version = aggregate.data_version(incident.pk)

    settled = settle_years(incident.pk)

    year = audit_year(audit_file)
    assert list(settled) == [klog.pk]
    assert_moved(klog, klog_file, year, assumed)
    assert set(Event.objects.filter(upload_id=klog.pk).values_list("pk", flat=True)) == ids
    assert aggregate.data_version(incident.pk) != version  # a new column index, new figures
    moved_first = header_times(klog_file, year)[0]
    mark.refresh_from_db()
    step.refresh_from_db()
    assert mark.start == step.at == moved_first

    # again: nothing changes
    klog.refresh_from_db()
    version, finished_at, notes = aggregate.data_version(incident.pk), klog.finished_at, klog.notes
    assert settle_years(incident.pk) == {}
    klog.refresh_from_db()
    assert (klog.finished_at, klog.notes) == (finished_at, notes)
    assert aggregate.data_version(incident.pk) == version
    assert log_times(klog) == header_times(klog_file, year)


def test_a_second_settle_that_read_the_upload_before_the_first_moved_it_does_nothing(
        incident, klog_file, audit_file):
    # Two uploads finishing at once both settle: the one that reads the row first and claims it
    # second must find it claimed (a compare-and-set on the guess), not move it again.
    from timelines.ingest.years import IncidentEvidence, _settle

    klog, _, assumed = klog_before_audit(incident, klog_file, audit_file)
    stale = Upload.objects.get(pk=klog.pk)

    assert list(settle_years(incident.pk)) == [klog.pk]
    assert _settle(incident.pk, stale, IncidentEvidence(incident.pk), None) is None

    assert_moved(klog, klog_file, audit_year(audit_file), assumed)


def test_nothing_moves_while_an_upload_of_the_incident_is_unfinished(incident, klog_file,
                                                                     audit_file):
    klog, _, assumed = klog_before_audit(incident, klog_file, audit_file)
    waiting = create_local_upload(incident, audit_file)

    assert settle_years(incident.pk) == {}
    assert log_times(klog) == header_times(klog_file, assumed)

    ingest_upload(waiting.pk, complete=False)
    assert list(settle_years(incident.pk)) == [klog.pk]


def test_the_warm_task_settles_the_years_once_the_last_upload_finished(incident, klog_file,
                                                                       audit_file):
    from timelines.tasks import complete_incident_task

    klog, _, assumed = klog_before_audit(incident, klog_file, audit_file)

    complete_incident_task.apply(args=[incident.pk]).get()

    assert_moved(klog, klog_file, audit_year(audit_file), assumed)


def test_the_ingest_command_settles_a_klog_file_read_before_the_audit_log(klog_file, audit_file):
    out = io.StringIO()
    call_command("ingest", str(klog_file), str(audit_file), incident="kind", json=True, stdout=out,
                 stderr=io.StringIO())

    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    klog = Upload.objects.get(pk=summary["uploads"][0]["id"])
    year = audit_year(audit_file)
    assert log_times(klog) == header_times(klog_file, year)
    notes = summary["uploads"][0]["notes"]
    assert any(n.startswith(f"year {year} for the klog headers") and "moved from" in n
               for n in notes)


def test_a_klog_file_in_a_bundle_with_a_collection_year_is_never_moved(
        incident, ingest_file, klog_file, audit_file, tmp_path):
    collected = datetime(audit_year(audit_file) - 4, 3, 1, 12, 0, tzinfo=UTC)
    assert header_times(klog_file, collected.year)[0] < collected  # the premise: same year
    ingest_file(incident, bundle_of(klog_file, collected, tmp_path))
    ingest_file(incident, audit_file)

    settle_years(incident.pk)

    (child,) = Upload.objects.filter(incident=incident, format="klog")
    assert GUESS_KEY not in child.hints
    assert log_times(child) == header_times(klog_file, collected.year)
    assert any(f"year {collected.year}" in note and "collection time" in note
               for note in child.notes)


def test_a_loose_copy_of_a_bundled_file_moves_onto_it_without_duplicates(
        incident, ingest_file, klog_file, tmp_path):
    loose = ingest_file(incident, klog_file)  # alone: its year assumed
    assumed = log_times(loose)[0].year
    collected = datetime(assumed - 3, 3, 1, tzinfo=UTC)
    ingest_file(incident, bundle_of(klog_file, collected, tmp_path))
    bundled = Upload.objects.get(incident=incident, format="klog", parent__isnull=False)
    kept = log_times(bundled)
    assert kept == header_times(klog_file, collected.year)

    settle_years(incident.pk)

    events = Event.objects.filter(incident=incident, kind="log")
    assert sorted(events.values_list("received", flat=True)) == sorted(kept)
    assert not events.filter(upload_id=loose.pk).exists()


def test_29_february_alone_gets_a_leap_year_and_keeps_one_against_common_years(
        incident, ingest_file, fixtures_dir, tmp_path):
    lines = [f"I0229 23:59:5{n}.00000{n}       1 main.go:{n}] line {n}" for n in range(3)]
    lines.append("I0301 00:00:01.000009       1 main.go:9] the next day")
    path = tmp_path / "kube-scheduler.log"
    path.write_text("\n".join(lines) + "\n")
    events_file = fixtures_dir / "events" / "kspan-deployment-2-pods.yaml"

    klog = ingest_file(incident, path)
    assert klog.event_count == len(lines)
    assert calendar.isleap(log_times(klog)[0].year)
    ingest_file(incident, events_file)
    evidence = {e.year for e in Event.objects.filter(incident=incident, kind="event")
                .values_list("received", flat=True)}

    settle_years(incident.pk)

    times = log_times(klog)
    assert len(times) == len(lines)
    year = times[0].year
    assert calendar.isleap(year) and min(evidence) - 4 <= year <= max(evidence) + 4
    assert [(t.month, t.day) for t in times] == [(2, 29)] * 3 + [(3, 1)]


def test_a_move_into_a_common_year_makes_29_february_the_28th(incident, tmp_path):
    assert_leap_day_clamped(incident, tmp_path)


# --- SQLite ------------------------------------------------------------------------------------

@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_a_klog_file_read_before_the_audit_log_moves_on_sqlite(klog_file, audit_file):
    out = io.StringIO()
    call_command("ingest", str(klog_file), str(audit_file), incident="kind", json=True, stdout=out,
                 stderr=io.StringIO())
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    klog = Upload.objects.get(pk=summary["uploads"][0]["id"])
    assumed = klog.hints[GUESS_KEY]["parsed_year"]

    assert_moved(klog, klog_file, audit_year(audit_file), assumed)
    assert settle_years(klog.incident_id) == {}


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_the_embedded_ingest_thread_settles_the_years_after_the_last_upload(klog_file,
                                                                            audit_file):
    from timelines.tasks import _start_thread

    incident = Incident.objects.create(title="embedded")
    klog = create_local_upload(incident, klog_file)
    audit = create_local_upload(incident, audit_file)

    def finished(upload, test=lambda u: u.finished):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            upload.refresh_from_db()
            if test(upload):
                return
            time.sleep(0.05)
        raise AssertionError(f"{upload.name} did not finish")

    before = threading.active_count()
    _start_thread(klog.pk)
    finished(klog)
    assumed = klog.hints[GUESS_KEY]["parsed_year"]
    _start_thread(audit.pk)
    finished(audit)
    finished(klog, lambda u: f"moved from {assumed}" in u.notes[u.hints[GUESS_KEY]["note"]])
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)

    assert_moved(klog, klog_file, audit_year(audit_file), assumed)


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_a_move_into_a_common_year_makes_29_february_the_28th_on_sqlite(tmp_path):
    assert_leap_day_clamped(Incident.objects.create(title="leap"), tmp_path)


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_a_loose_copy_of_a_bundled_file_moves_onto_it_on_sqlite(klog_file, tmp_path):
    incident = Incident.objects.create(title="copies")
    loose = ingest_upload(create_local_upload(incident, klog_file).pk)
    collected = datetime(log_times(loose)[0].year - 3, 3, 1, tzinfo=UTC)
    ingest_upload(create_local_upload(incident, bundle_of(klog_file, collected, tmp_path)).pk)

    settle_years(incident.pk)

    times = Event.objects.filter(incident=incident, kind="log").values_list("received", flat=True)
    assert sorted(times) == sorted(header_times(klog_file, collected.year))


def assert_leap_day_clamped(incident, tmp_path) -> None:
    """A file read in a leap year, moved by a year: its 29 February is the 28th, the clock kept,
    and its 28 February line, of other text, stays apart."""
    lines = ["I0228 10:00:00.000001       1 main.go:1] the day before",
             "I0229 10:00:00.000002       1 main.go:2] leap day"]
    path = tmp_path / "kube-proxy.log"
    path.write_text("\n".join(lines) + "\n")
    leap = max(y for y in range(2000, datetime.now(UTC).year + 1) if calendar.isleap(y))
    upload = create_local_upload(incident, path)
    Upload.objects.filter(pk=upload.pk).update(hints={"year": leap, "year_reason": "test"})
    klog = ingest_upload(upload.pk)
    assert log_times(klog) == [datetime(leap, 2, 28, 10, 0, 0, 1, tzinfo=UTC),
                               datetime(leap, 2, 29, 10, 0, 0, 2, tzinfo=UTC)]

    with transaction.atomic():
        move_upload_events(incident.pk, klog.pk, 1)

    common = leap + 1
    assert log_times(klog) == [datetime(common, 2, 28, 10, 0, 0, 1, tzinfo=UTC),
                               datetime(common, 2, 28, 10, 0, 0, 2, tzinfo=UTC)]
    bodies = [e.body()["time"] for e in Event.objects.filter(upload_id=klog.pk).order_by("line")]
    assert bodies == [t.isoformat() for t in log_times(klog)]
    assert timedelta(0) < log_times(klog)[1] - log_times(klog)[0] < timedelta(seconds=1)
