"""Findings from object state: the ``state`` rows that object snapshots in bundles become
(their layout: the state-row contract, README "Object snapshots"). Containers that crashed
(also in pods healthy at capture) and OOM kills from ``lastState``/``state.terminated``,
containers waiting in CrashLoopBackOff or on their image, pods that cannot be scheduled or are
stuck terminating, nodes NotReady or under pressure, ClusterOperators not Available, Degraded or
Progressing, ClusterVersion upgrades, and workloads below their desired replicas.

A condition row is the condition as the object's snapshot holds it: in force at capture since
its ``received`` (the lastTransitionTime). Where several snapshots hold one condition, the
latest says.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import Q, QuerySet

from incidents.notes import format_time

from .common import MAX_BODIES, MAX_LISTED, insight, plural, read_bodies, rfc3339
from .problems import LOG_SLACK, Problems, owner_of
from .statelinks import folded_rows

WORKLOADS = ("deployments", "statefulsets", "daemonsets", "replicasets")
# node conditions of the kubelet: the status that is trouble, and how bad
NODE_TROUBLE = {"Ready": (("False", "Unknown"), "critical"),
                "MemoryPressure": (("True", "Unknown"), "warning"),
                "DiskPressure": (("True", "Unknown"), "warning"),
                "PIDPressure": (("True", "Unknown"), "warning"),
                "NetworkUnavailable": (("True",), "warning")}
OPERATOR_TROUBLE = {"Available": (("False", "Unknown"), "critical"),
                    "Degraded": (("True",), "warning"),
                    "Progressing": (("True",), "info"),
                    "Upgradeable": (("False",), "info")}
WORKLOAD_TROUBLE = {"Available": (("False",), "warning"),
                    "Progressing": (("False",), "warning"),
                    "ReplicaFailure": (("True",), "warning")}
# Events on a node that say its trouble was planned: a drain, a machine-config update, a reboot
PLANNED_REASONS = ("NodeNotSchedulable", "Drain", "Cordon", "Reboot", "Rebooted",
                   "OSUpdateStarted", "OSUpdateStaged", "PendingConfig", "NodeSchedulable",
                   "Uncordon")
WAITING_KINDS = {"CrashLoopBackOff": "container-restarts", "ImagePullBackOff": "image-pull",
                 "ErrImagePull": "image-pull", "InvalidImageName": "image-pull",
                 "CreateContainerConfigError": "stuck-pending",
                 "CreateContainerError": "stuck-pending"}
LINKED_LINES = 20  # log lines linked to one termination (or problem)
MAX_LOG_LINES = 50_000  # log lines read to link them (those of each container, in time)
_FIELDS = ("id", "kind", "received", "completed", "reason", "message", "resource", "namespace",
           "name", "code", "count", "node", "component", "annotations", "severity", "source")


def state_rows(events: QuerySet, kinds: set[str] | None = None) -> list[dict]:
    """The state rows that may show trouble: Warning ones, every condition of nodes,
    ClusterOperators, workloads and pods' PodScheduled and Ready, containers' terminations and
    restarts, ClusterVersion history. ``kinds``: the kinds of the events, when known (no state
    rows: none read; no requests: no fact folded into one)."""
    if kinds is None:
        kinds = {"state", "audit"}
    conditions = Q(reason__contains="=") & (
        Q(resource__in=("nodes", "clusteroperators", *WORKLOADS))
        | Q(resource="pods", reason__startswith="Ready=")
        | Q(resource="pods", reason__startswith="PodScheduled="))
    # every termination (a regular container that ended well and was started again restarted
    # all the same) and every container started again (restartCount above 0)
    containers = Q(reason="ContainerTerminated") | Q(reason="ContainerStarted", count__gt=0)
    rows = list(events.filter(Q(severity="Warning") | conditions | containers
                              | Q(reason="VersionUpdate"),
                              kind="state").order_by("received", "id").values(*_FIELDS)
                ) if "state" in kinds else []
    # a deletion still pending at capture whose delete request the incident holds: its row is
    # folded into the request (``statelinks``), the fact is the same
    folded = [row for row in folded_rows(events, _FIELDS) if row["severity"] == "Warning"
              ] if "audit" in kinds else []
    return sorted(rows + folded, key=lambda row: (row["received"], row["id"])) if folded \
        else rows


def _condition(row: dict) -> tuple[str, str] | None:
    kind, sep, status = row["reason"].partition("=")
    return (kind, status) if sep else None


def add_states(events: QuerySet, problems: Problems, capture: datetime | None,
               kinds: set[str] | None = None) -> list[dict]:
    """Adds the state rows' problems to ``problems``; returns the findings made on their own
    (ClusterVersion upgrades, workloads below their replicas). ``kinds``: as ``state_rows``."""
    rows = state_rows(events, kinds)
    latest: dict[tuple, dict] = {}  # (resource, namespace, name, condition type) → latest row
    restarts: dict[tuple, int] = {}
    terminated = {(r["namespace"], r["name"], r["component"]) for r in rows
                  if r["reason"] == "ContainerTerminated"}
    for row in rows:
        reason = row["reason"]
        extra = row["annotations"] or {}
        pod = (row["resource"], row["namespace"], row["name"])
        bad = row["severity"] == "Warning"
        if reason == "ContainerTerminated" and (bad or (extra.get("last")
                                                        and not extra.get("init"))):
            oom = "OOMKilled" in (row["message"] or "")
            kind = "oom-kill" if oom else "container-restarts"
            problem = problems.of(kind, *pod)
            cause = (row["message"] or "").partition(": ")[2] or "terminated"
            # a clean exit (Completed, 0) before a restart is worth knowing, not a crash
            problem.add({**row, "completed": row["completed"] or row["received"]},
                        reason=cause.split(" exit code")[0],
                        severity="critical" if oom else "warning" if bad else "info")
            problem.facts.append({
                "pod": row["name"], "container": row["component"],
                "init": bool(extra.get("init")), "last": bool(extra.get("last")),
                "started": rfc3339(row["received"]),
                "finished": rfc3339(row["completed"] or row["received"]),
                "reason": cause.split(" exit code")[0],
                # (rows stored before the exit code left ``code`` still have it there)
                "exit_code": extra.get("exit_code", row["code"]),
                "restarts": row["count"], "event": row["id"]})
            if row["count"] is not None:
                key = (kind, *pod, row["component"])
                restarts[key] = max(restarts.get(key, 0), row["count"])
        elif reason == "ContainerStarted" and (row["count"] or 0) > 0:
            key = ("container-restarts", *pod, row["component"])
            restarts[key] = max(restarts.get(key, 0), row["count"])
            if (row["namespace"], row["name"], row["component"]) not in terminated:
                # restarted, its last termination not in the evidence: the start says
                problems.of("container-restarts", *pod).add(row, reason="restarted",
                                                            severity="info")
        elif reason == "ContainerWaiting" and row["severity"] == "Warning":
            waiting = (row["message"] or "").partition(": ")[2]
            kind = WAITING_KINDS.get(waiting, "stuck-pending")
            problems.of(kind, *pod).add({**row, "completed": capture or row["received"]},
                                        reason=waiting)
            if row["count"] is not None and kind == "container-restarts":
                key = (kind, *pod, row["component"])
                restarts[key] = max(restarts.get(key, 0), row["count"])
        elif reason == "DeletionRequested" and row["severity"] == "Warning":
            problems.of("stuck-terminating", *pod).add(
                {**row, "completed": capture or row["received"]}, reason="deletion requested",
                severity="warning")
        elif _condition(row) is not None:
            latest[(*pod, _condition(row)[0])] = row
    for (kind, resource, namespace, name, container), n in restarts.items():
        key = (kind, owner_of(resource, namespace, name))
        if n and key in problems:
            problems[key].notes.append(f"{container} in {name} restarted {plural(n, 'time')}")
    healthy = {(r, n, x) for (r, n, x, c), row in latest.items()
               if r == "pods" and c == "Ready" and row["reason"] == "Ready=True"}
    for problem in problems.values():
        if problem.kind in ("container-restarts", "oom-kill"):
            ready = [o for o in problem.objects if o in healthy]
            if ready:
                problem.notes.append(f"{len(ready)} of {len(problem.objects)} pods Ready at "
                                     "capture")
    _add_conditions(events, problems, latest, capture)
    return _upgrades(rows) + (_replicas(events, capture) if kinds is None or "state" in kinds
                              else [])


def _add_conditions(events: QuerySet, problems: Problems, latest: dict[tuple, dict],
                    capture: datetime | None) -> None:
    planned_nodes = set()
    nodes = {k[2] for k in latest if k[0] == "nodes"}
    if nodes:
        planned_nodes = set(events.filter(kind="event", resource="nodes", name__in=nodes,
                                          reason__in=PLANNED_REASONS).values_list(
            "name", flat=True).distinct())
    for (resource, namespace, name, kind), row in latest.items():
        status = _condition(row)[1]
        if resource == "pods":
            if kind == "PodScheduled" and status == "False":
                problem = problems.of("unschedulable", resource, namespace, name)
                problem.add({**row, "completed": capture or row["received"]},
                            reason="PodScheduled=False", severity="warning")
            continue
        if resource == "nodes":
            finding, table = "node-condition", NODE_TROUBLE
        elif resource == "clusteroperators":
            finding, table = "operator-condition", OPERATOR_TROUBLE
        else:
            finding, table = "workload-unavailable", WORKLOAD_TROUBLE
        bad, severity = table.get(kind, ((), "info"))
        if status not in bad:
            if kind in table or row["severity"] != "Warning":
                continue
            severity = "info"  # a condition type we do not know, said bad by its polarity
        problem = problems.of(finding, resource, namespace, name)
        problem.add({**row, "completed": capture or row["received"]}, reason=row["reason"],
                    severity=severity)
        problem.facts.append({"condition": kind, "status": status,
                              "since": rfc3339(row["received"]), "message": row["message"],
                              "event": row["id"]})
        if resource == "nodes":
            note = ("planned: drain or update Events on the node" if name in planned_nodes
                    else "no drain or update seen: unexpected")
            if note not in problem.notes:
                problem.notes.append(note)
        else:
            problem.notes.append(f"{row['reason']} since {format_time(row['received'])}")


def _upgrades(rows: list[dict]) -> list[dict]:
    updates = [r for r in rows if r["reason"] == "VersionUpdate"]
    if not updates:
        return []
    windows = [{"start": rfc3339(r["received"]), "end": rfc3339(r["completed"]),
                "version": r["message"], "event": r["id"]} for r in updates]
    open_ = [w for w in windows if w["end"] is None or w["end"] == w["start"]]
    return [insight(
        "operator-condition", f"ClusterVersion: {plural(len(updates), 'update')}",
        "info", "; ".join(f"{w['version']} from {w['start']}"
                          + (f" to {w['end']}" if w not in open_ else " (not completed)")
                          for w in windows[-5:]),
        [r["id"] for r in updates], start=windows[0]["start"],
        end=max((w["end"] or w["start"]) for w in windows), windows=windows,
        objects=[{"resource": "clusterversions", "namespace": "", "name": r["name"]}
                 for r in updates[:1]],
        filters={"kind": ["state"], "reason": ["VersionUpdate"]})]


def _replicas(events: QuerySet, capture: datetime | None) -> list[dict]:
    """Workloads whose snapshot has fewer ready replicas than desired."""
    snapshots = list(events.filter(kind="state", reason="Snapshot", resource__in=WORKLOADS)
                     .order_by("received", "id").values(
        "id", "received", "resource", "namespace", "name", "body_chunk", "body_index")[
        :MAX_BODIES])
    bodies = read_bodies(snapshots)
    latest: dict[tuple, tuple[dict, dict]] = {}
    for row in snapshots:
        body = bodies.get(row["id"])
        obj = _object(body)
        if obj is not None:
            latest[(row["resource"], row["namespace"], row["name"])] = (row, obj)
    found = []
    for (resource, namespace, name), (row, obj) in sorted(latest.items()):
        desired, ready = _replica_counts(resource, obj)
        if desired is None or ready >= desired:
            continue
        found.append(insight(
            "workload-unavailable",
            f"{resource}/{namespace}/{name}: {ready} of {desired} replicas ready",
            "critical" if ready == 0 else "warning",
            f"at capture ({format_time(row['received'])}) {ready} of {desired} desired "
            "replicas were ready", [row["id"]], desired=desired, ready=ready,
            start=rfc3339(row["received"]), end=rfc3339(row["received"]),
            capture=rfc3339(capture), age_s=0.0,
            objects=[{"resource": resource, "namespace": namespace, "name": name}],
            filters={"resource": [resource], "name": [name],
                     **({"namespace": [namespace]} if namespace else {})}))
    return found


def _object(body: dict | None) -> dict | None:
    """The object of a snapshot's body: the body itself, or an envelope's object."""
    if not isinstance(body, dict):
        return None
    if "status" in body or "spec" in body:
        return body
    for key in ("object", "responseObject", "requestObject"):
        if isinstance(body.get(key), dict):
            return body[key]
    return None


def _number(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _replica_counts(resource: str, obj: dict) -> tuple[int | None, int]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not isinstance(spec, dict) or not isinstance(status, dict):
        return None, 0
    if resource == "daemonsets":
        desired = _number(status.get("desiredNumberScheduled"))
        ready = _number(status.get("numberReady")) or 0
    else:
        desired = _number(spec.get("replicas"))
        if desired is None and "replicas" not in spec:
            desired = 1  # the API's default
        ready = _number(status.get("readyReplicas")) or 0
    return desired, ready


def link_logs(events: QuerySet, problems: Problems) -> None:
    """To each container termination (at most MAX_LISTED in all), the log lines of that
    container within LOG_SLACK of its end (the container's log file in the bundle); to a
    restart known from BackOff Events only, the container's error lines around it. One query
    for them all (a pod's log lines carry its container as their component), told apart here;
    reading every line of those containers instead cost a second in a must-gather."""
    targets = []  # (problem, fact or None, pod, container, from, to, errors only)
    for problem in problems.values():
        if problem.kind not in ("container-restarts", "oom-kill"):
            continue
        for fact in problem.facts:
            if fact.get("finished") and fact.get("container"):
                finished = datetime.fromisoformat(fact["finished"].replace("Z", "+00:00"))
                targets.append((problem, fact, fact["pod"], fact["container"],
                                finished - LOG_SLACK, finished + LOG_SLACK, False))
        if not problem.facts and problem.start is not None:
            targets += [(problem, None, pod, container, problem.start - LOG_SLACK,
                         problem.end + LOG_SLACK, True)
                        for pod, container in list(problem.containers)[:3]]
    targets = targets[:MAX_LISTED]
    if not targets:
        return
    wanted = Q()
    for problem, _, pod, container, low, high, errors_only in targets:
        # the pod's lines carry it (``parsers.base.pod_object``); the path of its log file in
        # a must-gather says it too, as it did for the lines stored before they did
        wanted |= Q(Q(resource="pods", namespace=problem.owner[1], name=pod)
                    | Q(source__contains=f"/{pod}/{container}/"),
                    component=container, received__gte=low, received__lte=high,
                    **({"severity__in": ("error", "fatal", "")} if errors_only else {}))
    rows = list(events.filter(wanted, kind="log").order_by("received", "id").values_list(
        "id", "received", "source", "component", "severity", "namespace", "name")[
        :MAX_LOG_LINES])
    lines: dict[int, int] = defaultdict(int)  # error lines linked per problem (by identity)
    for problem, fact, pod, container, low, high, errors_only in targets:
        path = f"/{pod}/{container}/"
        ids = [(i, when) for i, when, source, component, severity, namespace, name in rows
               if component == container and low <= when <= high
               and ((namespace, name) == (problem.owner[1], pod) or path in source)
               and (not errors_only or severity in ("error", "fatal", ""))]
        if fact is not None:  # the lines nearest the termination, the last words among them
            ended = low + LOG_SLACK
            ids = sorted(sorted(ids, key=lambda item: abs(item[1] - ended))[:LINKED_LINES],
                         key=lambda item: item[1])
        else:
            ids = ids[:LINKED_LINES]
        problem.ids += [(when, i) for i, when in ids]
        if ids:
            problem.sources.add("log")
        if fact is not None:
            fact["logs"] = [i for i, _ in ids]
        else:
            lines[id(problem)] += len(ids)
    for problem in {id(t[0]): t[0] for t in targets if t[1] is None}.values():
        if lines[id(problem)]:
            problem.notes.append(f"{plural(lines[id(problem)], 'error line')} of the container "
                                 "around it")
