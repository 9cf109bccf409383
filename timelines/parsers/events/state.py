"""Kubernetes objects (any kind, CRDs too) as evidence of state: one ``Snapshot`` row per object
at the capture time, and one row of kind ``state`` per time point the object records.

The rows follow the contract between the state rows and the findings built on them
(``state-contract``, README "Object snapshots"):

- ``Snapshot`` at the capture time, its body the redacted object;
- ``Created`` (``metadata.creationTimestamp``), ``DeletionRequested``
  (``metadata.deletionTimestamp``: still there at capture, so stuck terminating: Warning);
- ``<ConditionType>=<Status>`` at each ``status.conditions[].lastTransitionTime``;
- ``ContainerStarted`` / ``ContainerTerminated`` (a span ``startedAt`` → ``finishedAt``, from
  ``state`` and ``lastState``) / ``ContainerWaiting`` (at capture) for init, regular and ephemeral
  containers, with the ``restartCount``;
- ``JobStarted`` / ``JobCompleted``; ``VersionUpdate`` for each ClusterVersion history entry.

A row's ``audit_id`` is derived from the object's identity (uid, else resource/namespace/name),
the reason, the container and the time, so the same fact read from two files (a List and the
object's own file, two bundles) is stored once.

The capture time is the bundle's (``ParseHints.collected`` from the collector's own record),
else the latest time found in the file's objects; never the wall clock.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson

from ..base import Report, Row
from ..redact import Redactor, _redact_path, may_hold_token, redact_object, redact_strings
from .fields import _dumps, _parse_time, _plural

# Condition types whose True is trouble; for the rest of the built-in ones, False (or Unknown) is.
TRUE_IS_BAD = frozenset(("Degraded", "MemoryPressure", "DiskPressure", "PIDPressure",
                         "NetworkUnavailable", "Failed", "Failing", "ReplicaFailure",
                         "FailureTarget", "DisruptionTarget", "Stalled"))
FALSE_IS_BAD = frozenset(("Ready", "Available", "ContainersReady", "Initialized", "PodScheduled",
                          "Complete", "Succeeded", "Established", "NamesAccepted",
                          "PodReadyToStartContainers"))
# Progressing=False is trouble for a workload (ProgressDeadlineExceeded), not for an operator.
WORKLOADS = frozenset(("deployments", "statefulsets", "daemonsets", "replicasets",
                       "deploymentconfigs"))
BAD_WAITING = frozenset(("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull",
                         "CreateContainerConfigError", "CreateContainerError",
                         "InvalidImageName", "RunContainerError"))
CONTAINER_STATUSES = (("initContainerStatuses", True), ("containerStatuses", False),
                      ("ephemeralContainerStatuses", False))


def is_object(value: dict[str, Any]) -> bool:
    """A Kubernetes object of some kind: a kind, an apiVersion and a named metadata."""
    kind = value.get("kind")
    meta = value.get("metadata")
    return (isinstance(kind, str) and bool(kind) and isinstance(value.get("apiVersion"), str)
            and isinstance(meta, dict) and isinstance(meta.get("name"), str)
            and not value["apiVersion"].startswith(("audit.k8s.io/", "admission.k8s.io/")))


# Kinds of the resources a kind-less object's selfLink may name (the others: the resource).
KINDS = {"pods": "Pod", "nodes": "Node", "jobs": "Job", "clusterversions": "ClusterVersion",
         "replicasets": "ReplicaSet", "deployments": "Deployment", "daemonsets": "DaemonSet",
         "statefulsets": "StatefulSet", "services": "Service", "endpoints": "Endpoints",
         "configmaps": "ConfigMap", "secrets": "Secret", "namespaces": "Namespace",
         "persistentvolumeclaims": "PersistentVolumeClaim",
         "persistentvolumes": "PersistentVolume", "serviceaccounts": "ServiceAccount",
         "controllerrevisions": "ControllerRevision", "roles": "Role",
         "rolebindings": "RoleBinding", "clusterroles": "ClusterRole",
         "clusterrolebindings": "ClusterRoleBinding", "cronjobs": "CronJob"}


def kindless(value: dict[str, Any]) -> dict[str, Any] | None:
    """A kind-less object as the raw API returns it (sonobuoy's ``resources/``, troubleshoot's
    run pods) with the kind and apiVersion its ``metadata.selfLink`` names, or Pod for one shaped
    like a Pod (``spec.containers``); None when nothing says what it is."""
    meta = value.get("metadata")
    if (not isinstance(meta, dict) or not isinstance(meta.get("name"), str)
            or "apiVersion" in value):
        return None
    link = meta.get("selfLink")
    if isinstance(link, str):
        parts = link.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 4:
            version, rest = parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 5:
            version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            rest = []
        if len(rest) >= 4 and rest[0] == "namespaces":
            rest = rest[2:]
        if len(rest) >= 2:
            # A kind this table does not know keeps its resource name, which is what rows
            # carry (``_resource`` leaves a plural alone).
            return {"kind": KINDS.get(rest[0], rest[0]), "apiVersion": version, **value}
    spec = value.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
        return {"kind": "Pod", "apiVersion": "v1", **value}
    return None


def severity_of_condition(resource: str, kind: str, status: str) -> str:
    """Warning for a condition of bad polarity; unknown types are information (Normal)."""
    if kind in TRUE_IS_BAD:
        return "Warning" if status == "True" else "Normal"
    if kind in FALSE_IS_BAD or (kind == "Progressing" and resource in WORKLOADS):
        return "Warning" if status in ("False", "Unknown") else "Normal"
    return "Normal"


class StateBuilder:
    """Collects the objects of a file; ``rows(capture)`` turns them into state rows at the end,
    when the capture time (maybe the latest time of the objects themselves) is known."""

    def __init__(self, report: Report, redactor: Redactor) -> None:
        self.report = report
        self.redactor = redactor
        # identity → (line, object): the same object twice in a file is read once (the last)
        self.objects: dict[str, tuple[int, dict[str, Any]]] = {}
        self.latest: datetime | None = None
        self.bad_times = 0

    def add(self, obj: dict[str, Any], line: int) -> None:
        meta = obj["metadata"]
        key = _identity(obj, meta)
        self.objects[key] = (line, obj)

    def __len__(self) -> int:
        return len(self.objects)

    def kinds(self) -> Counter[str]:
        return Counter(obj["kind"] for _, obj in self.objects.values())

    def rows(self, capture: datetime | None) -> list[Row]:
        """The rows of every object; the capture time is ``capture``, else the latest time
        found in the objects (then said in a note)."""
        facts: list[tuple[int, dict[str, Any], list[_Fact]]] = []
        latest: datetime | None = None
        for line, obj in self.objects.values():
            try:
                found = list(self._facts(obj))
            except (ValueError, TypeError, AttributeError, OverflowError) as exc:
                self.report.skip(line, f"{obj.get('kind')} with a malformed field ({exc})")
                continue
            for fact in found:
                for when in (fact.received, fact.completed):
                    if when is not None and (latest is None or when > latest):
                        latest = when
            facts.append((line, obj, found))
        if capture is None:
            capture = latest
            if capture is not None and facts:
                self.report.notes.append(
                    f"capture time {capture.isoformat()} is the latest time found in the "
                    "objects (the bundle records none)")
        if capture is None:
            if facts:
                self.report.notes.append(f"{len(facts)} objects hold no time at all and no "
                                         "capture time is known: no snapshot of them")
            return []
        out: list[Row] = []
        for line, obj, found in facts:
            out.extend(self._rows(line, obj, found, capture))
        if self.bad_times:
            self.report.notes.append(f"{self.bad_times} unparseable object timestamps ignored")
        return out

    # --- one object ---------------------------------------------------------------------------

    def _time(self, holder: Any, key: str) -> datetime | None:
        if not isinstance(holder, dict):
            return None
        try:
            return _parse_time(holder.get(key))
        except (ValueError, TypeError, OverflowError):
            self.bad_times += 1
            return None

    def _facts(self, obj: dict[str, Any]) -> Iterable[_Fact]:
        meta = obj["metadata"]
        kind = obj["kind"]
        resource = _resource(kind)
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        if (when := self._time(meta, "creationTimestamp")) is not None:
            yield _Fact("Created", when)
        if (when := self._time(meta, "deletionTimestamp")) is not None:
            grace = meta.get("deletionGracePeriodSeconds")
            yield _Fact("DeletionRequested", when, severity="Warning",
                        message=f"grace period {grace} s" if grace is not None else "",
                        detail={"deletionTimestamp": meta.get("deletionTimestamp"),
                                "finalizers": meta.get("finalizers")})
        conditions = status.get("conditions")
        if isinstance(conditions, list):
            for condition in conditions:
                if not isinstance(condition, dict) or not isinstance(condition.get("type"), str):
                    continue
                when = (self._time(condition, "lastTransitionTime")
                        or self._time(condition, "lastUpdateTime"))
                if when is None:
                    continue
                value = str(condition.get("status", "Unknown"))
                why = str(condition.get("reason") or "")
                text = str(condition.get("message") or "")
                yield _Fact(f"{condition['type']}={value}", when,
                            severity=severity_of_condition(resource, condition["type"], value),
                            message=f"{why}: {text}" if why and text else why or text,
                            annotations={"condition": condition["type"], "status": value},
                            detail=condition)
        for key, init in CONTAINER_STATUSES:
            statuses = status.get(key)
            if isinstance(statuses, list):
                for container in statuses:
                    if isinstance(container, dict):
                        yield from self._container(container, init)
        if kind == "Job":
            if (when := self._time(status, "startTime")) is not None:
                yield _Fact("JobStarted", when)
            if (when := self._time(status, "completionTime")) is not None:
                yield _Fact("JobCompleted", when)
        if kind == "ClusterVersion" and isinstance(status.get("history"), list):
            for entry in status["history"]:
                start = self._time(entry, "startedTime")
                if start is None:
                    continue
                state = str(entry.get("state") or "")
                yield _Fact("VersionUpdate", start, completed=self._time(entry, "completionTime"),
                            span=True, message=f"{entry.get('version', '')} {state}".strip(),
                            annotations={"status": state}, detail=entry)

    def _container(self, container: dict[str, Any], init: bool) -> Iterable[_Fact]:
        name = str(container.get("name") or "")
        restarts = container.get("restartCount")
        count = restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else None
        common = {"container": name, "init": init}
        for holder, last in (("state", False), ("lastState", True)):
            state = container.get(holder)
            if not isinstance(state, dict):
                continue
            running = state.get("running")
            if isinstance(running, dict) and (when := self._time(running, "startedAt")):
                yield _Fact("ContainerStarted", when, container=name, count=count, message=name,
                            annotations={**common, "last": last}, detail=container)
            terminated = state.get("terminated")
            if isinstance(terminated, dict):
                start = self._time(terminated, "startedAt")
                end = self._time(terminated, "finishedAt")
                if start is None and end is None:
                    continue
                reason = str(terminated.get("reason") or "")
                code = terminated.get("exitCode")
                code = code if isinstance(code, int) and not isinstance(code, bool) else None
                bad = reason != "Completed" or code not in (0, None)
                # the exit code in the annotations: ``code`` is a request's HTTP status, and
                # an exit code 1 there counted among them (the Codes list, a code filter)
                yield _Fact("ContainerTerminated", start or end, completed=end or start,
                            span=True, container=name, count=count,
                            severity="Warning" if bad else "Normal",
                            message=f"{name}: {reason or 'terminated'} exit code {code}",
                            annotations={**common, "last": last, "exit_code": code},
                            detail=container)
            waiting = state.get("waiting")
            if isinstance(waiting, dict) and not last:
                reason = str(waiting.get("reason") or "")
                yield _Fact("ContainerWaiting", None, container=name, count=count,
                            severity="Warning" if reason in BAD_WAITING else "Normal",
                            message=f"{name}: {reason}" if reason else name,
                            annotations={**common, "last": last}, detail=container)

    def _rows(self, line: int, obj: dict[str, Any], found: list[_Fact],
              capture: datetime) -> list[Row]:
        meta = obj["metadata"]
        kind = obj["kind"]
        api_group, _, api_version = obj["apiVersion"].rpartition("/")
        resource = _resource(kind)
        namespace = _str(meta.get("namespace"))
        name = _str(meta.get("name"))
        uid = _str(meta.get("uid"))
        version = _str(meta.get("resourceVersion"))
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        node = _str(spec.get("nodeName")) if resource == "pods" else ""
        identity = uid or f"{resource}/{namespace}/{name}"
        stamp = capture.isoformat()
        redacted = self._redact(obj)
        raw = _dumps(obj)
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        base = dict(kind="state", resource=resource, namespace=namespace, name=name,
                    api_group=api_group, api_version=api_version, object_uid=uid,
                    resource_version=version, node=node, source=self.report.source, line=line)
        snapshot = {"capture": stamp}
        if related := relations(obj, resource, namespace):
            snapshot["related"] = related
        rows = [Row(audit_id=_key(identity, "Snapshot", "", stamp), received=capture,
                    completed=capture, duration_ms=0.0, reason="Snapshot", severity="Normal",
                    message=_str(status.get("phase")), annotations=snapshot,
                    raw=raw, **base)]
        self.report.redacted += redacted
        for fact in found:
            received = fact.received or capture
            completed = fact.completed if fact.span else received
            annotations = {**fact.annotations, "capture": stamp}
            rows.append(Row(
                audit_id=_key(identity, fact.reason, fact.container, received.isoformat()),
                received=received, completed=completed,
                duration_ms=((completed - received).total_seconds() * 1000.0
                             if completed is not None else None),
                reason=fact.reason, severity=fact.severity, message=fact.message,
                component=fact.container, code=fact.code, count=fact.count,
                annotations=annotations,
                # Not shaped as an object (no top-level metadata): only a snapshot is a
                # version of the object to diff (``timelines.reads.diff.object_version``).
                raw=_dumps({"object": {"kind": kind, "apiVersion": obj["apiVersion"],
                                       "namespace": namespace, "name": name, "uid": uid},
                            "reason": fact.reason, "capture": stamp, "fact": fact.detail}),
                **base))
        return rows

    def _redact(self, obj: dict[str, Any]) -> int:
        """Secrets out of the object before anything of it is stored, as in audit bodies."""
        if not self.redactor.enabled:
            return 0
        count = redact_object(obj)
        for path in self.redactor.extra_paths:
            count += _redact_path(obj, path)
        if may_hold_token(_dumps(obj)):
            count += redact_strings(obj)
        return count


class _Fact:
    """One time point (or span) of an object, before it becomes a row."""

    __slots__ = ("annotations", "code", "completed", "container", "count", "detail", "message",
                 "reason", "received", "severity", "span")

    def __init__(self, reason: str, received: datetime | None, *,
                 completed: datetime | None = None, span: bool = False, container: str = "",
                 count: int | None = None, code: int | None = None, severity: str = "Normal",
                 message: str = "", annotations: dict[str, Any] | None = None,
                 detail: Any = None) -> None:
        self.reason = reason
        self.received = received  # None: at the capture time
        self.completed = completed
        self.span = span
        self.container = container
        self.count = count
        self.code = code
        self.severity = severity
        self.message = message
        self.annotations = annotations or {}
        self.detail = detail


# Kinds whose objects have no namespace, for owner references (which name none).
CLUSTER_SCOPED = frozenset(("Node", "Namespace", "PersistentVolume", "ClusterRole",
                            "ClusterRoleBinding", "CustomResourceDefinition", "StorageClass",
                            "ClusterOperator", "ClusterVersion", "MachineConfigPool",
                            "MachineConfig", "APIService", "PriorityClass"))


def relations(obj: dict[str, Any], resource: str, namespace: str) -> list[list[str]]:
    """What an object names of other objects, as ``[relation, resource, namespace, name]``:
    ``owner`` (its ownerReferences), ``node`` (a pod's node), ``claim`` (a pod's
    PersistentVolumeClaims, a PersistentVolume's claimRef), ``volume`` (a claim's bound volume),
    ``service`` (the Service of Endpoints or an EndpointSlice), ``pod`` (the pods Endpoints and
    EndpointSlices point at). Read by ``timelines.reads.related``, which adds the inverse."""
    found: list[list[str]] = []
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}

    def add(relation: str, kind_or_resource: str, ns: str, name: Any) -> None:
        if isinstance(name, str) and name:
            entry = [relation, kind_or_resource, ns, name]
            if entry not in found:
                found.append(entry)

    for owner in meta.get("ownerReferences") or []:
        if isinstance(owner, dict) and isinstance(owner.get("kind"), str):
            kind = owner["kind"]
            add("owner", _plural(kind), "" if kind in CLUSTER_SCOPED else namespace,
                owner.get("name"))
    if resource == "pods":
        add("node", "nodes", "", spec.get("nodeName"))
        for volume in spec.get("volumes") or []:
            claim = volume.get("persistentVolumeClaim") if isinstance(volume, dict) else None
            if isinstance(claim, dict):
                add("claim", "persistentvolumeclaims", namespace, claim.get("claimName"))
    elif resource == "persistentvolumeclaims":
        add("volume", "persistentvolumes", "", spec.get("volumeName"))
    elif resource == "persistentvolumes":
        ref = spec.get("claimRef")
        if isinstance(ref, dict):
            add("claim", "persistentvolumeclaims", _str(ref.get("namespace")), ref.get("name"))
    elif resource == "endpoints":
        add("service", "services", namespace, meta.get("name"))
        for subset in obj.get("subsets") or []:
            for key in ("addresses", "notReadyAddresses"):
                for address in (subset.get(key) or []) if isinstance(subset, dict) else []:
                    ref = address.get("targetRef") if isinstance(address, dict) else None
                    if isinstance(ref, dict) and ref.get("kind") == "Pod":
                        add("pod", "pods", _str(ref.get("namespace")) or namespace,
                            ref.get("name"))
    elif resource == "endpointslices":
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        add("service", "services", namespace, labels.get("kubernetes.io/service-name"))
        for endpoint in obj.get("endpoints") or []:
            ref = endpoint.get("targetRef") if isinstance(endpoint, dict) else None
            if isinstance(ref, dict) and ref.get("kind") == "Pod":
                add("pod", "pods", _str(ref.get("namespace")) or namespace, ref.get("name"))
    return found


def _resource(kind: str) -> str:
    """The plural resource of a kind; a kind-less object named by its selfLink's resource (lower
    case already, see ``kindless``) keeps it."""
    return kind if kind.islower() else _plural(kind)


def _identity(obj: dict[str, Any], meta: dict[str, Any]) -> str:
    uid = meta.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return f"{obj['kind']}/{meta.get('namespace') or ''}/{meta['name']}"


def _key(identity: str, reason: str, container: str, when: str) -> str:
    digest = hashlib.blake2b(orjson.dumps([identity, reason, container, when]),
                             digest_size=16).hexdigest()
    return f"state:{digest}"


def _str(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)
