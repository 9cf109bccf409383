"""What people write on the evidence: annotations and root-cause sequences.

Events live in ``timelines`` and models depend one way (``timelines`` → ``incidents``), so an
annotation or a step names its event by id and keeps a copy of the event's time, which is what
ordering and deltas need.

Below the models, the pure formatting that the API and the exports share (human deltas, event
descriptions, the Markdown export): no ORM, no request, tested without a database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone


class Annotation(models.Model):
    """A note on one event or on a time range of an incident."""

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE,
                                 related_name="annotations")
    event_id = models.BigIntegerField(null=True, blank=True)  # timelines.Event, if on one event
    start = models.DateTimeField()  # the event's received time, or where the range starts
    end = models.DateTimeField(null=True, blank=True)  # where the range ends; None for a point
    note = models.TextField(blank=True)  # Markdown
    tags = models.JSONField(default=list, blank=True)
    starred = models.BooleanField(default=False)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                               on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["start", "id"]
        indexes = [models.Index(fields=["incident", "start"]),
                   models.Index(fields=["incident", "event_id"])]

    def __str__(self) -> str:
        return f"annotation {self.pk} on incident {self.incident_id}"


class Sequence(models.Model):
    """A root cause told as ordered steps on the evidence."""

    incident = models.ForeignKey("incidents.Incident", on_delete=models.CASCADE,
                                 related_name="sequences")
    title = models.CharField(max_length=300)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                               on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.title

    def replace_steps(self, steps: list[SequenceStep]) -> None:
        """Make ``steps`` (kept rows and new unsaved ones) this sequence's steps, in this order;
        the others are deleted. Call it inside ``locked_sequence``."""
        self.steps.exclude(pk__in=[s.pk for s in steps if s.pk]).delete()
        for position, step in enumerate(steps):
            step.sequence, step.position = self, position
        SequenceStep.objects.bulk_update([s for s in steps if s.pk], ["position", "note"])
        SequenceStep.objects.bulk_create([s for s in steps if not s.pk])
        self.updated_at = timezone.now()
        Sequence.objects.filter(pk=self.pk).update(updated_at=self.updated_at)


class SequenceStep(models.Model):
    sequence = models.ForeignKey(Sequence, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveIntegerField()  # 0-based order within the sequence
    event_id = models.BigIntegerField(null=True, blank=True)  # timelines.Event it points at
    annotation = models.ForeignKey(Annotation, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    at = models.DateTimeField()  # the time of that event or annotation: deltas are taken on it
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return f"step {self.position + 1} of {self.sequence_id}"


MAX_STEPS = 500


@contextmanager
def locked_sequence(pk: int) -> Iterator[tuple[Sequence, list[SequenceStep]]]:
    """``with locked_sequence(pk) as (sequence, steps)``: a transaction holding the sequence's
    row lock, so concurrent edits of its steps apply one after the other."""
    with transaction.atomic():
        # gone meanwhile (its incident deleted): 404, as for a sequence one cannot see
        sequence = get_object_or_404(Sequence.objects.select_related("incident")
                                     .select_for_update(of=("self",)), pk=pk)
        yield sequence, list(sequence.steps.select_related("annotation"))


# --- Formatting: pure functions (no ORM, no request), shared by the API and the exports -------

MINUS = "\u2212"  # a real minus sign: "−3 ms" reads as a negative delta, "-3 ms" as a dash
MAX_DESCRIPTION = 200


def _trim(value: float) -> str:
    """``7.0`` → ``"7"``, ``7.25`` → ``"7.25"``: at most three decimals, none when they are 0."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def format_duration(ms: float) -> str:
    """An unsigned human duration: ``"7 ms"``, ``"0.25 ms"``, ``"44 s"``, ``"1.5 s"``,
    ``"2 min 3 s"``, ``"1 h 5 min"``, ``"2 d 3 h"``. Below a minute it keeps millisecond (below a
    second microsecond) precision; from a minute on it counts whole seconds."""
    ms = abs(ms)
    if round(ms, 3) < 1000:
        return f"{_trim(ms)} ms"
    if round(ms / 1000, 3) < 60:
        return f"{_trim(ms / 1000)} s"
    seconds = round(ms / 1000)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n)


def format_delta(ms: float) -> str:
    """A signed delta between two steps: ``"+7 ms"``, ``"+2 min 3 s"``, ``"−3 ms"`` when the step
    happened before the previous one."""
    return (MINUS if ms < 0 else "+") + format_duration(ms)


def later_phrase(ms: float) -> str:
    """How the Markdown export introduces a step: ``"7 ms later"``, ``"3 ms earlier"``, ``"at the
    same time"``."""
    if ms == 0:
        return "at the same time"
    return f"{format_duration(ms)} {'earlier' if ms < 0 else 'later'}"


def format_time(when: datetime) -> str:
    """RFC 3339 in UTC, with microseconds only when there are some: ``2021-07-14T06:27:00Z``."""
    when = when.astimezone(UTC)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond:06d}"
    return text + "Z"


def _one_line(text: str, limit: int = MAX_DESCRIPTION) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _verbs(verb: str) -> str:
    """``delete`` → ``DELETEs``, ``patch`` → ``PATCHes``."""
    verb = verb.upper()
    return verb + ("es" if verb.endswith(("CH", "SH", "S", "X")) else "s")


