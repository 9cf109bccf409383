"""Redaction of secrets in audit events, applied before anything is stored.

What is replaced by ``MARKER`` (values only; keys and structure stay so that diffs still show
*that* something changed):
- Secret ``data``/``stringData`` values, in single objects and in list items;
- the copy of an object inside its ``kubectl.kubernetes.io/last-applied-configuration``
  annotation (parsed, redacted like the object itself, written back);
- ConfigMap values under keys that look like credentials, and ``key = value`` / ``key: value``
  lines inside ConfigMap values whose key looks like a credential;
- TokenReview ``spec.token``, TokenRequest ``status.token``, OpenShift Route ``spec.tls.key``;
- bearer tokens, basic credentials and JWTs in any string; ``access_token``-style query values in
  ``requestURI``;
- extra dotted paths given by configuration (``*`` matches any key or list index).

The common case, an event with nothing secret in it, must stay cheap: ``Redactor.redact`` first
looks at the raw line with one regular expression and only walks the event when it might hold
something.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

import orjson

MARKER = "[REDACTED]"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# Keys whose values are credentials ("aws_secret_access_key", "db-password", "apiToken", …).
SENSITIVE_KEY = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|credential|private[_.-]?key|api[_.-]?key|"
    r"access[_.-]?key|auth|cert(ificate)?[_.-]?key|\bkey$|[_.-]key$|dsn|conn(ection)?[_.-]?string)",
    re.IGNORECASE,
)
# One "key = value" or "key: value" line inside a ConfigMap value (properties, env files, YAML).
ASSIGNMENT_LINE = re.compile(r"^(\s*[\"']?)([\w.\-]+)([\"']?\s*[=:]\s*)(.+?)(\s*)$", re.MULTILINE)
# A JWT, or a JWS with its payload detached (``header..signature``: the bootstrap tokens'
# signatures in kube-public/cluster-info, keyed by the token's secret).
JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.(?:[A-Za-z0-9_-]{5,})?\.[A-Za-z0-9_-]*")
AUTH_HEADER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
URI_SECRET = re.compile(
    r"([?&](?:access_token|id_token|refresh_token|token|password|client_secret|code|sig|signature)=)"
    r"[^&#]*",
    re.IGNORECASE,
)
# Resources whose objects carry secrets by kind; their events are always walked.
SENSITIVE_RESOURCES = frozenset({"secrets", "configmaps", "tokenreviews", "routes",
                                 "serviceaccounts", "tokenrequests"})
# Otherwise a quick look at the raw line decides whether the walk is needed: a few case-sensitive
# substring tests cost ~1 µs a line, where a case-insensitive regular expression over many
# alternatives cost ~70 µs.
def may_hold_token(line: bytes) -> bool:
    return (b"eyJ" in line or b"earer " in line or b"asic " in line or b"EARER " in line
            or b"ASIC " in line)


# A JSON escape of a letter or a space (``\u0065``): through it a string may spell one of the
# words ``may_hold_token`` looks for in the raw line. (Go's encoder escapes <, >, &, U+2028,
# U+2029 and control characters, none of which spells them: a ConfigMap of HTML or a script
# keeps the shortcut below.)
_LETTER_ESCAPE = re.compile(rb"\\u00(?:[46][1-9a-fA-F]|[57][0-9aA]|20)")


def strings_may_hold_token(raw_line: bytes) -> bool:
    """Whether some string of the event whose line this is may hold a token (``redact_strings``
    could replace something): the raw line holds one of the words it looks for, or an escape
    that could spell one. False is certain; True may not be."""
    return may_hold_token(raw_line) or _LETTER_ESCAPE.search(raw_line) is not None


# In the raw line of a serviceaccounts event, what an object redacted by kind would show.
_REDACTED_KIND_WORDS = (b"Secret", b"ConfigMap", b"TokenReview", b"TokenRequest", b"Route",
                        b"last-applied-configuration")


def _objects_to_walk(event: dict[str, Any], ref: dict[str, Any], raw_line: bytes) -> bool:
    """For an event of a sensitive resource: whether ``redact_object`` could replace anything.
    It redacts by the kind of the request and response objects, so without either there is
    nothing; serviceaccounts are sensitive only for their token subresource (TokenRequest),
    unless an object names a redacted kind or carries a last-applied copy. A JSON escape in the
    line keeps the walk: these byte tests cannot see through it. The C scanner
    (``_auditscan.c``, ``walk_finds_objects``) applies the same rule."""
    if b"\\u" in raw_line:
        return True
    if event.get("requestObject") is None and event.get("responseObject") is None:
        return False
    if ref.get("resource") != "serviceaccounts" or ref.get("subresource") == "token":
        return True
    return any(word in raw_line for word in _REDACTED_KIND_WORDS)


class Redactor:
    """Replaces secrets in parsed audit events in place and counts what it replaced."""

    def __init__(self, extra_paths: Iterable[str] = (), enabled: bool = True) -> None:
        self.enabled = enabled
        self.extra_paths = [path.split(".") for path in extra_paths if path]

    def needs_walk(self, event: dict[str, Any], raw_line: bytes | None) -> bool:
        """Whether ``redact_event`` could find anything; cheap, runs on every stored event."""
        if not self.enabled:
            return False
        if self.extra_paths or raw_line is None:
            return True
        ref = event.get("objectRef")
        if (type(ref) is dict and ref.get("resource") in SENSITIVE_RESOURCES
                and _objects_to_walk(event, ref, raw_line)):
            return True
        uri = event.get("requestURI")
        if type(uri) is str and "=" in uri and URI_SECRET.search(uri):
            return True
        return may_hold_token(raw_line)

    def redact_event(self, event: dict[str, Any], raw_line: bytes | None = None) -> int:
        """Redact one audit event in place; returns the number of values replaced.

        ``raw_line``, the line the event was read from, spares the walk over every string
        when it shows that none holds a token (``strings_may_hold_token``): a Secret or a
        ConfigMap is redacted by its kind, and most of what it costs was that walk."""
        if not self.enabled:
            return 0
        count = 0
        uri = event.get("requestURI")
        if isinstance(uri, str) and "=" in uri:
            new_uri, n = URI_SECRET.subn(lambda m: m.group(1) + MARKER, uri)
            if n:
                event["requestURI"] = new_uri
                count += n
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") if isinstance(ref, dict) else None
        subresource = ref.get("subresource") if isinstance(ref, dict) else None
        for key in ("requestObject", "responseObject"):
            obj = event.get(key)
            if isinstance(obj, (dict, list)):
                count += redact_object(obj, resource, subresource)
        for path in self.extra_paths:
            count += _redact_path(event, path)
        # Finally any string anywhere (user.extra, annotations, messages) that carries a token.
        # What the steps above wrote holds none that the line did not (markers, and the
        # last-applied copy written back from its own strings).
        if raw_line is None or strings_may_hold_token(raw_line):
            count += redact_strings(event)
        return count


def redact_object(
    obj: Any, resource: str | None = None, subresource: str | None = None, kind: Any = None
) -> int:
    """Redact a Kubernetes object (or list, or patch body) in place; returns values replaced.

    ``kind`` stands in when the object has none (list items, patch bodies of a known resource).
    """
    if isinstance(obj, list):
        return sum(redact_object(item, resource, subresource, kind) for item in obj)
    if not isinstance(obj, dict):
        return 0
    kind = obj.get("kind") or kind or _KIND_BY_RESOURCE.get(resource or "")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(obj.get("items"), list):
        return redact_object(obj["items"], None, None, kind[: -len("List")])
    count = _redact_by_kind(obj, kind, subresource)
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict) and isinstance(annotations.get(LAST_APPLIED), str):
            try:
                applied = orjson.loads(annotations[LAST_APPLIED])
            except orjson.JSONDecodeError:
                applied = None
            if isinstance(applied, dict):
                inner = redact_object(applied, resource, subresource, kind)
                if inner:
                    annotations[LAST_APPLIED] = orjson.dumps(applied).decode()
                    count += inner
    return count


_KIND_BY_RESOURCE = {
    "secrets": "Secret",
    "configmaps": "ConfigMap",
    "tokenreviews": "TokenReview",
    "routes": "Route",
}


def _redact_by_kind(obj: dict[str, Any], kind: Any, subresource: str | None = None) -> int:
    count = 0
    if kind == "Secret" and isinstance(obj.get("op"), str) and isinstance(obj.get("path"), str):
        # One operation of a JSON Patch (RFC 6902) body: a value written under data/stringData.
        field, _, key = obj["path"].lstrip("/").partition("/")
        if field in ("data", "stringData") and "value" in obj:
            if key or not isinstance(obj["value"], dict):
                count += _replace(obj, "value")
            else:
                count += _redact_by_kind({field: obj["value"]}, "Secret")
    elif kind == "ConfigMap" and isinstance(obj.get("op"), str) and isinstance(obj.get("path"),
                                                                                 str):
        # A JSON Patch operation on a ConfigMap: judge the written value by its key.
        field, _, key = obj["path"].lstrip("/").partition("/")
        value = obj.get("value")
        if field in ("data", "binaryData") and key:
            if SENSITIVE_KEY.search(key.replace("~1", "/").replace("~0", "~")):
                count += _replace(obj, "value")
            elif isinstance(value, str):
                new_value, n = _redact_assignments(value)
                if n:
                    obj["value"] = new_value
                    count += n
        elif field in ("data", "binaryData") and isinstance(value, dict):
            count += _redact_by_kind({"data": value}, "ConfigMap")
    elif kind == "Secret":
        for field in ("data", "stringData"):
            values = obj.get(field)
            if isinstance(values, dict):
                for key, value in values.items():
                    if value not in (None, "", MARKER):
                        values[key] = MARKER
                        count += 1
    elif kind == "ConfigMap":
        for field in ("data", "binaryData"):
            values = obj.get(field)
            if isinstance(values, dict):
                for key, value in list(values.items()):
                    if not isinstance(value, str) or value in ("", MARKER):
                        continue
                    if SENSITIVE_KEY.search(key):
                        values[key] = MARKER
                        count += 1
                    elif "\n" in value or "=" in value or ":" in value:
                        new_value, n = _redact_assignments(value)
                        if n:
                            values[key] = new_value
                            count += n
    elif kind == "TokenReview":
        count += _replace(obj.get("spec"), "token")
    elif kind == "TokenRequest" or subresource == "token":
        count += _replace(obj.get("status"), "token")
    elif kind == "Route":
        tls = (obj.get("spec") or {}).get("tls") if isinstance(obj.get("spec"), dict) else None
        count += _replace(tls, "key")
    return count


# Every key that SENSITIVE_KEY matches contains one of these words: a value without any of them
# holds no credential line, and the line-by-line pass (the costliest part of redacting a
# ConfigMap) is skipped.
_SENSITIVE_WORD = re.compile(r"pass|secret|token|credential|private|key|auth|dsn|conn",
                             re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _redact_assignments(text: str) -> tuple[str, int]:
    """``text`` with the values of its credential-looking ``key = value`` lines replaced, and
    how many. Cached: a ConfigMap's values recur in every event that carries it."""
    if not _SENSITIVE_WORD.search(text):
        return text, 0
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if SENSITIVE_KEY.search(match.group(2)) and match.group(4) != MARKER:
            count += 1
            return match.group(1) + match.group(2) + match.group(3) + MARKER + match.group(5)
        return match.group(0)

    return ASSIGNMENT_LINE.sub(replace, text), count


