"""The rules evaluated over one incident's stored requests, and the detections they make.

Reading every body for every rule would cost seconds per hundred thousand requests, so each
rule is first decided on the indexed columns alone: the requests are grouped by the columns the
rules can read without a body (verb, user, object, code, stage: one GROUP BY), and each rule's
compiled condition is evaluated once per group in three-valued logic (``condition.UNKNOWN`` for
a field only the body holds). A group where the rule is false (most: ``kevt and pod and
kcreate`` rules out every get, list and watch) costs nothing more; true, every request of it
matches; unknown, only those requests' bodies are read, once, for all such rules.

The bodies are read in the order they are stored (each chunk fetched and decompressed once,
the pointers of every request in one query) and each parsed once; a body is tried only as the
stages its open rules can match, and decided once per distinct combination of the values of
the fields those rules read (``_Plan``), which is what a pod of a replicated template or a
re-applied manifest shares with the others.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import orjson
from django.db import connection
from django.db.models.expressions import RawSQL

from ..analysis.common import insight, read_bodies
from ..models import BodyChunk, Event
from ..store import packed
from . import rules as rules_module
from .condition import POSITIVE_TIME, UNKNOWN, View
from .engine import stages_of
from .fields import extractor
from .rules import Rule, RuleSet, render_output

log = logging.getLogger(__name__)

GROUP_COLUMNS = ("verb", "username", "impersonated_user", "resource", "subresource",
                 "namespace", "name", "code", "stage")
# field (as written in a rule) → column; "" is what ingest stores for a field the event lacks
COLUMN_FIELDS = {
    "ka.verb": "verb", "ka.user.name": "username", "ka.impuser.name": "impersonated_user",
    "ka.target.resource": "resource", "ka.target.subresource": "subresource",
    "ka.target.namespace": "namespace", "ka.target.name": "name",
    "ka.req.configmap.name": "name", "ka.response.code": "code",
    "ka.stage": "stage", "jevt.value[/stage]": "stage",
}
MAX_GROUPS = 30  # objects told one by one per rule; the rest in one more insight
BODY_BATCH = 20_000


class ColumnView(View):
    """A group of requests as the rules see it before any body is read."""

    __slots__ = ("columns",)

    def __init__(self, columns: dict):
        super().__init__({})
        self.columns = columns

    def get(self, text, extract):
        column = COLUMN_FIELDS.get(text)
        if column is None:
            if text == "jevt.rawtime":
                return POSITIVE_TIME  # a stored request always has its time
            return UNKNOWN
        value = self.columns.get(column, UNKNOWN)
        if value is UNKNOWN:
            return UNKNOWN
        if value is None or value == "":
            return None
        return str(value)


def body_from_columns(row: dict) -> dict:
    """The audit event a body-less request stands for, from its columns."""
    ref = {k: row[c] for k, c in (("resource", "resource"), ("subresource", "subresource"),
                                  ("namespace", "namespace"), ("name", "name")) if row.get(c)}
    event = {"kind": "Event", "verb": row["verb"], "stage": row["stage"],
             "user": {"username": row["username"]}, "requestURI": row.get("request_uri", "")}
    if ref:
        event["objectRef"] = ref
    if row.get("impersonated_user"):
        event["impersonatedUser"] = {"username": row["impersonated_user"]}
    if row.get("code") is not None:
        event["responseStatus"] = {"code": row["code"]}
    return event


def column_stages(columns: dict) -> list[ColumnView]:
    stand_in = {"stage": columns["stage"], "verb": columns["verb"]}
    if columns.get("code") is not None:
        stand_in["responseStatus"] = {"code": columns["code"]}
    return [ColumnView({**columns, "stage": s["stage"]}) for s in stages_of(stand_in)]


def decide(rule: Rule, views: list[View]) -> bool | None:
    result = False
    for view in views:
        value = rule.test(view)
        if value is True:
            return True
        if value is None:
            result = None
    return result


def _columns_read(rule: Rule) -> tuple[str, ...]:
    """The columns a rule's verdict on a group depends on (the stages come from stage, verb
    and code)."""
    read = {COLUMN_FIELDS[f] for f in rule.fields if f in COLUMN_FIELDS}
    return tuple(sorted(read | {"stage", "verb", "code"}))


class Verdicts:
    """Each rule decided on a group's columns, once per combination of the columns it reads
    (most rules read four or five: a few dozen combinations among thousands of groups)."""

    def __init__(self, active: list[Rule]):
        self.rules = [(rule, _columns_read(rule), {}) for rule in active]

    def of(self, columns: dict) -> tuple[list[Rule], list[Rule]]:
        """(the rules every request of the group matches, the rules its bodies must decide)."""
        views = None
        true, undecided = [], []
        for rule, read, memo in self.rules:
            key = tuple(columns[c] for c in read)
            try:
                verdict = memo[key]
            except KeyError:
                if views is None:
                    views = column_stages(columns)
                verdict = memo[key] = decide(rule, views)
            if verdict is True:
                true.append(rule)
            elif verdict is None:
                undecided.append(rule)
        return true, undecided


@dataclass
class Matches:
    """What the rules matched: rule name → event ids."""

    ids: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    bodies_read: int = 0  # parsed
    groups: int = 0
    from_index: bool = False
    column_seconds: float = 0.0  # deciding on the columns, before any body is read
    seconds: float = 0.0


def groups_of(incident_id: int, event_ids=None) -> list[tuple[dict, list[int]]]:
    """(columns, event ids) of the incident's requests (only ``event_ids`` when given) grouped
    by GROUP_COLUMNS."""
    requests = Event.objects.filter(incident_id=incident_id, kind=Event.Kind.AUDIT).order_by()
    if event_ids is not None and connection.vendor == "postgresql":
        # one array parameter, not one per id (8,000 of them cost more than the query)
        requests = requests.filter(pk__in=RawSQL("SELECT unnest(%s::bigint[])", (
            list(event_ids),)))
    elif event_ids is not None:
        requests = requests.filter(pk__in=event_ids)
    if connection.vendor == "postgresql":
        from django.contrib.postgres.aggregates import ArrayAgg

        return [({c: row[c] for c in GROUP_COLUMNS}, row["ids"]) for row in requests.values(
            *GROUP_COLUMNS).annotate(ids=ArrayAgg("id"))]
    grouped: dict[tuple, list[int]] = defaultdict(list)
    for row in requests.values_list(*GROUP_COLUMNS, "id").iterator(chunk_size=10_000):
        grouped[row[:-1]].append(row[-1])
    return [(dict(zip(GROUP_COLUMNS, key, strict=True)), ids) for key, ids in grouped.items()]


def _index_of(incident_id: int):
    """The incident's column index at its current data version, or None (none built: a small
    incident, or an upload running)."""
    from ..store import columns

    return columns.built(incident_id)  # the analyses' other lane may be writing it


def _decide_groups(incident_id: int, verdicts: Verdicts, found: Matches,
                   event_ids=None, pause=lambda: None) -> dict[int, list[Rule]]:
    """Every rule decided per group of requests; the requests whose bodies must decide some
    (id → those rules). From the column index's signatures when there is one (no query) and
    the whole incident is wanted, else one GROUP BY."""
    pending: dict[int, list[Rule]] = {}
    index = _index_of(incident_id) if event_ids is None else None
    if index is not None:
        _decide_signatures(index, verdicts, found, pending)
        return pending
    for columns, ids in groups_of(incident_id, event_ids):
        found.groups += 1
        pause()
        true, undecided = verdicts.of(columns)
        for rule in true:
            found.ids[rule.name] += ids
        if undecided:
            for event_id in ids:
                pending[event_id] = undecided
    return pending


def _decide_signatures(index, verdicts: Verdicts, found: Matches,
                       pending: dict[int, list[Rule]]) -> None:
    """``_decide_groups`` on a column index: for each rule, the distinct combinations of the
    codes of the columns it reads among the signatures (``numpy.unique``, a few dozen), each
    decided once, then spread to the signatures and from them to the events."""
    found.from_index = True
    values = {c: index.field(c)[0] for c in (*GROUP_COLUMNS, "kind")}
    codes = {c: np.asarray(index.field(c)[1]) for c in (*GROUP_COLUMNS, "kind")}
    audit = codes["kind"] == (values["kind"].index(Event.Kind.AUDIT)
                              if Event.Kind.AUDIT in values["kind"] else -1)
    found.groups = int(np.count_nonzero(audit))
    event_signatures = np.asarray(index.signature)
    ids = np.asarray(index.id)
    undecided_any = np.zeros(index.signatures, dtype=bool)
    undecided_masks = []
    def verdicts_of(rule, read, rows):
        """Per signature of ``rows``: 0 false, 1 true, 2 unknown, reading columns ``read``."""
        # one int64 per signature (mixed radix over the columns' value counts), whose distinct
        # values np.unique finds far faster than distinct rows of a 2-D array
        key = np.zeros(len(rows), dtype=np.int64)
        radix = 1
        for c in read:
            key += codes[c][rows].astype(np.int64) * radix
            radix *= max(1, len(values[c]))
        if radix >= 1 << 62:  # too many values to pack: distinct rows
            stacked = np.stack([codes[c][rows] for c in read], axis=1)
            combos, inverse = np.unique(stacked, axis=0, return_inverse=True)
            combos = [row.tolist() for row in combos]
        else:
            packed, inverse = np.unique(key, return_inverse=True)
            combos = []
            for number in packed.tolist():
                combo = []
                for c in read:
                    size = max(1, len(values[c]))
                    combo.append(number % size)
                    number //= size
                combos.append(combo)
        verdict = np.zeros(len(combos), dtype=np.int8)
        for number, combo in enumerate(combos):
            columns = {c: values[c][code] for c, code in zip(read, combo, strict=True)}
            result = decide(rule, column_stages(columns))
            verdict[number] = 1 if result is True else (2 if result is None else 0)
        return verdict[inverse.reshape(-1)]

    everything = np.arange(index.signatures)
    for rule, read, _ in verdicts.rules:
        # names are nearly as many as signatures: decided without them first, then only
        # where that left the rule open
        coarse = tuple(c for c in read if c != "name")
        per_signature = verdicts_of(rule, coarse, everything)
        if coarse != read:
            open_rows = np.flatnonzero(per_signature == 2)
            if len(open_rows):
                per_signature[open_rows] = verdicts_of(rule, read, open_rows)
        per_signature[~audit] = 0
        true = per_signature == 1
        if true.any():
            found.ids[rule.name] += ids[true[event_signatures]].tolist()
        unknown = per_signature == 2
        if unknown.any():
            undecided_any |= unknown
            undecided_masks.append((rule, unknown))
    if not undecided_any.any():
        return
    chosen = undecided_any[event_signatures]
    rules_of: dict[int, list[Rule]] = {}
    for number in np.flatnonzero(undecided_any).tolist():
        rules_of[number] = [rule for rule, mask in undecided_masks if mask[number]]
    for event_id, number in zip(ids[chosen].tolist(), event_signatures[chosen].tolist(),
                                strict=True):
        pending[event_id] = rules_of[number]


def _pointers(incident_id: int, wanted: np.ndarray, whole: bool) -> np.ndarray:
    """(event id, body chunk, index in the chunk) of the requests ``wanted`` (sorted ids), in
    body order (chunk -1: stored without a body). For the whole incident PostgreSQL sends every
    request's pointer in one value (0.7 s for a million; selecting the wanted ids by primary key
    took 2 s for 320,000), for a stream's batch only those wanted."""
    if connection.vendor == "postgresql":
        where = "AND kind = %s::text" if whole else "AND id = ANY(%s::bigint[])"
        ((data,),) = packed.fetch(
            "SELECT string_agg(int8send(id) || int8send(coalesce(body_chunk, -1))"
            f" || int8send(body_index), ''::bytea) FROM timelines_event"
            f" WHERE incident_id = %s {where}",
            [incident_id, str(Event.Kind.AUDIT) if whole else wanted.tolist()])
        rows = (np.frombuffer(data, dtype=">i8").reshape(-1, 3).astype(np.int64)
                if data else np.empty((0, 3), dtype=np.int64))
    else:
        found = []
        for start in range(0, len(wanted), BODY_BATCH):
            found += Event.objects.filter(
                incident_id=incident_id, pk__in=wanted[start:start + BODY_BATCH].tolist(),
            ).values_list("id", "body_chunk", "body_index")
        rows = np.array([(pk, -1 if chunk is None else chunk, index)
                         for pk, chunk, index in found], dtype=np.int64).reshape(-1, 3)
    rows = rows[np.isin(rows[:, 0], wanted, assume_unique=True)]
    return rows[np.lexsort((rows[:, 2], rows[:, 1]))]


