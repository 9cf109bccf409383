"""Decoding a file of Events into candidate objects with their line numbers.

The first non-blank line decides the syntax: JSON (one document, pretty-printed documents one
after another, JSON lines, watch streams) or a YAML stream. Every decoded value goes to the
``Collector`` with the line it starts on; what does not decode is skipped and recorded on the
report, and the good items of a broken list are salvaged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import yaml

from ..base import InputError
from .collector import Collector

try:
    _YAML_LOADER: Any = yaml.CSafeLoader
except AttributeError:  # PyYAML built without libyaml: same results, slower
    _YAML_LOADER = yaml.SafeLoader

# A document (pretty JSON, YAML) is held in memory to be parsed; beyond this it is not an export
# of Events anyone should upload whole.
MAX_DOCUMENT_BYTES = 512 * 1024**2
# A YAML list bigger than this is parsed item by item: on one document PyYAML holds the whole node
# graph (some 30 times the text) and is over twice as slow as on its items one at a time.
BIG_YAML_DOCUMENT = 4 * 1024**2
BOM = b"\xef\xbb\xbf"
# How far past a first line that is neither JSON nor YAML-like to look for a JSON line.
LOOKAHEAD_LINES = 64


def read_documents(numbered: Iterator[tuple[int, bytes]], collector: Collector,
                   tick: Callable[[int], None]) -> None:
    """Every value in ``numbered`` (line number, line) into ``collector``; ``tick(number)`` as
    lines are read. Raises ``InputError`` for a document over ``MAX_DOCUMENT_BYTES``."""
    report = collector.report
    # The first non-blank line decides: JSON starts with { or [, anything else is YAML.
    leading: list[tuple[int, bytes]] = []
    for number, line in numbered:
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        leading.append((number, line))
        if line.strip():
            break
    first = leading[-1][1].strip() if leading else b""
    json_lines = False
    if first and first[:1] not in (b"{", b"["):
        # A damaged first line must not make a file of JSON lines YAML and lose every Event in
        # it: a later line in column 0 that is a JSON value of its own says JSON lines.
        for number, line in numbered:
            leading.append((number, line))
            if line[:1] in (b"{", b"[") and _parses(line):
                json_lines = True
                break
            if len(leading) >= LOOKAHEAD_LINES:
                break
    everything = _chain(leading, numbered)

    def read_all(what: str) -> list[bytes]:
        kept: list[bytes] = []
        size = 0
        for number, line in everything:
            size += len(line)
            if size > MAX_DOCUMENT_BYTES:
                raise InputError(f"{report.source}: {what} over {MAX_DOCUMENT_BYTES} bytes; "
                                 "split it into smaller files")
            kept.append(line)
            tick(number)
        return kept

    if first in (b"{", b"["):
        # A pretty-printed document (kubectl get events -o json): one parse of the whole is the
        # common case; documents one after another, or a broken one, go line by line after all.
        text_lines = read_all("a JSON document")
        try:
            value = orjson.loads(b"".join(text_lines))
        except orjson.JSONDecodeError:
            reader = _JsonReader(collector)
            for number, line in enumerate(text_lines, start=1):
                reader.feed(number, line)
                tick(number)
            reader.finish()
        else:
            collector.visit(value, leading[-1][0])
    elif json_lines or first[:1] in (b"{", b"["):
        reader = _JsonReader(collector)  # JSON lines (or a minified document): streamed
        for number, line in everything:
            reader.feed(number, line)
            tick(number)
        reader.finish()
    elif first:
        _read_yaml(read_all("YAML"), collector)


def _parses(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _chain(first: list[tuple[int, bytes]],
           rest: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    yield from first
    yield from rest


# --- JSON ---------------------------------------------------------------------------------------


class _JsonReader:
    """JSON lines, one document, or documents one after another, read line by line.

    A line that parses alone is a value (JSON lines, or a minified document). Otherwise lines
    gather into a document until its brackets balance (counted outside strings), however it is
    indented. A line in column 0 that opens a new value ends a document that is broken: a line
    cut short, or a pretty-printed document cut short before the next one (pretty printers indent
    everything inside a document). A document that does not parse is salvaged item by item.
    Until the first value parses, all lines are kept so that a file in an unexpected layout
    (flow-style YAML) can still be read whole at the end.
    """

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.report = collector.report
        self.chunk: list[bytes] = []
        self.chunk_start = 0
        self.chunk_bytes = 0
        self.depth = 0
        self.pretty = False  # the document opened with a lone { or [ line
        self.indented: bool | None = None  # its second line is indented
        self.backup: list[bytes] | None = []
        self.backup_bytes = 0
        self.deferred: list[tuple[int, str]] = []

    def skip(self, line: int, reason: str) -> None:
        if self.backup is not None:
            self.deferred.append((line, reason))  # may be moot if the file parses whole
        else:
            self.report.skip(line, reason)

    def value(self, value: Any, line: int) -> None:
        if self.backup is not None:
            self._commit_deferred()
        self.collector.visit(value, line)

    def _commit_deferred(self) -> None:
        self.backup = None
        for line, reason in self.deferred:
            self.report.skip(line, reason)
        self.deferred = []

    def feed(self, number: int, line: bytes) -> None:
        if self.backup is not None:
            self.backup.append(line)
            self.backup_bytes += len(line)
            if self.backup_bytes > MAX_DOCUMENT_BYTES:
                self._commit_deferred()  # too big to retry whole: give up that fallback
        stripped = line.strip()
        if not stripped:
            if self.chunk:
                self.chunk.append(line)
            return
        if self.chunk:
            opens_value = line[:1] in (b"{", b"[")
            if opens_value and self.pretty and len(self.chunk) == 1 and _parses(stripped):
                # A lone brace followed by a whole value: a line cut short, not the start of
                # an unindented document (whose first item would end with a comma).
                self.chunk = []
                self.skip(self.chunk_start, "malformed JSON (a lone bracket)")
            elif not opens_value or (self.pretty and not self.indented):
                self._extend(line)
                return
            else:
                self.flush()  # a new value in column 0: the document before it is broken
        if stripped[:1] not in (b"{", b"["):
            self.skip(number, _json_reason(stripped, None))
            return
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            depth = _depth(stripped)
            if depth <= 0:
                self.skip(number, _json_reason(stripped, exc))
                return
            self.chunk, self.chunk_start, self.chunk_bytes = [line], number, len(line)
            self.depth, self.pretty, self.indented = depth, stripped in (b"{", b"["), None
            return
        self.value(value, number)

    def _extend(self, line: bytes) -> None:
        self.chunk.append(line)
        self.chunk_bytes += len(line)
        if self.chunk_bytes > MAX_DOCUMENT_BYTES:
            raise InputError(f"{self.report.source}: a JSON document over {MAX_DOCUMENT_BYTES} "
                             "bytes; split it into smaller files")
        if self.indented is None:
            self.indented = line[:1] in (b" ", b"\t")
        self.depth += _depth(line)
        if self.depth <= 0:
            self.flush()

    def flush(self) -> None:
        if not self.chunk:
            return
        try:
            value = orjson.loads(b"".join(self.chunk))
        except orjson.JSONDecodeError as exc:
            self._failed(exc)
            return
        start = self.chunk_start
        self.chunk = []
        self.value(value, start)

    def _failed(self, exc: orjson.JSONDecodeError) -> None:
        """The gathered document does not parse: keep its good items, report the rest."""
        lines, start = self.chunk, self.chunk_start
        self.chunk = []
        reason = _json_reason(b"".join(lines), exc)
        # orjson counts the end of the chunk's last line as one more line: no further than it.
        error_line = min(start + exc.lineno - 1, start + len(lines) - 1)
        items = _json_items(lines, start)
        failures = 0
        for item_start, item in items:
            try:
                value = orjson.loads(item.rstrip().rstrip(b","))
            except orjson.JSONDecodeError as item_exc:
                failures += 1
                self.skip(item_start + item_exc.lineno - 1,
                          f"list item: {_json_reason(item, item_exc)}")
                continue
            self.value(value, item_start)
        if not failures:  # the fault is outside the items (or there are none)
            self.skip(error_line, reason)

    def finish(self) -> None:
        self.flush()
        if self.backup is None or not self.backup:
            return
        # Nothing parsed line by line or as pretty documents: try the file whole.
        text = b"".join(self.backup)
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            # JSON-like YAML (flow style, comments)? Not worth PyYAML's time on a big file.
            values = _yaml_quietly(text) if len(text) <= BIG_YAML_DOCUMENT else None
            if values is None:
                self._commit_deferred()
                return
            self.deferred = []
            self.backup = None
            for document, line in values:
                self.collector.visit(document, line)
            return
        self.deferred = []
        self.backup = None
        self.collector.visit(value, 1)


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')


def _depth(line: bytes) -> int:
    """How many brackets ``line`` leaves open (negative: closes), strings not counted."""
    if b'"' in line:
        line = _JSON_STRING.sub(b"", line)
    return line.count(b"{") + line.count(b"[") - line.count(b"}") - line.count(b"]")


def _json_reason(text: bytes, exc: Exception | None) -> str:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    if exc is None:
        return "not JSON (expected an object or a list)"
    return f"malformed JSON ({str(exc).splitlines()[0][:120]})"


_ITEMS_OPEN = re.compile(rb'\s*"items"\s*:\s*\[\s*$')


def _json_items(lines: list[bytes], start: int) -> list[tuple[int, bytes]]:
    """The list items of a pretty-printed JSON array or list object, as (first line, text):
    objects opened by a lone ``{`` and closed by a ``}`` at the same indentation, or written one
    per line. Only the items of a top-level array or of an ``"items": [`` are taken, never deeper
    objects such as ``managedFields`` entries."""
    items: list[tuple[int, bytes]] = []
    armed = lines[0].strip().startswith(b"[")
    indent: bytes | None = None
    current: list[bytes] | None = None
    current_start = 0
    for offset, line in enumerate(lines[1:], start=1):
        body = line.rstrip(b"\r\n")
        stripped = body.strip()
        lead = body[: len(body) - len(body.lstrip())]
        if current is None:
            if indent is None and not armed:
                armed = _ITEMS_OPEN.match(body) is not None
            elif stripped == b"{" and (indent is None or lead == indent):
                indent = lead
                current, current_start = [line], start + offset
            elif (stripped[:1] == b"{" and stripped.rstrip(b",")[-1:] == b"}"
                  and (indent is None or lead == indent)):
                indent = lead  # one item per line
                items.append((start + offset, stripped))
            elif indent is None and stripped:
                return []  # the list does not hold objects one per lone brace
            continue
        current.append(line)
        if lead == indent and stripped in (b"}", b"},"):
            items.append((current_start, b"".join(current)))
            current = None
    if current is not None:  # cut off mid-item
        items.append((current_start, b"".join(current)))
    return items


# --- YAML ---------------------------------------------------------------------------------------

_DOC_START = re.compile(rb"---(?:[ \t]|\r?\n|$)")
_DOC_END = re.compile(rb"\.\.\.[ \t]*\r?\n?$")
_ITEMS_KEY = re.compile(rb"items:[ \t]*(?:#.*)?\r?\n?$")
_ITEM_START = re.compile(rb"( *)- ")


def _read_yaml(lines: list[bytes], collector: Collector) -> None:
    """Each document of a YAML stream on its own, so that a broken one costs only itself."""
    for start, chunk in _yaml_chunks(lines):
        _read_yaml_chunk(start, chunk, collector)


def _yaml_chunks(lines: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, lines) of each document: split at ``---`` and ``...`` in column 0,
    which YAML forbids inside a document. Directives stay with the document they precede;
    chunks of only comments and blank lines are dropped."""
    chunk: list[bytes] = []
    start = 1
    for number, line in enumerate(lines, start=1):
        if _DOC_START.match(line):
            if _has_content(chunk):
                yield start, chunk
                chunk, start = [], number
            elif not any(part.startswith(b"%") for part in chunk):
                chunk, start = [], number  # only comments before it: drop them
        chunk.append(line)
        if _DOC_END.match(line):
            if _has_content(chunk):
                yield start, chunk
            chunk, start = [], number + 1
    if _has_content(chunk):
        yield start, chunk


def _has_content(chunk: list[bytes]) -> bool:
    for line in chunk:
        stripped = line.strip()
        if stripped.startswith((b"---", b"...")):
            stripped = stripped[3:].strip()  # "--- {kind: Event}": content on the marker line
        if stripped and not stripped.startswith((b"#", b"%")):
            return True
    return False


def _yaml_problem(exc: BaseException) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"malformed YAML ({str(problem)[:120]})"


def _yaml_error_line(exc: BaseException, start: int, text: bytes) -> int:
    """The line of a YAML error; one at the end of the text (an unclosed quote or bracket) is
    put on the document's last line, not on the next document's ``---``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return start
    last = start + max(text.rstrip(b"\n").count(b"\n"), 0)
    return min(start + mark.line, last)


def _yaml_documents(text: bytes, start: int) -> Iterator[tuple[Any, int, list[int] | None]]:
    """(value, line, item lines) of each document in ``text``; raises what PyYAML raises."""
    loader = _YAML_LOADER(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            yield loader.construct_document(node), start + node.start_mark.line, _item_lines(
                node, start)
    finally:
        loader.dispose()


YAML_ERRORS = (yaml.YAMLError, ValueError, TypeError, RecursionError, OverflowError)


def _read_yaml_chunk(start: int, chunk: list[bytes], collector: Collector) -> None:
    if sum(map(len, chunk)) > BIG_YAML_DOCUMENT:
        items = _yaml_items(chunk, start)
        if items:
            _read_yaml_items(items, collector)
            return
    try:
        documents = list(_yaml_documents(b"".join(chunk), start))
    except YAML_ERRORS as exc:
        # Keep the good items of a broken list; report the document only if they are all good.
        if not _read_yaml_items(_yaml_items(chunk, start), collector):
            collector.report.skip(_yaml_error_line(exc, start, b"".join(chunk)),
                                  f"{_yaml_problem(exc)} in the document from line {start}")
        return
    for value, line, item_lines in documents:
        collector.visit(value, line, item_lines)
        collector.document_parsed()


def _read_yaml_items(items: list[tuple[int, bytes]], collector: Collector) -> int:
    """Parse list items one by one; returns how many were malformed (each reported)."""
    failures = 0
    for item_start, item in items:
        try:
            documents = list(_yaml_documents(item, item_start))
        except YAML_ERRORS as exc:
            failures += 1
            collector.report.skip(_yaml_error_line(exc, item_start, item),
                                  f"list item: {_yaml_problem(exc)}")
            continue
        for value, line, item_lines in documents:
            collector.visit(value, line, item_lines)
        collector.document_parsed()
    return failures


def _yaml_items(chunk: list[bytes], start: int) -> list[tuple[int, bytes]]:
    """The entries of a top-level ``items:`` block sequence as (first line, text), each still a
    one-item sequence (``- key: …``) so that it parses on its own."""
    items: list[tuple[int, bytes]] = []
    in_items = False
    indent: bytes | None = None
    current: list[bytes] | None = None
    current_start = 0
    for offset, line in enumerate(chunk):
        if not in_items:
            in_items = _ITEMS_KEY.match(line) is not None
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith(b"#"):
            if current is not None:
                current.append(line)
            continue
        match = _ITEM_START.match(line)
        if match and (indent is None or match.group(1) == indent):
            indent = match.group(1)
            if current is not None:
                items.append((current_start, b"".join(current)))
            current, current_start = [line], start + offset
            continue
        lead = len(line) - len(line.lstrip(b" "))
        if indent is None or lead <= len(indent):  # a sibling key of items: the list is over
            break
        if current is not None:
            current.append(line)
    if current is not None:
        items.append((current_start, b"".join(current)))
    return items


def _item_lines(node: Any, start: int) -> list[int] | None:
    """Line numbers of the items of a top-level sequence or ``items:`` sequence."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "items" and isinstance(
                    value, yaml.SequenceNode):
                return [start + item.start_mark.line for item in value.value]
    elif isinstance(node, yaml.SequenceNode):
        return [start + item.start_mark.line for item in node.value]
    return None


def _yaml_quietly(text: bytes) -> list[tuple[Any, int]] | None:
    """All documents of ``text`` as YAML, or None if it is not YAML either."""
    try:
        return [(value, line) for value, line, _ in _yaml_documents(text, 1)]
    except YAML_ERRORS:
        return None
