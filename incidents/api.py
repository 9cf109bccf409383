"""REST API for incidents and uploads (``/api/v1/``)."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.http import Http404
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from timelines.tasks import enqueue_ingest

from .access import can_upload, get_visible_incident, upload_teams
from .models import Incident, Upload
from .serializers import IncidentSerializer, UploadSerializer


class PayloadTooLarge(ValidationError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class IncidentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = IncidentSerializer

    def get_queryset(self):
        return Incident.objects.visible_to(self.request.user).select_related("team")


class FilePagination(LimitOffsetPagination):
    default_limit = 500
    max_limit = 5000


class UploadViewSet(mixins.CreateModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """``POST`` a file (multipart field ``file``) with ``incident`` (title of a new incident) or
    ``incident_id``; answers 202 and ingests in the background. ``GET {id}/`` reports progress."""

    serializer_class = UploadSerializer
    parser_classes = [MultiPartParser, FormParser]
    upload_scope_allowed = True

    def get_queryset(self):
        return Upload.objects.filter(
            incident__in=Incident.objects.visible_to(self.request.user)
        ).select_related("incident")

    @action(detail=True, pagination_class=FilePagination)
    def files(self, request, pk=None):
        """The files inside a bundle, each with its format, status, counts and problems."""
        bundle = self.get_object()
        page = self.paginate_queryset(bundle.files.order_by("pk").select_related("incident"))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def create(self, request, *args, **kwargs):
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.MAX_UPLOAD_BYTES + 1024 * 1024:
            raise PayloadTooLarge(_too_large(int(length)))
        received = request.FILES.get("file")
        if received is None:
            raise ValidationError({"file": "Send the evidence as multipart field 'file'."})
        if received.size > settings.MAX_UPLOAD_BYTES:
            raise PayloadTooLarge(_too_large(received.size))
        with transaction.atomic():
            incident = self._incident(request)
            upload = create_upload(incident, received, request.user)
        return Response(self.get_serializer(upload).data, status=status.HTTP_202_ACCEPTED)

    def _incident(self, request) -> Incident:
        incident_id = request.data.get("incident_id")
        if incident_id not in (None, ""):
            if not str(incident_id).isdigit():
                raise ValidationError({"incident_id": "Must be an incident id."})
            try:
                incident = get_visible_incident(request.user, int(incident_id))
            except Http404:
                raise NotFound("No such incident.") from None
            if not can_upload(request.user, incident):
                raise PermissionDenied("You may not upload to this incident.")
            return incident
        title = (request.data.get("incident") or "").strip()
        if not title:
            raise ValidationError({"incident": "Give 'incident' (title of a new incident) or "
                                               "'incident_id'."})
        return Incident.objects.create(title=title[:300], team=_team_for(request),
                                       created_by=request.user)


def _too_large(size: int) -> str:
    return (f"The upload is {size} bytes; this server accepts at most "
            f"{settings.MAX_UPLOAD_BYTES} bytes (HINDSIGHT_MAX_UPLOAD_BYTES).")


def _team_for(request):
    teams = upload_teams(request.user)
    wanted = (request.data.get("team") or "").strip()
    if wanted:
        team = teams.filter(name=wanted).first()
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


SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def create_upload(incident: Incident, received, user) -> Upload:
    """Move an uploaded file (already streamed to disk or memory by Django) into the upload
    directory and queue its ingest once the transaction commits."""
    name = Path(received.name or "upload").name[:200] or "upload"
    folder = Path(settings.UPLOAD_DIR) / uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (SAFE_NAME.sub("_", name) or "upload")
    if hasattr(received, "temporary_file_path"):
        shutil.move(received.temporary_file_path(), target)
    else:
        with target.open("wb") as out:
            for chunk in received.chunks():
                out.write(chunk)
    upload = Upload.objects.create(incident=incident, name=name, path=str(target),
                                   path_is_copy=True, uploaded_by=user,
                                   bytes_total=target.stat().st_size)
    enqueue_ingest(upload.pk)
    return upload
