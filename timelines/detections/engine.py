"""Rules evaluated over audit events: Falco evaluates each audit line (one stage of a request);
Hindsight stores requests, so a rule matches a request when one of the stages it reached
would match, and a request is counted once.

``stages_of`` gives the stages a stored request reached as far as its evidence tells: the
stored (last) stage with its body, ``ResponseStarted`` before a ``ResponseComplete`` of a
long-running request (a watch, or a 101 Switching Protocols upgrade: exec, attach,
port-forward), and ``RequestReceived`` (the same request without its response). A stage the
apiserver logged but whose line was not the one kept differs from the kept one only in
``stage``, ``stageTimestamp`` and the response, which is what these stand-ins change.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from .condition import View
from .rules import Rule, RuleSet, render_output

STAGE_ORDER = ("RequestReceived", "ResponseStarted", "ResponseComplete", "Panic")
NOT_AUDIT = "data not recognized as a k8s audit event"


def stages_of(event: dict, only: Container[str] | None = None) -> list[dict]:
    """The stages the request of ``event`` (its last stored stage) reached, last first; with
    ``only``, just those of these stages (and the stored one if its stage is not a known one),
    without copying the event for the others."""
    stage = event.get("stage")
    out = [event] if only is None or stage in only or stage not in STAGE_ORDER else []
    if stage in ("ResponseComplete", "Panic") and (only is None or "ResponseStarted" in only):
        code = (event.get("responseStatus") or {}).get("code")
        long_running = code == 101 or event.get("verb") == "watch"
        if long_running:
            out.append({**event, "stage": "ResponseStarted"})
    if stage != "RequestReceived" and (only is None or "RequestReceived" in only):
        earlier = {k: v for k, v in event.items()
                   if k not in ("responseStatus", "responseObject")}
        earlier["stage"] = "RequestReceived"
        earlier["stageTimestamp"] = event.get("requestReceivedTimestamp",
                                              event.get("stageTimestamp"))
        out.append(earlier)
    return out


@dataclass
class Detection:
    rule: Rule
    event: dict  # the stage that matched
    output: str


def matches(rule: Rule, stages: list[dict], views: list[View] | None = None) -> dict | None:
    """The first of ``stages`` on which ``rule`` matches, or None."""
    for index, stage in enumerate(stages):
        view = views[index] if views is not None else View(stage)
        if rule.test(view) is True:
            return stage
    return None


def requests_of(lines: Iterable[dict]) -> list[list[dict]]:
    """Audit lines grouped by request (auditID, else each line its own), in first-seen order,
    each request's stages in stage order, the last first (as ``stages_of``)."""
    grouped: dict[object, list[dict]] = {}
    for number, line in enumerate(lines):
        key = line.get("auditID") or ("line", number)
        grouped.setdefault(key, []).append(line)
    out = []
    for stages in grouped.values():
        stages.sort(key=lambda s: -STAGE_ORDER.index(s["stage"])
                    if s.get("stage") in STAGE_ORDER else 0)
        out.append(stages)
    return out


def evaluate_requests(ruleset: RuleSet, requests: Iterable[list[dict]]) -> Iterator[Detection]:
    """One detection per rule and request whose stages (as given) one matches."""
    active = ruleset.active
    for stages in requests:
        views = [View(stage) for stage in stages]
        for rule in active:
            stage = matches(rule, stages, views)
            if stage is not None:
                yield Detection(rule, stage, render_output(rule, stage))


def evaluate_lines(ruleset: RuleSet, lines: Iterable[dict]) -> list[Detection]:
    """Falco's own semantics over audit lines, each request counted once."""
    return list(evaluate_requests(ruleset, requests_of(lines)))


def read_trace(path: Path) -> tuple[list[dict], list[str]]:
    """The audit events of a trace file (one JSON object, an EventList, or JSON lines) and the
    errors of what is not one, each naming the file and line."""
    text = path.read_text()
    try:
        whole = orjson.loads(text)
        documents = [(1, whole)]
    except orjson.JSONDecodeError:
        documents = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    documents.append((number, orjson.loads(line)))
                except orjson.JSONDecodeError as exc:
                    documents.append((number, exc))
    events, errors = [], []
    for number, document in documents:
        if isinstance(document, Exception):
            errors.append(f"{path.name}:{number}: not JSON: {document}")
            continue
        items = document.get("items") if isinstance(document, dict) and document.get(
            "kind") == "EventList" else [document]
        for item in items or []:
            if isinstance(item, dict) and item.get("kind") == "Event" and isinstance(
                    item.get("stage"), str):
                events.append(item)
            else:
                errors.append(f"{path.name}:{number}: {NOT_AUDIT}")
    return events, errors
