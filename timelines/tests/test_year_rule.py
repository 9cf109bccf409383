"""``timelines.parsers.years``: the year of dates that carry none, chosen against the rest of the
incident, as pure code (no database).

Expected years come from the evidence the test gives (the real audit logs' own timestamps, or
times built here) and the calendar, never from what the rule answered.
"""

from __future__ import annotations

import calendar
import io
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from timelines.parsers.base import ParseHints, Report, TimesEvidence, YearGuess, parse_time
from timelines.parsers.klog import parse
from timelines.parsers.years import (
    YearInference,
    add_years,
    nearest_year,
    shifted_notes,
)

_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
KIND_APISERVER = _FIXTURES / "klog" / "kind-kube-apiserver.txt"
HEADER = re.compile(rb"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ", re.M)


def audit_times(name: str) -> list[datetime]:
    """When each event of an audit log fixture was received, read here (``timestamp`` in the
    earliest v1beta1 logs)."""
    events = [orjson.loads(line) for line in (_FIXTURES / "audit" / name).read_bytes().splitlines()
              if line]
    return [parse_time(e.get("requestReceivedTimestamp") or e["timestamp"]) for e in events]


def header_times(data: bytes, year: int) -> list[datetime]:
    """The klog header times of ``data`` in ``year`` (no file here crosses New Year)."""
    return [datetime(year, *map(int, match.groups()), tzinfo=UTC)
            for match in HEADER.finditer(data)]


def first_header(data: bytes) -> datetime:
    """The first header time, in a leap year so that any month-day exists."""
    return header_times(data, 2000)[0]


def klog_line(moment: datetime, message: str) -> str:
    return f"I{moment:%m%d %H:%M:%S}.{moment.microsecond:06d}       1 main.go:1] {message}"


def run(data: bytes, hints: ParseHints) -> tuple[list, Report]:
    report = Report("component.log")
    return list(parse(io.BytesIO(data), report, hints=hints)), report


# --- the rule ----------------------------------------------------------------------------------

def test_the_year_of_the_audit_log_beside_it_when_that_is_nearest():
    times = audit_times("openshift-requestresponse.log")
    (year,) = {t.year for t in times}
    first = first_header(KIND_APISERVER.read_bytes())
    # the test's premise: the first date in the audit log's year is nearer than a year later
    assert abs(first.replace(year=year) - times[0]) < abs(first.replace(year=year + 1) - times[-1])

    choice = nearest_year(first, TimesEvidence(times))

    assert choice is not None
    assert choice.year == year
    assert choice.span == (min(times), max(times))


def test_the_nearest_year_is_not_always_the_evidences_own():
    # audit2rbac's demo ran in September: 27 January of the next year is nearer than that of the
    # same year.
    times = audit_times("audit2rbac-demo.log")
    (year,) = {t.year for t in times}
    first = first_header(KIND_APISERVER.read_bytes())
    assert abs(first.replace(year=year + 1) - max(times)) < abs(first.replace(year=year)
                                                               - min(times))

    choice = nearest_year(first, TimesEvidence(times))

    assert choice is not None and choice.year == year + 1
    assert choice.nearest == max(times)


def test_a_tie_goes_to_the_later_year():
    first = datetime(2000, 1, 27, 12, 0, tzinfo=UTC)
    earlier, later = first.replace(year=2020), first.replace(year=2021)
    midway = earlier + (later - earlier) / 2

    choice = nearest_year(first, TimesEvidence([midway]))

    assert choice is not None and choice.year == later.year


def test_no_other_evidence_gives_no_year():
    assert nearest_year(datetime(2000, 1, 27, tzinfo=UTC), TimesEvidence([])) is None


def test_a_year_that_would_put_the_first_date_in_the_future_is_no_candidate():
    now = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
    evidence = TimesEvidence([now - timedelta(days=10)])
    first = datetime(2000, 3, 20, 8, 0, tzinfo=UTC)  # 19 days after now, in now's year
    assert first.replace(year=now.year) > now + timedelta(days=1)

    choice = nearest_year(first, evidence, now)

    assert choice is not None and choice.year == now.year - 1


@pytest.mark.parametrize("evidence_year", [2021, 2022, 2023, 2025])
def test_29_february_only_ever_gets_a_leap_year(evidence_year):
    evidence = [datetime(evidence_year, 5, 19, 9, 42, tzinfo=UTC)]
    first = datetime(2000, 2, 29, 10, 0, tzinfo=UTC)
    now = datetime(2030, 1, 1, tzinfo=UTC)

    choice = nearest_year(first, TimesEvidence(evidence), now)

    assert choice is not None
    leap_years = [y for y in range(evidence_year - 8, evidence_year + 9) if calendar.isleap(y)]
    nearest = min(leap_years, key=lambda y: (abs(first.replace(year=y) - evidence[0]), -y))
    assert choice.year == nearest


