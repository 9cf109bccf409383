from django.contrib import admin
from django.db import connection
from django.http import HttpResponse
from django.urls import include, path
from rest_framework.routers import DefaultRouter

from incidents.api import IncidentViewSet, UploadViewSet
from timelines.api import EventViewSet, IncidentEventViewSet, incident_events_csv, incident_figure

router = DefaultRouter()
router.register("incidents", IncidentViewSet, basename="incident")
router.register("uploads", UploadViewSet, basename="upload")
router.register("events", EventViewSet, basename="event")
router.register(r"incidents/(?P<incident_pk>\d+)/events", IncidentEventViewSet,
                basename="incident-event")


def healthz(request):
    """200 when the database answers; for load balancers and compose health checks."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("", include("incidents.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/incidents/<int:incident_pk>/events.csv", incident_events_csv,
         name="incident-events-csv"),
    path("api/v1/incidents/<int:incident_pk>/figure/", incident_figure, name="incident-figure"),
    path("api/v1/", include((router.urls, "api"))),
    path("admin/", admin.site.urls),
    path("healthz", healthz),
]
