"""Pages: the streams of your teams (and making one), and a stream's live view: its newest
events following the tail, and a time window cut into an incident."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from . import store
from .access import can_manage, get_visible_stream, stream_teams, visible_streams
from .cut import cut_incident
from .kubeconfig import apiserver_flags, kubeconfig


@login_required
def stream_list(request):
    made = None
    teams = stream_teams(request.user)
    if request.method == "POST":
        chosen = request.POST.get("team", "")
        team = teams.filter(pk=int(chosen)).first() if chosen.isdigit() else None
        if team is None:
            raise PermissionDenied("You may not make streams for that team.")
        try:
            hours = int(request.POST.get("retention_hours") or 24)
            stream, token = store.create_stream(request.POST.get("name", "").strip() or "stream",
                                                team, retention_hours=hours,
                                                created_by=request.user)
        except (ValueError, IntegrityError) as exc:
            messages.error(request, f"The stream was not made: {exc}")
            return redirect("streams:list")
        server = request.build_absolute_uri(reverse("stream-audit", args=[stream.pk]))
        made = {"stream": stream, "kubeconfig": kubeconfig(stream, server, token),
                "flags": " ".join(apiserver_flags())}
    visible = list(visible_streams(request.user).select_related("team"))
    if not settings.CELERY_BROKER_URL:  # the embedded default has no beat: retention runs here
        for stream in visible:
            store.apply_retention(stream)
    streams = [(s, store.summary(s)) for s in visible]
    return render(request, "streams/list.html",
                  {"streams": streams, "teams": teams, "made": made})


@login_required
def stream_detail(request, pk: int):
    stream = get_visible_stream(request.user, pk)
    return render(request, "streams/detail.html", {
        "stream": stream, "summary": store.summary(stream),
        "can_manage": can_manage(request.user, stream),
        "events_url": reverse("api:stream-event-list", args=[stream.pk]),
        "figure_url": reverse("stream-figure", args=[stream.pk]),
        "plotly_js": settings.PLOTLY_JS,
    })


@login_required
@require_POST
def stream_cut(request, pk: int):
    stream = get_visible_stream(request.user, pk)
    if not can_manage(request.user, stream):
        raise PermissionDenied("Only editors of the stream's team may cut incidents.")
    since = parse_datetime(request.POST.get("since", ""))
    until = parse_datetime(request.POST.get("until", ""))
    title = request.POST.get("title", "").strip()
    if since is None or until is None or not title or until < since:
        messages.error(request, "Give a title and a window (since before until, RFC 3339).")
        return redirect("streams:detail", pk=pk)
    queryset = store.events(stream).filter(received__gte=since, received__lte=until)
    incident = cut_incident(stream, queryset, title, request.user)
    return redirect(incident.get_absolute_url())
