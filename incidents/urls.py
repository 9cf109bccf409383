from django.urls import path

from . import views

app_name = "incidents"
urlpatterns = [
    path("", views.incident_list, name="list"),
    path("incidents/new/", views.incident_create, name="create"),
    path("incidents/<int:pk>/", views.incident_detail, name="detail"),
    path("incidents/<int:pk>/uploads/", views.upload_create, name="upload"),
]
