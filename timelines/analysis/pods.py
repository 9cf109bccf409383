"""Pod phases: when each pod of the evidence was created, scheduled, started, ready, finished and
deleted, and how long each step took. Pure functions, no Django: the rows and bodies come from
``pods_views``, which reads the store.

Evidence becomes *facts* (``Fact``: a pod, a field, a time, where it came from) and facts become
pods (``assemble``):

- **audit requests** (successful ones): ``create pods`` → created (the request's time; the name
  from the stored object when the client used ``generateName``; ``spec.nodeName`` already set, as
  for a static pod's mirror, means scheduled then too); ``create pods/binding`` → scheduled (and
  the node); ``delete pods`` and ``create pods/eviction`` → deleted (the first one: a graceful
  delete comes again when the kubelet is done);
- **status writes** (``patch``/``update pods/status``, their stored object, else the patch as
  sent): the ``PodScheduled`` and ``Ready`` conditions' ``lastTransitionTime`` when ``True`` →
  scheduled, ready; the first ``startedAt`` of any container → started; the last ``finishedAt``
  once every container has terminated → finished; ``restartCount``; an object's
  ``metadata.creationTimestamp`` → created when no create request was logged;
- **state rows** of bundles (a snapshot and its time points): ``Created``, ``DeletionRequested``,
  ``PodScheduled=True``, ``Ready=True``, container starts, the node and the restart counts, and
  finished (the last ``finishedAt`` of its terminated containers when the snapshot's phase is
  Succeeded or Failed);
- **Kubernetes Events** about the pod: ``Scheduled`` (its node from the message), ``Started``
  (first) → scheduled, started; ``Killing`` or ``Evicted`` → finished when no status says;
  Warning Events are counted; the ``SuccessfulCreate``/``SuccessfulDelete`` Events of its
  controller (``Created pod: <name>``) → created, deleted.

Where several say when the same thing happened, a request wins over a status write, which wins
over an object's metadata, which wins over an Event, which wins over a bundle's state row
(``RANK``): request times are to the microsecond on the apiserver's clock, the others to the
second (an Event's ``eventTime`` excepted); a snapshot only fills what the rest leaves out.
Among equals the earliest counts (the last for ``finished``). A name used again (a StatefulSet's
pod deleted and made anew) is a new pod when its UID differs or, without UIDs, when a second create
request comes or the pod was deleted before.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
FIELDS = ("created", "scheduled", "started", "ready", "finished", "deleted")
# Durations the page draws: name, from, to.
PHASES = (("created_to_scheduled_ms", "created", "scheduled"),
          ("scheduled_to_started_ms", "scheduled", "started"),
          ("started_to_ready_ms", "started", "ready"),
          ("created_to_ready_ms", "created", "ready"))
# Precedence of evidence for the same field, strongest first.
REQUEST, STATUS, OBJECT, EVENT, STATE = range(5)
# A second-precision time may lie up to this much before the instant it stands for.
WHOLE_SECOND_US = 1_000_000
# Controllers whose Events name the pods they create and delete.
CONTROLLERS = ("replicasets", "replicationcontrollers", "jobs", "daemonsets", "statefulsets")
CONTROLLER_REASONS = ("SuccessfulCreate", "SuccessfulDelete")
# Event reasons about a pod that give a phase (others are only counted when Warnings).
EVENT_FIELDS = {"Scheduled": "scheduled", "Started": "started", "Killing": "finished",
                "Evicted": "finished"}
_CONTROLLER_POD = re.compile(r"^(?:Created|Deleted) pod: (?P<name>[a-z0-9.-]+)"
                             r"|^(?:create|delete) Pod (?P<set>[a-z0-9.-]+) in StatefulSet ")
_ASSIGNED = re.compile(r"^Successfully assigned \S+ to (?P<node>\S+)")


class Fact(NamedTuple):
    """Something the evidence says about one pod: ``field`` (one of ``FIELDS``; ``node``,
    ``restarts``, ``warnings`` with ``value``; ``seen``: only that it exists) at ``at`` (µs
    since the epoch), from ``source`` (e.g. "audit binding", "event Scheduled"), of strength
    ``rank``; ``uid`` when known."""

    namespace: str
    name: str
    uid: str
    field: str
    at: int
    rank: int
    source: str
    value: Any = None


def microseconds(moment: datetime) -> int:
    since = moment - EPOCH  # its parts, not ``// timedelta(microseconds=1)``: twice as quick
    return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds


def rfc3339(micros: int | None) -> str | None:
    """As ``moment(micros).isoformat()`` with ``Z`` for ``+00:00`` (no fraction when whole)."""
    if micros is None:
        return None
    seconds, fraction = divmod(micros, 1_000_000)
    whole = _whole_second(seconds)
    return f"{whole}.{fraction:06d}Z" if fraction else f"{whole}Z"


@functools.lru_cache(maxsize=65_536)  # a pod's times share seconds, pods their whole seconds
def _whole_second(seconds: int) -> str:
    return (_NAIVE_EPOCH + timedelta(seconds=seconds)).isoformat()


def parse_time(value: Any) -> int | None:
    """µs since the epoch of an RFC 3339 string; None when absent or unreadable (a status body
    holds what its writer sent: a bad time costs the fact, not the pod)."""
    if not isinstance(value, str) or not value:
        return None
    return _parse_text_time(value)


@functools.lru_cache(maxsize=65_536)  # a pod's status writes repeat the same few times
def _parse_text_time(value: str) -> int | None:
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if parsed.year <= 1:
        return None
    return microseconds(parsed)


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --- audit requests ---------------------------------------------------------------------------

def wants_body(verb: str, subresource: str) -> bool:
    """Whether a successful request on pods says more with its stored body than its columns:
    the name of a generated pod, UIDs, nodes and every status write."""
    return (verb == "create" and subresource in ("", "binding")) or (
        verb == "delete" and subresource == "") or (
        verb in ("patch", "update") and subresource == "status")


def facts_of_request(verb: str, subresource: str, namespace: str, name: str, uid: str,
                     received: int, body: dict | None) -> list[Fact]:
    """The facts of one successful (2xx) audit request on ``pods`` at ``received`` (µs):
    ``body`` is the stored audit event, or None (Metadata level, no body stored)."""
    body = _mapping(body)
    response = _mapping(body.get("responseObject"))
    request = _mapping(body.get("requestObject"))
    # the stored Pod: the answer when it is one (not a Status), else what was sent
    pod = response if response.get("kind") == "Pod" else request
    meta = _mapping(pod.get("metadata"))
    name = name or _text(meta.get("name"))
    namespace = namespace or _text(meta.get("namespace"))
    if not name:
        return []  # a generated name that no stored body tells
    uid = uid or _text(meta.get("uid"))
    facts: list[Fact] = []

    def add(field: str, at: int | None, rank: int, source: str, value: Any = None) -> None:
        if at is not None:
            facts.append(Fact(namespace, name, uid, field, at, rank, source, value))

    if verb == "create" and subresource == "":
        add("created", received, REQUEST, "audit create")
        node = _text(_mapping(pod.get("spec")).get("nodeName"))
        if node:  # bound at creation (a static pod's mirror, a pod made for a node)
            add("scheduled", received, REQUEST, "audit create with spec.nodeName")
            add("node", received, REQUEST, "audit create", node)
    elif verb == "create" and subresource == "binding":
        # the Binding names the pod and, as the scheduler writes it, its UID
        uid = uid or _text(_mapping(request.get("metadata")).get("uid"))
        add("scheduled", received, REQUEST, "audit binding")
        node = _text(_mapping(request.get("target")).get("name"))
        if node:
            add("node", received, REQUEST, "audit binding", node)
    elif verb == "create" and subresource == "eviction":
        add("deleted", received, REQUEST, "audit eviction")
    elif verb == "delete" and subresource == "":
        add("deleted", received, REQUEST, "audit delete")
    elif subresource == "status":
        facts.extend(_status_facts(namespace, name, uid, pod, received))
    if verb != "create" or subresource != "":
        # an object's own creation time when its create request was not logged
        add("created", parse_time(meta.get("creationTimestamp")), OBJECT,
            "object creationTimestamp")
    return facts


def _status_facts(namespace: str, name: str, uid: str, pod: dict,
                  received: int) -> Iterator[Fact]:
    status = _mapping(pod.get("status"))
    for condition in _list(status.get("conditions")):
        condition = _mapping(condition)
        if condition.get("status") != "True":
            continue
        at = parse_time(condition.get("lastTransitionTime"))
        kind = condition.get("type")
        if at is not None and kind in ("PodScheduled", "Ready"):
            yield Fact(namespace, name, uid, "scheduled" if kind == "PodScheduled" else "ready",
                       at, STATUS, f"status {kind}")
    containers = _list(status.get("containerStatuses"))
    finished: list[int | None] = []
    for statuses in (_list(status.get("initContainerStatuses")), containers):
        for container in statuses:
            container = _mapping(container)
            for state in (_mapping(container.get("state")),
                          _mapping(container.get("lastState"))):
                for phase in ("running", "terminated"):
                    at = parse_time(_mapping(state.get(phase)).get("startedAt"))
                    if at is not None:
                        yield Fact(namespace, name, uid, "started", at, STATUS,
                                   "status containerStatuses")
    for container in containers:
        container = _mapping(container)
        terminated = _mapping(_mapping(container.get("state")).get("terminated"))
        finished.append(parse_time(terminated.get("finishedAt")) if terminated else None)
        restarts = container.get("restartCount")
        if isinstance(restarts, int) and not isinstance(restarts, bool):
            yield Fact(namespace, name, uid, "restarts", received, STATUS,
                       "status containerStatuses", restarts)
    if finished and all(at is not None for at in finished):
        yield Fact(namespace, name, uid, "finished", max(finished), STATUS,
                   "status containerStatuses")


# --- Kubernetes Events ------------------------------------------------------------------------

def controller_pod(message: str) -> str:
    """The pod a controller's SuccessfulCreate/SuccessfulDelete Event names, or ""."""
    match = _CONTROLLER_POD.match(message)
    if match is None:
        return ""
    return match.group("name") or match.group("set")


