"""The column index: an incident's filterable fields as arrays on disk, so that any heatmap of a
large incident is counted in milliseconds instead of by a database pass over every event.

Counting a million events in PostgreSQL takes 0.4–1 s whatever the index (bench/README.md,
Figure benchmark): the figure cache hides that for views seen before, not for the first view of
a new filter. Here each event is an entry of three arrays: ``received`` as int64 microseconds,
the number of its *signature*, the combination of its filterable fields' values (events share
them: a million synthetic events have 27,000), and its duration (``completed − received`` in
microseconds, for the request statistics of ``timelines.analysis.stats``). Per signature, the
code of each field's value in that field's distinct values, and its lane in each grouping. A
filtered heatmap is then a test of the signatures, one gather into a mask over the events and
one ``bincount`` (20–40 ms for 1M events on this machine), with exactly the answer of the
database's ``GROUP BY`` (tests compare them).

An index is built after an ingest, from the database, for incidents of more than ``MAX_SPANS``
events (smaller ones are drawn as a Gantt, which never needs it), under the incident's data
version: ``COLUMNS_DIR/<incident>/<version digest>/`` (``HINDSIGHT_COLUMNS_DIR``, by default
``<HINDSIGHT_DATA_DIR>/columns``), one ``.npy`` file per array and ``meta.json`` for the
distinct values. Web processes map the files (``mmap``): the
operating system's page cache holds one copy for all of them, and the web and worker
containers share the data volume (docker-compose.yml). A new upload makes a new version; older
versions are removed once the new one is in place, and an incident's deletion removes them all.
Without an index (not built yet, an upload running, a filter it does not hold such as
``group``) the database counts, as before.

The events are stored in the events list's order (``received``, then ``id``), so the times of
any selection come out sorted (the overview's suggested window reads them,
``timelines.reads.overview``), and each event's ``id`` is kept, so that a page of matches can be
read by id. A signature also says whether its events never completed (open spans), which the
overview's outcome series count. The events' free text (``request_uri``, ``message``, ``name``)
is kept beside them in blocks (``timelines.store.textblocks``), so that every reader answers the
text filter ``q`` from the index too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from ..figures.build import HEATMAP_BINS, MICROSECOND, Bins, LaneCounts, microseconds, moment
from ..figures.lanes import GROUPS, NONE, OTHER_LANES, lane_name
from . import aggregate, packed, textblocks

log = logging.getLogger(__name__)

# Filter parameter (timelines.reads.filters.EventFilterSet) → column. Every "any of these values"
# filter on a plain text or integer column; not ``group`` (a list per event), ``audit_id``
# (unique per request: its dictionary would be as big as the events) or the free text ``q``
# (``timelines.store.textblocks``, tested on the events' text).
FILTER_COLUMNS = {
    "kind": "kind", "resource": "resource", "subresource": "subresource", "name": "name",
    "namespace": "namespace", "user": "username", "impersonated_user": "impersonated_user",
    "verb": "verb", "code": "code", "source_ip": "source_ip", "user_agent": "user_agent",
    "api_group": "api_group", "level": "level", "stage": "stage", "source": "source",
    "reason": "reason", "severity": "severity", "component": "component", "node": "node",
}
WINDOW_PARAMS = ("since", "until")
_FIELDS = tuple(dict.fromkeys(FILTER_COLUMNS.values()))
_FETCH_ROWS = 50_000
_SEPARATOR = "\x1f"  # joins a row's fields into its signature
# of the files; a change makes older indexes unreadable, so they are rebuilt. 2: events in time
# order, and the open flag in the signature (``open.npy``). 3: each event's duration
# (``duration.npy``, for the request statistics of ``timelines.analysis.stats``). 4: events in
# (received, id) order, their ids (``id.npy``) and their text (``timelines.store.textblocks``).
_FORMAT = 4

_LOADED_MAX = 4  # indexes kept open per process
_REACH_BLOCK = 4096  # events tested first by ``ColumnIndex.reach``
_REACH_BLOCK_MAX = 1 << 20  # and at most at a time (the matches' positions: 8 MB at most)


def root() -> Path:
    return Path(settings.COLUMNS_DIR)


def version_dir(incident_id: int, version: str) -> Path:
    digest = hashlib.sha256(f"{_FORMAT}:{version}".encode()).hexdigest()[:24]
    return root() / str(incident_id) / digest


def _rows(incident_id: int):
    """Chunks of (received µs, signature, duration µs, id) rows of the incident's events (duration:
    ``completed − received``, 0 for an event that never completed), in no particular order,
    read through the ORM (the embedded default; PostgreSQL groups them itself, see
    ``_postgres_columns``); a signature is the row's ``_FIELDS`` joined by ``_SEPARATOR`` (a
    code of None is ""), then "1" for an event that never completed, else ""."""
    from ..models import Event

    rows = Event.objects.filter(incident_id=incident_id).order_by().values_list(
        "received", *_FIELDS, "completed", "id").iterator(chunk_size=_FETCH_ROWS)
    chunk = []
    for received, *values, completed, pk in rows:
        signature = _SEPARATOR.join(["" if v is None else str(v) for v in values]
                                    + ["1" if completed is None else ""])
        start = microseconds(received)
        length = 0 if completed is None else microseconds(completed) - start
        chunk.append((start, signature, length, pk))
        if len(chunk) == _FETCH_ROWS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# Reading the signatures grouped: enough memory that PostgreSQL aggregates a million events
# (27,000 signatures, 8 MB of times) without spilling to disk.
_GROUP_MEMORY = "128MB"
# PostgreSQL's timestamps count µs from 2000-01-01 UTC
_POSTGRES_EPOCH_US = 946_684_800_000_000


def _postgres_columns(incident_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                 list[str]]:
    """(received µs, duration µs, id, signature number, signatures) of the incident's events, in
    one pass: PostgreSQL joins each row's fields and groups the rows by signature, sending each
    distinct signature once with the times and ids of its events as big-endian int64s.
    200,000 events of 141 signatures: 0.65 s (times alone), where sending every row's time and
    a hash of its signature, then the distinct signatures apart, took 1.3-1.5 s.

    The times go as PostgreSQL holds them (``timestamptz_send``: µs since 2000-01-01) and are
    moved to the epoch here: ``extract(epoch …)`` computes a numeric per row, which took a
    third of the query (500,000 events alone: 0.86 s instead of 1.16 s). An event that never
    completed sends its start twice (duration 0)."""
    fields = ", ".join(["coalesce(code::text, '')" if f == "code" else f for f in _FIELDS]
                       + ["CASE WHEN completed IS NULL THEN '1' ELSE '' END"])
    # a time, its end and its id together in one value, so that they stay together
    sql = (f"SELECT s, string_agg(timestamptz_send(received)"
           f" || coalesce(timestamptz_send(completed), timestamptz_send(received))"
           f" || int8send(id), ''::bytea) FROM"
           f" (SELECT concat_ws(%s::text, {fields}) AS s, id, received, completed"
           f" FROM timelines_event WHERE incident_id = %s) e GROUP BY s")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL work_mem = '{_GROUP_MEMORY}'")
        groups = packed.fetch(sql, [_SEPARATOR, incident_id])
    signatures = [signature for signature, _ in groups]
    times = [np.frombuffer(data, dtype=">i8").reshape(-1, 3) for _, data in groups]
    triples = (np.concatenate(times).astype(np.int64) if times
               else np.empty((0, 3), dtype=np.int64))
    coded = np.repeat(np.arange(len(times), dtype=np.int32),
                      [len(t) for t in times])
    received = triples[:, 0] + _POSTGRES_EPOCH_US
    return (received, triples[:, 1] - triples[:, 0], np.ascontiguousarray(triples[:, 2]),
            coded, signatures)


def _split(signature: str) -> dict | None:
    """A signature's field values (code as int or None) and ``open`` (whether its events never
    completed); None if a value held the separator."""
    *parts, is_open = signature.split(_SEPARATOR)
    if len(parts) != len(_FIELDS):
        return None
    values = dict(zip(_FIELDS, parts, strict=True))
    values["code"] = int(values["code"]) if values["code"] else None
    values["open"] = is_open == "1"
    return values


class UnusualValues(ValueError):
    """A field value holds the separator of signatures: no index for this incident."""


# Builds announced in this process (``announce_build``): incident → set once it has ended.
_announced: dict[int, list[threading.Event]] = {}
_announced_lock = threading.Lock()


def announce_build(incident_id: int):
    """Say that a thread of this process is about to build (or decide not to build) the
    incident's index; returns the function that thread calls when it has ended."""
    ended = threading.Event()
    with _announced_lock:
        _announced.setdefault(incident_id, []).append(ended)

    def done() -> None:
        ended.set()
        with _announced_lock:
            waiting = _announced.get(incident_id, [])
            if ended in waiting:
                waiting.remove(ended)
            if not waiting:
                _announced.pop(incident_id, None)
    return done


