"""Findings on a bundle's evidence, beside the request insights of ``insights``: Kubernetes
Events, component logs and object state (``states``) say which containers crashed, which pods
could not be scheduled or mount their volumes, which probes and image pulls failed, which
nodes and operators were unwell and which workloads were short of replicas.

One problem is one finding: facts are gathered into a ``Problem`` keyed by the kind and the
object's owner (a Deployment's pods through their ReplicaSet, a StatefulSet's or a DaemonSet's
pods, by their generated names), whichever evidence they come from, so that a BackOff Event
and the container's termination in the pod's snapshot make one finding. Each finding carries
``start``/``end`` (RFC 3339), ``objects`` ([{"resource", "namespace", "name"}]), ``owner``,
its events, and its age: ``capture`` (the bundle's capture time: its snapshots', else the
latest evidence) and ``age_s``, how long before it the problem was last seen.

Every query selects a few rows by kind, severity or reason (Warning Events, error log lines,
state rows): no pass over every event of the incident in Python.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta

from django.db.models import Max, Q, QuerySet, Sum

from incidents.notes import format_duration, format_time

from . import states
from .common import MAX_EVENTS, MAX_GROUPS, MAX_LISTED, find_bursts, insight, plural, rfc3339
from .problems import (
    SEVERITIES_RANK,
    Problem,
    Problems,
    label,
    message_shape,
)

# kind of finding by the reason of a Kubernetes Event (Warning or not: some are Normal)
EVENT_KINDS = {
    "FailedScheduling": "unschedulable",
    "FailedMount": "mount-failure", "FailedAttachVolume": "mount-failure",
    "FailedMapVolume": "mount-failure",
    "Unhealthy": "probe-failure", "ProbeError": "probe-failure",
    "ErrImagePull": "image-pull", "ImagePullBackOff": "image-pull",
    "InspectFailed": "image-pull", "ErrImageNeverPull": "image-pull",
    "OOMKilling": "oom-kill", "SystemOOM": "oom-kill",
    "FailedCreatePodSandBox": "sandbox-failure", "FailedKillPodSandBox": "sandbox-failure",
    "FailedPodSandBoxStatus": "sandbox-failure",
    "Evicted": "eviction",
    "NodeNotReady": "node-condition", "NodeHasDiskPressure": "node-condition",
    "NodeHasInsufficientMemory": "node-condition", "NodeHasInsufficientPID": "node-condition",
}
# kinds this module and ``states`` add to those of requests (``insights.kinds_in_order``)
KINDS = ("oom-kill", "container-restarts", "node-condition", "operator-condition",
         "workload-unavailable", "unschedulable", "mount-failure", "probe-failure",
         "image-pull", "sandbox-failure", "eviction", "stuck-terminating", "stuck-pending",
         "repeated-event", "warning-burst", "log-errors")
REPEATED_MIN = 21  # an Event counted more than 20 times for one object and reason
MAX_WARNING_ROWS = 200_000  # Warning Events read (a bundle holds thousands)
MAX_LOG_ROWS = 100_000  # error log lines read
LOG_ERRORS_MIN = 10  # error lines of one shape that make a finding (special lines: any)
MAX_PROBLEMS = 100  # findings of one kind (the most severe, then the most frequent)
# log lines worth a finding however few: panics, lost leader elections, slow etcd
SPECIAL_LOGS = (("panic", re.compile(r"panic: ")),
                ("lost leader election", re.compile(r"leaderelection lost|failed to renew lease")),
                ("etcd took too long", re.compile(r"took too long")))
OOM_LOG = re.compile(r"Out of memory|oom-kill|invoked oom-killer|OOMKilled")
# what the database looks for in every log line (the patterns above, as plain substrings)
SPECIAL_TEXTS = ("panic: ", "leaderelection lost", "failed to renew lease", "took too long",
                 "Out of memory", "oom-kill", "invoked oom-killer", "OOMKilled")
SEVERITY_OF = {"oom-kill": "critical", "container-restarts": "warning",
               "unschedulable": "warning", "mount-failure": "warning",
               "probe-failure": "warning", "image-pull": "warning", "sandbox-failure": "warning",
               "eviction": "warning", "stuck-terminating": "warning", "stuck-pending": "warning"}
TITLES = {"oom-kill": "OOM kills", "container-restarts": "containers restarted or crashed",
          "unschedulable": "could not be scheduled", "mount-failure": "volumes would not mount",
          "probe-failure": "probes failing", "image-pull": "image pulls failing",
          "sandbox-failure": "pod sandboxes failing", "eviction": "pods evicted",
          "stuck-terminating": "stuck terminating", "stuck-pending": "stuck pending"}


def capture_time(events: QuerySet, kinds: set[str] | None = None) -> datetime | None:
    """The bundle's capture time: its latest object snapshot (state rows carry it), else its
    latest Kubernetes Event or request, else the latest time of its evidence (log files may
    hold times in a local zone read as UTC); never the wall clock. ``kinds``: the kinds of the
    events, when known (the reads of a kind not there are left out)."""
    latest = None
    if kinds is None or "state" in kinds:
        latest = events.filter(kind="state", reason="Snapshot").order_by().aggregate(
            t=Max("received"))["t"]
    if latest is None and (kinds is None or kinds & {"event", "audit"}):
        latest = events.filter(kind__in=("event", "audit")).order_by().aggregate(
            t=Max("completed"))["t"]
    if latest is None:
        latest = events.order_by().aggregate(t=Max("received"))["t"]
    return latest


def _age(capture: datetime | None, end: datetime | None) -> float | None:
    if capture is None or end is None:
        return None
    return max(0.0, (capture - end).total_seconds())


def age_text(capture: datetime | None, end: datetime | None) -> str:
    age = _age(capture, end)
    if age is None:
        return ""
    if age < 1:
        return "still at capture"
    return f"last {format_duration(age * 1000)} before capture"


# --- Kubernetes Events ---------------------------------------------------------------------------

_EVENT_FIELDS = ("id", "kind", "received", "completed", "reason", "message", "resource",
                 "namespace", "name", "count", "severity", "node", "component", "annotations")
_CONTAINER_PATH = re.compile(r"spec\.(?:initContainers|containers)\{([^}]+)\}")


def event_rows(events: QuerySet) -> list[dict]:
    """The incident's Warning Events and those Normal ones whose reason names a problem."""
    return list(events.filter(Q(severity="Warning") | Q(reason__in=list(EVENT_KINDS)),
                              kind="event").order_by("received", "id").values(
        *_EVENT_FIELDS)[:MAX_WARNING_ROWS])


