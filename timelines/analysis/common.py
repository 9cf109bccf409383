"""What every finder of insights shares: the shape of an insight (``insight``), how they speak
of times, counts and objects, the bodies read in chunks, the limits on what one insight carries,
and the detection of bursts in counts per minute (errors of requests, Warning Events).

The finders (``insights`` for requests, ``deletions``, ``findings`` and ``states`` for bundles,
``timelines.detections``) import this module; ``insights`` composes them, so none of them imports
``insights``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

import orjson
from django.db.models import Q, QuerySet

from incidents.notes import format_time

from ..figures.lanes import NONE
from ..models import BodyChunk, Event

MAX_EVENTS = 200  # event ids an insight carries
MAX_LISTED = 50  # entries of an insight's lists of facts (deletes, recreations…)
MAX_GROUPS = 30  # deletion groups, recreated objects, finalizer removals
MAX_BODIES = 2000  # bodies read for one kind
STATUS_OK = Q(code__gte=200, code__lt=300)
WRITE_VERBS = ("create", "update", "patch", "delete")  # requests that change an object
BURST_MIN = 10  # errors of one category in a minute that may be a burst
BURST_FACTOR = 5  # …when this many times the category's mean rate over the incident
BURST_SPAN = timedelta(minutes=10)  # below this span every concentration of errors counts
MAX_BURSTS = 20


def insight(kind: str, title: str, severity: str, explanation: str, events: Iterable[int],
            *, event_count: int | None = None, **extra) -> dict:
    """An insight as the API gives it. Its ``filters`` (the events list's parameters that
    select its events when their ids are too many for a link) name an empty value ``(none)``,
    as a filter takes it: an empty one would be no filter, and select everyone's."""
    ids = list(dict.fromkeys(events))
    if extra.get("filters"):
        extra["filters"] = {name: [NONE if value == "" else value for value in values]
                            for name, values in extra["filters"].items()}
    return {"kind": kind, "title": title, "severity": severity, "explanation": explanation,
            "events": ids[:MAX_EVENTS],
            "event_count": len(ids) if event_count is None else event_count, **extra}


def rfc3339(when: datetime | None) -> str | None:
    return format_time(when) if when is not None else None


def object_label(resource: str, namespace: str, name: str, subresource: str = "") -> str:
    what = resource + (f"/{subresource}" if subresource else "")
    return " ".join(p for p in (what, "/".join(p for p in (namespace, name) if p)) if p)


def ms(delta: timedelta) -> float:
    return delta / timedelta(milliseconds=1)


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def count_of(count: int, resource: str) -> str:
    """``3 configmaps``, ``1 configmap``, ``1 networkpolicy`` (resources are plural)."""
    if not resource:
        return plural(count, "object")
    if count != 1:
        return f"{count:,} {resource}"
    for ending, singular in (("ies", "y"), ("sses", "ss"), ("xes", "x"), ("s", "")):
        if resource.endswith(ending):
            return f"1 {resource[:-len(ending)] + singular}"
    return f"1 {resource}"


def requests_of(events: QuerySet) -> QuerySet:
    return events.filter(kind=Event.Kind.AUDIT)


def read_bodies(rows: Iterable[dict]) -> dict[int, dict]:
    """The stored bodies of ``rows`` (dicts with ``id``, ``body_chunk``, ``body_index``) by
    event id, reading each chunk once (in batches of chunks), whatever the number of events."""
    wanted: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        if row.get("body_chunk") is not None:
            wanted[row["body_chunk"]].append((row["id"], row["body_index"]))
    bodies: dict[int, dict] = {}
    chunk_ids = sorted(wanted)
    for start in range(0, len(chunk_ids), 200):
        for chunk in BodyChunk.objects.filter(pk__in=chunk_ids[start:start + 200]).only("data"):
            lines = chunk.lines()
            for event_id, index in wanted[chunk.pk]:
                if index < len(lines):
                    try:
                        bodies[event_id] = orjson.loads(lines[index])
                    except orjson.JSONDecodeError:
                        continue
    return bodies


def metadata_of(body: dict | None, side: str) -> dict:
    obj = (body or {}).get(side)
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        return obj["metadata"]
    return {}


def find_bursts(minutes: list[tuple[str, datetime, int]], first: datetime | None,
                last: datetime | None) -> list[dict]:
    """Runs of consecutive minutes in which one category's errors reach BURST_MIN and
    BURST_FACTOR times its mean rate over the incident (any concentration when the incident
    spans less than BURST_SPAN): ``category``, ``start``, ``end`` (the minute after),
    ``count``, the busiest first."""
    if first is None:
        return []
    span_minutes = max(1.0, (last - first) / timedelta(minutes=1))
    totals = Counter()
    for category, _, n in minutes:
        totals[category] += n
    bursts = []
    by_category = defaultdict(list)
    for category, minute, n in minutes:
        by_category[category].append((minute, n))
    for category, rows in by_category.items():
        baseline = totals[category] / span_minutes if last - first >= BURST_SPAN else 0.0
        current = None
        for minute, n in sorted(rows):
            if n < BURST_MIN or n < BURST_FACTOR * baseline:
                current = None
                continue
            if current and current["end"] == minute:
                current["end"] = minute + timedelta(minutes=1)
                current["count"] += n
            else:
                current = {"category": category, "start": minute,
                           "end": minute + timedelta(minutes=1), "count": n,
                           "baseline": baseline}
                bursts.append(current)
    return sorted(bursts, key=lambda b: (-b["count"], b["start"]))[:MAX_BURSTS]