def _replace(container: Any, key: str) -> int:
    if isinstance(container, dict) and container.get(key) not in (None, "", MARKER):
        container[key] = MARKER
        return 1
    return 0


def _redact_path(node: Any, path: list[str]) -> int:
    if not path:
        return 0
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        keys = list(node.keys()) if head == "*" else ([head] if head in node else [])
        children = [(node, k) for k in keys]
    elif isinstance(node, list):
        if head == "*":
            children = [(node, i) for i in range(len(node))]
        elif head.isdigit() and int(head) < len(node):
            children = [(node, int(head))]
        else:
            children = []
    else:
        return 0
    count = 0
    for container, key in children:
        if rest:
            count += _redact_path(container[key], rest)
        elif container[key] not in (None, "", MARKER):
            container[key] = MARKER
            count += 1
    return count


def redact_strings(node: Any) -> int:
    """Replace bearer/basic credentials and JWTs in every string under ``node`` (a dict or list),
    in place; returns the number of values replaced."""
    count = 0
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return 0
    for key, value in list(items):
        if isinstance(value, str):
            if "eyJ" in value or "earer " in value or "asic " in value:
                new_value, n = JWT.subn(MARKER, value)
                new_value, m = AUTH_HEADER.subn(lambda mt: mt.group(1) + " " + MARKER, new_value)
                if n or m:
                    node[key] = new_value
                    count += n + m
        elif isinstance(value, (dict, list)):
            count += redact_strings(value)
    return count
