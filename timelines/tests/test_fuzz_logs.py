"""Fuzzing the component and node log parsers (klog, text logs) and the year rule of dates
written without one. No database.

Log units are entries: the real klog entries of ``klog/`` (a header line and the lines that
continue it, apiserver traces included) and text-log lines in every form ``textlog`` reads, with
generated text; broken lines go between them. A line with no time continues the entry before it,
so the property is: each entry read alone comes out of the mixed file with the same kind, time
and severity, its message the start of the mixed entry's message. See ``fuzzing``.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

from timelines.parsers import klog, textlog
from timelines.parsers.base import ParseHints, Report
from timelines.parsers.years import YearInference

from .fuzzing import FIXTURES, broken_line, framed, fuzz, interleave, moment, odd, parse_all
from .test_fuzz_audit import SAMPLE_LINES

HINTS = ParseHints(year=2021, year_reason="fuzz")


def _entries(text: str) -> list[list[str]]:
    entries: list[list[str]] = []
    for line in text.splitlines():
        if klog.KLOG_HEADER.match(line):
            entries.append([line])
        elif entries:
            entries[-1].append(line)
    return entries


KLOG_ENTRIES = [entry for path in sorted((FIXTURES / "klog").glob("*.txt"))
                for entry in _entries(path.read_text(encoding="utf-8"))]


def _shape(row) -> tuple:
    return row.kind, row.received, row.severity, row.component


def check_entries(fmt, units: list[bytes], rng: random.Random, hints: ParseHints) -> None:
    """Each unit read alone comes out of the units mixed with broken lines: the same kind,
    time, severity and component, its message the start of the mixed row's message."""
    alone = []
    for unit in units:
        rows, report, error = parse_all(fmt, unit + b"\n", hints=hints)
        assert rows and not error, (unit, error, report.errors)
        alone.extend(rows)
    broken = [broken_line(rng, SAMPLE_LINES) for _ in range(rng.randint(0, 4))]
    data, _broken_at = interleave(units, broken, rng)
    rows, report, error = parse_all(fmt, framed(data, rng), hints=hints)
    mixed: dict[tuple, list[str]] = {}
    for row in rows:
        mixed.setdefault(_shape(row), []).append(row.message)
    for row in alone:
        messages = mixed.get(_shape(row), [])
        assert any(m.startswith(row.message.split("\n")[0]) for m in messages), (row, messages)
    assert bool(error) == (not units)


