"""Share links in the browser session: who the request is, re-decided on every request."""

from __future__ import annotations

from datetime import timedelta

from django.http import HttpResponseForbidden, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from .access import LinkHolder
from .sharing import ShareLink

SESSION_KEY = "hindsight_share_links"  # ids of the share links this session has opened
MAX_LINKS = 20
LAST_USED_RESOLUTION = timedelta(minutes=1)  # avoid a write on every request
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
READ_ONLY = "A share link gives read-only access."
GONE = "The share link this browser was using has been revoked or has expired."


class ShareLinkMiddleware:
    """For a session that opened share links (``/s/<key>/``), re-validate the links on every
    request, so that revoking one, or its expiry, takes effect at once:

    - a session that is not logged in becomes a ``LinkHolder``: it reads the linked incidents
      and nothing else, and any unsafe method but logging in or out is refused (403);
    - a logged-in user keeps their identity and also reads the linked incidents;
    - links that were revoked, expired or deleted leave the session; when that leaves a
      session that is not logged in with none, this one request answers 404 saying so, and the
      next ones are plainly anonymous.

    Must come after ``AuthenticationMiddleware``."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        ids = request.session.get(SESSION_KEY)
        if ids:
            refused = self._apply(request, ids)
            if refused is not None:
                return refused
        return self.get_response(request)

    def _apply(self, request, ids: list[int]):
        now = timezone.now()
        links = sorted((link for link in ShareLink.objects.filter(pk__in=ids) if link.active),
                       key=lambda link: ids.index(link.pk))
        if len(links) != len(ids):
            request.session[SESSION_KEY] = [link.pk for link in links]
        stale = [link.pk for link in links
                 if link.last_used_at is None or now - link.last_used_at > LAST_USED_RESOLUTION]
        if stale:
            ShareLink.objects.filter(pk__in=stale).update(last_used_at=now)
        if request.user.is_authenticated:
            request.user.shared_incident_ids = frozenset(link.incident_id for link in links)
            return None
        if not links:
            # said once, unless the browser is logging in or opening another link
            return None if _exempt(request) else _answer(request, 404, GONE)
        holder = LinkHolder(links)
        request.user = holder

        async def auser():
            return holder

        request.auser = auser
        if request.method not in SAFE_METHODS and not _exempt(request):
            return _answer(request, 403, READ_ONLY)
        return None


def _exempt(request) -> bool:
    """Logging in or out, and opening a share link."""
    return (request.path in (reverse("login"), reverse("logout"))
            or request.path.startswith(reverse("incidents:share", args=["x"])[:-2]))


def remember_link(session, link: ShareLink) -> None:
    """Add a link to the session's (the last opened goes last; the oldest beyond
    ``MAX_LINKS`` are forgotten)."""
    ids = [pk for pk in session.get(SESSION_KEY, []) if pk != link.pk]
    session[SESSION_KEY] = [*ids, link.pk][-MAX_LINKS:]


def _answer(request, status: int, message: str):
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=status)
    if status == 403:
        return HttpResponseForbidden(message, content_type="text/plain; charset=utf-8")
    return render(request, "incidents/share/gone.html", {"message": message}, status=status)
