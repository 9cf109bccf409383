"""HTTP side of ``timelines.analysis.compare``: the API and the run-against-run page."""

from __future__ import annotations

import gzip

import orjson
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError

from hindsight.schema import FILTERED
from incidents.access import get_visible_incident, visible_incidents
from incidents.models import Incident

from ..figures.build import EDGE_SHARE, microseconds, moment
from ..models import Event
from ..reads.queries import BadQuery
from ..store.aggregate import span_rows
from ..web.api import _ACCEPTS_GZIP, GZIP_MIN_BYTES
from . import filtered
from .compare import (
    MAX_STEPS,
    Step,
    build_relative_gantt,
    default_anchors,
    match_steps,
    summarise,
)

# the columns of a ``Step``, in its order
STEP_FIELDS = ("id", "received", "completed", "username", "verb", "resource", "subresource",
               "namespace", "name", "code")
# Parameters of the comparison, not events filters (which narrow both runs alike)
COMPARE_PARAMS = ("against", "anchor_a", "anchor_b", "figures")


class Run:
    """One side of the comparison: an incident and its filtered requests."""

    def __init__(self, incident: Incident, params) -> None:
        self.incident = incident
        try:
            self.requests = filtered(incident, params).filter(kind=Event.Kind.AUDIT).order_by(
                "received", "id")
        except BadQuery as exc:
            raise ValidationError(exc.errors) from None

    def steps(self, queryset=None, limit: int | None = None) -> list[Step]:
        queryset = self.requests if queryset is None else queryset
        if limit is not None:
            queryset = queryset[:limit]
        return [Step(*row) for row in span_rows(queryset, STEP_FIELDS)]

    def creates(self):
        return self.requests.filter(verb="create", code__gte=200, code__lt=300,
                                    subresource="").exclude(name="")

    def anchor(self, side: str, value: str) -> tuple[int, int]:
        """The (event id, received in microseconds) of the anchor given as ``anchor_<side>``:
        any event of the incident, whatever the filters; 400 otherwise."""
        if not value.isdigit():
            raise ValidationError({f"anchor_{side}": f"{value!r} is not an event id"})
        received = Event.objects.filter(incident=self.incident, pk=int(value)).values_list(
            "received", flat=True).first()
        if received is None:
            raise ValidationError({f"anchor_{side}": f"event {value} is not an event of "
                                                     f"incident {self.incident.pk}"})
        return int(value), microseconds(received)


def _anchors(run_a: Run, run_b: Run, params) -> tuple[tuple[int, int], tuple[int, int], str]:
    """Each run's anchor (event id, received in microseconds) and the rule that chose them:
    ``given``, ``first-shared-create`` or ``first-request`` (``compare`` module docstring)."""
    given_a, given_b = params.get("anchor_a", ""), params.get("anchor_b", "")
    if given_a or given_b:
        if not (given_a and given_b):
            raise ValidationError({"detail": "Give both anchor_a and anchor_b, or neither (the "
                                             "first create of an object name both runs share)."})
        return run_a.anchor("a", given_a), run_b.anchor("b", given_b), "given"
    shared = _shared_create(run_a, run_b)
    if shared is not None:
        a, b = shared
        return (a.id, a.received), (b.id, b.received), "first-shared-create"
    firsts = []
    for side, run in (("a", run_a), ("b", run_b)):
        first = run.steps(limit=1)
        if not first:
            raise ValidationError({"detail": f"Incident {run.incident.pk} (run {side}) has no "
                                             f"requests matching the filters."})
        firsts.append((first[0].id, first[0].received))
    return firsts[0], firsts[1], "first-request"


def _batches(run: Run, queryset, size: int = 500):
    """The steps of ``queryset`` in time order, in lists of ``size``: the first shared create
    usually comes early, and then the rest of a large run is never read."""
    after = None
    while True:
        page = queryset if after is None else queryset.filter(
            Q(received__gt=after[0]) | Q(received=after[0], id__gt=after[1]))
        rows = run.steps(page, limit=size)
        if rows:
            yield rows
        if len(rows) < size:
            return
        after = (moment(rows[-1].received), rows[-1].id)


def _shared_create(run_a: Run, run_b: Run) -> tuple[Step, Step] | None:
    """The default anchors (``compare.default_anchors``). The same object in both runs is
    looked up in b through the object index, a batch of a's creates at a time (a few
    milliseconds, where reading all of b's creates takes a pass over b's events: 0.3 s and more
    at 1M events); only when no object is created in both are b's creates read, for a name."""
    # batches of 50: a query of 500 alternatives took 0.25 s to plan alone
    for batch in _batches(run_a, run_a.creates(), size=50):
        objects = Q()
        for resource, namespace, name in {(s.resource, s.namespace, s.name) for s in batch}:
            objects |= Q(resource=resource, namespace=namespace, name=name)
        shared = default_anchors(batch, run_b.steps(run_b.creates().filter(objects)),
                                 by_namespace=True)
        if shared is not None:
            return shared
    creates_a = (step for batch in _batches(run_a, run_a.creates()) for step in batch)
    return default_anchors(creates_a, run_b.steps(run_b.creates()))


_SIDE = {"type": "object", "nullable": True, "properties": {
    "event": {"type": "integer"}, "offset_ms": {"type": "number"},
    "code": {"type": "integer", "nullable": True},
    "duration_ms": {"type": "number", "nullable": True}}}
_STEP = {"type": "object", "properties": {
    **{name: {"type": "string"} for name in ("user", "verb", "resource", "namespace", "name",
                                              "subresource")},
    "a": _SIDE, "b": _SIDE, "delta_ms": {"type": "number", "nullable": True}}}