def klog_unit(rng: random.Random) -> bytes:
    entry = list(rng.choice(KLOG_ENTRIES))
    if rng.random() < 0.5:  # new text after the header
        header = klog.KLOG_HEADER.match(entry[0])
        entry[0] = entry[0][: header.end()] + odd(rng).replace("\n", " ")
    if rng.random() < 0.3:  # behind a CRI or kubectl --timestamps prefix
        header = klog.KLOG_HEADER.match(entry[0])
        month, day, hour, minute, second = (int(header.group(i)) for i in range(2, 7))
        stamp = datetime(2021, month, day, hour, minute, second, tzinfo=UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        prefix = f"{stamp} stderr F " if rng.random() < 0.5 else f"{stamp} "
        entry = [prefix + line for line in entry]
    return "\n".join(entry).encode()


def test_klog_entries_between_broken_lines_are_all_read():
    def make(rng: random.Random):
        return [klog_unit(rng) for _ in range(rng.randint(0, 5))], rng

    fuzz(lambda case: check_entries(klog.FORMAT, *case, HINTS), make)


MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def text_unit(rng: random.Random, when: datetime) -> bytes:
    """A line in one of the forms ``textlog`` reads, at ``when``."""
    message = odd(rng).replace("\n", " ").strip() or "m"
    message = rng.choice(["", "ERROR ", "level=warning ", "I | "]) + "x" + message
    iso = when.strftime("%Y-%m-%dT%H:%M:%S")
    form = rng.randrange(8)
    if form == 0:
        line = (f"{MONTHS[when.month - 1]} {when.day:2d} {when:%H:%M:%S} node-1 kubelet[12]: "
                f"{message}")
    elif form == 1:
        line = f"{iso}.{when.microsecond:06d}+0000 node-1 crio[3]: {message}"
    elif form == 2:
        line = f"{iso}.{when.microsecond:06d}123Z {message}"
    elif form == 3:
        line = f"{iso}.{when.microsecond:06d}Z stdout F {message}"
    elif form == 4:
        line = f"{when:%Y-%m-%d %H:%M:%S},{when.microsecond // 1000:03d} {message}"
    elif form == 5:
        line = f'time="{iso}Z" level=info msg="{message}"'
    elif form == 6:
        line = (f"{MONTHS[when.month - 1]} {when.day} {when:%H:%M:%S}."
                f"{when.microsecond // 1000:03d}: INFO: {message}")
    else:
        line = (f"I{when:%m%d %H:%M:%S}.{when.microsecond:06d}       1 main.go:42] {message}")
    return line.encode()


def test_text_log_lines_between_broken_lines_are_all_read():
    def make(rng: random.Random):
        # In time order within a few weeks: the year rule has nothing to turn over.
        start = datetime(2021, rng.randint(1, 11), rng.randint(1, 28), tzinfo=UTC)
        times = sorted(start + timedelta(seconds=rng.randrange(20 * 86400))
                       for _ in range(rng.randint(0, 5)))
        return [text_unit(rng, when) for when in times], rng

    fuzz(lambda case: check_entries(textlog.FORMAT, *case, HINTS), make)


# --- the year rule -------------------------------------------------------------------------------

def dated(rng: random.Random) -> tuple[list[datetime], int]:
    """Times in order, each under five months after the one before (so that months never seem
    to go back half a year), spanning up to four years; and how they are given a year."""
    when = moment(rng, 946_684_800, 3_000_000_000)
    times = [when]
    for _ in range(rng.randint(0, 12)):
        when += timedelta(seconds=rng.randrange(150 * 86400))
        times.append(when)
    return times, rng.randrange(3)


def test_the_year_rule_gives_back_the_dates_it_took_away():
    """Dates without a year, read in order, get their real year back from any of the sources
    the year rule takes: the first date's year in the hints, a full date early in the file, or
    a collection time after the last date (but under a year after the first)."""

    def check(case):
        times, source = case
        report = Report("dates.log")
        first = times[0]
        hints = ParseHints()
        if source == 0:
            hints = ParseHints(year=first.year, year_reason="given")
        elif source == 1:
            collected = times[-1] + timedelta(hours=1)
            day = 28 if (first.month, first.day) == (2, 29) else first.day
            if collected >= datetime(first.year + 1, first.month, day, tzinfo=UTC) - timedelta(
                    days=2):
                return  # a year or more after the first date: it no longer says its year
            hints = ParseHints(collected=collected)
        years = YearInference(report, hints, "the dates", now=times[-1] + timedelta(days=400))
        if source == 2:
            years.early_date(first, "a trace start")
        got = [years.date(t.month, t.day, t.hour, t.minute, t.second, t.microsecond, line)
               for line, t in enumerate(times, start=1)]
        assert got == times, report.notes

    fuzz(check, dated)


def test_impossible_dates_are_a_value_error_never_a_crash():
    def check(case):
        month, day, hints = case
        years = YearInference(Report("x"), hints, "dates", now=datetime(2024, 3, 1, tzinfo=UTC))
        try:
            years.date(month, day, 1, 2, 3, 4, 1)
        except ValueError as exc:
            assert re.search(r"month|day|year", str(exc)), exc

    def make(rng: random.Random):
        hints = rng.choice([ParseHints(), ParseHints(year=rng.randint(1, 9999)),
                            ParseHints(collected=moment(rng))])
        return rng.randint(-1, 14), rng.randint(-1, 33), hints

    fuzz(check, make)