def _lines(pointers: np.ndarray):
    """(event id, its stored line or None) for ``pointers`` (in body order), each chunk read
    and decompressed once, 200 chunks a query."""
    chunk_ids, starts = np.unique(pointers[:, 1], return_index=True)
    bounds = [*starts.tolist(), len(pointers)]
    where = {chunk: (bounds[n], bounds[n + 1]) for n, chunk in enumerate(chunk_ids.tolist())}
    ids, indexes = pointers[:, 0].tolist(), pointers[:, 2].tolist()
    if -1 in where:
        begin, end = where.pop(-1)
        for n in range(begin, end):
            yield ids[n], None
    chunk_ids = sorted(where)
    for start in range(0, len(chunk_ids), 200):
        batch = chunk_ids[start:start + 200]
        data = dict(BodyChunk.objects.filter(pk__in=batch).values_list("id", "data"))
        for chunk in batch:
            begin, end = where[chunk]
            lines = BodyChunk(data=data[chunk]).lines() if chunk in data else []
            for n in range(begin, end):
                index = indexes[n]
                yield ids[n], lines[index] if index < len(lines) else None


STAGES = ("ResponseComplete", "ResponseStarted", "RequestReceived", "Panic")


def possible_stages(rule: Rule) -> frozenset[str]:
    """The stages on which a rule can match at all, whatever the rest of the request (``kevt``
    rules: ResponseComplete only), so that a body is not tried as the stages it cannot match."""
    return frozenset(stage for stage in STAGES
                     if rule.test(ColumnView({"stage": stage})) is not False)


