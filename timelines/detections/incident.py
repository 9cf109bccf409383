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

from django.db import connection

from ..analysis.insights import insight, read_bodies
from ..models import Event
from . import rules as rules_module
from .condition import POSITIVE_TIME, UNKNOWN, View
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
        value = self.columns[column]
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
    if columns["code"] is not None:
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


@dataclass
class Matches:
    """What the rules matched: rule name → event ids, and the body of each rule's first
    matching requests per object (for the output)."""

    ids: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    bodies_read: int = 0
    groups: int = 0
    seconds: float = 0.0


def groups_of(incident_id: int) -> list[tuple[dict, list[int]]]:
    """(columns, event ids) of the incident's requests grouped by GROUP_COLUMNS."""
    requests = Event.objects.filter(incident_id=incident_id, kind=Event.Kind.AUDIT).order_by()
    if connection.vendor == "postgresql":
        from django.contrib.postgres.aggregates import ArrayAgg

        return [({c: row[c] for c in GROUP_COLUMNS}, row["ids"]) for row in requests.values(
            *GROUP_COLUMNS).annotate(ids=ArrayAgg("id"))]
    grouped: dict[tuple, list[int]] = defaultdict(list)
    for row in requests.values_list(*GROUP_COLUMNS, "id").iterator(chunk_size=10_000):
        grouped[row[:-1]].append(row[-1])
    return [(dict(zip(GROUP_COLUMNS, key, strict=True)), ids) for key, ids in grouped.items()]


def evaluate(incident_id: int, ruleset: RuleSet) -> Matches:
    started = time.perf_counter()
    active = ruleset.active
    found = Matches()
    pending: dict[int, list[Rule]] = {}  # event id → rules its body must decide
    groups = groups_of(incident_id)
    found.groups = len(groups)
    for columns, ids in groups:
        views = column_stages(columns)
        undecided = []
        for rule in active:
            verdict = decide(rule, views)
            if verdict is True:
                found.ids[rule.name] += ids
            elif verdict is None:
                undecided.append(rule)
        if undecided:
            for event_id in ids:
                pending[event_id] = undecided
    pending_ids = sorted(pending)
    for start in range(0, len(pending_ids), BODY_BATCH):
        batch = pending_ids[start:start + BODY_BATCH]
        rows = list(Event.objects.filter(incident_id=incident_id, pk__in=batch).values(
            "id", "body_chunk", "body_index", "request_uri", *GROUP_COLUMNS))
        bodies = read_bodies(rows)
        found.bodies_read += len(bodies)
        for row in rows:
            body = bodies.get(row["id"]) or body_from_columns(row)
            stages = stages_of(body)
            views = [View(s) for s in stages]
            for rule in pending[row["id"]]:
                if decide(rule, views):
                    found.ids[rule.name].append(row["id"])
    found.seconds = time.perf_counter() - started
    return found


def ruleset_for(incident_id: int) -> RuleSet:
    """The shipped rules, then the added rules files of the instance and of the incident's
    team, in the order they were added."""
    from django.db.models import Q

    from incidents.models import Incident

    from .models import RulesFile

    team_id = Incident.objects.filter(pk=incident_id).values_list("team_id", flat=True).first()
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
    """Replace the incident's matched events (the ``detection=`` filter's)."""
    from .models import DetectionEvent

    DetectionEvent.objects.filter(incident_id=incident_id)._raw_delete(DetectionEvent.objects.db)
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
