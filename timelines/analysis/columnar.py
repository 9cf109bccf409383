"""The insights' passes over every request, answered from the column index when there is one.

Several insights begin with a GROUP BY over every request of the incident: the audit policy's
coverage, the errors per minute and each burst's details, the writers of each object, the
deletes per actor, the deleted objects and the writes after their deletion (finalizers), and the
window over the creates and deletes that finds re-created objects. Each is a pass of
PostgreSQL over every row (500,000 requests: 0.4–2 s of CPU each, bench/README.md), run behind
the first answer beside the column index's build and the detections. Their columns are fields
of the column index's signatures (``timelines.store.columns``), and its events are in the
events list's order (``received``, then ``id``): the same groups come from it, counted per
signature (one ``bincount``) or, where time order matters, from its events' times (numpy), in
milliseconds.

Each function here answers exactly what the query it stands for answers (its name says which;
tests compare both on incidents of every kind); the queries remain for incidents without an
index (small ones, an index not built yet, values it cannot hold). ``Requests`` is the view of
one index that they share: each field's value per signature, computed once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime

import numpy as np

from ..figures.build import microseconds, moment
from ..models import Event
from ..store import columns
from .common import WRITE_VERBS

_MINUTE_US = 60_000_000


class Requests:
    """The audit requests of one column index: each field's value per signature, and how many
    events each signature has."""

    def __init__(self, index: columns.ColumnIndex) -> None:
        self.index = index
        self._values: dict[str, list] = {}
        self.counts = np.bincount(np.asarray(index.signature), minlength=index.signatures)
        self.audit = np.array([kind == Event.Kind.AUDIT for kind in self.of("kind")],
                              dtype=bool)

    def of(self, field: str) -> list:
        """The value of ``field`` (a column of ``columns.FILTER_COLUMNS``) for each signature
        (a code of None: None)."""
        if field not in self._values:
            values, codes = self.index.field(field)
            self._values[field] = [values[code] for code in np.asarray(codes).tolist()]
        return self._values[field]

    def where(self, test: Callable[..., bool], *fields: str) -> np.ndarray:
        """Per signature: whether it is a request's whose ``fields`` pass ``test``."""
        columns = [self.of(field) for field in fields]
        return self.audit & np.array([bool(test(*values)) for values in zip(*columns,
                                                                             strict=True)],
                                     dtype=bool).reshape(-1)

    def positions(self, signatures: np.ndarray) -> np.ndarray:
        """The positions (in time order) of the events of the signatures selected by the
        boolean ``signatures``."""
        return np.flatnonzero(signatures[np.asarray(self.index.signature)])

    def grouped(self, signatures: np.ndarray, *fields: str) -> Counter:
        """The events of the selected signatures counted per value of ``fields``."""
        counts: Counter = Counter()
        columns = [self.of(field) for field in fields]
        for number in np.flatnonzero(signatures & (self.counts > 0)).tolist():
            counts[tuple(column[number] for column in columns)] += int(self.counts[number])
        return counts


def of_incident(incident_id: int) -> Requests | None:
    """The requests of the incident's column index at its current data version (waiting for
    a build of this process's other lane), or None: no index."""
    index = columns.built(incident_id)
    return None if index is None else Requests(index)


def _ok(code) -> bool:
    return code is not None and 200 <= code < 300


def coverage_rows(requests: Requests) -> list[tuple[str, str, str, bool, int]]:
    """``insights.coverage_rows``: (resource, level, stage, is a write, requests)."""
    counts: Counter = Counter()
    for (resource, level, stage, verb), n in requests.grouped(
            requests.audit, "resource", "level", "stage", "verb").items():
        counts[(resource, level, stage, verb in WRITE_VERBS)] += n
    return [(*key, n) for key, n in counts.items()]


def _category(code) -> str | None:
    """``insights._CATEGORY_CODES``: the category of an error's code."""
    if code is None or not 400 <= code < 600:
        return None
    if code == 409:
        return "conflict"
    if code == 429:
        return "throttled"
    return "server" if code >= 500 else "client"