MEMO_SIZE = 10_000  # verdicts remembered per plan before they are forgotten (memory bound)


class _Plan:
    """How the bodies of requests left open for the same rules are tried: only as the stages
    one of those rules can match (41 of the 48 default rules: ``ResponseComplete`` alone), so
    that no stand-in stage is built for nothing; and each stage decided once per distinct
    combination of the values of the fields those rules read (a rule's verdict is a function of
    them alone), so that the pods of one template, which differ only in what no rule reads
    (names, uids, times), are decided once."""

    __slots__ = ("extractors", "memo", "rules", "stages", "texts")

    def __init__(self, pending: list[Rule], stages_for: dict[str, frozenset[str]]):
        self.stages = frozenset().union(*(stages_for[r.name] for r in pending))
        self.rules = [(rule, stages_for[rule.name]) for rule in pending]
        self.texts = sorted(set().union(*(rule.fields for rule in pending)))
        self.extractors = [extractor(text) for text in self.texts]
        self.memo: dict[tuple, list[bool]] = {}

    def verdicts(self, stage: dict) -> list[bool]:
        """Whether each of the rules matches ``stage`` (one stage of a request's body)."""
        name = stage.get("stage")
        values = [extract(stage) for extract in self.extractors]
        key = (name, *[value if type(value) is not list else tuple(value) for value in values])
        verdicts = self.memo.get(key)
        if verdicts is None:
            view = View(stage)
            view.cache = dict(zip(self.texts, values, strict=True))
            verdicts = [(name in can or name not in STAGES) and rule.test(view) is True
                        for rule, can in self.rules]
            if len(self.memo) >= MEMO_SIZE:
                self.memo.clear()
            self.memo[key] = verdicts
        return verdicts


