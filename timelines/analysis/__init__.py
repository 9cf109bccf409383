"""The analysis part of the read side: questions a reviewer would otherwise answer by reading
the timeline by eye, computed from the stored events.

- ``stats``: request time by user, user agent, verb, resource, namespace or code, and requests
  in flight over time (``GET /api/v1/incidents/{id}/stats/``, the statistics page);
- ``insights``: findings computed once per data version and stored (LISTs served from etcd,
  slow requests, deletions, re-created objects, error bursts, conflicting writers, audit
  coverage; on bundles, with ``findings`` and ``states``: crashed containers, OOM kills,
  unschedulable pods, failing mounts, probes and image pulls, bad node, operator and workload
  conditions, repeated and bursting Events, error log lines; ``GET
  /api/v1/incidents/{id}/insights/``, the incident page's insights panel);
- ``pods``: each pod's created, scheduled, started, ready, finished and deleted times
  (``GET /api/v1/incidents/{id}/pods/``, the pod phases page);
- ``compare``: two runs aligned on an anchor event, their steps matched in order
  (``GET /api/v1/incidents/{a}/compare/?against={b}``, the run-against-run page);
- ``history``: everything about one object in order (``GET /api/v1/incidents/{id}/history/``).
- ``registry``: what runs behind the first answer once an incident's uploads are ready (the column
  index, overview, insights, pod facts), registered in one place (``after_ready``).

Each module is pure functions over rows where it can be; its ``*_views`` module is the HTTP
side. They select events with ``filtered``: the events API's filters and access rules.
"""

from __future__ import annotations

from django.http import QueryDict

from incidents.models import Incident

from ..models import Event
from ..reads.filters import EventFilterSet
from ..reads.queries import BadQuery


def filtered(incident: Incident, params: QueryDict):
    """The incident's events matching the events API's filters in ``params`` (parameters that
    are not filters are ignored); raises ``BadQuery`` when they do not validate."""
    filterset = EventFilterSet(params, queryset=Event.objects.filter(incident=incident))
    if not filterset.is_valid():
        raise BadQuery(filterset.errors)
    return filterset.qs
