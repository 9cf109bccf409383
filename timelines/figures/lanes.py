"""What a lane is: the row of the timeline an event is drawn on, in each grouping.

One rule, read by every side that names lanes: the Gantt and the heatmap
(``timelines.figures.build``), the database's count per lane (``timelines.store.aggregate``, from
``LANE_SQL``), the column index (``timelines.store.columns``) and the API's ``lanes`` parameter.

- ``object``: ``resource/namespace/name`` (the non-empty parts), an event without a resource
  on ``(kind)`` and its namespace and name;
- ``actor``: the user, or ``(kind)``;
- ``user_agent`` and ``source``: the field, or ``(none)``.

A heatmap shows the most active lanes and sums the others into one ``OTHER_LANES`` row; a lane
name longer than ``LABEL_CHARS`` is shortened in the middle for its tick label
(``short_label``; ``short_labels`` keeps the labels of a figure's lanes apart), and kept whole
in the figure's ``lanes``.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

# grouping (the API's ``lanes`` parameter) → its label on the page
GROUPS = {"object": "object", "actor": "actor", "user_agent": "user agent",
          "source": "source file"}
OTHER_LANES = "(other lanes)"
# Lane labels longer than this are shortened in the middle (the resource and the object's name
# stay readable); the figure's ``lanes`` keeps the full names, which the page shows on hover.
LABEL_CHARS = 44

# ``lane_name`` in SQL, per grouping: the lane's three parts for events that have the
# grouping's own column, the condition for those events, and the parts for the others (named
# after their kind). The lane is its non-empty parts joined by "/".
LANE_SQL = {
    "object": (("resource", "namespace", "name"), "resource <> ''",
               ("'(' || kind || ')'", "namespace", "name")),
    "actor": (("username", "''", "''"), "username <> ''", ("'(' || kind || ')'", "''", "''")),
    "user_agent": (("CASE WHEN user_agent = '' THEN '(none)' ELSE user_agent END", "''", "''"),
                   None, None),
    "source": (("CASE WHEN source = '' THEN '(none)' ELSE source END", "''", "''"), None, None),
}


class Laned(Protocol):
    """What names a lane: the fields of ``build.Span`` and ``build.Bar`` that lanes read
    (a protocol, so that the rule of lanes does not import the figures that use it)."""

    kind: str
    resource: str
    namespace: str
    name: str
    user: str
    user_agent: str
    source: str


def lane_of(span: Laned, group: str) -> str:
    """The lane of a span or bar in a grouping."""
    return lane_name(group, span.kind, span.resource, span.namespace, span.name, span.user,
                     span.user_agent, span.source)


# The value of a field that an event does not have (an empty text, no code): what the lanes and
# the page's facets show for it, and what a filter asks for to select such events
# (``?namespace=(none)``: the requests of cluster-scoped objects, and the logs;
# ``timelines.reads.filters``). An empty value in a query is no filter, as a form submits its
# empty inputs.
NONE = "(none)"


def lane_name(group: str, kind: str, resource: str, namespace: str, name: str, user: str,
              user_agent: str, source: str) -> str:
    """The lane of an event in a grouping, from its fields."""
    if group == "actor":
        return user or f"({kind})"
    if group == "user_agent":
        return user_agent or NONE
    if group == "source":
        return source or NONE
    lane = resource or f"({kind})"
    if namespace:
        lane = f"{lane}/{namespace}"
    if name:
        lane = f"{lane}/{name}"
    return lane


def short_label(name: str, limit: int = LABEL_CHARS) -> str:
    """A lane's name shortened in the middle to ``limit`` characters, keeping more of its end
    (an object's name) than of its start (the resource)."""
    if len(name) <= limit:
        return name
    head = (limit - 1) * 2 // 5
    return f"{name[:head]}…{name[len(name) - (limit - 1 - head):]}"


def short_labels(names: list[str], limit: int = LABEL_CHARS) -> list[str]:
    """The tick labels of lanes: each one's ``short_label``, unless two lanes would show the
    same, as the static pods of a must-gather do (``pods/openshift-kube-apiserver/
    kube-apiserver-ip-10-0-1-2.ec2.internal`` and ``pods/openshift-kube-controller-manager/
    kube-controller-manager-ip-10-0-1-2.ec2.internal`` both gave ``pods/openshift-ku…-10-0-1-2
    .ec2.internal``). Those drop what lies between the resource and the object's name first
    (``pods/…/kube-apiserver-ip-…``), else keep only the end (``…`` and as much of it as
    fits), else by the fewest parts that tell each apart (a log file's path: ``…/kube-
    apiserver-ip-…``, the pod's part). Where no way tells a whole group apart, each lane that
    one does tell apart takes that label; lanes that still look alike keep theirs, and their
    hover text tells them apart."""
    labels = [short_label(name, limit) for name in names]
    groups: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(label, []).append(index)
    taken = set(labels)
    for label, indexes in groups.items():
        if len(indexes) < 2:
            continue
        group = [names[i] for i in indexes]
        told = _differing(group, limit)
        for tried in ([_without_middle(name, limit) for name in group],
                      [_end_only(name, limit) for name in group], told):
            if len(set(tried)) == len(tried) and not (set(tried) - {label}) & taken:
                for index, new in zip(indexes, tried, strict=True):
                    labels[index] = new
                taken.update(tried)
                break
        else:  # no way tells them all apart: each that one tells apart takes its label
            count = Counter(told)
            for index, new in zip(indexes, told, strict=True):
                if count[new] == 1 and new not in taken:
                    labels[index] = new
                    taken.add(new)
    return labels


def _without_middle(name: str, limit: int) -> str:
    parts = name.split("/")
    if len(parts) < 3:
        return short_label(name, limit)
    return short_label(f"{parts[0]}/…/{parts[-1]}", limit)


def _end_only(name: str, limit: int) -> str:
    return name if len(name) <= limit else "…" + name[len(name) - (limit - 1):]


def _differing(group: list[str], limit: int) -> list[str]:
    """Each name by the fewest of its parts (between slashes) that tell it from the others of
    the group, deepest first: a container's ``…/logs/current.log`` on each node by its pod's
    part (``…/kube-apiserver-ip-10-0-1-2.ec2.internal``), whichever component's it is."""
    if len(group) > _MOST_TOLD_APART:
        return group
    parts = [name.split("/") for name in group]
    return [short_label("…/" + "/".join(parts[k][i] for i in _telling(parts, k)), limit)
            for k in range(len(parts))]


# Beyond so many lanes alike, telling each apart (a test of every pair) is not tried.
_MOST_TOLD_APART = 200


def _telling(parts: list[list[str]], k: int) -> list[int]:
    """The positions of ``parts[k]`` that tell it from every other name: greedily the one
    that differs from the most names still alike, the deepest of equals."""
    mine = parts[k]
    alike = [p for j, p in enumerate(parts) if j != k]
    chosen: list[int] = []
    while alike:
        position, told = max(
            ((i, sum(len(p) <= i or p[i] != mine[i] for p in alike)) for i in range(len(mine))),
            key=lambda pair: (pair[1], pair[0]))
        if not told:  # the same parts (a name that is a prefix of another): nothing tells
            break
        chosen.append(position)
        alike = [p for p in alike if len(p) > position and p[position] == mine[position]]
    return sorted(chosen)