def evaluate(incident_id: int, ruleset: RuleSet, event_ids=None, pause=None) -> Matches:
    """The rules over the incident's requests, or only those of ``event_ids`` (a stream's
    batch: ``streams.detect``). ``pause``, when given, is called between small pieces of the
    work (a group, a body): a stream's receivers go first (``streams.detect.GiveWay``). The
    bodies of a whole incident are tried by two processes at once (``_Helper``)."""
    started = time.perf_counter()
    found = Matches()
    pause = pause or (lambda: None)
    pending = _decide_groups(incident_id, Verdicts(ruleset.active), found, event_ids, pause)
    found.column_seconds = time.perf_counter() - started
    if not pending:
        found.seconds = time.perf_counter() - started
        return found
    bodies = _Bodies(pending, {rule.name: possible_stages(rule) for rule in ruleset.active})
    pointers = _pointers(incident_id, np.fromiter(sorted(pending), dtype=np.int64,
                                                  count=len(pending)), event_ids is None)
    helper = None
    if event_ids is None and _Helper.fits(len(pointers)):
        mine, theirs = _halves(pointers)
        helper = _Helper.start(bodies, theirs)
        if helper is not None:
            pointers = mine
    own = time.perf_counter()
    missing = bodies.try_lines(pointers, found, pause)
    if helper is not None:
        # the second half's matches after the first's: each rule's ids in body order, as when
        # one process tries them all; it has the time this half took, many times over
        patience = max(_Helper.MIN_PATIENCE, 10 * (time.perf_counter() - own))
        missing += helper.join(found, patience)
    if missing:  # requests stored without their body: what their columns say
        for row in Event.objects.filter(incident_id=incident_id, pk__in=missing).values(
                "id", "request_uri", *GROUP_COLUMNS):
            rules_open = pending[row["id"]]
            _try(_Plan(rules_open, bodies.stages_for), body_from_columns(row), row["id"],
                 found.ids)
    found.seconds = time.perf_counter() - started
    return found


