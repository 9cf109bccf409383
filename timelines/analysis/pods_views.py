"""HTTP side of ``timelines.analysis.pods``: not built yet."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.decorators import api_view


@api_view(["GET"])
def pods_api(request, incident_pk: int):
    return HttpResponse(status=501)


def pods_page(request, pk: int):
    return HttpResponse(status=501)
