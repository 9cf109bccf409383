"""The rules evaluated over one incident's stored requests, and the detections they make.

Reading every body for every rule would cost seconds per hundred thousand requests, so each
rule is first decided on the indexed columns alone: the requests are grouped by the columns the
rules can read without a body (verb, user, object, code, stage: one GROUP BY), and each rule's
compiled condition is evaluated once per group in three-valued logic (``condition.UNKNOWN`` for
a field only the body holds). A group where the rule is false (most: ``kevt and pod and
kcreate`` rules out every get, list and watch) costs nothing more; true, every request of it
matches; unknown, only those requests' bodies are read, once, for all such rules.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import orjson
from django.db import connection

from ..analysis.common import insight, read_bodies
from ..models import BodyChunk, Event
from . import rules as rules_module
from .condition import POSITIVE_TIME, UNKNOWN, RawLine, View
from .engine import stages_of
from .rules import Rule, RuleSet, render_output

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
    bodies_skipped: int = 0  # read, and ruled out on the raw line without parsing it
    groups: int = 0
    from_index: bool = False
    column_seconds: float = 0.0  # deciding on the columns, before any body is read
    seconds: float = 0.0


def groups_of(incident_id: int, event_ids=None) -> list[tuple[dict, list[int]]]:
    """(columns, event ids) of the incident's requests (only ``event_ids`` when given) grouped
    by GROUP_COLUMNS."""
    requests = Event.objects.filter(incident_id=incident_id, kind=Event.Kind.AUDIT).order_by()
    if event_ids is not None:
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
    from ..store.aggregate import data_version

    version = data_version(incident_id)
    return columns.load(incident_id, version) if version is not None else None


def _decide_groups(incident_id: int, verdicts: Verdicts, found: Matches,
                   event_ids=None) -> dict[int, list[Rule]]:
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
    import numpy as np

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


class RawView(View):
    """A stored request before its body is parsed: every field is its raw line
    (``condition.RawLine``), which rules out the rules needing a literal the line lacks."""

    __slots__ = ("raw",)

    def __init__(self, line: bytes):
        super().__init__({})
        self.raw = RawLine(line)

    def get(self, text, extract):
        return self.raw


def read_lines(rows) -> dict[int, bytes]:
    """The stored (redacted) audit line of each of ``rows`` (``id``, ``body_chunk``,
    ``body_index``) by event id, each chunk read once."""
    wanted: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        if row.get("body_chunk") is not None:
            wanted[row["body_chunk"]].append((row["id"], row["body_index"]))
    out: dict[int, bytes] = {}
    chunk_ids = sorted(wanted)
    for start in range(0, len(chunk_ids), 200):
        for chunk in BodyChunk.objects.filter(pk__in=chunk_ids[start:start + 200]).only("data"):
            chunk_lines = chunk.lines()
            for event_id, index in wanted[chunk.pk]:
                if index < len(chunk_lines):
                    out[event_id] = chunk_lines[index]
    return out


STAGES = ("ResponseComplete", "ResponseStarted", "RequestReceived", "Panic")


def possible_stages(rule: Rule) -> frozenset[str]:
    """The stages on which a rule can match at all, whatever the rest of the request (``kevt``
    rules: ResponseComplete only), so that a body is not tried as the stages it cannot match."""
    return frozenset(stage for stage in STAGES
                     if rule.test(ColumnView({"stage": stage})) is not False)


def evaluate(incident_id: int, ruleset: RuleSet, event_ids=None) -> Matches:
    """The rules over the incident's requests, or only those of ``event_ids`` (a stream's
    batch: ``streams.detect``)."""
    started = time.perf_counter()
    found = Matches()
    pending = _decide_groups(incident_id, Verdicts(ruleset.active), found, event_ids)
    found.column_seconds = time.perf_counter() - started
    stages_for = {rule.name: possible_stages(rule) for rule in ruleset.active}
    pending_ids = sorted(pending)
    for start in range(0, len(pending_ids), BODY_BATCH):
        batch = pending_ids[start:start + BODY_BATCH]
        rows = list(Event.objects.filter(incident_id=incident_id, pk__in=batch).values(
            "id", "body_chunk", "body_index"))
        lines = read_lines(rows)
        missing = [row["id"] for row in rows if row["id"] not in lines]
        columns_of = {}
        if missing:  # a request stored without its body: what its columns say
            for row in Event.objects.filter(incident_id=incident_id, pk__in=missing).values(
                    "id", "request_uri", *GROUP_COLUMNS):
                columns_of[row["id"]] = body_from_columns(row)
        for row in rows:
            pending_rules = pending[row["id"]]
            line = lines.get(row["id"])
            body = columns_of.get(row["id"])
            if line is not None:
                raw = RawView(line)
                pending_rules = [r for r in pending_rules if r.test(raw) is not False]
                if not pending_rules:
                    found.bodies_skipped += 1
                    continue
                try:
                    body = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                found.bodies_read += 1
            if body is None:
                continue
            wanted = frozenset().union(*(stages_for[r.name] for r in pending_rules))
            views = [(s["stage"], View(s)) for s in stages_of(body)
                     if s.get("stage") in wanted or s.get("stage") not in STAGES]
            for rule in pending_rules:
                can = stages_for[rule.name]
                if decide(rule, [v for stage, v in views if stage in can or stage not in STAGES]):
                    found.ids[rule.name].append(row["id"])
    found.seconds = time.perf_counter() - started
    return found


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
    requests first (MAX_GROUPS per rule, the rest in one more insight)."""
    out = []
    for rule in ruleset.active:
        ids = found.ids.get(rule.name)
        if not ids:
            continue
        rows = list(Event.objects.filter(incident_id=incident_id, pk__in=ids).order_by(
            "received", "id").values("id", "resource", "namespace", "name", "body_chunk",
                                     "body_index", "request_uri", *GROUP_COLUMNS[:3],
                                     "subresource", "code", "stage"))
        objects: dict[tuple, list[dict]] = defaultdict(list)
        for row in rows:
            objects[(row["resource"], row["namespace"], row["name"])].append(row)
        ranked = sorted(objects.items(), key=lambda kv: (-len(kv[1]), kv[1][0]["id"]))
        shown = ranked[:MAX_GROUPS]
        bodies = read_bodies([items[0] for _, items in shown])
        for (resource, namespace, name), items in shown:
            first = items[0]
            body = bodies.get(first["id"]) or body_from_columns(first)
            stage = next((s for s in stages_of(body) if rule.test(View(s)) is True), body)
            output = render_output(rule, stage)
            out.append(insight(
                "detection", rule.name, rule.severity, output, [r["id"] for r in items],
                rule=rule.name, priority=rule.priority, output=output, source=rule.file,
                tags=rule.tags, resource=resource, namespace=namespace, name=name,
                filters={"detection": [rule.name]}))
        rest = [r for _, items in ranked[MAX_GROUPS:] for r in items]
        if rest:
            rest.sort(key=lambda r: (r["id"]))
            out.append(insight(
                "detection", rule.name, rule.severity,
                f"{len(rest):,} more requests on {len(ranked) - MAX_GROUPS:,} more objects",
                [r["id"] for r in rest], rule=rule.name, priority=rule.priority, output="",
                source=rule.file, tags=rule.tags, filters={"detection": [rule.name]}))
    return out


