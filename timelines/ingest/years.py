"""The year of logs that carry none, settled against the rest of their incident.

A klog or journal file whose lines carry no year, loose or in a bundle that gives none, has its
year guessed when it is parsed (``parsers.years``): the year that puts its first date nearest to
the incident's other evidence already stored (``IncidentEvidence``), else the current year. The
upload keeps the guess in ``hints["year_guess"]`` (``record_guess``). Uploads of an incident are
ingested concurrently and in any order, so the evidence may arrive after the log: when the
incident's uploads have all finished (where the overview is warmed: the Celery task, the embedded
thread, ``manage.py ingest``), ``settle_years`` gives each guessed upload the year the rule gives
then, moving its rows by whole years. Other evidence means events of uploads whose year was not
guessed: a file's own full timestamps and a bundle's collection time are never moved.

A move, in one transaction per upload:

- claims the upload with a compare-and-set on the first date of its guess, so that concurrent
  calls move it once, and stores the new guess, notes that say which year and why, and a new
  ``finished_at``: a new data version (``aggregate.data_version``), so the column index and the
  figures cached for the old times are not used again;
- moves the events' ``received`` and ``completed`` by the whole years (29 February into a common
  year becomes 28 February, in the database as in ``parsers.years.add_years``), and the times
  that annotations and sequence steps keep of those events;
- drops a row whose new identity ``(incident, received, audit_id)`` another upload's row holds
  already (the same file also ingested with its real year, say in a bundle): it is the same
  evidence; annotations and steps on it then name that row;
- rewrites the ``time`` (log entries) or ``start`` (traces) of the stored bodies, which hold the
  time as the parser first gave it, so that the detail view agrees with the timeline.

A bulk-loaded incident's events are in a partition of their own (``ingest.bulk``): the same
statements reach them through ``timelines_event``, and after the load, since ``manage.py ingest``
settles after ``bulk.finish_load``. Running ``settle_years`` again changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

import orjson
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from incidents.models import Annotation, SequenceStep, Upload

from ..models import BodyChunk, Event
from ..parsers.base import YearGuess, parse_time
from ..parsers.years import add_years, nearest_note, nearest_year, shifted_notes

log = logging.getLogger(__name__)

GUESS_KEY = "year_guess"  # in Upload.hints: YearGuess.as_json() of an upload whose year was guessed
_BODY_TIMES = ("time", "start")  # the times that bodies of log and trace rows hold


class IncidentEvidence:
    """``parsers.base.Evidence`` read from the database: the times of an incident's events, but
    for those of uploads whose year was guessed and of ``exclude``. Nothing is read until the
    year rule asks; then two indexed lookups per candidate year."""

    def __init__(self, incident_id: int, exclude: tuple[int, ...] = ()) -> None:
        self.incident_id = incident_id
        self.exclude = set(exclude)
        self._events = None

    def events(self):
        if self._events is None:
            guessed = Upload.objects.filter(incident_id=self.incident_id,
                                            hints__has_key=GUESS_KEY).values_list("pk", flat=True)
            skip = set(guessed) | self.exclude
            events = Event.objects.filter(incident_id=self.incident_id)
            self._events = events.exclude(upload_id__in=sorted(skip)) if skip else events
        return self._events

    def span(self) -> tuple[datetime, datetime] | None:
        times = self.events().values_list("received", flat=True)
        first = times.order_by("received").first()
        if first is None:
            return None
        return first, times.order_by("-received").first()

    def nearest(self, when: datetime) -> datetime:
        times = self.events().values_list("received", flat=True)
        near = [t for t in (times.filter(received__lte=when).order_by("-received").first(),
                            times.filter(received__gte=when).order_by("received").first())
                if t is not None]
        return min(near, key=lambda t: abs(t - when))


def record_guess(hints: dict, guess: YearGuess | None) -> dict:
    """An upload's stored hints with its parse's year guess (or without one)."""
    kept = {k: v for k, v in hints.items() if k != GUESS_KEY}
    return kept if guess is None else {**kept, GUESS_KEY: guess.as_json()}


def settle_years(incident_id: int, *, now: datetime | None = None) -> dict[int, str]:
    """Give every upload of the incident whose year was guessed the year that the rule
    (``parsers.years.nearest_year``) gives now, against the events of the other uploads; returns
    the uploads changed (moved, or only their note rewritten) with their new note, by id. Does
    nothing while an upload of the incident is unfinished (the last one to finish settles), for
    an incident deleted meanwhile, or when the incident holds no other evidence with a year. An
    upload whose move fails on the request identity (identical lines exactly a whole number of
    years apart, which PostgreSQL checks row by row) keeps its year, with a warning in the
    log."""
    uploads = Upload.objects.filter(incident_id=incident_id)
    if uploads.filter(finished_at=None).exists():
        return {}
    guessed = list(uploads.filter(hints__has_key=GUESS_KEY).only("pk", "name", "hints", "notes")
                   .order_by("pk"))
    if not guessed:
        return {}
    evidence = IncidentEvidence(incident_id)
    changed = {}
    for upload in guessed:
        try:
            note = _settle(incident_id, upload, evidence, now)
            if note is not None:
                changed[upload.pk] = note
        except IntegrityError as exc:
            log.warning("could not move the year of upload %s: %s", upload.pk, exc)
    return changed


def _settle(incident_id: int, upload: Upload, evidence: IncidentEvidence,
            now: datetime | None) -> str | None:
    guess = YearGuess.from_json(upload.hints[GUESS_KEY])
    choice = nearest_year(guess.first, evidence, now)
    if choice is None:  # nothing else has a year: the guess stands
        return None
    years = choice.year - guess.first.year
    first = add_years(guess.first, years)  # the rule picks years in which the date exists
    note = nearest_note(guess.what, guess.line, first, choice, guess.parsed_year)
    notes = shifted_notes(upload.notes, guess, years, note)
    if not years and notes == upload.notes:
        return None
    fields = {"hints": {**upload.hints, GUESS_KEY: replace(guess, first=first).as_json()},
              "notes": notes}
    if years:
        fields["finished_at"] = timezone.now()
    with transaction.atomic():
        claimed = Upload.objects.filter(
            pk=upload.pk, **{f"hints__{GUESS_KEY}__first": guess.first.isoformat()},
        ).update(**fields)
        if not claimed:  # another call settled it meanwhile
            return None
        if years:
            move_upload_events(incident_id, upload.pk, years)
    log.info("%s (upload %s): %s", upload.name, upload.pk, note)
    return note


def move_upload_events(incident_id: int, upload_id: int, years: int) -> None:
    """Move an upload's events, the times kept of them and their bodies by whole ``years``, as
    the module docstring says; the caller holds the transaction."""
    own = Event.objects.filter(incident_id=incident_id, upload_id=upload_id)
    _move_notes(incident_id, own, years)
    if connection.vendor == "postgresql":
        dropped = _move_postgres(incident_id, upload_id, years)
    else:
        dropped = _move_generic(incident_id, upload_id, own, years)
    _move_bodies(incident_id, upload_id, years)
    if dropped:
        BodyChunk.objects.filter(pk__in=dropped).exclude(
            pk__in=Event.objects.filter(incident_id=incident_id, body_chunk__in=dropped)
            .values("body_chunk")).delete()


def _move_notes(incident_id: int, events, years: int) -> None:
    """The times that annotations on the moved events keep, and sequence steps on those events or
    annotations (few rows)."""
    ids = events.values("pk")
    annotations = list(Annotation.objects.filter(incident_id=incident_id, event_id__in=ids))
    for annotation in annotations:
        Annotation.objects.filter(pk=annotation.pk).update(
            start=add_years(annotation.start, years),
            end=add_years(annotation.end, years) if annotation.end else None)
    steps = SequenceStep.objects.filter(
        Q(event_id__in=ids) | Q(annotation__in=[a.pk for a in annotations]),
        sequence__incident_id=incident_id)
    for step in steps:
        SequenceStep.objects.filter(pk=step.pk).update(at=add_years(step.at, years))


def _repoint(pairs: list[tuple[int, int]]) -> None:
    """Annotations and steps on dropped rows name the row that holds the same evidence."""
    for dropped, kept in pairs:
        Annotation.objects.filter(event_id=dropped).update(event_id=kept)
        SequenceStep.objects.filter(event_id=dropped).update(event_id=kept)


def _move_postgres(incident_id: int, upload_id: int, years: int) -> set[int]:
    shift = "make_interval(years => %s::int)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.id, o.id, e.body_chunk FROM timelines_event e JOIN timelines_event o"
            f" ON o.incident_id = e.incident_id AND o.audit_id = e.audit_id"
            f" AND o.received = e.received + {shift}"
            f" WHERE e.incident_id = %s AND e.upload_id = %s"
            f" AND o.upload_id IS DISTINCT FROM e.upload_id",
            [years, incident_id, upload_id])
        taken = cursor.fetchall()
        if taken:
            _repoint([(dropped, kept) for dropped, kept, _ in taken])
            cursor.execute("DELETE FROM timelines_event WHERE incident_id = %s AND id = ANY(%s)",
                           [incident_id, [dropped for dropped, _, _ in taken]])
        # Timestamps with a zone move in the session's zone, UTC here (settings.TIME_ZONE).
        cursor.execute(
            f"UPDATE timelines_event SET received = received + {shift},"
            f" completed = completed + {shift} WHERE incident_id = %s AND upload_id = %s",
            [years, years, incident_id, upload_id])
    return {chunk for _, _, chunk in taken if chunk is not None}


def _move_generic(incident_id: int, upload_id: int, own, years: int) -> set[int]:
    """SQLite (the embedded mode, small incidents): row by row, in the order that never has a row
    take the place of one not yet moved."""
    rows = [(pk, add_years(received, years), add_years(completed, years) if completed else None,
             audit_id, chunk) for pk, received, completed, audit_id, chunk in own.order_by(
                 "-received" if years > 0 else "received").values_list(
                 "pk", "received", "completed", "audit_id", "body_chunk")]
    if not rows:
        return set()
    times = [row[1] for row in rows]
    others = Event.objects.filter(incident_id=incident_id, received__gte=min(times),
                                  received__lte=max(times)).exclude(upload_id=upload_id)
    holders = {(received, audit_id): pk for pk, received, audit_id
               in others.values_list("pk", "received", "audit_id")}
    taken = [(row[0], holders[row[1], row[3]], row[4]) for row in rows
             if (row[1], row[3]) in holders]
    if taken:
        _repoint([(dropped, kept) for dropped, kept, _ in taken])
        Event.objects.filter(pk__in=[dropped for dropped, _, _ in taken])._raw_delete(
            Event.objects.db)
    gone = {dropped for dropped, _, _ in taken}
    for pk, received, completed, _, _ in rows:
        if pk not in gone:
            Event.objects.filter(pk=pk).update(received=received, completed=completed)
    return {chunk for _, _, chunk in taken if chunk is not None}


def _move_bodies(incident_id: int, upload_id: int, years: int) -> None:
    """The times in the stored bodies of the upload's rows. An upload's rows point at its own
    chunks only (a chunk is written per upload and batch, and a merge that replaces a row
    replaces its chunk too)."""
    chunks = BodyChunk.objects.filter(incident_id=incident_id, upload_id=upload_id)
    for pk in chunks.values_list("pk", flat=True):
        chunk = BodyChunk.objects.get(pk=pk)
        lines = [_moved_body(line, years) for line in chunk.lines()]
        BodyChunk.objects.filter(pk=pk).update(data=BodyChunk.pack(b"\n".join(lines)))


def _moved_body(line: bytes, years: int) -> bytes:
    if not line:
        return line
    try:
        body = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    if not isinstance(body, dict):
        return line
    moved = False
    for key in _BODY_TIMES:
        value = body.get(key)
        if isinstance(value, str):
            try:
                body[key] = add_years(parse_time(value), years).isoformat()
            except ValueError:
                continue
            moved = True
    return orjson.dumps(body) if moved else line