def event_kind(row: dict) -> str | None:
    """The kind of finding an Event belongs to, if any."""
    reason, message = row["reason"], row["message"] or ""
    if reason == "BackOff":
        if "pulling image" in message.lower():
            return "image-pull"
        return "container-restarts"
    if reason == "Failed" and ("pull" in message.lower() or "ErrImage" in message):
        return "image-pull"
    if reason == "Killing" and "OOM" in message:
        return "oom-kill"
    if reason == "FailedKillPod" or (reason == "Killing" and row["severity"] == "Warning"):
        return "stuck-terminating"
    return EVENT_KINDS.get(reason)


# why an image pull failed, from the kubelet's message
PULL_CAUSES = (("image not found", re.compile(r"manifest unknown|not found|does not exist", re.I)),
               ("not authorized", re.compile(r"unauthorized|authentication required|denied|"
                                             r"forbidden", re.I)),
               ("rate limited", re.compile(r"toomanyrequests|rate limit", re.I)),
               ("registry unreachable", re.compile(r"i/o timeout|deadline exceeded|connection "
                                                   r"refused|no such host|TLS handshake", re.I)),
               ("invalid image name", re.compile(r"InvalidImageName|invalid reference", re.I)))


def pull_cause(message: str) -> str | None:
    return next((cause for cause, pattern in PULL_CAUSES if pattern.search(message)), None)


def add_events(problems: Problems, rows: Iterable[dict]) -> None:
    for row in rows:
        kind = event_kind(row)
        if kind is None:
            continue
        problem = problems.of(kind, row["resource"], row["namespace"], row["name"])
        reason = row["reason"]
        if kind == "image-pull":  # by cause where the message says it
            reason = pull_cause(row["message"] or "") or reason
        problem.add(row, count=row["count"] or 1, reason=reason,
                    severity=SEVERITY_OF.get(kind, "warning"))
        container = _CONTAINER_PATH.search((row["annotations"] or {}).get("fieldPath", ""))
        if container and kind in ("container-restarts", "oom-kill"):
            problem.containers[(row["name"], container.group(1))] = None