@extend_schema(
    parameters=[*FILTERED,
                OpenApiParameter("against", int, required=True,
                                 description="the incident to compare with (run b)"),
                OpenApiParameter("anchor_a", int, description="an event of run a; with anchor_b"),
                OpenApiParameter("anchor_b", int, description="an event of run b; with anchor_a"),
                OpenApiParameter("figures", bool, description="add each run's Gantt")],
    responses=OpenApiResponse({"type": "object", "properties": {
        "anchor": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"},
            "rule": {"type": "string", "enum": ["given", "first-shared-create",
                                                "first-request"]},
            "a_received": {"type": "string"}, "b_received": {"type": "string"}}},
        "steps": {"type": "array", "items": _STEP},
        "summary": {"type": "object", "properties": {
            "both": {"type": "integer"}, "only_a": {"type": "integer"},
            "only_b": {"type": "integer"}}},
        "truncated": {"type": "object", "properties": {
            "a": {"type": "boolean"}, "b": {"type": "boolean"}}},
        "max_steps": {"type": "integer"},
        "figures": {"type": "object", "description": "with figures=1: a, b (Plotly) and range"},
    }}, "the two runs' steps, matched"))
@api_view(["GET"])
def compare_api(request, incident_pk: int):
    """Run against run (``timelines.analysis.compare``): this incident (run a) and ``against``
    (run b), both visible to the user (404 otherwise), aligned on ``anchor_a`` and
    ``anchor_b`` (event ids; by default the first create of an object name both runs share,
    else each run's first request). Events filters narrow both runs alike.

    ``{"anchor": {"a", "b", "rule", "a_received", "b_received"}, "steps": [{"user", "verb",
    "resource", "namespace", "name", "subresource", "a": {"event", "offset_ms", "code",
    "duration_ms"} or null, "b": … or null, "delta_ms"}], "summary": {"both", "only_a",
    "only_b"}, "truncated": {"a", "b"}, "max_steps"}``; with ``figures=1`` also ``figures``:
    each run's Gantt on one axis of milliseconds from its anchor (``a``, ``b``, ``range``)."""
    params = request.query_params
    against = params.get("against", "")
    if not against.isdigit():
        raise ValidationError({"against": "Give the id of the incident to compare with."})
    incident_a = get_visible_incident(request.user, incident_pk)
    incident_b = get_visible_incident(request.user, int(against))
    filters = params.copy()
    for name in COMPARE_PARAMS:
        filters.pop(name, None)
    run_a, run_b = Run(incident_a, filters), Run(incident_b, filters)
    (anchor_a, time_a), (anchor_b, time_b), rule = _anchors(run_a, run_b, params)
    steps_a = run_a.steps(limit=MAX_STEPS + 1)
    steps_b = run_b.steps(limit=MAX_STEPS + 1)
    truncated = {"a": len(steps_a) > MAX_STEPS, "b": len(steps_b) > MAX_STEPS}
    steps_a, steps_b = steps_a[:MAX_STEPS], steps_b[:MAX_STEPS]
    steps = match_steps(steps_a, steps_b, time_a, time_b)
    answer = {
        "anchor": {"a": anchor_a, "b": anchor_b, "rule": rule,
                   "a_received": _iso(time_a), "b_received": _iso(time_b)},
        "steps": steps,
        "summary": summarise(steps),
        "truncated": truncated,
        "max_steps": MAX_STEPS,
    }
    if params.get("figures", "").lower() in ("1", "true", "yes"):
        answer["figures"] = {"a": build_relative_gantt(steps_a, time_a),
                             "b": build_relative_gantt(steps_b, time_b),
                             "range": _common_range(steps_a, time_a, steps_b, time_b)}
    # orjson: 10,000 steps in about 15 ms, DRF's renderer takes ten times that
    response = HttpResponse(orjson.dumps(answer), content_type="application/json")
    # gzipped as the timeline's figure is (its figures make several MB at the step cap)
    patch_vary_headers(response, ["Accept-Encoding"])
    if len(response.content) >= GZIP_MIN_BYTES and _ACCEPTS_GZIP.search(
            request.META.get("HTTP_ACCEPT_ENCODING", "")):
        response.content = gzip.compress(response.content, compresslevel=1, mtime=0)
        response["Content-Encoding"] = "gzip"
    return response


def _iso(micros: int) -> str:
    return moment(micros).isoformat().replace("+00:00", "Z")


def _common_range(steps_a, time_a, steps_b, time_b) -> list[float] | None:
    """One x range (ms from the anchors) holding both runs' bars, with the Gantt's margin."""
    ends = [((s.received - anchor) / 1000, ((s.completed or s.received) - anchor) / 1000)
            for steps, anchor in ((steps_a, time_a), (steps_b, time_b)) for s in steps]
    if not ends:
        return None
    low = min(0.0, *(start for start, _ in ends))
    high = max(0.0, *(end for _, end in ends))
    margin = max((high - low) * EDGE_SHARE, 1.0)
    return [low - margin, high + margin]


@login_required
def compare_page(request, pk: int):
    """The run-against-run page: pick the other run among the incidents the user sees; the
    anchors, the two Gantts and the steps come from ``compare_api`` (static/js/compare.js)."""
    incident = get_visible_incident(request.user, pk)
    others = (visible_incidents(request.user).exclude(pk=incident.pk)
              .order_by("-created_at").values("pk", "title", "created_at"))
    against = request.GET.get("against", "")
    return render(request, "analysis/compare.html", {
        "incident": incident,
        "others": list(others[:500]),
        "against": int(against) if against.isdigit() else None,
    })
