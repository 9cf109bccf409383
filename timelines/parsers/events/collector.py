"""Events told from everything else: the latest sighting of each Event is kept, and the
report's notes say what was collapsed, ignored or guessed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..base import Report, Row
from ..redact import Redactor
from .fields import HASHED_ID, RowBuilder, is_event
from .state import StateBuilder, is_object, kindless

PROGRESS_DOCUMENTS = 256
MAX_DEPTH = 4  # lists of lists of watch events of Events: deeper nesting is not a Kubernetes shape
WATCH_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED"))


class Collector:
    """Turns parsed values into rows, keeps the latest sighting of each Event, and remembers what
    the report's notes will say."""

    def __init__(self, report: Report, redactor: Redactor,
                 heartbeat: Callable[[], None] | None = None) -> None:
        self.report = report
        self.builder = RowBuilder(report, redactor)
        self.state = StateBuilder(report, redactor)  # every other Kubernetes object
        self.heartbeat = heartbeat  # called every PROGRESS_DOCUMENTS parsed YAML documents
        self.documents = 0
        # audit_id → (rank, row, values redacted in it, whether it had no first time)
        self.best: dict[str, tuple[tuple[int, datetime, int], Row, int, bool]] = {}
        self.sightings = 0  # Events seen, usable or not
        self.built = 0  # sightings that made a row (before collapsing)
        self.others: Counter[str] = Counter()
        self.watch_errors: list[str] = []
        self.empty_lists = 0

    def visit(self, value: Any, line: int, item_lines: list[int] | None = None,
              depth: int = 0, item_kind: str = "", item_version: str = "") -> None:
        """Every Event in ``value`` (found at ``line``; ``item_lines`` are its items' lines when
        known) is added, every other Kubernetes object goes to the state rows; the rest is
        counted or reported. ``item_kind``/``item_version``: what the items of a typed List are
        when they do not say (the raw API leaves them out)."""
        if value is None:  # an empty YAML document, a null list
            return
        if depth > MAX_DEPTH:
            self.report.skip(line, "nested too deep to be Kubernetes Events")
            return
        if isinstance(value, list):
            if item_lines is None or len(item_lines) != len(value):
                item_lines = [line] * len(value)
            for item, item_line in zip(value, item_lines, strict=True):
                if item_kind and isinstance(item, dict) and "kind" not in item:
                    item = {"kind": item_kind, "apiVersion": item_version, **item}
                self.visit(item, item_line, None, depth + 1)
            return
        if not isinstance(value, dict):
            self.report.skip(line, f"not an object ({type(value).__name__})")
            return
        kind = value.get("kind")
        watch_type = value.get("type")
        if isinstance(value.get("object"), dict) and isinstance(watch_type, str) and (
                watch_type in WATCH_TYPES or watch_type in ("BOOKMARK", "ERROR")):
            self._watch_event(watch_type, value["object"], line)
        elif (isinstance(kind, str) and kind.endswith("List")) or (
                kind is None and isinstance(value.get("items"), list)):
            if not value.get("items"):
                self.empty_lists += 1
            element = kind[:-len("List")] if isinstance(kind, str) and kind != "List" else ""
            version = value.get("apiVersion")
            self.visit(value.get("items"), line, item_lines, depth + 1,
                       item_kind=element if element != "Event" else "",
                       item_version=version if isinstance(version, str) else "")
        elif is_event(value):
            self.add_event(value, line)
        elif is_object(value):
            self.state.add(value, line)
        elif kind is None and (guessed := kindless(value)) is not None:
            self.state.add(guessed, line)  # the raw API leaves kind and apiVersion out
        else:
            self.others[kind if isinstance(kind, str) and kind else "object without kind"] += 1

    def _watch_event(self, watch_type: str, obj: dict[str, Any], line: int) -> None:
        if watch_type in WATCH_TYPES and is_event(obj):
            self.add_event(obj, line)  # DELETED carries the Event's last state too
        elif watch_type in WATCH_TYPES and is_object(obj):
            self.state.add(obj, line)  # the latest sighting in the stream wins
        elif watch_type in WATCH_TYPES:
            self.others[str(obj.get("kind") or "object without kind")] += 1
        else:
            self.others[f"watch {watch_type}"] += 1
            if watch_type == "ERROR" and len(self.watch_errors) < 3:
                # A Status: e.g. 410 Gone, the stream has a gap here.
                self.watch_errors.append(f"line {line}: {obj.get('message') or obj}")

    def document_parsed(self) -> None:
        self.documents += 1
        if self.heartbeat is not None and self.documents % PROGRESS_DOCUMENTS == 0:
            self.heartbeat()

    def add_event(self, event: dict[str, Any], line: int) -> None:
        self.sightings += 1
        try:
            built = self.builder.build(event, line)
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            self.report.skip(line, f"Event with a malformed field ({exc})")
            return
        if built is None:
            return
        self.built += 1
        previous = self.best.get(built[1].audit_id)
        # Ties go to the later sighting: later in a stream is newer.
        if previous is None or built[0] >= previous[0]:
            self.best[built[1].audit_id] = built

    def rows(self) -> list[Row]:
        """The kept rows in time order; writes the notes and the redaction count."""
        kept = sorted(self.best.values(), key=lambda entry: (entry[1].received,
                                                              entry[1].audit_id))
        self.report.redacted += sum(entry[2] for entry in kept)
        notes = self.report.notes
        collapsed = self.built - len(kept)
        if collapsed > 0:
            notes.append(f"{collapsed} repeated sightings of the same Event collapsed into the "
                         "latest (highest count, then latest last time)")
        if self.others:
            total = sum(self.others.values())
            what = "object that is not a Kubernetes Event" if total == 1 else (
                "objects that are not Kubernetes Events")
            notes.append(f"{total} {what} ignored: {describe(self.others)}")
        for error in self.watch_errors:
            notes.append(f"watch stream reported an error at {error}")
        without_first = sum(1 for entry in kept if entry[3])
        if without_first:
            notes.append(f"{without_first} Events have no first time (firstTimestamp, "
                         "eventTime, creationTimestamp): placed at their last time")
        hashed = sum(1 for entry in kept if HASHED_ID in entry[1].audit_id)
        if hashed:
            notes.append(f"{hashed} Events have neither uid nor name: identified by a hash of "
                         "their content")
        if self.builder.bad_times:
            notes.append(f"{self.builder.bad_times} unparseable timestamps ignored")
        return [entry[1] for entry in kept]

    def state_rows(self, capture: datetime | None) -> list[Row]:
        """The state rows of the other objects (``state.StateBuilder``), with a note of what they
        were."""
        if not self.state:
            return []
        rows = self.state.rows(capture)
        kinds = self.state.kinds()
        snapshots = sum(row.reason == "Snapshot" for row in rows)
        self.report.notes.append(f"{snapshots} object snapshots and {len(rows) - snapshots} "
                                 f"time points of state read from {describe(kinds)}")
        return rows


def describe(counter: Counter[str]) -> str:
    return ", ".join(f"{kind} ×{n}" for kind, n in counter.most_common())