def facts_of_event(resource: str, reason: str, severity: str, namespace: str, name: str,
                   uid: str, first: int, count: int | None, message: str) -> list[Fact]:
    """The facts of one Kubernetes Event first seen at ``first`` (µs): one about a pod
    (``resource`` pods), or a controller's about a pod it created or deleted."""
    if resource != "pods":
        pod = controller_pod(message) if reason in CONTROLLER_REASONS else ""
        if not pod:
            return []
        field = "created" if reason == "SuccessfulCreate" else "deleted"
        return [Fact(namespace, pod, "", field, first, EVENT, f"event {reason}")]
    # any Event about a pod lists it, whether or not it gives a phase (SandboxChanged, …)
    facts = [Fact(namespace, name, uid, EVENT_FIELDS.get(reason, "seen"), first, EVENT,
                  f"event {reason}")]
    if reason == "Scheduled":
        match = _ASSIGNED.match(message)
        if match:
            facts.append(Fact(namespace, name, uid, "node", first, EVENT, "event Scheduled",
                              match.group("node")))
    if severity == "Warning":
        facts.append(Fact(namespace, name, uid, "warnings", first, EVENT, f"event {reason}",
                          count or 1))
    return facts


# --- state rows of bundles (kind "state") -----------------------------------------------------

# A pod's state rows (``timelines.parsers.events.state``) → field; the container rows give
# ``started`` (a terminated one's row begins at its startedAt) and the restart count. They rank
# last (``STATE``): a snapshot speaks only where Events and requests are silent.
STATE_FIELDS = {"Created": "created", "DeletionRequested": "deleted",
                "PodScheduled=True": "scheduled", "Ready=True": "ready",
                "ContainerStarted": "started", "ContainerTerminated": "started"}
