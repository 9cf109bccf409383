"""Builds the synthetic incident of the figure benchmark in a PostgreSQL database.

Every event is a clone of a request parsed (by Hindsight's own audit parser) from the audit
fixtures under ``/work/shared/fixtures/audit``, the same 93 source events as ``bench/ingest``
(the caller passes its list of files). Fixture files are only read. Each clone gets a fresh
auditID, a received time on a Poisson process (``rate`` requests/s), a log-normal latency
(median 3 ms), one of three apiserver files as its source and, for named objects, a name suffix
drawn from a skewed pool (``objects`` per source event), so that there are thousands of object
lanes rather than 93. A few requests (``OPEN_SHARE``, 0.05%) never complete: open spans. The
rows go through ``timelines.ingest.store.write_rows``, the store's own COPY path, in batches of
5,000, with the source event's redacted body as each clone's body.

Requires Django to be set up (``DATABASE_URL`` pointing at the bench database) by the caller.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

START = datetime(2025, 1, 1, tzinfo=UTC)
NODES = 3
LATENCY_MEDIAN_MS = 3.0
LATENCY_SIGMA = 0.8
LATENCY_BOUNDS_US = (100, 2_000_000)
OPEN_SHARE = 0.0005  # of requests: never completed (open spans)
BATCH = 5000


@dataclass
class Built:
    incident_id: int
    events: int
    seconds: float
    sources: int
    first: datetime
    last: datetime
    usernames: Counter[str] = field(default_factory=Counter)
    objects: int = 0


def template_rows(paths: list[Path]) -> list:
    """The fixture requests as the audit parser reads them (redaction on, as by default)."""
    from timelines.parsers import Redactor, Report, parse_audit

    rows = []
    for path in paths:
        report = Report(source=path.name)
        with path.open("rb") as handle:
            rows.extend(parse_audit(handle, report, Redactor()))
    return rows


def build(fixtures: list[Path], requests: int, *, rate: float, objects: int, seed: int,
          title: str) -> Built:
    """A new incident holding ``requests`` clones of the requests in ``fixtures``, with one
    finished upload (whose ``finished_at`` names the data version the figure cache keys on)."""
    from django.utils import timezone
    from incidents.models import Incident, Upload
    from timelines.ingest.store import write_rows

    started = time.perf_counter()
    templates = template_rows(fixtures)
    rng = random.Random(seed)
    incident = Incident.objects.create(title=title)
    upload = Upload.objects.create(incident=incident, name="synthetic clones of fixture events",
                                   format="audit", status=Upload.Status.RUNNING,
                                   path_is_copy=False, started_at=timezone.now())
    mean_gap_us = 1_000_000 / rate
    mu = math.log(LATENCY_MEDIAN_MS * 1000)
    low, high = LATENCY_BOUNDS_US
    micros = 0
    usernames: Counter[str] = Counter()
    names: set[tuple[str, str, str]] = set()
    batch = []
    for sequence in range(requests):
        micros += max(1, round(rng.expovariate(1 / mean_gap_us)))
        template = templates[rng.randrange(len(templates))]
        received = START + timedelta(microseconds=micros)
        completed = None
        if rng.random() >= OPEN_SHARE:
            latency = min(high, max(low, round(rng.lognormvariate(mu, LATENCY_SIGMA))))
            completed = received + timedelta(microseconds=latency)
        name = template.name
        if name:
            # log-uniform over the pool: a few objects are busy, most are touched a few times
            name = f"{name}-{int(objects ** rng.random()) - 1}"
            names.add((template.resource, template.namespace, name))
        usernames[template.username] += 1
        batch.append(template._replace(
            audit_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            received=received, completed=completed,
            duration_ms=None if completed is None else (completed - received) / timedelta(
                milliseconds=1),
            name=name, source=f"node-{rng.randrange(NODES) + 1}-kube-apiserver-audit.log",
            line=sequence + 1, stage="ResponseComplete" if completed else "RequestReceived"))
        if len(batch) == BATCH:
            write_rows(incident.pk, upload.pk, batch)
            batch = []
    if batch:
        write_rows(incident.pk, upload.pk, batch)
    Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.DONE, event_count=requests,
                                               new_events=requests, finished_at=timezone.now())
    return Built(incident.pk, requests, time.perf_counter() - started, len(templates), START,
                 START + timedelta(microseconds=micros), usernames, len(names))
