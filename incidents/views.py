"""Pages: the incident list and the incident page (uploads with live progress, events table)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from timelines.figures.build import KIND_COLOURS, OUTCOME_COLOURS
from timelines.figures.lanes import GROUPS
from timelines.ingest import create_upload
from timelines.models import Event
from timelines.reads.filters import EventFilterSet
from timelines.tasks import enqueue_ingest, requeue_lost_purges, requeue_stale_uploads

from .access import (
    can_administer,
    can_upload,
    can_write,
    get_visible_incident,
    upload_teams,
    visible_incidents,
)
from .models import Incident, IncidentGone, Team, Upload

PAGE_ROWS = 100
# The filters the incident page's form shows (since/until, the window, have their own inputs);
# any other EventFilterSet parameter in the URL is kept as a hidden input. Those of MORE_FILTERS
# sit behind "More filters" (open when one has a value), so that the timeline starts higher.
FILTER_INPUTS = ["q", "kind", "resource", "subresource", "namespace", "name", "user", "group",
                 "impersonated_user", "verb", "code", "reason", "node", "source"]
MORE_FILTERS = ("subresource", "group", "impersonated_user", "reason", "node", "source")
FILTER_LABELS = {"q": "Text", "impersonated_user": "As user", "source": "Source file"}
# Parameters of the page that are not event filters: the table's cursor, the Gantt's lanes and
# colour, the selected event, the chosen sequence, the table-only request of the timeline
# script, and ``window=all`` (the whole span chosen over the suggested first window).
VIEW_PARAMS = ("after", "lanes", "colour", "event", "sequence", "partial", "window")


@login_required
def incident_list(request):
    if not settings.CELERY_BROKER_URL:
        requeue_lost_purges()  # embedded mode has no beat; a deletion comes back here
    incidents = (visible_incidents(request.user).select_related("team")
                 .annotate(upload_count=Count("uploads", filter=Q(uploads__parent=None)),
                           # a bundle already sums its files
                           event_count=Sum("uploads__new_events",
                                           filter=Q(uploads__parent=None))))
    teams = list(_creation_teams(request.user))
    own = upload_teams(request.user).order_by("name").first()
    return render(request, "incidents/list.html", {
        "incidents": incidents,
        "teams": teams,
        # preselected: the user's own (first) team; for a superuser in none, no team
        "team_selected": own.pk if own else None,
        "max_upload_bytes": settings.MAX_UPLOAD_BYTES,
    })


def _creation_teams(user):
    """The teams a new incident may be given: those in which the user is an editor or admin;
    every team for a superuser, who may also make one without a team."""
    return (Team.objects.all() if user.is_superuser else upload_teams(user)).order_by("name")


@login_required
@require_POST
def incident_create(request):
    title = request.POST.get("title", "").strip()
    files = request.FILES.getlist("file")
    if not title:
        messages.error(request, "Give the incident a title.")
        return redirect("incidents:list")
    team = None
    team_id = request.POST.get("team", "")
    if team_id:
        team = _creation_teams(request.user).filter(pk=team_id).first() if (
            team_id.isdigit()) else None
        if team is None:
            raise PermissionDenied("You may not create incidents in that team.")
    elif not request.user.is_superuser:
        team = upload_teams(request.user).first()
        if team is None:
            raise PermissionDenied("You belong to no team that may create incidents.")
    incident = Incident.objects.create(title=title[:300], team=team, created_by=request.user)
    _accept_files(request, incident, files)
    return redirect(incident)


@login_required
@require_POST
def upload_create(request, pk):
    incident = get_visible_incident(request.user, pk)
    if not can_upload(request.user, incident):
        raise PermissionDenied("You may not upload to this incident.")
    _accept_files(request, incident, request.FILES.getlist("file"))
    return redirect(incident)


def _accept_files(request, incident: Incident, files) -> None:
    for received in files:
        if received.size > settings.MAX_UPLOAD_BYTES:
            messages.error(request, f"{received.name}: {received.size} bytes is more than the "
                                    f"{settings.MAX_UPLOAD_BYTES} bytes this server accepts.")
            continue
        try:
            enqueue_ingest(create_upload(incident, received, request.user).pk)
        except IncidentGone:
            raise Http404("No such incident: it has been deleted.") from None


@login_required
def incident_detail(request, pk):
    incident = get_visible_incident(request.user, pk)
    table = _events_table(request, incident)
    if request.GET.get("partial") == "events":
        # the timeline script swaps in the table of a new time window without a reload
        return render(request, "incidents/partials/events_table.html",
                      {"incident": incident, **table})
    if not settings.CELERY_BROKER_URL:
        requeue_stale_uploads()  # embedded mode has no beat to do it
    uploads = list(incident.uploads.filter(parent=None))
    bundles = {u.pk: _bundle_summary(u) for u in uploads if u.format == "bundle"}
    for upload in uploads:
        upload.bundle = bundles.get(upload.pk)
    shown = {*FILTER_INPUTS, "since", "until"}
    any_running = any(not u.finished for u in uploads)
    any_failed = any(u.status == Upload.Status.FAILED for u in uploads)
    return render(request, "incidents/detail.html", {
        "incident": incident,
        "uploads": uploads,
        "any_running": any_running,
        # the page polls these: being read, or analysed behind their first answer
        "any_incomplete": any(not u.complete for u in uploads),
        "any_failed": any_failed,
        # while uploads run or have failed, the finished ones are folded away behind "show all"
        "fold_settled": (any_running or any_failed) and any(
            u.finished and u.status != Upload.Status.FAILED for u in uploads),
        "status_counts": sorted(Counter(u.status for u in uploads).items()),
        "can_upload": can_upload(request.user, incident),
        # annotate, build sequences, share: the page shows these controls to writers only
        "can_write": can_write(request.user, incident),
        # rename, move, delete: to admins of its team and superusers only
        **_administration(request.user, incident),
        # where the notes scripts find one annotation, sequence or share link (append "<id>/")
        "api_prefixes": {name: reverse(f"api:{route}", args=[0])[:-len("0/")]
                         for name, route in (("annotation", "annotation-detail"),
                                             ("sequence", "sequence-detail"),
                                             ("share_link", "share-link-detail"))},
        **table,
        # one input per value, so a repeated parameter (verb=get&verb=list) survives a submit
        "filter_inputs": [(name, FILTER_LABELS.get(name, name.replace("_", " ").capitalize()),
                           request.GET.getlist(name) or [""], name in MORE_FILTERS)
                          for name in FILTER_INPUTS],
        "more_filters_open": any(request.GET.get(name) for name in (*MORE_FILTERS, "since",
                                                                     "until")),
        "hidden_filters": [(name, value) for name in EventFilterSet.base_filters
                           if name not in shown for value in request.GET.getlist(name)],
        "gantt_groups": list(GROUPS.items()),
        "gantt_colours": [("verb", "verb"), ("outcome", "outcome")],
        # the colours of outcomes and kinds, as the Gantt draws them, for the overview strip
        "timeline_colours": {**OUTCOME_COLOURS, **KIND_COLOURS},
        "gantt_group": request.GET.get("lanes", "object"),
        "gantt_colour": request.GET.get("colour", "verb"),
        # stored events: also of files whose analyses are still running (stage ready)
        "event_total": sum(u.new_events for u in uploads if u.status == Upload.Status.DONE
                           or u.stage == Upload.Stage.READY),
    })


def _administration(user, incident: Incident) -> dict:
    """What the page's rename, move and delete controls need, for those who may use them: the
    teams it may be moved to (every other team for a superuser; for a team admin the teams in
    which they are an editor or admin, so that they keep working on it: giving it to a team they
    are not in is for the API, which takes any team by name), and what a deletion takes with it,
    said in the dialog that confirms it."""
    if not can_administer(user, incident):
        return {"can_administer": False}
    return {
        "can_administer": True,
        "move_teams": list(_creation_teams(user).exclude(pk=incident.team_id)),
        "deletion": {"annotations": incident.annotations.count(),
                     "sequences": incident.sequences.count(),
                     "share_links": incident.share_links.count(),
                     "bundle_files": incident.uploads.exclude(parent=None).count()},
    }


def _mark_detections(incident: Incident, events: list) -> None:
    """``event.detections``: the Falco rules (``timelines.detections``) that matched each event
    of the page, by name, in one query."""
    from timelines.detections.models import DetectionMatch

    rules: dict[int, list[str]] = {}
    if events:
        for event_id, rule in DetectionMatch.objects.filter(
                incident_id=incident.pk, event_id__in=[e.pk for e in events]).order_by(
                "rule").values_list("event_id", "rule"):
            rules.setdefault(event_id, []).append(rule)
    for event in events:
        event.detections = rules.get(event.pk, [])


def _events_table(request, incident: Incident) -> dict:
    """The context of the events table: a keyset page of the filtered events, the query of the
    next page, the filter errors, and the filters alone (for the export links)."""
    filterset = EventFilterSet(request.GET, queryset=Event.objects.filter(incident=incident))
    events, next_after, error = [], None, None
    if filterset.is_valid():
        queryset = filterset.qs.order_by("received", "id")
        after = _parse_after(request.GET.get("after", ""))
        if after:
            queryset = queryset.filter(Q(received__gt=after[0]) |
                                       Q(received=after[0], id__gt=after[1]))
        events = list(queryset[:PAGE_ROWS + 1])
        if len(events) > PAGE_ROWS:
            events = events[:PAGE_ROWS]
            last = events[-1]
            query = request.GET.copy()
            query.pop("partial", None)
            query["after"] = f"{last.received.isoformat()}|{last.pk}"
            next_after = query.urlencode()
    else:
        error = filterset.errors
    _mark_detections(incident, events)
    filters = request.GET.copy()
    for name in VIEW_PARAMS:
        filters.pop(name, None)
    return {
        "filterset": filterset,
        "filter_error": error,
        "events": events,
        "next_query": next_after,
        "filter_query": filters.urlencode(),
    }


def _bundle_summary(bundle: Upload) -> dict:
    """What the incident page shows of a bundle's files: counts by status and by format, and
    the files that failed or were not used, with why (the first 200)."""
    files = bundle.files.all()
    return {
        "by_status": sorted(Counter(files.values_list("status", flat=True)).items()),
        "by_format": Counter(files.filter(Q(status=Upload.Status.DONE)
                                          | Q(stage=Upload.Stage.READY))
                             .values_list("format", flat=True)).most_common(),
        "problems": list(files.exclude(status=Upload.Status.DONE)
                         .exclude(status__in=[Upload.Status.PENDING, Upload.Status.RUNNING])
                         .order_by("-status", "pk").values("name", "status", "message")[:200]),
    }


def _parse_after(value: str):
    if "|" not in value:
        return None
    stamp, _, pk = value.rpartition("|")
    try:
        return datetime.fromisoformat(stamp), int(pk)
    except ValueError:
        raise Http404("Bad page cursor.") from None
