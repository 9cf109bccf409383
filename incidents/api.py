"""REST API for incidents, their sharing, and uploads (``/api/v1/``)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from timelines.ingest import create_upload, delete_incident
from timelines.tasks import enqueue_ingest

from .access import (
    can_administer,
    can_manage_grants,
    can_write,
    get_visible_incident,
    slot_message,
    slot_owner,
    upload_teams,
    visible_incidents,
)
from .auth import ApiRateThrottle, UploadRateThrottle
from .models import Incident, Team, Upload, writing
from .serializers import (
    GrantSerializer,
    GrantWriteSerializer,
    IncidentSerializer,
    IncidentUpdateSerializer,
    ShareLinkCreatedSerializer,
    ShareLinkCreateSerializer,
    ShareLinkSerializer,
    UploadCreateSerializer,
    UploadSerializer,
)
from .sharing import IncidentGrant, ShareLink


class PayloadTooLarge(ValidationError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class IncidentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Incidents you can see: of your teams, granted to them, or opened with a share link; their
    admins rename, move and delete them."""

    serializer_class = IncidentSerializer

    def get_queryset(self):
        return (visible_incidents(self.request.user).select_related("team")
                .prefetch_related("grants__team", "grants__granted_by"))

    @extend_schema(request=IncidentUpdateSerializer, responses=IncidentSerializer)
    def partial_update(self, request, pk=None):
        """Rename the incident or give it to another team (by name): owning-team admins and
        superusers."""
        incident = self.get_object()
        if not can_administer(request.user, incident):
            raise PermissionDenied("Only admins of the incident's team may change it.")
        serializer = IncidentUpdateSerializer(incident, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        try:
            with writing(incident.pk):
                serializer.save()
        except IntegrityError:  # the same key arrived in that team meanwhile
            raise ValidationError({"team": "That team already has an incident with this "
                                           "incident_key."}) from None
        # not get_object(): who gave the incident away may no longer see it
        return Response(self.get_serializer(serializer.instance).data)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        """Delete the incident with everything of it: uploads (a bundle's files too), events,
        annotations, sequences, grants and share links; 204. Owning-team admins and
        superusers. From then on the incident and all of it answer 404; its events are removed
        in the background (``timelines.ingest.purge``), which is why this is quick however many
        there are. A stream's slot incident answers 409 naming its stream to who may see the
        stream (404 to others): it goes with its stream only."""
        segment = slot_owner(pk)
        if segment is not None:
            from streams.access import visible_streams

            if visible_streams(request.user).filter(pk=segment.stream_id).exists():
                return Response({"detail": slot_message(segment)}, status=status.HTTP_409_CONFLICT)
        incident = self.get_object()
        if not can_administer(request.user, incident):
            raise PermissionDenied("Only admins of the incident's team may delete it.")
        delete_incident(incident)
        if isinstance(request.successful_authenticator, SessionAuthentication):
            # the page goes to the incident list next, which shows it
            messages.success(request._request, f"Incident “{incident.title}” deleted.")
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=GrantWriteSerializer, responses={201: GrantSerializer,
                                                            200: GrantSerializer})
    @action(detail=True, methods=["post"])
    def grants(self, request, pk=None):
        """Give another team access (``role`` viewer or editor); a second grant to the same
        team changes its role (200). Owning-team editors and admins, superusers."""
        incident = self._managed(request)
        serializer = GrantWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        team = serializer.validated_data["team"]
        if team.pk == incident.team_id:
            raise ValidationError({"team": "The incident already belongs to that team."})
        with writing(incident.pk):
            grant, created = IncidentGrant.objects.update_or_create(
                incident=incident, team=team,
                defaults={"role": serializer.validated_data["role"], "granted_by": request.user})
        return Response(GrantSerializer(grant).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={204: None},
                   parameters=[OpenApiParameter("grant", str, OpenApiParameter.PATH,
                                                description="the grant's id or team name")])
    @action(detail=True, methods=["delete"], url_path=r"grants/(?P<grant>[^/]+)",
            url_name="grant-detail")
    def revoke_grant(self, request, pk=None, grant=None):
        """Take a grant back, named by its id or its team's name."""
        incident = self._managed(request)
        grants = IncidentGrant.objects.filter(incident=incident)
        found = grants.filter(pk=int(grant)).first() if grant.isdigit() else None
        found = found or grants.filter(team__name=grant).first()
        if found is None:
            raise NotFound("No such grant.")
        found.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["GET"], responses=ShareLinkSerializer(many=True))
    @extend_schema(methods=["POST"], request=ShareLinkCreateSerializer,
                   responses={201: ShareLinkCreatedSerializer})
    @action(detail=True, methods=["get", "post"], url_path="share-links",
            url_name="share-links")
    def share_links(self, request, pk=None):
        """``POST`` makes a read-only link to the incident, optionally to a saved view of it and
        expiring; its URL (with the key) is in this answer only. ``GET`` lists the links
        (without keys). Both for those who may write to the incident."""
        incident = self.get_object()
        if not can_write(request.user, incident):
            raise PermissionDenied("You may not share this incident.")
        if request.method == "GET":
            links = incident.share_links.select_related("created_by").order_by("-created_at")
            return Response(ShareLinkSerializer(links, many=True).data)
        serializer = ShareLinkCreateSerializer(data=request.data,
                                               context={"incident": incident})
        serializer.is_valid(raise_exception=True)
        with writing(incident.pk):
            link, key = ShareLink.issue(incident, request.user, **serializer.validated_data)
        answer = ShareLinkCreatedSerializer(link, context={"request": request, "key": key})
        return Response(answer.data, status=status.HTTP_201_CREATED)

    def _managed(self, request) -> Incident:
        incident = self.get_object()
        if not can_manage_grants(request.user, incident):
            raise PermissionDenied("Only the incident's team may share it with other teams.")
        return incident


