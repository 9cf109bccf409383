"""What changed between two versions of a Kubernetes object, as dotted paths. Pure code.

The version an audit event holds is its ``responseObject`` (the object as stored, after
admission) or, failing that, its ``requestObject`` when that is a whole object (a patch body is
not). Bookkeeping that changes on every write (resourceVersion, managedFields, generation, …) is
folded away unless asked for; a change of a spec or status field, a lease's renewTime included,
is never folded.
"""

from __future__ import annotations

from typing import Any

TOO_BIG = "skipped-too-big-size-object"
# Paths whose changes say nothing about what the object does; prefixes match whole segments.
BOOKKEEPING = (
    "metadata.resourceVersion",
    "metadata.managedFields",
    "metadata.generation",
    "metadata.selfLink",
    "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration",
    "metadata.annotations.deployment.kubernetes.io/revision",
)
_MISSING = object()


class NoVersion(Exception):
    """The event holds no object version to compare, and this says why."""


def object_version(body: dict[str, Any] | None) -> dict[str, Any]:
    """The object version an audit event (or an object's snapshot) holds; raises ``NoVersion``
    with the reason."""
    if body is None:
        raise NoVersion("the event's stored body is not available")
    if "auditID" not in body and body.get("kind") not in (None, "Event") and _is_object(body):
        return body  # an object's snapshot in a bundle (kind state): the object itself
    if body.get("kind") not in (None, "Event") or "auditID" not in body:
        raise NoVersion("only audit events hold object versions")
    for field in ("responseObject", "requestObject"):
        value = body.get(field)
        if value == TOO_BIG or (isinstance(value, dict) and value.get("kind") == TOO_BIG):
            raise NoVersion(f"the apiserver left the {field} out: {TOO_BIG}")
        if _is_object(value):
            return value
    level = body.get("level") or "unknown"
    if level in ("Metadata", "None"):
        raise NoVersion(f"the audit level is {level}: requests and responses were not recorded")
    raise NoVersion("the event holds no whole object (a patch body, a status or a list)")


def _is_object(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("metadata"), dict)
            and value.get("kind") not in (None, "Status") and not value.get("kind", "").endswith(
                "List"))


def diff(before: Any, after: Any, *, fold: bool = True) -> tuple[list[dict], list[str]]:
    """Changes from ``before`` to ``after``: ``[{"path", "before", "after"}]`` in path order
    (``before``/``after`` is None where the path is absent), and the folded bookkeeping paths."""
    changes: list[dict] = []
    _walk(before, after, [], changes)
    if not fold:
        return changes, []
    folded = [c["path"] for c in changes if _is_bookkeeping(c["path"])]
    return [c for c in changes if not _is_bookkeeping(c["path"])], folded


def _is_bookkeeping(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in BOOKKEEPING)


def _walk(before: Any, after: Any, path: list[str], out: list[dict]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            _walk(before.get(key, _MISSING), after.get(key, _MISSING), [*path, str(key)], out)
        return
    if isinstance(before, list) and isinstance(after, list):
        for index in range(max(len(before), len(after))):
            _walk(before[index] if index < len(before) else _MISSING,
                  after[index] if index < len(after) else _MISSING, [*path, str(index)], out)
        return
    if before is _MISSING and after is _MISSING:
        return
    if before != after or type(before) is not type(after):
        out.append({"path": ".".join(path),
                    "before": None if before is _MISSING else before,
                    "after": None if after is _MISSING else after})
