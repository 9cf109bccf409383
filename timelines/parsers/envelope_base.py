"""What the parsers of audit events in other envelopes share: reading the whole file, finding the
JSON or YAML values in it, native events inside them, and the apiserver's reading of a request
path (for the envelopes that give a path instead of an objectRef).

Envelope files are documents (a JSON array from ``gcloud``, a CloudWatch page, an Event Hub batch,
an OTLP export) rather than logs, so they are read whole into memory, up to
``MAX_DOCUMENT_BYTES``, like the native parser's document mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import parse_qs, unquote

import orjson
import yaml

from .audit import BOM, MAX_DOCUMENT_BYTES
from .base import CountingReader, InputError, Report, open_lines

# The apiserver's RequestInfo: verbs from HTTP methods, path prefixes that are verbs, and the
# subresources of a namespace (which do not start a namespaced resource path).
VERB_OF_METHOD = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update",
                  "PATCH": "patch", "DELETE": "delete"}
SPECIAL_VERBS = frozenset(("proxy", "watch"))
NAMESPACE_SUBRESOURCES = frozenset(("status", "finalize"))
_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))  # Go's strconv.ParseBool
_WHITESPACE = re.compile(r"\s*")
_VALUE_AT_LINE_START = re.compile(r"^[\[{]", re.MULTILINE)
_YAML_DOCUMENT_START = re.compile(rb"^---(?=[ \t\r\n]|$)", re.MULTILINE)
# Lines that start a value: a JSON one (maybe indented, in a pretty-printed list), a YAML
# document, list item or key in column 0.
_JSON_START = re.compile(rb"^[ \t]*[{\[]", re.MULTILINE)
_JSON_LINE_START = re.compile(rb"^[{\[]", re.MULTILINE)
_YAML_START = re.compile(rb"^(?:---|-[ \t\r]|-$|[^\s:#{}\[\]\-][^:\r\n]*:(?:[ \t\r]|$))",
                         re.MULTILINE)


# --- reading ---------------------------------------------------------------------------------

def read_document(raw: BinaryIO, report: Report) -> tuple[bytes, CountingReader]:
    """The whole (gunzipped) content of ``raw`` without a leading BOM, and its byte counter.

    A truncated gzip keeps what came before the cut (recorded on ``report`` by ``open_lines``).
    Raises ``InputError`` over ``MAX_DOCUMENT_BYTES``: envelope exports that big are not what
    these formats are.
    """
    lines, counter = open_lines(raw, report)
    chunks: list[bytes] = []
    size = 0
    for line in lines:
        size += len(line)
        if size > MAX_DOCUMENT_BYTES:
            raise InputError(f"{report.source}: over {MAX_DOCUMENT_BYTES} bytes; envelope files "
                             "are read whole")
        chunks.append(line)
    data = b"".join(chunks)
    return data.removeprefix(BOM), counter


def json_values(data: bytes, report: Report) -> Iterator[tuple[Any, int]]:
    """``(value, line)`` for each JSON value in ``data``: one document, JSON lines, or documents
    written one after another (pretty-printed or run together, as Kinesis Firehose writes them).

    ``line`` is where the value starts. What cannot be read is recorded on ``report`` and the
    reading resumes at the next line that starts a value in column 0, so one bad document does
    not cost the rest of the file.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    else:
        yield value, _first_line(data)
        return
    # JSON lines first: orjson per line is several times faster than the stdlib's raw_decode.
    lines = data.split(b"\n")
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            # Not one value per line from here on: read the rest as a stream of documents.
            rest = b"\n".join(lines[index:]).decode("utf-8", errors="replace")
            yield from _concatenated(rest, index + 1, report)
            return
        yield value, index + 1


def _concatenated(text: str, first_line: int, report: Report) -> Iterator[tuple[Any, int]]:
    decoder = json.JSONDecoder()
    position, line, size = 0, first_line, len(text)
    while True:
        start = _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]
        line += text.count("\n", position, start)
        position = start
        if position >= size:
            return
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            report.skip(line, f"malformed JSON ({exc.msg} at line {first_line + exc.lineno - 1})")
            # Resume at the next value that starts a line in column 0.
            next_line = text.find("\n", position)
            found = _VALUE_AT_LINE_START.search(text, next_line + 1) if next_line >= 0 else None
            if found is None:
                return
            line += text.count("\n", position, found.start())
            position = found.start()
            continue
        yield value, line
        line += text.count("\n", position, end)
        position = end


def _first_line(data: bytes) -> int:
    stripped = data.lstrip()
    return data.count(b"\n", 0, len(data) - len(stripped)) + 1