class _Bodies:
    """Trying the stored bodies of the requests left open (``pending``: id → the rules their
    columns left undecided), one plan per set of open rules (a few dozen), found by the list
    of them that the requests of one signature share."""

    def __init__(self, pending: dict[int, list[Rule]],
                 stages_for: dict[str, frozenset[str]]) -> None:
        self.pending, self.stages_for = pending, stages_for
        self.plans: dict[tuple[str, ...], _Plan] = {}
        self.plan_of: dict[int, _Plan] = {}

    def try_lines(self, pointers: np.ndarray, found: Matches, pause) -> list[int]:
        """Try the bodies of ``pointers`` (in body order) into ``found``; returns the ids of
        the requests stored without their body."""
        missing = []
        matched = found.ids
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        for event_id, line in _lines(pointers):
            if line is None:
                missing.append(event_id)
                continue
            try:
                body = loads(line)
            except decode_error:
                continue
            found.bodies_read += 1
            pause()
            rules_open = self.pending[event_id]
            plan = self.plan_of.get(id(rules_open))
            if plan is None:
                plan = self.plan_of[id(rules_open)] = self.plans.setdefault(
                    tuple(rule.name for rule in rules_open), _Plan(rules_open, self.stages_for))
            _try(plan, body, event_id, matched)
        return missing