class ShareLinkViewSet(mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = ShareLinkSerializer

    def get_queryset(self):
        return ShareLink.objects.filter(incident__in=visible_incidents(self.request.user))

    def destroy(self, request, *args, **kwargs):
        """Revoke the link: it stops working at once, also for browsers that opened it."""
        link = self.get_object()
        if not can_write(request.user, link.incident):
            raise PermissionDenied("You may not revoke links to this incident.")
        ShareLink.objects.filter(pk=link.pk, revoked_at=None).update(revoked_at=timezone.now())
        return Response(status=status.HTTP_204_NO_CONTENT)


class FilePagination(LimitOffsetPagination):
    default_limit = 500
    max_limit = 5000


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="a retried request with the same key (per user) answers 200 with the first "
                "upload instead of making another")


class UploadViewSet(mixins.CreateModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """``POST`` a file (multipart field ``file``) with ``incident_key`` and ``title``, or
    ``incident`` (title of a new incident), or ``incident_id``; answers 202 and ingests in the
    background. ``GET {id}/`` reports progress."""

    serializer_class = UploadSerializer
    parser_classes = [MultiPartParser, FormParser]
    throttle_classes = [ApiRateThrottle, UploadRateThrottle]
    upload_scope_allowed = True

    def get_queryset(self):
        return Upload.objects.filter(
            incident__in=visible_incidents(self.request.user)
        ).select_related("incident")

    # A page of uploads, not one: schemathesis found the schema saying one.
    @extend_schema(responses=UploadSerializer(many=True))
    @action(detail=True, pagination_class=FilePagination)
    def files(self, request, pk=None):
        """The files inside a bundle, each with its format, status, counts and problems."""
        bundle = self.get_object()
        page = self.paginate_queryset(bundle.files.order_by("pk").select_related("incident"))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(request={"multipart/form-data": UploadCreateSerializer},
                   parameters=[IDEMPOTENCY_KEY],
                   responses={202: UploadSerializer,
                              200: OpenApiResponse(UploadSerializer,
                                                   "a replay: the upload made first"),
                              413: OpenApiResponse(OpenApiTypes.OBJECT, "over the size limit")})
    def create(self, request, *args, **kwargs):
        """Answers 202 with the upload, ``incident_id`` and ``incident_url``; 200 with the first
        upload for a repeated ``Idempotency-Key``."""
        idempotency_key = request.headers.get("Idempotency-Key", "").strip()
        if len(idempotency_key) > 200:
            raise ValidationError({"Idempotency-Key": "At most 200 characters."})
        if idempotency_key:
            first = self._replayed(request, idempotency_key)
            if first is not None:
                return first
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.MAX_UPLOAD_BYTES + 1024 * 1024:
            raise PayloadTooLarge(_too_large(int(length)))
        received = request.FILES.get("file")
        if received is None:
            raise ValidationError({"file": "Send the evidence as multipart field 'file'."})
        if received.size > settings.MAX_UPLOAD_BYTES:
            raise PayloadTooLarge(_too_large(received.size))
        try:
            with transaction.atomic():
                incident = self._incident(request)
                upload = create_upload(incident, received, request.user,
                                       idempotency_key=idempotency_key)
                enqueue_ingest(upload.pk)
        except IntegrityError:
            # A concurrent request with the same Idempotency-Key won the unique constraint
            # (PostgreSQL waited for it to commit): answer with its upload.
            first = self._replayed(request, idempotency_key) if idempotency_key else None
            if first is None:
                raise
            return first
        return Response(self.get_serializer(upload).data, status=status.HTTP_202_ACCEPTED)

    def _replayed(self, request, idempotency_key: str) -> Response | None:
        upload = (Upload.objects.filter(uploaded_by=request.user, idempotency_key=idempotency_key)
                  .select_related("incident").first())
        if upload is None:
            return None
        return Response(self.get_serializer(upload).data, status=status.HTTP_200_OK,
                        headers={"Idempotent-Replayed": "true"})

    def _incident(self, request) -> Incident:
        incident_id = request.data.get("incident_id")
        key = (request.data.get("incident_key") or "").strip()
        if incident_id not in (None, ""):
            if key:
                raise ValidationError({"incident_key": "Give incident_key or incident_id, "
                                                       "not both."})
            if not str(incident_id).isdigit():
                raise ValidationError({"incident_id": "Must be an incident id."})
            try:
                incident = get_visible_incident(request.user, int(incident_id))
            except Http404:
                raise NotFound("No such incident.") from None
            if not can_write(request.user, incident):
                raise PermissionDenied("You may not upload to this incident.")
            return incident
        title = (request.data.get("title") or request.data.get("incident") or "").strip()
        if key:
            if len(key) > 500:
                raise ValidationError({"incident_key": "At most 500 characters."})
            return _incident_for_key(key, title or key, _team_for(request), request.user)
        if not title:
            raise ValidationError({"incident": "Give 'incident_key' (and 'title'), 'incident' "
                                               "(title of a new incident) or 'incident_id'."})
        return Incident.objects.create(title=title[:300], team=_team_for(request),
                                       created_by=request.user)


def _incident_for_key(key: str, title: str, team: Team | None, user) -> Incident:
    """The team's incident with this key, made (with ``title``) if there is none yet. Two
    requests racing to make it meet at the unique constraint; the loser takes the winner's."""
    found = Incident.objects.filter(team=team, key=key).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return Incident.objects.create(title=title[:300], team=team, key=key,
                                           created_by=user)
    except IntegrityError:
        return Incident.objects.get(team=team, key=key)


def _too_large(size: int) -> str:
    return (f"The upload is {size} bytes; this server accepts at most "
            f"{settings.MAX_UPLOAD_BYTES} bytes (HINDSIGHT_MAX_UPLOAD_BYTES).")


def _team_for(request):
    teams = upload_teams(request.user)
    wanted = (request.data.get("team") or "").strip()
    if wanted:
        team = teams.filter(name=wanted).first()
        if team is None and request.user.is_superuser:
            team = Team.objects.filter(name=wanted).first()
        if team is None:
            raise PermissionDenied(f"You may not create incidents in team {wanted!r}.")
        return team
    teams = list(teams[:2])
    if len(teams) == 1:
        return teams[0]
    if len(teams) > 1:
        raise ValidationError({"team": "You belong to several teams; say which with 'team'."})
    if request.user.is_superuser:
        return None
    raise PermissionDenied("You belong to no team that may upload.")


