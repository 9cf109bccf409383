"""Who may see and manage a stream: members of its team see it, its editors and admins manage it
(create, cut incidents), its admins delete it, superusers do everything. Anything else answers
404."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404

from incidents.access import WRITE_ROLES, is_person, upload_teams
from incidents.models import Membership, Team

from .models import Stream


def visible_streams(user) -> QuerySet:
    if not is_person(user):
        return Stream.objects.none()
    if user.is_superuser:
        return Stream.objects.all()
    return Stream.objects.filter(team_id__in=Membership.objects.filter(user=user)
                                 .values("team_id"))


def stream_teams(user) -> QuerySet:
    """Teams the user may make streams for: those they edit or administer; every team for a
    superuser (the page and the API alike)."""
    if is_person(user) and user.is_superuser:
        return Team.objects.all()
    return upload_teams(user)


def get_visible_stream(user, pk) -> Stream:
    stream = visible_streams(user).select_related("team").filter(pk=pk).first()
    if stream is None:
        raise Http404("No such stream.")
    return stream


def can_manage(user, stream: Stream) -> bool:
    if not is_person(user):
        return False
    if user.is_superuser:
        return True
    return Membership.objects.filter(team_id=stream.team_id, user=user,
                                     role__in=WRITE_ROLES).exists()


def can_administer(user, stream: Stream) -> bool:
    if not is_person(user):
        return False
    if user.is_superuser:
        return True
    return Membership.objects.filter(team_id=stream.team_id, user=user,
                                     role=Membership.Role.ADMIN).exists()
