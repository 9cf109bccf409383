"""One Kubernetes Event object into a ``Row``: identity, times, count, the involved object (its
kind as a resource name) and the text fields, all redacted first.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime
from typing import Any

import orjson

from ..base import Report, Row
from ..redact import Redactor, may_hold_token, redact_strings

HASHED_ID = "/~"  # "~" is not allowed in a Kubernetes name: such a key is always our hash
EVENT_API_VERSIONS = frozenset(("v1", "events.k8s.io/v1", "events.k8s.io/v1beta1"))
TIME_KEYS = ("firstTimestamp", "lastTimestamp", "eventTime", "deprecatedFirstTimestamp",
             "deprecatedLastTimestamp", "series")


class RowBuilder:
    """Builds the row of each sighting of an Event; counts the timestamps it could not read."""

    def __init__(self, report: Report, redactor: Redactor) -> None:
        self.report = report
        self.redactor = redactor
        self.bad_times = 0

    def _time(self, container: dict[str, Any], key: str) -> datetime | None:
        try:
            return _parse_time(container.get(key))
        except (ValueError, TypeError, OverflowError):
            self.bad_times += 1  # one bad field does not cost the Event; noted
            return None

    def build(self, event: dict[str, Any],
              line: int) -> tuple[tuple[int, datetime, int], Row, int, bool] | None:
        """The row for one sighting of an Event, with its rank among sightings, the number of
        values redacted and whether its time is only a last time; None (recorded on the report)
        when it has no usable time."""
        # Redact first, so that the row's message is as clean as its raw JSON. Walking every
        # Event costs more than the rest of the row: the serialised form says whether to.
        raw = _dumps(event)
        redacted = 0
        if self.redactor.enabled and may_hold_token(raw):
            redacted = redact_strings(event)
            if redacted:
                raw = _dumps(event)
        meta = _mapping(event.get("metadata"), "metadata")
        involved = event.get("involvedObject")
        if involved is None:
            involved = event.get("regarding")
        involved = _mapping(involved, "involvedObject/regarding")
        source = _mapping(event.get("source"), "source")
        old_source = _mapping(event.get("deprecatedSource"), "deprecatedSource")
        series = _mapping(event.get("series"), "series")

        firsts = [self._time(event, "firstTimestamp"),
                  self._time(event, "deprecatedFirstTimestamp"),
                  self._time(event, "eventTime"), self._time(meta, "creationTimestamp")]
        lasts = [t for t in (self._time(event, "lastTimestamp"),
                             self._time(event, "deprecatedLastTimestamp"),
                             self._time(series, "lastObservedTime")) if t is not None]
        received = next((t for t in firsts if t is not None), None)
        without_first = received is None
        if received is None:
            if not lasts:
                self.report.skip(line, "Event without a usable time (no firstTimestamp, "
                                       "eventTime, lastTimestamp, series or creationTimestamp)")
                return None
            received = min(lasts)
        # firstTimestamp/lastTimestamp are whole seconds while eventTime has microseconds: a last
        # time a fraction before the first is the same instant, not a negative span.
        completed = max([received, *lasts])
        count = max((c for c in (_count(series.get("count")), _count(event.get("count")),
                                 _count(event.get("deprecatedCount"))) if c is not None),
                    default=1)

        namespace = _text(meta.get("namespace"), "metadata.namespace") or _text(
            event.get("namespace"), "namespace")
        uid = _text(meta.get("uid"), "metadata.uid")
        name = _text(meta.get("name"), "metadata.name")
        if uid:
            audit_id = f"event:{uid}"
        elif name:
            audit_id = f"event:{namespace}/{name}"
        else:
            # No identity of its own (insights-operator keeps only reason, message, times): the
            # content that does not change between sightings stands in.
            digest = hashlib.sha256(orjson.dumps(
                [involved, event.get("reason"), event.get("message"), event.get("note"),
                 event.get("type"), source, received.isoformat()],
                default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()
            audit_id = f"event:{namespace}{HASHED_ID}{digest[:20]}"

        kind = _text(involved.get("kind"), "involvedObject.kind")
        group_version = _text(involved.get("apiVersion"), "involvedObject.apiVersion")
        api_group, _, api_version = group_version.rpartition("/")
        involved_name = _text(involved.get("name"), "involvedObject.name")
        # A cluster-scoped object (Node) has no namespace though its Event lives in "default";
        # only an Event that names no object at all falls back to its own namespace.
        involved_namespace = _text(involved.get("namespace"), "involvedObject.namespace") or (
            "" if kind or involved_name else namespace)
        annotations = {}
        field_path = _text(involved.get("fieldPath"), "involvedObject.fieldPath")
        if field_path:  # spec.containers{app}: a part of the object, not an API subresource
            annotations["fieldPath"] = field_path
        action = _text(event.get("action"), "action")
        if action:
            annotations["action"] = action

        row = Row(
            audit_id=audit_id,
            received=received,
            completed=completed,
            duration_ms=(completed - received).total_seconds() * 1000.0,
            resource=_plural(kind),
            namespace=involved_namespace,
            name=involved_name,
            api_group=api_group,
            api_version=api_version,
            object_uid=_text(involved.get("uid"), "involvedObject.uid"),
            resource_version=_text(involved.get("resourceVersion"),
                                   "involvedObject.resourceVersion"),
            annotations=annotations,
            source=self.report.source,
            line=line,
            raw=raw,
            kind="event",
            message=_text(event.get("message"), "message") or _text(event.get("note"), "note"),
            reason=_text(event.get("reason"), "reason"),
            severity=_text(event.get("type"), "type"),
            component=(_text(source.get("component"), "source.component")
                       or _text(old_source.get("component"), "deprecatedSource.component")
                       or _text(event.get("reportingComponent"), "reportingComponent")
                       or _text(event.get("reportingController"), "reportingController")),
            node=(_text(source.get("host"), "source.host")
                  or _text(old_source.get("host"), "deprecatedSource.host")),
            count=count,
        )
        version = _text(meta.get("resourceVersion"), "metadata.resourceVersion")
        rank = (count, completed, int(version) if version.isdigit() else -1)
        return rank, row, redacted, without_first


def is_event(obj: Any) -> bool:
    """A core/v1 or events.k8s.io Event; items of a raw API list carry no kind of their own."""
    if not isinstance(obj, dict) or "auditID" in obj:
        return False
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if isinstance(api_version, str) and api_version.startswith("audit.k8s.io/"):
        return False
    subject = isinstance(obj.get("involvedObject"), dict) or isinstance(obj.get("regarding"), dict)
    if kind == "Event":
        return api_version is None or api_version in EVENT_API_VERSIONS or subject
    if kind is None:
        return subject or ("reason" in obj and any(key in obj for key in TIME_KEYS))
    return False


def _dumps(event: dict[str, Any]) -> bytes:
    """The Event as stored JSON; YAML may have given datetimes, dates and non-string keys."""
    return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS
                        | orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z)


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _text(value: Any, what: str) -> str:
    """A string field; YAML turns some unquoted scalars into numbers or booleans."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    raise ValueError(f"{what} is not a string")


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value) or None
    return None


def _parse_time(value: Any) -> datetime | None:
    """A timezone-aware UTC datetime from an RFC 3339 string or a YAML timestamp; None when unset
    (null, empty, or Go's zero time 0001-01-01)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):  # a YAML date without time
        parsed = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        # Python 3.11 reads "Z", offsets and more than 6 fractional digits (truncated).
        parsed = datetime.fromisoformat(value.strip())
    else:
        raise TypeError(f"timestamp {value!r} is not a string")
    if parsed.year <= 1:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


# Resource names that are not the lower-cased kind plus the English plural rules below.
IRREGULAR_PLURALS = {
    "endpoints": "endpoints",
    "securitycontextconstraints": "securitycontextconstraints",
    "podmetrics": "pods",
    "nodemetrics": "nodes",
}


def _plural(kind: str) -> str:
    """The resource name of a kind as in an audit objectRef: Pod→pods, Ingress→ingresses,
    NetworkPolicy→networkpolicies, Endpoints→endpoints; "" for no kind."""
    lower = kind.strip().lower()
    if not lower:
        return ""
    if lower in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[lower]
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    return lower + "s"