def repeated_rows(events: QuerySet) -> list[dict]:
    """(object, reason) whose Events count more than 20 in all, the most first (then by object
    and reason: equal counts came out in whichever order the plan gave them, so two runs could
    list, and cut at MAX_GROUPS, different ones): one GROUP BY."""
    return list(events.filter(kind="event").order_by().values(
        "resource", "namespace", "name", "reason").annotate(n=Sum("count")).filter(
        n__gte=REPEATED_MIN).order_by("-n", "resource", "namespace", "name", "reason")[
        :MAX_GROUPS])


def repeated_insights(events: QuerySet, groups: list[dict],
                      capture: datetime | None) -> list[dict]:
    found = []
    for group in groups:
        rows = list(events.filter(kind="event", resource=group["resource"],
                                  namespace=group["namespace"], name=group["name"],
                                  reason=group["reason"]).order_by("received", "id").values(
            "id", "received", "completed", "severity", "message")[:MAX_EVENTS])
        if not rows:
            continue
        start, end = rows[0]["received"], max(r["completed"] or r["received"] for r in rows)
        warning = any(r["severity"] == "Warning" for r in rows)
        what = label(group["resource"], group["namespace"], group["name"])
        found.append(insight(
            "repeated-event", f"{group['reason']} {group['n']:,} times on {what}",
            "warning" if warning else "info",
            f"{plural(len(rows), 'Event')} of reason {group['reason']} counting {group['n']:,} "
            f"between {format_time(start)} and {format_time(end)}; {age_text(capture, end)}"
            + (f"; \u201c{message_shape(rows[-1]['message'])}\u201d" if rows[-1]["message"]
               else ""),
            [r["id"] for r in rows], count=group["n"], reason=group["reason"],
            start=rfc3339(start), end=rfc3339(end), capture=rfc3339(capture),
            age_s=_age(capture, end),
            objects=[{"resource": group["resource"], "namespace": group["namespace"],
                      "name": group["name"]}],
            filters={"kind": ["event"], "reason": [group["reason"]],
                     "resource": [group["resource"]], "name": [group["name"]],
                     **({"namespace": [group["namespace"]]} if group["namespace"] else {})}))
    return found