def describe_event(event) -> str:
    """One line saying what an event (a ``timelines.Event``, or anything with its attributes)
    shows, e.g. ``system:admin DELETEs pods default/web-0 → 200``, ``bob as alice LISTs pods ns1
    → 403``, ``Warning BackOff pods default/web-0: Back-off restarting…``, ``kubelet: …``."""
    target = "/".join(p for p in (event.namespace, event.name) if p)
    what = event.resource + (f"/{event.subresource}" if event.subresource else "")
    what = " ".join(p for p in (what, target) if p)
    if event.kind == "audit":
        actor = event.username or "(unknown user)"
        if event.impersonated_user:
            actor += f" as {event.impersonated_user}"
        outcome = f"→ {event.code}" if event.code is not None else "→ (no response)"
        return _one_line(f"{actor} {_verbs(event.verb or 'request')} "
                         f"{what or event.request_uri or '/'} {outcome}")
    if event.kind == "event":
        head = " ".join(p for p in (event.severity, event.reason, what) if p)
        return _one_line(f"{head}: {event.message}" if event.message else head)
    who = event.component or event.node or event.kind
    return _one_line(f"{who}: {event.message}" if event.message else who)


def note_label(note: str, limit: int = 80) -> str:
    """A short plain label for a Markdown note (its first line without block markers), for
    markers and lists."""
    for line in note.splitlines():
        line = line.strip().lstrip("#>*-+ ").strip()
        if line:
            return _one_line(line, limit)
    return ""


_MARKDOWN_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>"})


def escape_markdown(text: str) -> str:
    """Evidence text (names, log messages) made inert inside a Markdown line."""
    return text.translate(_MARKDOWN_SPECIAL)


def sequence_markdown(title: str, steps: list[dict]) -> str:
    """A sequence as Markdown: ``# title``, then one numbered item per step, ``<when>:
    <description> — <note>``, where <when> is the absolute time for step 1 (``At
    2021-07-14T06:27:00Z``) and ``7 ms later`` from the previous step after it. ``steps`` are
    dicts with ``at`` (datetime), ``delta_ms`` (None for the first), ``description`` (plain text,
    escaped here) and ``note`` (Markdown, kept as written, its lines indented into the item)."""
    lines = [f"# {_one_line(title, 300)}", ""]
    for number, step in enumerate(steps, start=1):
        if step["delta_ms"] is None:
            when = f"At {format_time(step['at'])}"
        else:
            when = later_phrase(step["delta_ms"])
        item = f"{number}. {when}: {escape_markdown(step['description'] or '(no description)')}"
        note = step["note"].strip()
        if note:
            indent = " " * len(f"{number}. ")
            first, *rest = note.splitlines()
            item += f" — {first}" + "".join(f"\n{indent}{line}" if line.strip() else "\n"
                                             for line in rest)
        lines.append(item)
    return "\n".join(lines) + "\n"


_MS = timedelta(milliseconds=1)


def step_data(steps: list[SequenceStep], events: dict) -> list[dict]:
    """Steps in order as the API and the exports show them: ``id``, ``position`` (1-based),
    ``event``, ``annotation``, ``at``, ``note``, ``description`` (from ``events``, a mapping of
    event id to ``timelines.Event``, else from the annotation), ``delta_ms`` (from the previous
    step, None for the first), ``offset_ms`` (from the first) and ``delta`` (human). Times in
    ms with microsecond precision. Reads only what the steps carry: no query when their
    annotations are loaded."""
    data, first, previous = [], None, None
    for number, step in enumerate(steps, start=1):
        event = events.get(step.event_id)
        if event is not None:
            description = describe_event(event)
        elif step.annotation is not None:
            label = note_label(step.annotation.note) or "time range"
            description = f"annotation: {label} ({format_time(step.annotation.start)})"
        else:
            description = f"event {step.event_id} (no longer stored)" if step.event_id else ""
        first = step.at if first is None else first
        delta_ms = None if previous is None else (step.at - previous) / _MS
        data.append({"id": step.pk, "position": number, "event": step.event_id,
                     "annotation": step.annotation_id, "at": step.at, "note": step.note,
                     "description": description, "delta_ms": delta_ms,
                     "offset_ms": (step.at - first) / _MS,
                     "delta": "" if delta_ms is None else format_delta(delta_ms)})
        previous = step.at
    return data


def build_steps(items: list[dict], event_times: dict, annotations: dict,
                existing: dict) -> tuple[list[SequenceStep | None], list[dict]]:
    """Steps for ``items`` (dicts with ``id`` to keep one of ``existing``, or ``event`` or
    ``annotation``, and optionally ``note``), in order, new ones unsaved; and per item a dict
    of error lists by field as DRF gives them (empty when fine). ``event_times`` maps the
    incident's event ids to their received time, ``annotations`` ids to the incident's
    annotations: whatever is missing there is not in this incident."""
    steps, errors, seen = [], [], set()
    for item in items:
        error, step = {}, None
        if "id" in item:
            step = existing.get(item["id"])
            if step is None or item["id"] in seen:
                error["id"] = [f"Step {item['id']} is not in this sequence (or given twice)."]
            seen.add(item["id"])
        elif item.get("event") is not None:
            if item["event"] not in event_times:
                error["event"] = [f"Event {item['event']} is not in this incident."]
            else:
                step = SequenceStep(event_id=item["event"], at=event_times[item["event"]])
        else:
            annotation = annotations.get(item["annotation"])
            if annotation is None:
                error["annotation"] = [
                    f"Annotation {item['annotation']} is not in this incident."]
            else:
                step = SequenceStep(annotation=annotation, event_id=annotation.event_id,
                                    at=annotation.start)
        if step is not None and "note" in item:
            step.note = item["note"]
        errors.append(error)
        steps.append(step)
    return steps, errors


MAX_TAGS = 20
MAX_TAG_LENGTH = 50


def normalize_tags(values) -> list[str]:
    """Stripped, lower-case, unique (first kept), empty ones dropped."""
    tags: list[str] = []
    for value in values:
        tag = str(value).strip().lower()
        if tag and tag not in tags:
            tags.append(tag)
    return tags
