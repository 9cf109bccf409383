from django.contrib import admin
from django.db import connection
from django.http import HttpResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

import hindsight.schema  # noqa: F401 - registers the OpenAPI descriptions of function views
from incidents.api import IncidentViewSet, ShareLinkViewSet, UploadViewSet
from incidents.notes_api import (
    AnnotationViewSet,
    IncidentAnnotationViewSet,
    IncidentSequenceViewSet,
    SequenceViewSet,
)
from streams.api import (
    StreamEventViewSet,
    StreamIncidentViewSet,
    StreamViewSet,
    stream_figure,
)
from streams.receiver import receive_audit
from timelines.analysis import (
    compare_views,
    history_views,
    insights_views,
    pods_views,
    stats_views,
)
from timelines.detections.views import rules_api
from timelines.web.api import (
    EventViewSet,
    IncidentEventViewSet,
    incident_event_step,
    incident_events_csv,
    incident_events_json,
    incident_figure,
)
from timelines.web.overview_api import incident_facets, incident_overview

router = DefaultRouter()
router.register("incidents", IncidentViewSet, basename="incident")
router.register("uploads", UploadViewSet, basename="upload")
router.register("share-links", ShareLinkViewSet, basename="share-link")
router.register("events", EventViewSet, basename="event")
router.register(r"incidents/(?P<incident_pk>\d+)/events", IncidentEventViewSet,
                basename="incident-event")
router.register(r"incidents/(?P<incident_pk>\d+)/annotations", IncidentAnnotationViewSet,
                basename="incident-annotation")
router.register("annotations", AnnotationViewSet, basename="annotation")
router.register(r"incidents/(?P<incident_pk>\d+)/sequences", IncidentSequenceViewSet,
                basename="incident-sequence")
# sequences/{id}/export.md and export.json come from the router's format suffixes
router.register("sequences", SequenceViewSet, basename="sequence")
router.register("streams", StreamViewSet, basename="stream")
router.register(r"streams/(?P<stream_pk>\d+)/events", StreamEventViewSet, basename="stream-event")
router.register(r"streams/(?P<stream_pk>\d+)/incidents", StreamIncidentViewSet,
                basename="stream-incident")


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
    path("api/v1/incidents/<int:incident_pk>/facets/", incident_facets, name="incident-facets"),
    path("api/v1/incidents/<int:incident_pk>/overview/", incident_overview,
         name="incident-overview"),
    # analysis (timelines.analysis): its API, then its pages
    path("api/v1/incidents/<int:incident_pk>/stats/", stats_views.stats_api,
         name="incident-stats"),
    path("api/v1/incidents/<int:incident_pk>/stats/inflight/", stats_views.inflight_api,
         name="incident-stats-inflight"),
    path("api/v1/rules/", rules_api, name="rules"),
    path("api/v1/incidents/<int:incident_pk>/insights/", insights_views.insights_api,
         name="incident-insights"),
    path("api/v1/incidents/<int:incident_pk>/insights/<int:number>/sequence/",
         insights_views.insight_sequence_api, name="incident-insight-sequence"),
    path("api/v1/incidents/<int:incident_pk>/pods/", pods_views.pods_api, name="incident-pods"),
    path("api/v1/incidents/<int:incident_pk>/compare/", compare_views.compare_api,
         name="incident-compare"),
    path("api/v1/incidents/<int:incident_pk>/history/", history_views.history_api,
         name="incident-history"),
    path("api/v1/incidents/<int:incident_pk>/related/", history_views.related_api,
         name="incident-related"),
    path("incidents/<int:pk>/stats/", stats_views.stats_page, name="stats-page"),
    path("incidents/<int:pk>/pods/", pods_views.pods_page, name="pods-page"),
    path("incidents/<int:pk>/compare/", compare_views.compare_page, name="compare-page"),
    path("incidents/<int:pk>/history/", history_views.history_page, name="history-page"),
    # before the router: its format suffixes would read events.json as the list in JSON
    path("api/v1/incidents/<int:incident_pk>/events.json", incident_events_json,
         name="incident-events-json"),
    path("api/v1/incidents/<int:incident_pk>/events/step/", incident_event_step,
         name="incident-event-step"),
    # kube-apiserver's audit webhook (a plain view: no session, no DRF, its own token)
    path("api/v1/streams/<int:stream_pk>/audit/", receive_audit, name="stream-audit"),
    path("api/v1/streams/<int:stream_pk>/figure/", stream_figure, name="stream-figure"),
    path("streams/", include("streams.urls")),
    path("api/v1/", include((router.urls, "api"))),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("healthz", healthz),
]
