"""Run against run: two incidents (two runs of the same test, say with the old and the new
version of a component) aligned on an anchor event, their requests matched step by step.

Pure functions over step rows (``Step``: one request, times in integer microseconds since the
epoch); ``compare_views`` reads the rows and answers HTTP.

- A step is a request (kind ``audit``), keyed by (user, verb, resource, namespace, name) and,
  when the request is on one, its subresource (a ``pods/status`` write is not the pod's write).
  The i-th occurrence of a key in run a is matched with the i-th occurrence in run b; the
  occurrences left over are only in a, or only in b.
- Offsets are milliseconds from each run's anchor (``received`` of the step minus ``received``
  of the anchor): a step in both runs has ``delta_ms`` = its offset in b minus its offset in a.
- The default anchor (``default_anchors``): among the successful (2xx) creates of a named object
  (not of a subresource) in run a, in time order, the first whose (resource, namespace, name)
  also has a successful create in run b; b's anchor is b's first such create. If no object is
  created in both, the same by (resource, name) alone: runs often make a namespace of their own.
  Without such a create either, each run's first step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..figures.build import Bar, build_gantt_figure

# Each run contributes at most this many steps, the first in time order; the answer says when
# a run had more (``truncated``): narrow them with filters.
MAX_STEPS = 10_000


class Step(NamedTuple):
    id: int
    received: int  # microseconds since the epoch
    completed: int | None
    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int | None

    @property
    def key(self) -> tuple[str, str, str, str, str, str]:
        """What matches a step with a step of the other run: user, verb, resource,
        subresource, namespace and name (a slice of the tuple: quick for 10,000 steps)."""
        return self[3:9]


def is_created(step: Step) -> bool:
    """A successful create of a named object itself (not of a subresource)."""
    return (step.verb == "create" and step.code is not None and 200 <= step.code < 300
            and bool(step.name) and not step.subresource)


def default_anchors(creates_a: Iterable[Step], creates_b: Iterable[Step], *,
                    by_namespace: bool = False) -> tuple[Step, Step] | None:
    """The default anchors (the module docstring's rule) from each run's steps in time order
    (only the creates matter, so callers may pass just those): the first create in a of an
    object (resource, name; and namespace with ``by_namespace``) also created in b, with b's
    first create of it. None when there is none."""
    def key(step: Step) -> tuple[str, ...]:
        if by_namespace:
            return step.resource, step.namespace, step.name
        return step.resource, step.name

    first_b: dict[tuple[str, ...], Step] = {}
    for step in creates_b:
        if is_created(step):
            first_b.setdefault(key(step), step)
    for step in creates_a:
        if is_created(step) and key(step) in first_b:
            return step, first_b[key(step)]
    return None


def _offset(step: Step, anchor: int) -> float:
    return (step.received - anchor) / 1000


def _side(step: Step, anchor: int) -> dict:
    return {"event": step.id, "offset_ms": _offset(step, anchor), "code": step.code,
            "duration_ms": None if step.completed is None else (step.completed - step.received)
            / 1000}


def match_steps(steps_a: Sequence[Step], steps_b: Sequence[Step], anchor_a: int,
                anchor_b: int) -> list[dict]:
    """The steps of two runs (each in time order), matched in order by key, with offsets from
    each run's anchor time (microseconds since the epoch): ``[{"user", "verb", "resource",
    "namespace", "name", "subresource", "a": {"event", "offset_ms", "code", "duration_ms"} or
    None, "b": … or None, "delta_ms": b − a offset or None}]``, ordered by the offset in a (b's
    for a step only in b), then a's order."""
    occurrences_b: dict[tuple, list[Step]] = defaultdict(list)
    for step in steps_b:
        occurrences_b[step[3:9]].append(step)
    taken: dict[tuple, int] = defaultdict(int)
    rows: list[tuple[float, int, dict]] = []
    for order, step in enumerate(steps_a):
        key = step[3:9]
        n = taken[key]
        taken[key] = n + 1
        others = occurrences_b.get(key, ())
        other = others[n] if n < len(others) else None
        a = _side(step, anchor_a)
        b = None if other is None else _side(other, anchor_b)
        rows.append((a["offset_ms"], order, _row(step, a, b)))
    for key, others in occurrences_b.items():
        for other in others[taken.get(key, 0):]:
            b = _side(other, anchor_b)
            rows.append((b["offset_ms"], len(steps_a), _row(other, None, b)))
    rows.sort(key=lambda row: (row[0], row[1]))
    return [row for _, _, row in rows]


def _row(step: Step, a: dict | None, b: dict | None) -> dict:
    return {"user": step.user, "verb": step.verb, "resource": step.resource,
            "namespace": step.namespace, "name": step.name, "subresource": step.subresource,
            "a": a, "b": b,
            "delta_ms": None if a is None or b is None else b["offset_ms"] - a["offset_ms"]}


def summarise(steps: Iterable[dict]) -> dict[str, int]:
    """How many steps are in both runs, only in a, only in b."""
    counts = {"both": 0, "only_a": 0, "only_b": 0}
    for step in steps:
        counts["both" if step["a"] and step["b"] else "only_a" if step["a"] else "only_b"] += 1
    return counts


def build_relative_gantt(steps: Sequence[Step], anchor: int) -> dict:
    """The Gantt of a run's steps (``figures.build.build_gantt_figure``: its bars, lanes and
    colours) on an axis of milliseconds from the run's anchor instead of clock time, so that two
    runs' Gantts share one axis. Hover texts are made here (``text`` of each trace), from the
    figure's label parts, with offsets instead of clock times."""
    bars = [Bar(s.id, "audit", s.received - anchor,
                None if s.completed is None else s.completed - anchor, s.verb, s.code,
                s.resource, s.namespace, s.name, s.user, "", "", "", s.subresource)
            for s in steps]
    figure = build_gantt_figure(bars, group="object", colour="verb")
    strings = figure.pop("labels")
    for trace in figure["data"]:
        labels = trace.pop("labels", None)
        if labels is None:
            trace.pop("text", None)  # lifespans: their texts are clock times
            trace["hoverinfo"] = "skip"
            continue
        parts, x = labels["parts"], trace["x"]
        text: list[str | None] = [None] * len(x)
        if labels["form"] == "bar":
            for n in range(len(parts) // 4):
                what, thing, user, took = parts[n * 4:n * 4 + 4]
                took_text = "open" if took < 0 else f"{took / 1000:.3f} ms"
                text[n * 3] = text[n * 3 + 1] = (
                    f"{x[n * 3]:+.3f} ms {strings[what]} {strings[thing]} {strings[user]} "
                    f"({took_text})")
        else:
            for n in range(len(x)):
                text[n] = f"{strings[parts[2 * n]]} by {strings[parts[2 * n + 1]]} at " \
                          f"{x[n]:+.3f} ms"
        trace["text"] = text
    layout = figure["layout"]
    layout["xaxis"] = {**layout["xaxis"], "type": "linear",
                       "title": {"text": "ms from the anchor", "standoff": 6}}
    layout["xaxis"].pop("range", None)  # the page sets one range for both runs
    return figure
