"""Who may do what with an incident: the one place that decides visibility and write rights.

Roles, strongest first: ``admin`` (of the owning team), ``editor``, ``viewer``. A user's role on an
incident is the strongest of:

- their membership role in the incident's team;
- for each team of theirs the incident is granted to, the weaker of the grant's role and their
  membership role (a viewer of a team granted ``editor`` stays a viewer; a grant never makes an
  admin);
- ``viewer`` for incidents opened in this browser session through a share link.

Superusers are admins of every incident. An incident without a team is visible to superusers
only, until someone gives it to a team. The incidents that hold a stream's slots
(``streams.models.Segment``) are no one's: they are read and deleted through their stream only.
"""

from __future__ import annotations

from django.apps import apps
from django.contrib.auth.models import AnonymousUser
from django.db.models import Q, QuerySet
from django.http import Http404

from .models import Incident, Membership, Team
from .sharing import IncidentGrant

WRITE_ROLES = (Membership.Role.EDITOR, Membership.Role.ADMIN)
RANK = {Membership.Role.VIEWER: 1, Membership.Role.EDITOR: 2, Membership.Role.ADMIN: 3}


class LinkHolder(AnonymousUser):
    """The principal of a browser session that is not logged in but opened share links: it
    reads the linked incidents and nothing else, and writes nothing. Set as ``request.user`` by
    ``incidents.middleware.ShareLinkMiddleware``; like ``AnonymousUser`` it has no ``pk``, no
    memberships and no permissions, but it is authenticated (so ``login_required`` pages and
    DRF's ``IsAuthenticated`` let it read)."""

    is_link_holder = True
    is_active = True  # DRF's SessionAuthentication ignores inactive users

    def __init__(self, share_links) -> None:
        self.share_links = list(share_links)

    @property
    def share_link(self):
        """The link opened last."""
        return self.share_links[-1] if self.share_links else None

    @property
    def username(self) -> str:  # type: ignore[override]
        link = self.share_link
        return f"link:{link.prefix}" if link else "link"

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def is_anonymous(self) -> bool:
        return False

    @property
    def shared_incident_ids(self) -> frozenset[int]:
        return frozenset(link.incident_id for link in self.share_links)

    def __str__(self) -> str:
        return self.username


def is_person(user) -> bool:
    """A logged-in account (or a token's user), as opposed to anonymous or a share link."""
    return bool(user.is_authenticated) and not getattr(user, "is_link_holder", False)


def shared_incident_ids(user) -> frozenset[int]:
    """Incidents opened through share links in this session (set by the middleware)."""
    return frozenset(getattr(user, "shared_incident_ids", ()) or ())


def stream_slot_ids() -> QuerySet:
    """The ids of the incidents that hold a stream's slots (a subquery)."""
    return apps.get_model("streams", "Segment").objects.values("incident_id")


def slot_owner(incident_id):
    """The ``Segment`` (with its stream) held by this incident, or None for an ordinary one."""
    try:
        incident_id = int(incident_id)
    except (TypeError, ValueError):
        return None
    return (apps.get_model("streams", "Segment").objects.select_related("stream")
            .filter(incident_id=incident_id).first())


def slot_message(segment) -> str:
    return (f"Incident {segment.incident_id} holds slot {segment.slot} of stream "
            f"“{segment.stream.name}” (#{segment.stream_id}): it is not an incident of its own; "
            f"its events go when the stream does (DELETE /api/v1/streams/{segment.stream_id}/).")


def visible_incidents(user, queryset: QuerySet | None = None) -> QuerySet:
    """``queryset`` (default: every incident) narrowed to what ``user`` may see: the one rule
    every list of incidents and every query across incidents goes through. Never a stream's
    slot incidents, not even to superusers."""
    incidents = Incident.objects.all() if queryset is None else queryset
    incidents = incidents.exclude(pk__in=stream_slot_ids())
    if not user.is_authenticated:
        return incidents.none()
    shared = shared_incident_ids(user)
    if not is_person(user):
        return incidents.filter(pk__in=shared)
    if user.is_superuser:
        return incidents
    # Subqueries, not joins: no duplicate rows, so callers may annotate counts.
    teams = Membership.objects.filter(user=user).values("team_id")
    granted = IncidentGrant.objects.filter(team_id__in=teams).values("incident_id")
    rule = Q(team_id__in=teams) | Q(pk__in=granted)
    if shared:
        rule |= Q(pk__in=shared)
    return incidents.filter(rule)


def get_visible_incident(user, pk) -> Incident:
    """The incident if the user may see it; 404 otherwise (never a hint that it exists)."""
    incident = visible_incidents(user).select_related("team").filter(pk=pk).first()
    if incident is None:
        raise Http404("No such incident.")
    return incident


def role_on(user, incident: Incident) -> str | None:
    """The user's role on the incident (see the module docstring), or None."""
    if not user.is_authenticated:
        return None
    if is_person(user):
        if user.is_superuser:
            return Membership.Role.ADMIN
        grants = dict(IncidentGrant.objects.filter(incident=incident)
                      .values_list("team_id", "role"))
        roles = []
        for team_id, role in Membership.objects.filter(
                user=user, team_id__in=[incident.team_id, *grants]).values_list("team_id", "role"):
            if team_id == incident.team_id:
                roles.append(role)
            if team_id in grants:
                roles.append(min(role, grants[team_id], key=RANK.__getitem__))
        if roles:
            return max(roles, key=RANK.__getitem__)
    if incident.pk in shared_incident_ids(user):
        return Membership.Role.VIEWER
    return None


def can_write(user, incident: Incident) -> bool:
    """May upload to, annotate and share the incident: editors and admins of its team, editors
    of a team it is granted to as ``editor``, superusers. Never a share link."""
    return role_on(user, incident) in WRITE_ROLES


can_upload = can_write  # the name the upload views use


def can_manage_grants(user, incident: Incident) -> bool:
    """May grant the incident to other teams and take grants back: editors and admins of the
    owning team, superusers (not teams it was granted to)."""
    if not is_person(user):
        return False
    if user.is_superuser:
        return True
    return incident.team_id is not None and Membership.objects.filter(
        team_id=incident.team_id, user=user, role__in=WRITE_ROLES).exists()


def can_administer(user, incident: Incident) -> bool:
    """May rename the incident and give it to another team: admins of the owning team,
    superusers."""
    if not is_person(user):
        return False
    if user.is_superuser:
        return True
    return incident.team_id is not None and Membership.objects.filter(
        team_id=incident.team_id, user=user, role=Membership.Role.ADMIN).exists()


def upload_teams(user) -> QuerySet:
    """Teams in which the user may create incidents."""
    if not is_person(user):
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user, memberships__role__in=WRITE_ROLES)