def wait_built(incident_id: int, timeout: float = 3600) -> None:
    """Wait for the builds of the incident's index announced in this process (none: at once),
    so that a reader finds the index they are writing instead of none."""
    with _announced_lock:
        waiting = list(_announced.get(incident_id, []))
    for ended in waiting:
        ended.wait(timeout)


def built(incident_id: int) -> ColumnIndex | None:
    """The incident's index at its current data version, once the builds announced in this
    process have ended (``wait_built``); None if there is none (a small incident, an upload
    running, a build that failed)."""
    wait_built(incident_id)
    version = aggregate.data_version(incident_id)
    return load(incident_id, version) if version is not None else None


def build(incident_id: int, version: str) -> Path | None:
    """Write the column index of the incident's events as they are at ``version`` (the caller
    knows no upload is running, see ``aggregate.data_version``) and remove older versions.
    Returns its folder, or None if a newer version became current meanwhile. Raises
    ``UnusualValues`` (nothing written) if a value holds the separator character. Memory: the
    distinct signatures, 20 bytes per event, and one chunk of rows (SQLite) or the grouped times
    and durations as PostgreSQL sends them (16 bytes per event); 28 bytes per event more while
    the events are put in time order."""
    final = version_dir(incident_id, version)
    if (final / "meta.json").exists():
        return final
    started = time.perf_counter()
    # Rows share most of their fields (the same user, agent and verb on the same objects), so
    # each distinct combination is a "signature", decoded once; a row holds only its time and
    # its signature's number, and filters are tested on the signatures, not on every row.
    signatures: dict[str, int] = {}
    received: list[np.ndarray] = []
    durations: list[np.ndarray] = []
    identities: list[np.ndarray] = []
    coded: list[np.ndarray] = []
    postgres = connection.vendor == "postgresql"
    if postgres:
        times, lengths, ids, codes, distinct = _postgres_columns(incident_id)
        received.append(times)
        durations.append(lengths)
        identities.append(ids)
        coded.append(codes)
        signatures = dict.fromkeys(distinct)
    else:
        for chunk in _rows(incident_id):
            times, keys, lengths, ids = zip(*chunk, strict=True)
            received.append(np.fromiter(times, dtype=np.int64, count=len(chunk)))
            durations.append(np.fromiter(lengths, dtype=np.int64, count=len(chunk)))
            identities.append(np.fromiter(ids, dtype=np.int64, count=len(chunk)))
            coded.append(np.fromiter((signatures.setdefault(k, len(signatures)) for k in keys),
                                     dtype=np.int32, count=len(chunk)))
    table = []
    for signature in signatures:
        values = _split(signature)
        if values is None:
            raise UnusualValues(f"incident {incident_id}: a value holds U+001F")
        table.append(values)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        times = np.concatenate(received) if received else np.empty(0, dtype=np.int64)
        numbers = np.concatenate(coded) if coded else np.empty(0, dtype=np.int32)
        ids = np.concatenate(identities) if identities else np.empty(0, dtype=np.int64)
        # in the list's order: a selection's times come out sorted, and the text read in that
        # order lines up (0.2 s for a million events)
        order = np.lexsort((ids, times))
        times = times[order]
        np.save(work / "received.npy", times)
        np.save(work / "signature.npy", numbers[order])
        np.save(work / "id.npy", ids[order])
        lengths = np.concatenate(durations) if durations else np.empty(0, dtype=np.int64)
        np.save(work / "duration.npy", lengths[order])
        del order, lengths, ids, numbers
        arrays_done = time.perf_counter()
        writer = textblocks.Writer(work)
        try:
            if postgres:
                textblocks.read_postgres(incident_id, times, writer)
            else:
                textblocks.read_rows(incident_id, writer)
        finally:
            writer.close()
        if writer.events != times.size:
            raise ValueError(f"incident {incident_id}: text of {writer.events} events,"
                             f" {times.size} indexed")
        text_done = time.perf_counter()
        np.save(work / "open.npy", np.array([row["open"] for row in table], dtype=bool))
        meta = {"format": _FORMAT, "incident": incident_id, "version": version,
                "events": int(times.size), "values": {}, "lanes": {},
                # how the text is folded: as PostgreSQL's upper() or SQLite's LIKE compares it
                "text_case": "upper" if postgres else "ascii"}
        for field in _FIELDS:
            values, codes = _encode([row[field] for row in table])
            meta["values"][field] = values
            np.save(work / f"field-{field}.npy", codes)
        for group in GROUPS:
            values, codes = _encode([lane_name(group, row["kind"], row["resource"],
                                               row["namespace"], row["name"], row["username"],
                                               row["user_agent"], row["source"])
                                     for row in table])
            meta["lanes"][group] = values
            np.save(work / f"lane-{group}.npy", codes)
        # what the build cost (bench/scale reads it): the text, and the rest
        meta["seconds"] = {"text": round(text_done - arrays_done, 2),
                           "rest": round(time.perf_counter() - started
                                         - (text_done - arrays_done), 2)}
        (work / "meta.json").write_text(json.dumps(meta))
        try:
            work.rename(final)
        except OSError:  # another process built the same version first: keep theirs
            if not (final / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # Older versions go once this one is current. Two builds may overlap (two uploads finished
    # a moment apart): the one that finishes last must not remove the newer one.
    current = aggregate.data_version(incident_id)
    if current == version:
        for other in final.parent.iterdir():
            if other != final and not other.name.startswith(".build-"):
                shutil.rmtree(other, ignore_errors=True)
    elif current is not None:  # a newer version is complete: this one will never be read
        shutil.rmtree(final, ignore_errors=True)
        return None
    log.info("column index of incident %s: %s events, %s signatures, in %.1f s (text %.1f s)",
             incident_id, meta["events"], len(table), sum(meta["seconds"].values()),
             meta["seconds"]["text"])
    return final


def _encode(values: list) -> tuple[list, np.ndarray]:
    """(distinct values in order of first appearance, each value's code)."""
    codes: dict = {}
    array = np.fromiter((codes.setdefault(v, len(codes)) for v in values), dtype=np.int32,
                        count=len(values))
    return list(codes), array


def discard(incident_id: int) -> None:
    """Remove every column index of the incident (it is being deleted)."""
    shutil.rmtree(root() / str(incident_id), ignore_errors=True)
    with _lock:
        for key in [k for k in _loaded if k[0] == incident_id]:
            del _loaded[key]


@dataclass
class Window:
    """What a query selects, in the index's terms: the events ``start:stop`` (their positions
    in time order: the query's since..until), of which those where ``mask`` is true (None: all
    of them)."""

    mask: np.ndarray | None
    count: int
    start: int = 0
    stop: int | None = None  # None: to the last event


class ColumnIndex:
    """An incident's column index at one data version, mapped from its files."""

    def __init__(self, folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"format {meta.get('format')}, expected {_FORMAT}")
        self.events: int = meta["events"]
        self.received = np.load(folder / "received.npy", mmap_mode="r")
        self.signature = np.load(folder / "signature.npy", mmap_mode="r")
        # ``completed − received`` (µs) of each event, 0 for those that never completed
        self.duration = np.load(folder / "duration.npy", mmap_mode="r")
        # per signature: the code of each field's value, and its lane in each grouping
        self._fields = {f: np.load(folder / f"field-{f}.npy") for f in _FIELDS}
        self._lanes = {g: np.load(folder / f"lane-{g}.npy") for g in GROUPS}
        self._values: dict[str, list] = meta["values"]
        self._codes = {field: {v: i for i, v in enumerate(values)}
                       for field, values in meta["values"].items()}
        self._lane_names: dict[str, list[str]] = meta["lanes"]
        self.open: np.ndarray = np.load(folder / "open.npy")  # per signature
        self.signatures: int = len(self.open)
        self.id = np.load(folder / "id.npy", mmap_mode="r")
        self.text = textblocks.TextBlocks(folder)
        self.text_case: str = meta["text_case"]

    def field(self, column: str) -> tuple[list, np.ndarray]:
        """(the distinct values of an event column in ``FILTER_COLUMNS``, the code of each
        signature's value in that list)."""
        return self._values[column], self._fields[column]

    def signature_counts(self, window: Window) -> np.ndarray:
        """How many of the selected events have each signature (int64, one per signature)."""
        return np.bincount(self.selected(self.signature, window), minlength=self.signatures)

    def times(self, window: Window) -> np.ndarray:
        """``received`` (µs) of the selected events, in time order."""
        return self.selected(self.received, window)

    @staticmethod
    def selected(events: np.ndarray, window: Window) -> np.ndarray:
        """The selected events' entries of a per-event array (``received``, ``signature``)."""
        part = np.asarray(events[window.start:window.stop])
        return part if window.mask is None else part[window.mask]

    @staticmethod
    def serves(params: Mapping[str, list[str]]) -> bool:
        """Whether every filter of the query (name → values) is one this index holds (a term
        of ``q`` may still not be: ``filters``)."""
        return all(name in FILTER_COLUMNS or name in WINDOW_PARAMS or name == "q"
                   for name in params)

    def filters(self, data: Mapping, names: Iterable[str]) -> dict[str, list] | None:
        """The filters ``names`` of a query (those it gives; ``since``/``until`` are the
        window's) as ``select``, ``reach`` and ``ids`` take them, from the cleaned data of
        ``EventFilterSet``'s form: ``q``'s terms folded (``textblocks.fold``). None when the
        index does not hold one of them. The one translation of a query into the index's
        terms, for every reader (the figure, facets, overview, statistics, the events list,
        its stepping and the exports)."""
        names = [name for name in names if name not in WINDOW_PARAMS]
        if not self.serves(dict.fromkeys(names)):
            return None
        filters = {name: data.get(name) for name in names if name in FILTER_COLUMNS}
        if "q" in names and data.get("q"):
            terms = textblocks.fold(data["q"], self.text_case)
            if terms is None:
                return None
            filters["q"] = terms
        return filters

    def select(self, filters: Mapping[str, list], since: datetime | None,
               until: datetime | None) -> Window:
        """The events matching ``filters`` (parameter → cleaned values, as EventFilterSet's
        form gives them: a repeated value ORs, parameters AND) received within the window.
        The events being in time order, the window is a slice: a zoomed query tests only the
        events inside it (``_masker``)."""
        start, stop = self._slice(since, until)
        mask_of = self._masker(filters)
        mask = np.zeros(stop - start, dtype=bool) if mask_of is None else mask_of(start, stop)
        count = stop - start if mask is None else int(np.count_nonzero(mask))
        return Window(mask, count, start, stop)

    def _slice(self, since: datetime | None, until: datetime | None) -> tuple[int, int]:
        """The positions ``start:stop`` of the events received within since..until."""
        start = int(np.searchsorted(self.received, microseconds(since), "left")) if since else 0
        stop = int(np.searchsorted(self.received, microseconds(until), "right")) if until \
            else self.events
        return start, max(start, stop)

    def _matching(self, filters: Mapping[str, list]) -> np.ndarray | None:
        """Which signatures match ``filters`` (one bool per signature; None: no filter). The
        text filter ``q`` is not theirs (``_tester``)."""
        signatures: np.ndarray | None = None
        for name, values in filters.items():
            if not values or name == "q":
                continue
            field = FILTER_COLUMNS[name]
            known = self._codes[field]
            # a value the field lacks (NONE) is held as the database holds it: "" or no code
            empty = None if field == "code" else ""
            values = [empty if v == NONE else v for v in values]
            match = np.isin(self._fields[field], [known[v] for v in values if v in known])
            signatures = match if signatures is None else (signatures & match)
        return signatures

    def _masker(self, filters: Mapping[str, list]):
        """A function of ``(begin, end)`` giving one bool per event ``begin:end``, whether it
        matches ``filters`` (None: every event does), or None when no event can match. The
        text filter ``q`` (terms folded by ``textblocks.fold``) opens only the text blocks that
        may hold every term, and of those only the ones holding an event the other filters
        keep."""
        signatures = self._matching(filters)
        terms = filters.get("q") or []
        blocks = self.text.candidates(terms) if terms else None
        if (signatures is not None and not signatures.any()) or \
                (blocks is not None and not blocks.any()):
            return None

        def mask(begin: int, end: int) -> np.ndarray | None:
            kept = None if signatures is None else signatures[self.signature[begin:end]]
            if terms:
                text = self.text.matches(terms, begin, end, blocks, kept)
                kept = text if kept is None else (kept & text)
            return kept

        return mask

    def _tester(self, filters: Mapping[str, list]):
        """``_masker`` giving the positions (from ``begin``) of the matching events."""
        mask_of = self._masker(filters)
        if mask_of is None:
            return None

        def hits(begin: int, end: int) -> np.ndarray:
            mask = mask_of(begin, end)
            return np.arange(end - begin) if mask is None else np.flatnonzero(mask)

        return hits

    def ids(self, filters: Mapping[str, list], first: int, last: int) -> np.ndarray:
        """The ids of the events matching ``filters`` received from ``first`` to ``last`` (µs,
        inclusive), in the list's order."""
        begin = int(np.searchsorted(self.received, first, "left"))
        end = int(np.searchsorted(self.received, last, "right"))
        hits = self._tester(filters)
        if hits is None or begin >= end:
            return np.empty(0, dtype=np.int64)
        return np.asarray(self.id[begin:end])[hits(begin, end)]

    def reach(self, filters: Mapping[str, list], since: datetime | None,
              until: datetime | None, *, count: int, after: int | None = None,
              before: int | None = None) -> tuple[int, int] | None:
        """``received`` (µs) of the first and of the last of the ``count`` selected events (as
        ``select`` selects them) nearest to a point: the first ``count`` received after
        ``after`` (µs, exclusive; None: from the window's start), or with ``before`` the last
        ``count`` received before it. None when there is none. No event is looked at when no
        signature matches, or no text block may hold the terms of ``q``; otherwise the events
        are tested in blocks growing from that point, so a page of a common or a rare value
        costs a few thousand tests, not one per event (the events list narrows its query to
        this reach, ``timelines.web.api.narrowed``)."""
        start, stop = self._slice(since, until)
        if after is not None:
            start = max(start, int(np.searchsorted(self.received, after, "right")))
        backward = before is not None
        if backward:
            stop = min(stop, int(np.searchsorted(self.received, before, "left")))
        hits_of = self._tester(filters)
        if start >= stop or count < 1 or hits_of is None:
            return None
        near = far = None
        found, block = 0, _REACH_BLOCK
        while found < count and start < stop:
            begin, end = (max(start, stop - block), stop) if backward \
                else (start, min(stop, start + block))
            hits = hits_of(begin, end)
            if backward:
                hits = hits[::-1]
                stop = begin
            else:
                start = end
            if hits.size:
                near = begin + int(hits[0]) if near is None else near
                taken = min(hits.size, count - found)
                far = begin + int(hits[taken - 1])
                found += taken
            block = min(block * 4, _REACH_BLOCK_MAX)
        if near is None:
            return None
        first, last = (far, near) if backward else (near, far)
        return int(self.received[first]), int(self.received[last])

    def lane_counts(self, window: Window, group: str, *, since: datetime | None = None,
                    until: datetime | None = None, bins: int = HEATMAP_BINS,
                    max_lanes: int | None = None) -> LaneCounts | None:
        """``aggregate.lane_counts`` of the selected events: the same bins, lanes, ranking and
        folding (most active first, ties by name; the rest summed into ``OTHER_LANES``).
        ``max_lanes`` defaults to ``aggregate.HEATMAP_LANES``."""
        if window.count == 0:
            return None
        if max_lanes is None:  # the database's limit, read now (tests change it)
            max_lanes = aggregate.HEATMAP_LANES
        received = self.selected(self.received, window)
        signature = self.selected(self.signature, window)
        first_us, last_us = int(received.min()), int(received.max())
        first, last = moment(first_us), moment(last_us)
        edges = Bins.spanning(min(since or first, first), max(until or last, last), bins)
        columns = (received - microseconds(edges.start)) // (edges.width // MICROSECOND)
        names = self._lane_names[group]
        lanes = self._lanes[group].astype(np.int64)[signature]
        cells = np.bincount(lanes * edges.count + columns,
                            minlength=len(names) * edges.count).reshape(len(names), edges.count)
        totals = cells.sum(axis=1)
        ranked = sorted(np.flatnonzero(totals).tolist(),
                        key=lambda lane: (-int(totals[lane]), names[lane]))
        shown, rest = ranked[:max_lanes], ranked[max_lanes:]
        z = [cells[lane].tolist() for lane in shown]
        if rest:
            z.append(cells[rest].sum(axis=0).tolist())
        return LaneCounts(edges, [names[lane] for lane in shown] + ([OTHER_LANES] if rest else []),
                          z, window.count, len(ranked), len(rest), first, last)


_loaded: OrderedDict[tuple[int, str], ColumnIndex] = OrderedDict()
_lock = threading.Lock()


def load(incident_id: int, version: str) -> ColumnIndex | None:
    """The incident's column index at ``version`` if it has been built, else None."""
    key = (incident_id, version)
    with _lock:
        index = _loaded.get(key)
        if index is not None:
            _loaded.move_to_end(key)
            return index
    folder = version_dir(incident_id, version)
    if not (folder / "meta.json").exists():
        return None
    try:
        index = ColumnIndex(folder)
    except (OSError, ValueError) as exc:  # removed meanwhile by a newer version, or damaged
        log.warning("column index %s unreadable: %s", folder, exc)
        return None
    with _lock:
        _loaded[key] = index
        while len(_loaded) > _LOADED_MAX:
            _loaded.popitem(last=False)
    return index


def forget() -> None:
    """Close every index this process has open (they are mapped again on the next use)."""
    with _lock:
        _loaded.clear()


def size_on_disk(incident_id: int) -> int:
    """Bytes of the incident's column indexes (for the benchmark and the docs)."""
    folder = root() / str(incident_id)
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0