def error_minutes(requests: Requests) -> tuple[list[tuple[str, datetime, int]],
                                               datetime | None, datetime | None]:
    """``insights.error_minutes``: errors per (category, minute), sorted; the first and last
    request."""
    received = np.asarray(requests.index.received)
    every = requests.positions(requests.audit)
    if every.size == 0:
        return [], None, None
    first, last = moment(received[every[0]]), moment(received[every[-1]])
    names = sorted({c for c in map(_category, requests.of("code")) if c is not None})
    number = np.array([-1 if (c := _category(code)) is None else names.index(c)
                       for code in requests.of("code")], dtype=np.int64).reshape(-1)
    errors = requests.positions(requests.audit & (number >= 0))
    if errors.size == 0:
        return [], first, last
    # one key per (category, minute): the category above the minutes since the epoch
    minutes = np.floor_divide(received[errors], _MINUTE_US)
    span = int(minutes.max() - minutes.min()) + 1
    keys = number[np.asarray(requests.index.signature)[errors]] * span + (minutes - minutes.min())
    found, counts = np.unique(keys, return_counts=True)
    rows = [(names[int(key) // span], moment((int(key) % span + int(minutes.min())) * _MINUTE_US),
             int(n)) for key, n in zip(found.tolist(), counts.tolist(), strict=True)]
    return sorted(rows), first, last


def burst_details(requests: Requests, bursts: list[dict], ids: int) -> list[dict]:
    """``insights.burst_details``: each burst with the ids of its first ``ids`` errors, their
    ``codes`` and their top ``users`` and ``resources``; a burst's errors are the requests of
    its category between its ``start`` and ``end``, found by their times (sorted) and
    counted per signature."""
    received = np.asarray(requests.index.received)
    signature = np.asarray(requests.index.signature)
    category = [_category(code) if audit else None
                for code, audit in zip(requests.of("code"), requests.audit.tolist(), strict=True)]
    for burst in bursts:
        begin, end = np.searchsorted(received, [microseconds(burst["start"]),
                                                microseconds(burst["end"])], side="left")
        of_burst = np.array([c == burst["category"] for c in category], dtype=bool).reshape(-1)
        inside = begin + np.flatnonzero(of_burst[signature[begin:end]])
        burst["ids"] = np.asarray(requests.index.id)[inside[:ids]].tolist()
        counts = np.bincount(signature[inside], minlength=requests.index.signatures)
        for name, field in (("codes", "code"), ("users", "username"),
                            ("resources", "resource")):
            totals: Counter = Counter()
            values = requests.of(field)
            for number in np.flatnonzero(counts).tolist():
                totals[values[number]] += int(counts[number])
            burst[name] = dict(totals) if name == "codes" else top(totals.items())
    return bursts


def top(counted, many: int = 3) -> list[tuple]:
    """The ``many`` (value, count) pairs of most count, then by value."""
    return sorted(counted, key=lambda pair: (-pair[1], pair[0]))[:many]


def finalizer_candidates(requests: Requests, objects: int, writes: int
                         ) -> tuple[dict[tuple, datetime], list[int]]:
    """The queries of ``deletions.finalizer_rows``: the first ``objects`` objects (resource,
    namespace, name) deleted by a successful delete, by the time of their first deletion (then
    by object), with that time; and the ids of the first ``writes`` successful updates and
    patches with bodies (Request or RequestResponse level) from the first of those deletions
    on whose resource and name are of those objects, in time order."""
    deletes = requests.where(lambda verb, code, name: verb == "delete" and _ok(code) and name,
                             "verb", "code", "name")
    positions = requests.positions(deletes)
    if positions.size == 0:
        return {}, []
    signature = np.asarray(requests.index.signature)
    received = np.asarray(requests.index.received)
    keys: dict[tuple, int] = {}
    objects_of = np.array([keys.setdefault(key, len(keys)) for key in zip(
        requests.of("resource"), requests.of("namespace"), requests.of("name"), strict=True)],
        dtype=np.int64).reshape(-1)
    numbers, at = np.unique(objects_of[signature[positions]], return_index=True)
    names = list(keys)
    deleted = sorted(((moment(received[positions[n]]), names[key]) for key, n in zip(
        numbers.tolist(), at.tolist(), strict=True)))[:objects]
    first = {key: when for when, key in deleted}
    resources, named = {key[0] for key in first}, {key[2] for key in first}
    candidates = requests.where(
        lambda verb, code, level, resource, name: (
            verb in ("update", "patch") and _ok(code) and level in ("Request", "RequestResponse")
            and resource in resources and name in named),
        "verb", "code", "level", "resource", "name")
    since = int(np.searchsorted(received, microseconds(min(first.values())), side="left"))
    found = since + np.flatnonzero(candidates[signature[since:]])[:writes]
    return first, np.asarray(requests.index.id)[found].tolist()


def writes_per_writer(requests: Requests) -> list[tuple[str, str, str, str, str, int]]:
    """``insights.writes_per_writer``: (resource, subresource, namespace, name, username,
    writes) of the writes (create, update, patch, delete answered 2xx or 409) of named
    objects."""
    writes = requests.where(
        lambda verb, code, name: verb in WRITE_VERBS and (code == 409 or _ok(code)) and name,
        "verb", "code", "name")
    return [(*key, n) for key, n in requests.grouped(
        writes, "resource", "subresource", "namespace", "name", "username").items()]


def delete_groups(requests: Requests, exclude_user: str, ids: int) -> list[dict]:
    """The queries of ``deletions.deletion_groups``: per (username, resource) of the
    successful deletes (not by ``exclude_user``, not of namespaces), ``count``, ``first``,
    ``last`` and ``ids``, the ids of its first ``ids`` deletes in time order."""
    deletes = requests.where(
        lambda verb, code, user, resource: (verb in ("delete", "deletecollection") and _ok(code)
                                            and user != exclude_user
                                            and resource != "namespaces"),
        "verb", "code", "username", "resource")
    positions = requests.positions(deletes)
    if positions.size == 0:
        return []
    keys: dict[tuple, int] = {}
    users, resources = requests.of("username"), requests.of("resource")
    group = np.array([keys.setdefault((users[n], resources[n]), len(keys))
                      for n in range(requests.index.signatures)], dtype=np.int64).reshape(-1)
    of_event = group[np.asarray(requests.index.signature)[positions]]
    received = np.asarray(requests.index.received)[positions]
    numbers, first_at, counts = np.unique(of_event, return_index=True, return_counts=True)
    # the last of each group: the first of the events read backwards
    _, last_back = np.unique(of_event[::-1], return_index=True)
    # each group's events together, each in time order
    together = positions[np.argsort(of_event, kind="stable")]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    event_ids = np.asarray(requests.index.id)
    names = list(keys)
    return [{"username": names[key][0], "resource": names[key][1], "count": int(n),
             "first": moment(received[start]),
             "last": moment(received[of_event.size - 1 - back]),
             "ids": event_ids[together[begin:begin + min(n, ids)]].tolist()}
            for key, start, n, back, begin in zip(numbers.tolist(), first_at.tolist(),
                                                  counts.tolist(), last_back.tolist(), starts,
                                                  strict=True)]


def recreations(requests: Requests) -> list[tuple[datetime, int, int]]:
    """The window of ``deletions.recreated_rows``: (received, id, the delete's id) of each
    successful create of a named object whose previous successful create or delete of the same
    object (resource, namespace, name; a namespace by its name) was a delete, in time order."""
    lifecycle = requests.where(
        lambda verb, code, name: verb in ("create", "delete") and _ok(code) and name,
        "verb", "code", "name")
    positions = requests.positions(lifecycle)
    if positions.size == 0:
        return []
    keys: dict[tuple, int] = {}
    objects = np.array([keys.setdefault((resource, "" if resource == "namespaces" else namespace,
                                         name), len(keys))
                        for resource, namespace, name in zip(
                            requests.of("resource"), requests.of("namespace"),
                            requests.of("name"), strict=True)], dtype=np.int64).reshape(-1)
    creates = np.array([verb == "create" for verb in requests.of("verb")], dtype=bool)
    signature = np.asarray(requests.index.signature)[positions]
    # each object's events together, each in time order (a stable sort of the time-ordered ones)
    order = np.argsort(objects[signature], kind="stable")
    positions, signature = positions[order], signature[order]
    same = objects[signature][1:] == objects[signature][:-1]
    after_delete = np.flatnonzero(same & creates[signature][1:] & ~creates[signature][:-1]) + 1
    ids, received = np.asarray(requests.index.id), np.asarray(requests.index.received)
    return sorted((moment(received[positions[n]]), int(ids[positions[n]]),
                   int(ids[positions[n - 1]])) for n in after_delete.tolist())