def _halves(pointers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pointers`` (in body order) cut in two near the middle, where a chunk begins (each
    chunk is read once)."""
    middle = len(pointers) // 2
    cut = int(np.searchsorted(pointers[:, 1], pointers[middle, 1], "left"))
    if cut == 0:
        cut = int(np.searchsorted(pointers[:, 1], pointers[middle, 1], "right"))
    return pointers[:cut], pointers[cut:]


class _Helper:
    """A forked process trying one half of the bodies while this one tries the other: the
    rules are Python (parsing and testing 161,109 bodies of the ingest benchmark: 2.3 s of one
    CPU, at the end of the analyses with the other CPU idle). PostgreSQL outside a
    transaction only (the child reads the chunks on a connection of its own, which would not
    see a caller's open transaction). It shares nothing but the pipe of its answer: the
    inherited connections are left alone (psycopg closes none of them in a process other than
    their own) and it ends with ``os._exit``. Whatever goes wrong in it, the half is tried
    here instead (``join``): never a match lost."""

    MIN_BODIES = 20_000  # fewer are not worth a process (forking: 10-20 ms)
    MIN_PATIENCE = 60.0  # seconds the parent waits at least for the helper's answer

    def __init__(self, bodies: _Bodies, pointers: np.ndarray, pid: int, reader: int) -> None:
        self.bodies, self.pointers, self.pid, self.reader = bodies, pointers, pid, reader

    @classmethod
    def fits(cls, bodies: int) -> bool:
        return (bodies >= cls.MIN_BODIES and connection.vendor == "postgresql"
                and not connection.in_atomic_block and hasattr(os, "fork"))

    @classmethod
    def start(cls, bodies: _Bodies, pointers: np.ndarray) -> _Helper | None:
        """The helper trying ``pointers``, or None if no process could be made."""
        reader, writer = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(reader)
            os.close(writer)
            log.warning("detections: no second process (%s): one tries every body", exc)
            return None
        if pid == 0:  # the child, which never returns from here
            os.close(reader)
            cls._child(bodies, pointers, writer)
            os._exit(1)
        os.close(writer)
        return cls(bodies, pointers, pid, reader)

    @staticmethod
    def _child(bodies: _Bodies, pointers: np.ndarray, writer: int) -> None:
        code = 1
        try:
            from django.db import connections

            for alias in connections:  # opened anew on first use; the parent's left alone
                connections[alias].connection = None
            found = Matches()
            missing = bodies.try_lines(pointers, found, lambda: None)
            answer = pickle.dumps((dict(found.ids), found.bodies_read, missing),
                                  protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(writer, "wb") as out:
                out.write(answer)
            code = 0
        except BaseException:  # noqa: BLE001 - told on stderr; the parent tries the half
            traceback.print_exc()
        finally:
            os._exit(code)

    def join(self, found: Matches, patience: float) -> list[int]:
        """Add the helper's matches to ``found`` (or try its half here if it failed); returns
        the ids of its requests stored without their body. A helper that has not answered
        within ``patience`` seconds (it hangs: a lock another thread held when it was forked,
        say) is killed and its half tried here."""
        data, deadline = bytearray(), time.monotonic() + patience
        with os.fdopen(self.reader, "rb", buffering=0) as answer:
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([answer], [], [], left)[0]:
                    continue
                piece = answer.read(1 << 20)
                if not piece:
                    break
                data += piece
            else:
                log.warning("detections: the second process gave no answer in %.0f s: killed,"
                            " its %d bodies are tried here", patience, len(self.pointers))
                os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        if status == 0:
            try:
                ids, bodies_read, missing = pickle.loads(data)
            except (pickle.UnpicklingError, EOFError, ValueError) as exc:
                log.warning("detections: the second process's answer is unreadable: %s", exc)
            else:
                for rule, matched in ids.items():
                    found.ids[rule] += matched
                found.bodies_read += bodies_read
                return missing
        else:
            log.warning("detections: the second process ended with status %s: its %d bodies"
                        " are tried here", status, len(self.pointers))
        return self.bodies.try_lines(self.pointers, found, lambda: None)


def _try(plan: _Plan, body: dict, event_id: int, matched: dict[str, list[int]]) -> None:
    """The open rules of one request over the stages of its body they can match."""
    stages = stages_of(body, plan.stages)
    if not stages:
        return
    verdicts = plan.verdicts(stages[0]) if len(stages) == 1 else [
        any(column) for column in zip(*(plan.verdicts(stage) for stage in stages), strict=True)]
    for (rule, _), verdict in zip(plan.rules, verdicts, strict=True):
        if verdict:
            matched[rule.name].append(event_id)


def ruleset_for(incident_id: int) -> RuleSet:
    """The shipped rules, then the added rules files of the instance and of the incident's
    team, in the order they were added."""
    from incidents.models import Incident

    team_id = Incident.objects.filter(pk=incident_id).values_list("team_id", flat=True).first()
    return ruleset_of_team(team_id)


def ruleset_of_team(team_id: int | None) -> RuleSet:
    """The shipped rules, then the instance's added rules files and those of ``team_id``."""
    from django.db.models import Q

    from .models import RulesFile

    added = RulesFile.objects.filter(Q(team__isnull=True) | Q(team_id=team_id)).order_by("id")
    return rules_module.load(rules_module.default_files() + [(f.name, f.text) for f in added])


def detection_insights(incident_id: int, ruleset: RuleSet, found: Matches) -> list[dict]:
    """One insight per rule and object (resource, namespace, name), the objects of most
    requests first (MAX_GROUPS per rule, the rest in one more insight). The objects are grouped
    from the column index's signatures when it holds every match (no query but the rows of the
    objects told), else from the matched rows (at 500,000 requests and 355,000 matches: 10.5 s
    reading them by id, against a fraction of a second from the index)."""
    index = _index_of(incident_id) if any(found.ids.values()) else None
    locate = _Locator(index) if index is not None else None
    out = []
    for rule in ruleset.active:
        ids = found.ids.get(rule.name)
        if not ids:
            continue
        objects = locate.objects(ids) if locate is not None else None
        if objects is None:
            objects = _objects_from_rows(incident_id, ids)
        ranked = sorted(objects, key=lambda o: (-len(o[1]), o[1][0]))
        shown = ranked[:MAX_GROUPS]
        firsts = {row["id"]: row for row in Event.objects.filter(
            incident_id=incident_id, pk__in=[items[0] for _, items in shown]).values(
            *_TOLD_COLUMNS)}
        bodies = read_bodies([firsts[items[0]] for _, items in shown])
        for (resource, namespace, name), items in shown:
            first = firsts[items[0]]
            body = bodies.get(first["id"]) or body_from_columns(first)
            stage = next((s for s in stages_of(body) if rule.test(View(s)) is True), body)
            output = render_output(rule, stage)
            out.append(insight(
                "detection", rule.name, rule.severity, output, list(items),
                rule=rule.name, priority=rule.priority, output=output, source=rule.file,
                tags=rule.tags, resource=resource, namespace=namespace, name=name,
                filters={"detection": [rule.name]}))
        rest = sorted(i for _, items in ranked[MAX_GROUPS:] for i in items)
        if rest:
            out.append(insight(
                "detection", rule.name, rule.severity,
                f"{len(rest):,} more requests on {len(ranked) - MAX_GROUPS:,} more objects",
                rest, rule=rule.name, priority=rule.priority, output="",
                source=rule.file, tags=rule.tags, filters={"detection": [rule.name]}))
    return out


# the columns of an object's first request that its insight's text and body are made from
_TOLD_COLUMNS = ("id", "resource", "namespace", "name", "body_chunk", "body_index", "request_uri",
                 *GROUP_COLUMNS[:3], "subresource", "code", "stage")
_OBJECT_COLUMNS = ("resource", "namespace", "name")

# An object: ((resource, namespace, name), the ids of its matched requests in the events
# list's order, received then id).
Object = tuple[tuple[str, str, str], list[int]]


def _objects_from_rows(incident_id: int, ids: list[int]) -> list[Object]:
    objects: dict[tuple, list[int]] = defaultdict(list)
    for event_id, *key in Event.objects.filter(incident_id=incident_id, pk__in=ids).order_by(
            "received", "id").values_list("id", *_OBJECT_COLUMNS):
        objects[tuple(key)].append(event_id)
    return list(objects.items())


class _Locator:
    """Matched requests grouped by object from a column index: its events are in the list's
    order with their ids, and each event's signature holds its object's three columns."""

    def __init__(self, index) -> None:
        self.index = index
        self.ids = np.asarray(index.id)
        self.order = np.argsort(self.ids, kind="stable")
        self.sorted_ids = self.ids[self.order]
        codes = np.stack([np.asarray(index.field(c)[1]) for c in _OBJECT_COLUMNS], axis=1)
        # one number per distinct object among the signatures
        self.objects_of, self.object_of_signature = np.unique(codes, axis=0, return_inverse=True)
        self.object_of_signature = self.object_of_signature.reshape(-1)
        self.values = [index.field(c)[0] for c in _OBJECT_COLUMNS]

    def objects(self, ids: list[int]) -> list[Object] | None:
        """The objects of ``ids``, or None if one of them is not in the index."""
        wanted = _distinct(np.asarray(ids, dtype=np.int64))
        at = np.searchsorted(self.sorted_ids, wanted)
        if len(self.sorted_ids) == 0 or at.max(initial=0) >= len(self.sorted_ids) or (
                self.sorted_ids[at] != wanted).any():
            return None
        positions = np.sort(self.order[at])  # the list's order
        objects = self.object_of_signature[np.asarray(self.index.signature)[positions]]
        ordered = np.argsort(objects, kind="stable")  # by object, the list's order within
        cuts = np.flatnonzero(np.diff(objects[ordered])) + 1
        out = []
        for group in np.split(ordered, cuts):
            codes = self.objects_of[objects[group[0]]]
            key = tuple(values[code] for values, code in zip(self.values, codes, strict=True))
            out.append((key, self.ids[positions[group]].tolist()))
        return out


def store_matches(incident_id: int, found: Matches) -> None:
    """Replace the incident's matched events (the ``detection=`` filter's), in one transaction
    that holds the incident (nothing is written for a deleted one); on PostgreSQL only the
    matches that changed (``replace_matches``)."""
    from incidents.models import writing

    from .models import DetectionMatch

    with writing(incident_id):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                replace_matches(cursor, incident_id, found.ids)
            return
        DetectionMatch.objects.filter(incident_id=incident_id)._raw_delete(
            DetectionMatch.objects.db)
        DetectionMatch.objects.bulk_create(
            (DetectionMatch(incident_id=incident_id, rule=rule, event_id=event_id)
             for rule, ids in found.ids.items() for event_id in dict.fromkeys(ids)),
            batch_size=5000)


def replace_matches(cursor, incident_id: int, matched: dict[str, list[int]]) -> None:
    """PostgreSQL: the incident's matches become ``matched`` (rule → event ids), deleting
    those that are no longer and adding those that are new; those that stay are not written
    again. The insights of a new upload find nearly every match of the last ones again, and
    writing a key back where it was just deleted checks each against its dead row (the
    355,000 matches of 500,000 requests: 3.3-3.6 s, against 0.8-1.0 s for a first COPY)."""
    from .models import DetectionMatch

    table = DetectionMatch._meta.db_table
    rules = list(matched)
    ((data,),) = packed.fetch(
        "SELECT string_agg(int8send(event_id) || int8send(r.number), ''::bytea)"
        f" FROM {table} d JOIN unnest(%s::text[]) WITH ORDINALITY AS r(rule, number)"
        " USING (rule) WHERE d.incident_id = %s", [rules, incident_id])
    # the matches of rules that are gone (a rules file removed, a rule renamed)
    cursor.execute(f"DELETE FROM {table} WHERE incident_id = %s AND NOT (rule = ANY(%s))",
                   [incident_id, rules])
    if not data:  # nothing stored of these rules: all of them are new
        copy_matches(cursor, incident_id, matched)
        return
    stored = np.frombuffer(data, dtype=">i8").reshape(-1, 2).astype(np.int64)
    # one number per match, event id then rule: the two sets compared at once
    width = len(rules) + 1
    old = stored[:, 0] * width + stored[:, 1]
    new = np.concatenate([np.empty(0, dtype=np.int64), *(
        np.asarray(matched[rule], dtype=np.int64) * width + number
        for number, rule in enumerate(rules, start=1))])
    gone = old[~_within(old, new)]
    if len(gone):
        cursor.execute(f"DELETE FROM {table} d USING unnest(%s::bigint[], %s::text[])"
                       " AS k(event_id, rule) WHERE d.incident_id = %s"
                       " AND d.event_id = k.event_id AND d.rule = k.rule",
                       [(gone // width).tolist(), [rules[n - 1] for n in (gone % width).tolist()],
                        incident_id])
    fresh = new[~_within(new, old)]
    which = fresh % width
    added = {rule: (fresh[which == number] // width).tolist()
             for number, rule in enumerate(rules, start=1)}
    copy_matches(cursor, incident_id, added)


def _distinct(values: np.ndarray) -> np.ndarray:
    """``numpy.unique(values)`` by sorting: without ``return_*``, numpy 2.4 hashes, 0.45-0.7 s
    for 355,000 distinct numbers where sorting takes 0.01 s."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def _within(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is one of ``among``, by sorting and binary search (numpy's
    set functions hash, as ``_distinct`` tells: 0.7 s for 355,000 matches, against 0.03 s)."""
    among = np.sort(among)
    at = np.minimum(np.searchsorted(among, values), max(len(among) - 1, 0))
    return (among[at] == values) if len(among) else np.zeros(len(values), dtype=bool)


COPY_ROWS = 50_000  # rows of text per write


def copy_matches(cursor, incident_id: int, matched: dict[str, list[int]]) -> None:
    """PostgreSQL: add the matches ``matched`` (rule → event ids) of the incident, in one COPY
    of text (a row at a time took 1-2 s for 355,000), in the order of the matches' key
    (incident, event, rule): each row then goes to the key's last page, where a rule after
    another went through the index once per rule (the 354,863 matches of the ingest
    benchmark's 500,000 requests: 0.70-0.74 s against 0.91-1.03 s)."""
    from .models import DetectionMatch

    rules = [rule for rule, ids in matched.items() if ids]
    if not rules:
        return
    ids = np.concatenate([np.asarray(matched[rule], dtype=np.int64) for rule in rules])
    which = np.repeat(np.arange(len(rules)), [len(matched[rule]) for rule in rules])
    order = np.lexsort((which, ids))
    ids, which = ids[order], which[order]
    once = np.ones(len(ids), dtype=bool)  # the key (incident, event, rule) holds each once
    once[1:] = (ids[1:] != ids[:-1]) | (which[1:] != which[:-1])
    ids, which = ids[once].tolist(), which[once].tolist()
    prefixes = [f"{incident_id}\t{_copy_text(rule)}\t" for rule in rules]
    with cursor.copy(f"COPY {DetectionMatch._meta.db_table} (incident_id, rule, event_id)"
                     " FROM STDIN") as copy:
        for start in range(0, len(ids), COPY_ROWS):
            copy.write("".join([f"{prefixes[rule]}{event_id}\n" for rule, event_id in zip(
                which[start:start + COPY_ROWS], ids[start:start + COPY_ROWS], strict=True)]))


def _copy_text(value: str) -> str:
    """A value in COPY's text format."""
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def detections(incident_id: int, requests: bool = True) -> list[dict]:
    """The incident's detection insights (its matches stored for the events filter). A rules
    file refused meanwhile cannot be, since only files that load are stored. ``requests``:
    False when the incident is known to hold none (nothing to evaluate; matches of an earlier
    version are removed all the same)."""
    ruleset = ruleset_for(incident_id)
    found = evaluate(incident_id, ruleset) if requests else Matches()
    store_matches(incident_id, found)
    return detection_insights(incident_id, ruleset, found)
