"""Who may do what with an incident."""

from __future__ import annotations

from django.http import Http404

from .models import Incident, Membership, Team

WRITE_ROLES = (Membership.Role.EDITOR, Membership.Role.ADMIN)


def get_visible_incident(user, pk) -> Incident:
    """The incident if the user may see it; 404 otherwise (never a hint that it exists)."""
    incident = Incident.objects.visible_to(user).filter(pk=pk).first()
    if incident is None:
        raise Http404("No such incident.")
    return incident


def can_upload(user, incident: Incident) -> bool:
    if user.is_superuser:
        return True
    return incident.team_id is not None and Membership.objects.filter(
        team_id=incident.team_id, user=user, role__in=WRITE_ROLES).exists()


def upload_teams(user):
    """Teams in which the user may create incidents."""
    return Team.objects.filter(memberships__user=user, memberships__role__in=WRITE_ROLES)
