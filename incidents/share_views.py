"""Pages for share links: ``/s/<key>/`` opens the incident it points at."""

from __future__ import annotations

from django.db.models import F
from django.http import QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .middleware import remember_link
from .sharing import ShareLink, hash_link_key

NOT_FOUND = "This share link does not exist, has been revoked or has expired."


@never_cache
@require_safe
def open_share_link(request, key: str):
    """Remember an active link in the session (no login needed) and go to its incident with the
    saved view; 404 for a link that does not exist, was revoked or has expired."""
    link = ShareLink.objects.filter(key_hash=hash_link_key(key)).first()
    if link is None or not link.active:
        return render(request, "incidents/share/gone.html", {"message": NOT_FOUND}, status=404)
    remember_link(request.session, link)
    ShareLink.objects.filter(pk=link.pk).update(use_count=F("use_count") + 1,
                                                last_used_at=timezone.now())
    return redirect(view_url(link))


def view_url(link: ShareLink) -> str:
    """The incident page with the link's saved view: its query, plus ``sequence=<id>``, opened
    at the timeline (``#timeline``), which is what the link was made to show."""
    view = link.view or {}
    query = QueryDict(view.get("query", ""), mutable=True)
    if view.get("sequence"):
        query["sequence"] = str(view["sequence"])
    url = reverse("incidents:detail", args=[link.incident_id])
    return f"{url}?{query.urlencode()}#timeline" if query else f"{url}#timeline"
