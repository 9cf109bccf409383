from django.urls import path

from . import share_views, views

app_name = "incidents"
urlpatterns = [
    path("", views.incident_list, name="list"),
    path("incidents/new/", views.incident_create, name="create"),
    path("incidents/<int:pk>/", views.incident_detail, name="detail"),
    path("incidents/<int:pk>/uploads/", views.upload_create, name="upload"),
    path("s/<str:key>/", share_views.open_share_link, name="share"),
]