def store_matches(incident_id: int, found: Matches) -> None:
    """Replace the incident's matched events (the ``detection=`` filter's), in one transaction
    that holds the incident (nothing is written for a deleted one); COPY on PostgreSQL."""
    from incidents.models import writing

    from .models import DetectionEvent

    with writing(incident_id):
        DetectionEvent.objects.filter(incident_id=incident_id)._raw_delete(
            DetectionEvent.objects.db)
        if connection.vendor == "postgresql":
            table = DetectionEvent._meta.db_table
            with connection.cursor() as cursor, cursor.copy(
                    f"COPY {table} (incident_id, rule, event_id) FROM STDIN") as copy:
                for rule, ids in found.ids.items():
                    for event_id in ids:
                        copy.write_row((incident_id, rule, event_id))
        else:
            DetectionEvent.objects.bulk_create(
                (DetectionEvent(incident_id=incident_id, rule=rule, event_id=event_id)
                 for rule, ids in found.ids.items() for event_id in ids), batch_size=5000)


def detections(incident_id: int) -> list[dict]:
    """The incident's detection insights (its matches stored for the events filter). A rules
    file refused meanwhile cannot be, since only files that load are stored."""
    ruleset = ruleset_for(incident_id)
    found = evaluate(incident_id, ruleset)
    store_matches(incident_id, found)
    return detection_insights(incident_id, ruleset, found)
