"""REST API for events (``/api/v1/``)."""

from __future__ import annotations

from rest_framework import mixins, viewsets
from rest_framework.pagination import CursorPagination

from incidents.access import get_visible_incident
from incidents.models import Incident

from .filters import EventFilterSet
from .models import Event
from .serializers import EventDetailSerializer, EventSerializer


class EventCursorPagination(CursorPagination):
    ordering = ("received", "id")
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


class IncidentEventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Events of one incident, filtered (see ``EventFilterSet``), in time order, by cursor."""

    serializer_class = EventSerializer
    filterset_class = EventFilterSet
    pagination_class = EventCursorPagination

    def get_queryset(self):
        incident = get_visible_incident(self.request.user, self.kwargs["incident_pk"])
        return Event.objects.filter(incident=incident)


class EventViewSet(mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """One event with its stored (redacted) body."""

    serializer_class = EventDetailSerializer

    def get_queryset(self):
        return Event.objects.filter(incident__in=Incident.objects.visible_to(self.request.user))
