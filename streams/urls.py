from django.urls import path

from . import views

app_name = "streams"
urlpatterns = [
    path("", views.stream_list, name="list"),
    path("<int:pk>/", views.stream_detail, name="detail"),
    path("<int:pk>/cut/", views.stream_cut, name="cut"),
]
