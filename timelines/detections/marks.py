"""What the timeline figure marks as detected: the rules (with their priority and severity) that
matched each drawn event, for ``figures.build.build_gantt_figure``'s ``detections``.

One query over the stored matches (``DetectionMatch``) of the figure's events, by the leading
columns of their index; nothing more when none of them was detected, which is most figures.
The priorities come from the rules the team's incidents are evaluated with, and only when some
drawn event was detected (``rules.load`` keeps a rule set once read, so that is one small query
of the added rules files).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db.models import QuerySet

from . import rules
from .models import DetectionMatch


def detected(incident_ids: Iterable[int] | QuerySet, event_ids: Sequence[int],
             ) -> dict[int, list[str]]:
    """The rules that matched each of ``event_ids`` (events of ``incident_ids``: ids, or a
    queryset of them, which becomes a subquery), by event id, sorted; events no rule matched are
    left out. One query (the matches from the least id to the greatest), none without events;
    the ids are only looked at again when some match came back."""
    if not event_ids:
        return {}
    matches = list(DetectionMatch.objects.filter(
        incident_id__in=incident_ids, event_id__gte=min(event_ids),
        event_id__lte=max(event_ids)).values_list("event_id", "rule"))
    if not matches:
        return {}
    wanted = set(event_ids)
    found: dict[int, set[str]] = {}
    for event_id, rule in matches:
        if event_id in wanted:
            found.setdefault(event_id, set()).add(rule)
    return {event_id: sorted(names) for event_id, names in found.items()}


def rule_priorities(team_id: int | None) -> dict[str, str]:
    """Each rule's priority (``WARNING``, …) in the rules a team's incidents are evaluated with
    (``incident.ruleset_of_team``): the shipped rules, then the instance's and the team's."""
    from .incident import ruleset_of_team  # it imports the analyses, which import the figure's

    return {rule.name: rule.priority for rule in ruleset_of_team(team_id).rules}


def detection_marks(incident_ids: Iterable[int] | QuerySet, team_id: int | None,
                    bars: Iterable[Sequence]) -> dict[int, list[tuple[str, str, str]]]:
    """``build_gantt_figure``'s ``detections`` for ``bars`` (``figures.build.Bar``s, or rows of
    their fields) of ``incident_ids``: event id → ``(rule, priority, severity)`` of each rule
    that matched it, the most severe first (then by name). A rule the team's rules no longer
    hold keeps its name, with an empty priority and severity ``info``."""
    found = detected(incident_ids, [bar[0] for bar in bars])
    if not found:
        return {}
    priorities = rule_priorities(team_id)
    marks = {}
    for event_id, names in found.items():
        ranked = []
        for name in names:
            priority = priorities.get(name, "")
            rank = rules.PRIORITIES.index(priority) if priority else len(rules.PRIORITIES)
            ranked.append((rank, name, priority,
                           rules.severity_of(priority) if priority else "info"))
        marks[event_id] = [(name, priority, severity)
                           for _, name, priority, severity in sorted(ranked)]
    return marks
