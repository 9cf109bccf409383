"""A problem of one owner, gathered from any evidence (Kubernetes Events, log lines, object
state): ``Problems`` keys them by kind and owner, so that one problem is one finding, rolled up
to what the pods belong to (``owner_of``). Filled by ``findings`` (Events, logs) and ``states``
(state rows), which both import this module.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

LOG_SLACK = timedelta(seconds=60)  # log lines this close to a container's termination
# the pod-template-hash and generated-name suffixes use this alphabet (k8s.io/apimachinery rand)
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_REPLICA_POD = re.compile(rf"^(.+)-{_SAFE}{{6,10}}-{_SAFE}{{5}}$")
_GENERATED_POD = re.compile(rf"^(.+)-{_SAFE}{{5}}$")
_STATEFUL_POD = re.compile(r"^(.+)-\d+$")
_SHAPE = re.compile(r"\"[^\"]*\"|\b[0-9a-f]{8}-[0-9a-f-]{27}\b|\b0x[0-9a-f]+\b|"
                    r"\b\d[\d.]*\b|\b[0-9a-f]{16,}\b", re.I)


def owner_of(resource: str, namespace: str, name: str) -> tuple[str, str, str]:
    """(resource, namespace, name) of what a pod belongs to, told by its generated name:
    ``web-7d9f8c6b5d-x2x4z`` → Deployment ``web``; ``db-0`` → StatefulSet ``db``;
    ``dns-default-2pf64`` → ``("pods", ns, "dns-default-*")`` (a DaemonSet or Job: the name does
    not say); anything else is its own owner."""
    if resource != "pods" or not name:
        return resource, namespace, name
    match = _REPLICA_POD.match(name)
    if match:
        return "deployments", namespace, match.group(1)
    match = _GENERATED_POD.match(name)
    if match and any(c.isdigit() for c in name[-5:]):
        return "pods", namespace, match.group(1) + "-*"
    match = _STATEFUL_POD.match(name)
    if match and not name.startswith(("installer-", "revision-pruner-")):
        return "statefulsets", namespace, match.group(1)
    return resource, namespace, name


def label(resource: str, namespace: str, name: str) -> str:
    return f"{resource}/{namespace + '/' if namespace else ''}{name}"


def message_shape(message: str) -> str:
    """A message with its variable parts (quoted strings, numbers, addresses, ids) as ``…``."""
    return _SHAPE.sub("…", message.split("\n", 1)[0])[:160]


@dataclass
class Problem:
    """The facts of one problem of one owner, from any evidence."""

    kind: str
    owner: tuple[str, str, str]
    severity: str = ""
    objects: dict[tuple[str, str, str], None] = field(default_factory=dict)
    ids: list[tuple[datetime, int]] = field(default_factory=list)
    count: int = 0  # occurrences (an Event's count, a line, a termination)
    start: datetime | None = None
    end: datetime | None = None
    reasons: Counter = field(default_factory=Counter)  # Event reasons, causes, exit codes
    messages: Counter = field(default_factory=Counter)  # message shapes
    facts: list[dict] = field(default_factory=list)  # terminations, conditions…
    sources: set[str] = field(default_factory=set)  # event, log, state
    notes: list[str] = field(default_factory=list)
    containers: dict[tuple[str, str], None] = field(default_factory=dict)  # (pod, container)

    def add(self, row: dict, *, count: int = 1, reason: str = "", severity: str = "") -> None:
        self.objects[(row["resource"], row["namespace"], row["name"])] = None
        self.ids.append((row["received"], row["id"]))
        self.count += count
        end = row.get("completed") or row["received"]
        self.start = row["received"] if self.start is None else min(self.start, row["received"])
        self.end = end if self.end is None else max(self.end, end)
        if reason:
            self.reasons[reason] += count
        if row.get("message"):
            self.messages[message_shape(row["message"])] += count
        self.sources.add(row["kind"])
        if severity and (not self.severity or SEVERITIES_RANK[severity]
                         < SEVERITIES_RANK[self.severity]):
            self.severity = severity


SEVERITIES_RANK = {"critical": 0, "warning": 1, "info": 2}


class Problems(dict):
    """Problems by (kind, owner)."""

    def of(self, kind: str, resource: str, namespace: str, name: str) -> Problem:
        owner = owner_of(resource, namespace, name)
        key = (kind, owner)
        if key not in self:
            self[key] = Problem(kind, owner)
        return self[key]