def test_29_february_without_other_evidence_is_the_latest_leap_year_before_now():
    now = datetime(2026, 11, 25, tzinfo=UTC)
    report = Report("x.log")
    years = YearInference(report, ParseHints(), "the dates", now=now)

    when = years.date(2, 29, 10, 0, 0, 0, 1)

    assert when == datetime(max(y for y in range(now.year - 8, now.year + 1)
                                if calendar.isleap(y)), 2, 29, 10, 0, tzinfo=UTC)
    assert report.year_guess is not None and report.year_guess.first == when
    assert "assumed" in report.notes[report.year_guess.note]


def test_moving_by_whole_years_keeps_the_clock_and_29_february_becomes_the_28th():
    leap = datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)
    assert add_years(leap, -3) == datetime(2021, 2, 28, 23, 59, 59, 999999, tzinfo=UTC)
    assert add_years(leap, -4) == datetime(2020, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)
    plain = datetime(2026, 1, 27, 14, 37, 20, 25361, tzinfo=UTC)
    assert add_years(plain, -8) == datetime(2018, 1, 27, 14, 37, 20, 25361, tzinfo=UTC)


def test_moved_notes_say_the_new_year_where_the_months_turned():
    notes = ["klog header times carry no zone: read as UTC", "year 2026 for x: assumed",
             "year advanced to 2027 at line 9, where the months go from 12 to 01"]
    guess = YearGuess(datetime(2026, 12, 31, 23, 0, tzinfo=UTC), 1, "x", 1, 2026)

    moved = shifted_notes(notes, guess, -5, "the new note")

    assert moved[guess.note] == "the new note"
    assert "year advanced to 2022 at line 9, where the months go from 12 to 01" in moved
    assert notes[0] in moved


# --- through the klog parser -------------------------------------------------------------------

def test_a_loose_klog_file_takes_the_year_nearest_to_the_other_evidence_and_says_so():
    data = KIND_APISERVER.read_bytes()
    times = audit_times("openshift-requestresponse.log")
    (year,) = {t.year for t in times}

    rows, report = run(data, ParseHints(evidence=TimesEvidence(times)))

    assert [row.received for row in rows if row.kind == "log"] == header_times(data, year)
    guess = report.year_guess
    assert guess is not None and guess.first == rows[0].received and guess.parsed_year == year
    note = report.notes[guess.note]
    assert note.startswith(f"year {year} for the klog headers")
    assert (f"nearest to the incident's other evidence ({min(times):%Y-%m-%d} … "
            f"{max(times):%Y-%m-%d})") in note
    assert orjson.loads(rows[0].raw)["time"] == rows[0].received.isoformat()


def test_the_bundles_year_wins_over_the_other_evidence_and_is_no_guess():
    data = KIND_APISERVER.read_bytes()
    times = audit_times("openshift-requestresponse.log")
    bundle_year = min(t.year for t in times) - 3

    rows, report = run(data, ParseHints(year=bundle_year, year_reason="collection time",
                                        evidence=TimesEvidence(times)))

    assert {row.received.year for row in rows} == {bundle_year}
    assert report.year_guess is None


def test_full_timestamps_on_the_lines_win_over_the_other_evidence_and_are_no_guess():
    times = audit_times("openshift-requestresponse.log")
    own = datetime(min(t.year for t in times) - 2, 1, 27, 14, 37, 20, 25361, tzinfo=UTC)
    lines = [f"{moment:%Y-%m-%dT%H:%M:%S.%f}Z stderr F {klog_line(moment, 'hello')}"
             for moment in (own, own + timedelta(seconds=3))]

    rows, report = run("\n".join(lines).encode(), ParseHints(evidence=TimesEvidence(times)))

    assert [row.received for row in rows] == [own, own + timedelta(seconds=3)]
    assert report.year_guess is None


def test_without_other_evidence_the_year_is_assumed_and_reported_as_a_guess():
    data = KIND_APISERVER.read_bytes()

    rows, report = run(data, ParseHints(evidence=TimesEvidence([])))

    guess = report.year_guess
    assert guess is not None and guess.first == rows[0].received
    note = report.notes[guess.note]
    assert "assumed" in note and "the rest of the incident" in note