# A pod's phases after which no container runs again: its containers' last end is *finished*.
DONE_PHASES = ("Succeeded", "Failed")


def facts_of_state(reason: str, namespace: str, name: str, uid: str, at: int,
                   count: int | None, node: str, *, completed: int | None = None,
                   message: str = "") -> list[Fact]:
    """The facts of one state row about a pod at ``at`` (µs): what its snapshot in a bundle
    says, which counts where no Event or request says it (rank ``STATE``). A terminated
    container's end (``completed``) and a snapshot's phase (its ``message``) Succeeded or Failed
    give *finished*: the last end of its containers, once the pod is done (``Pod.take``)."""
    facts = [Fact(namespace, name, uid, STATE_FIELDS.get(reason, "seen"), at, STATE,
                  f"state {reason}")]
    if node and reason == "Snapshot":
        facts.append(Fact(namespace, name, uid, "node", at, STATE, "state Snapshot", node))
    if reason == "Snapshot" and message in DONE_PHASES:
        facts.append(Fact(namespace, name, uid, "done", at, STATE, "state Snapshot", message))
    if reason == "ContainerTerminated" and completed is not None:
        facts.append(Fact(namespace, name, uid, "terminated", completed, STATE,
                          "state ContainerTerminated"))
    if count is not None and reason.startswith("Container"):
        facts.append(Fact(namespace, name, uid, "restarts", at, STATE, f"state {reason}",
                          count))
    return facts


# --- facts into pods --------------------------------------------------------------------------

