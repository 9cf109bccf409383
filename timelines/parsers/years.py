"""The year of dates written without one: klog headers, journal ``short`` lines (``klog`` and
``textlog`` read them through ``YearInference``).

Where the file and its hints give no year, the year is guessed: the one that puts the file's first
date nearest to the other evidence of its incident (``nearest_year``), else the current year.
A guess is reported (``Report.year_guess``) so that the ingest can move the file's rows by whole
years once the rest of the incident is in (``timelines.ingest.years``); ``add_years`` and
``shifted_notes`` are what that move does to a time and to the file's notes.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .base import Evidence, ParseHints, Report, YearGuess

MAX_YEAR_NOTES = 5
# Clocks and zones differ: a date up to a day ahead of now is not yet "in the future".
FUTURE_SLACK = timedelta(days=1)
_YEAR_CHANGE_NOTE = re.compile(r"^year (advanced|set back) to (\d{4}) ")


class YearInference:
    """Gives a year to dates that lack one and records in ``report.notes`` how it was chosen.

    Evidence, strongest first: ``anchor`` (a full date on the line being read, such as a runtime
    timestamp), ``last_date`` (the last date of what follows, as a journal header gives it),
    ``early_date`` (a full date seen early in the file, such as a trace start), a collection time
    in the hints (``collected``), ``hints.year`` (the year of the first date), the incident's
    other evidence in the hints (``evidence``: the year that puts the first date nearest to it,
    see ``nearest_year``), and last the current year (the latest year that does not put the first
    date in the future). The last two are guesses: ``report.year_guess`` says so, unless a full
    date later in the file (an ``anchor`` or ``last_date``) gives the year after all. ``date``
    builds a datetime from month, day and clock and moves the year when the months jump by half a
    year or more (December → January advances it, January → December sets it back). ``what``
    names the yearless dates in notes.
    """

    def __init__(self, report: Report, hints: ParseHints | None, what: str,
                 now: datetime | None = None) -> None:
        self.report = report
        self.hints = hints or ParseHints()
        self.what = what
        self.now = now
        self.year: int | None = None
        self.month: int | None = None
        self.evidence: tuple[datetime, str] | None = None
        self.last: tuple[datetime, str] | None = None
        self.changes = 0

    def anchor(self, when: datetime, reason: str | None = None) -> None:
        """A date with a year in the file; ``reason`` (where it was found) is noted when the year
        it gives differs from the year in use."""
        if reason and when.year != self.year:
            self._note(f"year {when.year} for {self.what}: {reason}")
        self.year = when.year
        self.month = when.month
        # The file has years of its own from here: moving all of its rows would move these too.
        self.report.year_guess = None

    def last_date(self, when: datetime, reason: str) -> None:
        """The latest date of the lines that follow (a journal's "end at"): the next yearless date
        takes its year, or the one before when its month and day come later in the year."""
        self.last = (when, reason)

    def early_date(self, when: datetime, reason: str) -> None:
        """A full date seen early in the file (a trace start) that gives the year of the first
        yearless date, if no anchor comes before it; preferred to hints."""
        if self.evidence is None:
            self.evidence = (when, reason)

    def date(self, month: int, day: int, hour: int, minute: int, second: int, micro: int,
             line: int) -> datetime:
        """The full date; raises ValueError for an impossible one (month 13, 30 February)."""
        if not 1 <= month <= 12:
            raise ValueError(f"month {month:02d} does not exist")
        if self.last is not None:
            last, reason = self.last
            self.last = None
            year = last.year - (1 if (month, day) > (last.month, last.day) else 0)
            if year != self.year:
                self._note(f"year {year} for {self.what}: {reason}")
            self.year, self.month = year, month
            self.report.year_guess = None
        elif self.year is None:
            self._choose(month, day, (hour, minute, second, micro), line)
        if self.month is not None and abs(month - self.month) >= 6:
            previous = self.month
            self.year += 1 if month < previous else -1
            self.changes += 1
            if self.changes <= MAX_YEAR_NOTES:
                self._note(f"year {'advanced' if month < previous else 'set back'} to {self.year} "
                           f"at line {line}, where the months go from {previous:02d} to "
                           f"{month:02d}")
        self.month = month
        assert self.year is not None
        return datetime(self.year, month, day, hour, minute, second, micro, tzinfo=UTC)

    def finish(self) -> None:
        if self.changes > MAX_YEAR_NOTES:
            self._note(f"the year changed {self.changes} times in all (only the first "
                       f"{MAX_YEAR_NOTES} are listed)")

    def _choose(self, month: int, day: int, clock: tuple[int, int, int, int], line: int) -> None:
        if self.evidence is not None:
            when, reason = self.evidence
            self.anchor(when, reason)
            return
        # A collection time is an upper bound, better than a bare year: a log that runs from
        # December into January and was collected in January starts in the year before.
        collected = self.hints.collected
        if isinstance(collected, datetime):
            if collected.tzinfo is None:
                collected = collected.replace(tzinfo=UTC)
            self.year = _latest_year(month, day, collected)
            reason = self.hints.year_reason or f"collected {collected:%Y-%m-%d}"
            self._note(f"year {self.year} for {self.what}: the latest that does not put the first "
                       f"date (line {line}, {month:02d}-{day:02d}) after the collection time "
                       f"({reason})")
            return
        if self.hints.year:
            self.year = self.hints.year
            reason = self.hints.year_reason or "given with the upload"
            self._note(f"year {self.year} for {self.what}: {reason}")
            return
        now = self.now or datetime.now(UTC)
        # The first date in a year that has it (29 February is in leap years only).
        first = datetime(2000, month, day, *clock, tzinfo=UTC)
        evidence = self.hints.evidence
        choice = nearest_year(first, evidence, now) if evidence is not None else None
        if choice is not None:
            self.year = choice.year
            self._guess(first, line, nearest_note(self.what, line, first.replace(
                year=choice.year), choice))
            return
        self.year = _latest_year(month, day, now)
        without = ("neither the file nor the upload gives one" if evidence is None else
                   "neither the file, the upload nor the rest of the incident gives one")
        if self.year != now.year:
            leap = " and has a 29 February" if (month, day) == (2, 29) else ""
            text = (f"year {self.year} for {self.what}: assumed, as {without}; the latest year "
                    f"that does not put the first date (line {line}, {month:02d}-{day:02d}) in "
                    f"the future{leap}")
        else:
            text = f"year {self.year} for {self.what}: assumed to be the current year, as {without}"
        self._guess(first, line, text)

    def _guess(self, first: datetime, line: int, note: str) -> None:
        assert self.year is not None
        self._note(note)
        self.report.year_guess = YearGuess(first.replace(year=self.year), line, self.what,
                                           len(self.report.notes) - 1, self.year)

    def _note(self, text: str) -> None:
        self.report.notes.append(text)


def _latest_year(month: int, day: int, bound: datetime) -> int:
    """The year that puts month-day at or before ``bound`` (a day of slack for time zones), as
    late as possible; for 29 February, the latest leap year that does."""
    year = bound.year
    while True:
        if (month, day) != (2, 29) or calendar.isleap(year):
            if datetime(year, month, day, tzinfo=UTC) <= bound + FUTURE_SLACK:
                return year
        year -= 1


@dataclass(frozen=True)
class Nearest:
    """The year ``nearest_year`` chose, with what it was measured against."""

    year: int
    nearest: datetime  # the time of the other evidence nearest to the first date in that year
    span: tuple[datetime, datetime]  # the other evidence's first and last time


def nearest_year(first: datetime, evidence: Evidence, now: datetime | None = None
                 ) -> Nearest | None:
    """The year that puts ``first`` (its month, day and clock; its year is ignored) nearest to
    ``evidence``, or None when there is no evidence.

    The candidates run from the year before the evidence's first time to the year after its last:
    for each, the distance from ``first`` in that year to the nearest time of the evidence; the
    smallest distance wins, the later year on a tie. A year that would put ``first`` in the future
    (after ``now``, with a day of slack) is no candidate, nor is a common year for 29 February:
    then the range widens by a year at each end until it holds one. Each candidate costs one
    ``evidence.nearest`` call.
    """
    span = evidence.span()
    if span is None:
        return None
    limit = (now or datetime.now(UTC)) + FUTURE_SLACK
    low, high = span[0].year - 1, span[1].year + 1
    while True:
        best: tuple[timedelta, int, datetime] | None = None
        for year in range(low, high + 1):
            try:
                moment = first.replace(year=year)
            except ValueError:  # 29 February of a common year
                continue
            if moment > limit:
                continue
            near = evidence.nearest(moment)
            distance = abs(moment - near)
            if best is None or distance <= best[0]:
                best = (distance, year, near)
        if best is not None:
            return Nearest(best[1], best[2], span)
        low, high = low - 1, high + 1


def nearest_note(what: str, line: int, first: datetime, choice: Nearest,
                 parsed_year: int | None = None) -> str:
    """The note for a year that ``nearest_year`` chose; ``first`` is the first date in that
    year. ``parsed_year``: the year the file was first read in, when it was moved since."""
    start, end = choice.span
    distance = abs(first - choice.nearest)
    amount = _duration(distance) if distance < timedelta(days=1) else f"{distance.days} days"
    side = "before" if choice.nearest <= first else "after"
    closest = f"{choice.nearest:%Y-%m-%d %H:%M}"
    text = (f"year {choice.year} for {what}: nearest to the incident's other evidence "
            f"({start:%Y-%m-%d} … {end:%Y-%m-%d}), whose closest time ({closest}) is {amount} "
            f"{side} the first date (line {line}, {first:%m-%d %H:%M})")
    if parsed_year is not None and parsed_year != choice.year:
        text += f"; moved from {parsed_year} once the incident's uploads had all finished"
    return text


def _duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    if minutes < 1:
        return "less than a minute"
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h"


def add_years(when: datetime, years: int) -> datetime:
    """``when`` moved by whole years; 29 February into a common year becomes 28 February (as
    PostgreSQL's ``+ interval 'N years'`` does)."""
    try:
        return when.replace(year=when.year + years)
    except ValueError:
        return when.replace(year=when.year + years, day=28)


def shifted_notes(notes: list[str], guess: YearGuess, years: int, note: str) -> list[str]:
    """A guessed file's notes after its rows moved by ``years``: the note of the year's choice
    replaced by ``note``, the years where the months turned (``year advanced to …``) moved too."""
    out = []
    for index, text in enumerate(notes):
        if index == guess.note:
            text = note
        elif years and (match := _YEAR_CHANGE_NOTE.match(text)):
            text = (f"year {match.group(1)} to {int(match.group(2)) + years} "
                    f"{text[match.end():]}")
        out.append(text)
    return out