class _Loader(yaml.CSafeLoader):
    """Safe YAML without implicit timestamps: a timestamp must stay the string it was written as,
    or identities (``received``) would differ from the JSON of the same entry."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers
            if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.CSafeLoader.yaml_implicit_resolvers.items()
}


def yaml_values(data: bytes, report: Report) -> Iterator[tuple[Any, int]]:
    """``(document, line)`` for each YAML document in ``data`` (``---`` separated), ``line``
    where its content starts. A document that is not valid YAML is recorded on ``report`` and
    skipped; the others are kept, because each is split off at its ``---`` before parsing."""
    starts = [0] + [m.start() for m in _YAML_DOCUMENT_START.finditer(data) if m.start() > 0]
    line = 1
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(data)
        chunk = data[start:end]
        if index:
            line += data.count(b"\n", starts[index - 1], start)
        try:
            loader = _Loader(chunk)
            try:
                documents = []
                while loader.check_node():
                    node = loader.get_node()
                    documents.append((loader.construct_document(node),
                                      line + node.start_mark.line))
            finally:
                loader.dispose()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = line + mark.line if mark is not None else line
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            report.skip(line, f"malformed YAML document ({problem} at line {where})")
            continue
        except (ValueError, TypeError) as exc:  # e.g. a non-UTF-8 document
            report.skip(line, f"unreadable YAML ({str(exc)[:120]})")
            continue
        for document, document_line in documents:
            if document is not None:
                yield document, document_line


def values_of(data: bytes, report: Report) -> Iterator[tuple[Any, int]]:
    """JSON values if the content is JSON, else YAML documents. A line in column 0 that is a
    JSON value of its own means JSON lines; otherwise the lines that start a value (``{``/``[``,
    maybe indented, for JSON; ``---``, ``- `` or ``key:`` in column 0 for YAML) decide, the more
    numerous kind winning, then the first. A damaged line, even the first, must not make a JSON
    file YAML and lose every value in it."""
    for tries, match in enumerate(_JSON_LINE_START.finditer(data)):
        end = data.find(b"\n", match.start())
        try:
            orjson.loads(data[match.start():end if end >= 0 else len(data)])
        except orjson.JSONDecodeError:
            if tries < 100:
                continue
        else:
            return json_values(data, report)
        break
    json_starts = sum(1 for _ in _JSON_START.finditer(data))
    yaml_starts = sum(1 for _ in _YAML_START.finditer(data))
    if json_starts == yaml_starts:
        first_json, first_yaml = _JSON_START.search(data), _YAML_START.search(data)
        if first_json is not None and (first_yaml is None or first_json.start()
                                       < first_yaml.start()):
            return json_values(data, report)
    elif json_starts > yaml_starts:
        return json_values(data, report)
    return yaml_values(data, report)


def native_event_bytes(text: Any) -> tuple[Any, bytes] | None:
    """A native audit event carried as a JSON string (a CloudWatch message, an AKS
    ``properties.log``, an OTLP string body): the parsed value and the exact bytes the
    apiserver wrote (what ``parse_audit`` would store for that line), or None if the string is
    not JSON. A value that is already an object (some exporters parse it) comes back with
    ``None`` bytes, to be stored re-serialised."""
    if isinstance(text, dict):
        return text, None  # type: ignore[return-value]
    if not isinstance(text, str):
        return None
    try:
        line = text.strip().encode("utf-8")
        return orjson.loads(line), line
    except (orjson.JSONDecodeError, UnicodeEncodeError):
        return None


def looks_like_native_event(value: Any) -> bool:
    """An object that claims to be an audit.k8s.io Event (whether or not it is a usable one)."""
    if not isinstance(value, dict):
        return False
    api_version = value.get("apiVersion")
    if isinstance(api_version, str) and api_version.startswith("audit.k8s.io/"):
        return True
    return "auditID" in value and "stage" in value


def count_note(counts: dict[str, int], what: str) -> str:
    """'3 records of other categories (kube-apiserver: 2, guard: 1) ...' style detail."""
    detail = ", ".join(f"{name or '(none)'}: {n}" for name, n in sorted(counts.items()))
    return f"{sum(counts.values())} {what} ({detail})"


# --- request paths -----------------------------------------------------------------------------

class RequestInfo(NamedTuple):
    """What the apiserver makes of a request path, as its audit objectRef would say it."""

    verb: str
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def request_info(uri: str, method: str) -> RequestInfo:
    """The apiserver's reading of ``method uri`` (k8s.io/apiserver RequestInfoFactory): a
    resource request under /api/v1 or /apis/<group>/<version> gives resource, namespace, name and
    subresource, and the verb (GET on a collection is list, or watch with ``watch=true``; DELETE on
    a collection is deletecollection; a ``fieldSelector=metadata.name=x`` names the object); any
    other path is a non-resource request whose verb is the lower-cased method."""
    path, _, query = uri.partition("?")
    parts = [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []
    method = method.upper()
    non_resource = RequestInfo(method.lower())
    if not parts or parts[0] not in ("api", "apis"):
        return non_resource
    current = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(current) < 3:  # /apis, /apis/<group>, /apis/<group>/<version>: discovery
            return non_resource
        group, current = current[0], current[1:]
    elif len(current) < 2:  # /api, /api/v1
        return non_resource
    version, current = current[0], current[1:]
    if current[0] in SPECIAL_VERBS:
        if len(current) < 2:
            return non_resource
        verb, current = current[0], current[1:]
    else:
        verb = VERB_OF_METHOD.get(method, method.lower())
    namespace, resource, name, subresource = object_of_parts(current,
                                                             subresources=verb != "proxy")
    if not name and verb == "get":
        options = parse_qs(query, keep_blank_values=True)
        verb = "watch" if options.get("watch", [""])[-1] in _TRUE else "list"
        name = _name_from_field_selector(options.get("fieldSelector", [""])[-1])
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb, group, version, resource, subresource, namespace, name)


def object_of_parts(parts: list[str], subresources: bool = True) -> tuple[str, str, str, str]:
    """``(namespace, resource, name, subresource)`` of the path parts after the group version
    (``namespaces/ns/pods/name/log``, ``nodes/n``, ``namespaces/ns/status``), as the apiserver
    reads them: a namespace's own subresources keep ``namespaces`` as the resource."""
    namespace = ""
    if parts and parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0] if parts else ""
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 and subresources else ""
    return namespace, resource, name, subresource


def _name_from_field_selector(selector: str) -> str:
    for term in selector.split(","):
        key, operator, value = term.partition("==") if "==" in term else term.partition("=")
        if operator and key.strip() == "metadata.name" and value and "/" not in value:
            return value.strip()
    return ""