@dataclass
class Pod:
    namespace: str
    name: str
    uid: str = ""
    # field → (rank, at, source) of the evidence chosen so far
    times: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    node: str = ""
    node_rank: int = STATE + 1
    restarts: int | None = None
    warnings: int = 0
    create_requests: set[int] = field(default_factory=set)
    seen: int | None = None  # the first time any evidence is about it
    # from state rows: the last end of a terminated container, and whether a snapshot shows
    # the pod Succeeded or Failed (then that end is when it finished)
    last_end: int | None = None
    done: bool = False

    def at(self, name: str) -> int | None:
        chosen = self.times.get(name)
        return chosen[1] if chosen else None

    def take(self, fact: Fact) -> None:
        if fact.uid and not self.uid:
            self.uid = fact.uid
        self.seen = fact.at if self.seen is None else min(self.seen, fact.at)
        if fact.field == "seen":
            return
        if fact.field == "node":
            if fact.rank < self.node_rank:
                self.node, self.node_rank = fact.value, fact.rank
            return
        if fact.field == "restarts":
            self.restarts = max(self.restarts or 0, fact.value)
            return
        if fact.field == "warnings":
            self.warnings += fact.value
            return
        if fact.field in ("terminated", "done"):
            if fact.field == "done":
                self.done = True
            else:
                self.last_end = max(self.last_end or fact.at, fact.at)
            if self.done and self.last_end is not None:
                self.take(Fact(self.namespace, self.name, self.uid, "finished", self.last_end,
                               STATE, "state ContainerTerminated"))
            return
        if fact.field == "created" and fact.rank == REQUEST:
            self.create_requests.add(fact.at)
        chosen = self.times.get(fact.field)
        if chosen is None or fact.rank < chosen[0] or fact.rank == chosen[0] and (
                fact.at > chosen[1] if fact.field == "finished" else fact.at < chosen[1]):
            self.times[fact.field] = (fact.rank, fact.at, fact.source)

    def first_seen(self) -> int:
        return self.seen or 0

    def as_json(self) -> dict:
        answer: dict[str, Any] = {"namespace": self.namespace, "name": self.name,
                                  "uid": self.uid or None, "node": self.node or None}
        for name in FIELDS:
            answer[name] = rfc3339(self.at(name))
        for name, start, end in PHASES:
            answer[name] = duration_ms(self.times.get(start), self.times.get(end))
        answer["restarts"] = self.restarts
        answer["warnings"] = self.warnings
        answer["sources"] = {name: self.times[name][2] for name in FIELDS if name in self.times}
        return answer


def duration_ms(start: tuple[int, int, str] | None,
                end: tuple[int, int, str] | None) -> float | None:
    """Milliseconds from one chosen time to another. Times from status writes and most Events
    are whole seconds: an end less than a second before its start is the same instant seen at
    two precisions, so 0; more than that is reported as it is (clocks differ)."""
    if start is None or end is None:
        return None
    micros = end[1] - start[1]
    if -WHOLE_SECOND_US < micros < 0 and (end[0] != REQUEST or start[0] != REQUEST):
        micros = 0
    return micros / 1000


# The order facts of the same instant are taken in: a pod's own story.
ORDER = {name: i for i, name in enumerate(("created", "seen", "node", "scheduled", "started",
                                            "ready", "restarts", "warnings", "terminated", "done",
                                            "finished", "deleted"))}


def assemble(facts: Iterable[Fact]) -> list[Pod]:
    """The pods the facts describe, in order of their first known time (then namespace, name).

    Facts of one namespace/name are taken in time order. One with a UID joins the pod of that
    UID, else the latest pod if it has none yet, else starts a new pod; one without joins the
    latest pod, except that a create request when the latest pod already has one (at another
    time), or a created or scheduled fact after the latest pod's deletion, starts a new pod."""
    by_object: dict[tuple[str, str], list[Fact]] = {}
    for fact in facts:
        by_object.setdefault((fact.namespace, fact.name), []).append(fact)
    pods: list[Pod] = []
    for (namespace, name), object_facts in by_object.items():
        object_facts.sort(key=lambda f: (f.at, ORDER[f.field], f.rank))
        lives: list[Pod] = []
        by_uid: dict[str, Pod] = {}
        for fact in object_facts:
            latest = lives[-1] if lives else None
            pod = None
            if fact.uid:
                pod = by_uid.get(fact.uid)
                if pod is None and latest is not None and not latest.uid and not _starts_anew(
                        latest, fact):
                    pod = latest
            elif latest is not None and not _starts_anew(latest, fact):
                pod = latest
            if pod is None:
                pod = Pod(namespace, name)
                lives.append(pod)
            pod.take(fact)
            if pod.uid:
                by_uid[pod.uid] = pod
        pods.extend(lives)
    pods.sort(key=lambda p: (p.first_seen(), p.namespace, p.name))
    return pods


def _starts_anew(pod: Pod, fact: Fact) -> bool:
    if fact.field == "created" and fact.rank == REQUEST and pod.create_requests and (
            fact.at not in pod.create_requests):
        return True
    deleted = pod.times.get("deleted")
    return deleted is not None and fact.field in ("created", "scheduled") and (
        fact.at > deleted[1] + (WHOLE_SECOND_US if fact.rank != REQUEST else 0))