def _spread(row: dict) -> Iterator[tuple[datetime, int]]:
    """(minute, occurrences) of one Event: its count spread evenly over the minutes from its
    first to its last time (a whole number in each; where the count is smaller than the
    minutes, one in every few), not all in its first minute: a BackOff seen 11 times over four
    minutes is not 11 in the first."""
    n = row["count"] or 1
    start = row["received"].replace(second=0, microsecond=0)
    end = max(row["completed"] or row["received"], row["received"])
    k = int((end.replace(second=0, microsecond=0) - start) / timedelta(minutes=1)) + 1
    if n <= k:
        for j in range(n):
            yield start + timedelta(minutes=j * k // n), 1
    else:
        for i in range(k):
            yield start + timedelta(minutes=i), n * (i + 1) // k - n * i // k


def warning_bursts(rows: list[dict], capture: datetime | None) -> list[dict]:
    """Bursts of Warning Events of one reason (``insights.find_bursts`` over Events by reason
    and minute, each Event's count spread over the minutes it was seen in, ``_spread``); a
    burst ends at the capture at the latest."""
    warnings = [r for r in rows if r["severity"] == "Warning"]
    if not warnings:
        return []
    minutes: Counter = Counter()
    for row in warnings:
        for minute, n in _spread(row):
            minutes[(row["reason"], minute)] += n
    first = min(r["received"] for r in warnings)
    last = max(max(r["completed"] or r["received"], r["received"]) for r in warnings)
    found = []
    for burst in find_bursts([(reason, minute, n) for (reason, minute), n in minutes.items()],
                             first, last):
        reason = burst["category"]
        if capture is not None and burst["start"] <= capture < burst["end"]:
            burst["end"] = capture + timedelta(microseconds=1)
        members = [r for r in warnings if r["reason"] == reason
                   and r["received"] < burst["end"]
                   and max(r["completed"] or r["received"], r["received"]) >= burst["start"]]
        objects = list(dict.fromkeys((r["resource"], r["namespace"], r["name"])
                                     for r in members))
        span = round((burst["end"] - burst["start"]) / timedelta(minutes=1), 1)
        found.append(insight(
            "warning-burst",
            f"{burst['count']:,} {reason} Warning Events in {span:g} min from "
            f"{format_time(burst['start'])}",
            "warning",
            f"on {plural(len(objects), 'object')}"
            + (f"; {burst['baseline']:.1f}/min on average" if burst["baseline"] else "")
            + f"; {age_text(capture, burst['end'])}",
            [r["id"] for r in members], count=burst["count"], reason=reason,
            start=rfc3339(burst["start"]), end=rfc3339(burst["end"]),
            capture=rfc3339(capture), age_s=_age(capture, burst["end"]),
            objects=[{"resource": r, "namespace": n, "name": x}
                     for r, n, x in objects[:MAX_LISTED]],
            filters={"kind": ["event"], "reason": [reason], "severity": ["Warning"],
                     "since": [rfc3339(burst["start"])],
                     "until": [rfc3339(burst["end"] - timedelta(microseconds=1))]}))
    return found


# --- logs ----------------------------------------------------------------------------------------

_LOG_FIELDS = ("id", "kind", "received", "completed", "message", "severity", "component", "node",
               "resource", "namespace", "name")


def log_rows(events: QuerySet) -> list[dict]:
    """Error and fatal log lines, and any line that is a panic, a lost leader election, a slow
    etcd request or an OOM kill."""
    # substring tests (LIKE): several times faster than one regular expression over every line
    special = Q()
    for text in SPECIAL_TEXTS:
        special |= Q(message__contains=text)
    return list(events.filter(Q(severity__in=("error", "fatal")) | special,
                              kind="log").order_by("received", "id").values(
        *_LOG_FIELDS)[:MAX_LOG_ROWS])


def log_insights(rows: list[dict], problems: Problems, capture: datetime | None) -> list[dict]:
    """OOM lines go to ``oom-kill`` problems (by node); the others, per component and message
    shape (special lines by their kind), become ``log-errors`` findings: the most lines
    first, at most MAX_GROUPS."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    special: set[tuple[str, str]] = set()
    for row in rows:
        message = row["message"] or ""
        if OOM_LOG.search(message):
            problem = problems.of("oom-kill", "nodes", "", row["node"] or row["component"])
            problem.add({**row, "resource": "nodes", "namespace": "",
                         "name": row["node"] or row["component"]}, reason="kernel/journal",
                        severity="critical")
            continue
        shape = next((what for what, pattern in SPECIAL_LOGS if pattern.search(message)), None)
        if shape is not None:
            special.add((row["component"], shape))
        elif row["severity"] in ("error", "fatal"):
            shape = message_shape(message)
        else:
            continue  # SQLite's LIKE ignores case: a line that only looked special
        groups[(row["component"], shape)].append(row)
    ranked = sorted(((key, items) for key, items in groups.items()
                     if key in special or len(items) >= LOG_ERRORS_MIN),
                    key=lambda kv: (kv[0] not in special, -len(kv[1]), kv[0]))[:MAX_GROUPS]
    found = []
    for (component, shape), items in ranked:
        start, end = items[0]["received"], items[-1]["received"]
        fatal = any(r["severity"] == "fatal" for r in items)
        nodes = sorted({r["node"] for r in items if r["node"]})
        busiest = Counter(r["received"].replace(second=0, microsecond=0) for r in items)
        minute, peak = busiest.most_common(1)[0]
        found.append(insight(
            "log-errors",
            f"{component or '(unknown component)'}: {plural(len(items), 'line')} "
            f"\u201c{shape}\u201d",
            "critical" if fatal or shape == "panic" else "warning",
            f"between {format_time(start)} and {format_time(end)}, at most {peak:,} in the "
            f"minute from {format_time(minute)}"
            + (f"; on {', '.join(nodes[:3])}" + ("…" if len(nodes) > 3 else "") if nodes else "")
            + f"; {age_text(capture, end)}",
            [r["id"] for r in items], component=component, shape=shape, count=len(items),
            start=rfc3339(start), end=rfc3339(end), capture=rfc3339(capture),
            age_s=_age(capture, end), objects=[],
            filters={"kind": ["log"], "component": [component]}))
    return found


# --- problems into findings ----------------------------------------------------------------------

# A finding's filters name its objects up to this many; beyond, its namespace alone
MAX_FILTER_OBJECTS = 50


def problem_insight(problem: Problem, capture: datetime | None) -> dict:
    resource, namespace, name = problem.owner
    objects = list(problem.objects)
    kind = problem.kind
    what = label(resource, namespace, name)
    if len(objects) > 1 or objects[0] != problem.owner:
        what += f" ({count_pods(objects)})"
    reasons = ", ".join(f"{r} ({n:,})" for r, n in problem.reasons.most_common(4))
    top = problem.messages.most_common(1)
    parts = [f"{plural(problem.count, 'time')} between {format_time(problem.start)} and "
             f"{format_time(problem.end)}"]
    if reasons:
        parts.append(reasons)
    parts += problem.notes
    if top:
        parts.append(f"\u201c{top[0][0]}\u201d")
    parts.append(age_text(capture, problem.end))
    ids = [i for _, i in sorted(problem.ids)]
    filters = {"kind": sorted(problem.sources)}
    if len(objects) <= MAX_FILTER_OBJECTS:  # its objects (a repeated filter ORs its values)
        filters.update({"resource": sorted({r for r, _, _ in objects}),
                        "name": sorted({x for _, _, x in objects})})
    if namespace:
        filters["namespace"] = [namespace]
    return insight(
        kind, f"{TITLES.get(kind, kind)}: {what}", problem.severity or "warning",
        "; ".join(p for p in parts if p), ids, count=problem.count,
        owner={"resource": resource, "namespace": namespace, "name": name},
        objects=[{"resource": r, "namespace": n, "name": x} for r, n, x in objects[:MAX_LISTED]],
        start=rfc3339(problem.start), end=rfc3339(problem.end), capture=rfc3339(capture),
        age_s=_age(capture, problem.end), reasons=dict(problem.reasons.most_common()),
        facts=problem.facts[:MAX_LISTED], evidence=sorted(problem.sources), filters=filters)


def count_pods(objects: list[tuple[str, str, str]]) -> str:
    kinds = Counter(r for r, _, _ in objects)
    return ", ".join(plural(n, r[:-1] if r.endswith("s") else r) for r, n in kinds.items())


def problem_insights(problems: Problems, capture: datetime | None) -> list[dict]:
    ranked = sorted((p for p in problems.values() if p.start is not None), key=lambda p: (
        SEVERITIES_RANK[p.severity or "warning"], -p.count, p.owner))
    per_kind: Counter = Counter()
    found = []
    for problem in ranked:
        per_kind[problem.kind] += 1
        if per_kind[problem.kind] <= MAX_PROBLEMS:
            found.append(problem_insight(problem, capture))
    return found


def steps(events: QuerySet, kinds: Callable[[], set[str]]) -> list[tuple[str, Callable[[], list]]]:
    """(name, function) of each part, for ``insights.steps``: Events and logs, then object
    state (``states``), their problems merged, then the counts of Events. ``kinds()``: the
    kinds of the incident's events (``insights.kinds_of``); a part whose kind is not there
    reads nothing (each read is a pass over the incident: 0.1-0.3 s at 500,000 events)."""
    shared: dict = {}

    def gather() -> list:
        present = kinds()
        shared["capture"] = capture_time(events, present)
        problems = shared["problems"] = Problems()
        rows = shared["rows"] = event_rows(events) if "event" in present else []
        add_events(problems, rows)
        return []

    def logs() -> list:
        if "log" not in kinds():
            return []
        return log_insights(log_rows(events), shared["problems"], shared["capture"])

    def state() -> list:
        present = kinds()
        found = []
        if present & {"state", "audit"}:  # (a request may carry a state row folded into it)
            found = states.add_states(events, shared["problems"], shared["capture"], present)
        if "log" in present:
            states.link_logs(events, shared["problems"])
        return found + problem_insights(shared["problems"], shared["capture"])

    def repeated() -> list:
        if "event" not in kinds():
            return []
        return repeated_insights(events, repeated_rows(events), shared["capture"])

    return [
        ("findings: Warning Events", gather),
        ("log-errors", logs),
        ("findings: state", state),
        ("repeated-event", repeated),
        ("warning-burst", lambda: warning_bursts(shared["rows"], shared["capture"])),
    ]

